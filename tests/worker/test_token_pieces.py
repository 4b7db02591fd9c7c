"""SentencePiece-style tokenizers on the detokenizer's table path, exactly as their decode.

Three tiny tokenizers built offline with the ``tokenizers`` library in the shapes transformers
gives the real ones: Llama 2 / Mistral (BPE with ``<0xNN>`` byte pieces, a ``Metaspace``
pre-tokenizer, the decoder ``Replace("▁", " ")``, ``ByteFallback``, ``Fuse``, ``Strip`` of one
leading space), Gemma (the same without the strip) and a Unigram with a ``Metaspace`` decoder
(T5's kind: the first piece loses its ``▁``). Each gets a table; random ids (characters cut
across byte pieces, runs of bytes that are not UTF-8, specials inside a run, ids past the
vocabulary) stream to ``tokenizer.decode`` of them all, and stop strings cut as the windows cut.
"""

import string

import pytest

from radixray.model_meta import BPETokenizer
from radixray.worker.detokenizer import IncrementalDetokenizer
from radixray.worker.token_bytes import TokenPieces, token_bytes

from .test_token_bytes import check_tokenizer, released

CHARS = [c for c in string.printable if not c.isspace()] + ["\n", "\t", "é", "ö", "—", "漢"]
SPECIALS = ("<unk>", "<s>", "</s>")


def _with_specials(backend) -> BPETokenizer:
    from tokenizers import AddedToken

    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    return BPETokenizer(backend, bos_token_id=1, eos_token_id=2)


def byte_fallback_bpe(strip: bool) -> BPETokenizer:
    """Llama 2's shape (``strip``: a dummy prefix, taken off again by the decoder) or Gemma's
    (spaces are ``▁`` by a normalizer, nothing stripped); characters outside the vocabulary
    (most of CJK, emoji) become ``<0xNN>`` pieces."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = {t: i for i, t in enumerate(SPECIALS)}
    vocab.update({f"<0x{b:02X}>": len(SPECIALS) + b for b in range(256)})
    merges = [("▁", "t"), ("▁t", "h"), ("e", "s"), ("▁", "▁")]
    for piece in ["▁", *CHARS, *("".join(m) for m in merges)]:
        vocab.setdefault(piece, len(vocab))
    model = models.BPE(vocab, merges, byte_fallback=True, unk_token="<unk>", fuse_unk=True)
    backend = Tokenizer(model)
    if strip:
        backend.pre_tokenizer = pre_tokenizers.Metaspace("▁", prepend_scheme="first", split=False)
    else:
        backend.normalizer = normalizers.Replace(" ", "▁")
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence(steps + [decoders.Strip(" ", 1, 0)] * strip)
    return _with_specials(backend)


def metaspace_unigram() -> BPETokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    pieces = [(t, 0.0) for t in SPECIALS] + [("▁", -2.0), ("▁the", -1.0), ("▁▁", -3.0)]
    pieces += [(c, -4.0) for c in CHARS] + [("▁" + c, -3.5) for c in "abcdefgh"] + [("x▁y", -9.0)]
    backend = Tokenizer(models.Unigram(pieces, unk_id=0))
    backend.pre_tokenizer = pre_tokenizers.Metaspace("▁", prepend_scheme="always")
    backend.decoder = decoders.Metaspace("▁", prepend_scheme="always")
    return _with_specials(backend)


KINDS = {
    "llama2": lambda: byte_fallback_bpe(strip=True),
    "gemma": lambda: byte_fallback_bpe(strip=False),
    "unigram": metaspace_unigram,
}


@pytest.fixture(scope="module", params=sorted(KINDS))
def tok(request) -> BPETokenizer:
    return KINDS[request.param]()


def test_sentencepiece_kinds_stream_by_table_exactly(tok):
    assert isinstance(token_bytes(tok, tok.vocab_size + 8), TokenPieces)
    check_tokenizer(tok, tok.vocab_size + 8, range(60), no_later=False)


def ids_of(tok, *pieces: str) -> list[int]:
    return [tok._tok.token_to_id(p) for p in pieces]


@pytest.mark.parametrize(
    ("pieces", "llama2", "gemma"),
    [
        (("▁", "▁th", "e"), " the", "  the"),  # Strip drops one space of the text, no more
        (("▁▁", "a"), " a", "  a"),
        (("<s>", "▁th"), "th", " th"),  # the first piece the decode keeps is the first
        (("<0x20>", "a"), "a", " a"),  # a byte piece's space is stripped as well
        (("<0xE2>", "<0x82>", "<0xAC>", "▁th"), "€ th", "€ th"),  # a run, valid
        (("<0xE2>", "<0x82>", "<0xAC>", "<0xE2>", "a"), "\ufffd" * 4 + "a", "\ufffd" * 4 + "a"),
        (("<0xE2>", "</s>", "<0x82>", "<0xAC>"), "€", "€"),  # a skipped special: the run goes on
        (("a", "<0xF0>", "<0x9F>"), "a\ufffd\ufffd", "a\ufffd\ufffd"),  # cut at the end
    ],
)
def test_byte_runs_and_the_leading_space(pieces, llama2, gemma):
    for tok, want in ((byte_fallback_bpe(True), llama2), (byte_fallback_bpe(False), gemma)):
        ids = ids_of(tok, *pieces)
        assert tok.decode(ids) == want
        streamed = released(IncrementalDetokenizer(tok.decode, table=token_bytes(tok)), ids)
        assert "".join(streamed) == want


def test_a_run_of_bytes_is_released_when_it_ends():
    tok = byte_fallback_bpe(True)
    ids = ids_of(tok, "a", "<0xE2>", "<0x82>", "<0xAC>", "b")
    steps = released(IncrementalDetokenizer(tok.decode, table=token_bytes(tok)), ids)
    assert steps == ["a", "", "", "", "€b", ""]


def test_metaspace_drops_every_mark_of_the_first_piece_only():
    tok = metaspace_unigram()
    ids = ids_of(tok, "x▁y", "▁the", "x▁y")
    assert tok.decode(ids) == "xy thex y"
    assert "".join(released(IncrementalDetokenizer(tok.decode, table=token_bytes(tok)), ids)) == (
        "xy thex y"
    )


def test_an_unknown_decoder_step_keeps_the_windows():
    from tokenizers import decoders

    tok = byte_fallback_bpe(True)
    tok._tok.decoder = decoders.Sequence(  # a strip per piece (no fuse before it): not taken
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Strip(" ", 1, 0)]
    )
    assert token_bytes(tok) is None


def test_a_stop_string_in_a_run_closed_by_the_end_is_cut_at_flush():
    tok = byte_fallback_bpe(True)
    ids = [*tok.encode("the 🙂 rest"), tok.eos_token_id]  # 🙂: four byte pieces before "▁"
    cut = ids.index(tok._tok.token_to_id("<0x82>")) + 1  # the output ends after the emoji
    out = [*ids[:cut], tok.eos_token_id]  # (EOS is skipped: the run is still open)
    detok = IncrementalDetokenizer(tok.decode, ("🙂",), table=token_bytes(tok))
    steps = [detok.update(out[:n]) for n in range(1, len(out) + 1)]
    assert "".join(steps) + detok.flush(out) == "the " and detok.stopped


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_a_stop_string_found_only_at_the_end_finishes_the_request_as_stop(overlap):
    """A run of byte pieces comes out when it ends: an output that is one open run until
    ``max_tokens`` shows its text (and the stop string in it) only at the flush. The request
    then ends on the stop string, "stop", not "length", with the string cut from its text."""
    from radixray.worker import Engine, EngineConfig, SamplingParams
    from radixray.worker.detokenizer import Detokenizers

    tok = byte_fallback_bpe(True)
    lead = tok._tok.token_to_id("<0xC3>")  # a lead byte, never continued: U+FFFD at the end
    e = Engine(EngineConfig(model="tiny", page_size=4, num_pages=64, device="cpu", overlap=overlap))
    e._detokenizer = Detokenizers(tok)  # the tiny model's ids read by a SentencePiece tokenizer
    params = SamplingParams(
        temperature=0.0, max_tokens=4, ignore_eos=True, stop=["\ufffd"], logit_bias={lead: 100.0}
    )
    chunks = []
    e.add(e.requests.build([5, 6, 7, 8], params, "r0", None), chunks.append)
    while e.has_work():
        e.step()
    e.shutdown()
    assert [c.token_ids for c in chunks] == [[lead]] * 4
    assert "".join(c.text for c in chunks) == ""
    assert [c.finish_reason for c in chunks] == [None, None, None, "stop"]
