import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub behind PyPI here: never try the network


@pytest.fixture(autouse=True)
def _one_torch_thread():
    # On a small shared CPU, two OpenMP threads spinning against other processes make every op
    # wait a scheduler slice: a SmolLM2 decode step measured 1.4 s with 2 threads, 0.11 s with 1.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def smollm2(smollm2_loaded):
    """The real model, loaded once for every test that needs it (engines' tests included: an
    engine sets the model's attention backend to the one a direct call chooses, "cpu")."""
    return smollm2_loaded


@pytest.fixture(scope="session")
def hf_smollm2_tokenizer():
    """transformers' tokenizer built from the same GGUF file (the reference for ours)."""
    from transformers import AutoTokenizer

    from radixray.worker.model import smollm2_gguf_path

    path = smollm2_gguf_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
