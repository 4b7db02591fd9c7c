"""The detokenizer's byte-table path must release exactly what the decode windows release.

For each tokenizer the tests use (the tiny model's bytes, SmolLM2's byte-level BPE, a byte-level
BPE with added non-special tokens): the table is accepted, a stream of random ids (characters cut
between tokens, special and out-of-vocabulary ids) joins to ``tokenizer.decode`` of them all, and
with stop strings the same text is released, each character no later than the windows release
it (a window waits for the character after a space; the table releases the space at once). A
tokenizer whose decode differs anywhere (spaces cleaned up, another decoder) gets none;
SentencePiece's decoders: ``test_token_pieces.py``.
"""

import random

import pytest

from radixray.model_meta import BPETokenizer
from radixray.worker.detokenizer import Detokenizers, IncrementalDetokenizer
from radixray.worker.model import ByteTokenizer
from radixray.worker.token_bytes import PROBES, token_bytes

TEXTS = ["plain ascii text", "héllo wörld — ünïcödé ✓ 漢字 🙂🙂", "a" * 20 + "€" * 10, *PROBES]


def released(detok: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    """Each step's released text, then the flush's (as the engine calls them)."""
    out = []
    for n in range(1, len(ids) + 1):
        out.append(detok.update(ids[:n]))
        if detok.stopped:
            return out
    return [*out, detok.flush(ids)]


def random_ids(rng: random.Random, tok, size: int, n: int) -> list[int]:
    """Pieces of encoded text (multi-byte characters cut anywhere) mixed with random ids."""
    ids: list[int] = []
    while len(ids) < n:
        if rng.random() < 0.5:
            enc = tok.encode(rng.choice(TEXTS))
            a = rng.randrange(len(enc))
            ids += enc[a : a + rng.randint(1, 6)]
        else:
            ids.append(rng.randrange(size))
    return ids[:n]


def check_tokenizer(tok, size: int, seeds=range(40), no_later: bool = True) -> None:
    """``no_later``: each character comes no later than the windows release it (not so for a
    SentencePiece run of byte pieces, held until it ends: a later byte can still spoil it)."""
    table = token_bytes(tok, size)
    assert table is not None
    for seed in seeds:
        rng = random.Random(seed)
        ids = random_ids(rng, tok, size, rng.randint(1, 40))
        fast = IncrementalDetokenizer(tok.decode, table=table)
        assert "".join(released(fast, ids)) == tok.decode(ids), ids
    for text in TEXTS:  # stop strings: the same text, each character released no later
        ids = tok.encode(text)
        for stop in ((), (text[len(text) // 2 :][:3],), ("zz", text[-2:])):
            window = IncrementalDetokenizer(tok.decode, stop)
            fast = IncrementalDetokenizer(tok.decode, stop, table=table)
            slow, quick = released(window, ids), released(fast, ids)
            assert "".join(quick) == "".join(slow) and fast.stopped == window.stopped
            for n in range(len(slow) if no_later else 0):
                assert "".join(quick[: n + 1]).startswith("".join(slow[: n + 1])), (text, n)


def test_byte_tokenizer_streams_by_table():
    tok = ByteTokenizer()
    check_tokenizer(tok, 320)  # the tiny model's vocabulary is larger than the tokenizer's
    table = token_bytes(tok, 320)
    # a skipped special token ends a run of bytes: the character cut there is U+FFFD
    ids = [0xE2, tok.EOS_ID, 0x82, 0xAC, 300, 0xE2, 0x82, 0xAC]
    assert table.decode(ids) == tok.decode(ids) == "\ufffd" * 3 + "€"


def test_smollm2_byte_level_bpe_streams_by_table(smollm2_meta):
    check_tokenizer(smollm2_meta.tokenizer, smollm2_meta.config.vocab_size, range(15))


def byte_level_with_added_tokens(decoder=None) -> BPETokenizer:
    """A byte-level BPE: the 256 byte characters, a merge, three specials, added plain tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["Ġt"] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[("Ġ", "t")]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoder or decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    backend.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    backend.add_tokens(["<|filler|>", "漢字", "wörd"])
    return BPETokenizer(backend, bos_token_id=None, eos_token_id=258)


def test_byte_level_bpe_with_added_tokens_streams_by_table():
    tok = byte_level_with_added_tokens()
    # an added token's characters go through the byte map where they all are in it (ö is the
    # byte 0xF6 there, not UTF-8), else it is its own UTF-8: the table does as the decoder does
    ids = tok.encode(" t <|im_end|>漢字wörd<|filler|>")
    assert tok.decode(ids) == token_bytes(tok, 300).decode(ids) == " t 漢字w\ufffdrd<|filler|>"
    check_tokenizer(tok, 300)


class CleanedUp(BPETokenizer):
    """A decode that cleans up spaces before punctuation (transformers' option)."""

    def decode(self, ids, skip_special_tokens=True):
        return super().decode(ids, skip_special_tokens).replace(" .", ".").replace(" ,", ",")


def test_a_tokenizer_decoding_otherwise_keeps_the_windows():
    from tokenizers import decoders

    base = byte_level_with_added_tokens()
    cleaned = CleanedUp(base._tok, bos_token_id=None, eos_token_id=258)
    wordpiece = byte_level_with_added_tokens(decoders.WordPiece())  # a decoder not taken
    for tok in (cleaned, wordpiece, None):
        assert token_bytes(tok, 300) is None
        make = Detokenizers(tok, 300)
        assert make.table is None
    ids = cleaned.encode("Hello , world . wörd")  # the windows' text, as before
    detok = Detokenizers(cleaned, 300)(_Req())
    assert released(detok, ids) == released(IncrementalDetokenizer(cleaned.decode), ids)


class _Req:
    class params:  # noqa: N801 (a request's params, as Detokenizers reads them)
        stop = ()
        min_tokens = 0


@pytest.fixture(scope="module")
def smollm2_meta():
    from radixray.model_meta import load_model_meta

    return load_model_meta("smollm2")
