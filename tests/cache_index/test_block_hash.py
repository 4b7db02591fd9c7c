import json
import subprocess
import sys

import pytest

from radixray.cache_index import hash_blocks


def test_one_hash_per_full_page():
    assert len(hash_blocks(list(range(33)), 16)) == 2
    assert hash_blocks(list(range(15)), 16) == []
    assert len(hash_blocks(list(range(5)), 1)) == 5


def test_chained_prefix_property():
    a = hash_blocks([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = hash_blocks([1, 2, 3, 4, 9, 9, 9, 9], 4)
    c = hash_blocks([0, 2, 3, 4, 5, 6, 7, 8], 4)
    assert a[0] == b[0] and a[1] != b[1]
    # Same second page, different first page: the chain makes the second hash differ too.
    assert c[0] != a[0] and c[1] != a[1]


def test_parent_continues_the_chain():
    toks = list(range(100, 164))
    full = hash_blocks(toks, 16)
    tail = hash_blocks(toks[32:], 16, parent=full[1])
    assert tail == full[2:]


def test_extra_key_namespaces():
    toks = list(range(32))
    assert hash_blocks(toks, 16, extra_key="lora-a") != hash_blocks(toks, 16)
    assert hash_blocks(toks, 16, extra_key="lora-a") != hash_blocks(toks, 16, extra_key="lora-b")
    same = hash_blocks(tuple(toks), 16, extra_key="lora-a")
    assert hash_blocks(toks, 16, extra_key="lora-a") == same


def test_values_are_uint64_and_stable_across_processes():
    toks = [7, 300, 70000, 2**31 - 1] * 8
    here = hash_blocks(toks, 8, extra_key="s")
    assert all(0 <= h < 2**64 for h in here)
    code = (
        "import json; from radixray.cache_index import hash_blocks;"
        f"print(json.dumps(hash_blocks({toks!r}, 8, extra_key='s')))"
    )
    # A fresh interpreter with a different hash seed must agree (no Python hash()).
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONHASHSEED": "12345"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout) == here


def test_known_value_pins_the_byte_layout():
    # xxh3_64(le_u64(0) || le_i32(0, 1, 2, 3)) computed independently with xxhash and struct.
    import struct

    import xxhash

    expected = xxhash.xxh3_64_intdigest(struct.pack("<Q", 0) + struct.pack("<4i", 0, 1, 2, 3))
    assert hash_blocks([0, 1, 2, 3], 4) == [expected]


@pytest.mark.parametrize("bad", [0, 3, 12, -4])
def test_bad_page_size(bad):
    with pytest.raises(ValueError, match="page_size"):
        hash_blocks([1, 2, 3, 4], bad)


def test_token_out_of_int32_range():
    with pytest.raises(ValueError, match="int32"):
        hash_blocks([2**40, 1], 2)
