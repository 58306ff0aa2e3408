from datetime import timedelta

from humanfmt import precisedelta


def test_seconds_only():
    assert precisedelta(1) == "1 second"
    assert precisedelta(45) == "45 seconds"


def test_two_units():
    assert precisedelta(3725) == "1 hour 2 minutes"


def test_more_units():
    assert precisedelta(timedelta(days=2, hours=3, minutes=4), max_units=3) == "2 days 3 hours 4 minutes"


def test_zero_units_are_skipped():
    assert precisedelta(timedelta(days=1, seconds=5)) == "1 day 5 seconds"


def test_zero():
    assert precisedelta(0) == "0 seconds"
    assert precisedelta(timedelta(milliseconds=300)) == "0 seconds"
