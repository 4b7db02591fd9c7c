"""Each family served as a user would: a random-weight checkpoint written by the test (with a
small byte-level tokenizer and a ChatML template) behind the router, asked through the official
OpenAI client for a chat and a completion; the completion's text is transformers' greedy tokens,
decoded."""

from __future__ import annotations

import json

import openai
import pytest
import torch

from radixray.model_meta import load_model_meta
from radixray.router.service import RouterService, RouterSettings
from radixray.worker import WorkerHost
from tests.router.serving import LiveServer, local_client

from .test_checkpoint_declarations import write_tokenizer
from .test_model_families import hf_checkpoint

pytestmark = pytest.mark.integration

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize("family", ["qwen2", "qwen3_moe", "gemma3_text", "mistral_window"])
def test_a_family_serves_chat_and_completions_through_the_router(tmp_path, family):
    hf = hf_checkpoint(family, tmp_path)
    write_tokenizer(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = CHATML
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))

    meta = load_model_meta(str(tmp_path))
    service = RouterService(meta, RouterSettings(page_size=4, poll_interval_s=0.1))
    host = WorkerHost({"model": str(tmp_path), "page_size": 4, "num_pages": 128}, "w0")
    try:
        with LiveServer(service, lambda: [local_client(host)]) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)
            prompt = "The sea at night"
            done = client.completions.create(
                model=meta.name, prompt=prompt, max_tokens=24, temperature=0
            )
            chat = client.chat.completions.create(
                model=meta.name,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=8,
                temperature=0,
            )
        assert host.engine.cache.protected_tokens == 0
    finally:
        host.shutdown()
    ids = meta.tokenizer.encode(prompt)
    with torch.inference_mode():
        ref = hf.generate(
            torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=None
        )[0, len(ids) :].tolist()
    stops = set(meta.tokenizer.stop_token_ids)
    end = next((i + 1 for i, t in enumerate(ref) if t in stops), len(ref))
    assert done.choices[0].text == meta.tokenizer.decode(ref[:end])
    assert done.usage.completion_tokens == end
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage.prompt_tokens == len(
        meta.tokenizer.encode(
            meta.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
        )
    )
