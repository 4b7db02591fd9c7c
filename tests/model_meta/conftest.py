import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub behind PyPI here: never try the network


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2's metadata (config, tokenizer, chat template) from the GGUF: no weights."""
    from radixray.model_meta import load_model_meta

    return load_model_meta("smollm2")


@pytest.fixture(scope="session")
def gguf_reader():
    """``gguf``'s own reader of the embedded SmolLM2 file, the reference for ours. Building one
    takes seconds (a numpy view per part of 100k vocabulary strings): built once, it serves
    test_gguf_reader.py and transformers' tokenizer below."""
    gguf = pytest.importorskip("gguf")
    from radixray.model_meta import smollm2_gguf_path

    return gguf.GGUFReader(str(smollm2_gguf_path()))


@pytest.fixture(scope="session")
def hf_smollm2_tokenizer(gguf_reader):
    """transformers' tokenizer built from the same GGUF file (the reference for ours).
    transformers reads the file with ``gguf.GGUFReader`` too: it is handed the reader above, the
    one it would build, of the same file."""
    from unittest import mock

    import gguf
    from transformers import AutoTokenizer

    from radixray.model_meta import smollm2_gguf_path

    path = smollm2_gguf_path()

    def reader(p, *a, **kw):
        assert os.path.samefile(p, path) and not a and not kw, (p, a, kw)
        return gguf_reader

    with mock.patch.object(gguf, "GGUFReader", reader):
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
