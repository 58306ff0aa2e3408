"""Sets of half-open intervals ``[start, end)``."""

import bisect


class IntervalSet:
    """A union of half-open intervals, kept sorted and merged.

    ``[1, 3)`` and ``[3, 5)`` share no point but leave no gap, so adding both
    stores ``[1, 5)``. An interval with ``start == end`` is empty and ignored.
    """

    def __init__(self, intervals=()):
        self._intervals = []
        for start, end in intervals:
            self.add(start, end)

    def __iter__(self):
        return iter(list(self._intervals))

    def __len__(self):
        return len(self._intervals)

    def __repr__(self):
        return f"IntervalSet({self._intervals!r})"

    def add(self, start, end):
        if end < start:
            raise ValueError(f"interval end {end!r} is before its start {start!r}")
        if start == end:
            return
        merged = []
        for lo, hi in self._intervals:
            if hi < start or lo > end:
                merged.append((lo, hi))
            else:
                start, end = min(start, lo), max(end, hi)
        merged.append((start, end))
        merged.sort()
        self._intervals = merged

    def contains(self, point):
        """Whether ``point`` lies in one of the intervals (``end`` itself is outside)."""
        index = bisect.bisect_right(self._intervals, (point, float("inf"))) - 1
        return index >= 0 and self._intervals[index][0] <= point < self._intervals[index][1]

    def overlaps(self, start, end):
        """Whether ``[start, end)`` shares at least one point with the set."""
        return any(lo < end and start < hi for lo, hi in self._intervals)

    def total_length(self):
        return sum(hi - lo for lo, hi in self._intervals)
