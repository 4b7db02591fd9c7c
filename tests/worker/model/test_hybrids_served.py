"""The hybrid families (recurrent-state layers) served as a user would, as
test_families_served.py serves the others: a random-weight LFM2 or Granite 4.0-H checkpoint
with a byte-level tokenizer and a ChatML template, behind the router, asked through the
official OpenAI client; the completion's text is transformers' greedy tokens, decoded, and the
worker ends with every state slot free or a checkpoint of its state cache (mamba_radix)."""

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
from .test_families_served import CHATML
from .test_hybrid_families import hf_model

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("family", ["lfm2", "granite_h"])
def test_a_hybrid_serves_chat_and_completions_through_the_router(tmp_path, family):
    hf = hf_model(family, tmp_path)
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
                n=2,  # the second sample forks the first's state
            )
        engine = host.engine
        assert engine.cache_kind == "mamba_radix"
        engine.check_integrity()  # both pools: nothing held by a request
        assert engine.state_pool.num_free + engine.cache.num_states == engine.state_pool.num_slots
        assert (
            engine.pool.allocator.num_free + engine.cache.total_pages
            == engine.pool.allocator.num_pages
        )
    finally:
        host.shutdown()
    ids = meta.tokenizer.encode(prompt)
    with torch.inference_mode():
        ref = hf.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),  # id 0 is the pad id
            max_new_tokens=24,
            do_sample=False,
            eos_token_id=None,
        )[0, len(ids) :].tolist()
    stops = set(meta.tokenizer.stop_token_ids)
    end = next((i + 1 for i, t in enumerate(ref) if t in stops), len(ref))
    assert done.choices[0].text == meta.tokenizer.decode(ref[:end])
    assert done.usage.completion_tokens == end
    # greedy: the fork answers as its leader does
    assert len(chat.choices) == 2 and chat.choices[0].message == chat.choices[1].message
