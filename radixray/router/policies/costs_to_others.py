"""What a placement costs the requests already on a worker, beside its own time to first token
(docs/ttft_policy.md): the decode steps its answer adds (``decode_cost``), the wait its first
chunk adds to the prefill it is packed with (``packing_delay``), and the fleet-wide inputs they
read (``answer_tokens``, ``pages_in_use``)."""

from __future__ import annotations

from collections.abc import Sequence

from .base import WorkerState

__all__ = ["answer_tokens", "decode_cost", "packing_delay", "pages_in_use"]


def pages_in_use(live: Sequence[WorkerState]) -> float:
    """The share of the fleet's pages in use (of the workers that report their pages)."""
    total = free = 0
    for w in live:
        if w.total_pages:
            total += w.total_pages
            free += w.free_pages
    return 1.0 - free / total if total else 0.0


def answer_tokens(live: Sequence[WorkerState]) -> float:
    """The tokens a request is expected to decode: the mean of what the workers report (the
    workload's, not the worker's: it does not depend on where the request goes); 0 before any
    worker has seen a sequence end."""
    total, known = 0.0, 0
    for w in live:
        if w.answer_tokens > 0:
            total += w.answer_tokens
            known += 1
    return total / known if known else 0.0


def packing_delay(w: WorkerState, queued: float, own: float) -> float:
    """Seconds a placement adds to the request whose prefill ends last in ``w``'s queue: the
    engine packs the next prompt's first chunk into the rest of that request's last step
    (chunked prefill fills every step's budget), and its first token waits for the whole step.
    ``min(own, room)`` tokens at the fit's rate, ``room`` the budget that step has left after
    the queue's last chunk and the decodes; nothing when nothing is queued, or the queue ends
    on a step's boundary, or ``w`` reports no budget."""
    budget = w.max_batch_tokens - w.running
    if queued <= 0 or own <= 0 or budget <= 0:
        return 0.0
    return min(own, -queued % budget) / w.prefill_tokens_per_s


def decode_cost(w: WorkerState, answer: float, steps: bool = True) -> float:
    """Seconds a placement's answer of ``answer`` tokens adds, on ``w``, to the requests already
    there (docs/ttft_policy.md, "Decode cost"). Each of its decode steps is ``decode_seq_s``
    longer for everyone sharing it: a waiting request waits through all of it, a running one
    overlaps about half. And while ``w``'s steps are full of queued prefill (its queue at least
    a step's budget less its decodes), each answer token takes a budget token from that prefill:
    every request still waiting for its first token (at least the one in prefill) waits a
    prefill token's time more. That token is priced as ttft prices a recompute, by ``steps``
    (with its share of a full step, most of the step on small budgets) or at the fit's rate
    alone: the two sides of the trade in one unit (by steps against recomputes at the rate, on a
    4-token budget it would outweigh every cached prefix). The answer's own steps cost the same
    on any worker; what differs is who waits."""
    if not answer:
        return 0.0
    per_token = w.decode_seq_s * (w.running / 2 + w.waiting)
    spare = w.max_batch_tokens - w.running
    if w.max_batch_tokens and w.queued_prefill_tokens >= spare:
        per_token += max(w.waiting, 1) * w.token_s(steps)
    return answer * per_token
