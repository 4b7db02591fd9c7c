"""State checkpoints saved inside a step's forward (``SeqSpan.saves``, docs/state_cache.md "When
checkpoints are taken"): the state layers' ``conv_varlen`` and ``ssd_varlen`` run a prefill
span whole and write the state at each save point into its slot. Held bitwise to what the
engine computed before, when the chunk was cut at each point and the save was a slot copy
before the next step: the same outputs (but for SiLU's rounding of a vector's tail), the same
states in every slot; and the metadata refuses
saves that are not strictly inside their span or that would overwrite a slot the step reads."""

from __future__ import annotations

import pytest
import torch

from radixray.worker.model.state_layers import conv_varlen, ssd_varlen
from radixray.worker.model.state_metadata import SeqSpan, StateMetadata

K, CH = 4, 6  # conv taps, channels
H, P, N, G, CHUNK = 3, 4, 5, 1, 4  # heads, head dim, state size, groups, SSD chunk
# (slot, cached, new, saves as (tokens, slot)) per sequence, in batch order: a span from a
# state saved two tokens in (within K - 1 of its start: part of the state is the initial one),
# a decode row, a fresh span saved two tokens in (the rest zeros) and past a chunk boundary.
# No piece of one token: the cut plan would run it as a decode row (another sum order).
SEQS = [
    (0, 5, 20, ((7, 3), (16, 4))),
    (2, 3, 1, ()),
    (1, 0, 12, ((2, 5), (9, 6))),
]
SPARE = 7  # no one's: must stay NaN


def _pool(shape, gen) -> torch.Tensor:
    pool = torch.randn(SPARE + 1, *shape, generator=gen)
    pool[[1, 3, 4, 5, 6, SPARE]] = float("nan")  # fresh, save destinations, spare: unread
    return pool


def _meta(seqs) -> StateMetadata:
    slots, cached, new, saves = zip(*seqs, strict=True)
    return StateMetadata.build(slots, cached, new, saves=saves)


def _cut(run, seqs, pool) -> torch.Tensor:
    """The engine's old plan: each sequence's span cut at its save points, one step per piece
    (``run(meta, row slice)``), the state copied from its slot to the save's after the piece
    that ends there."""
    outs, row = [], 0
    for slot, cached, new, saves in seqs:
        bounds = [cached, *(t for t, _ in saves), cached + new]
        for (b, e), dst in zip(zip(bounds, bounds[1:], strict=False), [*saves, None], strict=True):
            r = slice(row + b - cached, row + e - cached)
            outs.append(run(StateMetadata.build([slot], [b], [e - b]), r))
            if dst is not None:
                pool[dst[1]] = pool[slot]
        row += new
    return torch.cat(outs)


@pytest.mark.parametrize("silu", [False, True])
def test_conv_saves_inside_the_span_equal_the_cut_chunks_bitwise(silu):
    gen = torch.Generator().manual_seed(1)
    T = sum(s[2] for s in SEQS)
    u, w, b = torch.randn(T, CH, generator=gen), torch.randn(CH, K, generator=gen), None
    pool = _pool((CH, K - 1), gen)
    want_pool, initial = pool.clone(), pool[0].clone()
    got = conv_varlen(u, w, b, silu, _meta(SEQS), pool)
    want = _cut(lambda m, r: conv_varlen(u[r], w, b, silu, m, want_pool), SEQS, want_pool)
    if silu:  # torch's SiLU rounds a vector's tail differently from its body: within an ulp
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    else:
        assert torch.equal(got, want)
    assert torch.equal(pool[:SPARE], want_pool[:SPARE]) and pool[SPARE].isnan().all()
    # slot 3, after 7 tokens of a span from 5: the initial state's last input, then rows 0, 1
    assert torch.equal(pool[3], torch.cat((initial[:, 2:], u[0:2].T), dim=1))
    # slot 5, a fresh span's state after 2 tokens (rows 21, 22): a zero, then those rows
    assert torch.equal(pool[5], torch.cat((torch.zeros(CH, 1), u[21:23].T), dim=1))


def test_ssd_saves_inside_the_span_equal_the_cut_chunks_bitwise():
    gen = torch.Generator().manual_seed(2)
    T = sum(s[2] for s in SEQS)
    x = torch.randn(T, H, P, generator=gen)
    dt = torch.nn.functional.softplus(torch.randn(T, H, generator=gen))
    A = -torch.rand(H, generator=gen).add(0.5)
    B, C = torch.randn(T, G, N, generator=gen), torch.randn(T, G, N, generator=gen)
    D = torch.randn(H, generator=gen)
    pool = _pool((H, P, N), gen)
    want_pool = pool.clone()
    got = ssd_varlen(x, dt, A, B, C, D, CHUNK, _meta(SEQS), pool)

    def run(m, r):
        return ssd_varlen(x[r], dt[r], A, B[r], C[r], D, CHUNK, m, want_pool)

    assert torch.equal(got, _cut(run, SEQS, want_pool))
    assert torch.equal(pool[:SPARE], want_pool[:SPARE]) and pool[SPARE].isnan().all()


def test_build_turns_saves_into_span_offsets_and_refuses_bad_ones():
    meta = _meta(SEQS)
    assert meta.prefills == (
        SeqSpan(0, 20, 0, True, ((2, 3), (11, 4))),
        SeqSpan(21, 33, 1, False, ((2, 5), (9, 6))),
    )
    for saves, why in [
        (((5, 3),), r"in \(5, 25\)"),  # at the span's start: a copy before the step does it
        (((25, 3),), r"in \(5, 25\)"),  # at its end: the next step's start
        (((16, 3), (7, 4)), "increasing"),
        (((7, 2),), "no sequence owns"),  # the decode row's slot
        (((7, 3), (8, 3)), "distinct"),
    ]:
        with pytest.raises(ValueError, match=why):
            _meta([(0, 5, 20, saves), *SEQS[1:2]])
