"""FlatParams: one buffer of master weights beside parameters that keep their storage.

Gradients gathered with zeros for None; frozen parameters left out; bad parameters refused.
"""

from __future__ import annotations

import gc
import importlib
import warnings
import weakref

import pytest
import torch

from compcoll.optim.flat import FlatParams
from tests.pool import run


def _groups():
    torch.manual_seed(0)
    a, b, c = (torch.nn.Parameter(torch.randn(shape)) for shape in ((3, 5), (7,), (2,)))
    return [{"params": [a, b]}, {"params": [c]}], (a, b, c)


def test_parameters_keep_their_storage_and_take_the_masters() -> None:
    """The flat buffer holds the masters; each parameter keeps its own storage (nothing a tool that finds tied weights
    by storage could take for one), takes its master at ``write_back``, and is read back at ``rebind`` however it
    was edited (through ``p.data`` too, which moves no version counter)."""
    groups, (a, b, c) = _groups()
    before = torch.cat([a.detach().reshape(-1), b.detach(), c.detach()]).clone()
    flat = FlatParams(groups, "test")
    assert flat.numel == 24 and flat.groups == [(0, 22), (22, 24)]
    assert torch.equal(flat.data, before)
    storages = {p.untyped_storage().data_ptr() for p in (a, b, c)} | {flat.data.untyped_storage().data_ptr()}
    assert len(storages) == 4, "a parameter shares a storage"
    flat.data.add_(1.0)
    assert torch.equal(a.detach().reshape(-1), before[:15]), "a parameter changed before write_back"
    flat.write_back()
    assert torch.equal(a.detach().reshape(-1), before[:15] + 1) and torch.equal(c.detach(), before[22:] + 1)
    assert [s.group for s in flat.segments] == [0, 0, 1]
    b.data.mul_(2.0)
    assert flat.rebind([a, b, c], "test") is False
    assert torch.equal(flat.data[15:22], (before[15:22] + 1) * 2), "an edit through p.data was not read"


def test_building_keeps_none_of_its_callers_variables() -> None:
    """The check for torch's ZeroRedundancyOptimizer reads no caller's locals: on Python 3.10-3.12 reading
    ``frame.f_locals`` stores a copy on the frame, which kept what a caller's variables held then (in the test pool, a
    finished case's communicator and its Gloo groups, three threads each) alive until that caller returned."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`torch.jit", DeprecationWarning)  # torch's own functional optimizers
        importlib.import_module("torch.distributed.optim.zero_redundancy_optimizer")
    groups, _ = _groups()
    held = torch.nn.Linear(3, 3)
    dropped = weakref.ref(held)
    FlatParams(groups, "test")
    del held
    gc.collect()
    assert dropped() is None, "building the optimizer kept a variable of its caller alive"


def test_gradients_gathered_with_zeros_where_none() -> None:
    groups, (a, b, c) = _groups()
    flat = FlatParams(groups, "test")
    (a.sum() * 2 + c.sum()).backward()
    grad = flat.gather_grads()
    assert torch.equal(grad, torch.cat([torch.full((15,), 2.0), torch.zeros(7), torch.ones(2)]))
    b.grad = torch.ones(7).to_sparse()
    with pytest.raises(ValueError, match="sparse"):
        flat.gather_grads()


def test_sixteen_bit_parameters_get_float32_masters() -> None:
    half = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16))
    full = torch.nn.Parameter(torch.tensor([4.0, 5.0]))
    flat = FlatParams([{"params": [half, full]}], "test")
    assert flat.data.dtype == torch.float32 and flat.data.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    flat.data[0] = 1.0 + 2.0 ** -10
    assert half[0].item() == 1.0, "the model changed before write_back"
    flat.write_back()
    assert half.dtype == torch.bfloat16 and half[0].item() == 1.0 and flat.data[0].item() == 1.0 + 2.0 ** -10
    flat.data[1] = 2.0 + 2.0 ** -6
    flat.write_back()
    assert half[1].item() == 2.0 + 2.0 ** -6, "rounded to nearest: bfloat16 holds 8 bits of mantissa"
    half.grad = torch.full((3,), 0.5, dtype=torch.bfloat16)
    assert flat.gather_grads()[:3].tolist() == [0.5] * 3


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        FlatParams([{"params": [torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))]}], "test")
    with pytest.raises(ValueError, match="no parameters"):
        FlatParams([{"params": []}], "test")
    assert FlatParams([{"params": [torch.nn.Parameter(torch.zeros(4))]}], "t").layout_code() != \
        FlatParams([{"params": [torch.nn.Parameter(torch.zeros(2, 2))]}], "t").layout_code()


def test_fsdp_flat_parameters_are_refused() -> None:
    """FSDP's (FSDP1's) FlatParameter: one shard per rank, alike in shape, so averaging them would mix different
    parameters' values with no layout check to catch it (a real FlatParameter, as FullyShardedDataParallel makes)."""
    from torch.distributed.fsdp._flat_param import FlatParameter

    with pytest.raises(ValueError, match="is FSDP's FlatParameter .* compcoll.fsdp.compress"):
        FlatParams([{"params": [torch.nn.Parameter(torch.zeros(3)), FlatParameter(torch.zeros(8))]}], "test")


def test_parameters_on_several_devices_or_an_unsupported_one_are_refused() -> None:
    cpu, meta = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3, device="meta"))
    with pytest.raises(ValueError, match=r"several devices \(cpu, meta\).*one device"):
        FlatParams([{"params": [cpu]}, {"params": [meta]}], "test")
    with pytest.raises(ValueError, match="on meta are not supported; use CPU or CUDA"):
        FlatParams([{"params": [meta]}], "test")
    sparse = torch.nn.Parameter(torch.zeros(3).to_sparse())
    with pytest.raises(ValueError, match="dense"):
        FlatParams([{"params": [sparse]}], "test")
    assert FlatParams([{"params": [cpu]}], "test").device == torch.device("cpu")


def test_rebind_follows_replaced_storage_and_leaves_the_rest() -> None:
    """Nothing changed: the buffers stay. A float32 parameter assigned new storage is read back; a bfloat16 one
    loaded in place is read back; one moved with the same values keeps its float32 master."""
    half = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16))
    full = torch.nn.Parameter(torch.tensor([4.0, 5.0]))
    flat = FlatParams([{"params": [half, full]}], "test")
    flat.data[0] = 1.0 + 2.0 ** -10
    flat.write_back()
    buffer = flat.data.data_ptr()
    assert flat.rebind([half, full], "test") is False and flat.data.data_ptr() == buffer
    assert flat.data[0].item() == 1.0 + 2.0 ** -10
    full.data = torch.tensor([6.0, 7.0])
    half.data = half.data.clone()  # the same values in new storage: the master keeps its bits
    assert flat.rebind([half, full], "test") is False
    assert flat.data.tolist() == [1.0 + 2.0 ** -10, 2.0, 3.0, 6.0, 7.0]
    with torch.no_grad():
        half.copy_(torch.tensor([8.0, 9.0, 10.0]))
    flat.rebind([half, full], "test")
    assert flat.data[:3].tolist() == [8.0, 9.0, 10.0]
    with pytest.raises(ValueError, match="no longer hold the parameters.*build a new optimizer"):
        flat.rebind([full, half], "test")
    with pytest.raises(ValueError, match="join through add_param_group, not by assigning param_groups"):
        flat.rebind([half, full, torch.nn.Parameter(torch.zeros(2))], "test")
    full.data = torch.zeros(3)
    with pytest.raises(ValueError, match=r"parameter 1 changed shape from \(2,\) to \(3,\)"):
        flat.rebind([half, full], "test")


def test_frozen_parameters_stay_out_of_the_buffer() -> None:
    """requires_grad=False at construction: out of the buffer, the gradients and the checks (a float64 or int8 frozen
    parameter is allowed, as torch's optimizers allow it); the layout's checksum names them, and is a layout
    without them's when there are none; freezing or unfreezing one later is refused, naming it."""
    groups, (a, b, c) = _groups()
    code = FlatParams(groups, "test").layout_code()
    groups, (a, b, c) = _groups()
    assert FlatParams(groups, "test").layout_code() == code
    b.requires_grad_(False)
    odd = torch.nn.Parameter(torch.zeros(2, dtype=torch.int8), requires_grad=False)
    groups[1]["params"].append(odd)
    flat = FlatParams(groups, "test")
    assert flat.numel == 17 and flat.groups == [(0, 15), (15, 17)] and flat.trained == [0, 2]
    assert [(s.start, s.numel, s.group) for s in flat.segments] == [(0, 15, 0), (15, 2, 1)]
    assert flat.data[15:].tolist() == c.tolist() and flat.data[:15].tolist() == a.reshape(-1).tolist()
    assert flat.layout_code() != code
    b.grad = torch.ones(7)
    assert flat.gather_grads().tolist() == [0.0] * 17
    assert flat.rebind([a, b, c, odd], "test") is False
    b.requires_grad_(True)
    with pytest.raises(ValueError, match=r"parameter 1 \(shape \(7,\)\) was frozen when the optimizer was built and "
                                         r"is trained now \(requires_grad=True\)"):
        flat.rebind([a, b, c, odd], "test")
    b.requires_grad_(False)
    c.requires_grad_(False)
    with pytest.raises(ValueError, match=r"parameter 2 \(shape \(2,\)\) was trained .* is frozen now"):
        flat.rebind([a, b, c, odd], "test")
    with pytest.raises(ValueError, match="none of its 2 parameters requires a gradient"):
        FlatParams([{"params": [b, c]}], "test")


def test_torchs_zero_redundancy_optimizer_is_refused() -> None:
    run("tests.optim.flat_workers:zero_redundancy_is_refused", 2, "gloo")
