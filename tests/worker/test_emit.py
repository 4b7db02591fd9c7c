"""A step's tokens into their requests (worker/emit.py): the steady requests' one loop gives
the general path's chunks, ends and pages, whatever ends a request (a stop token, EOS, a stop
string, ``max_tokens``, one that fills the model's length), serially and overlapped."""

from __future__ import annotations

import pytest

from radixray.worker import Engine, EngineConfig, SamplingParams, emit
from tests.worker.test_engine import assert_no_leak

MAX_LEN = 40


def _params(stop_tok: int, stop_text: str) -> list[SamplingParams]:
    greedy = {"temperature": 0.0, "max_tokens": 12}
    return [
        SamplingParams(**greedy, ignore_eos=True),  # length
        SamplingParams(**greedy, ignore_eos=True, stop_token_ids=[stop_tok]),
        SamplingParams(**greedy),  # the model's EOS, if it samples one
        SamplingParams(**greedy, ignore_eos=True, stop=[stop_text]),
        SamplingParams(temperature=0.0, max_tokens=MAX_LEN - 18, ignore_eos=True),  # fills it
        SamplingParams(temperature=0.9, top_p=0.9, seed=5, max_tokens=9, ignore_eos=True),
    ]


def _run(overlap: str, params: list[SamplingParams], prompts) -> tuple[list, int]:
    """Every chunk each request streamed, and how many took the steady loop."""
    e = Engine(
        EngineConfig(
            model="tiny", page_size=4, num_pages=256, device="cpu", seed=0, overlap=overlap,
            max_model_len=MAX_LEN, debug_checks=True,
        )
    )  # fmt: skip
    chunks: dict[str, list] = {}
    steady = 0

    def sink_for(rid):
        def sink(chunk):
            nonlocal steady
            live = e._live.get(rid)
            steady += live is not None and live.steady is not None and chunk.finish_reason is None
            chunks[rid].append(chunk)

        return sink

    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        req = e.requests.build(prompt, p, f"r{i}", None)
        chunks[req.request_id] = []
        e.add(req, sink_for(req.request_id))
    while e.has_work():
        e.step()
    assert_no_leak(e)
    e.shutdown()
    return [chunks[k] for k in sorted(chunks)], steady


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_steady_loop_gives_the_general_paths_chunks(overlap, monkeypatch):
    prompts = [[(5 * i + j) % 200 + 3 for j in range(14 + i)] for i in range(6)]
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    probe, _ = _run("off", [greedy] * 6, prompts)
    text = "".join(c.text for c in probe[3])
    params = _params(probe[1][2].token_ids[0], text[3:5] if len(text) >= 5 else text[-1])
    fast, steady = _run(overlap, params, prompts)
    monkeypatch.setattr(emit, "settle", lambda *a: None)  # every token the general path
    slow, none = _run(overlap, params, prompts)
    assert fast == slow and none == 0
    reasons = [c[-1].finish_reason for c in fast]
    assert reasons[1] == "stop" and len(fast[1]) <= 3  # its stop token (its third, or before)
    assert reasons[3] == "stop" and reasons[4] == "length"
    assert len(fast[4]) == MAX_LEN - len(prompts[4])  # up to the model's length
    # every token but each request's first and its last took the loop
    assert steady == sum(max(len(c) - 2, 0) for c in fast) > 30
