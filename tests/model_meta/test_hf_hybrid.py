"""The hybrid families' config.json (radixray/model_meta/hf_hybrid.py): each spelling of the
layer kinds, LFM2's MLP width rule, Granite's Mamba2 and multiplier fields; what is refused (a
window beside state layers, an unknown layer type), and that a worker does not serve them yet."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from radixray.model_meta import SUPPORTED_ARCHITECTURES, HFMetadata, UnsupportedModelError
from radixray.model_meta.model_config import ModelConfig
from radixray.model_meta.state_layers import Mamba2Spec, ShortConvSpec

BASE = {
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def read(path, **fields) -> ModelConfig:
    (path / "config.json").write_text(json.dumps(BASE | fields))
    return HFMetadata(path).config()


def test_lfm2_layer_kinds_norms_and_tied_embeddings(tmp_path):
    c = read(
        tmp_path,
        model_type="lfm2",
        full_attn_idxs=[1],
        conv_L_cache=4,
        norm_eps=1e-6,
        block_auto_adjust_ff_dim=False,
    )
    assert c.layer_kinds == ("conv", "attention", "conv")
    assert c.attention_layers == (1,) and c.state_layers == (0, 2)
    assert c.short_conv == ShortConvSpec(kernel=4, bias=False)
    assert (c.qk_norm, c.rms_norm_eps, c.tie_word_embeddings) == (True, 1e-6, True)
    assert c.intermediate_size == 96 and c.rope_theta == 1_000_000.0
    c = read(
        tmp_path,
        model_type="lfm2",
        layer_types=["full_attention", "conv", "conv"],
        tie_embedding=False,
        conv_bias=True,
        block_auto_adjust_ff_dim=False,
    )
    assert c.layer_kinds == ("attention", "conv", "conv") and not c.tie_word_embeddings
    assert c.short_conv.bias


@pytest.mark.parametrize(
    ("size", "multiplier", "step"), [(96, 1.0, 256), (200, 1.0, 32), (300, 1.5, 64)]
)
def test_lfm2_mlp_width_is_transformers(tmp_path, size, multiplier, step):
    import transformers

    fields = {
        "intermediate_size": size,
        "block_ffn_dim_multiplier": multiplier,
        "block_multiple_of": step,
    }
    c = read(tmp_path, model_type="lfm2", **fields)
    hf = transformers.models.lfm2.modeling_lfm2.Lfm2MLP(transformers.Lfm2Config(**BASE | fields))
    assert c.intermediate_size == hf.w1.out_features


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        (None, (0.0, math.inf)),
        ([0.0, {"__float__": "Infinity"}], (0.0, math.inf)),
        ([0.001, 0.1], (0.001, 0.1)),
    ],
)
def test_granite_mamba_fields(tmp_path, limit, expected):
    c = read(
        tmp_path,
        model_type="granitemoehybrid",
        layers_block_type=["mamba", "attention", "mamba"],  # the hub's older spelling
        mamba_n_heads=8,
        mamba_d_head="auto",
        mamba_d_state=16,
        mamba_n_groups=2,
        mamba_chunk_size=64,
        time_step_limit=limit,
        shared_intermediate_size=48,
        num_local_experts=0,
        embedding_multiplier=12.0,
        residual_multiplier=0.22,
        attention_multiplier=0.0078125,
        logits_scaling=6.0,
        position_embedding_type="nope",
    )
    assert c.layer_kinds == ("mamba", "attention", "mamba")
    assert c.mamba == Mamba2Spec(
        num_heads=8,
        head_dim=16,
        state_size=16,
        n_groups=2,
        chunk_size=64,
        dt_min=expected[0],
        dt_max=expected[1],
    )
    assert (c.embed_scale, c.residual_multiplier, c.attn_scale, c.logits_scaling) == (
        12.0,
        0.22,
        0.0078125,
        6.0,
    )
    assert not c.use_rope and c.num_experts == 0 and c.intermediate_size == 48


def test_granite_moe_and_rope(tmp_path):
    c = read(
        tmp_path,
        model_type="granitemoehybrid",
        layer_types=["full_attention", "linear_attention", "full_attention"],
        mamba_n_heads=8,
        num_local_experts=4,
        num_experts_per_tok=2,
        intermediate_size=32,
        shared_intermediate_size=48,
        position_embedding_type="rope",
    )
    assert c.layer_kinds == ("attention", "mamba", "attention") and c.use_rope
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (4, 2, 32)
    assert c.norm_topk_prob and c.moe_shared_mlp and c.intermediate_size == 48
    assert c.is_moe_layer(1)


def test_window_layers_beside_state_layers_are_refused_naming_both(tmp_path):
    with pytest.raises(
        UnsupportedModelError,
        match=r"sliding-window layers \[1\] together with "
        r"recurrent-state layers \[0, 2\] are not supported",
    ):
        read(
            tmp_path,
            model_type="lfm2",
            layer_types=["conv", "sliding_attention", "conv"],
            sliding_window=16,
            max_position_embeddings=1024,
        )
    lfm2 = read(tmp_path, model_type="lfm2", layer_types=["conv", "full_attention", "conv"])
    with pytest.raises(ValueError, match="window cache and the state cache do not compose"):
        dataclasses.replace(lfm2, layer_windows=(None, 16, None))


def test_unknown_layer_types_and_kinds_are_refused(tmp_path):
    with pytest.raises(UnsupportedModelError, match=r"layer types \['gdn'\] are not supported"):
        read(tmp_path, model_type="lfm2", layer_types=["conv", "gdn", "conv"])
    lfm2 = read(tmp_path, model_type="lfm2", layer_types=["conv", "full_attention", "conv"])
    with pytest.raises(ValueError, match=r"unknown \['gdn'\]"):
        dataclasses.replace(lfm2, layer_kinds=("conv", "gdn", "conv"))
    with pytest.raises(ValueError, match="'mamba' layers need ModelConfig.mamba"):
        dataclasses.replace(lfm2, layer_kinds=("conv", "attention", "mamba"))


def test_hybrids_are_served_with_the_state_cache(tmp_path):
    from radixray.worker.memory_pool import cache_kind

    assert "lfm2" in SUPPORTED_ARCHITECTURES and "granitemoehybrid" in SUPPORTED_ARCHITECTURES
    lfm2 = read(tmp_path, model_type="lfm2", layer_types=["conv", "full_attention", "conv"])
    assert cache_kind("radix", lfm2) == "mamba_radix"  # KV and state checkpoints
    assert cache_kind("chunk", lfm2) == "chunk"
    with pytest.raises(ValueError, match="swa_radix"):
        cache_kind("swa_radix", lfm2)
    # Granite 4.0's attention-only members are the same model type with no state layers
    dense = read(
        tmp_path, model_type="granitemoehybrid", layer_types=["attention"] * 3, num_local_experts=0
    )
    assert dense.state_layers == () and cache_kind("radix", dense) == "radix"
    with pytest.raises(ValueError, match="needs a model with recurrent-state layers"):
        cache_kind("mamba_radix", dense)
