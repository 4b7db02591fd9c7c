"""The workloads shipped inside the package (radixray/data/): each loads from a clean clone with
no environment variable, equals its upstream file (the sha256 its SOURCE.md records, the record
counts of the original), and carries its license; RADIXRAY_DATA_DIR replaces the folder."""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import re

import pytest

from radixray.bench.workloads import mooncake_workload, mtbench_workload
from radixray.sim import load_mooncake
from radixray.sim.data import (
    DATA_ENV,
    PACKAGE_DATA_DIR,
    azure_trace_path,
    data_dir,
    data_file,
    data_text,
    display_path,
    mooncake_trace_path,
    open_text,
    read_mooncake,
)

# file -> records in the upstream file (lines of JSONL or text, CSV rows under the header)
SHIPPED = {
    "mooncake/conversation_trace.jsonl": 12031,
    "azure_llm_2023/AzureLLMInferenceTrace_code.csv": 8819,
    "azure_llm_2023/AzureLLMInferenceTrace_conv.csv": 19366,
    "text_prompts/mt_bench_question.jsonl": 80,
    "text_prompts/sonnet_llmperf.txt": 84,
}


@pytest.fixture(autouse=True)
def _no_override(monkeypatch):
    monkeypatch.delenv(DATA_ENV, raising=False)


def test_the_default_data_folder_is_the_packages_own():
    assert data_dir() == PACKAGE_DATA_DIR
    assert PACKAGE_DATA_DIR.parent.name == "radixray"
    for rel in SHIPPED:
        assert data_file(rel) == PACKAGE_DATA_DIR / f"{rel}.gz"
        assert not (PACKAGE_DATA_DIR / rel).exists()  # only the compressed copy is shipped


@pytest.mark.parametrize("rel", sorted(SHIPPED))
def test_each_shipped_file_is_its_upstream_file(rel):
    """The decompressed bytes hash to the sha256 SOURCE.md records for the upstream file, and
    hold as many records as it."""
    path = data_file(rel)
    raw = gzip.decompress(path.read_bytes())
    folder = path.parent
    source = (folder / "SOURCE.md").read_text()
    assert hashlib.sha256(raw).hexdigest() in source
    assert (folder / "LICENSE").stat().st_size > 1000
    if rel.endswith(".csv"):
        with open_text(path, newline="") as f:
            rows = list(csv.DictReader(f))
        assert list(rows[0]) == ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
        assert len(rows) == SHIPPED[rel]
    else:
        assert len(raw.decode().splitlines()) == SHIPPED[rel]


def test_licenses_are_the_ones_source_md_names():
    lic = {p.parent.name: p.read_text() for p in PACKAGE_DATA_DIR.glob("*/LICENSE")}
    assert sorted(lic) == ["azure_llm_2023", "mooncake", "text_prompts"]
    assert "Apache License" in lic["mooncake"] and "Version 2.0" in lic["mooncake"]
    assert "Apache License" in lic["text_prompts"]
    assert "Attribution 4.0 International" in lic["azure_llm_2023"]


def test_the_readers_read_the_shipped_files():
    rows = list(read_mooncake(mooncake_trace_path()))
    assert len(rows) == 12031
    assert sum(len(r.hash_ids) for r in rows) == 288500  # the input blocks upstream counts
    wl = load_mooncake("mooncake", limit=10)
    assert len(wl) == 10
    assert wl.description["trace"] == "radixray/data/mooncake/conversation_trace.jsonl.gz"
    assert azure_trace_path("code").name == "AzureLLMInferenceTrace_code.csv.gz"
    mt = mtbench_workload(num_sessions=80)
    assert len({s.session_id.split("-q")[1] for s in mt.sessions}) == 80
    assert all(len(s.turns) == 2 for s in mt.sessions)
    assert mt.meta["source"] == "radixray/data/text_prompts/mt_bench_question.jsonl.gz"
    assert len(mooncake_workload(limit=20).sessions) == 20
    assert "summer's day" in data_text("text_prompts/sonnet_llmperf.txt")


def test_the_env_folder_overrides_plain_or_gz_and_a_missing_file_names_the_variable(
    monkeypatch, tmp_path
):
    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    (tmp_path / "text_prompts").mkdir()
    with pytest.raises(FileNotFoundError) as err:
        data_file("text_prompts/sonnet_llmperf.txt")
    msg = str(err.value)
    assert "\n" not in msg and DATA_ENV in msg and "text_prompts/sonnet_llmperf.txt" in msg
    gz = tmp_path / "text_prompts" / "sonnet_llmperf.txt.gz"
    gz.write_bytes(gzip.compress(b"compressed\n"))
    assert data_text("text_prompts/sonnet_llmperf.txt") == "compressed\n"
    (tmp_path / "text_prompts" / "sonnet_llmperf.txt").write_text("plain\n")
    assert data_text("text_prompts/sonnet_llmperf.txt") == "plain\n"  # plain wins over .gz
    assert display_path(gz) == str(gz)  # outside the package: the path as given


def test_a_gzipped_trace_path_reads_like_the_plain_one(tmp_path):
    line = {"timestamp": 0, "input_length": 40, "output_length": 3, "hash_ids": [0, 1]}
    plain = tmp_path / "t.jsonl"
    plain.write_text(json.dumps(line) + "\n")
    gz = tmp_path / "t.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    a, b = load_mooncake(plain), load_mooncake(gz)
    fields = ("rid", "arrival", "segments", "num_tokens", "output_len", "session")

    def rows(wl):
        return [tuple(getattr(r, f) for f in fields) for r in wl.requests]

    assert rows(a) == rows(b) == [(0, 0.0, ((0, 16), (1, 1)), 17, 1, "1")]
    assert a.name == b.name == "t"


def test_source_md_names_commit_and_license_for_every_folder():
    for src in PACKAGE_DATA_DIR.glob("*/SOURCE.md"):
        text = src.read_text()
        assert re.search(r"commit\s+`[0-9a-f]{8,40}`", text), src
        assert "License" in text, src
