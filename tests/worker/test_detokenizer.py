"""Incremental detokenization must release exactly the full decode, token by token."""

import random

import pytest

from radixray.worker.detokenizer import IncrementalDetokenizer
from radixray.worker.model import ByteTokenizer

TEXTS = ["plain ascii text", "héllo wörld — ünïcödé ✓ 漢字 🙂🙂", "a" * 50 + "€" * 10]


def stream(tok, ids, stop=()):
    d = IncrementalDetokenizer(tok.decode, tuple(stop))
    out = []
    for i in range(1, len(ids) + 1):
        out.append(d.update(ids[:i]))
        assert "\ufffd" not in out[-1]  # never half a character
        if d.stopped:
            break
    else:
        out.append(d.flush(ids))
    return "".join(out), d


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_text_equals_the_full_decode(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    got, d = stream(tok, ids)
    assert got == text == d.text


@pytest.mark.parametrize("seed", range(5))
def test_stop_strings_cut_exactly_and_never_leak(seed):
    rng = random.Random(seed)
    tok = ByteTokenizer()
    text = "".join(rng.choice("abc✓漢 ") for _ in range(80))
    stop = text[rng.randint(10, 60) :][: rng.randint(1, 4)]
    got, d = stream(tok, tok.encode(text), [stop])
    assert d.stopped and got == text[: text.index(stop)]


def test_special_tokens_are_skipped_and_window_stays_short():
    tok = ByteTokenizer()
    ids = tok.encode("ab") + [tok.EOS_ID] + tok.encode("cd")
    got, _ = stream(tok, ids)
    assert got == "abcd"
    calls = []

    def counting_decode(x):
        calls.append(len(x))
        return tok.decode(x)

    d = IncrementalDetokenizer(counting_decode)
    long_ids = tok.encode("x" * 500)
    for i in range(1, len(long_ids) + 1):
        d.update(long_ids[:i])
    assert max(calls) <= 4  # a window, not the whole output (O(n), not O(n^2))
