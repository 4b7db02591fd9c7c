import pytest

from radixray.cache_index import PageAllocator


def test_fresh_allocator_hands_out_ascending_ids_and_every_page():
    a = PageAllocator(5)
    assert a.num_pages == 5 and a.num_free == 5
    assert a.alloc(3) == [0, 1, 2]
    assert a.alloc(2) == [3, 4]
    assert a.num_free == 0 and a.num_used == 5
    a.check_integrity()


def test_alloc_returns_none_when_short_and_takes_nothing():
    a = PageAllocator(4)
    assert a.alloc(3) == [0, 1, 2]
    before = a.free_pages()
    assert a.alloc(2) is None
    assert a.free_pages() == before and a.num_free == 1
    assert not a.can_alloc(2) and a.can_alloc(1)
    assert a.alloc(1) == [3]
    assert a.alloc(1) is None
    a.check_integrity()


def test_alloc_zero_and_negative():
    a = PageAllocator(2)
    assert a.alloc(0) == []
    assert a.num_free == 2
    with pytest.raises(ValueError, match="n must be >= 0"):
        a.alloc(-1)


def test_freed_pages_come_back_in_the_same_order():
    a = PageAllocator(8)
    pages = a.alloc(5)
    a.free([3, 1, 4])
    assert a.alloc(3) == [3, 1, 4]
    a.free(pages)
    assert a.num_free == 8
    a.check_integrity()


def test_double_free_raises_without_changing_state():
    a = PageAllocator(6)
    a.alloc(4)
    a.free([2])
    before = (a.free_pages(), a.num_free, [a.is_free(p) for p in range(6)])
    with pytest.raises(ValueError, match="page 2 freed twice"):
        a.free([0, 2])  # 0 is valid, 2 is already free: nothing may be freed
    assert (a.free_pages(), a.num_free, [a.is_free(p) for p in range(6)]) == before
    with pytest.raises(ValueError, match="freed twice in one call"):
        a.free([1, 1])
    assert (a.free_pages(), a.num_free, [a.is_free(p) for p in range(6)]) == before
    a.check_integrity()


@pytest.mark.parametrize("bad", [-1, 6, 100, 1.0, "1", None])
def test_out_of_range_or_non_int_free_raises_without_changing_state(bad):
    a = PageAllocator(6)
    a.alloc(6)
    with pytest.raises(ValueError, match="out of range"):
        a.free([0, bad])
    assert a.num_free == 0 and not a.is_free(0)
    a.check_integrity()


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "4"])
def test_bad_num_pages(bad):
    with pytest.raises(ValueError, match="num_pages"):
        PageAllocator(bad)
