"""``WindowedAllocator``: the page allocator of a model with sliding-window layers, which keeps
the window layers' KV in a pool of their own (docs/window_cache.md).

Every page id the scheduler and the caches deal in is a *full* page id (the full-attention
layers' pool). Each full page in use may also own one page of the window pool, the window
layers' KV of the same ``page_size`` positions::

    full page  7  ->  window page 3      (both pools hold positions [jP, (j+1)P) of a sequence)
    full page  9  ->  NULL               (window page freed: out of every query's window)

``alloc`` hands out full pages each with a window page (all or none), ``free`` frees both, and
``drop_window`` frees only the window pages (a tombstone: the full page stays, its window page
is gone). Window page 0 is ``NULL``, never handed out: a dropped page's slot in a block table
points there. The kernels never read it (its positions are out of the window of every query
of the step) and nothing writes it, so it stays zero.

Pure Python, like the rest of ``cache_index``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from .page_allocator import PageAllocator

__all__ = ["NULL_WINDOW_PAGE", "WindowedAllocator", "reusable_pages", "window_pages_needed"]

NULL_WINDOW_PAGE = 0


def window_pages_needed(window: int, page_size: int, chunk: int) -> int:
    """The window pages one request may hold at once: its last ``window - 1`` positions before
    a chunk of ``chunk`` new ones, page-aligned on both ends."""
    return -(-(window - 1 + chunk) // page_size) + 1


def reusable_pages(pages: Sequence, has_window: Callable[[int], bool], P: int, W: int) -> int:
    """The most leading ``pages`` (page ids, or block hashes: whatever ``has_window`` takes) a
    request can start after: the largest ``e`` such that every page holding a position in
    ``[e*P - W + 1, e*P)`` has its window page. Right to left: a missing page ``j`` rules out
    every ``e`` in ``(j, end]``, so the next candidate is ``j``."""
    end = len(pages)
    while end > 0:
        start = max(0, end * P - W + 1) // P  # the first page the query at end*P reads
        j = end - 1
        while j >= start and has_window(pages[j]):
            j -= 1
        if j < start:
            return end
        end = j
    return 0


class WindowedAllocator(PageAllocator):
    """Full pages (``PageAllocator``'s ids) paired with window pages (``window_allocator``)."""

    def __init__(self, num_pages: int, num_window_pages: int, window: int):
        super().__init__(num_pages)
        if not isinstance(num_window_pages, int) or num_window_pages < 2:
            raise ValueError(f"num_window_pages must be an int >= 2, got {num_window_pages!r}")
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an int >= 1, got {window!r}")
        self.window = window
        self.window_allocator = PageAllocator(num_window_pages)
        assert self.window_allocator.alloc(1) == [NULL_WINDOW_PAGE]
        self._window_of = [-1] * num_pages  # full page -> window page, -1: none

    @property
    def num_window_free(self) -> int:
        return self.window_allocator.num_free

    @property
    def num_window_pages(self) -> int:
        """Window pages that can be handed out (the NULL page not counted)."""
        return self.window_allocator.num_pages - 1

    def alloc(self, n: int, window: bool = True) -> list[int] | None:
        """``n`` full pages, each with a window page (none with ``window=False``: a host tier
        gives window pages only to the pages that keep them); None (nothing taken) if either
        pool has fewer than ``n`` free."""
        if window and n > self.window_allocator.num_free:
            return None
        pages = super().alloc(n)
        if pages is None or not window:
            return pages
        for p, w in zip(pages, self.window_allocator.alloc(n), strict=True):
            self._window_of[p] = w
        return pages

    def give_window(self, pages: Sequence[int]) -> list[int]:
        """Window pages for full ``pages`` (which have none), as many as are free, from the
        last page back; returns the window pages given, in the order of ``pages`` given."""
        k = min(len(pages), self.window_allocator.num_free)
        if k == 0:
            return []
        got = pages[len(pages) - k :]
        ws = self.window_allocator.alloc(k)
        for p, w in zip(got, ws, strict=True):
            if self._window_of[p] >= 0:
                raise ValueError(f"full page {p} has a window page already")
            self._window_of[p] = w
        return ws

    def window_of(self, page: int) -> int:
        """The window page of full ``page``, -1 if none."""
        return self._window_of[page]

    def free(self, pages: Iterable[int]) -> None:
        pages = list(pages)
        super().free(pages)  # validates before changing anything
        self.drop_window(pages)

    def has_window(self, page: int) -> bool:
        return self._window_of[page] >= 0

    def drop_window(self, pages: Iterable[int]) -> int:
        """Free the window pages of full ``pages`` (those that have one); the count freed."""
        freed = []
        for p in pages:
            w = self._window_of[p]
            if w >= 0:
                freed.append(w)
                self._window_of[p] = -1
        if freed:
            self.window_allocator.free(freed)
        return len(freed)

    def move_window(self, src: int, dst: int) -> bool:
        """Give full page ``dst`` (which has none) ``src``'s window page: a duplicate computed
        by a request revives a cached page whose window page was dropped."""
        if self._window_of[dst] >= 0 or self._window_of[src] < 0:
            return False
        self._window_of[dst], self._window_of[src] = self._window_of[src], -1
        return True

    def window_table(self, pages: Sequence[int]) -> list[int]:
        """The window pool's block table row for a sequence's full pages (NULL where dropped)."""
        w = self._window_of
        return [w[p] if w[p] >= 0 else NULL_WINDOW_PAGE for p in pages]

    def check_window(self) -> None:
        """Every window page is free, the NULL page, or owned by exactly one full page in use;
        a free full page owns none."""
        wa = self.window_allocator
        wa.check_integrity()
        if wa.is_free(NULL_WINDOW_PAGE):
            raise AssertionError("the NULL window page is on the free list")
        owned = [w for w in self._window_of if w >= 0]
        if len(set(owned)) != len(owned):
            raise AssertionError("a window page is owned by two full pages")
        for p, w in enumerate(self._window_of):
            if w < 0:
                continue
            if self.is_free(p):
                raise AssertionError(f"free full page {p} owns window page {w}")
            if w == NULL_WINDOW_PAGE or wa.is_free(w):
                raise AssertionError(f"full page {p} owns window page {w}, which is not in use")
        if wa.num_free + len(owned) + 1 != wa.num_pages:
            raise AssertionError(
                f"window page leak: {wa.num_free} free + {len(owned)} owned + NULL "
                f"!= {wa.num_pages}"
            )

    def __repr__(self) -> str:
        return (
            f"WindowedAllocator(num_pages={self.num_pages}, num_free={self.num_free}, "
            f"window_pages={self.num_window_pages}, window_free={self.num_window_free}, "
            f"window={self.window})"
        )
