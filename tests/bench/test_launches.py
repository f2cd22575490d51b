"""Launch, wrap, wait and torch-operator counts of each protocol's CUDA path, traced on meta tensors (no GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Callable

import pytest
import torch

from compcoll import SingleComm, codecs, spec
from compcoll.algorithms.replay import REPLAY_ENV
from compcoll.bench.launches import PROTOCOLS, _reads_to_host, call_counts, world_counts
from compcoll.ddp.onebit import BLOCK_SIZE
from compcoll.kernels.cuda.scales import CODE_SCALES_PER_THREAD, CODE_THREADS
from compcoll.kernels.cuda.sums import TAIL
from compcoll.kernels.launch import COUNTS
from compcoll.spec import BLOCK, LANES

GROUPED = TAIL // LANES * BLOCK
"""Elements (1M) past which a sum's lane sums exceed ``TAIL``, so that its last blocks add them in groups
(``kernels.cuda.sums._finish_lanes``), in the same launch: each sum took one more launch (``_collapse``) until
2026-12-01."""
SPLITTING = CODE_THREADS * CODE_SCALES_PER_THREAD * BLOCK_SIZE
"""Elements of a row (131072 at one rank) past which its block scales are coded by several blocks in two launches
(``kernels.cuda.scales.code_blocks``): one more launch for each coding of the block forms' scales (gather-scatter
codes the worker's rows and the server's, allgather its one row)."""
EXPECTED = {"gather_scatter": (5, 1, 2, 1), "allgather": (3, 1, 1, 1), "hierarchical": (6, 1, 4, 1),
            "birder": (9, 1, 6, 1), "gather_scatter_blocks": (8, 1, 2, 1), "allgather_blocks": (4, 1, 1, 1),
            "gather_scatter_levels": (9, 1, 2, 1), "hierarchical_allgather": (4, 1, 3, 1)}
"""(launches, waits, torch operators, device allocations) per protocol, below and past ``GROUPED``. The launches are
those the H200 read (bench/results/gpu_kernels_h200_fused.txt), but for the hierarchical form's node average, one kernel
since (``codecs.average_rows``, in place of a copy, k - 1 additions and a division by torch), Birder's row maxima (3
launches fewer since 2026-12-05) and the received rows' weights (the block forms' 1 launch fewer, Birder's 2, since
2026-12-05), which no GPU has run yet; so are the waits, but for Birder's finite check, which was not counted then. With
block scales (the DDP hook's default) each coding of the scales (their roots, the row's largest, the 8-bit codes, the
frame: ``codecs.frame_scales``) is one launch at any length, and the received rows' weights are decoded by the launch
that accumulates them (``codecs.accumulate_framed``; a launch of ``codecs.unframe_blocks`` before it until 2026-12-05),
a coding two past ``SPLITTING`` (the last decoding and the result's decode one launch together:
``codecs.decode_framed_blocks``), where torch took 87 operators (gather-scatter) and 47 (allgather) until 2026-11-28. At
one rank the torch operators include the transport's copies: gather-scatter's 2 are its exchanges'. ``SingleComm``'s
rounds run on the device (``SingleComm.agrees_on_device``), where a round of one rank gathers nothing (its record is its
table), and the flat and hierarchical forms' encode with one scale derives s_w and the weights from the record's
sum in its launch (the server's scale goes into its frame head in the launch that sums it, and the decode reads the
heads): until 2026-12-06 its rounds ran on host numbers, and one more operator copied the weights to the device.
Birder's three encodes write their scales into the frame heads themselves (``codecs.randomized_encode``), and its two
exchanges read their weights s / size from the heads in the launch that
averages the rows (``codecs.accumulate_framed`` with no codes; a launch of ``codecs.unframe`` with a divisor before it
until 2026-12-05), where torch took a copy each, and a copy, a fill and a division (15 operators until 2026-11-28); one
of its 6 is the copy of the call's three random streams' keys to the device (``codecs.stream_keys``, since 2026-11-30:
its kernels read them there, so that its calls replay). Its three row maxima are one launch each (``codecs.row_absmax``:
the last block to finish reduces the rows; a second launch of a block a row until 2026-12-05). The block forms' finite
check of their block statistics and Birder's of its row maxima are written by the kernel that computes them
(``codecs.block_sums``, ``block_absmax`` and ``row_absmax`` with ``finite``; a torch sum over them until 2026-12-04, one
operator more). The allocations: the result's alone (no ``out`` here). The kernels' temporaries, and the sums nobody
reads back (the total behind a device scale, the allgather protocol's and Birder's), come from the thread's
``workspace.Temporaries`` of the stream (4 more a flat gather-scatter call, 7 a Birder call, until 2026-11-29); the
codecs' results that live across codec calls (Birder's row maxima and its exchanges' weights, the block forms' block
sums and decoded scales) from the plan's ``Workspace`` (5 more a Birder call and a gather-scatter call with block
scales, 3 an allgather one, until 2026-11-29). With 4-bit levels the two codings of the steps are those of the block
scales, and the decode of the served rows is one launch (one a rank until 2026-11-29: 9 + n launches at n ranks); its
torch operators are the transport's two copies alone: the steps' float32 multiplies are the scale coder's
(``codecs.frame_scales`` with ``bits``; by torch until 2026-12-04, and until 2026-11-29 by a tensor of the factor,
copied from the host at each multiply), and the weights' division by n the scales' decode (since 2026-12-04: a fill and
a division fewer). The hierarchical form with the allgather protocol between nodes averages the k shards' rows in one
launch (``codecs.accumulate_groups``; one a shard until 2026-11-29: 3 + k launches)."""
PADDED_NODE_ROWS = 2
"""Torch operators the compensated hierarchical forms' node average makes where the tensor is not whole shards (at
one rank: a length not a multiple of 8): its copy into a buffer of whole shards and the padding's fill
(``exact.shard_average``; for every length until 2026-12-05). A 16-bit tensor of whole shards is copied (cast) alone."""
NODE_AVERAGED = {"hierarchical", "hierarchical_allgather"}
"""The calls whose node average is ``exact.shard_average``. With the rounds on the device (NCCL's) their first round,
before the node average, reads its table too (``Agreement.check_signatures``): a second counted wait from two ranks on
(at one rank there is no such round: nothing to agree with). Over NCCL it was a second wait before 2026-12-05 too,
uncounted: NCCL copied the host record up and the table back."""
CAST_16_BIT = {"allgather", "allgather_blocks", "gather_scatter_levels", "hierarchical_allgather"}
"""Calls that average into float32 and cast that into a 16-bit result: one more torch operator."""


@pytest.mark.parametrize("numel", [1, 4096, 100003, SPLITTING, SPLITTING + 1, GROUPED, GROUPED + 1,
                                   3 * (1 << 26) + 5])
def test_each_protocol_makes_the_launches_and_waits_of_the_gpu(numel: int) -> None:
    """Issue 39's aim for flat gather-scatter, at most 5 launches and 1 host wait a call, holds at every length
    (past ``GROUPED`` two collapses made 7 until 2026-12-01). The block forms take one more launch per coding of
    their scales past ``SPLITTING``; the compensated hierarchical forms ``PADDED_NODE_ROWS`` more torch operators
    where the length is not whole shards."""
    counts = call_counts(torch.empty(numel, device="meta"), SingleComm())
    expected = dict(EXPECTED)
    if numel % 8:
        for protocol in NODE_AVERAGED:
            launches, waits, operators, allocations = expected[protocol]
            expected[protocol] = (launches, waits, operators + PADDED_NODE_ROWS, allocations)
    if numel > SPLITTING:
        for protocol, codings in (("gather_scatter_blocks", 2), ("allgather_blocks", 1), ("gather_scatter_levels", 2)):
            launches, waits, operators, allocations = expected[protocol]
            expected[protocol] = (launches + codings, waits, operators, allocations)
    assert {p: (c["launches"], c["waits"], c["torch"], c["allocations"]) for p, c in counts.items()} == expected
    assert all(c["wraps"] == 0 for c in counts.values()), counts


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_16_bit_call_makes_a_float32_calls_launches_and_operators(dtype: torch.dtype) -> None:
    """The decodes round their scales to the output's dtype in their own launch (``kernels.cuda.frames.decode_framed``,
    ``decode_framed_blocks``): no torch operator reads, rounds or negates a scale (the float32 averages of
    ``CAST_16_BIT`` alone are cast, once each; so is the input of ``NODE_AVERAGED``)."""
    counts = call_counts(torch.empty(4096, device="meta", dtype=dtype), SingleComm())
    expected = {p: {"launches": n, "wraps": 0, "waits": w, "torch": t + (p in CAST_16_BIT) + (p in NODE_AVERAGED),
                    "allocations": a}
                for p, (n, w, t, a) in EXPECTED.items()}
    assert counts == expected


@pytest.mark.parametrize("ranks, ranks_per_node", [(2, 1), (6, 3), (8, 2)])
def test_a_rank_of_a_world_makes_the_launches_and_waits_of_one_rank(ranks: int, ranks_per_node: int) -> None:
    """On meta tensors over an in-process world (flat, and 2 or 4 nodes): each rank's launches and waits do not
    grow with the ranks or the ranks a node; they are one rank's. The levels' decode took a launch a rank, and the
    hierarchical allgather's average one a shard, until 2026-11-29."""
    counts = world_counts(4096, ranks, ranks_per_node)
    assert {p: (c["launches"], c["waits"]) for p, c in counts.items()} == {
        p: (n, w) for p, (n, w, _, _) in EXPECTED.items()}
    assert all(c["wraps"] == 0 for c in counts.values()), counts


@pytest.mark.parametrize("ranks, ranks_per_node", [(2, 1), (8, 2)])
def test_a_round_on_the_device_launches_nothing_of_its_own(ranks: int, ranks_per_node: int) -> None:
    """With the agreement round on the device (NCCL's: ``Communicator.agrees_on_device``) every protocol's call
    waits once for the round's table (the compensated hierarchical forms twice: ``NODE_AVERAGED``), and launches
    what one rank's call launches on a transport of host tensors: the call's device part writes its sum into the
    record's own field (``Agreement.slot``). Until the evening of 2026-12-01 one more launch wrote the record beside
    the sum; before 2026-12-01 an NCCL call read its sum and then the table: two waits, the second uncounted (the
    transport's copy back of a host round)."""
    counts = world_counts(4096, ranks, ranks_per_node, on_device=True)
    assert {p: (c["launches"], c["waits"]) for p, c in counts.items()} == {
        p: (n, w + (p in NODE_AVERAGED)) for p, (n, w, _, _) in EXPECTED.items()}


def test_a_summed_round_on_the_device_waits_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rounds that are allreduces (above 64 ranks; forced here at 2) on the device: the sums, this rank's record
    and, for a call that agrees on a value (the worker's scale), the values all-gathered on the device are read in
    one wait (the compensated hierarchical forms' first round, before the node average, in one more). Until the
    evening of 2026-12-01 the values' all-gather came after the sums' read: a second wait for the calls with one
    scale (gather-scatter, allgather, both hierarchical forms). On a transport of host tensors
    the sum's read stays the only wait; over NCCL until 2026-12-01 that read came with two more, uncounted (the
    host allreduce's and the values' copies back)."""
    monkeypatch.setattr(spec, "GATHERED_AGREEMENT_RANKS", 0)
    counts = world_counts(4096, 2, 1, on_device=True)
    assert {p: (c["launches"], c["waits"]) for p, c in counts.items()} == {
        p: (n, w + (p in NODE_AVERAGED)) for p, (n, w, _, _) in EXPECTED.items()}
    assert {p: c["waits"] for p, c in world_counts(4096, 2, 1).items()} == {p: 1 for p in EXPECTED}


def test_numbas_dispatcher_wraps_each_tensor_argument(choose_launcher: Callable[[str], None]) -> None:
    """Under numba's launcher (``COMPCOLL_CUDA_LAUNCHER=numba``) each launch's tensors are wrapped: more wraps than
    launches."""
    choose_launcher("numba")
    counts = call_counts(torch.empty(100003, device="meta"), SingleComm())
    assert all(c["wraps"] > c["launches"] > 0 for c in counts.values()), counts


def test_a_finite_check_on_a_device_is_a_counted_wait() -> None:
    """``codecs.all_finite`` reads its answer back through ``kernels.launch`` (meta: counted, and True)."""
    COUNTS.reset()
    assert codecs.all_finite(torch.empty(5, device="meta"))
    assert (COUNTS.launches, COUNTS.waits) == (0, 1)
    assert not codecs.all_finite(torch.tensor([1.0, float("nan")]))


def test_a_read_to_the_host_is_the_calls_wait_not_a_torch_operator() -> None:
    """A value read to the host (``.item()``, or ``.tolist()``'s copy to the CPU, as ``kernels.launch`` reads a sum)
    counts as the call's wait alone, which meta tensors count too without reading: on the H200 on 2026-12-04 every
    CUDA call counted one torch operator more than on meta (the read's ``_to_copy``). A copy between devices, or to a
    device, stays device work."""
    ops = torch.ops.aten
    assert _reads_to_host(ops._to_copy.default, torch.zeros(2))
    assert _reads_to_host(ops._local_scalar_dense.default, 1.0)
    assert not _reads_to_host(ops._to_copy.default, torch.empty(2, device="meta"))
    assert not _reads_to_host(ops.copy_.default, torch.zeros(2))


def test_the_script_prints_one_object_keyed_by_protocol() -> None:
    """``python scripts/cuda_launches.py --json``: the README's table, as JSON."""
    out = subprocess.run([sys.executable, "scripts/cuda_launches.py", "--numel", "4096", "--json"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    counts = json.loads(out)
    assert tuple(counts) == PROTOCOLS
    assert counts["gather_scatter"] == {"launches": 5, "wraps": 0, "waits": 1, "torch": 3, "allocations": 1}


def test_the_script_adds_host_microseconds_with_time() -> None:
    """``--time`` adds a positive ``host_us`` to each protocol's counts (a figure to compare, never asserted)."""
    command = [sys.executable, "scripts/cuda_launches.py", "--numel", "37", "--json", "--time", "--runs", "1",
               "--calls", "2"]
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300).stdout
    counts = json.loads(out)
    assert tuple(counts) == PROTOCOLS and all(c["host_us"] > 0 for c in counts.values()), counts


def test_the_script_adds_compcolls_python_calls_and_replays_cut_them() -> None:
    """``--python`` adds each protocol's calls of compcoll's own Python functions a steady call: a count, so the
    same in two runs; replays make every protocol's fewer than replays off."""
    command = [sys.executable, "scripts/cuda_launches.py", "--numel", "4096", "--json", "--python"]

    def calls(flag: str) -> dict[str, float]:
        out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300,
                             env={**os.environ, REPLAY_ENV: flag}).stdout
        return {name: c["python"] for name, c in json.loads(out).items()}

    on, off = calls("1"), calls("0")
    assert calls("1") == on
    assert tuple(on) == PROTOCOLS and all(0 < on[p] < off[p] for p in PROTOCOLS), (on, off)


def test_the_script_counts_nccls_path_at_one_rank_with_on_device() -> None:
    """``--on-device`` at one rank (NCCL's agreement rounds, on the device): every protocol makes the launches and
    the one wait it makes with the round on the host; the flat and hierarchical forms with one scale copy no weights
    to the device (their encode derives them from the round's sums; the hierarchical allgather form's since
    2026-12-06, by the senders' table): one torch operator fewer. A round of one
    rank gathers nothing (the record is its table) and the compensated hierarchical forms' first round
    (``NODE_AVERAGED``, ``Agreement.check_signatures``) is none at one rank; until 2026-12-06 the record's all-gather
    was one device copy more, and those forms' first round a second wait."""
    command = [sys.executable, "scripts/cuda_launches.py", "--numel", "4096", "--json"]
    host, device = (json.loads(subprocess.run(command + extra, capture_output=True, text=True, check=True,
                                              timeout=300).stdout) for extra in ([], ["--on-device"]))
    assert tuple(device) == PROTOCOLS
    for name in PROTOCOLS:
        assert {k: device[name][k] for k in ("launches", "wraps")} == {
            k: host[name][k] for k in ("launches", "wraps")}, (name, host[name], device[name])
        derived = name in ("gather_scatter", "allgather", "hierarchical", "hierarchical_allgather")
        assert host[name]["waits"] == device[name]["waits"] == 1, name
        assert device[name]["torch"] == host[name]["torch"] - derived, name
        assert device[name]["allocations"] == host[name]["allocations"] == 1, name
