import pytest
import torch

from radixray.protocol import SamplingParams
from radixray.worker.sampler import Sampler


def logits(seed=0, n=3, vocab=50):
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax():
    lg = logits()
    got = Sampler().sample(lg, ["a", "b", "c"], [SamplingParams(temperature=0.0)] * 3)
    assert got == lg.argmax(-1).tolist()


@pytest.mark.parametrize("kw", [{"temperature": 1e-300}, {"top_p": 1e-300}, {"top_k": 1}])
def test_degenerate_settings_reduce_to_greedy_instead_of_crashing(kw):
    lg = logits(1)
    got = Sampler().sample(lg, ["a", "b", "c"], [SamplingParams(seed=5, **kw)] * 3)
    assert got == lg.argmax(-1).tolist()


def test_top_k_and_top_p_restrict_the_support():
    lg = logits(2, n=1, vocab=100)
    top5 = set(torch.topk(lg[0], 5).indices.tolist())
    s = Sampler(0)
    draws = {s.sample(lg, ["r"], [SamplingParams(top_k=5, temperature=5.0)])[0] for _ in range(200)}
    assert draws <= top5 and len(draws) > 1
    probs = torch.softmax(lg[0], -1)
    order = torch.argsort(probs, descending=True).tolist()
    nucleus, mass = set(), 0.0
    for t in order:
        nucleus.add(t)
        mass += float(probs[t])
        if mass >= 0.5:
            break
    draws = {s.sample(lg, ["r"], [SamplingParams(top_p=0.5)])[0] for _ in range(200)}
    assert draws <= nucleus


def test_seeded_requests_do_not_depend_on_batch_neighbours():
    lg = logits(3, n=2)
    p = SamplingParams(seed=11, temperature=1.0)
    alone = [Sampler().sample(lg[:1], ["x"], [p])[0] for _ in range(1)]
    s = Sampler()
    paired = s.sample(lg, ["x", "y"], [p, SamplingParams(temperature=1.0)])
    assert paired[0] == alone[0]


@pytest.mark.parametrize("seed", [2**63, -(2**63) - 1, 1.5, True])
def test_seed_outside_int64_is_rejected(seed):
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(seed=seed)


def test_negative_seed_is_accepted_and_deterministic():
    lg = logits(4, n=1)
    p = SamplingParams(seed=-7)
    assert Sampler().sample(lg, ["a"], [p]) == Sampler().sample(lg, ["a"], [p])


def test_the_batched_draw_samples_each_token_with_its_probability():
    """The exponential race over the whole batch: 4,000 draws of one row, each token's share
    within 0.03 of its probability (top-k and top-p off)."""
    lg = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    want = torch.softmax(lg[0], -1)
    s = Sampler(3)
    rows = torch.cat([lg] * 4000)
    got = s.sample_ids(rows, ["r"] * 4000, [SamplingParams(temperature=1.0)] * 4000)
    share = torch.bincount(got, minlength=5).float() / 4000
    assert (share - want).abs().max() < 0.03, (share, want)


def test_penalty_counts_kept_on_the_device_equal_counting_the_tokens_each_step():
    """Ten steps of two penalized requests: the sampler's own counts (made once, updated from
    its sampled ids) give the tokens that counting the whole history each step gives."""
    vocab = 40
    gen = torch.Generator().manual_seed(9)
    params = [
        SamplingParams(temperature=0.0, repetition_penalty=1.7, frequency_penalty=0.4),
        SamplingParams(temperature=0.7, seed=4, presence_penalty=1.2, min_tokens=3),
    ]
    prompts = [[1, 2, 3, 2], [5, 6]]
    kept, fresh = Sampler(eos_ids=[0]), Sampler(eos_ids=[0])
    outs: list[list[int]] = [[], []]
    for _ in range(10):
        lg = torch.randn(2, vocab, generator=gen) * 2
        a = kept.sample(lg, ["a", "b"], params, prompts, outs)
        # the reference: a sampler that counts from the lists (its counts forgotten each step)
        fresh.forget("a"), fresh._counts.pop("b", None)
        b = fresh.sample(lg, ["a", "b"], params, prompts, outs)
        assert a == b
        for o, t in zip(outs, a, strict=True):
            o.append(t)
    assert set(kept._counts) == {"a", "b"}
    assert kept._counts["a"][0].sum().item() == 10
    kept.forget("a")
    assert set(kept._counts) == {"b"}
