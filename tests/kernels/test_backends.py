"""Backend choice in radixray.kernels: automatic, forced by argument, forced by environment."""

from __future__ import annotations

import pytest
import torch

import radixray.kernels as K
from radixray.kernels import flash_attn, reference
from tests.kernels.cases import assert_close, make_cu_seqlens, make_paged_kv, make_query

F32 = torch.float32


@pytest.fixture
def small():
    gen = torch.Generator().manual_seed(0)
    kv = make_paged_kv([2, 7], 4, 2, 16, F32, "cpu", gen)
    q = make_query(2, 4, 16, F32, "cpu", gen)
    return q, kv


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv(K.ENV_VAR, raising=False)


def test_cpu_default_is_the_cpu_fast_path(small):
    q, kv = small
    assert K.resolve_backend(None, q, kv.k_cache) == "cpu"
    assert K.resolve_backend("auto", q, kv.k_cache) == "cpu"
    assert K.resolve_backend(None, q.double(), kv.k_cache.double()) == "torch"
    assert K.available_backends(q, kv.k_cache)[-2:] == ["cpu", "torch"]


def test_public_functions_on_cpu_match_reference(small):
    q, kv = small
    args = (q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens, 0.25)
    expected = reference.paged_decode_attention_loop(*args)
    assert_close(K.paged_decode_attention(*args), expected, F32)
    assert_close(K.paged_decode_attention(*args, backend="torch"), expected, F32)
    cu = make_cu_seqlens([1, 1], "cpu")
    ext_args = (q, kv.k_cache, kv.v_cache, kv.block_table, cu, kv.seq_lens, 0.25)
    assert_close(K.extend_attention(*ext_args), expected, F32)
    assert_close(K.extend_attention(*ext_args, backend=None, max_seqlen_q=1), expected, F32)
    k = torch.randn(2, 2, 16)
    K.store_kv(k, k, kv.k_cache, kv.v_cache, torch.tensor([0, -1]))
    assert torch.equal(kv.k_cache[0, 0], k[0])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only messages")
@pytest.mark.parametrize("name", ["flash_attn", "triton"])
def test_forcing_unavailable_backend_errors_clearly(small, name):
    q, kv = small
    with pytest.raises(K.BackendUnavailableError) as err:
        K.paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens, 1.0, name)
    msg = str(err.value)
    assert repr(name) in msg and "argument" in msg
    assert "flash_attn, triton, cpu, torch" in msg  # the valid choices
    assert "CUDA" in msg


def test_unknown_backend_lists_choices(small):
    q, kv = small
    with pytest.raises(ValueError, match="valid choices: flash_attn, triton, cpu, torch"):
        K.resolve_backend("cuda", q, kv.k_cache)


def test_env_var_is_respected(small, monkeypatch):
    q, kv = small
    monkeypatch.setenv(K.ENV_VAR, "torch")
    assert K.resolve_backend(None, q, kv.k_cache) == "torch"
    monkeypatch.setenv(K.ENV_VAR, "bogus")
    with pytest.raises(ValueError, match=K.ENV_VAR):
        K.paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens, 1.0)
    # an explicit argument wins over the environment
    assert K.resolve_backend("torch", q, kv.k_cache) == "torch"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only messages")
def test_env_var_forcing_unavailable_backend_names_the_variable(small, monkeypatch):
    q, kv = small
    monkeypatch.setenv(K.ENV_VAR, "flash_attn")
    with pytest.raises(K.BackendUnavailableError, match=K.ENV_VAR):
        K.resolve_backend(None, q, kv.k_cache)


def test_flash_attn_absent_or_unsuitable_is_a_reason_not_an_error():
    reason = flash_attn.unavailable_reason(torch.device("cpu"), torch.float16, 16, 64)
    assert reason and "CUDA" in reason
    reason = flash_attn.unavailable_reason(torch.device("cuda"), torch.float32, 16, 64)
    assert reason and "float16" in reason
    assert isinstance(flash_attn.available(), bool)


def test_fast_backend_argument_checks_name_the_value():
    from radixray.kernels._validate import check_decode

    gen = torch.Generator().manual_seed(1)
    kv = make_paged_kv([3], 4, 2, 16, F32, "cpu", gen)
    q = make_query(1, 3, 16, F32, "cpu", gen)
    with pytest.raises(ValueError, match=r"query heads \(3\) must be a multiple of KV heads \(2\)"):
        check_decode(q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens)
    q = make_query(1, 4, 16, torch.float16, "cpu", gen)
    with pytest.raises(ValueError, match="q dtype torch.float16 != cache dtype torch.float32"):
        check_decode(q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens)
    q = make_query(1, 4, 16, F32, "cpu", gen)
    with pytest.raises(ValueError, match="block_table must be int32"):
        check_decode(q, kv.k_cache, kv.v_cache, kv.block_table.long(), kv.seq_lens)
