import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub behind PyPI here: never try the network


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2's metadata (config, tokenizer, chat template) from the GGUF: no weights."""
    from radixray.model_meta import load_model_meta

    return load_model_meta("smollm2")


@pytest.fixture(scope="session")
def hf_smollm2_tokenizer():
    """transformers' tokenizer built from the same GGUF file (the reference for ours)."""
    from transformers import AutoTokenizer

    from radixray.model_meta import smollm2_gguf_path

    path = smollm2_gguf_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
