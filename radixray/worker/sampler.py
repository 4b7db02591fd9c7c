"""Next-token sampling: the logits controls (``logits_controls``), then greedy or temperature,
min-p, top-k, top-p, with a per-request seed."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from operator import attrgetter

import torch

from radixray.protocol import SamplingParams

from .logits_controls import apply_controls, apply_min_p, token_counts
from .model.upload import upload

__all__ = ["Sampler", "apply_token_bitmask"]

_MIN_TEMPERATURE = 1e-5


_BITS = torch.arange(32, dtype=torch.int32)
_PLAIN = attrgetter("plain_greedy")  # Request.plain_greedy


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows=None) -> None:
    """Sets to -inf, in place, every logit whose bit is 0 in ``bitmask`` [m, ceil(vocab/32)]
    (int32 words, bit j of word w allows id 32*w + j: xgrammar's and llguidance's layout).
    ``rows``: the m rows of ``logits`` the mask is for (default all); the others are untouched."""
    vocab = logits.shape[-1]
    bits = bitmask.to(logits.device).unsqueeze(-1) >> _BITS.to(logits.device)
    allowed = (bits & 1).bool().flatten(1)[:, :vocab]
    if rows is None:
        logits.masked_fill_(~allowed, float("-inf"))
        masked = logits
    else:
        idx = torch.as_tensor(rows, device=logits.device)
        masked = logits[idx].masked_fill(~allowed, float("-inf"))
    # A row the controls and the grammar together leave empty (min_tokens holds back the stop
    # token that is all the grammar allows): the grammar wins, uniform over what it allows.
    empty = torch.isneginf(masked).all(dim=-1)
    if empty.any():
        masked[empty] = torch.zeros_like(masked[empty]).masked_fill(~allowed[empty], float("-inf"))
    if rows is not None:
        logits[idx] = masked


class _Column(Sequence):
    """One attribute of each of ``reqs``, read when a row is indexed."""

    __slots__ = ("_reqs", "_name")

    def __init__(self, reqs: Sequence, name: str):
        self._reqs, self._name = reqs, name

    def __len__(self) -> int:
        return len(self._reqs)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [getattr(r, self._name) for r in self._reqs[i]]
        return getattr(self._reqs[i], self._name)


class Sampler:
    """Samples one token per row of logits, on the logits' device, for the whole batch at once.

    Greedy rows take the argmax. The others are drawn by the exponential race (vLLM's): after
    the temperature, top-k and top-p, a row's token is the argmax of its probabilities over
    exponential noise, which picks each token with its probability. Each row's noise comes
    from its request's generator when it has a ``seed`` (so its tokens do not depend on what
    else shares the batch), else from the engine's (seeded ``seed``). The penalties' token
    counts are kept on the device per request and updated from the sampled ids, never
    uploaded again (``logits_controls``). ``eos_ids``: the model's stop tokens, which
    ``min_tokens`` holds back (with each request's ``stop_token_ids``)."""

    def __init__(self, seed: int = 0, eos_ids: Collection[int] = ()):
        self.eos_ids = frozenset(eos_ids)
        self._seed = seed
        self._default: dict[torch.device, torch.Generator] = {}  # the engine's, per device
        self._per_request: dict[str, torch.Generator] = {}
        # penalized requests: (output token counts, prompt tokens seen), each [vocab]
        self._counts: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def forget(self, request_id: str) -> None:
        self._per_request.pop(request_id, None)
        self._counts.pop(request_id, None)

    def _generator(
        self, request_id: str, params: SamplingParams, device: torch.device
    ) -> torch.Generator:
        if params.seed is None:
            gen = self._default.get(device)
            if gen is None:
                gen = self._default[device] = torch.Generator(device).manual_seed(self._seed)
            return gen
        gen = self._per_request.get(request_id)
        if gen is None:
            # manual_seed takes [-2**63, 2**64): fold signed seeds into the unsigned range.
            gen = self._per_request[request_id] = torch.Generator(device).manual_seed(
                params.seed % (1 << 64)
            )
        return gen

    def sample_requests(self, logits: torch.Tensor, reqs: Sequence, **grammar) -> list[int]:
        """``sample`` for the scheduler's requests (a row each): a row's request id, prompt and
        output are read only where it needs them (a greedy row without controls: never), and
        a batch of such rows (``Request.plain_greedy``) skips asking each row's params."""
        if all(map(_PLAIN, reqs)):  # (C-level: no generator frame a row)
            return self.sample(logits, (), (), plain=True, **grammar)
        return self.sample(
            logits,
            _Column(reqs, "request_id"),
            [r.params for r in reqs],
            _Column(reqs, "prompt_ids"),
            _Column(reqs, "output_ids"),
            **grammar,
        )

    def sample(
        self,
        logits: torch.Tensor,
        request_ids: list[str],
        params: list[SamplingParams],
        prompt_ids: Sequence[Sequence[int]] | None = None,
        output_ids: Sequence[Sequence[int]] | None = None,
        grammar_mask: tuple[list[int], torch.Tensor] | None = None,
        plain: bool = False,
    ) -> list[int]:
        """logits [n, vocab] (any device) -> n token ids. ``prompt_ids`` and ``output_ids``
        (each row's tokens so far) are needed only by the penalties (at a request's first
        sampled token: then its counts stay on the device) and ``min_tokens``.
        ``grammar_mask``: (rows, bitmask) of the rows under a grammar, applied after the
        controls. ``plain``: every row is greedy without controls (the caller knows)."""
        return self.sample_ids(
            logits, request_ids, params, prompt_ids, output_ids, grammar_mask, plain=plain
        ).tolist()

    def sample_ids(
        self,
        logits: torch.Tensor,
        request_ids: list[str],
        params: list[SamplingParams],
        prompt_ids: Sequence[Sequence[int]] | None = None,
        output_ids: Sequence[Sequence[int]] | None = None,
        grammar_mask: tuple[list[int], torch.Tensor] | None = None,
        num_output: Sequence[int] | None = None,
        plain: bool = False,
    ) -> torch.Tensor:
        """``sample``'s ids as an int64 tensor on the logits' device, with no wait for the
        device (they stay there, ``overlap.py``). ``num_output``: each row's output tokens so
        far, those not read back yet included (default: ``len(output_ids[i])``). ``plain``: as
        ``sample``'s."""
        given = logits
        logits = logits if logits.dtype == torch.float32 else logits.float()  # (a call less)
        counted = states = None
        if not plain and any(p.uses_controls for p in params):
            empty = [()] * len(params)
            prompt_ids = empty if prompt_ids is None else prompt_ids
            output_ids = empty if output_ids is None else output_ids
            states = self._penalty_counts(logits, request_ids, params, prompt_ids, output_ids)
            if states:  # (rows, output counts, prompt tokens seen), stacked
                rows, kept = zip(*states, strict=True)
                counts, seen = zip(*kept, strict=True)
                counted = (list(rows), torch.stack(counts), torch.stack(seen))
            logits = apply_controls(
                logits, params, prompt_ids, output_ids, self.eos_ids, counted, num_output
            )
            logits = apply_min_p(logits, params, _MIN_TEMPERATURE)
        if grammar_mask is not None:  # after the controls: see apply_token_bitmask
            if logits is given:  # no copy was made: leave the caller's tensor alone
                logits = logits.clone()
            apply_token_bitmask(logits, grammar_mask[1], grammar_mask[0])
        out = logits.argmax(dim=-1)
        rows = [] if plain else [i for i, p in enumerate(params) if not p.greedy]
        if rows:
            drawn = self._draw(
                logits, rows, [request_ids[i] for i in rows], [params[i] for i in rows]
            )
            out[upload(rows, torch.int64, out.device)] = drawn
        if states:  # the sampled tokens join their requests' counts (no sync)
            one = torch.ones(1, device=out.device)
            for i, (counts, _) in states:
                counts.index_add_(0, out[i : i + 1], one)
        return out

    def _penalty_counts(self, logits, request_ids, params, prompt_ids, output_ids):
        """(row, (output counts, prompt tokens seen)) of each row with a penalty: its request's
        counts on the device, made from its tokens the first time (its first sampled token,
        or after the engine forgot it); none without a penalty."""
        pen = [i for i, p in enumerate(params) if p.penalized]
        vocab, dev = logits.shape[1], logits.device
        out = []
        for i in pen:
            state = self._counts.get(request_ids[i])
            if state is None:
                state = self._counts[request_ids[i]] = (
                    token_counts([output_ids[i]], vocab, dev)[0],
                    token_counts([prompt_ids[i]], vocab, dev)[0] > 0,
                )
            out.append((i, state))
        return out

    def _draw(
        self, logits: torch.Tensor, rows: list[int], ids: list[str], params: list[SamplingParams]
    ) -> torch.Tensor:
        """One token for each of ``rows`` (not greedy): temperature, top-k, top-p, then the
        exponential race, all rows at once."""
        dev = logits.device
        temps = upload([max(p.temperature, _MIN_TEMPERATURE) for p in params], torch.float32, dev)
        # Below _MIN_TEMPERATURE the distribution is one-hot in float32 anyway; a subnormal
        # temperature would overflow the logits to inf and the softmax to NaN. A tiny
        # repetition_penalty can push a logit to +inf (softmax: NaN): capped.
        sub = (logits[rows] / temps.unsqueeze(1)).clamp(max=torch.finfo(torch.float32).max)
        vocab = sub.shape[1]
        ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
        if min(ks) < vocab:
            top = torch.topk(sub, max(ks), dim=-1).values
            kth = top.gather(1, upload(ks, torch.int64, dev).unsqueeze(1) - 1)
            sub = sub.masked_fill(sub < kth, float("-inf"))
        probs = torch.softmax(sub, dim=-1)
        if any(p.top_p < 1.0 for p in params):
            # Keep the smallest set whose mass reaches top_p (the first token always stays).
            tops = [p.top_p if p.top_p < 1.0 else float("inf") for p in params]
            sorted_p, idx = torch.sort(probs, dim=-1, descending=True)
            drop = (
                torch.cumsum(sorted_p, dim=-1) - sorted_p
                >= upload(tops, torch.float32, dev)[:, None]
            )
            drop[:, 0] = False  # even a top_p that rounds to 0 in float32 keeps the top token
            probs = torch.zeros_like(probs).scatter_(1, idx, sorted_p.masked_fill(drop, 0.0))
        noise = torch.empty_like(probs)
        for j, (rid, p) in enumerate(zip(ids, params, strict=True)):
            noise[j].exponential_(generator=self._generator(rid, p, dev))
        return (probs / noise.clamp_(min=torch.finfo(torch.float32).tiny)).argmax(dim=-1)
