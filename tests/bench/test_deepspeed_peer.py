"""DeepSpeed's 1-bit code as a peer: the CPU packbits shim, and (where deepspeed 0.19.6 is installed) both benches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "peers"))

from deepspeed_shim import CpuPacker  # noqa: E402


@pytest.mark.parametrize("numel", [1, 8, 37, 1001])
def test_cpu_packbits_packs_as_deepspeeds_op(numel: int) -> None:
    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel))
    x[0] = -0.0
    packed = CpuPacker.packbits(x, numel, 0)
    assert np.array_equal(packed.numpy(), np.packbits(~np.signbit(x.numpy())))
    unpacked = CpuPacker.unpackbits(packed, packed.numel(), 0)
    assert unpacked.numel() == 8 * packed.numel()
    assert torch.equal(unpacked[:numel], torch.where(torch.signbit(x), -1.0, 1.0))


def test_allreduce_beside_deepspeed_agrees_on_two_gloo_ranks(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    out = tmp_path / "peer"
    ops = tmp_path / "torch_extensions"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "peers" / "allreduce.py"), "--numel", "30011",
                           "--runs", "2", "--out", str(out)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TORCH_EXTENSIONS_DIR": str(ops)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert not ops.exists(), "DeepSpeed compiled an op that its 1-bit code never calls"
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["identical_on_all_ranks"] == {"deepspeed": True, "compcoll": True}
    assert result["max_rel_difference"] < 1e-4 and result["sign_agreement"] > 0.999
