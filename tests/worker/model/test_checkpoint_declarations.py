"""What an HF directory declares beyond its weights: every end-of-sequence id (config.json's and
generation_config.json's lists) stops generation, and an architecture the worker does not run is
refused on opening, naming it and the supported list (``radixray worker`` exits 2, no traceback).
"""

from __future__ import annotations

import json

import pytest
import torch

from radixray import cli
from radixray.model_meta import (
    SUPPORTED_ARCHITECTURES,
    HFMetadata,
    UnsupportedModelError,
    load_model_meta,
)
from radixray.worker import Engine, EngineConfig, SamplingParams
from radixray.worker.model import load_model
from tests.router.serving import free_port

from .test_model_families import hf_checkpoint

IM_END, ENDOFTEXT = 258, 256


def write_tokenizer(path) -> None:
    """A byte-level tokenizer of 300 ids: the 256 bytes, three ChatML specials, fillers."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.add_tokens([f"<|filler{i}|>" for i in range(300 - 259)])
    assert tok.token_to_id("<|im_end|>") == IM_END and tok.get_vocab_size() == 300
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))


def test_every_declared_eos_stops_generation(tmp_path):
    hf = hf_checkpoint("qwen2", tmp_path, eos=[IM_END, 7])
    prompt = list(range(100, 121))
    with torch.inference_mode():
        ref = hf.generate(
            torch.tensor([prompt]), max_new_tokens=60, do_sample=False, eos_token_id=None
        )[0, len(prompt) :].tolist()
    # a token the model produces late, declared only by generation_config.json, second in a list
    late = next(t for t in ref[20:] if t not in ref[:20] and t not in (IM_END, ENDOFTEXT, 7))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [9, late]}))
    write_tokenizer(tmp_path)

    meta = load_model_meta(str(tmp_path))
    assert meta.config.stop_token_ids == (IM_END, 7, 9, late)
    assert meta.config.eos_token_id == IM_END
    assert set(meta.tokenizer.stop_token_ids) == {IM_END, ENDOFTEXT, 7, 9, late}
    stops = set(meta.tokenizer.stop_token_ids)
    end = next(i for i, t in enumerate(ref) if t in stops)
    assert ref[end] == late  # the test checks the late, second-listed id

    engine = Engine(EngineConfig(model=str(tmp_path), page_size=4, device="cpu", num_pages=64))
    out = engine.generate_batch([prompt], SamplingParams(max_tokens=60, temperature=0.0))[0]
    assert out.token_ids == ref[: end + 1] and out.finish_reason == "stop"


def test_without_a_tokenizer_the_checkpoints_eos_ids_still_stop(tmp_path):
    hf = hf_checkpoint("qwen2", tmp_path, eos=[3])
    prompt = list(range(100, 121))
    with torch.inference_mode():
        ref = hf.generate(
            torch.tensor([prompt]), max_new_tokens=40, do_sample=False, eos_token_id=None
        )[0, len(prompt) :].tolist()
    late = next(t for t in ref[5:] if t not in ref[:5])  # declared by generation_config.json
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [late]}))
    engine = Engine(EngineConfig(model=str(tmp_path), page_size=4, device="cpu", num_pages=64))
    assert engine.tokenizer is None
    out = engine.generate_batch([prompt], SamplingParams(max_tokens=40, temperature=0.0))[0]
    end = next(i for i, t in enumerate(ref) if t in (3, late))
    assert out.token_ids == ref[: end + 1] and out.finish_reason == "stop"


def unsupported_checkpoint(path):
    (path / "config.json").write_text(
        json.dumps({"model_type": "phi3", "architectures": ["Phi3ForCausalLM"]})
    )
    return path


def test_an_unsupported_architecture_is_refused_naming_it_and_the_supported_ones(tmp_path):
    unsupported_checkpoint(tmp_path)
    for load in (load_model, load_model_meta):
        with pytest.raises(UnsupportedModelError) as info:
            load(str(tmp_path))
        message = str(info.value)
        assert "'phi3' (Phi3ForCausalLM) is not supported" in message
        assert ", ".join(SUPPORTED_ARCHITECTURES) in message
    assert SUPPORTED_ARCHITECTURES == (
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "gemma3_text",
        "gemma3",
        "gemma2",
        "lfm2",
        "granitemoehybrid",
    )


def test_worker_refuses_an_unsupported_architecture_with_exit_code_2(tmp_path, capsys):
    unsupported_checkpoint(tmp_path)
    argv = ["worker", "--model", str(tmp_path), "--port", str(free_port()), "--device", "cpu"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "cannot start" in err and "'phi3' (Phi3ForCausalLM) is not supported" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("fields", "windows"),
    [
        ({"model_type": "mistral", "sliding_window": 64}, (64, 64, 64)),
        ({"model_type": "mistral", "sliding_window": None}, ()),
        ({"model_type": "qwen2", "sliding_window": 64}, ()),  # use_sliding_window unset
        (
            {
                "model_type": "qwen2",
                "use_sliding_window": True,
                "sliding_window": 64,
                "max_window_layers": 1,
            },
            (None, 64, 64),
        ),
        (
            {
                "model_type": "qwen3",
                "sliding_window": 64,
                "layer_types": ["full_attention", "sliding_attention", "full_attention"],
            },
            (None, 64, None),
        ),
        ({"model_type": "mistral", "sliding_window": 4096}, ()),  # no sequence exceeds it
    ],
)
def test_sliding_windows_are_read_as_transformers_reads_them(tmp_path, fields, windows):
    config = {
        "vocab_size": 300,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "max_position_embeddings": 1024,
        **fields,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    got = HFMetadata(tmp_path).config()
    assert got.layer_windows == windows
    assert [got.window(i) for i in range(3)] == list(windows or (None, None, None))
