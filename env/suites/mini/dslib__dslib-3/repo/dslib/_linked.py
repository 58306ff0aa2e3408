"""An intrusive doubly linked list, the recency order behind ``LRUCache``."""


class Node:
    """A list node carrying a key and a value."""

    __slots__ = ("key", "value", "prev", "next")

    def __init__(self, key, value):
        self.key = key
        self.value = value
        self.prev = None
        self.next = None


class LinkedList:
    """Nodes from ``head`` (most recent) to ``tail`` (least recent). All operations are O(1)."""

    def __init__(self):
        self.head = None
        self.tail = None
        self._size = 0

    def __len__(self):
        return self._size

    def __iter__(self):
        node = self.head
        while node is not None:
            yield node
            node = node.next

    def push_front(self, node):
        node.prev = None
        node.next = self.head
        if self.head is not None:
            self.head.prev = node
        self.head = node
        if self.tail is None:
            self.tail = node
        self._size += 1

    def unlink(self, node):
        """Remove ``node`` from the list (it must be in it)."""
        if node.prev is not None:
            node.prev.next = node.next
        else:
            self.head = node.next
        if node.next is not None:
            node.next.prev = node.prev
        else:
            self.tail = node.prev
        node.prev = node.next = None
        self._size -= 1

    def move_to_front(self, node):
        """Make ``node`` the most recent one."""
        if node is self.head:
            return
        # Detach (node is not the head, so it has a predecessor).
        node.prev.next = node.next
        if node.next is not None:
            node.next.prev = node.prev
        else:
            self.tail = node.prev
        # Re-attach in front.
        node.prev = None
        node.next = self.head
        self.head.prev = node
        self.head = node

    def pop_back(self):
        """Remove and return the least recent node, or ``None`` when empty."""
        node = self.tail
        if node is not None:
            self.unlink(node)
        return node
