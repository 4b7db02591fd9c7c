"""One source for every setting: a config dataclass holds each default once, with its help
text, and the command-line flags are generated from it (as vLLM's ``EngineArgs`` does).

::

    @dataclass(frozen=True)
    class EngineConfig:
        page_size: int = setting(16, "tokens per KV page")
        kv_memory_bytes: int | None = setting(
            None, "KV pool budget (GB)", flag="--kv-memory-gb", type=float, convert=gb_to_bytes
        )

    add_arguments(parser, EngineConfig)          # --page-size, --kv-memory-gb, ...
    config = from_args(EngineConfig, parser.parse_args(), worker_id="w0")

A field's flag is ``--`` and its name with dashes unless ``flag`` says otherwise; its argparse
type, choices and default come from the field; ``convert`` turns the parsed value into the
field's (a unit change); ``cli=False`` keeps a field off the command line (test switches, ids the
caller sets). Only stdlib here: the CLI imports it before anything heavy.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["setting", "add_arguments", "from_args", "cli_fields", "defaults", "gb_to_bytes"]

_MISSING = dataclasses.MISSING


def setting(
    default: Any = _MISSING,
    help: str = "",
    *,
    flag: str | None = None,
    aliases: Iterable[str] = (),
    choices: Iterable[str] | None = None,
    type: Callable[[str], Any] | None = None,
    convert: Callable[[Any], Any] | None = None,
    cli: bool = True,
    default_factory: Callable[[], Any] | Any = _MISSING,
) -> Any:
    """A dataclass field with what its command-line flag needs in its metadata."""
    meta = {
        "help": help,
        "flag": flag,
        "aliases": tuple(aliases),
        "choices": None if choices is None else tuple(choices),
        "type": type,
        "convert": convert,
        "cli": cli,
    }
    if default_factory is not _MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def gb_to_bytes(gb: float | None) -> int | None:
    """A size given in GiB on the command line, as the bytes a config holds (0/None: unset)."""
    return int(gb * (1 << 30)) if gb else None


def _flag(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _dest(f: dataclasses.Field) -> str:
    return _flag(f).lstrip("-").replace("-", "_")


def cli_fields(
    cls: type, skip: Iterable[str] = (), only: Iterable[str] | None = None
) -> list[dataclasses.Field]:
    """The fields of ``cls`` that have a flag (declared with ``setting``), minus ``skip``, and
    only those in ``only`` when it is given."""
    skip, only = set(skip), None if only is None else set(only)
    return [
        f
        for f in dataclasses.fields(cls)
        if f.metadata.get("cli") and f.name not in skip and (only is None or f.name in only)
    ]


def defaults(cls: type) -> dict[str, Any]:
    """Every field's default (its factory called), by name: what ``cls()`` would hold."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not _MISSING:
            out[f.name] = f.default
        elif f.default_factory is not _MISSING:
            out[f.name] = f.default_factory()
    return out


def _scalar_type(annotation: Any) -> Any:
    """``int`` from ``int``, ``int | None`` or ``Optional[int]``; None when not a plain scalar."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if args:
        return args[0] if len(args) == 1 else None
    return annotation if annotation in (int, float, str, bool) else None


def add_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    skip: Iterable[str] = (),
    only: Iterable[str] | None = None,
) -> None:
    """Add a flag for every ``setting`` field of ``cls`` (not in ``skip``), its default the
    field's, its help the field's help with the default appended."""
    hints = typing.get_type_hints(cls)
    field_defaults = defaults(cls)
    for f in cli_fields(cls, skip, only):
        m = f.metadata
        kind = m["type"] or _scalar_type(hints[f.name])
        default = field_defaults[f.name]
        help_text = f"{m['help']} (default: {default})" if m["help"] else None
        names = (_flag(f), *m["aliases"])
        if kind is bool:
            parser.add_argument(
                *names,
                dest=_dest(f),
                action=argparse.BooleanOptionalAction,
                default=default,
                help=help_text,
            )
            continue
        # A flag in another unit than its field's (--kv-memory-gb) has no default of its own:
        # left out, the field keeps its default.
        parser.add_argument(
            *names,
            dest=_dest(f),
            type=kind,
            choices=m["choices"],
            default=None if m["convert"] is not None else default,
            help=help_text,
        )


def from_args(
    cls: type,
    args: argparse.Namespace,
    skip: Iterable[str] = (),
    only: Iterable[str] | None = None,
    **overrides: Any,
):
    """``cls`` built from the parsed flags that ``add_arguments`` added (converted back to the
    field's unit), then ``overrides``; fields with no flag keep their defaults."""
    values = {}
    for f in cli_fields(cls, skip, only):
        v = getattr(args, _dest(f), None)
        convert = f.metadata["convert"]
        if convert is not None:
            if v is not None:
                values[f.name] = convert(v)
        elif hasattr(args, _dest(f)):
            values[f.name] = v
    return cls(**(values | overrides))
