"""radixray's GGUF reader against gguf's own on the embedded SmolLM2 file: the same metadata
values (and Python types) and the same tensors, byte for byte."""

from __future__ import annotations

import numpy as np
import pytest

from radixray.model_meta.gguf_reader import GGUFFile

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def both(gguf_reader):
    from radixray.model_meta import smollm2_gguf_path

    return GGUFFile(smollm2_gguf_path()), gguf_reader


def test_every_field_has_gguf_s_value_and_type(both):
    ours, theirs = both
    assert list(ours.fields) == list(theirs.fields)
    for key, field in theirs.fields.items():
        want, got = field.contents(), ours.fields[key].contents()
        assert got == want and type(got) is type(want), key
        if isinstance(want, list) and want:
            assert type(got[0]) is type(want[0]), key
    assert len(ours.fields["tokenizer.ggml.tokens"].contents()) == 49152


def test_every_tensor_is_the_same_view_of_the_file(both):
    ours, theirs = both
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, ref in zip(ours.tensors, theirs.tensors, strict=True):
        assert mine.shape == tuple(int(d) for d in ref.shape), mine.name
        assert mine.tensor_type == ref.tensor_type, mine.name
        assert (mine.data.dtype, mine.data.shape) == (ref.data.dtype, ref.data.shape), mine.name
        assert np.array_equal(mine.data, ref.data), mine.name
        assert not mine.data.flags.writeable
    assert {t.tensor_type.name for t in ours.tensors} >= {"F32", "Q8_0"}


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGML" + bytes(40))
    with pytest.raises(ValueError, match="not a little-endian GGUF"):
        GGUFFile(bad)
