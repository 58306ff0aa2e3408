"""dslib: plain-Python data structures (LRU cache, stable priority queue, interval sets)."""

from dslib.heap import PriorityQueue
from dslib.intervals import IntervalSet
from dslib.lru import LRUCache

__all__ = ["IntervalSet", "LRUCache", "PriorityQueue"]

__version__ = "2.0.1"
