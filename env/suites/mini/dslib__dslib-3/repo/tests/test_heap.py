import pytest

from dslib import PriorityQueue


def test_lowest_priority_first():
    queue = PriorityQueue()
    for item, priority in (("c", 3), ("a", 1), ("b", 2)):
        queue.push(item, priority)
    assert queue.drain() == ["a", "b", "c"]


def test_reverse():
    queue = PriorityQueue(reverse=True)
    queue.push("low", 1)
    queue.push("high", 9)
    assert queue.pop() == "high"


def test_peek_and_len():
    queue = PriorityQueue()
    queue.push("x", 5)
    assert queue.peek() == "x"
    assert len(queue) == 1
    assert queue


def test_empty():
    queue = PriorityQueue()
    assert not queue
    with pytest.raises(IndexError):
        queue.pop()
