"""FSDP2's gradient reduce-scatter in a few bits with error feedback: ``ReduceScatterState`` and ``compress``."""

from __future__ import annotations

import warnings
import weakref
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from ..algorithms.agreement import agree_settings
from ..algorithms.inputs import check_scale
from ..algorithms.parts import packed, unpacked
from ..algorithms.plan import owned
from ..algorithms.reduce_scatter import compressed_reduce_scatter, row_elements
from ..comm.torchdist import own_comm, process_group_of, reduce_scatter_single
from ..errors import NonFiniteError
from ..spec import check_bits, check_block_size
from .replicas import ReplicaState
from .units import check_replicas, check_sharded, check_start_step, fsdp_units, reduce_op, replicate_group, shard_group

try:
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
except ImportError as missing:
    raise ImportError(f"compcoll.fsdp needs torch 2.9 or newer, whose FSDP2 takes a custom reduce-scatter "
                      f"(FSDPModule.set_custom_reduce_scatter); this is torch {torch.__version__}. The rest of "
                      "compcoll (collectives, optimizers, DDP hooks) runs on torch 2.6 and newer") from missing

ERROR_DTYPES = (torch.float32, torch.bfloat16)
BITS = 3
"""The default bits per element (bench/results/convergence_fsdp_lm.txt)."""
BLOCK_SIZE = 32
"""The default elements per scale (bench/results/convergence_fsdp_lm.txt)."""
_COMPRESSED: "weakref.WeakKeyDictionary[torch.nn.Module, Any]" = weakref.WeakKeyDictionary()
"""The state ``compress`` last set on each FSDP unit (a unit dropped is not kept alive)."""


class ReduceScatterState:
    """The state of the compressed reduce-scatter: its communicator, options and one error buffer per FSDP unit.

    Follows ``compcoll.ddp.OneBitState``: every argument has a default, it pickles, and
    ``state_dict()`` / ``load_state_dict()`` resume exactly. Build it on every rank at the
    same point (it makes a process group): ``compcoll.fsdp.compress(model)`` does.

    Memory: each unit's worker error covers the whole unsharded unit (n rows of its shard,
    each rounded up to 8 elements), in ``error_dtype``: with bfloat16 (default) 2 bytes per
    parameter per rank, half of float32's; FSDP's own sharded gradients take 4/n. The
    call's float32 view of it is one scratch buffer, shared by all units, the size of the
    largest.

    Args:
        process_group: the ranks FSDP shards over (a process group or a 1-D DeviceMesh); None means the
            default group. The calls run on a new group of the same ranks and backend.
        bits: bits per element: 3 (default), or 1, 2, 4, 8 (``compressed_reduce_scatter``):
            bits/8 + 1/block_size bytes per element; at the defaults 13/32, 1/9.8 of a float32
            reduce-scatter.
        block_size: elements per scale (a power of two from 8 to 8192; default 32).
        scale: 1 bit only: "l2" (default) or "l1".
        error_dtype: torch.bfloat16 (default) or torch.float32: how the error buffers are kept.
        start_step: reduce-scatters each unit sends uncompressed (FSDP's own) first (default 0).
        timeout: seconds a compressed call may take (None: ``COMPCOLL_TIMEOUT``, 300).
    """

    def __init__(self, process_group: dist.ProcessGroup | DeviceMesh | None = None, *, bits: int = BITS,
                 block_size: int = BLOCK_SIZE, scale: str = "l2", error_dtype: torch.dtype = torch.bfloat16,
                 start_step: int = 0, timeout: float | None = None) -> None:
        process_group = process_group_of(process_group, "ReduceScatterState")
        if block_size is None:
            raise ValueError("ReduceScatterState: block_size must be a power of two from 8 to 8192, got None")
        check_block_size("ReduceScatterState", block_size)
        check_scale("ReduceScatterState", scale)
        check_bits("ReduceScatterState", bits)
        if error_dtype not in ERROR_DTYPES:
            raise ValueError(f"ReduceScatterState: error_dtype must be one of {ERROR_DTYPES}, got {error_dtype!r}")
        check_start_step("ReduceScatterState", start_step)
        self.process_group = process_group
        self.bits, self.block_size, self.scale, self.error_dtype = bits, block_size, scale, error_dtype
        self.start_step, self.timeout = start_step, timeout
        self.comm = own_comm(process_group, timeout)
        self._groups: list[dist.ProcessGroup] = []
        agree_settings(self.comm, "ReduceScatterState", {"uncompressed first calls (start_step)": start_step})
        self.errors: dict[int, torch.Tensor] = {}
        self.steps: dict[int, int] = {}
        self._scratch: torch.Tensor | None = None

    def reduce_scatter(self, key: int, output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup,
                       op: Any, unit: torch.nn.Module | None = None) -> None:
        """Reduce-scatter unit ``key``'s gradients as FSDP2 hands them over, into ``output``.

        1. Before ``start_step`` calls of this unit: FSDP's own reduce-scatter on ``group``.
        2. Otherwise ``compressed_reduce_scatter`` with the unit's error buffer (created as
           zeros on first use; a float32 scratch copy of it when kept in bfloat16), ``op``
           as FSDP gives it (AVG, SUM or PREMUL_SUM, its factor read with ``unit``'s help
           before torch 2.13: ``units.reduce_op``).
        3. NaN / Inf in any rank's gradients: every rank's ``output`` is NaN, as FSDP's
           own reduce-scatter would give, and no error buffer changes.
        4. float64 gradients (float64 parameters, or ``reduce_dtype=torch.float64``) go
           through float32 copies, as the DDP hooks' float64 buckets (``ddp.buckets.in_float32``):
           the codecs take float32, float16 and bfloat16.
        """
        self._check_group(group)
        step = self.steps.get(key, 0)
        self.steps[key] = step + 1
        if step < self.start_step:
            reduce_scatter_single(output, input, group=group, op=op)
            return
        kind, factor = reduce_op(op, unit)
        stored = self._error(key, input)
        error = stored if stored.dtype == torch.float32 else self._float32(stored)
        target = output
        if input.dtype == torch.float64:
            input, output = input.float(), output.new_empty(output.shape, dtype=torch.float32)
        try:
            compressed_reduce_scatter(input, output, error, self.comm, op=kind, factor=factor,
                                      block_size=self.block_size, scale=self.scale, bits=self.bits)
        except NonFiniteError:
            target.fill_(float("nan"))
            return
        if error is not stored:
            stored.copy_(error)
        if output is not target:
            target.copy_(output)

    def _check_group(self, group: dist.ProcessGroup) -> None:
        """FSDP's reduce-scatter ``group`` holds the ranks of the state's (checked once per group object).

        Raises:
            ValueError: it holds other ranks: the state would reduce across the wrong ones.
        """
        if any(seen is group for seen in self._groups):
            return
        ranks = dist.get_process_group_ranks(group)
        if ranks != self.comm.global_ranks:
            raise ValueError(f"compcoll.fsdp: FSDP reduce-scatters over ranks {ranks}, the state was built for "
                             f"ranks {self.comm.global_ranks}; build it for the unit's shard group "
                             f"(compress(model) does)")
        self._groups.append(group)

    def _error(self, key: int, input: torch.Tensor) -> torch.Tensor:
        """Unit ``key``'s stored error buffer: zeros in ``error_dtype`` on first use; on ``input``'s device, values
        kept, where it is on another (loaded from ``compcoll.checkpoint``'s files, which map to the CPU: before
        2026-12-01 a GPU run resumed from them restarted every error buffer at zero, with nothing said)."""
        length = self.comm.size * row_elements(input.numel(), self.comm.size)
        error = self.errors.get(key)
        if error is None or error.numel() != length:
            error = torch.zeros(length, dtype=self.error_dtype, device=input.device)
            self.errors[key] = error
        elif error.device != input.device:
            error = error.to(input.device)
            self.errors[key] = error
        return error

    def _float32(self, stored: torch.Tensor) -> torch.Tensor:
        """A float32 copy of ``stored`` in the shared scratch (grown to the largest unit)."""
        if self._scratch is None or self._scratch.numel() < stored.numel() or self._scratch.device != stored.device:
            self._scratch = torch.empty(stored.numel(), dtype=torch.float32, device=stored.device)
        return self._scratch[:stored.numel()].copy_(stored)

    def memory(self) -> int:
        """Bytes of this rank's error buffers and scratch."""
        buffers = sum(e.numel() * e.element_size() for e in self.errors.values())
        return buffers + (0 if self._scratch is None else self._scratch.numel() * 4)

    def state_dict(self) -> dict[str, Any]:
        """The options, each unit's step count (as (unit, count) pairs) and this rank's error buffers (save one per
        process), with whose they are: the rank of the group and the process of the job (``plan.owned``); the buffers
        and the rank packed under the process's key (``parts.packed``: ``torch.distributed.checkpoint`` keeps every
        process's)."""
        return packed({"world_size": self.comm.size, "rank": self.comm.rank,
                       "job": [self.comm.job_rank, self.comm.job_size], "bits": self.bits,
                       "block_size": self.block_size, "scale": self.scale,
                       "error_dtype": str(self.error_dtype).replace("torch.", ""), "start_step": self.start_step,
                       "steps": sorted(self.steps.items()), "errors": {k: e.clone() for k, e in self.errors.items()}},
                      ("rank", "errors"))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict()`` saved: options, step counts and, from this rank's own state, its error
        buffers; another rank's or world size's (``plan.owned``: a warning) restarts them at zero. A state of the layout
        before 2026-12-01 (nothing packed: ``parts.unpacked``) loads too."""
        state = unpacked(state)
        own = owned(state, self.comm, "ReduceScatterState")
        self.bits, self.block_size, self.scale = state["bits"], state["block_size"], state["scale"]
        self.start_step = state["start_step"]
        self.error_dtype = getattr(torch, state["error_dtype"])
        self.steps = dict(state["steps"])
        self.errors = {k: e.clone() for k, e in state["errors"].items()} if own else {}

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the ``state_dict()`` and the timeout; the process group is not picklable."""
        return {"state": self.state_dict(), "timeout": self.timeout}

    def __setstate__(self, saved: dict[str, Any]) -> None:
        """Unpickle onto the default process group (every rank at the same point: it makes a group)."""
        state = saved["state"]
        self.__init__(None, bits=state["bits"], block_size=state["block_size"], scale=state["scale"],
                      error_dtype=getattr(torch, state["error_dtype"]), start_step=state["start_step"],
                      timeout=saved["timeout"])
        self.load_state_dict(state)


class CompressedReduceScatter(ReduceScatter):
    """FSDP2's ``ReduceScatter`` for one unit: ``ReduceScatterState.reduce_scatter`` under the unit's key.

    It holds the unit weakly (the unit holds it): what a PREMUL_SUM's factor is read from before torch 2.13.
    """

    def __init__(self, state: ReduceScatterState, key: int, unit: torch.nn.Module) -> None:
        self.state = state
        self.key = key
        self.unit = weakref.ref(unit)

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A new tensor from torch's allocator, as FSDP's default."""
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op: Any, async_op: bool = False) -> None:
        """Run the unit's compressed reduce-scatter (blocking: FSDP2 waits on its stream, not on a Work)."""
        self.state.reduce_scatter(self.key, output_tensor, input_tensor, group, op, self.unit())


def compress(model: torch.nn.Module, *, replicas: dist.ProcessGroup | DeviceMesh | None = None,
             **options: Any) -> ReduceScatterState:
    """Compress FSDP2's gradient communication for every ``fully_shard`` unit of ``model``; returns the state.

    1. Without ``replicas``: a ``ReduceScatterState`` on the group FSDP2 reduce-scatters over
       (the mesh ``fully_shard`` was given; beside tensor parallelism, not the tensor-parallel
       dimension), set as each unit's custom reduce-scatter (``set_custom_reduce_scatter``),
       keyed by the unit's place in ``model.modules()``. Under native HSDP (a mesh with a
       replicate dimension), FSDP2's all-reduce across the replicas stays its own, in float,
       with a warning that says so.
    2. With ``replicas`` (HSDP by hand: ``fully_shard`` over the ranks of a node, and
       ``replicas`` the group of the ranks holding the same shard on the other nodes): a
       ``ReplicaState`` on ``replicas``, whose hook (``set_all_reduce_hook``) averages each
       reduced shard across the replicas in a few bits; the reduce-scatter inside the node
       stays FSDP's. A ``ValueError`` where FSDP2 all-reduces across replicas itself (native
       HSDP: the hook would come after its float all-reduce) or where ``replicas`` holds other
       ranks of the shard group (it would average different parts of the parameters).
    3. Units an earlier call compressed take this call's state instead, with a warning: the
       earlier state no longer sees their gradients, and saving it would save stale buffers.
    A model under FSDP2's ``replicate`` alone (no shard dimension) raises a ``ValueError``
    that says how to compress it: FSDP2 all-reduces its gradients itself, in float.
    Call it on every rank at the same point, after ``fully_shard`` and before the first
    backward. Save ``state.state_dict()`` beside the model for an exact resume.

    Args:
        model: the root module, with ``fully_shard`` applied to it (and to its blocks).
        replicas: the cross-replica group for the HSDP form (a process group or a 1-D DeviceMesh, such as
            ``mesh["replicate"]``); None for the reduce-scatter form.
        **options: passed to ``ReduceScatterState`` or ``ReplicaState``.

    Returns:
        The state.
    """
    units = fsdp_units(model)
    check_sharded(units)
    again = sum(unit in _COMPRESSED for unit in units)
    if again:
        warnings.warn(f"compcoll.fsdp.compress: {again} of the model's {len(units)} FSDP units were compressed by an "
                      f"earlier call; they take this call's state now, and the earlier state no longer sees their "
                      f"gradients (keep and save the state this call returns)", stacklevel=2)
    if replicas is None:
        native = replicate_group(units)
        if native is not None:
            warnings.warn(f"compcoll.fsdp.compress: the model is sharded by native HSDP (a mesh with a replicate "
                          f"dimension): the reduce-scatter inside each replica goes compressed, and FSDP2's "
                          f"all-reduce across its {native.size()} replicas stays its own, in float (FSDP2 takes no "
                          f"custom all-reduce); to compress across the replicas, shard over mesh['shard'] alone and "
                          f"pass replicas=mesh.get_group('replicate')", stacklevel=2)
        state: Any = ReduceScatterState(shard_group(units), **options)
        for key, unit in enumerate(units):
            unit.set_custom_reduce_scatter(CompressedReduceScatter(state, key, unit))
    else:
        replicas = process_group_of(replicas, "compcoll.fsdp.compress")
        check_replicas(units, replicas)
        state = ReplicaState(replicas, **options)
        for key, unit in enumerate(units):
            unit.set_all_reduce_hook(state.hook(key, unit))
    for unit in units:
        _COMPRESSED[unit] = state
    return state
