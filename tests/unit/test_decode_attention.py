"""The Triton decode attention (services/rollout/engines/decode_attention.py) against SDPA, run by
Triton's interpreter on the CPU (TRITON_INTERPRET=1, in a child interpreter: it is read at import);
the GPU run of the same comparison is tests/gpu/test_fast_rollout.py."""
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.unit

CHECK = textwrap.dedent("""
    import torch
    from services.rollout.engines.decode_attention import (kernel_works, sdpa_decode_attention,
                                                           triton_decode_attention)
    assert kernel_works(torch.device("cpu"), 16, torch.float32) is None  # the start-up check passes
    torch.manual_seed(0)
    B, KV, G, D, L = 5, 2, 3, 16, 40
    for column in (0, 7, 17, 39):
        q = torch.randn(B, KV * G, 1, D).transpose(1, 2).reshape(B, KV, G, D)  # the decoder's strided view
        cache_k, cache_v = torch.randn(2, B, KV, L, D).unbind(0)
        valid = torch.zeros(B, L, dtype=torch.bool)
        starts = [0, 3, column, 1, 9]            # left padding: row r sees columns start..column
        for r, start in enumerate(starts):
            valid[r, min(start, column):column + 1] = True
        # columns past `column` hold garbage the kernel must never read into the result
        cache_k[:, :, column + 1:] = float("nan")
        cache_v[:, :, column + 1:] = float("nan")
        col = torch.tensor([column])
        got = triton_decode_attention(q, cache_k, cache_v, valid, col, 0.25, block_l=16)
        ref = sdpa_decode_attention(q, cache_k[:, :, :column + 1], cache_v[:, :, :column + 1],
                                    valid[:, :column + 1], col, 0.25)
        err = ((got - ref).norm() / ref.norm()).item()
        assert err < 1e-5, (column, err)
    print("ok")
""")


def test_triton_kernel_matches_sdpa_on_every_visible_prefix():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.getcwd()}
    done = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_a_kernel_that_cannot_run_is_reported_not_raised():
    """Without the interpreter a CPU tensor cannot go through the kernel: the start-up check says why,
    so `auto` falls back to SDPA instead of failing the first generation."""
    pytest.importorskip("triton")
    import torch

    from services.rollout.engines.decode_attention import kernel_works

    reason = kernel_works(torch.device("cpu"), 16, torch.float32)
    assert isinstance(reason, str) and reason


def test_auto_picks_sdpa_off_the_gpu_and_triton_refuses_there():
    import torch

    from services.rollout.engines.decode_attention import decode_attention_for, sdpa_decode_attention

    assert decode_attention_for(torch.device("cpu"), 64) is sdpa_decode_attention
    with pytest.raises(ValueError, match="CUDA device"):
        decode_attention_for(torch.device("cpu"), 64, "triton")
