"""Rank-side bodies of the FSDP2 tests: the compressed reduce-scatter and cross-replica hook (Gloo; NCCL on a GPU)."""

from __future__ import annotations

import hashlib
import io
import pickle
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

import compcoll
import compcoll.checkpoint
import compcoll.fsdp
from compcoll.algorithms.plan import PLANS
from compcoll.fsdp.replicas import ReplicaState
from compcoll.fsdp.scatter import CompressedReduceScatter, ReduceScatterState
from compcoll.fsdp.units import divides_itself, fsdp_units, param_groups, reduce_op
from compcoll.kernels import reference
from compcoll.launcher import seeded
from tests.algorithms.agreement_workers import assert_rounds_on_device
from tests.algorithms.onebit_workers import _expect
from tests.warned import warned


def model(mesh=None, mp: MixedPrecisionPolicy | None = None, hidden: int = 29, device_type: str = "cpu",
          **options) -> torch.nn.Module:
    """Three linear layers of awkward sizes (``hidden`` wide in the middle), the first two their own FSDP units, the
    root the third, under ``fully_shard``'s ``options`` besides the mesh and precision. Without ``mesh``, a mesh of
    every rank on ``device_type``: ``fully_shard``'s own default takes the accelerator where there is one, which put
    these CPU tests' parameters on the GPU of the H200 machine (2026-12-04: every test without a mesh failed there,
    the one with a CPU mesh passed)."""
    mesh = mesh or init_device_mesh(device_type, (dist.get_world_size(),))
    with seeded(0):
        net = torch.nn.Sequential(torch.nn.Linear(13, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 7),
                                  torch.nn.ReLU(), torch.nn.Linear(7, 3))
    options = {"mesh": mesh, "mp_policy": mp or MixedPrecisionPolicy(), **options}
    fully_shard(net[0], **options)
    fully_shard(net[2], **options)
    return fully_shard(net, **options)


def batch(step: int, rank: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s fresh random batch of step ``step``."""
    gen = torch.Generator().manual_seed(7919 * step + 104729 * rank + 31 * micro)
    return torch.randn(5 + rank, 13, generator=gen) * (1 + rank), torch.randn(5 + rank, 3, generator=gen)


def loss_of(net: torch.nn.Module, step: int, rank: int, micro: int = 0) -> torch.Tensor:
    device = next(net.parameters()).device
    x, y = (t.to(device) for t in batch(step, rank, micro))
    return torch.nn.functional.mse_loss(net(x).float(), y)


def digest(net: torch.nn.Module) -> str:
    """A hash of this rank's parameter shards' bits."""
    hashed = hashlib.sha256()
    for p in net.parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        hashed.update(local.detach().float().cpu().numpy().tobytes())
    return hashed.hexdigest()


class Recording(CompressedReduceScatter):
    """A unit's compressed reduce-scatter that keeps what it was given and what it gave."""

    def __init__(self, state: ReduceScatterState, key: int, unit: torch.nn.Module, log: list) -> None:
        super().__init__(state, key, unit)
        self.log = log

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False) -> None:
        given = input_tensor.clone()
        super().__call__(output_tensor, input_tensor, group, op, async_op)
        self.log.append((self.key, given.float().cpu().numpy(), str(input_tensor.dtype), reduce_op(op, self.unit()),
                         output_tensor.clone().float().cpu().numpy()))


def _replay(log: list, logs: list[list], state: ReduceScatterState, rank: int, where: str) -> None:
    """Every recorded call equals the reference from all ranks' inputs, with error buffers carried across calls
    (rounded to the state's error dtype between calls), and the final error buffers equal the reference's."""
    n = len(logs)
    errors: dict[int, list[np.ndarray]] = {}
    for i, (key, _, dtype, (op, factor), out) in enumerate(log):
        inputs = [logs[r][i][1] for r in range(n)]
        assert all(logs[r][i][0] == key for r in range(n)), f"ranks called units out of order ({where})"
        ref = errors.setdefault(key, [np.zeros(state.errors[key].numel(), np.float32) for _ in range(n)])
        outs, ref, _ = reference.compressed_reduce_scatter(inputs, ref, state.block_size, state.scale, op, factor,
                                                           state.bits)
        errors[key] = [torch.from_numpy(e).to(state.error_dtype).float().numpy() for e in ref]
        want = torch.from_numpy(outs[rank]).to(getattr(torch, dtype.replace("torch.", ""))).float().numpy()
        assert np.array_equal(out, want), f"call {i} (unit {key}, {op}, {dtype}) differs from the reference ({where})"
    for key, ref in errors.items():
        mine = state.errors[key].float().cpu().numpy()
        assert np.array_equal(mine, ref[rank]), f"unit {key}'s error buffer ({where})"


CASES = {
    "float32, AVG": {"op": "avg", "bits": 1},
    "divide factor 5 (PREMUL_SUM)": {"op": "premul_sum", "factor": 5.0},
    "bfloat16 parameters and reduce, accumulation of 2": {"op": "avg", "mp": (torch.bfloat16, torch.bfloat16),
                                                          "micro": 2, "bits": 2},
    "float16 reduce (SUM, pre- and post-divided), float32 errors": {"op": "sum", "mp": (None, torch.float16),
                                                                    "error_dtype": torch.float32, "bits": 8},
    "float64 reduce (SUM), through float32": {"op": "sum", "mp": (None, torch.float64), "dtype": "torch.float64"},
}


def reduce_scatter(comm: compcoll.Communicator, steps: int, device_type: str = "cpu", on_device: bool = False
                   ) -> None:
    """For every case of CASES: each compressed reduce-scatter FSDP2 makes on ``device_type`` equals the numpy
    reference from all ranks' inputs, bit for bit, with the error buffers across steps; FSDP's ops come through as
    asked. ``on_device``: the state's communicator agrees on the device (``Communicator.agrees_on_device``, as over
    NCCL), and every plan's round runs there."""
    rank, n = comm.rank, comm.size
    for where, case in CASES.items():
        where = f"{where}, {case.get('bits', 3)} bits"
        mp = MixedPrecisionPolicy(*case["mp"]) if "mp" in case else None
        net = model(mp=mp, device_type=device_type)
        for unit in fsdp_units(net) if "factor" in case else ():
            unit.set_gradient_divide_factor(case["factor"])
        state = ReduceScatterState(error_dtype=case.get("error_dtype", torch.bfloat16), bits=case.get("bits", 3))
        if on_device:
            state.comm.agrees_on_device = True
        log: list = []
        for key, unit in enumerate(fsdp_units(net)):
            unit.set_custom_reduce_scatter(Recording(state, key, unit, log))
        opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
        micro = case.get("micro", 1)
        for step in range(steps):
            for m in range(micro):
                net.set_requires_gradient_sync(m == micro - 1)
                loss_of(net, step, rank, m).backward()
            opt.step()
            opt.zero_grad()
        assert len(log) == 3 * steps, f"{len(log)} reduce-scatters for {steps} steps of 3 units ({where})"
        ops = {entry[3][0] for entry in log}
        assert ops == {case["op"]}, f"FSDP's reduce-scatters came as {ops} ({where})"
        dtypes = {entry[2] for entry in log}
        assert "dtype" not in case or dtypes == {case["dtype"]}, f"FSDP's gradients came as {dtypes} ({where})"
        devices = {p.device.type for p in net.parameters()}
        assert devices == {device_type}, f"FSDP put the parameters on {devices}, not {device_type} ({where})"
        logs = [None] * n
        dist.all_gather_object(logs, log)
        _replay(log, logs, state, rank, where)
        if on_device:
            assert_rounds_on_device(list(state.comm.attached[PLANS].values()), f"({where})")


def _train(net: torch.nn.Module, opt: torch.optim.Optimizer, steps: range, rank: int, nan_at: int | None = None,
           nan_rank: int = 0) -> list[bool]:
    """Train ``steps``; at ``nan_at`` rank ``nan_rank``'s loss is NaN. Returns, per step, whether the grads were
    finite (the step is skipped where not, as a loss scaler would)."""
    finite = []
    for step in steps:
        loss = loss_of(net, step, rank)
        if step == nan_at and rank == nan_rank:
            loss = loss * float("nan")
        loss.backward()
        ok = all(torch.isfinite(p.grad.to_local()).all() for p in net.parameters())
        finite.append(bool(ok))
        if ok:
            opt.step()
        opt.zero_grad()
    return finite


def _saved(net: torch.nn.Module, opt: torch.optim.Optimizer, state: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save({"model": net.state_dict(), "optim": opt.state_dict(), "compcoll": state.state_dict()}, buffer)
    return buffer.getvalue()


def _resumed(saved: bytes, build, load: Callable[[Any], None] | None = None
             ) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    """Model, optimizer and state from what ``_saved`` wrote; the state by ``load(state)`` where given (from
    ``compcoll.checkpoint``'s files, from ``dcp.save``'s checkpoint)."""
    net, opt, state = build()
    loaded = torch.load(io.BytesIO(saved), weights_only=False)
    net.load_state_dict(loaded["model"])
    opt.load_state_dict(loaded["optim"])
    if load is None:
        state.load_state_dict(loaded["compcoll"])
    else:
        load(state)
    return net, opt, state


def _saved_apart(folder: str, state: Any) -> dict[str, Callable[[Any], None]]:
    """Save ``state`` with ``compcoll.checkpoint`` (``folder``) and ``dcp.save`` (``folder/dcp``, in the dictionary
    beside what a job saves there); how each loads it back."""
    compcoll.checkpoint.save(folder, state)
    dcp.save({"compcoll": state}, checkpoint_id=f"{folder}/dcp")
    return {"compcoll.checkpoint": lambda fresh: compcoll.checkpoint.load(folder, fresh),
            "dcp": lambda fresh: dcp.load({"compcoll": fresh}, checkpoint_id=f"{folder}/dcp")}


def training(comm: compcoll.Communicator, steps: int, folder: str) -> None:
    """``compress(model)`` with its defaults: a NaN on one rank makes every rank's gradients NaN with no error
    buffer changed; a resume from ``state_dict``, from ``compcoll.checkpoint``'s files and from ``dcp.save``'s
    checkpoint (in the shared ``folder``) ends with the uninterrupted run's bits; a pickled state keeps its buffers
    and counts; ``start_step`` sends FSDP's own reduce-scatters first."""
    rank, n = comm.rank, comm.size

    def build():
        net = model()
        return net, torch.optim.AdamW(net.parameters(), lr=1e-2), compcoll.fsdp.compress(net)

    net, opt, state = build()
    assert isinstance(state, ReduceScatterState) and state.error_dtype == torch.bfloat16
    half = steps // 2
    _train(net, opt, range(half), rank)
    saved, pickled, counted = _saved(net, opt, state), pickle.dumps(state), dict(state.steps)
    loads = _saved_apart(folder, state)
    before = {k: e.clone() for k, e in state.errors.items()}
    finite = _train(net, opt, range(half, half + 1), rank, nan_at=half, nan_rank=n - 1)
    assert finite == [False], f"rank {rank}: a NaN on rank {n - 1} did not reach every rank's gradients"
    assert all(torch.equal(before[k], state.errors[k]) for k in before), "a NaN step changed an error buffer"
    _train(net, opt, range(half + 1, steps), rank)
    whole = digest(net)

    for how, load in [("state_dict", None), *loads.items()]:
        net, opt, state = _resumed(saved, build, load)
        _train(net, opt, range(half + 1, steps), rank)
        assert digest(net) == whole, f"rank {rank}: the run resumed ({how}) differs from the uninterrupted run"
    restored = pickle.loads(pickled)
    assert restored.steps == counted, "the pickled state lost its step counts"
    assert all(torch.equal(restored.errors[k], before[k]) for k in before), "the pickled state lost its buffers"

    plain = model()
    _train(plain, torch.optim.AdamW(plain.parameters(), lr=1e-2), range(2), rank)
    net, opt, _ = build()
    late = compcoll.fsdp.compress(net, start_step=2)
    _train(net, opt, range(2), rank)
    assert digest(net) == digest(plain) and not late.errors, "start_step=2: the first steps were not FSDP's own"
    _train(net, opt, range(2, 3), rank)
    assert len(late.errors) == 3, "start_step=2: the third step did not compress"


def _replicas_match_the_reference(net: torch.nn.Module, opt: torch.optim.Optimizer, state: ReplicaState,
                                  group: dist.ProcessGroup, steps: int, rank: int,
                                  dtype: torch.dtype = torch.float32) -> None:
    """``steps`` steps of ``net`` under ``state``'s hook: each call's output equals the reference compressed allreduce
    of both replicas' shards (of ``dtype``; a float64 one through its float32 copy), with error buffers across steps;
    the replicas of a shard end with the same bits."""
    log: list = []
    for key, unit in enumerate(fsdp_units(net)):
        def recorded(shard: torch.Tensor, key: int = key) -> None:
            given = shard.clone().numpy()
            state.all_reduce(key, shard)
            log.append((key, given, shard.clone().numpy()))
        unit.set_all_reduce_hook(recorded)
    _train(net, opt, range(steps), rank)
    assert {entry[1].dtype for entry in log} == {torch.empty(0, dtype=dtype).numpy().dtype}, "shards' dtype"
    logs = [None, None]
    dist.all_gather_object(logs, log, group=group)
    mine = dist.get_rank(group)
    errors: dict[int, tuple[list, list]] = {}
    for i, (key, _, out) in enumerate(log):
        inputs = [logs[r][i][1].astype(np.float32) for r in range(2)]
        numel = inputs[0].size
        full = compcoll.padded_numel(numel, 2)
        we, se = errors.get(key, ([np.zeros(full, np.float32)] * 2, [np.zeros(full // 2, np.float32)] * 2))
        outs, we, se, _ = reference.compressed_allreduce(inputs, we, se, "gather_scatter", "l2", block_size=64,
                                                         bits=state.allreduce.bits)
        errors[key] = (we, se)
        assert np.array_equal(out, outs[mine].astype(out.dtype)), f"hook call {i} (unit {key}, {dtype}) differs"
    shards = [None, None]
    dist.all_gather_object(shards, digest(net), group=group)
    assert shards[0] == shards[1], f"the replicas of a shard differ ({dtype})"


def replicas(comm: compcoll.Communicator, steps: int, folder: str) -> None:
    """HSDP by hand on 2 x 2 ranks: FSDP inside each pair, ``compress(model, replicas=...)`` across them. Each
    hook's output equals the reference compressed allreduce of both replicas' shards, with error buffers across
    steps; replicas of a shard hold the same bits; resume is exact, from ``state_dict``, from
    ``compcoll.checkpoint``'s files in the shared ``folder`` (one a process: both replica groups have a rank 0,
    whose files had one name, so a shard resumed with the other shard's error buffers, with nothing said) and from
    ``dcp.save``'s checkpoint (each process's buffers under its rank in the job); the
    state of the process of the same replica rank in the other group warns that its buffers restart at zero; a NaN
    on one rank reaches every rank; ``start_step`` sends plain allreduces first."""
    rank = comm.rank
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    group = mesh.get_group("replicate")

    def build():
        net = model(mesh=mesh["shard"])
        return net, torch.optim.AdamW(net.parameters(), lr=1e-2), compcoll.fsdp.compress(net, replicas=group)

    net, opt, state = build()
    assert isinstance(state, ReplicaState)
    _replicas_match_the_reference(net, opt, state, group, steps, rank)
    net = model(mesh=mesh["shard"], mp=MixedPrecisionPolicy(None, torch.float64))
    _replicas_match_the_reference(net, torch.optim.AdamW(net.parameters(), lr=1e-2),
                                  compcoll.fsdp.compress(net, replicas=group), group, 2, rank, torch.float64)
    shards = [None, None]

    net, opt, state = build()
    _train(net, opt, range(2), rank)
    saved = _saved(net, opt, state)
    loads = _saved_apart(folder, state)
    states = [None] * 4
    dist.all_gather_object(states, state.state_dict())
    finite = _train(net, opt, range(2, 3), rank, nan_at=2, nan_rank=3)
    assert finite == [False], f"rank {rank}: a NaN on rank 3 did not reach every rank"
    _train(net, opt, range(3, steps), rank)
    whole = digest(net)
    for how, load in [("state_dict", None), *loads.items()]:
        net, opt, state = _resumed(saved, build, load)
        _train(net, opt, range(3, steps), rank)
        assert digest(net) == whole, f"the HSDP run resumed ({how}) differs from the uninterrupted one"
    said = warned(state.load_state_dict, states[rank ^ 1])
    assert len(said) == 1 and said[0].startswith(
        f"ReplicaState: loaded the state of rank {rank // 2} of 2 (process {rank ^ 1} of 4) on rank {rank // 2} of 2 "
        f"(process {rank} of 4): counters resume exactly, but its error buffers restart at zero"), said

    net = model(mesh=mesh["shard"])
    late = compcoll.fsdp.compress(net, replicas=group, start_step=2)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    _train(net, opt, range(2), rank)
    assert not late.allreduce.plans, "start_step=2: a first step was compressed"
    _train(net, opt, range(2, 3), rank)
    assert len(late.allreduce.plans) == 3, "start_step=2: the third step did not compress"
    dist.all_gather_object(shards, digest(net), group=group)
    assert shards[0] == shards[1], "the replicas of a shard differ after plain steps"


def replicated(comm: compcoll.Communicator, steps: int) -> None:
    """FSDP2's ``replicate`` (data parallelism through FSDP2, which all-reduces every gradient itself, in float):
    ``compress(model)`` and ``compress(model, replicas=...)`` raise one ValueError that says so and gives the form
    that compresses (before: a warning about native HSDP, then "the units shard over 0 different groups of ranks").
    That form, ``fully_shard`` over a mesh of one rank and ``replicas`` the mesh's replicate group, averages each
    gradient across the ranks as the reference does, and the replicas end alike."""
    from torch.distributed._composable.replicate_with_fsdp import replicate

    with seeded(0):
        net = torch.nn.Sequential(torch.nn.Linear(13, 29), torch.nn.ReLU(), torch.nn.Linear(29, 3))
    replicate(net[0])
    replicate(net)
    for replicas in (None, dist.group.WORLD):
        said = warned(lambda: _expect(ValueError, "the model is replicated by FSDP2's replicate()",
                                      compcoll.fsdp.compress, net, replicas=replicas))
        assert not said, said
    mesh = init_device_mesh("cpu", (comm.size, 1), mesh_dim_names=("replicate", "shard"))
    group = mesh.get_group("replicate")
    net = model(mesh=mesh["shard"])
    state = compcoll.fsdp.compress(net, replicas=group)
    _replicas_match_the_reference(net, torch.optim.AdamW(net.parameters(), lr=1e-2), state, group, steps, comm.rank)


def optimizers_refuse_sharded_parameters(comm: compcoll.Communicator) -> None:
    """compcoll's optimizers over FSDP2's DTensor parameters: a ValueError naming DTensor and the way to go, on every
    rank, at construction (torch's own error came at the first step, naming neither); and at the first step where
    the model was sharded after the optimizer was built and its parameter groups switched to the shards, as
    Accelerate's ``prepare`` does under FSDP2 (``fsdp2_switch_optimizer_parameters``)."""
    from compcoll.optim import Birder, OneBitAdam

    for cls in (OneBitAdam, Birder):
        try:
            cls(model().parameters(), lr=1e-2, comm=comm)
        except ValueError as exc:
            assert "is a DTensor" in str(exc) and "compcoll.fsdp.compress" in str(exc), exc
        else:
            raise AssertionError(f"{cls.__name__} took sharded parameters")
    with seeded(0):
        net = torch.nn.Sequential(torch.nn.Linear(13, 29), torch.nn.ReLU(), torch.nn.Linear(29, 3))
    opt = OneBitAdam(net.parameters(), lr=1e-2, comm=comm)
    names = {p: name for name, p in net.named_parameters()}
    fully_shard(net)
    shards = dict(net.named_parameters())
    for group in opt.param_groups:
        group["params"] = [shards[names[p]] for p in group["params"]]
    loss_of(net, 0, comm.rank).backward()
    try:
        opt.step()
    except ValueError as exc:
        assert "they are DTensors now" in str(exc) and "compcoll.fsdp.compress" in str(exc), exc
    else:
        raise AssertionError("OneBitAdam stepped parameters switched to FSDP2's shards")


def states_refuse_different_start_steps(comm: compcoll.Communicator) -> None:
    """``ReduceScatterState`` and ``ReplicaState`` whose ``start_step`` differs on one rank: RankMismatchError naming
    it on every rank, at construction."""
    from compcoll.fsdp.replicas import ReplicaState

    step = 1 if dist.get_rank() == dist.get_world_size() - 1 else 0
    for cls in (ReduceScatterState, ReplicaState):
        try:
            cls(start_step=step)
        except compcoll.RankMismatchError as exc:
            assert "start_step" in str(exc), exc
        else:
            raise AssertionError(f"{cls.__name__}: no RankMismatchError")


def compress_twice_warns(comm: compcoll.Communicator) -> None:
    """A second ``compress`` of the same model: one warning that its units take the new state (the first one then saw
    no more gradients, and a checkpoint of it was stale, with nothing said); the new state compresses, the first
    stays as it was; a model compressed once: no warning."""
    import warnings

    rank = dist.get_rank()
    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = compcoll.fsdp.compress(net)
        assert not [w for w in caught if "compressed by an earlier call" in str(w.message)]
        second = compcoll.fsdp.compress(net)
    said = [str(w.message) for w in caught if "compressed by an earlier call" in str(w.message)]
    assert len(said) == 1 and "3 of the model's 3 FSDP units" in said[0], said
    _train(net, opt, range(1), rank)
    assert second.errors and not first.errors, (len(second.errors), len(first.errors))


def another_ranks_state_restarts_errors(comm: compcoll.Communicator) -> None:
    """Every rank loads the next rank's ``ReduceScatterState`` (its error buffers are that rank's shards): one
    warning, the step counts resume, the error buffers restart at zero, and training goes on compressed."""
    rank, n = dist.get_rank(), dist.get_world_size()
    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    state = compcoll.fsdp.compress(net)
    _train(net, opt, range(2), rank)
    states = [None] * n
    dist.all_gather_object(states, state.state_dict())
    other = states[(rank + 1) % n]
    said = warned(state.load_state_dict, other)
    assert len(said) == 1 and said[0].startswith(
        f"ReduceScatterState: loaded the state of rank {(rank + 1) % n} of {n} on rank {rank} of {n}"), said
    assert state.steps == dict(other["steps"]) and not state.errors
    _train(net, opt, range(2, 3), rank)
    assert len(state.errors) == 3, "the step after the load did not compress"


def compiled_model_compresses(comm: compcoll.Communicator) -> None:
    """``torch.compile`` over a compressed FSDP2 model (Dynamo leaves FSDP's hooks to Python): every unit's
    reduce-scatter goes compressed, and the parameters end with the eager run's bits."""
    rank = dist.get_rank()
    digests = []
    for compiled in (False, True):
        net = model()
        opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
        state = compcoll.fsdp.compress(net)
        run = torch.compile(net, backend="eager") if compiled else net
        for step in range(3):
            loss_of(run, step, rank).backward()
            opt.step()
            opt.zero_grad()
        assert len(state.errors) == 3 and all(count == 3 for count in state.steps.values()), state.steps
        digests.append(digest(net))
    assert digests[0] == digests[1], f"rank {rank}: the compiled model's parameters differ from the eager run's"


def reduce_ops_as_each_torch_gives_them(comm: compcoll.Communicator) -> None:
    """FSDP2's reduce-scatter ops read as compcoll's, with the factor of a PREMUL_SUM from the op (torch 2.13) or,
    where the op does not tell it (an op as torch 2.9-2.12 passes it, ``op`` alone), from the unit's divide factor;
    a unit with none refuses such an op, naming its factors."""
    net = model()
    units = fsdp_units(net)
    plain = units[0]
    assert param_groups(plain) and not divides_itself(plain), "a unit's parameter groups or its factor misread"
    for unit in units[1:]:
        unit.set_gradient_divide_factor(5.0)
    unit = units[1]
    assert divides_itself(unit) and len(param_groups(unit)) >= 1
    made = dist._make_nccl_premul_sum(1 / 5.0)  # as FSDP2 makes it for a unit divided by 5
    assert reduce_op(made, unit) == ("premul_sum", 1 / 5.0)
    untold = SimpleNamespace(op=dist.ReduceOp.PREMUL_SUM)  # what reduce_op reads of an op that hides its factor
    assert reduce_op(untold, unit) == ("premul_sum", 1 / 5.0), "the factor was not read from the unit"
    assert reduce_op(dist.ReduceOp.AVG, plain) == ("avg", 1.0) and reduce_op(dist.ReduceOp.SUM) == ("sum", 1.0)
    for without in (plain, None):
        try:
            reduce_op(untold, without)
        except ValueError as exc:
            assert "does not tell" in str(exc) and "divide factors are" in str(exc), str(exc)
        else:
            raise AssertionError("a PREMUL_SUM with no factor to read was taken")


def _recorded_run(net: torch.nn.Module, state: ReduceScatterState, steps: int, seed: int) -> list:
    """Train ``net`` ``steps`` steps on batches drawn from ``seed``, each unit's reduce-scatter recorded."""
    log: list = []
    for key, unit in enumerate(fsdp_units(net)):
        unit.set_custom_reduce_scatter(Recording(state, key, unit, log))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    for step in range(steps):
        loss_of(net, step, seed).backward()
        opt.step()
        opt.zero_grad()
    return log


def fsdp_options(comm: compcoll.Communicator, steps: int) -> None:
    """Under the ``fully_shard`` options users set, ``reshard_after_forward=False`` (ZeRO-2's layout), a
    ``shard_placement_fn`` sharding a weight along its columns (FSDP2 lays its rows out for the reduce-scatter
    itself) and CPU offload, every compressed reduce-scatter equals the reference from all ranks' inputs, bit for
    bit, with the error buffers across steps."""
    n = comm.size
    columns = {"shard_placement_fn": lambda p: Shard(1) if p.ndim == 2 and p.shape[1] % n == 0 else None}
    for where, options in {"reshard_after_forward=False": {"reshard_after_forward": False},
                           "shard_placement_fn, Shard(1)": columns,
                           "CPUOffloadPolicy": {"offload_policy": CPUOffloadPolicy(pin_memory=False)}}.items():
        net = model(hidden=24, **options)  # its second weight (7 x 24) shards along its columns on 2, 3 or 4 ranks
        assert "shard_placement_fn" not in options or net[2].weight.placements == (Shard(1),), "not Shard(1)"
        state = ReduceScatterState()
        log = _recorded_run(net, state, steps, comm.rank)
        assert len(log) == 3 * steps, f"{len(log)} compressed reduce-scatters for {steps} steps of 3 units ({where})"
        logs = [None] * n
        dist.all_gather_object(logs, log)
        _replay(log, logs, state, comm.rank, where)


def meshes(comm: compcoll.Communicator, steps: int) -> None:
    """On 2 x 2 ranks ``compress`` finds the group FSDP2 reduce-scatters over, whatever else the mesh holds.

    1. FSDP beside tensor parallelism (mesh (dp, tp), whose last dimension, the parameters' DTensor mesh's, is tp):
       the state is on the dp group, and each reduce-scatter equals the reference from the dp group's inputs.
       Before 2026-12-03 it was on the tp group, of the same size, and reduced every gradient across the wrong
       ranks, with nothing said.
    2. Native HSDP (mesh (replicate, shard)): ``compress(model)`` warns that FSDP2's all-reduce across the replicas
       stays its own; the state is on the shard group, its calls equal the reference, the replicas end alike.
       ``compress(model, replicas=...)``, whose hook FSDP2 calls after its own all-reduce (before: the bytes of
       both, with nothing said), raises ValueError.
    3. HSDP by hand takes ``replicas=mesh["replicate"]`` (a 1-D DeviceMesh); a ``replicas`` group holding other
       ranks of the shard group (the whole job, or the shard group itself: it averaged different parts of the
       parameters, with nothing said): ValueError; one that pairs ranks holding different shards ([0, 3] and
       [1, 2]; as silent before): RankMismatchError at its first call.
    4. A state on a group of the right size and other ranks than FSDP's: its first reduce-scatter raises
       ValueError naming both.
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp_mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp = tp_mesh.get_group("dp")
    with seeded(0):
        net = torch.nn.Sequential(torch.nn.Linear(13, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    parallelize_module(net, tp_mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(net, mesh=tp_mesh["dp"])
    state = compcoll.fsdp.compress(net)
    log = _recorded_run(net, state, steps, tp_mesh.get_local_rank("dp"))
    logs = [None, None]
    dist.all_gather_object(logs, log, group=dp)
    _replay(log, logs, state, dist.get_rank(dp), "FSDP beside tensor parallelism")

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    shard, replicas = mesh.get_group("shard"), mesh.get_group("replicate")
    net = model(mesh=mesh)
    states: list = []
    said = warned(lambda: states.append(compcoll.fsdp.compress(net)))
    assert len(said) == 1 and said[0].startswith("compcoll.fsdp.compress: the model is sharded by native HSDP"), said
    log = _recorded_run(net, states[0], steps, mesh.get_local_rank("shard"))
    logs = [None, None]
    dist.all_gather_object(logs, log, group=shard)
    _replay(log, logs, states[0], dist.get_rank(shard), "native HSDP")
    digests = [None, None]
    dist.all_gather_object(digests, digest(net), group=replicas)
    assert digests[0] == digests[1], "native HSDP: the replicas of a shard differ"
    _expect(ValueError, "sharded by native HSDP", compcoll.fsdp.compress, model(mesh=mesh), replicas=replicas)

    by_hand = model(mesh=mesh["shard"])
    assert isinstance(compcoll.fsdp.compress(model(mesh=mesh["shard"]), replicas=mesh["replicate"]), ReplicaState)
    for wrong in (dist.group.WORLD, shard):
        _expect(ValueError, "shares rank(s)", compcoll.fsdp.compress, by_hand, replicas=wrong)
    crossed = [dist.new_group([0, 3]), dist.new_group([1, 2])]
    compcoll.fsdp.compress(by_hand, replicas=crossed[dist.get_rank() in (1, 2)])
    _expect(compcoll.RankMismatchError, "hold different parameters", lambda: loss_of(by_hand, 0, 0).backward())

    state = ReduceScatterState(tp_mesh.get_group("tp"))
    net = model(mesh=tp_mesh["dp"])
    for key, unit in enumerate(fsdp_units(net)):
        unit.set_custom_reduce_scatter(CompressedReduceScatter(state, key, unit))
    tp_ranks = dist.get_process_group_ranks(tp_mesh.get_group("tp"))
    _expect(ValueError, f"FSDP reduce-scatters over ranks {dist.get_process_group_ranks(dp)}, the state was built "
            f"for ranks {tp_ranks}", lambda: loss_of(net, 0, 0).backward())
