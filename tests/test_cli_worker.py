"""`radixray worker` refuses settings this machine cannot run with one line naming them, before
it binds a port."""

from __future__ import annotations

import pytest
import torch

from radixray import cli
from tests.router.serving import free_port


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_worker_with_an_unrunnable_attention_backend_stops_with_the_choices(capsys):
    argv = ["worker", "--model", "tiny", "--port", str(free_port())]
    assert cli.main([*argv, "--attention-backend", "flash_attn"]) == 2
    err = capsys.readouterr().err
    assert "cannot start: attention backend 'flash_attn'" in err
    assert "needs CUDA tensors" in err and "available here: cpu, torch" in err
    assert cli.main([*argv, "--attention-backend", "cuda-magic"]) == 2
    assert "valid choices: flash_attn, triton, cpu, torch" in capsys.readouterr().err
