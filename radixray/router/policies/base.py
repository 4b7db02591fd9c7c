"""The routing contract: what a policy sees, what it returns, and the registry of policies.

A policy is a small object with one decision method::

    decision = policy.choose(request, workers, index)

``request`` is a :class:`RoutingRequest` (the prompt's page hashes, already computed by the router,
and the router's place in its fleet), ``workers`` the current :class:`WorkerState` of every
candidate, ``index`` the router's :class:`~radixray.cache_index.ApproxIndex`. What varies per
request comes in these arguments: no caller sets attributes on a shared policy. ``choose`` never
mutates ``workers`` or ``index``: the caller (the live router or ``radixray.sim``) applies the
decision, records the optimistic index entry and tells the policy through the optional feedback
hooks:

- ``on_dispatch(decision, request)``: the request was sent to ``decision.worker_id``;
- ``on_first_token(request_id, worker_id)``: its prefill is done (its first token arrived);
- ``on_complete(request_id, worker_id, cached_tokens)``: it finished, with its actual reuse, or
  failed (cached 0).

Policies keep only their own small state (a round-robin counter, an rng, a hash ring); every rate
they use comes from :class:`WorkerState` (measured by the workers), never from a constant here.
Nothing in this package imports the simulator.
"""

from __future__ import annotations

import dataclasses
import inspect
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import xxhash

from radixray.step_cost import queue_wait_seconds

if TYPE_CHECKING:  # only for type hints: policies read the index, they never build one
    from radixray.cache_index import ApproxIndex

__all__ = [
    "RoutingRequest",
    "WorkerState",
    "Decision",
    "Policy",
    "register_policy",
    "make_policy",
    "policy_names",
    "healthy",
    "separating_term",
    "NoHealthyWorker",
]


@dataclass(frozen=True, slots=True)
class RoutingRequest:
    """One request as the router sees it.

    ``block_hashes`` are ``hash_blocks(prompt, index.page_size)``: one per *full* page, so a
    match of ``n`` blocks means ``n * page_size`` cached tokens. ``fleet`` is where the router
    stands as it routes this request: (its rank, how many routers) among the routers that share
    the workers, as the workers' reports list them (``Policy.pick_tied`` reads it).
    """

    request_id: Hashable
    num_tokens: int
    block_hashes: Sequence[int]
    session_key: str | None = None
    arrival_time: float = 0.0
    fleet: tuple[int, int] = (0, 1)
    # The client's ``prompt_cache_key`` (OpenAI's field for cache-friendly routing): ``ttft``
    # breaks exact ties by it (``Policy.pick_tied``), so every router sends a key's ties to
    # the same worker. ``session_key`` carries it too (else the ``user``).
    cache_key: str | None = None


@dataclass(frozen=True, slots=True)
class WorkerState:
    """A worker's load as last reported (or tracked by the router between reports).

    ``queued_prefill_tokens`` is the prefill work already accepted and not yet computed (uncached
    tokens of waiting requests plus what is left of the one in prefill). ``active_decode_tokens``
    is the context held by decoding requests. ``prefill_overhead_s`` and ``prefill_tokens_per_s``
    are the prefill step cost fit (``overhead + tokens / rate``) the router pools over the
    workers of one performance class (``radixray.step_cost``); ``decode_step_s`` is the worker's
    own moving average of a decode-only step; ``load_tokens_per_s`` and ``load_overhead_s`` its
    host tier's measured load-back cost.
    """

    worker_id: Hashable
    running: int = 0
    waiting: int = 0
    queued_prefill_tokens: int = 0
    active_decode_tokens: int = 0
    free_pages: int = 0
    total_pages: int = 0
    prefill_tokens_per_s: float = 1.0
    prefill_overhead_s: float = 0.0  # fixed cost of a prefill step (rate is per extra token)
    decode_step_s: float = 0.0
    healthy: bool = True
    # Its host tier's load-back (docs/host_tier.md), in prompt tokens: ``overhead + tokens /
    # rate``; a rate of 0 means no host tier.
    load_tokens_per_s: float = 0.0
    load_overhead_s: float = 0.0
    # The token budget of one engine step (0: not reported; then a step holds whatever is
    # queued): admission prices queued prefill by steps (``step_cost.queue_wait_seconds``).
    max_batch_tokens: int = 0
    # Its host tier's pages, free and in all (0 in all: none, or not reported): a placement's
    # demotions beyond the free ones push older prefixes out of the host tier.
    host_free_pages: int = 0
    host_total_pages: int = 0
    # Seconds one more decoding sequence adds to each of its steps (pooled per class, 0: not
    # known) and the tokens a sequence decodes here on average (0: none ended yet).
    decode_seq_s: float = 0.0
    answer_tokens: float = 0.0
    # Whether its cache keeps prefixes (False: the reuse-off "chunk" cache, which hybrid models
    # with state layers run): the router then indexes nothing on it, so no policy predicts a hit
    # there that the worker cannot deliver.
    reuses: bool = True

    def queue_wait_s(self) -> float:
        """Seconds before a request sent here now starts its first step, behind the queued
        prefill (``step_cost.queue_wait_seconds``; 0 when nothing is queued): what admission
        limits."""
        return queue_wait_seconds(
            self.queued_prefill_tokens,
            self.running,
            self.max_batch_tokens,
            self.prefill_overhead_s,
            self.prefill_tokens_per_s,
            self.decode_step_s,
        )

    def load_time(self, tokens: int) -> float:
        """Seconds to load ``tokens`` back from the host tier (0 for none)."""
        if tokens <= 0 or self.load_tokens_per_s <= 0:
            return 0.0
        return self.load_overhead_s + tokens / self.load_tokens_per_s

    @property
    def load(self) -> int:
        """Outstanding requests: what SGLang's router calls the running queue."""
        return self.running + self.waiting


@dataclass(frozen=True, slots=True)
class Decision:
    """Where a request goes and why. ``scores`` maps worker id -> the policy's score (lower is
    better unless the policy's docstring says otherwise); it is for logs and debugging.
    ``headroom``: the fleet's spare capacity as the policy estimates it (``Headroom``: ``1 -
    rho``, <= 0 when saturated), None for policies that do not estimate it. ``tiers``: the
    index's ``match_tiers`` answer the policy read for this request, handed on so that the
    decision record does not walk the index again (None: the policy did not read it).
    ``terms``: for a policy whose score is a sum of named terms (``ttft``), worker id -> the
    terms' values in ``term_names`` order, and ``decided_by`` the term that separated the
    winner from the runner-up (None for other policies)."""

    worker_id: Hashable
    reason: str
    predicted_cached_tokens: int = 0
    scores: dict = field(default_factory=dict)
    headroom: float | None = None
    tiers: dict | None = None
    terms: dict | None = None
    term_names: tuple[str, ...] = ()
    decided_by: str | None = None


class NoHealthyWorker(RuntimeError):
    """``choose`` was called with no healthy worker: the caller answers 503, not the policy."""


def healthy(workers: Sequence[WorkerState]) -> list[WorkerState]:
    """The healthy workers, in the order given; raises NoHealthyWorker when there is none."""
    out = [w for w in workers if w.healthy]
    if not out:
        raise NoHealthyWorker(f"no healthy worker among {len(workers)}")
    return out


_NO_RUNNER = object()


def separating_term(winner: Hashable, scores: dict, terms: dict, names: Sequence[str]) -> str:
    """For a score that is a sum of named terms (``Decision.terms``): the name of the term whose
    difference most separated ``winner`` from the runner-up (the next lowest score, the first
    of equals; the first of equal gaps), "tie" when they score the same, "alone" with one
    candidate. Plain loops: it runs once per routed request (a few hundred ns for two workers,
    min/max with a key and a list of gaps took ~5x that)."""
    runner, low = _NO_RUNNER, None
    for k, s in scores.items():
        if k != winner and (runner is _NO_RUNNER or s < low):
            runner, low = k, s
    if runner is _NO_RUNNER:
        return "alone"
    if low == scores[winner]:
        return "tie"
    won, lost = terms[winner], terms[runner]
    term, widest = 0, lost[0] - won[0]
    for i in range(1, len(names)):
        if (gap := lost[i] - won[i]) > widest:
            term, widest = i, gap
    return names[term]


class Policy(ABC):
    """Chooses a worker for a request. Must be cheap: it runs once per request in the router.

    ``choose`` reads ``request``, ``workers`` and ``index`` and changes only the policy's own
    state (counters, rng). It calls ``index.match`` at most once. It raises
    :class:`NoHealthyWorker` when no worker is healthy and never returns an unhealthy worker.
    """

    name: str = ""

    def __init__(self, seed: int | None = 0):
        self.rng = random.Random(seed)
        self._ties = 0

    def pick_tied(
        self, best: Sequence[WorkerState], fleet: tuple[int, int] = (0, 1), key: str | None = None
    ) -> WorkerState:
        """One of equally good workers. With a ``key`` (the request's ``cache_key``), the one
        the key hashes to (highest random weight of key and worker id): every router picks the
        same one, and a key's ties keep going where its pages are whichever workers come and go
        (only the ties that picked a departed worker move). Else, alone (``fleet``, the
        request's: (rank, routers)), a seeded random one; in a fleet of routers, the one at
        this router's rank in worker-id order, then the next on each later tie: routers that
        see the same idle workers at the same moment (a burst split across them, before any
        report shows their choices) then start on different workers instead of all taking the
        same "best" one (each router's own tally spreads its later requests)."""
        if len(best) == 1:
            return best[0]
        if key is not None:
            return max(best, key=lambda w: xxhash.xxh64_intdigest(f"{key}\0{w.worker_id}".encode()))
        rank, size = fleet
        if size <= 1:
            return self.rng.choice(best)
        ordered = sorted(best, key=lambda w: str(w.worker_id))
        self._ties += 1
        return ordered[(rank + self._ties - 1) % len(ordered)]

    @staticmethod
    def lowest(
        live: Sequence[WorkerState], costs: Sequence[float]
    ) -> tuple[list[WorkerState], dict]:
        """The workers of lowest cost (all of them on a tie) and every worker's cost, from
        ``costs``, one per worker of ``live`` in its order."""
        scores = {}
        best_cost = None
        best: list[WorkerState] = []
        for w, c in zip(live, costs, strict=True):
            scores[w.worker_id] = c
            if best_cost is None or c < best_cost:
                best_cost, best = c, [w]
            elif c == best_cost:
                best.append(w)
        return best, scores

    @abstractmethod
    def choose(
        self, request: RoutingRequest, workers: Sequence[WorkerState], index: ApproxIndex
    ) -> Decision: ...

    def on_dispatch(self, decision: Decision, request: RoutingRequest) -> None:  # noqa: B027
        """The request was sent where ``decision`` says (optional hook)."""

    def on_first_token(self, request_id: Hashable, worker_id: Hashable) -> None:  # noqa: B027
        """The request's first token arrived: its prefill is done (optional hook)."""

    def on_complete(  # noqa: B027
        self, request_id: Hashable, worker_id: Hashable, cached_tokens: int
    ) -> None:
        """The request finished with ``cached_tokens`` actually reused (optional hook)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


_REGISTRY: dict[str, Callable[..., Policy]] = {}


def register_policy(name: str) -> Callable[[type[Policy]], type[Policy]]:
    """Class decorator: make a policy constructible by ``make_policy(name)``."""

    def deco(cls: type[Policy]) -> type[Policy]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"policy name {name!r} is already registered")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def policy_names() -> list[str]:
    return sorted(_REGISTRY)


def make_policy(name: str, **kwargs) -> Policy:
    """Build a registered policy by name; kwargs go to its constructor.

    ``name`` may carry constructor arguments as a spec, ``"name:key=value:key=value"`` (e.g.
    ``"cache_aware_v03:fallback=smallest_cache"``, what ``radixray sim --policies`` and the notebook
    take); values are read as int, float, true/false/none, else a string, and win over
    ``kwargs``. A policy built from a spec with arguments is named by the whole spec, so that
    two variants of one policy stay apart in a report.
    """
    base, *params = name.split(":")
    try:
        cls = _REGISTRY[base]
    except KeyError:
        raise ValueError(
            f"unknown routing policy {base!r}; valid names: {', '.join(policy_names())}"
        ) from None
    spec_args = dict(_spec_arg(name, p) for p in params)
    accepted = _init_params(cls)
    unknown = sorted(set(spec_args) - set(accepted))
    if unknown:
        valid = ", ".join(accepted)
        raise ValueError(
            f"policy {base!r} has no parameter {unknown[0]!r}; its parameters: {valid}"
        )
    policy = cls(**(kwargs | spec_args))
    if params:
        policy.name = name
    return policy


def _init_params(cls: type) -> list[str]:
    """The keyword arguments ``cls(...)`` takes, through subclasses that pass ``**kwargs`` on,
    and the fields of its ``settings_class`` (a config dataclass it takes by field name)."""
    config = getattr(cls, "settings_class", None)
    names: list[str] = [f.name for f in dataclasses.fields(config)] if config else []
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(klass.__init__).parameters.values()
        names += [p.name for p in params if p.name != "self" and p.kind is p.POSITIONAL_OR_KEYWORD
                  and p.name not in names]  # fmt: skip
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names


def _spec_arg(spec: str, part: str) -> tuple[str, object]:
    key, sep, text = part.partition("=")
    if not sep or not key:
        raise ValueError(f"policy spec {spec!r}: expected key=value after ':', got {part!r}")
    low = text.lower()
    if low in ("true", "false"):
        return key, low == "true"
    if low == "none":
        return key, None
    for parse in (int, float):
        try:
            return key, parse(text)
        except ValueError:
            pass
    return key, text
