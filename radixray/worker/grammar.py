"""Structured output on the worker, through llguidance: a request's grammar spec (kind + spec
string, ``radixray.protocol.GrammarSpec``) compiled once per spec, one matcher per request, and
the next-token bitmask of every grammar row of a batch.

llguidance was kept over xgrammar on this machine's numbers (benchmarks/README.md, "Structured
output"). Only the worker imports this module; the router never does (the library is a worker
dependency). Compile errors are the client's: :meth:`GrammarCompiler.compile` raises
``InvalidRequest`` naming ``response_format``.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence

import llguidance
import torch

from radixray.protocol import InvalidRequest

from .grammar_vocab import Vocab, vocab_of

__all__ = [
    "GrammarCompiler",
    "GrammarMatcher",
    "fill_bitmask",
    "llg_tokenizer",
]

from radixray.protocol.messages import GRAMMAR_KINDS

_ANY_JSON_OBJECT = '{"type": "object"}'
# Compact JSON (no whitespace between tokens): a model that likes newlines cannot pad forever.
# A schema's own "x-guidance" options override this.
_JSON_DEFAULTS = {"whitespace_flexible": False}


class _Wrapped:
    """What llguidance's TokenizerWrapper reads: the bytes of each id and an encode callable."""

    def __init__(self, vocab: Vocab):
        self.eos_token_id = vocab.eos_id
        self.bos_token_id = None
        self.tokens = vocab.tokens
        self.special_token_ids = sorted(vocab.special_ids)
        self._by_bytes = {t: i for i, t in enumerate(vocab.tokens) if i not in vocab.special_ids}

    def __call__(self, data: bytes) -> list[int]:
        # Greedy longest match over the vocabulary: llguidance only uses this for forced text.
        out, i = [], 0
        longest = max(len(t) for t in self._by_bytes)
        while i < len(data):
            for n in range(min(longest, len(data) - i), 0, -1):
                tid = self._by_bytes.get(data[i : i + n])
                if tid is not None:
                    out.append(tid)
                    i += n
                    break
            else:
                raise ValueError(f"byte {data[i]} has no token")
        return out


def llg_tokenizer(vocab: Vocab) -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer(
        llguidance.TokenizerWrapper(_Wrapped(vocab)),
        n_vocab=len(vocab.tokens),
        eos_token=list(vocab.stop_ids),
    )


def _regex_escape_choice(choices: Sequence[str]) -> str:
    import re

    return "(" + "|".join(re.escape(c) for c in choices) + ")"


def grammar_of(kind: str, spec: str) -> str:
    """The llguidance grammar text for one spec; raises ValueError when the spec is malformed."""
    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema(_ANY_JSON_OBJECT, _JSON_DEFAULTS)
    if kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(spec, _JSON_DEFAULTS)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec)
    if kind == "choice":
        choices = json.loads(spec)
        return llguidance.LLMatcher.grammar_from_regex(_regex_escape_choice(choices))
    if kind == "grammar":
        return llguidance.LLMatcher.grammar_from_lark(spec)
    raise ValueError(f"unknown grammar kind {kind!r}; valid: {', '.join(GRAMMAR_KINDS)}")


def _rejected(kind: str, why: str) -> InvalidRequest:
    return InvalidRequest(f"the grammar library rejects this {kind}: {why}", "response_format")


class GrammarMatcher:
    """One request's position in its grammar. ``allowed_eos`` once the grammar is complete."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, grammar: str):
        self._m = llguidance.LLMatcher(tokenizer, grammar, log_level=0)

    def fill(self, row: torch.Tensor) -> None:
        """Writes the next-token bitmask into ``row`` (a contiguous int32 CPU tensor)."""
        self._m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)

    def accept(self, token: int) -> bool:
        return self._m.consume_token(token)

    @property
    def done(self) -> bool:
        """The grammar is complete and allows nothing more (the request finishes)."""
        return self._m.is_stopped()

    @property
    def accepting(self) -> bool:
        return self._m.is_accepting()

    @property
    def error(self) -> str | None:
        return self._m.get_error() if self._m.is_error() else None


class GrammarCompiler:
    """Compiles grammar specs for one tokenizer; compiled grammars are cached by (kind, spec)."""

    def __init__(self, tokenizer, model_vocab_size: int | None = None, cache_size: int = 256):
        self.vocab = vocab_of(tokenizer, model_vocab_size)
        self.vocab_size = len(self.vocab.tokens)
        self._tok = llg_tokenizer(self.vocab)
        self._cache: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._cache_size = cache_size

    def compile(self, kind: str, spec: str) -> str:
        key = (kind, spec)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        try:
            grammar = grammar_of(kind, spec)
            errors = llguidance.LLMatcher.validate_grammar(grammar, self._tok)
        except (ValueError, TypeError) as e:  # the spec's own JSON, or the library's parse
            errors = str(e) or type(e).__name__
        if errors:
            raise InvalidRequest(
                f"the grammar library rejects this {kind}: {errors}", "response_format"
            )
        self._cache[key] = grammar
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return grammar

    def matcher(self, kind: str, spec: str) -> GrammarMatcher:
        m = GrammarMatcher(self._tok, self.compile(kind, spec))
        if m.error:
            raise InvalidRequest(
                f"the grammar library rejects this {kind}: {m.error}", "response_format"
            )
        return m

    def new_bitmask(self, rows: int) -> torch.Tensor:
        return torch.full((rows, (self.vocab_size + 31) // 32), -1, dtype=torch.int32)


def fill_bitmask(matchers: Sequence[GrammarMatcher], bitmask: torch.Tensor) -> None:
    for i, m in enumerate(matchers):
        m.fill(bitmask[i])
