"""Structured output as it crosses the boundary: a grammar's kind and its spec text, a field of
``SamplingParams``. Shape only: the grammar library (worker only) compiles it at admission."""

from __future__ import annotations

from msgspec import Struct

from .errors import InvalidRequest

__all__ = ["GRAMMAR_KINDS", "GrammarSpec"]

GRAMMAR_KINDS = ("json_object", "json_schema", "regex", "choice", "grammar")


class GrammarSpec(Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """Structured output: the worker constrains sampling to this grammar. ``kind`` names how
    ``spec`` reads: "json_object" (spec ""), "json_schema" (a JSON schema as text), "regex",
    "choice" (a JSON list of strings), "grammar" (Lark, llguidance's dialect). Checked for shape
    here; the grammar library (worker only) compiles it at admission."""

    kind: str
    spec: str = ""

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise InvalidRequest(
                f"GrammarSpec.kind must be one of {', '.join(GRAMMAR_KINDS)}, got {self.kind!r}",
                "response_format",
            )
        if not isinstance(self.spec, str) or len(self.spec) > 1 << 20:
            raise InvalidRequest(
                "GrammarSpec.spec must be a string of at most 1 MiB", "response_format"
            )
