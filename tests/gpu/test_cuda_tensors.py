"""CUDA tensors end to end (needs a GPU; skipped otherwise): codecs equal the CPU's, collectives equal the reference."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import pytest
import torch

import compcoll
from compcoll import SingleComm, codecs, compressed_allreduce
from compcoll.algorithms.server import serve
from compcoll.algorithms.parts import unpacked
from compcoll.bench.clocks import QueuedClock, host_seconds, idle_seconds, own_host_seconds
from compcoll.bench.launches import call_counts
from compcoll.kernels.launch import COUNTS, LAUNCHERS
from compcoll.launcher import run
from compcoll.spec import STAGES, stream_key
from compcoll.workspace import Workspace
from tests.bench import bench_script
from tests.optim.follow_workers import CHANGES
from tests.versions import NEEDS_FSDP_HOOK

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")
WORKERS = "tests.gpu.gpu_workers"
SHAPES = [[1], [37], [3, 7, 11], [100003]]


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("numel", [1, 37, 8193, 1 << 20])
def test_codecs_on_cuda_equal_cpu(dtype: torch.dtype, numel: int, launcher: str,
                                  choose_launcher: Callable[[str], None]) -> None:
    choose_launcher(launcher)
    gen = torch.Generator().manual_seed(numel)
    x = (torch.randn(numel, generator=gen) * 3).to(dtype)
    full = -(-numel // 24) * 24
    err = torch.randn(full, generator=gen) * 0.1
    results = {}
    for device in ("cpu", "cuda"):
        xd, ed = x.to(device), err.clone().to(device)
        total = codecs.compensated_sum(xd, ed)
        absolute = codecs.compensated_sum(xd, ed, "l1")
        bits = torch.empty(full // 8, dtype=torch.uint8, device=device)
        codecs.compensate_encode(xd, ed, 0.5, bits)
        rows = bits.view(3, -1)
        acc = torch.empty(full // 3, device=device)
        squares = codecs.accumulate_signs(rows, torch.tensor([0.3, 0.2, 0.1]), None, acc, full // 3)
        out = torch.empty(numel, dtype=dtype, device=device)
        codecs.decode(rows, torch.tensor([1.5, 2.5, 3.5]), out)
        maxima = codecs.row_absmax(xd, 3, full)
        wire = torch.zeros(3, codecs.SCALE_BYTES + full // 24, dtype=torch.uint8, device=device)
        codecs.randomized_encode(xd, maxima, stream_key(7, 2, STAGES["node"], 1), 0, wire)
        torch.cuda.synchronize()
        results[device] = (total, absolute, squares, bits.cpu(), ed.cpu(), acc.cpu(), out.cpu(), maxima.cpu(),
                           wire.cpu())
    names = ("sumsq", "sum |x|", "accumulate sumsq", "bits", "error", "accumulate", "decode", "absmax", "wire")
    for name, a, b in zip(names, results["cpu"], results["cuda"]):
        same = (a == b if isinstance(a, float)
                else np.array_equal(a.view(torch.uint8).numpy(), b.view(torch.uint8).numpy()))
        assert same, name


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_segment_sums_on_cuda_equal_cpu(launcher: str, choose_launcher: Callable[[str], None]) -> None:
    """``codecs.segment_sumsq`` on CUDA gives the CPU's bits (each segment's ``sumsq``): empty segments, one past a
    summation block, one past ``MAX_BLOCKS`` blocks' worth of lanes, values whose sums depend on the order."""
    choose_launcher(launcher)
    gen = torch.Generator().manual_seed(3)
    sizes = (0, 1, 37, 8193, 0, 5, 40_000_003, 300)
    x = torch.randn(sum(sizes) + 3, generator=gen) * torch.exp2(torch.randint(-20, 21, (sum(sizes) + 3,),
                                                                              generator=gen).float())
    bounds = tuple(np.concatenate([[0], np.cumsum(sizes)]).tolist())
    sums = {}
    for device in ("cpu", "cuda"):
        out = torch.empty(len(sizes), dtype=torch.float64, device=device)
        codecs.segment_sumsq(x.to(device), bounds, out)
        sums[device] = out.cpu()
    assert torch.equal(sums["cpu"], sums["cuda"]), (sums["cpu"] - sums["cuda"]).abs().max()


@pytest.mark.parametrize("numel", [(1 << 20) + 7, (1 << 22) + 7, (1 << 24) + 7])
def test_sums_past_4096_lane_sums_on_cuda_equal_cpu(numel: int) -> None:
    """Past 4096 lane sums (1M elements) the last block of each of 128 groups adds its part of the tree's wide levels
    and the last group the rest (``kernels.cuda.sums._finish_lanes``): here 1, 4 and 16 blocks a group, and up to 4 lane
    sums a thread walks. The sums of squares and of |x|, and the accumulate's values and sum, give the CPU's bits on
    values whose sums depend on the order."""
    gen = torch.Generator().manual_seed(numel)
    x = torch.randn(numel, generator=gen) * torch.exp2(torch.randint(-20, 21, (numel,), generator=gen).float())
    err = torch.randn(numel, generator=gen) * 1e-3
    rows = torch.randint(0, 256, (2, -(-numel // 8)), dtype=torch.uint8, generator=gen)
    found = {}
    for device in ("cpu", "cuda"):
        xd, ed, acc = x.to(device), err.to(device), torch.empty(numel, device=device)
        squares = codecs.accumulate_signs(rows.to(device), torch.tensor([0.7, 0.3]), xd, acc, numel)
        found[device] = (codecs.compensated_sum(xd, ed), codecs.compensated_sum(xd, ed, "l1"), squares, acc.cpu())
    for name, a, b in zip(("sumsq", "sum |x|", "accumulate sumsq", "accumulate"), found["cpu"], found["cuda"]):
        assert (a == b) if isinstance(a, float) else torch.equal(a, b), name


@pytest.mark.parametrize("launcher, wraps", [("bound", False), ("numba", True)])
def test_one_call_counts_its_launches_wraps_and_waits(launcher: str, wraps: bool,
                                                      choose_launcher: Callable[[str], None]) -> None:
    """One gather-scatter call at 1 rank through kernels.launch: the bound launcher wraps no tensor, numba's
    dispatcher wraps each; the worker's sum is the kernels' one host wait. Issue 39's aim: at most 5 launches (each
    sum finished by its own kernel's last block, the server scale beside it)."""
    choose_launcher(launcher)
    x = torch.randn(100003, device="cuda")
    we, se = torch.zeros(compcoll.padded_numel(x.numel(), 1), device="cuda"), torch.zeros(100008, device="cuda")
    compressed_allreduce(x, we, se, SingleComm())
    torch.cuda.synchronize()
    COUNTS.reset()
    compressed_allreduce(x, we, se, SingleComm())
    torch.cuda.synchronize()
    assert 0 < COUNTS.launches <= 5 and (COUNTS.wraps > 0) == wraps and COUNTS.waits == 1, COUNTS


def _call_synchronizations(prof: torch.profiler.profile) -> list[str]:
    """The CUDA runtime synchronizations ``prof`` (a ``torch.profiler.profile`` left around one call) read, less
    the profiler's own: leaving it synchronizes the device (``torch.autograd.profiler.profile.__exit__``), the
    last ``cudaDeviceSynchronize`` of every list (seen on the H200 on 2026-12-04)."""
    waits = [e.name for e in prof.events() if e.name in ("cudaStreamSynchronize", "cudaDeviceSynchronize",
                                                         "cudaEventSynchronize", "cuStreamSynchronize")]
    assert waits[-1:] == ["cudaDeviceSynchronize"], waits
    return waits[:-1]


@pytest.mark.parametrize("block_size", [None, 64])
def test_one_call_synchronizes_once(block_size: int | None) -> None:
    """What ``COUNTS`` cannot see: the CUDA runtime's synchronizations of one gather-scatter call at 1 rank, read by
    torch.profiler, are the worker sum's one (torch's own copies waited too: the weights' pageable copy did)."""
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(100003, device="cuda")
    we, se = torch.zeros(compcoll.padded_numel(x.numel(), 1), device="cuda"), torch.zeros(100008, device="cuda")
    compressed_allreduce(x, we, se, SingleComm(), block_size=block_size)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        compressed_allreduce(x, we, se, SingleComm(), block_size=block_size)
    assert _call_synchronizations(prof) == ["cudaStreamSynchronize"]


@pytest.mark.parametrize("form", ["flat", "birder"])
def test_a_call_uploads_from_pinned_memory_it_writes_itself(form: str) -> None:
    """The host numbers a call copies to the device (the weights and s_w where its rounds run on host numbers, as
    over MPI, Birder's stream keys) are written straight into fresh pinned memory (``codecs.pinned_like``):
    torch.profiler sees no ``pin_memory`` in a steady call (17 us a call on the H200 at f15d93e, staged from a
    pageable buffer), and the bits stay the CPU's."""
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(100003, device="cuda")
    full = compcoll.padded_numel(x.numel(), 1)
    if form == "flat":
        def call(t: torch.Tensor) -> torch.Tensor:
            buffers = [torch.zeros(full, device=t.device) for _ in range(2)]
            comm = SingleComm()
            comm.agrees_on_device = False
            return compressed_allreduce(t, *buffers, comm)
    else:
        def call(t: torch.Tensor) -> torch.Tensor:
            return compcoll.hierarchical_allreduce(t, SingleComm(), ranks_per_node=1, seed=3, step=0)
    assert torch.equal(call(x).cpu(), call(x.cpu()))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call(x)
    torch.cuda.synchronize()
    assert not [e.name for e in prof.events() if "pin_memory" in e.name]


@pytest.mark.parametrize("protocol", ["gather_scatter", "allgather"])
def test_rounds_on_the_device_copy_nothing_up_in_a_steady_call(protocol: str) -> None:
    """A steady one-scale call whose rounds run on the device (``SingleComm``'s, as NCCL's) copies nothing from the
    host: the flat form and the hierarchical form with either protocol between nodes derive s_w and the server's
    weights in the encode's launch, reading the senders' sums at the ranks of the plan's table, copied up at its first
    call (``Workspace.constant``); with the rounds on host numbers ("single-host", MPI's path) the same calls copy
    the weights up, so that a profiler whose copies were not seen fails here. The same bits both ways."""
    from torch.profiler import ProfilerActivity, profile

    from compcoll.bench.one_rank import one_rank_comm

    x = torch.randn(100003, device="cuda")
    full = compcoll.padded_numel(x.numel(), 1)
    copies_up, results = {}, {}
    for kind in ("single", "single-host"):
        comm = one_rank_comm(kind)
        buffers = [torch.zeros(full, device="cuda") for _ in range(4)]
        calls = (lambda: compressed_allreduce(x, *buffers[:2], comm, protocol=protocol),
                 lambda: compcoll.hierarchical_compressed_allreduce(x, *buffers[2:], comm, ranks_per_node=1,
                                                                    protocol=protocol))
        for call in calls:
            call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            results[kind] = [call().cpu() for call in calls]
        copies_up[kind] = [e.name for e in prof.events() if "HtoD" in e.name]
    assert copies_up["single"] == [] and copies_up["single-host"], copies_up
    assert all(torch.equal(a, b) for a, b in zip(results["single"], results["single-host"]))


@pytest.mark.parametrize("summed", [False, True])
@pytest.mark.parametrize("block_size", [None, 64])
def test_an_nccl_call_synchronizes_once(summed: bool, block_size: int | None, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    """On a one-rank NCCL group a gather-scatter call's CUDA synchronizations (torch.profiler) are one: the
    agreement table's read (the sum written into its record on the device, ``Agreement.check_record``); with
    summed rounds (forced here at one rank; above 64 ranks) the sums' read, with the scales' all-gathered before
    it for one scale (a second read until the evening of 2026-12-01). Until 2026-12-01 the worker sum's read came
    first (two; three summed with one scale); before that the record's pageable ``.to(device)`` made one more."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    if summed:
        monkeypatch.setattr(compcoll.spec, "GATHERED_AGREEMENT_RANKS", 0)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        comm = compcoll.TorchComm()
        x = torch.randn(100003, device="cuda")
        we, se = torch.zeros(compcoll.padded_numel(x.numel(), 1), device="cuda"), torch.zeros(100008, device="cuda")
        want = compressed_allreduce(x, we.clone(), se.clone(), SingleComm(), block_size=block_size)
        assert torch.equal(compressed_allreduce(x, we, se, comm, block_size=block_size), want)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            compressed_allreduce(x, we, se, comm, block_size=block_size)
        assert comm.agrees_on_device
        assert _call_synchronizations(prof) == ["cudaStreamSynchronize"]
    finally:
        dist.destroy_process_group()


def _gpu_streams(prof: torch.profiler.profile, folder) -> set[int]:
    """The CUDA streams of every kernel, copy and fill in ``prof``'s trace (its Chrome trace's "stream" fields)."""
    import json

    path = folder / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    return {e["args"]["stream"] for e in events
            if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "stream" in e.get("args", {})}


@pytest.mark.parametrize("protocol", ["gather_scatter", "allgather"])
def test_blocking_nccl_collectives_run_on_the_calls_stream(protocol: str, tmp_path) -> None:
    """On a one-rank NCCL group a call's blocking collectives run on the call's own stream (``TorchComm.
    in_stream_order``: torch.distributed's blocking form, no event on NCCL's stream recorded and waited for): every
    kernel and copy of a call made on a fresh stream is on that stream; with the collectives issued asynchronously
    (the path until 2026-12-06) NCCL's own stream shows too, so that a trace whose streams were not seen fails here.
    The same bits both ways."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        comm = compcoll.TorchComm()
        assert comm.in_stream_order
        x = torch.randn(100003, device="cuda")
        full = compcoll.padded_numel(x.numel(), 1)
        streams, results = {}, {}
        for ordered in (True, False):
            comm.in_stream_order = ordered
            buffers = [torch.zeros(full, device="cuda") for _ in range(2)]
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                compressed_allreduce(x, *buffers, comm, protocol=protocol)
                side.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    results[ordered] = compressed_allreduce(x, *buffers, comm, protocol=protocol).cpu()
            streams[ordered] = _gpu_streams(prof, tmp_path)
        assert len(streams[True]) == 1 and len(streams[False]) > 1, streams
        assert torch.equal(results[True], results[False])
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("numel", [4096, 1 << 24])
def test_a_steady_sum_allocates_no_device_memory(numel: int) -> None:
    """A compensated sum's lane sums, tree level and total come from the thread's ``Temporaries`` of the stream:
    from the second call on, the caching allocator is asked for nothing (its allocation count stays)."""
    x, err = torch.randn(numel, device="cuda"), torch.randn(numel, device="cuda")
    first = codecs.compensated_sum(x, err)
    allocated = torch.cuda.memory_stats()["allocation.all.allocated"]
    assert codecs.compensated_sum(x, err) == first
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == allocated


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("numel", [4096, 100003, 1 << 24])
def test_meta_tensors_count_what_cuda_tensors_do(numel: int, launcher: str,
                                                 choose_launcher: Callable[[str], None]) -> None:
    """``scripts/cuda_launches.py``'s counts (meta tensors, nothing run) are the GPU's, for every protocol."""
    choose_launcher(launcher)
    on_gpu = call_counts(torch.randn(numel, device="cuda"), SingleComm(), torch.cuda.synchronize)
    assert call_counts(torch.empty(numel, device="meta"), SingleComm()) == on_gpu


@pytest.mark.parametrize("block_size", [None, 64])
@pytest.mark.parametrize("numel", [4096, 100003])
def test_a_call_replayed_from_a_cuda_graph_gives_the_eager_bits(numel: int, block_size: int | None) -> None:
    """Issue 39, item 4: ``bench/gpu_graphs.py`` replays ``FlatPlan.finish_flat`` / ``finish_blocks`` from a CUDA
    graph after an eager agreement; over 4 calls on fresh inputs its results and error buffers equal eager calls' bit
    for bit."""
    assert bench_script("gpu_graphs.py").measure(numel, steps=4, calls=3, runs=1, block_size=block_size)["same_bits"]


def test_the_queued_clock_times_the_device_alone_and_refuses_a_wait() -> None:
    """``compcoll.bench.clocks.QueuedClock``: a function that queues two spins around a slow host step (5 ms of
    sleep) reads as the two spins' device time, far below the host's 5 ms, where the idle clock reads the host's time
    too; a function that waits for the device is refused, and the clock times the next function again."""
    clock = QueuedClock()

    def spins() -> None:
        torch.cuda._sleep(1 << 20)
        time.sleep(0.005)
        torch.cuda._sleep(1 << 20)

    alone = clock(lambda: torch.cuda._sleep(1 << 20))
    assert clock(spins) < 3 * alone < 0.005 < idle_seconds(spins)
    with pytest.raises(RuntimeError, match="waits for the device"):
        clock(torch.cuda.synchronize)
    assert clock(lambda: torch.cuda._sleep(1 << 20)) < 2 * alone


def test_the_hosts_own_clock_takes_a_wait_for_the_device_out() -> None:
    """``compcoll.bench.clocks.own_host_seconds``: a function that queues a spin kernel (tens of milliseconds) and
    then reads a value through compcoll's one host read (``codecs.host_value``) takes that long by ``host_seconds``,
    and by the host's own clock far less (its wait out: ``kernels.launch.COUNTS.waited``)."""
    value = torch.ones(1, dtype=torch.float64, device="cuda")

    def spin_then_read() -> float:
        torch.cuda._sleep(1 << 26)
        return codecs.host_value(value)

    spin_then_read()
    assert own_host_seconds(spin_then_read) < 0.005 < 0.01 < host_seconds(spin_then_read)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("numel, block", [(37, 8), (8193, 64), (1 << 20, 128)])
def test_block_scales_on_cuda_equal_cpu(dtype: torch.dtype, numel: int, block: int) -> None:
    """The block-scale codecs (sums, scales, 8-bit codes, encode into framed rows, accumulate, with the weights
    decoded first or in the same launch, decode) and
    ``compressed_allreduce(block_size=...)`` with both protocols give the CPU's bits on CUDA tensors."""
    gen = torch.Generator().manual_seed(numel + block)
    x = (torch.randn(numel, generator=gen) * 3).to(dtype)
    full = -(-numel // 24) * 24
    blocks = -(-full // 3 // block)
    err = torch.randn(full, generator=gen) * 0.1
    results = {}
    for device in ("cpu", "cuda"):
        xd, ed = x.to(device), err.clone().to(device)
        sums = codecs.block_sums(xd, ed, block, "l2", 3)
        wire = torch.zeros(3, codecs.SCALE_BYTES + blocks + full // 24, dtype=torch.uint8, device=device)
        scales, signs = codecs.frame_scales(wire, sums, "l2", block, full // 3)
        codecs.encode_blocks(xd, ed, scales.view(-1), block, signs)
        decoded, bits = codecs.unframe_blocks(wire, blocks)
        acc = torch.empty(full // 3, device=device)
        codecs.accumulate_blocks(bits, codecs.divide_(decoded.clone(), 3), block, None, acc, full // 3)
        fused = torch.empty(full // 3, device=device)  # the weights decoded in the launch that adds
        codecs.accumulate_framed(wire, blocks, 3, block, None, fused, full // 3)
        out = torch.empty(full, device=device)
        codecs.decode_framed_blocks(wire, blocks, block, out)
        calls = []
        for protocol in ("gather_scatter", "allgather"):
            padded = -(-numel // 8) * 8
            errors = torch.zeros(padded, device=device), torch.zeros(padded, device=device)
            calls.append(compressed_allreduce(xd, *errors, SingleComm(), protocol=protocol, block_size=block).cpu())
        torch.cuda.synchronize()
        results[device] = (sums.cpu(), wire.cpu(), ed.cpu(), acc.cpu(), fused.cpu(), out.cpu(), *calls)
    for name, a, b in zip(("sums", "wire", "error", "accumulate", "accumulate framed", "decode", "gather-scatter",
                           "allgather"), results["cpu"], results["cuda"]):
        assert np.array_equal(a.view(torch.uint8).numpy(), b.view(torch.uint8).numpy()), name
    assert torch.equal(results["cuda"][3], results["cuda"][4]), "the fused accumulate is the two steps'"


@pytest.mark.parametrize("scale", ["l2", "l1"])
def test_the_server_step_keeps_its_scale_on_the_device(scale: str) -> None:
    """``serve`` on CUDA gives the CPU's wire rows and server error, and, queued behind a busy
    stream, returns while the stream is still busy: the server scale is summed, framed and
    read on the device, so the host never waits for the all-to-all."""
    gen = torch.Generator().manual_seed(5)
    chunk = 8200
    bits = torch.randint(0, 256, (chunk // 8,), dtype=torch.uint8, generator=gen)
    error = torch.randn(chunk, generator=gen)
    weights = torch.tensor([0.37])
    results = {}
    for device in ("cpu", "cuda"):
        server_error = error.clone().to(device)  # serve updates it in place: each device starts from the same
        rows = serve(bits.to(device), weights.to(device), server_error, SingleComm(), Workspace(), scale)
        results[device] = (rows.cpu(), server_error.cpu())
    assert torch.equal(results["cpu"][0], results["cuda"][0]) and torch.equal(results["cpu"][1], results["cuda"][1])

    on_device = bits.cuda(), weights.cuda(), error.cuda()  # a pageable copy waits for the stream: copy first
    torch.cuda.synchronize()
    torch.cuda._sleep(1 << 30)  # about half a second of the GPU's time on the current stream
    serve(*on_device, SingleComm(), Workspace(), scale)
    busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    assert busy, "serve waited for the device: a host round trip is left in the server step"


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_mpi_ranks_sharing_the_gpu(world_size: int) -> None:
    run(f"{WORKERS}:cuda_numerics", world_size, "mpi", args=(SHAPES, 2))


def test_nccl_at_world_size_one() -> None:
    run(f"{WORKERS}:cuda_numerics", 1, "nccl", args=(SHAPES, 2))


@pytest.mark.parametrize("backend, world_size, ranks_per_node", [("nccl", 1, None), ("mpi", 2, None), ("mpi", 2, 1)])
def test_replayed_calls_match_the_reference(backend: str, world_size: int, ranks_per_node: int | None) -> None:
    """Calls whose device part is replayed (``algorithms.replay``) give the reference's bits on CUDA tensors: NCCL's
    collectives recorded and issued again, and MPI's (two ranks sharing the GPU; flat, and the hierarchical forms
    on two nodes of one rank)."""
    run("tests.algorithms.replay_workers:replayed_matches_reference", world_size, backend,
        args=([37, 100003], 6, "cuda", ranks_per_node))


@pytest.mark.parametrize("world_size, ranks_per_node", [(2, None), (3, None), (2, 1)])
def test_rounds_on_the_device_replayed_match_the_reference_over_mpi(world_size: int,
                                                                    ranks_per_node: int | None) -> None:
    """NCCL's rounds (the record all-gathered on the device, s_w and the server's weights derived there in the
    encode's launch: ``codecs.compensate_encode_agreed``) on ranks sharing the GPU, which one NCCL group cannot:
    MPI's transport set to agree on the device, the flat forms and the hierarchical ones on nodes of one rank (both
    protocols between nodes), replayed; the reference's bits at every call."""
    run("tests.algorithms.replay_workers:replayed_on_the_device", world_size, "mpi",
        args=([37, 100003], 6, "cuda", ranks_per_node))


@pytest.mark.parametrize("backend, world_size", [("nccl", 1), ("mpi", 2)])
def test_birder_replayed_with_each_calls_keys_matches_the_reference(backend: str, world_size: int) -> None:
    """Birder's replayed calls on CUDA tensors, each with its own seed and step: the encoding kernel reads its
    stream's key from device memory (``codecs.stream_keys``), so the bits are the reference's at every call."""
    run("tests.algorithms.replay_workers:birder_replayed_matches_reference", world_size, backend,
        args=(100003, 6, "cuda", 1))


@pytest.mark.parametrize("protocol, block_size", [("gather_scatter", None), ("allgather", 64)])
def test_ddp_buckets_on_cuda_match_the_reference_over_nccl(protocol: str, block_size: int | None) -> None:
    """DDP on the GPU (NCCL, one rank): each bucket through ``onebit_hook`` equals the reference, error buffers
    too, as on CPU ranks."""
    run("tests.ddp.ddp_workers:onebit_matches_reference", 1, "nccl",
        args=(3, protocol, "l2", "auto", 1, block_size, "cuda"))


@NEEDS_FSDP_HOOK
def test_fsdp_reduce_scatters_on_cuda_match_the_reference_two_ranks_sharing_the_gpu() -> None:
    """FSDP2 on the GPU (the model where FSDP2's default mesh puts it): every compressed reduce-scatter equals the
    reference, for every op and precision of the CPU test. Two ranks over Gloo, as ``compcoll.init`` picks where a
    node has more ranks than GPUs: FSDP2 makes no reduce-scatter at one rank, and NCCL takes one GPU a rank."""
    run(f"{WORKERS}:fsdp_sharing_the_gpu", 2, "gloo", args=(3,))


def test_ddp_waits_for_the_hook_on_a_stream_of_its_own() -> None:
    run(f"{WORKERS}:ddp_on_a_stream_of_its_own", 1, "nccl", args=(4,))


def test_a_gathered_bucket_is_waited_for_on_the_reading_stream() -> None:
    """``ddp.buckets.gather`` (a resumed bucket's parts): a reader on another stream sees the part written on a
    stream held back by ``torch.cuda._sleep``, as DDP's copy out of the bucket must. The sum is read to the host on
    the reader's stream (the default stream waits for no other)."""
    from compcoll.ddp.buckets import gather

    buffer = torch.zeros(1 << 20, device="cuda")
    part = torch.futures.Future(devices=[buffer.device])
    with torch.cuda.stream(torch.cuda.Stream()):
        torch.cuda._sleep(1 << 28)
        buffer.fill_(1.0)
        part.set_result(buffer)
    gathered = gather([part], buffer)
    with torch.cuda.stream(torch.cuda.Stream()):
        total = gathered.wait().sum().item()
    assert total == buffer.numel(), "the reader did not wait for the part's stream"


@pytest.mark.parametrize("world_size", [1, 2])
def test_optimizers_on_cuda_equal_cpu_over_mpi(world_size: int) -> None:
    run(f"{WORKERS}:optimizers_on_cuda_equal_cpu", world_size, "mpi", args=(9,))


def test_optimizers_on_cuda_equal_cpu_over_nccl() -> None:
    run(f"{WORKERS}:optimizers_on_cuda_equal_cpu", 1, "nccl", args=(9,))


def test_buffers_broadcast_on_cuda_over_mpi() -> None:
    run("tests.optim.buffers_workers:buffers_become_roots", 2, "mpi", args=(1, "cuda"))


@pytest.mark.parametrize("world_size", [1, 2])
def test_cupy_arrays_over_mpi(world_size: int) -> None:
    pytest.importorskip("cupy")
    run(f"{WORKERS}:cupy_arrays", world_size, "mpi", args=(4,))


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("start, device", [("cpu", "cuda"), ("cuda", "cpu")])
def test_optimizers_follow_models_between_cpu_and_cuda(world_size: int, start: str, device: str) -> None:
    run("tests.optim.follow_workers:built_then_changed", world_size, "mpi", args=(start, device, list(CHANGES)))


@pytest.mark.parametrize("start, device", [("cpu", "cuda"), ("cuda", "cpu")])
def test_optimizers_moved_mid_run_equal_never_moved(start: str, device: str) -> None:
    """Within rounding of never moved: the optimizers' CUDA steps round as torch's CUDA kernels do (on the H100 on
    2026-11-25 they differed from the CPU's bits from the first warmup step)."""
    run("tests.optim.follow_workers:moved_mid_run", 1, "mpi", args=(start, device))


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("bits", [1, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reduce_scatter_on_cuda_equals_cpu(dtype: torch.dtype, bits: int, launcher: str,
                                           choose_launcher: Callable[[str], None]) -> None:
    """compressed_reduce_scatter on one rank, three steps: CUDA's outputs and error buffer are the CPU's bits."""
    from compcoll.algorithms.reduce_scatter import compressed_reduce_scatter, row_elements

    choose_launcher(launcher)
    numel = 100003
    results = {}
    for device in ("cpu", "cuda"):
        error = torch.zeros(row_elements(numel, 1), device=device)
        outs = []
        for step in range(3):
            x = (torch.randn(numel, generator=torch.Generator().manual_seed(step)) * 3).to(dtype).to(device)
            out = torch.empty(numel, dtype=dtype, device=device)
            compressed_reduce_scatter(x, out, error, SingleComm(), bits=bits, op="premul_sum", factor=0.3)
            outs.append(out.cpu())
        results[device] = (torch.stack(outs), error.cpu())
    assert torch.equal(results["cpu"][0].view(torch.uint8), results["cuda"][0].view(torch.uint8)), "outputs"
    assert torch.equal(results["cpu"][1], results["cuda"][1]), "error buffer"


def test_a_state_dict_on_cuda_waits_for_the_calls_in_flight() -> None:
    """``CompressedAllreduce.state_dict`` during asynchronous calls on CUDA (their side stream) copies the buffers
    they leave (``launch.settle_device``), as on the CPU (tests/algorithms/test_onebit.py)."""
    stateful = compcoll.CompressedAllreduce(SingleComm())
    xs = [torch.randn(1 << 22, generator=torch.Generator().manual_seed(step)).cuda() for step in range(3)]
    stateful(xs[0], key="w")
    works = [stateful(x, key="w", async_op=True) for x in xs[1:]]
    during = unpacked(stateful.state_dict())["buffers"]["w"]["worker_error"]
    for work in works:
        work.wait()
    torch.cuda.synchronize()
    assert torch.equal(during, unpacked(stateful.state_dict())["buffers"]["w"]["worker_error"])


def test_buffers_loaded_from_checkpoint_files_follow_cuda_tensors(tmp_path) -> None:
    run(f"{WORKERS}:checkpoint_files_on_cuda", 1, "gloo", args=(str(tmp_path),))
