"""Kernel launches, tensor wraps, host waits and torch operators of one call of each protocol: on CUDA, or on meta."""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import compcoll
from ..comm import Communicator
from ..ddp.onebit import BLOCK_SIZE
from ..kernels.launch import COUNTS

PROTOCOLS = ("gather_scatter", "allgather", "hierarchical", "birder", "gather_scatter_blocks", "allgather_blocks",
             "gather_scatter_levels", "hierarchical_allgather")
"""The calls counted: flat 1-bit gather-scatter and allgather, the compensated hierarchical form, Birder's, both
flat protocols with a scale per ``ddp.onebit.BLOCK_SIZE`` elements (the DDP hook's default), gather-scatter with
4-bit levels a step per ``BLOCK_SIZE`` (``fsdp.ReplicaState``'s default), and the compensated hierarchical form
with the allgather protocol between nodes (the optimizers' between 2 nodes)."""
LEVEL_BITS = 4
"""The bits of the "gather_scatter_levels" call."""


_NO_DEVICE_WORK = {torch.ops.aten.detach.default, torch.ops.aten.lift_fresh.default}
"""Operators not counted as device work: those that launch nothing on the device (detaches; views neither)."""
_ALLOCATIONS = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default,
                torch.ops.aten.empty_like.default}
"""Allocations (from torch's caching allocator on a GPU): counted apart from device work."""


class DeviceOps(TorchDispatchMode):
    """Counts the torch operators that touch a device tensor and launch device work (copies, arithmetic, fills):
    not views, allocations or detaches (``count``); and, apart, the allocations of device memory
    (``allocations``: each one a call to torch's caching allocator, host time on a GPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.allocations = 0

    def __torch_dispatch__(self, func: Callable[..., Any], types: tuple, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if any(isinstance(t, torch.Tensor) and t.device.type != "cpu" for t in tree_flatten((args, kwargs, out))[0]):
            if func in _ALLOCATIONS:
                self.allocations += 1
            elif not (func.is_view or func in _NO_DEVICE_WORK or _reads_to_host(func, out)):
                self.count += 1
        return out


def _reads_to_host(func: Callable[..., Any], out: Any) -> bool:
    """Whether ``func`` read a device tensor's values to the host: ``.item()`` (``_local_scalar_dense``) or
    ``.tolist()`` (a ``_to_copy`` to the CPU), as ``kernels.launch.read_values`` does. Such a read is a host wait,
    counted in ``waits``; on meta tensors nothing is read, so counting it as device work too made a CUDA call one
    torch operator more than the same call on meta (the H200, 2026-12-04: 4 against 3 for flat gather-scatter)."""
    return func is torch.ops.aten._local_scalar_dense.default or (
        func is torch.ops.aten._to_copy.default and isinstance(out, torch.Tensor) and out.device.type == "cpu")


def protocol_calls(x: torch.Tensor, comm: Communicator, ranks_per_node: int | None = None
                   ) -> dict[str, Callable[[], object]]:
    """One call of each protocol on ``x`` over ``comm``, the hierarchical ones on nodes of ``ranks_per_node`` ranks
    (None: one node), with zeroed error buffers on ``x``'s device."""
    k = comm.size if ranks_per_node is None else ranks_per_node
    full = compcoll.padded_numel(x.numel(), comm.size)
    we, se = torch.zeros(full, device=x.device), torch.zeros(full // comm.size, device=x.device)
    hwn, hsn = compcoll.hierarchical_error_numels(x.numel(), comm.size, k)
    hwe, hse = torch.zeros(hwn, device=x.device), torch.zeros(hsn, device=x.device)
    return {
        "gather_scatter": lambda: compcoll.compressed_allreduce(x, we, se, comm),
        "allgather": lambda: compcoll.compressed_allreduce(x, we, se, comm, protocol="allgather"),
        "hierarchical": lambda: compcoll.hierarchical_compressed_allreduce(x, hwe, hse, comm, ranks_per_node=k),
        "birder": lambda: compcoll.hierarchical_allreduce(x, comm, ranks_per_node=k, seed=1, step=0),
        "gather_scatter_blocks": lambda: compcoll.compressed_allreduce(x, we, se, comm, block_size=BLOCK_SIZE),
        "allgather_blocks": lambda: compcoll.compressed_allreduce(x, we, se, comm, protocol="allgather",
                                                                  block_size=BLOCK_SIZE),
        "gather_scatter_levels": lambda: compcoll.compressed_allreduce(x, we, se, comm, block_size=BLOCK_SIZE,
                                                                       bits=LEVEL_BITS),
        "hierarchical_allgather": lambda: compcoll.hierarchical_compressed_allreduce(
            x, hwe, hse, comm, ranks_per_node=k, protocol="allgather"),
    }


def call_counts(x: torch.Tensor, comm: Communicator, synchronize: Callable[[], None] = lambda: None,
                protocols: tuple[str, ...] = PROTOCOLS) -> dict[str, dict[str, int]]:
    """``{protocol: {"launches": N, "wraps": N, "waits": N, "torch": N, "allocations": N}}`` of one call of each of
    ``protocols`` on ``x``.

    1. Call the protocol once: it agrees its plan, compiles and allocates.
    2. Wait for the device (``synchronize``), reset ``kernels.launch.COUNTS``, call it again
       under ``DeviceOps`` and wait again.
    3. Read the counts: those of a steady call (``torch``: its torch operators with device
       work, among them the transport's copies on ``SingleComm``; ``allocations``: its
       allocations of device memory). On meta tensors nothing runs, and the counts are those
       the same call makes on CUDA tensors.
    """
    found = {}
    calls = protocol_calls(x, comm)
    for name in protocols:
        call = calls[name]
        call()
        synchronize()
        COUNTS.reset()
        with DeviceOps() as ops:
            call()
        synchronize()
        found[name] = {"launches": COUNTS.launches, "wraps": COUNTS.wraps, "waits": COUNTS.waits, "torch": ops.count,
                       "allocations": ops.allocations}
    return found


def world_counts(numel: int, ranks: int, ranks_per_node: int, protocols: tuple[str, ...] = PROTOCOLS,
                 on_device: bool = False) -> dict[str, dict[str, int]]:
    """``{protocol: {"launches": N, "wraps": N, "waits": N}}`` of one rank's steady call of each of ``protocols`` on
    ``numel`` float32 elements, in an in-process world of ``ranks`` ranks on nodes of ``ranks_per_node``, its
    agreement rounds on the device where ``on_device`` (``Communicator.agrees_on_device``: NCCL's).

    The world carries meta tensors (``Communicator.carries_meta``), so every rank's calls take the CUDA path with
    every launch and wait counted and none run: what each rank of such a job launches and waits for on a GPU.
    1. Every rank calls each protocol once (its plan, agreement and compilation), then, between barriers, rank 0
       resets ``kernels.launch.COUNTS``, every rank calls it again, and rank 0 reads the world's counts.
    2. A rank's counts are the world's over ``ranks``: every rank of these protocols makes the same launches and
       waits (ValueError where a count is not a multiple of ``ranks``).
    """
    from ..launcher import run_threads

    totals: dict[str, dict[str, int]] = {}

    def rank(comm: Communicator) -> None:
        comm.agrees_on_device = on_device
        calls = protocol_calls(torch.empty(numel, device="meta"), comm, ranks_per_node)
        for name in protocols:
            calls[name]()
            comm.barrier()
            if comm.rank == 0:
                COUNTS.reset()
            comm.barrier()
            calls[name]()
            comm.barrier()
            if comm.rank == 0:
                totals[name] = {"launches": COUNTS.launches, "wraps": COUNTS.wraps, "waits": COUNTS.waits}
            comm.barrier()

    run_threads(rank, ranks, timeout=600.0)
    uneven = {name: c for name, c in totals.items() if any(v % ranks for v in c.values())}
    if uneven:
        raise ValueError(f"counts over {ranks} ranks that the ranks do not share evenly: {uneven}")
    return {name: {key: value // ranks for key, value in c.items()} for name, c in totals.items()}


def per_call_us(fn: Callable[[], object], calls: int, runs: int, synchronize: Callable[[], None] = lambda: None
                ) -> float:
    """Median over ``runs`` of the host microseconds per call of ``fn`` in a loop of ``calls`` calls, after up to 50
    calls of warm-up; ``synchronize`` (a GPU's) runs after the warm-up and after each run."""
    for _ in range(min(calls, 50)):
        fn()
    synchronize()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
        synchronize()
    return statistics.median(times)


def host_microseconds(x: torch.Tensor, comm: Communicator, runs: int = 9, calls: int = 200) -> dict[str, float]:
    """``{protocol: microseconds}`` per call (``per_call_us``: the median over ``runs`` of ``calls`` calls in a row).

    On meta tensors nothing is launched, so this is the CUDA path's own Python (compcoll's
    and torch's dispatch, meta's shape functions among it): a proxy for its host overhead on
    a GPU, comparable between two versions of compcoll measured side by side on one machine.
    """
    return {name: per_call_us(call, calls, runs) for name, call in protocol_calls(x, comm).items()}


_PACKAGE = str(Path(__file__).resolve().parents[1])
"""compcoll's own source folder: the functions ``python_calls`` counts."""


def python_calls(x: torch.Tensor, comm: Communicator, calls: int = 20) -> dict[str, float]:
    """``{protocol: calls}``: the calls of compcoll's own Python functions one steady call of each protocol makes.

    1. Call each protocol 5 times (plan, agreement, compilation, replays recorded).
    2. Count, with ``cProfile``, the calls of functions defined in compcoll's source in ``calls`` more calls.
    A count, not a time: the same on any machine, however busy (torch's operators and the transport are outside
    it), so two versions compare exactly where ``host_microseconds`` is noisy.
    """
    found = {}
    for name, call in protocol_calls(x, comm).items():
        for _ in range(5):
            call()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(calls):
            call()
        profile.disable()
        own = sum(count for (where, _, _), (_, count, _, _, _) in pstats.Stats(profile).stats.items()
                  if where.startswith(_PACKAGE))
        found[name] = own / calls
    return found
