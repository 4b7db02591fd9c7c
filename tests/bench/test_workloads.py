"""Workload builders: deterministic blocks from hash ids, really shared prefixes, scaled sizes."""

from __future__ import annotations

import json

import pytest

from radixray.bench.workloads import (
    Session,
    Turn,
    block_text,
    build_workload,
    mooncake_workload,
    mtbench_workload,
)


def test_block_text_is_deterministic_distinct_and_one_byte_per_token():
    assert block_text(7, 16) == block_text(7, 16)
    assert len(block_text(7, 100)) == 100  # longer than one digest
    assert block_text(7, 16) != block_text(8, 16)
    assert block_text(7, 32)[:16] == block_text(7, 16)
    assert block_text(7, 16).isascii() and " " not in block_text(7, 16)


def _tiny_trace(tmp_path):
    rows = [
        {"timestamp": 0, "input_length": 1500, "output_length": 320, "hash_ids": [0, 1, 2]},
        {"timestamp": 5, "input_length": 2048, "output_length": 64, "hash_ids": [0, 1, 2, 3]},
        {"timestamp": 9, "input_length": 1000, "output_length": 10, "hash_ids": [5, 6]},
        {"timestamp": 9, "input_length": 10**6, "output_length": 10, "hash_ids": [0, 9]},
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def test_mooncake_equal_ids_give_equal_prefixes_and_scaled_lengths(tmp_path):
    wl = mooncake_workload(
        limit=10,
        block_tokens=16,
        sample_every=1,
        max_prompt_tokens=1000,
        path=_tiny_trace(tmp_path),
    )
    a, b, c = (s.turns[0].user for s in wl.sessions)
    assert len(wl.sessions) == 3 and wl.meta["skipped_too_long"] == 1
    assert wl.meta["scale"] == 32.0
    assert len(a) == round(1500 / 32) and len(b) == 2048 // 32 and len(c) == round(1000 / 32)
    assert b[: len(a)] == a  # [0, 1, 2] is a prefix of [0, 1, 2, 3]
    assert a[:16] == block_text(0, 16) and c[:16] == block_text(5, 16)
    assert a[:16] != c[:16]
    assert [s.shared_prefix_tokens for s in wl.sessions] == [16, 16, 0]
    assert wl.sessions[0].turns[0].max_tokens == 10  # 320 / 32
    again = mooncake_workload(
        limit=10,
        block_tokens=16,
        sample_every=1,
        max_prompt_tokens=1000,
        path=_tiny_trace(tmp_path),
    )
    assert again.sessions == wl.sessions


def test_mooncake_conversation_sampling_keeps_follow_up_turns():
    wl = mooncake_workload(limit=200, sample_every=10)
    assert len(wl.sessions) == 200 and wl.meta["sample_every"] == 10
    prompts = [s.turns[0].user for s in wl.sessions]
    # Some later request extends an earlier one beyond the shared block 0: a follow-up turn.
    follow_ups = sum(
        any(p[:32] == q[:32] and len(q) > 32 for q in prompts[:i]) for i, p in enumerate(prompts)
    )
    assert follow_ups > 20


def test_mtbench_sessions_share_system_prompts_and_carry_answers():
    wl = mtbench_workload(num_sessions=16, num_system=4, system_chars=500)
    assert wl.num_requests == 32
    s0, s4, s1 = wl.sessions[0], wl.sessions[4], wl.sessions[1]
    assert s0.system == s4.system and s0.system != s1.system and len(s0.system) == 500
    first = s0.request_body("tiny", 0, [])
    second = s0.request_body("tiny", 1, ["ANSWER-1"])
    assert second["messages"][: len(first["messages"])] == first["messages"]
    assert second["messages"][-2] == {"role": "assistant", "content": "ANSWER-1"}
    assert second["messages"][-1]["content"] == s0.turns[1].user
    assert build_workload("mtbench", num_sessions=2).num_requests == 4


def test_session_validation_and_unknown_workload():
    with pytest.raises(ValueError, match="no turns"):
        Session("x", "chat", ())
    with pytest.raises(ValueError, match="exactly one turn"):
        Session("x", "completion", (Turn("a", 1), Turn("b", 1)))
    with pytest.raises(ValueError, match="mooncake"):
        build_workload("nope")
