"""A priority queue on a binary heap."""

import heapq
import itertools


class PriorityQueue:
    """Items come out lowest priority first (highest first with ``reverse=True``).

    Items with equal priority come out in the order they were pushed, and items
    themselves are never compared, so any object can be queued.
    """

    def __init__(self, reverse=False):
        self._heap = []
        self._reverse = reverse
        self._counter = itertools.count()

    def __len__(self):
        return len(self._heap)

    def __bool__(self):
        return bool(self._heap)

    def _key(self, priority):
        return -priority if self._reverse else priority

    def push(self, item, priority=0):
        heapq.heappush(self._heap, (self._key(priority), next(self._counter), item))

    def pop(self):
        """Remove and return the next item; ``IndexError`` when empty."""
        if not self._heap:
            raise IndexError("pop from an empty PriorityQueue")
        return heapq.heappop(self._heap)[-1]

    def peek(self):
        if not self._heap:
            raise IndexError("peek at an empty PriorityQueue")
        return self._heap[0][-1]

    def drain(self):
        """Pop every item, in order."""
        items = []
        while self._heap:
            items.append(self.pop())
        return items
