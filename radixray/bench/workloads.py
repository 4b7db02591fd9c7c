"""Workloads for the live benchmark: sessions of turns, sent as text through any OpenAI API.

Text, not token ids, because SGLang's router rejects token-id prompts; with the tiny model's byte
tokenizer one ASCII character is one token, so a block of ``block_tokens`` characters is exactly
one block of tokens (with a BPE model blocks are only approximately token-aligned).

* ``mooncake``: the Mooncake conversation trace. Each hash id (one 512-token block upstream)
  becomes a fixed block of ``block_tokens`` characters derived from the id alone (blake2b), so
  equal ids at equal positions give equal prefixes, in every process and run. Input lengths are
  scaled by ``512 / block_tokens`` (the scale factor every report states); output lengths by
  ``output_scale``. One single-turn session per trace row, in trace order.
* ``mtbench``: two-turn chats over the 80 MT-Bench questions behind ``num_system`` long shared
  system prompts (slices of the llmperf sonnet text). Turn 2 carries turn 1's actual answer, so
  a router that keeps a chat on one worker reuses the whole history.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from radixray.sim.data import (
    MOONCAKE_BLOCK_TOKENS,
    data_file,
    display_path,
    mooncake_trace_path,
    open_text,
    read_mooncake,
)

__all__ = [
    "Turn",
    "Session",
    "BenchWorkload",
    "block_text",
    "mooncake_workload",
    "mtbench_workload",
    "build_workload",
    "MOONCAKE_BLOCK_TOKENS",
    "WORKLOADS",
]

# 64 printable ASCII characters without spaces or specials: one byte token each.
_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


@dataclass(frozen=True)
class Turn:
    user: str  # the prompt text (completion) or the user message (chat)
    max_tokens: int


@dataclass(frozen=True)
class Session:
    """Turns are sent one after another; a chat turn carries the previous answers."""

    session_id: str
    kind: Literal["completion", "chat"]
    turns: tuple[Turn, ...]
    system: str | None = None
    arrival_s: float = 0.0  # offset in the source trace (informative; replay sets its own rate)
    shared_prefix_tokens: int = 0  # tokens every session shares (reported hits beyond it)

    def __post_init__(self):
        if not self.turns:
            raise ValueError(f"session {self.session_id} has no turns")
        if self.kind == "completion" and len(self.turns) != 1:
            raise ValueError("a completion session has exactly one turn")

    def request_body(self, model: str, turn: int, answers: list[str]) -> dict:
        """The OpenAI request body of ``turn`` given the answers to the earlier turns."""
        t = self.turns[turn]
        if self.kind == "completion":
            return {"model": model, "prompt": t.user, "max_tokens": t.max_tokens}
        messages = [{"role": "system", "content": self.system}] if self.system else []
        for prev, answer in zip(self.turns[:turn], answers, strict=False):
            messages.append({"role": "user", "content": prev.user})
            messages.append({"role": "assistant", "content": answer})
        messages.append({"role": "user", "content": t.user})
        return {"model": model, "messages": messages, "max_tokens": t.max_tokens}


@dataclass(frozen=True)
class BenchWorkload:
    name: str
    sessions: tuple[Session, ...]
    meta: dict = field(default_factory=dict)  # scale factors and sizes, copied into reports

    @property
    def num_requests(self) -> int:
        return sum(len(s.turns) for s in self.sessions)


def block_text(hash_id: int, block_tokens: int) -> str:
    """The fixed ``block_tokens``-character block of one hash id (same in every process)."""
    out = bytearray()
    counter = 0
    while len(out) < block_tokens:
        digest = hashlib.blake2b(f"{hash_id}:{counter}".encode(), digest_size=64).digest()
        out.extend(_ALPHABET[b & 63] for b in digest)
        counter += 1
    return out[:block_tokens].decode("ascii")


def _keep_conversation(conversation: int, sample_every: int) -> bool:
    """Sample whole conversations (``MooncakeRow.conversation``), so every turn of a kept
    conversation is kept."""
    if sample_every <= 1:
        return True
    digest = hashlib.blake2b(str(conversation).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % sample_every == 0


def mooncake_workload(
    limit: int = 300,
    block_tokens: int = 16,
    sample_every: int = 10,
    output_scale: float | None = None,
    max_output_tokens: int = 64,
    max_prompt_tokens: int = 3072,
    path: str | Path | None = None,
) -> BenchWorkload:
    """The first ``limit`` rows of the trace whose scaled prompt fits ``max_prompt_tokens``, from
    one conversation in ``sample_every``: a trace prefix would hold no follow-up turns (the first
    120 rows reuse nothing beyond block 0), one conversation in 10 keeps the trace's reuse
    (~37 % of blocks) in 300 requests."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    path = Path(path) if path else mooncake_trace_path()
    if not path.is_file():
        raise FileNotFoundError(f"Mooncake trace not found at {path}")
    scale = MOONCAKE_BLOCK_TOKENS / block_tokens
    oscale = scale if output_scale is None else output_scale
    cache: dict[int, str] = {}
    sessions: list[Session] = []
    skipped = 0
    for i, row in enumerate(read_mooncake(path)):
        if len(sessions) >= limit:
            break
        ids = row.hash_ids
        if not _keep_conversation(row.conversation, sample_every):
            continue
        length = max(1, round(row.input_length / scale))
        if length > max_prompt_tokens:
            skipped += 1
            continue
        blocks = [cache.setdefault(h, block_text(h, block_tokens)) for h in ids]
        prompt = "".join(blocks)[:length]
        out = max(1, min(max_output_tokens, round(row.output_length / oscale)))
        shared = min(block_tokens, length) if ids[0] == 0 else 0
        sessions.append(
            Session(
                f"mc-{i}",
                "completion",
                (Turn(prompt, out),),
                arrival_s=row.timestamp_ms / 1000.0,
                shared_prefix_tokens=shared,
            )
        )
    return BenchWorkload(
        "mooncake",
        tuple(sessions),
        {
            "source": display_path(path),
            "block_tokens": block_tokens,
            "scale": scale,
            "sample_every": sample_every,
            "output_scale": oscale,
            "max_output_tokens": max_output_tokens,
            "skipped_too_long": skipped,
        },
    )


def _system_prompts(num_system: int, system_chars: int, sonnet: str) -> list[str]:
    text = " ".join(sonnet.split())
    step = max(1, len(text) // max(num_system, 1))
    prompts = []
    for k in range(num_system):
        start = (k * step) % len(text)
        body = (text[start:] + " " + text) * (system_chars // max(len(text), 1) + 2)
        head = f"You are assistant {k} of the radixray benchmark. Reference text follows. "
        prompts.append((head + body)[:system_chars])
    return prompts


def mtbench_workload(
    num_sessions: int = 80,
    num_system: int = 8,
    system_chars: int = 2000,
    max_tokens: int = 32,
    folder: str | Path | None = None,
) -> BenchWorkload:
    """Two-turn chats: session ``i`` asks question ``i % 80`` behind system prompt
    ``i % num_system``."""
    # ``folder`` holds the two files itself; by default they are text_prompts/ of the data folder.
    sub = "" if folder else "text_prompts/"
    qpath = data_file(f"{sub}mt_bench_question.jsonl", folder)
    spath = data_file(f"{sub}sonnet_llmperf.txt", folder)
    with open_text(qpath) as f:
        questions = [json.loads(line) for line in f if line.strip()]
    with open_text(spath) as f:
        systems = _system_prompts(num_system, system_chars, f.read())
    sessions = []
    for i in range(num_sessions):
        q = questions[i % len(questions)]
        turns = tuple(Turn(t, max_tokens) for t in q["turns"])
        sessions.append(
            Session(f"mt-{i}-q{q['question_id']}", "chat", turns, system=systems[i % num_system])
        )
    return BenchWorkload(
        "mtbench",
        tuple(sessions),
        {
            "source": display_path(qpath),
            "num_system": num_system,
            "system_chars": system_chars,
            "max_tokens": max_tokens,
        },
    )


WORKLOADS = {"mooncake": mooncake_workload, "mtbench": mtbench_workload}


def build_workload(name: str, **kwargs) -> BenchWorkload:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose one of {sorted(WORKLOADS)}")
    return WORKLOADS[name](**kwargs)
