"""``PageManager``: which pages a request holds, and every change to that. Ints and lists only.

The scheduler decides *who* runs (order, budget, whom to preempt); this decides *whether the
pages are there* and moves them. Each verb either does all it says or changes nothing and says
so, the shape of nano-vllm's block manager and vLLM's ``allocate_slots``::

    match(req)              the cached prefix of the request's tokens (read only)
    admit(req, m, upto)     lock the prefix, pages for positions < upto -> False: nothing changed
    admit_first(req, m, n)  admit with a first chunk of <= n tokens, loading the host-resident
                            continuation back first (all of it or none) -> None: nothing changed
    grow(req, upto)         more pages (evicting cached ones) -> False: nothing changed (preempt)
    commit(req, upto)       hand computed full pages to the cache; the request keeps them locked
    fork(src, dst)          dst shares src's cached pages and gets copies of its private ones
    release(req)            give everything back: full computed pages cached, the rest freed
    trim_window(req)        drop the window-pool pages out of req's window (a window pool only)

With ``slots`` (a model with recurrent-state layers: the state pool's slot ids, state_pool.py)
every running request holds one state slot too: ``admit`` and ``fork`` take it with the pages
(none free, even after evicting a checkpoint: nothing changes, the request waits as for pages)
and ``release`` gives it back. With a state cache (mamba_radix) a ``StateCheckpointer`` says
when states are saved and restored, and KV goes to the cache up to the last checkpoint only.

Ownership follows the contract of ``cache_index.prefix_cache``: a request's pages are
``pages[:num_tree_pages]`` (the cache's, locked through ``node``) then private pages; every page
is free, cached, or private to exactly one request (``check_integrity``).
"""

from __future__ import annotations

from collections.abc import Iterable

from radixray.cache_index import ChunkCache, PageAllocator, PrefixCache
from radixray.cache_index.prefix_cache import MatchResult
from radixray.cache_index.window_pages import WindowedAllocator

from .miss_attribution import attribute
from .request import Request
from .state_checkpointer import StateCheckpointer

__all__ = ["PageManager"]


# A host continuation shorter than this is recomputed instead of loaded back. One page: on the
# CPU a page's copy costs far less than its prefill at any page size, and on a GPU a page is
# ~page_size x KV bytes per token over PCIe (microseconds) against a forward (milliseconds).
MIN_LOAD_PAGES = 1
# With a window pool, a window-page shortage drops at least 1/this of the window pool's pages
# from the cache at once (the walk over the tree is paid once per batch, not per page).
WINDOW_EVICT_BATCH = 32


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class PageManager:
    def __init__(
        self, cache: PrefixCache, slots: PageAllocator | None = None, state_interval: int = 256
    ):
        self.cache = cache
        self.slots = slots  # the state pool's slot ids (hybrid models), else None
        # a cache of state checkpoints (mamba_radix): when states are saved and restored
        keeps = slots is not None and hasattr(cache, "lock_state")
        self.states = StateCheckpointer(cache, slots, state_interval) if keeps else None
        self.alloc = cache.allocator
        self.P = cache.page_size
        self.reuse = not isinstance(cache, ChunkCache)
        self.num_evicted_pages = 0
        self.num_loaded_pages = 0  # host pages loaded back for admitted requests
        # With a window pool (docs/window_cache.md) every page taken brings a window page too.
        self.window = self.alloc if isinstance(self.alloc, WindowedAllocator) else None
        self.num_window_dropped = 0  # window pages dropped out of running requests' windows

    @property
    def available_pages(self) -> int:
        """Pages a request could get now: free ones and cached ones nobody holds."""
        return self.alloc.num_free + self.cache.evictable_tokens // self.P

    def match(self, req: Request) -> MatchResult:
        """The cached prefix of the request's tokens; the last token is always computed (its
        logits give the next token), so it is never matched. A request that wants its prompt's
        logprobs, before its first token, matches nothing: cached pages carry no logits, so its
        whole prompt is computed (``commit`` still inserts its pages for later requests)."""
        if req.needs_prompt_logits:
            return self.cache.match_prefix([], req.extra_key)
        return self.cache.match_prefix(req.all_ids[: req.num_tokens - 1], req.extra_key)

    def peek(self, req: Request) -> int:
        """Tokens of ``req``'s prompt that ``match`` would find, read-only (no access counted):
        from the prompt's page hashes, O(edges)."""
        if req.needs_prompt_logits:
            return 0
        return self.cache.peek_prefix(req.prompt_ids, self.matchable(req), req.extra_key)

    def matchable(self, req: Request) -> list[int]:
        """Hashes of the prompt pages a match may cover: the last token is always computed, so
        a prompt's last page only counts when more tokens follow it."""
        return req.block_hashes[: (req.num_tokens - 1) // self.P]

    def admit(self, req: Request, m: MatchResult, upto: int) -> bool:
        """Lock ``m`` for ``req`` and give it pages for positions < ``upto``; the request's
        whole prompt must fit in what is available. False (nothing changed) when it does not."""
        pages = self._take_locked(m.node, req, upto, len(m.pages))
        if pages is None:
            return False
        req.pages = list(m.pages) + pages
        req.num_tree_pages = len(m.pages)
        req.node = m.node
        req.num_computed = m.num_tokens
        if self.states is not None:  # its slot gets the match's checkpoint first
            self.states.restore(req, m)
        return True

    def admit_first(self, req: Request, m: MatchResult, budget: int) -> MatchResult | None:
        """Admit ``req`` with a first chunk of up to ``budget`` tokens. If ``m`` has a host
        continuation of ``MIN_LOAD_PAGES`` or more and the pages fit, it is loaded back (all of
        it: the copies are recorded in the cache for the engine), else the request starts from
        the device prefix alone. Returns the match it starts from (``num_tokens`` of it are
        computed), or None (nothing changed) when not even that fits."""
        if m.host_node is not None:  # a host continuation: loaded back, or left behind
            loaded = (
                self._admit_loading(req, m, budget) if len(m.host_pages) >= MIN_LOAD_PAGES else None
            )
            if loaded is not None:
                return loaded
            device_part = getattr(self.cache, "device_part", None)
            if device_part is not None:  # a state cache: its device prefix ends at a checkpoint
                m = device_part(m)
        upto = m.num_tokens + min(req.num_tokens - m.num_tokens, budget)
        return m if self.admit(req, m, upto) else None

    def _admit_loading(self, req: Request, m: MatchResult, budget: int) -> MatchResult | None:
        cache = self.cache
        start = m.num_tokens + m.host_tokens
        upto = start + min(req.num_tokens - start, budget)
        # locks the whole path, both tiers: nothing on it is evicted now
        pages = self._take_locked(m.host_node, req, upto, len(m.pages))
        if pages is None:
            return None
        n_host = len(m.host_pages)
        full = cache.load_back(m, pages[:n_host])
        req.pages = list(full.pages) + pages[n_host:]
        req.num_tree_pages = len(full.pages)
        req.node = full.node
        req.num_computed = full.num_tokens
        self.num_loaded_pages += n_host
        if self.states is not None:  # its slot gets the checkpoint at the loaded end first
            self.states.restore(req, full)
        return full

    def grow(self, req: Request, upto: int) -> bool:
        """Pages for positions < ``upto``, evicting cached pages nobody holds if need be. False
        (nothing changed) when even that is not enough: the caller frees some by preempting."""
        need = _cdiv(upto, self.P) - len(req.pages)
        if need <= 0:
            return True
        pages = self._take(need)
        if pages is None:
            return False
        req.pages += pages
        return True

    def _take_locked(self, node, req: Request, upto: int, held: int) -> list[int] | None:
        """Lock ``node``, then take the pages for positions < ``upto`` beyond the ``held`` first
        ones, if the request's whole prompt fits in what is available; else unlock it again and
        return None (nothing changed). Locking first keeps the node's own pages from counting
        as evictable."""
        P = self.P
        self.cache.lock(node)  # first: a slot found by evicting a checkpoint is not this one
        if not self._slot_free():
            self.cache.unlock(node)
            return None
        self._drop_own_window(node, held, _cdiv(upto, P) - held)
        if (
            _cdiv(req.num_tokens, P) - held > self.available_pages
            or (pages := self._take(_cdiv(upto, P) - held)) is None
        ):
            self.cache.unlock(node)
            return None
        self._take_slot(req)
        return pages

    def _slot_free(self) -> bool:
        """A state slot is free, or the model keeps no state."""
        states = self.states
        return self.slots is None or self.slots.num_free > 0 or bool(states and states.free_slot())

    def chunk(self, req: Request, limit: int) -> int:
        """Tokens of ``req``'s next chunk: what is left, at most ``limit`` (a state cache's
        checkpoints inside it are saved by its forward: state_checkpointer.py)."""
        return min(req.num_tokens - req.num_computed, limit)

    def state_copies(self, items) -> tuple | list:
        """The state copies to run before the step of ``items`` (a state cache's)."""
        return self.states.take(items) if self.states is not None else ()

    def _take_slot(self, req: Request) -> None:
        """Give ``req`` a state slot (checked free by ``_slot_free``), if the model keeps state."""
        if self.slots is not None:
            assert req.state_slot is None, f"{req.request_id} already holds slot {req.state_slot}"
            req.state_slot = self.slots.alloc(1)[0]

    def _drop_own_window(self, node, held: int, n: int) -> None:
        """With a window pool short of ``n`` window pages: drop the window pages of the path to
        ``node`` (just locked) that the request's first query, after its ``held`` pages, does
        not read, where it alone holds them (``trim_window`` would after its first step). Else
        a request whose own matched path holds the window pool's pages waits for them forever:
        evict_window skips locked nodes, and with nothing running nothing else frees them."""
        win, drop_held = self.window, getattr(self.cache, "drop_window_held", None)
        if win is None or drop_held is None or n <= win.num_window_free:
            return
        out = max(0, held * self.P - win.window + 1) // self.P
        if out:
            self.num_window_dropped += drop_held(node, 0, out)

    def _take(self, n: int) -> list[int] | None:
        """``n`` pages, evicting the shortfall from the cache; None when the free and evictable
        pages together are fewer (nothing evicted, except window pages: below)."""
        if n <= 0:
            return []
        if n > self.available_pages:
            return None
        if n > self.alloc.num_free:
            self.num_evicted_pages += self.cache.evict(n - self.alloc.num_free)
        win = self.window
        if win is not None and n > win.num_window_free:
            # The cache's window eviction walks its tree: one walk drops a batch, for the next
            # allocations too. What it drops stays cached (full pages); if running requests
            # hold the rest of the window pool this still fails and the caller preempts.
            evict_window = getattr(self.cache, "evict_window", None)
            if evict_window is not None:
                short = n - win.num_window_free
                evict_window(max(short, win.num_window_pages // WINDOW_EVICT_BATCH))
            if n > win.num_window_free:
                return None
        return self.alloc.alloc(n)

    def trim_window(self, req: Request) -> None:
        """Drop the window-pool pages that no future query of ``req`` reads: a query at
        position p >= num_computed sees keys > p - W, so pages wholly before
        ``num_computed - W + 1`` are out of its window. Its private pages lose theirs; pages
        it shares with the cache lose theirs only where no other request holds them
        (``drop_window_held``). No window pool: nothing to do."""
        win = self.window
        if win is None:
            return
        upto = max(0, req.num_computed - win.window + 1) // self.P
        if upto <= req.window_start:
            return
        ntp = req.num_tree_pages
        lo = max(req.window_start, ntp)
        if lo < upto:
            self.num_window_dropped += win.drop_window(req.pages[lo:upto])
        if req.window_start < ntp and req.node is not None:
            drop_held = getattr(self.cache, "drop_window_held", None)
            if drop_held is not None:
                self.num_window_dropped += drop_held(req.node, req.window_start, min(upto, ntp))
        req.window_start = upto

    def commit(self, req: Request, upto: int) -> None:
        """Insert the full pages of ``all_ids[:upto]`` and keep them locked for ``req``; pages
        another request cached meanwhile replace ``req``'s private copies, which are freed."""
        P, cache, kw = self.P, self.cache, {}
        if self.states is not None:  # KV goes in up to its last checkpoint, with them
            upto, kw["states"] = self.states.insertable(req, upto)
        k = upto // P
        if not self.reuse or k <= req.num_tree_pages:
            return
        tokens = req.all_ids[: k * P]
        cached = cache.insert(tokens, req.pages[:k], req.extra_key, req.block_hashes, **kw)
        dups = req.pages[req.num_tree_pages : max(req.num_tree_pages, min(cached // P, k))]
        # every cached page, tombstoned window pages or not (swa_radix's match stops before)
        m = getattr(cache, "match_cached", cache.match_prefix)(tokens, req.extra_key)
        assert len(m.pages) == k, f"inserted {k} pages, matched {len(m.pages)}"
        cache.lock(m.node)
        if req.node is not None:
            cache.unlock(req.node)
        req.node = m.node
        revive = getattr(cache, "revive_window", None)
        if dups and revive is not None:  # a window pool: tombstoned cached pages come back
            revive(m.node, req.num_tree_pages, dups)
        req.pages[:k] = m.pages
        req.num_tree_pages = k
        if dups:
            self.alloc.free(dups)

    def attribute(
        self, req: Request, m: MatchResult, in_flight: set[int], host: int = 0
    ) -> dict[str, int]:
        """Why each prompt token was (not) reused (``miss_attribution.attribute``)."""
        return attribute(req, m, in_flight, host, self.cache if self.reuse else None)

    def fork(self, src: Request, dst: Request) -> list[tuple[int, int]] | None:
        """Give ``dst`` what ``src`` computed: ``src``'s cached pages (locked for ``dst`` too)
        and a copy of each private page holding computed tokens (the partial last page, or with
        reuse off every page), and its own state slot. Returns the (source, copy) pairs, whose KV
        the caller copies (and ``src``'s state into ``dst``'s slot); None (nothing changed) when
        the copies or a slot do not fit."""
        private = src.pages[src.num_tree_pages : _cdiv(src.num_computed, self.P)]
        if not self._slot_free():
            return None
        copies = self._take(len(private))
        if copies is None:
            return None
        self._take_slot(dst)  # the caller copies src's state into it, with the pages' KV
        self.cache.lock(src.node)
        dst.pages = src.pages[: src.num_tree_pages] + copies
        dst.num_tree_pages = src.num_tree_pages
        dst.node = src.node
        dst.num_computed = src.num_computed
        return list(zip(private, copies, strict=True))

    def release(self, req: Request) -> None:
        """Give every page back: computed full pages to the cache (kept for reuse), the rest to
        the allocator; drop the lock; free its state slot (the state in it is dropped)."""
        P, cache, kw = self.P, self.cache, {}
        k = req.num_computed // P
        if self.states is not None:  # KV up to its last checkpoint, with them
            end, kw["states"] = self.states.insertable(req, req.num_computed)
            self.states.unkept(req, end)
            k = end // P
        ntp = req.num_tree_pages
        to_free: list[int] = []
        if k > ntp or (not self.reuse and k > 0):
            tokens = req.all_ids[: k * P]
            cached = cache.insert(tokens, req.pages[:k], req.extra_key, req.block_hashes, **kw)
            to_free += req.pages[ntp : max(ntp, min(cached // P, k))]  # duplicates
            to_free += req.pages[k:]
        else:
            to_free += req.pages[ntp:]
        if req.node is not None:
            cache.unlock(req.node)
        if to_free:
            self.alloc.free(to_free)
        if req.state_slot is not None:
            self.slots.free([req.state_slot])
            req.state_slot = None
        if self.states is not None:
            self.states.drop(req)
        req.pages = []
        req.num_tree_pages = 0
        req.node = None
        req.window_start = 0

    def check_integrity(self, holders: Iterable[Request], idle: Iterable[Request] = ()) -> None:
        """Every page is free, cached or private to exactly one of ``holders``; each holder has
        pages for what it computed; ``idle`` requests hold none; every state slot is free or
        held by exactly one holder."""
        holders = list(holders)
        held = [p for r in holders for p in r.private_pages]
        if self.states is not None:  # both pools: each slot free, a request's, or cached
            slots = [s for r in holders for s in (r.state_slot, *r.checkpoints.values())]
            self.cache.check_integrity(held_pages=held, held_slots=slots)
        else:
            self.cache.check_integrity(held_pages=held)
        if self.window is not None:
            self.window.check_window()
        for r in holders:
            if len(r.pages) < _cdiv(r.num_computed, self.P):
                raise AssertionError(
                    f"{r.request_id} computed {r.num_computed} tokens "
                    f"but holds {len(r.pages)} pages"
                )
        for r in idle:
            if r.pages or r.node is not None or r.state_slot is not None or r.checkpoints:
                raise AssertionError(f"waiting request {r.request_id} holds pages or a slot")
        if self.slots is not None:
            self._check_slots(holders)

    def _check_slots(self, holders: list[Request]) -> None:
        """Every state slot is free or held by exactly one running request, which holds one."""
        self.slots.check_integrity()
        held = [r.state_slot for r in holders]
        if None in held:
            raise AssertionError(f"running {holders[held.index(None)].request_id} has no slot")
        if len(set(held)) != len(held) or any(self.slots.is_free(s) for s in held):
            raise AssertionError(f"state slots held twice or held while free: {held}")
        if self.states is None and len(held) != self.slots.num_used:
            raise AssertionError(
                f"{self.slots.num_used} state slots in use, {len(held)} held by running requests"
            )
