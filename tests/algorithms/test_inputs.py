"""Local argument checks: tensors that share memory are refused before any communication, in-place calls are not."""

from __future__ import annotations

import pytest
import torch

import compcoll
from compcoll.algorithms.inputs import check_disjoint


def _check(*named: tuple[str, torch.Tensor | None], **options) -> None:
    check_disjoint("call", named, **options)


def test_disjoint_views_of_one_buffer_pass() -> None:
    """Views that meet at a boundary, empty and meta tensors, and tensors on other devices do not overlap."""
    buffer = torch.zeros(100)
    _check(("tensor", buffer[:40]), ("out", buffer[40:80]), ("worker_error", buffer[80:]),
           ("server_error", torch.zeros(3)))
    _check(("tensor", buffer[:0]), ("out", None), ("worker_error", buffer))
    _check(("tensor", torch.empty(100, device="meta")), ("worker_error", torch.empty(100, device="meta")))


def test_overlaps_are_named() -> None:
    """A shared element anywhere in two byte ranges is refused, naming both; a 2-D tensor's range is its rows'."""
    buffer = torch.zeros(100)
    with pytest.raises(ValueError, match="call: worker_error and server_error share memory"):
        _check(("worker_error", buffer[:60]), ("server_error", buffer[59:]))
    with pytest.raises(ValueError, match="tensor and worker_error share memory"):
        _check(("tensor", buffer.view(10, 10)[:, :3]), ("worker_error", buffer[92:]))
    _check(("tensor", buffer.view(10, 10)[:9, :3]), ("worker_error", buffer[93:]))
    with pytest.raises(ValueError, match="out and worker_error share memory"):
        _check(("tensor", torch.zeros(4)), ("out", buffer[:4]), ("worker_error", buffer))


def test_out_may_be_the_tensor_itself_only() -> None:
    """out identical to tensor (same pointer, shape and strides) is an in-place call; a shifted or reshaped view of
    it is refused, unless the pair may overlap."""
    buffer = torch.zeros(64)
    _check(("tensor", buffer), ("out", buffer))
    _check(("tensor", buffer), ("out", buffer.view(-1)))
    with pytest.raises(ValueError, match="out overlaps tensor without being it"):
        _check(("tensor", buffer[1:]), ("out", buffer[:-1]))
    with pytest.raises(ValueError, match="out overlaps tensor without being it"):
        _check(("tensor", buffer.view(8, 8)), ("out", buffer))
    _check(("tensor", buffer), ("out", buffer[8:16]), may_overlap=(frozenset(("tensor", "out")),))


def test_every_entry_point_refuses_shared_memory() -> None:
    """compressed_allreduce (in its worker), CompressedAllreduce, hierarchical_allreduce and
    hierarchical_compressed_allreduce refuse overlapping arguments on one rank, and their buffers stay put."""
    comm = compcoll.SingleComm()
    x = torch.randn(1001)
    full = compcoll.padded_numel(x.numel(), 1)
    shifted = torch.randn(1002)
    with pytest.raises(ValueError, match="CompressedAllreduce: out overlaps tensor"):
        compcoll.CompressedAllreduce(comm)(shifted[1:], out=shifted[:-1])
    with pytest.raises(ValueError, match="hierarchical_allreduce: out overlaps tensor"):
        compcoll.hierarchical_allreduce(shifted[1:], comm, out=shifted[:-1], seed=0)
    wn, sn = compcoll.hierarchical_error_numels(x.numel(), 1, 1)
    errors = torch.randn(wn + sn)
    saved = errors.clone()
    with pytest.raises(ValueError, match="hierarchical_compressed_allreduce: worker_error and server_error share"):
        compcoll.hierarchical_compressed_allreduce(x, errors[:wn], errors[wn - 1:wn - 1 + sn], comm,
                                                   ranks_per_node=1)
    assert torch.equal(errors, saved), "a refused call wrote an error buffer"
    flat = torch.randn(2 * full)
    saved = flat.clone()
    with pytest.raises(ValueError, match="compressed_allreduce: out and worker_error share memory"):
        compcoll.compressed_allreduce(x, flat[:full], flat[full:], comm, out=flat[:x.numel()])
    assert torch.equal(flat, saved), "a refused call wrote an error buffer"
