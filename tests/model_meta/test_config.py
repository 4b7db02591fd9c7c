import dataclasses

import pytest

from radixray.model_meta import ModelConfig, tiny_config


def test_tiny_config_is_valid_gqa():
    c = tiny_config()
    assert c.num_heads % c.num_kv_heads == 0 and c.num_heads != c.num_kv_heads
    assert c.q_size == c.num_heads * c.head_dim and c.kv_size == c.num_kv_heads * c.head_dim
    assert tiny_config(tie_word_embeddings=True).tie_word_embeddings


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_size": 0}, "hidden_size must be a positive int"),
        ({"num_layers": 2.0}, "num_layers must be a positive int"),
        ({"num_kv_heads": 3}, "multiple of num_kv_heads"),
        ({"head_dim": 15}, "head_dim must be even"),
        ({"rope_theta": 0.0}, "rope_theta must be > 0"),
        ({"rms_norm_eps": -1.0}, "rms_norm_eps must be > 0"),
        ({"eos_token_id": 320}, r"eos_token_id must be None or in \[0, 320\)"),
    ],
)
def test_invalid_config_names_the_field(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(tiny_config(), **change)


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        tiny_config().hidden_size = 1  # type: ignore[misc]


def test_optional_token_ids():
    c = ModelConfig(
        vocab_size=10,
        hidden_size=8,
        intermediate_size=16,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=4,
    )
    assert c.bos_token_id is None and c.eos_token_id is None
