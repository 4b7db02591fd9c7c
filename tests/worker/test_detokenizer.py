"""Incremental detokenization must release exactly the full decode, token by token."""

import random

import pytest

from radixray.worker.detokenizer import TAIL_SLACK, IncrementalDetokenizer
from radixray.worker.model import ByteTokenizer
from radixray.worker.token_bytes import token_bytes

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


class StringText:
    """The detokenizer as it was before its text was kept in pieces: the whole text one string
    (``text += piece``), the stop search and hold-back over it. The reference for the pieces."""

    def __init__(self, stop, min_tokens):
        self.stop, self.min_tokens, self.text, self.emitted = stop, min_tokens, "", 0
        self.hold = max((len(s) for s in stop), default=1) - 1

    def update(self, new: str, num_ids: int, final: bool = False) -> str:
        self.text += new
        for s in self.stop if num_ids > self.min_tokens else ():
            i = self.text.find(s, max(0, self.emitted - len(s) + 1))
            if i != -1:
                self.text, final = self.text[:i], True
                break
        end = len(self.text) if final else len(self.text) - self.hold
        delta = self.text[self.emitted : end] if end > self.emitted else ""
        self.emitted = max(self.emitted, end) if not final else len(self.text)
        return delta


@pytest.mark.parametrize("seed", range(30))
def test_text_in_pieces_releases_as_one_string_did(seed):
    rng = random.Random(seed)
    tok = ByteTokenizer()
    text = "".join(rng.choice("ab c✓") for _ in range(rng.randint(1, 700)))
    ids = tok.encode(text)
    stop = tuple(
        text[rng.randrange(len(text)) :][: rng.randint(1, 6)] or "x"
        for _ in range(rng.randint(0, 3))
    )
    min_tokens = rng.choice([0, 0, len(ids) // 2])
    table = token_bytes(tok)
    d = IncrementalDetokenizer(tok.decode, stop, min_tokens, table)
    ref, stream = StringText(stop, min_tokens), table.stream()  # the same new text a token
    for n in range(1, len(ids) + 1):
        assert d.update(ids[:n]) == ref.update(stream.text(ids[:n], n - 1), n), (text, n)
        assert d.text == ref.text and d.emitted == ref.emitted
        assert len(d._tail) <= 2 * max(map(len, stop), default=0) + TAIL_SLACK + 1  # bounded
        if d.stopped:
            break
    else:
        assert d.flush(ids) == ref.update(stream.end(), len(ids), final=True)
    assert d.text == ref.text and d.emitted == ref.emitted


def test_a_stop_held_back_before_min_tokens_is_found_once_they_are_reached():
    # "abc" is complete at the 4th token, still held back (the longest stop is 6), but no search
    # runs before min_tokens; the 5th token's "d" ends no stop, yet the search must run then
    tok = ByteTokenizer()
    d = IncrementalDetokenizer(tok.decode, ("abc", "zzzzzz"), min_tokens=4)
    ids = tok.encode("xabcd")
    assert [d.update(ids[:n]) for n in range(1, 6)] == ["", "", "", "", "x"]
    assert d.stopped and d.text == "x"
