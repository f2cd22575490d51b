"""codecs.dispatch: the devices with kernels, and codec results written into the caller's ``out``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compcoll import codecs
from compcoll.codecs import dispatch
from compcoll.kernels import cpu


def test_unsupported_device() -> None:
    """Meta tensors have kernels (traced) where the communicator carries them only."""
    meta = torch.empty(1, device="meta")
    codecs.check_device(meta)
    with pytest.raises(ValueError, match="on meta are not supported by this communicator"):
        codecs.check_device(meta, carries_meta=False)


def test_results_go_into_out_where_given() -> None:
    """The codecs whose results live across codec calls write them into ``out`` where given (a plan's workspace:
    no allocation a call), the same bits as the tensors they make otherwise, on fresh random inputs of a length
    that is a multiple of nothing; ``out`` may be a slice of a larger buffer, as ``Workspace.get`` hands out."""
    rng = np.random.default_rng(29)
    length, rows, block = 1000, 4, 37
    source = torch.from_numpy(rng.standard_normal(997).astype(np.float32))
    error = torch.from_numpy(rng.standard_normal(length).astype(np.float32))
    blocks = rows * -(-(length // rows) // block)
    wire = torch.from_numpy(rng.integers(0, 256, (rows, codecs.SCALE_BYTES + blocks // rows + 31), dtype=np.uint8))
    wire[:, :codecs.SCALE_BYTES] = torch.from_numpy(rng.random(rows, np.float32) + 0.5).view(torch.uint8).view(
        rows, codecs.SCALE_BYTES)

    def spare(numel: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.full((numel + 5,), float("nan"), dtype=dtype)[:numel]

    sums = codecs.block_sums(source, error, block, "l2", rows)
    cases = [
        (lambda out=None: codecs.row_absmax(source, rows, length, out), spare(rows, torch.float32)),
        (lambda out=None: codecs.unframe(wire.clone(), rows, out)[0], spare(rows, torch.float32)),
        (lambda out=None: codecs.block_sums(source, error, block, "l1", rows, out), spare(blocks, torch.float64)),
        (lambda out=None: codecs.block_absmax(source, error, block, rows, out), spare(blocks, torch.float32)),
        (lambda out=None: codecs.frame_scales(wire.clone(), sums, "l2", block, length // rows, out)[0].reshape(-1),
         spare(blocks, torch.float32)),
        (lambda out=None: codecs.unframe_blocks(wire, blocks // rows, rows, out)[0].reshape(-1),
         spare(blocks, torch.float32)),
    ]
    for run, out in cases:
        made, written = run(), run(out)
        assert written.data_ptr() == out.data_ptr() and torch.equal(out, made)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_host_finite_is_torchs_isfinite(dtype: torch.dtype) -> None:
    """``host_finite`` (numpy's one pass, ``FINITE_CHUNK`` at a time; bfloat16's exponent bits) answers as
    ``torch.isfinite(...).all()`` on fresh random values of lengths that are multiples of nothing, across chunk
    boundaries, each with a NaN, an Inf or a -Inf at its first, middle or last element, on a transposed view, and on
    the dtype's largest and smallest normal values (finite)."""
    rng = np.random.default_rng(41)
    for n in (0, 1, 4099, dispatch.FINITE_CHUNK + 3):
        x = torch.from_numpy(rng.standard_normal(n) * 100).to(dtype)
        assert dispatch.host_finite(x) is True
        for bad in (float("nan"), float("inf"), float("-inf")):
            for at in sorted({0, n // 2, n - 1} if n else set()):
                y = x.clone()
                y[at] = bad
                assert dispatch.host_finite(y) is False, (n, bad, at)
    grid = torch.from_numpy(rng.standard_normal((64, 33))).to(dtype)
    assert dispatch.host_finite(grid.t())
    grid[5, 7] = float("nan")
    assert not dispatch.host_finite(grid.t())
    info = torch.finfo(dtype)
    assert dispatch.host_finite(torch.tensor([info.max, -info.max, info.tiny], dtype=dtype))


def test_inputs_below_the_switch_run_the_serial_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    """``call`` runs a CPU kernel's serial twin for an input below ``serial_below()`` elements, the threaded kernel
    from there (the switch at 1000 here; ``conftest`` puts the test's own back)."""
    ran = []
    monkeypatch.setitem(cpu.SERIAL, "compensated_power_sum", lambda *args: ran.append("serial") or 1.0)
    monkeypatch.setattr(cpu, "compensated_power_sum", lambda *args: ran.append("threaded") or 1.0)
    cpu.use_serial_below(1000)
    for n in (999, 1000, 1001):
        codecs.compensated_sum(torch.ones(n), torch.zeros(n))
    assert ran == ["serial", "threaded", "threaded"]
