import pytest

from dslib import LRUCache


def test_get_and_put():
    cache = LRUCache(2)
    cache.put("a", 1)
    assert cache.get("a") == 1
    assert cache.get("missing", "x") == "x"
    assert (cache.hits, cache.misses) == (1, 1)


def test_evicts_oldest_insert():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("c", 3)
    assert "a" not in cache
    assert cache.keys() == ["c", "b"]


def test_put_existing_key_updates_value():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("a", 10)
    assert len(cache) == 1
    assert cache.peek("a") == 10


def test_on_evict_callback():
    evicted = []
    cache = LRUCache(1, on_evict=lambda k, v: evicted.append((k, v)))
    cache.put("a", 1)
    cache.put("b", 2)
    assert evicted == [("a", 1)]


def test_pop():
    cache = LRUCache(3)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.pop("a") == 1
    assert cache.keys() == ["b"]
    with pytest.raises(KeyError):
        cache.pop("a")


def test_invalid_capacity():
    with pytest.raises(ValueError):
        LRUCache(0)
