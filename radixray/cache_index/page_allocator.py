"""A free list of KV pages. Pure Python: page ids are ints, nothing here touches tensors."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["PageAllocator"]


class PageAllocator:
    """Hands out page ids ``0 .. num_pages - 1``.

    ``alloc(n)`` returns ``None`` when ``n`` pages are not free: running short is a normal event
    that the caller answers by evicting or preempting. Freeing a page that is already free, or one
    that does not exist, is a bug and raises, before anything is changed.

    Pages are reused last-freed-first (warm pages first), and a fresh allocator hands them out in
    ascending order, so page ids in tests are predictable.
    """

    def __init__(self, num_pages: int):
        if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages < 1:
            raise ValueError(f"num_pages must be an int >= 1, got {num_pages!r}")
        self.num_pages = num_pages
        # A stack: the end of the list is handed out first.
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._is_free = bytearray(b"\x01") * num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self._free)

    def can_alloc(self, n: int) -> bool:
        return n <= len(self._free)

    def alloc(self, n: int) -> list[int] | None:
        """Take ``n`` pages, or return None (and take nothing) if fewer than ``n`` are free."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if n > len(self._free):
            return None
        if n == 0:
            return []
        pages = self._free[-n:]
        del self._free[-n:]
        pages.reverse()
        is_free = self._is_free
        for p in pages:
            is_free[p] = 0
        return pages

    def free(self, pages: Iterable[int]) -> None:
        """Return pages. Raises ValueError on an unknown id, a free page or a repeated id."""
        pages = list(pages)
        is_free = self._is_free
        n = self.num_pages
        for p in pages:
            if not (isinstance(p, int) and 0 <= p < n):
                raise ValueError(f"page id {p!r} is out of range [0, {n})")
            if is_free[p]:
                raise ValueError(f"page {p} freed twice (it is already free)")
        if len(set(pages)) != len(pages):
            raise ValueError(f"page ids freed twice in one call: {sorted(pages)}")
        for p in pages:
            is_free[p] = 1
        # Reversed so that alloc(len(pages)) hands them back in the same order.
        self._free.extend(reversed(pages))

    def is_free(self, page: int) -> bool:
        return bool(self._is_free[page])

    def free_pages(self) -> list[int]:
        return list(self._free)

    def check_integrity(self) -> None:
        """Raise AssertionError if the free list and the free bitmap disagree."""
        free = self._free
        if len(set(free)) != len(free):
            raise AssertionError("allocator free list holds a page twice")
        if sum(self._is_free) != len(free):
            raise AssertionError(
                f"allocator bitmap counts {sum(self._is_free)} free pages, list has {len(free)}"
            )
        for p in free:
            if not self._is_free[p]:
                raise AssertionError(f"page {p} is on the free list but marked used")

    def __repr__(self) -> str:
        return f"PageAllocator(num_pages={self.num_pages}, num_free={self.num_free})"
