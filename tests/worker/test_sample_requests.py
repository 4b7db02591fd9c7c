"""``Sampler.sample_requests`` reads each row's request id, prompt and output from the requests
only where the row needs them, and samples exactly as ``sample`` given those lists."""

from types import SimpleNamespace

import torch

from radixray.protocol import SamplingParams
from radixray.worker.request import Request
from radixray.worker.sampler import Sampler


def test_sample_requests_equals_sample_with_the_lists():
    gen = torch.Generator().manual_seed(0)
    kinds = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.8, seed=3),
        SamplingParams(temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.5),
        SamplingParams(temperature=1.0, top_p=0.9, seed=5, min_tokens=4),
    ]
    reqs = [
        SimpleNamespace(
            request_id=f"r{i}",
            params=kinds[i % 4],
            plain_greedy=False,
            prompt_ids=[i, 7, 9],
            output_ids=[3, 3, i % 5],
        )
        for i in range(8)
    ]
    a, b = Sampler(seed=1, eos_ids={2}), Sampler(seed=1, eos_ids={2})
    for _ in range(3):  # the penalties' counts carried between steps alike
        logits = torch.randn(8, 40, generator=gen)
        want = a.sample(
            logits.clone(),
            [r.request_id for r in reqs],
            [r.params for r in reqs],
            [r.prompt_ids for r in reqs],
            [r.output_ids for r in reqs],
        )
        assert b.sample_requests(logits.clone(), reqs) == want
        for r, t in zip(reqs, want, strict=True):
            r.output_ids.append(t)


def test_a_batch_of_plain_greedy_requests_takes_the_argmax():
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7, top_k=1),
        SamplingParams(temperature=0.0, min_tokens=2),
        SamplingParams(temperature=0.5),
    ]
    reqs = [Request(f"r{i}", [1, 2], p, []) for i, p in enumerate(params)]
    assert [r.plain_greedy for r in reqs] == [True, True, False, False]
    logits = torch.randn(2, 30, generator=torch.Generator().manual_seed(1))
    assert Sampler().sample_requests(logits, reqs[:2]) == logits.argmax(-1).tolist()
