import pytest

from dslib import IntervalSet


def test_disjoint_intervals_stay_apart():
    assert list(IntervalSet([(5, 7), (1, 2)])) == [(1, 2), (5, 7)]


def test_overlapping_intervals_merge():
    assert list(IntervalSet([(1, 4), (3, 6)])) == [(1, 6)]


def test_adjacent_intervals_merge():
    assert list(IntervalSet([(1, 3), (3, 5)])) == [(1, 5)]


def test_spanning_interval_swallows_others():
    spans = IntervalSet([(1, 2), (4, 5), (7, 8)])
    spans.add(0, 10)
    assert list(spans) == [(0, 10)]


def test_contains_is_half_open():
    spans = IntervalSet([(1, 5)])
    assert spans.contains(1)
    assert spans.contains(4.9)
    assert not spans.contains(5)


def test_overlaps():
    spans = IntervalSet([(10, 20)])
    assert spans.overlaps(15, 25)
    assert spans.overlaps(0, 11)
    assert not spans.overlaps(30, 40)


def test_total_length():
    assert IntervalSet([(0, 2), (5, 6)]).total_length() == 3


def test_reversed_interval_is_an_error():
    with pytest.raises(ValueError):
        IntervalSet([(3, 1)])
