"""The page manager under random sequences of its verbs (hypothesis state machine): every page
is always free, cached or private to exactly one request, and admit / grow either do all they
say or change nothing."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixray.cache_index import PageAllocator, RadixCache, hash_blocks
from radixray.protocol import SamplingParams
from radixray.worker.page_manager import PageManager
from radixray.worker.request import Request

P = 4
PAGES = 12
# Prompts share prefixes: a few stems, then a tail.
STEMS = [list(range(100, 112)), list(range(200, 206)), []]


class PageManagerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.alloc = PageAllocator(PAGES)
        self.pm = PageManager(RadixCache(P, self.alloc))
        self.running: list[Request] = []
        self.idle: list[Request] = []
        self.n = 0

    def snapshot(self, req: Request):
        c = self.pm.cache
        return (self.alloc.num_free, c.total_tokens, c.evictable_tokens, list(req.pages),
                req.num_tree_pages, req.node, req.num_computed)  # fmt: skip

    @rule(stem=st.integers(0, len(STEMS) - 1), tail=st.integers(1, 9), chunk=st.integers(1, 16))
    def admit(self, stem, tail, chunk):
        self.n += 1
        prompt = STEMS[stem] + [1000 * self.n + i for i in range(tail)]
        req = Request(f"r{self.n}", prompt, SamplingParams(max_tokens=4), hash_blocks(prompt, P))
        m = self.pm.match(req)
        upto = min(m.num_tokens + chunk, req.num_tokens)
        before = self.snapshot(req)
        if self.pm.admit(req, m, upto):
            assert req.num_computed == m.num_tokens and len(req.pages) * P >= upto
            self.running.append(req)
        else:
            assert self.snapshot(req) == before  # nothing changed
            self.idle.append(req)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), more=st.integers(1, 12))
    def compute_and_grow(self, i, more):
        req = self.running[i % len(self.running)]
        # what it was given is computed; it wants pages for `more` tokens after that
        req.num_computed = min(len(req.pages) * P, req.num_tokens)
        if req.num_computed == req.num_tokens:
            req.output_ids.append(7)  # a sampled token extends it
        self.pm.commit(req, req.num_computed)
        upto = min(req.num_computed + more, req.num_tokens)
        before = self.snapshot(req)
        if not self.pm.grow(req, upto):
            assert self.snapshot(req) == before
        else:
            assert len(req.pages) * P >= upto

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100))
    def release(self, i):
        req = self.running.pop(i % len(self.running))
        self.pm.release(req)
        assert req.pages == [] and req.node is None
        self.idle.append(req)

    @invariant()
    def pages_are_accounted_for(self):
        self.pm.check_integrity(self.running, self.idle)
        held = sum(len(r.private_pages) for r in self.running)
        assert self.alloc.num_free + self.pm.cache.total_tokens // P + held == PAGES


PageManagerMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
TestPageManager = PageManagerMachine.TestCase
