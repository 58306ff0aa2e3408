"""A least-recently-used cache."""

from dslib._linked import LinkedList, Node

_MISSING = object()


class LRUCache:
    """A mapping with at most ``capacity`` entries.

    ``get`` and ``put`` mark an entry as most recently used; when a ``put`` would
    exceed the capacity, the least recently used entry is evicted (and passed to
    ``on_evict(key, value)`` if given). ``in`` and ``peek`` do not change the order.
    """

    def __init__(self, capacity, on_evict=None):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.on_evict = on_evict
        self._nodes = {}
        self._order = LinkedList()
        self.hits = 0
        self.misses = 0

    def __len__(self):
        return len(self._nodes)

    def __contains__(self, key):
        return key in self._nodes

    def keys(self):
        """Keys from most to least recently used."""
        return [node.key for node in self._order]

    def peek(self, key, default=None):
        node = self._nodes.get(key)
        return default if node is None else node.value

    def get(self, key, default=None):
        node = self._nodes.get(key)
        if node is None:
            self.misses += 1
            return default
        self.hits += 1
        self._order.move_to_front(node)
        return node.value

    def put(self, key, value):
        node = self._nodes.get(key)
        if node is not None:
            node.value = value
            self._order.move_to_front(node)
            return
        node = Node(key, value)
        self._nodes[key] = node
        self._order.push_front(node)
        if len(self._nodes) > self.capacity:
            oldest = self._order.pop_back()
            del self._nodes[oldest.key]
            if self.on_evict is not None:
                self.on_evict(oldest.key, oldest.value)

    def pop(self, key, default=_MISSING):
        node = self._nodes.pop(key, None)
        if node is None:
            if default is _MISSING:
                raise KeyError(key)
            return default
        self._order.unlink(node)
        return node.value

    def clear(self):
        self._nodes.clear()
        self._order = LinkedList()
