"""What compcoll reads of FSDP2: a model's ``fully_shard`` units, the group they shard over, its reduce ops."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import ReduceOp
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor


def fsdp_units(model: torch.nn.Module) -> list[FSDPModule]:
    """The modules of ``model`` that ``fully_shard`` made FSDP units, in ``model.modules()`` order (alike on every
    rank).

    Raises:
        ValueError: no module of ``model`` is a unit.
    """
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not units:
        raise ValueError("compcoll.fsdp: no module of the model is an FSDP unit; call "
                         "torch.distributed.fsdp.fully_shard on it (and its blocks) first")
    return units


def check_sharded(units: list[FSDPModule]) -> None:
    """The units shard their parameters: not FSDP2's ``replicate`` alone (``torch.distributed._composable.
    replicate_with_fsdp``, data parallelism through FSDP2), whose units have a replicate group and no shard group.

    Raises:
        ValueError: a unit replicated alone; it says how to compress such a model (FSDP2 all-reduces its gradients
            itself, in float, and takes no custom all-reduce).
    """
    for unit in units:
        for group in param_groups(unit):
            info = group.mesh_info
            replicas = getattr(info, "replicate_process_group", None)
            if replicas is not None and getattr(info, "shard_process_group", None) is None:
                raise ValueError(
                    f"compcoll.fsdp.compress: the model is replicated by FSDP2's replicate() (no shard dimension), "
                    f"which all-reduces each gradient across its {replicas.size()} replicas itself, in float, and "
                    f"takes no custom all-reduce. To compress them, fully_shard over one rank and average across "
                    f"the replicas with compcoll: mesh = init_device_mesh(device, (world_size, 1), "
                    f"mesh_dim_names=('replicate', 'shard')); fully_shard(module, mesh=mesh['shard']) for each "
                    f"unit; compcoll.fsdp.compress(model, replicas=mesh.get_group('replicate')). Or train under "
                    f"DistributedDataParallel with compcoll.ddp.onebit_hook")


def shard_group(units: list[FSDPModule]) -> dist.ProcessGroup:
    """The process group FSDP2 reduce-scatters the units' gradients over: each parameter group's shard group
    (private state, ``mesh_info.shard_process_group``), which is the dimension of the mesh ``fully_shard`` was
    given, not the last dimension of the parameters' DTensor mesh: under tensor parallelism that is the
    tensor-parallel one.

    Raises:
        ValueError: the units shard over different groups, or over none (``replicate`` alone).
    """
    groups = {}
    for unit in units:
        for group in param_groups(unit):
            shard = getattr(group.mesh_info, "shard_process_group", None)
            if shard is not None:
                groups[tuple(dist.get_process_group_ranks(shard))] = shard
    if len(groups) != 1:
        raise ValueError(f"compcoll.fsdp: the units shard over {len(groups)} different groups of ranks "
                         f"({sorted(groups)}); compress needs one")
    return next(iter(groups.values()))


def replicate_group(units: list[FSDPModule]) -> dist.ProcessGroup | None:
    """The group FSDP2 itself all-reduces the units' reduced shards across (native HSDP: ``fully_shard`` over a
    mesh with a replicate dimension), read from the parameter groups' private ``mesh_info``; None without one."""
    for unit in units:
        for group in param_groups(unit):
            replicas = getattr(group.mesh_info, "replicate_process_group", None)
            if replicas is not None:
                return replicas
    return None


def check_replicas(units: list[FSDPModule], replicas: dist.ProcessGroup) -> None:
    """``replicas`` suits HSDP by hand: FSDP2 does not all-reduce across replicas itself, and the group holds this
    rank and no other rank of the units' shard group (which holds other parts of the parameters).

    Raises:
        ValueError: native HSDP, whose all-reduce hook FSDP2 calls after its own all-reduce, so the hook's would
            come on top of it; or a ``replicas`` group that shares ranks with the shard group.
    """
    native = replicate_group(units)
    if native is not None:
        raise ValueError(f"compcoll.fsdp.compress: the model is sharded by native HSDP (a mesh with a replicate "
                         f"dimension), and FSDP2 all-reduces across its {native.size()} replicas itself before it "
                         f"calls an all-reduce hook, so replicas= would send on top of FSDP2's float all-reduce; "
                         f"shard over mesh['shard'] alone and pass replicas=mesh.get_group('replicate') (HSDP by hand)")
    rank, ranks = dist.get_rank(), dist.get_process_group_ranks(replicas)
    shared = sorted(set(ranks) & set(dist.get_process_group_ranks(shard_group(units))) - {rank})
    if rank not in ranks or shared:
        reason = f"shares rank(s) {shared} with the units' shard group" if shared else "does not hold it"
        raise ValueError(f"compcoll.fsdp.compress: replicas must be the group of this rank ({rank}) and the ranks "
                         f"that hold its shard in the other replicas; the one given, {ranks}, {reason}")


def reduce_op(op: Any, unit: FSDPModule | None = None) -> tuple[str, float]:
    """FSDP2's reduce-scatter op as compcoll's (op, factor): AVG, SUM or PREMUL_SUM(factor).

    PREMUL_SUM's factor is the op's own (``ReduceOp.factor``, torch 2.13 and newer). Before
    2.13 FSDP2 makes the op with ``_make_nccl_premul_sum(1 / f)``, whose factor Python cannot
    read, for a ``unit`` with a gradient divide factor f of its own: then it is ``1 / f``
    from the unit, the same float.

    Raises:
        ValueError: another op, or a PREMUL_SUM whose factor neither the op nor ``unit`` tells.
    """
    kind = getattr(op, "op", op)
    if kind == ReduceOp.AVG:
        return "avg", 1.0
    if kind == ReduceOp.SUM:
        return "sum", 1.0
    if kind == ReduceOp.PREMUL_SUM:
        factor = getattr(op, "factor", None)
        return "premul_sum", float(factor) if factor is not None else 1 / divide_factor(unit)
    raise ValueError(f"compcoll.fsdp: FSDP asked for a reduce-scatter with {kind}; AVG, SUM and PREMUL_SUM are "
                     f"supported")


def param_groups(unit: FSDPModule) -> list[Any]:
    """The unit's FSDP2 parameter groups (private state): ``_fsdp_param_groups`` from torch 2.12, before it the one
    ``_fsdp_param_group`` (None for a unit with no parameters of its own)."""
    state = unit._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    return [] if state._fsdp_param_group is None else [state._fsdp_param_group]


def local_shards(unit: FSDPModule) -> list[torch.Tensor]:
    """This rank's shards of the unit's parameters (a DTensor's local tensor), in ``parameters()`` order."""
    return [p.to_local() if isinstance(p, DTensor) else p for p in unit.parameters()]


def divide_factor(unit: FSDPModule | None) -> float:
    """The gradient divide factor ``unit`` was given (``set_gradient_divide_factor``, alike on its groups).

    Raises:
        ValueError: no unit, or it has no factor of its own.
    """
    factors = {group.gradient_divide_factor for group in param_groups(unit)} if unit is not None else set()
    if len(factors) != 1 or None in factors:
        raise ValueError(f"compcoll.fsdp: FSDP asked for a PREMUL_SUM reduce-scatter whose factor this torch "
                         f"({torch.__version__}) does not tell, and the unit's gradient divide factors are "
                         f"{sorted(map(str, factors))}")
    return float(factors.pop())


def divides_itself(unit: FSDPModule) -> bool:
    """Whether the unit has its own gradient divide factor (``set_gradient_divide_factor``), after which FSDP2 sums
    across replicas instead of averaging; read from the unit's parameter groups."""
    return any(group.gradient_divide_factor is not None for group in param_groups(unit))


def check_start_step(what: str, start_step: int) -> None:
    """``start_step`` (calls of a unit sent uncompressed first) is a non-negative integer."""
    if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
        raise ValueError(f"{what}: start_step must be a non-negative integer, got {start_step!r}")
