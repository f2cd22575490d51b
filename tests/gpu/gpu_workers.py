"""Rank-side bodies of the GPU tests: compcoll's collectives on CUDA tensors against the reference."""

from __future__ import annotations

import os

import numpy as np
import torch
import torch.distributed as dist

import compcoll
from compcoll.kernels import reference
from tests.algorithms.onebit_workers import (assert_errors_match, assert_matches_reference, assert_same_on_all_ranks,
                                             make_input)
from tests.optim.follow_workers import close
from tests.optim.optim_workers import whole_state


def report(line: str) -> None:
    """Append a line to the file ``$COMPCOLL_GPU_DIFFS`` names, where it is set (the GPU run keeps it)."""
    path = os.environ.get("COMPCOLL_GPU_DIFFS")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def cuda_numerics(comm: compcoll.Communicator, shapes: list[list[int]], steps: int) -> None:
    """compressed_allreduce (1 bit, and 3 / 4-bit levels) and both hierarchical forms (one node of n ranks for the
    compensated one) on CUDA equal the reference.

    Odd steps run the compensated calls asynchronously (a side stream, waited on), the flat
    one in 3 pieces, the hierarchical one with the allgather protocol, and the levels at 4 bits.
    """
    n, rank = comm.size, comm.rank
    device = torch.device("cuda", torch.cuda.current_device())
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for shape in map(tuple, shapes):
            numel = int(np.prod(shape))
            full = compcoll.padded_numel(numel, n)
            we = torch.zeros(full, device=device)
            se = torch.zeros(full // n, device=device)
            ref_we = [np.zeros(full, np.float32) for _ in range(n)]
            ref_se = [np.zeros(full // n, np.float32) for _ in range(n)]
            wn, sn = compcoll.hierarchical_error_numels(numel, n, n)
            hwe, hse = torch.zeros(wn, device=device), torch.zeros(sn, device=device)
            ref_hwe = [np.zeros(wn, np.float32) for _ in range(n)]
            ref_hse = [np.zeros(sn, np.float32) for _ in range(n)]
            lwe, lse = torch.zeros(full, device=device), torch.zeros(full // n, device=device)
            ref_lwe, ref_lse = [np.zeros(full, np.float32) for _ in range(n)], [np.zeros(full // n, np.float32)
                                                                                for _ in range(n)]
            for step in range(steps):
                xs = [make_input(q, step, shape, dtype) for q in range(n)]
                flat = [x.float().reshape(-1).numpy() for x in xs]
                asynchronous = step % 2 == 1
                out = compcoll.compressed_allreduce(xs[rank].to(device), we, se, comm, async_op=asynchronous,
                                                    pieces=3 if asynchronous else 1)
                out = out.wait() if asynchronous else out
                assert out.device == device
                outs, ref_we, ref_se, _ = reference.compressed_allreduce(flat, ref_we, ref_se)
                where = f"{dtype} shape {shape} step {step}"
                assert_matches_reference(out.cpu(), outs[rank], where)
                assert_errors_match(we.cpu(), se.cpu(), ref_we[rank], ref_se[rank], where)
                hier = compcoll.hierarchical_allreduce(xs[rank].to(device), comm, ranks_per_node=1, seed=5, step=step)
                ref_hier, _ = reference.hierarchical_allreduce(flat, 1, 5, step)
                assert_matches_reference(hier.cpu(), ref_hier[rank], "hierarchical " + where)
                protocol = ("gather_scatter", "allgather")[step % 2]
                out = compcoll.hierarchical_compressed_allreduce(xs[rank].to(device), hwe, hse, comm, ranks_per_node=n,
                                                                 async_op=asynchronous, protocol=protocol)
                out = out.wait() if asynchronous else out
                outs, ref_hwe, ref_hse, _ = reference.hierarchical_compressed_allreduce(flat, ref_hwe, ref_hse, n,
                                                                                        protocol=protocol)
                assert_matches_reference(out.cpu(), outs[rank], "hierarchical compensated " + where)
                assert_errors_match(hwe.cpu(), hse.cpu(), ref_hwe[rank], ref_hse[rank], "hierarchical " + where)
                bits = (3, 4)[step % 2]
                out = compcoll.compressed_allreduce(xs[rank].to(device), lwe, lse, comm, block_size=64, bits=bits)
                outs, ref_lwe, ref_lse, _ = reference.compressed_allreduce(flat, ref_lwe, ref_lse, block_size=64,
                                                                           bits=bits)
                assert_matches_reference(out.cpu(), outs[rank], f"{bits}-bit levels " + where)
                assert_errors_match(lwe.cpu(), lse.cpu(), ref_lwe[rank], ref_lse[rank], "levels " + where)


def optimizers_on_cuda_equal_cpu(comm: compcoll.Communicator, steps: int, device: str = "cuda") -> None:
    """Every optimizer trains CUDA parameters as the same run on CPU parameters does, to rounding.

    Both copies get the same gradients (seeded per rank and step, a zero row and a zero
    column that the silent-coordinate masks must keep at zero), through warmup and the
    compressed phases. The optimizers' element-wise steps are torch's own operations,
    whose CUDA kernels round differently from the CPU's (fused multiply-adds), so:

    1. after every step the parameters are within ``follow_workers.TOLERANCE`` of the CPU run's;
    2. the CUDA parameters are the same bits on every rank (0/1 Adam: where it is synchronised);
    3. at the end every state buffer and error buffer is within ``follow_workers.TOLERANCE``, and the
       scalars (step counts, phases) are equal.

    ``device="cpu"`` runs the same check on two CPU copies, where everything is equal.
    The largest difference seen is appended to ``$COMPCOLL_GPU_DIFFS`` where that is set.
    """
    from compcoll.optim import Birder, OneBitAdam, OneBitLamb, ZeroOneAdam

    device = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device(device)
    configs = [
        (OneBitAdam, dict(lr=1e-2, freeze_step=3, weight_decay=0.01), torch.float32),
        (OneBitAdam, dict(lr=1e-2, freeze_step=3, compress="momentum", scale="l2"), torch.float32),
        (OneBitAdam, dict(lr=1e-2, freeze_step=3), torch.bfloat16),
        (OneBitLamb, dict(lr=1e-2, freeze_step=3, weight_decay=0.01), torch.float32),
        (OneBitLamb, dict(lr=1e-2, freeze_step=3, compress="momentum", scale="l2", trust_ratio="frozen"),
         torch.float32),
        (OneBitLamb, dict(lr=1e-2, freeze_step=3, weight_decay=0.01, trust_ratio="frozen"), torch.float32),
        (ZeroOneAdam, dict(lr=1e-2, var_freeze_step=5, var_update_scaler=2, local_step_scaler=3,
                           local_step_clipper=4, weight_decay=0.01), torch.float32),
        (Birder, dict(lr=1e-3, weight_decay=0.01), torch.float32),
    ]
    shapes = [(20, 4), (7, 5), (5,), (3, 5), (3,)]
    for cls, kwargs, dtype in configs:
        init = torch.Generator().manual_seed(11)
        values = [(torch.randn(shape, generator=init) * 0.5).to(dtype) for shape in shapes]
        devices = (torch.device("cpu"), device)
        copies = [[torch.nn.Parameter(v.clone().to(d)) for v in values] for d in devices]
        opts = [cls([{"params": ps[:3]}, {"params": ps[3:], "lr": kwargs["lr"] / 2}], comm=comm, **kwargs)
                for ps in copies]
        where = f"{cls.__name__} {kwargs} {dtype} on rank {comm.rank} of {comm.size}"
        worst = 0.0
        for step in range(steps):
            gen = torch.Generator().manual_seed(1000 * comm.rank + step)
            grads = [torch.randn(shape, generator=gen).to(dtype) for shape in shapes]
            grads[0][10:] = 0.0
            grads[1][:, 2] = 0.0
            for d, ps, opt in zip(devices, copies, opts):
                for p, g in zip(ps, grads):
                    p.grad = g.to(d)
                opt.step()
            for a, b in zip(*copies):
                worst = max(worst, close(a.detach(), b.detach().cpu(), f"{where}: parameters at step {step}"))
                if getattr(opts[1], "synchronized", True):
                    assert_same_on_all_ranks(comm, b.detach().cpu().float(), f"{where} at step {step}: ")
        cpu_state, cuda_state = (whole_state(opt) for opt in opts)
        for name, buf in cpu_state["buffers"].items():
            close(buf, cuda_state["buffers"][name].cpu(), f"{where}: state buffer {name}")
        for name in ("worker_error", "server_error"):
            if cpu_state["error_feedback"] is not None:
                close(cpu_state["error_feedback"][name], cuda_state["error_feedback"][name].cpu(), f"{where}: {name}")
        assert cpu_state["scalars"] == cuda_state["scalars"], where
        report(f"{where}: largest |cuda - cpu| of a parameter over {steps} steps {worst:.3g}")


def cupy_arrays(comm: compcoll.Communicator, steps: int) -> None:
    """cupy in, cupy out (through DLPack, no copy): compressed_allreduce equals the reference, blocking and async."""
    import cupy

    n, rank = comm.size, comm.rank
    for shape in ((37,), (3, 7, 11)):
        numel = int(np.prod(shape))
        full = compcoll.padded_numel(numel, n)
        we, se = cupy.zeros(full, cupy.float32), cupy.zeros(full // n, cupy.float32)
        ref_we, ref_se = [np.zeros(full, np.float32)] * n, [np.zeros(full // n, np.float32)] * n
        for step in range(steps):
            xs = [make_input(q, step, shape, torch.float32) for q in range(n)]
            asynchronous = step % 2 == 1
            got = compcoll.compressed_allreduce(cupy.asarray(xs[rank].numpy()), we, se, comm, async_op=asynchronous)
            got = got.wait() if asynchronous else got
            assert isinstance(got, cupy.ndarray) and got.shape == shape
            outs, ref_we, ref_se, _ = reference.compressed_allreduce([x.reshape(-1).numpy() for x in xs], ref_we,
                                                                     ref_se)
            where = f"cupy {shape} step {step}"
            assert np.array_equal(cupy.asnumpy(got).reshape(-1), outs[rank]), where
            assert np.array_equal(cupy.asnumpy(we), ref_we[rank]) and np.array_equal(cupy.asnumpy(se), ref_se[rank])


def fsdp_sharing_the_gpu(comm: compcoll.Communicator, steps: int) -> None:
    """FSDP2's compressed reduce-scatters (``tests.fsdp.fsdp_workers.reduce_scatter``) on a CUDA mesh of ranks
    sharing GPU 0: each sets it first, since a CUDA mesh would set the GPU of its LOCAL_RANK, which one GPU lacks."""
    from tests.fsdp.fsdp_workers import reduce_scatter

    torch.cuda.set_device(0)
    reduce_scatter(comm, steps, "cuda")


def ddp_on_a_stream_of_its_own(comm: compcoll.Communicator, steps: int) -> None:
    """DDP on the GPU with forward and backward on a non-default stream, and each call's last kernel held back
    (the decode queued behind ``torch.cuda._sleep`` on the call's stream, after its host wait): every bucket's
    gradients, as DDP writes them on that stream, are the hook's output, so DDP waited for the call there, not
    only on the default stream."""
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from compcoll import codecs
    from tests.ddp.ddp_workers import BUCKET_MB, batch, make_model

    decode_framed = codecs.decode_framed

    def slow_decode(rows: torch.Tensor, out: torch.Tensor) -> None:
        torch.cuda._sleep(1 << 28)  # about a tenth of a second of the call's stream
        decode_framed(rows, out)

    codecs.decode_framed = slow_decode
    device = torch.device("cuda", torch.cuda.current_device())
    model = DDP(make_model().to(device), device_ids=[device.index], bucket_cap_mb=BUCKET_MB)
    state = compcoll.ddp.OneBitState(min_compress_numel=211500)
    outputs: dict[int, tuple[list[torch.nn.Parameter], torch.Tensor]] = {}

    def hook(state, bucket):
        params = bucket.parameters()
        return compcoll.ddp.onebit_hook(state, bucket).then(
            lambda fut: outputs.__setitem__(bucket.index(), (params, fut.value().clone())) or fut.value())

    model.register_comm_hook(state, hook)
    user = torch.cuda.Stream(device)
    compressed = 0
    try:
        for i in range(steps):
            outputs.clear()
            with torch.cuda.stream(user):
                x, y = (t.to(device) for t in batch(comm.rank, i))
                model.zero_grad()
                F.mse_loss(model(x), y).backward()
                grads = {index: torch.cat([p.grad.reshape(-1) for p in params]).cpu()
                         for index, (params, _) in outputs.items()}
            for index, (_, out) in outputs.items():
                compressed += i >= state.schedule.start_iter and out.numel() >= 211500
                assert torch.equal(grads[index], out.cpu()), f"step {i} bucket {index}: DDP wrote stale gradients"
    finally:
        codecs.decode_framed = decode_framed
    assert compressed > 0, "no bucket went compressed"


def checkpoint_files_on_cuda(comm: compcoll.Communicator, folder: str, device: str = "cuda") -> None:
    """``compcoll.checkpoint`` maps its files to the CPU: a ``CompressedAllreduce`` and a ``ReduceScatterState``
    loaded from them on a GPU run move their error buffers to the tensors' device at the next call, values kept, and
    go on with the bits of the run that went on (the allreduce raised ValueError there before 2026-12-01, the
    reduce-scatter restarted its buffers at zero, with nothing said)."""
    import compcoll.checkpoint
    from compcoll.fsdp.scatter import ReduceScatterState

    xs = [torch.randn(5003, generator=torch.Generator().manual_seed(step)).to(device) for step in range(2)]
    outs = [torch.empty(5003, device=device) for _ in range(2)]
    allreduce, scatter = compcoll.CompressedAllreduce(comm), ReduceScatterState()
    allreduce(xs[0], key="w")
    scatter.reduce_scatter(0, outs[0], xs[0], None, dist.ReduceOp.AVG)
    compcoll.checkpoint.save(folder, allreduce, scatter)
    went_on = allreduce(xs[1], key="w").cpu()
    scatter.reduce_scatter(0, outs[0], xs[1], None, dist.ReduceOp.AVG)
    resumed, resumed_scatter = compcoll.CompressedAllreduce(comm), ReduceScatterState()
    compcoll.checkpoint.load(folder, resumed, resumed_scatter)
    assert resumed.plans["w"].device.type == resumed_scatter.errors[0].device.type == "cpu"
    assert torch.equal(resumed(xs[1], key="w").cpu(), went_on), "the resumed allreduce differs"
    resumed_scatter.reduce_scatter(0, outs[1], xs[1], None, dist.ReduceOp.AVG)
    assert torch.equal(outs[1], outs[0]), "the resumed reduce-scatter differs"
    assert resumed.plans["w"].device.type == resumed_scatter.errors[0].device.type == device
