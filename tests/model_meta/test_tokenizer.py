"""Tokenizers: SmolLM2's (from the GGUF metadata) against transformers' tokenizer for the same file,
on real prompts; decode round trips; chat templates; the tiny model's byte tokenizer."""

import json

import pytest

from radixray.model_meta import CHATML, BPETokenizer, ByteTokenizer, ChatTemplate, TokenizerProtocol
from radixray.sim.data import data_text

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You answer in French."},
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Bonjour !"},
        {"role": "user", "content": "Count to 3: 1, 2, 3?\n  Done."},
    ],
]


def real_prompts() -> list[str]:
    """mt_bench turns and sonnet lines, from the data shipped in the package."""
    prompts = []
    for line in data_text("text_prompts/mt_bench_question.jsonl").splitlines():
        if line.strip():
            prompts.extend(json.loads(line)["turns"])
    sonnet = data_text("text_prompts/sonnet_llmperf.txt")
    prompts.append(sonnet)
    prompts.extend(line for line in sonnet.splitlines() if line.strip())
    return prompts


# --- SmolLM2 (the real GGUF) -------------------------------------------------------------------


@pytest.mark.slow
def test_ids_equal_transformers_on_real_prompts(smollm2, hf_smollm2_tokenizer):
    tok = smollm2.tokenizer
    prompts = real_prompts() + ["<|im_start|>user\nhi 2024<|im_end|>", "  two  spaces\n\n\ttab ü €"]
    for text in prompts:
        expected = hf_smollm2_tokenizer(text, add_special_tokens=False).input_ids
        assert tok.encode(text) == expected, text[:80]
        assert tok.decode(expected, skip_special_tokens=False) == text, text[:80]
        assert tok.decode(expected) == hf_smollm2_tokenizer.decode(
            expected, skip_special_tokens=True
        ), text[:80]


@pytest.mark.slow
def test_special_ids_and_stops(smollm2, hf_smollm2_tokenizer):
    tok = smollm2.tokenizer
    assert isinstance(tok, TokenizerProtocol)
    assert tok.eos_token_id == hf_smollm2_tokenizer.eos_token_id == 2  # <|im_end|>
    assert tok.bos_token_id == hf_smollm2_tokenizer.bos_token_id == 1
    assert set(tok.stop_token_ids) == {0, 2}  # <|endoftext|>, <|im_end|>
    assert tok.vocab_size == smollm2.config.vocab_size == 49152
    assert tok.encode("hi", add_special_tokens=True) == tok.encode("hi")  # SmolLM2 adds no BOS
    assert tok.decode(tok.encode("<|im_start|>x<|im_end|>")) == "x"


@pytest.mark.slow
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_equals_transformers(smollm2, hf_smollm2_tokenizer, add_generation_prompt):
    for messages in CONVERSATIONS:
        ours = smollm2.tokenizer.apply_chat_template(messages, add_generation_prompt)
        theirs = hf_smollm2_tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        assert ours == theirs


@pytest.mark.slow
def test_hf_directory_tokenizer(smollm2, hf_smollm2_tokenizer, tmp_path):
    hf_smollm2_tokenizer.save_pretrained(tmp_path)
    tok = BPETokenizer.from_hf_dir(tmp_path)
    text = "Shall I compare thee to a summer's day? <|im_start|>user\n42"
    assert tok.encode(text) == smollm2.tokenizer.encode(text)
    assert tok.eos_token_id == 2
    messages = CONVERSATIONS[1]
    assert tok.apply_chat_template(messages) == smollm2.tokenizer.apply_chat_template(messages)
    assert BPETokenizer.from_hf_dir(tmp_path / "nothing") is None


# --- chat templates and the byte tokenizer (fast) ----------------------------------------------


def test_chatml_renders_explicit_chatml():
    text = ChatTemplate(CHATML).render(CONVERSATIONS[1])
    expected = "".join(
        f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in CONVERSATIONS[1]
    )
    assert text == expected + "<|im_start|>assistant\n"
    assert (
        ChatTemplate(CHATML)
        .render(CONVERSATIONS[0], add_generation_prompt=False)
        .endswith("<|im_end|>\n")
    )


def test_chat_template_rejects_bad_messages():
    with pytest.raises(ValueError, match="messages must be a list"):
        ChatTemplate(CHATML).render("hello")
    with pytest.raises(ValueError, match="role"):
        ChatTemplate(CHATML).render([{"content": "no role"}])


def test_chat_template_raise_exception():
    template = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    )
    with pytest.raises(ValueError, match="user first"):
        ChatTemplate(template).render([{"role": "assistant", "content": "x"}])


def test_byte_tokenizer_round_trip_and_specials():
    tok = ByteTokenizer()
    assert isinstance(tok, TokenizerProtocol)
    text = "héllo <|im_start|>user\nwörld<|im_end|>"
    ids = tok.encode(text)
    assert ids[:2] == [ord("h"), 0xC3] and ByteTokenizer.IM_START_ID in ids
    assert ids[-1] == tok.eos_token_id and max(ids) < tok.vocab_size
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.decode(ids) == "héllo user\nwörld"
    assert tok.encode("a", add_special_tokens=True) == [tok.bos_token_id, 97]
    assert set(tok.stop_token_ids) == {256, 258}


def test_byte_tokenizer_chat_template_is_chatml():
    tok = ByteTokenizer()
    text = tok.apply_chat_template(CONVERSATIONS[0])
    assert (
        text
        == "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.encode(text)[0] == ByteTokenizer.IM_START_ID
