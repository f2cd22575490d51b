"""Rank-side bodies of the DDP hook tests: real DDP over Gloo, each bucket's average against the numpy reference."""

from __future__ import annotations

import gc
import io
import pickle
import warnings

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.nn.parallel import DistributedDataParallel as DDP

import compcoll
import compcoll.checkpoint
import compcoll.ddp
from compcoll.algorithms.plan import PLANS
from compcoll.comm.topology import TOPOLOGIES
from compcoll.kernels import reference
from compcoll.launcher import seeded
from compcoll.optim.dcp import ElasticLoadPlanner
from tests.algorithms.agreement_workers import assert_rounds_on_device
from tests.shared import world_once
from tests.warned import warned

BUCKET_MB = 0.5
"""Small buckets, so that the 1.6 MiB model spans several (DDP's first bucket holds up to 1 MiB)."""


SMALL_BUCKET_MB = 0.004
"""``make_model(small=True)``'s buckets: two, of 2,298 and 2,201 elements."""
SMALL_COMPRESS_NUMEL = 2250
"""``onebit_matches_reference(small=True)``'s ``min_compress_numel``: its larger bucket compresses, its smaller not."""


def make_model(small: bool = False) -> torch.nn.Module:
    """423,107 parameters in 6 tensors (``small``: 4,499, for numba's simulator, whose every CUDA thread is a Python
    one); lengths that are multiples of nothing in particular."""
    inputs, hidden, narrow = (30, 71, 29) if small else (300, 701, 299)
    with seeded(0):
        return torch.nn.Sequential(torch.nn.Linear(inputs, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, narrow),
                                   torch.nn.Tanh(), torch.nn.Linear(narrow, 7))


ODD_COMPRESS_NUMEL = 20000
"""``OddModel``'s ``min_compress_numel``: its float64 and complex64 weights and sparse table reach it, the rest not."""


class OddModel(torch.nn.Module):
    """Parameters a DDP hook meets beyond float32: a float64 layer (a float64 bucket), a complex64 weight (DDP views it
    as float32 pairs) and an embedding with sparse gradients (a sparse bucket of its own), beside float32 ones."""

    def __init__(self) -> None:
        super().__init__()
        with seeded(0):
            self.wide = torch.nn.Linear(300, 71, dtype=torch.float64)
            self.rotation = torch.nn.Module()  # a module's own parameters come first: ``step`` reads the first's width
            self.rotation.weight = torch.nn.Parameter(torch.randn(71, 293, dtype=torch.complex64) / 9)
            self.out = torch.nn.Linear(293, 7)
            self.table = torch.nn.Embedding(3001, 7, sparse=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = (x[:, 0].abs() * 1000).long() % self.table.num_embeddings
        hidden = torch.tanh(self.wide(x.double())).to(torch.complex64) @ self.rotation.weight
        return self.out(hidden.abs()) + self.table(rows)


def batch(rank: int, step: int, inputs: int = 300) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's fresh random batch of a step (every rank's differs), of ``inputs`` features."""
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, inputs, generator=gen), torch.randn(16, 7, generator=gen)


def recording(hook, records: dict[int, tuple]):
    """Wrap a hook: keep each bucket's input, whether it went compressed, its output and (Birder) the call counter
    it ran with, by bucket index (a sparse bucket's as dense tensors)."""
    def wrapped(state, bucket):
        index, before = bucket.index(), bucket.buffer().to_dense().clone()
        compressed, calls = state.schedule.compress(bucket), getattr(state, "calls", None)

        def keep(fut: torch.futures.Future) -> torch.Tensor:
            records[index] = (compressed, before, fut.value().to_dense().clone(), calls)
            return fut.value()

        return hook(state, bucket).then(keep)
    return wrapped


def step(model: DDP, opt: torch.optim.Optimizer, rank: int, i: int, poison: bool = False) -> None:
    """One training step on this rank's batch, on the model's device (``poison``: the loss times NaN)."""
    first = next(model.parameters())
    x, y = (t.to(first.device) for t in batch(rank, i, first.shape[1]))
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    (loss * float("nan") if poison else loss).backward()
    opt.step()


def gather(obj) -> list:
    """Every rank's ``obj`` (over the default group, outside the hooks' own group)."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def assert_replicas_equal(model: torch.nn.Module) -> None:
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    table = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(table, flat)
    assert all(torch.equal(flat, other) for other in table), "replicas differ"


def onebit_matches_reference(comm: compcoll.Communicator, steps: int, protocol: str, scale: str,
                             ranks_per_node: int | str = "auto", nodes_of: int = 1, block_size: int | None = None,
                             device: str = "cpu", small: bool = False, odd: bool = False,
                             composable: bool = False, on_device: bool = False) -> None:
    """Every compressed bucket equals the reference's output from all ranks' inputs (flat, or hierarchical with
    ``ranks_per_node``, which "auto" must resolve to ``nodes_of``), with error buffers kept per bucket across
    steps; plain buckets (first iterations, small ones) are the float mean; gradients and replicas are the same
    bits on every rank; the final error buffers equal the reference's. ``device="cuda"``: the model on this
    rank's GPU (NCCL). ``small``: ``make_model(small=True)`` in buckets of ``SMALL_BUCKET_MB``. ``odd``:
    ``OddModel``, whose float64 bucket the reference takes as float32 and whose sparse bucket is the float mean.
    ``composable``: DDP through torch's composable ``replicate`` (torch.distributed._composable.replicate, which
    registers the hook on the DDP it builds at the first forward) instead of the ``DistributedDataParallel``
    wrapper. ``on_device``: the state's communicators agree on the device (``agree_on_device``: NCCL's rounds, on
    Gloo's host tensors here), set once it is bound, before the first bucket."""
    n, rank = comm.size, comm.rank
    on = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device(device)
    net = OddModel() if odd else make_model(small)
    options = {"bucket_cap_mb": SMALL_BUCKET_MB if small else BUCKET_MB,
               "device_ids": [on.index] if on.type == "cuda" else None}
    if composable:
        from torch.distributed._composable.replicate import replicate

        model = replicate(net.to(on), **options)
    else:
        model = DDP(net.to(on), **options)
    least = ODD_COMPRESS_NUMEL if odd else SMALL_COMPRESS_NUMEL if small else 211500
    state = compcoll.ddp.OneBitState(min_compress_numel=least, protocol=protocol, scale=scale,
                                     ranks_per_node=ranks_per_node, block_size=block_size)
    if on_device:
        state.bind()
        agree_on_device(state.comm)
    k = state.ranks_per_node
    assert k == (nodes_of if ranks_per_node == "auto" else ranks_per_node), f"ranks per node {k}"
    records: dict[int, tuple] = {}
    model.register_comm_hook(state, recording(compcoll.ddp.onebit_hook, records))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref: dict[int, tuple[list, list]] = {}
    kinds = set()
    for i in range(steps):
        records.clear()
        step(model, opt, rank, i)
        everyone = gather({k: (c, b.cpu().numpy()) for k, (c, b, _, _) in records.items()})
        for index, (compressed, before, out, _) in sorted(records.items()):
            xs, out = [r[index][1] for r in everyone], out.cpu()
            kinds.add((i >= 2, compressed))
            if not compressed:
                assert torch.allclose(out, torch.from_numpy(np.mean(xs, axis=0)), atol=1e-6), f"plain bucket {index}"
                continue
            xs = [x.astype(np.float32) for x in xs]
            full = compcoll.padded_numel(before.numel(), n)
            wn, sn = (full, full // n) if k == 1 else compcoll.hierarchical_error_numels(before.numel(), n, k)
            we, se = ref.setdefault(index, ([np.zeros(wn, np.float32)] * n, [np.zeros(sn, np.float32)] * n))
            if k == 1:
                outs, we, se, _ = world_once(comm, reference.compressed_allreduce, xs, we, se, protocol, scale,
                                             block_size)
            else:
                outs, we, se, _ = world_once(comm, reference.hierarchical_compressed_allreduce, xs, we, se, k, scale,
                                             block_size)
            ref[index] = (we, se)
            assert torch.equal(out, torch.from_numpy(outs[rank]).to(out.dtype)), f"bucket {index} step {i} differs"
        assert_replicas_equal(model)
    assert kinds == {(False, False), (True, False), (True, True)}, f"not every path ran: {kinds}"
    if on_device:
        assert_rounds_on_device([*state.allreduce.plans.values(), *state.comm.attached.get(PLANS, {}).values()])
    if odd:
        assert {r[1].dtype for r in records.values() if r[0]} == {torch.float32, torch.float64}, records
    for index, (we, se) in ref.items():
        worker, server = state.allreduce.plans[index].error_feedback.buffers() if k == 1 else state.node_buffers[index]
        assert np.array_equal(worker.cpu().numpy(), we[rank]), f"worker error of bucket {index}"
        if protocol == "gather_scatter" or k > 1:
            assert np.array_equal(server.cpu().numpy(), se[rank]), f"server error of bucket {index}"


def _train(model: DDP, opt: torch.optim.Optimizer, rank: int, steps: range) -> torch.Tensor:
    for i in steps:
        step(model, opt, rank, i)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


HOOKS = {compcoll.ddp.OneBitState: compcoll.ddp.onebit_hook, compcoll.ddp.BirderState: compcoll.ddp.birder_hook}
"""Each hook state's hook."""


def built_before_init() -> tuple:
    """A default ``OneBitState`` and ``BirderState`` built before ``init_process_group`` (as Lightning's
    ``DDPStrategy(ddp_comm_state=...)`` builds them), and each again as Lightning's spawning launcher hands it to a
    new process: pickled and unpickled, still before ``init_process_group`` (a ``OneBitState`` raised "torch.distributed
    is not initialized" at its pickling before 2026-12-03)."""
    early = (compcoll.ddp.OneBitState(), compcoll.ddp.BirderState())
    return early + tuple(pickle.loads(pickle.dumps(state)) for state in early)


def states_built_before_init(comm: compcoll.Communicator, early: tuple, steps: int) -> None:
    """``early``: hook states built before ``init_process_group`` (``built_before_init``). None holds a group until
    the hook's first bucket; then each trains ``make_model`` with the bits of the same state built after it, replicas
    identical."""
    rank = comm.rank
    for before in early:
        assert before.comm is None, f"{type(before).__name__} took a group before init_process_group"
        hook, trained = HOOKS[type(before)], []
        for state in (before, type(before)()):
            model = DDP(make_model(), bucket_cap_mb=BUCKET_MB)
            model.register_comm_hook(state, hook)
            trained.append(_train(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), rank,
                                  range(steps)))
            assert_replicas_equal(model)
        compressed = before.allreduce.plans if hook is compcoll.ddp.onebit_hook else before.calls
        assert compressed, f"{type(before).__name__} built before init compressed nothing"
        assert torch.equal(*trained), f"{type(before).__name__} built before init trained other bits"


def onebit_pickled_for_a_new_process(comm: compcoll.Communicator, directory: str) -> None:
    """Train 5 steps under a ``OneBitState``, ``torch.save`` the model, the optimizer and the state (a file per rank,
    in ``directory``), then 4 more steps: their parameters (saved beside) are what a resumed run must end with."""
    rank = comm.rank
    model = DDP(make_model(), bucket_cap_mb=BUCKET_MB)
    state = compcoll.ddp.OneBitState(min_compress_numel=211500)
    model.register_comm_hook(state, compcoll.ddp.onebit_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    _train(model, opt, rank, range(5))
    torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "hook": state},
               f"{directory}/rank{rank}.pt")
    torch.save(_train(model, opt, rank, range(5, 9)), f"{directory}/expected{rank}.pt")


def onebit_loaded_before_init(comm: compcoll.Communicator, checkpoint: dict, directory: str) -> None:
    """``checkpoint``: this rank's file of ``onebit_pickled_for_a_new_process``, loaded by ``torch.load`` before
    ``init_process_group``. Its ``OneBitState`` holds no group and keeps the saved state; at the hook's first bucket
    it takes the default group and loads it, and the run ends with the bits of the run that went on."""
    state = checkpoint["hook"]
    assert state.comm is None, "a OneBitState unpickled before init_process_group holds a group"
    got = _resumed(checkpoint, state, comm.rank)
    assert state.schedule.iteration == 9 and state.allreduce.plans, "the saved state was not loaded"
    assert torch.equal(got, torch.load(f"{directory}/expected{comm.rank}.pt")), "resumed run differs"


def _resumed(checkpoint: dict, state: compcoll.ddp.OneBitState, rank: int) -> torch.Tensor:
    """A fresh DDP of ``make_model`` with the checkpoint's model and SGD state and the hook ``state``, trained on
    steps 5-8 with every warning an error: its parameters."""
    module = make_model()
    module.load_state_dict(checkpoint["model"])
    model = DDP(module, bucket_cap_mb=BUCKET_MB)
    model.register_comm_hook(state, compcoll.ddp.onebit_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt.load_state_dict(checkpoint["opt"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return _train(model, opt, rank, range(5, 9))


def onebit_resumes_exactly(comm: compcoll.Communicator, directory: str, ranks_per_node: int = 1) -> None:
    """Checkpoint model, optimizer and hook state after 5 steps; a fresh DDP resumed from it (state pickled whole,
    through state_dict, through compcoll.checkpoint's per-process files, and in ``torch.distributed.checkpoint``'s
    dictionary, which keeps one copy of what every rank saves under one key: each process's buffers under its own)
    ends the next 4 steps with the bits of the run that went on. The files go to ``directory``."""
    rank = comm.rank
    model = DDP(make_model(), bucket_cap_mb=BUCKET_MB)
    state = compcoll.ddp.OneBitState(min_compress_numel=211500, ranks_per_node=ranks_per_node)
    model.register_comm_hook(state, compcoll.ddp.onebit_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    _train(model, opt, rank, range(5))
    saved = io.BytesIO()
    torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "hook": state}, saved)
    hook_dict = state.state_dict()
    compcoll.checkpoint.save(directory, state)
    dcp.save({"hook": state}, checkpoint_id=f"{directory}/dcp")
    expected = _train(model, opt, rank, range(5, 9))

    for how in ("pickled", "state_dict", "compcoll.checkpoint", "dcp"):
        saved.seek(0)
        checkpoint = torch.load(saved, weights_only=False)
        if how == "pickled":
            hook_state = checkpoint["hook"]
        else:
            hook_state = compcoll.ddp.OneBitState(min_compress_numel=211500, ranks_per_node=ranks_per_node)
            if how == "state_dict":
                hook_state.load_state_dict(hook_dict)
            elif how == "dcp":
                dcp.load({"hook": hook_state}, checkpoint_id=f"{directory}/dcp")
            else:
                compcoll.checkpoint.load(directory, hook_state)
        got = _resumed(checkpoint, hook_state, rank)
        assert torch.equal(got, expected), f"resumed ({how}) run differs"


def onebit_saves_every_rank(comm: compcoll.Communicator, directory: str) -> None:
    """5 steps under the hook, then rank 0's model and every rank's hook state (``compcoll.checkpoint.save``, and
    ``dcp.save`` in ``directory/dcp``)."""
    model = DDP(make_model(), bucket_cap_mb=BUCKET_MB)
    state = compcoll.ddp.OneBitState(min_compress_numel=211500)
    model.register_comm_hook(state, compcoll.ddp.onebit_hook)
    _train(model, torch.optim.SGD(model.parameters(), lr=0.05), comm.rank, range(5))
    if comm.rank == 0:
        torch.save(model.module.state_dict(), f"{directory}/model.pt")
    compcoll.checkpoint.save(directory, state)
    dcp.save({"hook": state}, checkpoint_id=f"{directory}/dcp")


def onebit_resumes_on_another_world_size(comm: compcoll.Communicator, directory: str, saved_size: int) -> None:
    """An elastic restart of the hook: a world of another size loads the files ``onebit_saves_every_rank`` wrote.
    One warning a rank (its error buffers restart at zero); the schedule resumes at iteration 5; the buckets
    are compressed from the first step, with no other warning, and the replicas stay identical. From its
    ``dcp.save``: ``ElasticLoadPlanner`` loads the same (the default planner raises on a larger world, on every
    rank)."""
    module = make_model()
    module.load_state_dict(torch.load(f"{directory}/model.pt", weights_only=True))
    model = DDP(module, bucket_cap_mb=BUCKET_MB)
    state = compcoll.ddp.OneBitState(min_compress_numel=211500)
    said = warned(compcoll.checkpoint.load, directory, state)
    expected = (f"OneBitState: loaded the state of rank {comm.rank % saved_size} of {saved_size} on rank {comm.rank} "
                f"of {comm.size}: counters resume exactly, but its error buffers restart at zero")
    assert len(said) == 1 and said[0].startswith(expected) and "needs the world size that saved it" in said[0], said
    assert state.schedule.iteration == 5 and not state.allreduce.plans and state.layouts
    from_dcp = compcoll.ddp.OneBitState(min_compress_numel=211500)
    if comm.size > saved_size:
        try:
            dcp.load({"hook": from_dcp}, checkpoint_id=f"{directory}/dcp")
        except CheckpointException as exc:
            assert "Missing key in checkpoint state_dict: hook." in str(exc) and ".rank" in str(exc), exc
        else:
            raise AssertionError("the default planner loaded a smaller world's hook state")
    said = warned(dcp.load, {"hook": from_dcp}, checkpoint_id=f"{directory}/dcp", planner=ElasticLoadPlanner())
    assert len(said) == 1 and said[0].startswith(expected), said
    assert (from_dcp.schedule.iteration, from_dcp.layouts, from_dcp.allreduce.plans) == (5, state.layouts, {})
    model.register_comm_hook(state, compcoll.ddp.onebit_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(5, 9):
            step(model, opt, comm.rank, i)
            assert_replicas_equal(model)
    assert state.comm.bytes_sent > 0 and state.allreduce.plans, "no bucket went compressed"


def compiled_model_keeps_the_hook(comm: compcoll.Communicator) -> None:
    """``torch.compile`` over a hooked DDP model (Dynamo's DDPOptimizer splits the graph at the buckets; the
    reducer still calls the hook): the buckets go compressed and the replicas stay identical."""
    model = torch.compile(DDP(make_model()), backend="eager")  # DDPOptimizer wants its first bucket the smallest
    state = compcoll.ddp.OneBitState(min_compress_numel=211500)
    model.register_comm_hook(state, compcoll.ddp.onebit_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for i in range(5):
        step(model, opt, comm.rank, i)
        assert_replicas_equal(model)
    assert state.comm.bytes_sent > 0 and state.allreduce.plans, "no bucket went compressed"


def python_reducer(comm: compcoll.Communicator) -> None:
    """torch.compile's Python reducer (``optimize_ddp = "python_reducer"`` under compiled autograd) calls hooks on
    one (gradient, parameter) pair at a time: ``local_hook`` leaves each gradient local and a 1-bit Adam trains with
    identical replicas; ``onebit_hook`` raises a TypeError naming the mode on every rank (it failed with an
    AttributeError on the pair)."""
    import torch._dynamo
    from torch._dynamo import compiled_autograd

    from compcoll.optim import OneBitAdam

    before = torch._dynamo.config.optimize_ddp
    torch._dynamo.config.optimize_ddp = "python_reducer"
    try:
        for hook in (compcoll.ddp.local_hook, compcoll.ddp.onebit_hook):
            net = make_model()
            model = torch.compile(DDP(net), backend="eager")
            state = None if hook is compcoll.ddp.local_hook else compcoll.ddp.OneBitState(min_compress_numel=1000)
            model.register_comm_hook(state, hook)
            opt = (OneBitAdam(net.parameters(), lr=1e-3, freeze_step=2, comm=compcoll.init()) if state is None
                   else torch.optim.SGD(net.parameters(), lr=0.05))
            try:
                with compiled_autograd._enable(torch.compile(backend="eager")):
                    for i in range(4):
                        step(model, opt, comm.rank, i)
            except TypeError as exc:
                assert state is not None and "optimize_ddp = 'python_reducer'" in str(exc), exc
                continue
            assert state is None and opt.steps == 4, "onebit_hook took the Python reducer's pairs"
            assert_replicas_equal(net)
    finally:
        torch._dynamo.config.optimize_ddp = before


def nan_skips_on_every_rank(comm: compcoll.Communicator) -> None:
    """A NaN in the last rank's gradients at a compressed step: every rank gets NaN buckets, a GradScaler skips the
    step and halves its scale on every rank, the error buffers are unchanged, the step's errors do not outlive it, and
    the steps after it equal a run in which that step never happened."""
    n, rank = comm.size, comm.rank

    def run(poisoned_step: int | None) -> tuple[torch.Tensor, list[float]]:
        model = DDP(make_model(), bucket_cap_mb=BUCKET_MB)
        state = compcoll.ddp.OneBitState(min_compress_numel=211500)
        model.register_comm_hook(state, compcoll.ddp.onebit_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        scales = []
        for i in range(6):
            poison = i == poisoned_step
            buffers = {k: p.error_feedback.worker_error.clone() for k, p in state.allreduce.plans.items()}
            x, y = batch(rank, 4 if poison else i)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            scaler.scale(loss * float("nan") if poison and rank == n - 1 else loss).backward()
            if poison:
                assert all(torch.isnan(p.grad).all() for p in model.parameters()), "a bucket stayed finite"
                for k, p in state.allreduce.plans.items():
                    assert torch.equal(p.error_feedback.worker_error, buffers[k]), "an error buffer changed"
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        assert_replicas_equal(model)
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), scales

    earlier = _errors()
    poisoned, scales = run(3)
    kept = _errors() - earlier
    assert not kept, f"{len(kept)} error(s) of the skipped step outlived it, with the calls and frames they hold"
    clean, clean_scales = run(None)
    assert scales == [1024.0] * 3 + [512.0] * 3 and clean_scales == [1024.0] * 6, (scales, clean_scales)
    assert all(s == scales for _, s in gather((0, scales))), "loss scales differ between ranks"
    assert not torch.equal(poisoned, clean)


def _errors() -> set[int]:
    """The ids of the ``NonFiniteError``s alive after a collection (earlier tests in this process may have kept some:
    torch's own ``Future.wait`` keeps an error it raised, tests/comm/test_ordering.py)."""
    gc.collect()
    return {id(o) for o in gc.get_objects() if isinstance(o, compcoll.NonFiniteError)}


def agree_on_device(comm: compcoll.Communicator) -> None:
    """Set ``comm`` and the node communicators of every topology built on it to agree on the device
    (``Communicator.agrees_on_device``), as a state's communicators over NCCL do."""
    comm.agrees_on_device = True
    for nodes in comm.attached.get(TOPOLOGIES, {}).values():
        nodes.intra.agrees_on_device = nodes.inter.agrees_on_device = True


def birder_matches_reference(comm: compcoll.Communicator, steps: int, odd: bool = False,
                             on_device: bool = False) -> None:
    """Every compressed bucket equals Birder's reference (seed, call counter as step); replicas identical. ``odd``:
    ``OddModel``, whose float64 bucket the reference takes as float32 and whose sparse bucket goes plain.
    ``on_device``: the state's communicators agree on the device, as over NCCL (``agree_on_device``)."""
    rank = comm.rank
    model = DDP(OddModel() if odd else make_model(), bucket_cap_mb=BUCKET_MB)
    state = compcoll.ddp.BirderState(ranks_per_node=1, seed=5, min_compress_numel=ODD_COMPRESS_NUMEL if odd else 211500)
    if on_device:
        state.bind()
        agree_on_device(state.comm)
    records: dict[int, tuple] = {}
    model.register_comm_hook(state, recording(compcoll.ddp.birder_hook, records))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    compressed_calls = 0
    for i in range(steps):
        records.clear()
        step(model, opt, rank, i)
        everyone = gather({k: (c, b.numpy()) for k, (c, b, _, _) in records.items()})
        for index, (compressed, _, out, calls) in records.items():
            xs = [r[index][1] for r in everyone]
            if compressed:
                outs, _ = reference.hierarchical_allreduce([x.astype(np.float32) for x in xs], 1, 5, calls)
                compressed_calls += 1
                assert torch.equal(out, torch.from_numpy(outs[rank]).to(out.dtype)), f"bucket {index} step {i}"
            else:
                assert torch.allclose(out, torch.from_numpy(np.mean(xs, axis=0)), atol=1e-6), f"plain bucket {index}"
        assert_replicas_equal(model)
    assert compressed_calls == state.calls > 0
    if on_device:
        assert_rounds_on_device(list(state.comm.attached[PLANS].values()))


def local_hook_keeps_gradients(comm: compcoll.Communicator) -> None:
    """Under local_hook every rank's gradients are its own (those of the unwrapped model on its batch)."""
    rank = comm.rank
    model = DDP(make_model(), bucket_cap_mb=BUCKET_MB)
    model.register_comm_hook(None, compcoll.ddp.local_hook)
    plain = make_model()
    x, y = batch(rank, 0)
    torch.nn.functional.mse_loss(model(x), y).backward()
    torch.nn.functional.mse_loss(plain(x), y).backward()
    for p, q in zip(model.parameters(), plain.parameters()):
        assert torch.equal(p.grad, q.grad), "a gradient was changed"


class _WithUnused(torch.nn.Module):
    """``make_model`` and a layer no forward uses (DDP's ``find_unused_parameters`` case)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = make_model()
        self.unused = torch.nn.Linear(50, 50)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _trained_with(options: dict, unused: bool = False, accumulate: bool = False, steps: int = 6) -> torch.Tensor:
    """``make_model``'s parameters after ``steps`` steps of DDP (``options``) with the default ``onebit_hook``
    (compressing from the third iteration, buckets of 1000 elements and more); ``accumulate``: each step adds a
    micro-batch under ``no_sync()`` first. Replicas must be equal."""
    rank = dist.get_rank()
    model = DDP(_WithUnused() if unused else make_model(), bucket_cap_mb=BUCKET_MB, **options)
    model.register_comm_hook(compcoll.ddp.OneBitState(min_compress_numel=1000), compcoll.ddp.onebit_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for i in range(steps):
        if accumulate:
            with model.no_sync():
                x, y = batch(rank, 100 + i)
                torch.nn.functional.mse_loss(model(x), y).backward()
            x, y = batch(rank, i)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        else:
            step(model, opt, rank, i)
    assert_replicas_equal(model)
    body = model.module.body if unused else model.module
    return torch.cat([p.detach().reshape(-1) for p in body.parameters()])


def ddp_options_keep_the_hook(comm: compcoll.Communicator) -> None:
    """Under DDP's options users set, the hook trains alike on every rank: ``gradient_as_bucket_view`` and
    ``static_graph`` give the default's bits; ``find_unused_parameters`` (whose buckets DDP never rebuilds) with an
    unused layer, and gradient accumulation under ``no_sync()``, keep replicas equal and train."""
    default = _trained_with({})
    for options in (dict(gradient_as_bucket_view=True), dict(static_graph=True)):
        assert torch.equal(_trained_with(options), default), f"{options} changed the bits"
    start = torch.cat([p.detach().reshape(-1) for p in make_model().parameters()])
    for trained in (_trained_with(dict(find_unused_parameters=True), unused=True),
                    _trained_with(dict(gradient_as_bucket_view=True), accumulate=True)):
        assert not torch.equal(trained, start) and torch.isfinite(trained).all()


def _uneven(state: compcoll.ddp.OneBitState | compcoll.ddp.BirderState, joined: bool, steps: int = 6) -> torch.Tensor:
    """``make_model``'s parameters after ``steps`` steps with the hook of ``state``, where the last rank has two
    batches fewer: under DDP's ``model.join()`` (``joined``), or stepping on zero gradients (its loss times 0)."""
    rank, last = dist.get_rank(), dist.get_rank() == dist.get_world_size() - 1
    model = DDP(make_model(), bucket_cap_mb=BUCKET_MB)
    model.register_comm_hook(state, HOOKS[type(state)])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with model.join(enable=joined):
        for i in range(steps - 2 if last and joined else steps):
            x, y = batch(rank, i)
            opt.zero_grad()
            (torch.nn.functional.mse_loss(model(x), y) * (0.0 if last and i >= steps - 2 else 1.0)).backward()
            opt.step()
    assert_replicas_equal(model)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def uneven_inputs_under_ddp_join(comm: compcoll.Communicator) -> None:
    """DDP's own uneven-input support, ``model.join()``, with each hook: a joined rank runs the hook on zero buckets
    (DDP's ``_match_all_reduce_for_bwd_pass``) in step with the others, so the run ends with the bits of one where
    that rank steps on zero gradients, on every rank (DDP hands the last joiner's model to the rest)."""
    for kind in (compcoll.ddp.OneBitState, compcoll.ddp.BirderState):
        joined, zeros = _uneven(kind(min_compress_numel=1000), True), _uneven(kind(min_compress_numel=1000), False)
        assert torch.equal(joined, zeros), f"{kind.__name__}: the run under join differs from zero gradients"


def states_refuse_different_schedules(comm: compcoll.Communicator) -> None:
    """Hook states built with a schedule (or Birder's seed) that differs on one rank: RankMismatchError naming it on
    every rank, at construction (a bucket would otherwise go through torch's allreduce on one rank and compcoll's
    group on another, each waiting for a timeout)."""
    last = dist.get_rank() == dist.get_world_size() - 1
    for build, named in ((lambda: compcoll.ddp.OneBitState(start_iter=3 if last else 2), "start iterations"),
                         (lambda: compcoll.ddp.OneBitState(min_compress_numel=1 if last else 2), "min_compress_numel"),
                         (lambda: compcoll.ddp.BirderState(seed=7 if last else 0), "seeds")):
        try:
            build()
        except compcoll.RankMismatchError as exc:
            assert named in str(exc), exc
        else:
            raise AssertionError(f"no RankMismatchError for different {named}")


def rewrapped_model(comm: compcoll.Communicator) -> None:
    """One state over a new DDP of a changed model (a layer unfrozen, as in gradual unfreezing): its buckets are
    compressed again once DDP's buckets settle, with a warning (checked on processes) and fresh error buffers (they
    went uncompressed for good, with nothing said); a new DDP over the same model keeps compressing, no warning."""
    net = make_model()
    net[0].requires_grad_(False)
    state = compcoll.ddp.OneBitState(start_iter=1, min_compress_numel=1)
    rank = dist.get_rank()
    on_processes = dist.get_backend() != "threaded"  # warnings are recorded process-wide: checked on processes

    def train(model: DDP, first: int, count: int) -> int:
        """``count`` steps from step ``first``; the compressed calls' bytes they sent."""
        sent = state.comm.bytes_sent
        opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.01)
        for i in range(first, first + count):
            step(model, opt, rank, i)
        assert_same(torch.cat([p.detach().reshape(-1) for p in net.parameters()]))
        return state.comm.bytes_sent - sent

    for stage, (change, warns) in enumerate(((None, False), (None, False), ("unfreeze", True))):
        if change == "unfreeze":
            net[0].requires_grad_(True)
        model = DDP(net)  # one bucket (DDP's 25 MiB): the unfrozen layer joins bucket 0, which no known one tiles
        model.register_comm_hook(state, compcoll.ddp.onebit_hook)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            train(model, 10 * stage, 3)
        said = [str(w.message) for w in caught if "DDP's buckets now hold other parameters" in str(w.message)]
        if on_processes:
            assert bool(said) == warns and len(said) <= 1, (stage, said)
        assert train(model, 10 * stage + 3, 2) > 0, f"stage {stage}: the buckets went uncompressed"
        assert state.layouts and all(state.layouts.values())


def assert_same(values: torch.Tensor) -> None:
    """Every rank holds the same bits of ``values`` (an all-gather over the default group)."""
    gathered = [torch.empty_like(values) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, values)
    assert all(torch.equal(g, values) for g in gathered), "replicas differ"


def _gan(states: tuple[compcoll.ddp.OneBitState, compcoll.ddp.OneBitState], steps: int) -> list[int]:
    """``steps`` steps of a small GAN whose generator and discriminator are each under DDP, hooked with ``states``
    (generator's, discriminator's; the same one twice as a user may): the bytes each state's compressed calls sent."""
    rank = dist.get_rank()
    with seeded(0):
        nets = (torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.Tanh(), torch.nn.Linear(64, 30)),
                torch.nn.Sequential(torch.nn.Linear(30, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)))
    (gen, disc), sent = (DDP(net) for net in nets), [state.comm.bytes_sent for state in states]
    for model, state in zip((gen, disc), states):
        model.register_comm_hook(state, compcoll.ddp.onebit_hook)
    opts = [torch.optim.Adam(net.parameters(), lr=1e-3) for net in nets]
    draws = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        z, real = torch.randn(16, 20, generator=draws), torch.randn(16, 30, generator=draws)
        for opt in opts:
            opt.zero_grad()
        (disc(real).mean() - disc(gen(z).detach()).mean()).backward()
        opts[1].step()
        opts[0].zero_grad()
        disc(gen(z)).mean().backward()
        opts[0].step()
    assert_same(torch.cat([p.detach().reshape(-1) for net in nets for p in net.parameters()]))
    return [state.comm.bytes_sent - before for state, before in zip(states, sent)]


def state_shared_by_two_models(comm: compcoll.Communicator) -> None:
    """One OneBitState registered on a GAN's two DDP models: ValueError naming the cause on every rank within two
    steps (their buckets shared error buffers by index, the generator's went uncompressed for good, with nothing
    said); a state each: both models' buckets compressed, replicas equal."""
    shared = compcoll.ddp.OneBitState(start_iter=1, min_compress_numel=1)
    try:
        _gan((shared, shared), steps=2)
    except ValueError as exc:
        assert "give each DDP model its own OneBitState" in str(exc), exc
    else:
        raise AssertionError("no ValueError for one OneBitState on two DDP models")
    own = tuple(compcoll.ddp.OneBitState(start_iter=1, min_compress_numel=1) for _ in range(2))
    assert all(_gan(own, steps=3)), "a model's buckets went uncompressed"


def state_on_another_group_than_ddps(comm: compcoll.Communicator) -> None:
    """DDP over the subgroups [0, 2] and [1, 3] of 4 ranks (beside tensor or pipeline parallelism), each averaging
    another model of the same shapes: a state on the default group raises RankMismatchError on every rank at its
    first bucket, naming which ranks hold which parameters (before 2026-12-03 it averaged both models' gradients
    together, with nothing said), for OneBitState and BirderState; states on DDP's group train, replicas equal."""
    rank = dist.get_rank()
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    group = groups[rank % 2]
    for build, hook in ((lambda g: compcoll.ddp.OneBitState(g, start_iter=1, min_compress_numel=1),
                         compcoll.ddp.onebit_hook),
                        (lambda g: compcoll.ddp.BirderState(g, ranks_per_node=None), compcoll.ddp.birder_hook)):
        for state_group in (None, group):
            with seeded(rank % 2):
                net = torch.nn.Sequential(torch.nn.Linear(30, 71), torch.nn.Tanh(), torch.nn.Linear(71, 7))
            model = DDP(net, process_group=group, bucket_cap_mb=SMALL_BUCKET_MB)
            state = build(state_group)
            model.register_comm_hook(state, hook)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            try:
                for step in range(3):
                    x, y = batch(rank, step, inputs=30)
                    torch.nn.functional.mse_loss(model(x), y).backward()
                    opt.step()
                    opt.zero_grad()
            except compcoll.RankMismatchError as exc:
                assert state_group is None, f"rank {rank}: a state on DDP's group refused: {exc}"
                assert "hold different parameters" in str(exc) and "on rank(s) [0, 2]" in str(exc) and \
                    "on rank(s) [1, 3]" in str(exc), exc
            else:
                assert state_group is not None, f"rank {rank}: {type(state).__name__} on the default group trained"
                digests = [None] * 4
                dist.all_gather_object(digests, [p.detach().numpy().tobytes() for p in model.parameters()])
                assert digests[rank] == digests[rank ^ 2], f"rank {rank}: DDP's replicas differ"


def states_take_a_device_mesh(comm: compcoll.Communicator) -> None:
    """A 1-D DeviceMesh serves as any state's ``process_group`` (what ``DDP(device_mesh=...)`` takes): DDP and
    ``OneBitState`` over ``mesh["dp"]`` of a (tp, dp) mesh on 4 ranks train, replicas equal; the other states take
    it too (FSDP's where this torch has compcoll.fsdp); a 2-D mesh and a string raise TypeError naming the
    argument (before 2026-12-03: a KeyError of the mesh's repr)."""
    from torch.distributed.device_mesh import init_device_mesh

    from tests.versions import FSDP_COMPRESSES

    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("tp", "dp"))
    with seeded(rank // 2):
        net = torch.nn.Sequential(torch.nn.Linear(30, 71), torch.nn.Tanh(), torch.nn.Linear(71, 7))
    model = DDP(net, device_mesh=mesh["dp"], bucket_cap_mb=SMALL_BUCKET_MB)
    model.register_comm_hook(compcoll.ddp.OneBitState(mesh["dp"], start_iter=1, min_compress_numel=1),
                             compcoll.ddp.onebit_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        x, y = batch(rank, step, inputs=30)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    digests = [None] * 4
    dist.all_gather_object(digests, [p.detach().numpy().tobytes() for p in model.parameters()])
    peer = mesh["dp"].mesh.tolist()
    assert digests[peer[0]] == digests[peer[1]], f"rank {rank}: DDP's replicas over {peer} differ"
    states = [compcoll.ddp.BirderState]
    if FSDP_COMPRESSES:
        from compcoll.fsdp import ReduceScatterState, ReplicaState

        states += [ReduceScatterState, ReplicaState]
    for cls in states:
        assert cls(mesh["dp"]).comm.size == 2, cls.__name__
    for wrong, said in ((mesh, "of 2 dimensions"), ("dp", "got 'dp'")):
        try:
            compcoll.ddp.OneBitState(wrong)
        except TypeError as exc:
            assert "OneBitState: process_group must be" in str(exc) and said in str(exc), exc
        else:
            raise AssertionError(f"OneBitState took {wrong!r}")


def birder_unpickled_with_other_seeds(comm: compcoll.Communicator, pickled: bytes) -> None:
    """``pickled``: a ``BirderState(seed=rank)`` pickled before ``init_process_group`` (each rank another seed).
    Unpickled after it, the state takes the group at once and its ranks agree on the saved seed: ``RankMismatchError``
    on every rank, naming the seeds (before 2026-12-03 they agreed on the default seed, then drew from their own)."""
    try:
        pickle.loads(pickled)
    except compcoll.RankMismatchError as exc:
        assert "seeds" in str(exc), exc
    else:
        raise AssertionError("ranks with other seeds unpickled their BirderStates without an error")
