"""compcoll.ddp.onebit_hook under real DDP: the reference per bucket, exact resume, NaN steps, DDP's options.

On threads of torch's own multi-threaded process group at 1-4 ranks (DDP's real buckets,
in one process), and on real Gloo ranks.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from compcoll import launcher

from tests.ddp import ddp_workers
from tests.ddp.threaded_group import run_threaded_group
from tests.pool import run

WORKERS = "tests.ddp.ddp_workers"


def on(backend: str, target: str, world_size: int, *args) -> None:
    """``target`` of ddp_workers on ``world_size`` ranks: threads of torch's threaded group, or Gloo processes."""
    if backend == "threads":
        run_threaded_group(getattr(ddp_workers, target), world_size, *args)
    else:
        run(f"{WORKERS}:{target}", world_size, backend, args=args)


@pytest.mark.parametrize("backend, world_size", [("threads", 1), ("threads", 2), ("threads", 3), ("threads", 4),
                                                 ("gloo", 3)])
def test_buckets_match_the_reference(backend: str, world_size: int) -> None:
    on(backend, "onebit_matches_reference", world_size, 5, "allgather", "l1")


def test_gather_scatter_with_the_l2_scale_matches_the_reference() -> None:
    on("threads", "onebit_matches_reference", 3, 4, "gather_scatter", "l2")


@pytest.mark.parametrize("backend, world_size, protocol", [("threads", 3, "gather_scatter"),
                                                           ("threads", 2, "allgather"), ("gloo", 2, "gather_scatter")])
def test_block_scales_match_the_reference(backend: str, world_size: int, protocol: str) -> None:
    on(backend, "onebit_matches_reference", world_size, 4, protocol, "l2", "auto", 1, 64)


def test_float64_complex_and_sparse_buckets_match_the_reference() -> None:
    """``OddModel``: a float64 bucket compressed through float32 (the reference on its float32 copy), a complex64
    weight's bucket (float32 pairs), and a sparse gradient's bucket by DDP's own allreduce (on Gloo: torch's threaded
    group answers a sparse allreduce with the rank's own tensor)."""
    on("gloo", "onebit_matches_reference", 3, 4, "gather_scatter", "l2", "auto", 1, 64, "cpu", False, True)


def test_torchs_composable_replicate_takes_the_hook() -> None:
    """DDP through ``torch.distributed._composable.replicate(model)`` (as torchtitan applies it): the hook given to
    ``model.register_comm_hook`` reaches the DDP built at the first forward, and every bucket equals the reference."""
    pytest.importorskip("torch.distributed._composable.replicate")
    on("gloo", "onebit_matches_reference", 2, 4, "gather_scatter", "l2", "auto", 1, 64, "cpu", False, False, True)


def test_states_built_before_init_process_group_bind_at_the_first_bucket() -> None:
    """As Lightning builds them (``DDPStrategy(ddp_comm_state=OneBitState(), ddp_comm_hook=onebit_hook)``, which
    raised "Default process group has not been initialized" before 2026-12-03), also pickled and unpickled before
    init: on 2 threads of torch's threaded group and, under torchrun, on 2 Gloo processes, both states take the
    default group at the hook's first bucket and train with the bits of states built after it."""
    run_threaded_group(ddp_workers.states_built_before_init, 2, 4,
                       before_init=lambda rank: ddp_workers.built_before_init())
    command = [str(Path(sys.executable).parent / "torchrun"), "--master-port", str(launcher._free_port()),
               "--nproc-per-node", "2", "-m", "tests.ddp.before_init"]
    done = subprocess.run(command, cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(2):
        assert f"rank {rank}: the states built before init_process_group trained the same bits" in done.stdout, \
            done.stdout


def test_a_state_saved_whole_resumes_when_loaded_before_init_process_group(tmp_path) -> None:
    """``torch.save(state)`` by 2 ranks of torch's threaded group; 2 new ranks ``torch.load`` it before they join
    their group, and it resumes at the first bucket with the bits of the run that went on (before 2026-12-03 its
    unpickling raised there: it loaded its state at once, and that needed the group)."""
    run_threaded_group(ddp_workers.onebit_pickled_for_a_new_process, 2, str(tmp_path))
    run_threaded_group(ddp_workers.onebit_loaded_before_init, 2, str(tmp_path),
                       before_init=lambda rank: torch.load(tmp_path / f"rank{rank}.pt", weights_only=False))


def test_lightnings_spawning_launcher_carries_a_state_built_before_init() -> None:
    """tests/ddp/lightning_spawn.py where Lightning is installed: ``DDPStrategy(start_method="spawn",
    ddp_comm_state=OneBitState(), ...)`` on 2 Gloo ranks (before 2026-12-03 the launcher's pickling of the state
    raised "torch.distributed is not initialized" in the parent); each spawned rank's state compresses."""
    pytest.importorskip("lightning")
    done = subprocess.run([sys.executable, "-m", "tests.ddp.lightning_spawn"], cwd=Path(__file__).parents[2],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(2):
        assert f"rank {rank}: the spawned OneBitState compressed; replicas bit-identical" in done.stdout, \
            done.stdout + done.stderr


def test_hierarchical_form_matches_the_reference() -> None:
    run(f"{WORKERS}:onebit_matches_reference", 4, "gloo", args=(4, "allgather", "l2", 2))


@pytest.mark.parametrize("world_size, protocol, ranks_per_node, block_size", [
    (3, "gather_scatter", "auto", 64), (3, "gather_scatter", "auto", None), (2, "allgather", "auto", None),
    (4, "gather_scatter", 2, None)])
def test_buckets_with_nccls_rounds_on_the_device_match_the_reference(world_size: int, protocol: str,
                                                                     ranks_per_node: int | str,
                                                                     block_size: int | None) -> None:
    """The hook's rounds as over NCCL (``Communicator.agrees_on_device``: the record all-gathered where the bucket
    is, and for one scale s_w and the server's weights derived in the encode's launch), on Gloo ranks, which NCCL
    cannot run on one GPU: the default block scales, one scale over both protocols, and the hierarchical form on
    nodes of 2; every bucket the reference's."""
    nodes_of = 1 if ranks_per_node == "auto" else ranks_per_node
    run(f"{WORKERS}:onebit_matches_reference", world_size, "gloo",
        args=(4, protocol, "l2", ranks_per_node, nodes_of, block_size, "cpu", False, False, False, True))


@pytest.mark.parametrize("backend, world_size", [("threads", 2), ("threads", 3), ("gloo", 2)])
def test_resume_is_exact(backend: str, world_size: int, tmp_path) -> None:
    on(backend, "onebit_resumes_exactly", world_size, str(tmp_path))


def test_hierarchical_resume_is_exact(tmp_path) -> None:
    on("threads", "onebit_resumes_exactly", 4, str(tmp_path), 2)


def test_another_world_size_resumes_with_fresh_error_buffers(tmp_path) -> None:
    """An elastic restart: the hook state saved by 3 Gloo ranks loads on 2 and on 4."""
    run(f"{WORKERS}:onebit_saves_every_rank", 3, "gloo", args=(str(tmp_path),))
    for size in (2, 4):
        run(f"{WORKERS}:onebit_resumes_on_another_world_size", size, "gloo", args=(str(tmp_path), 3))


def test_a_compiled_model_keeps_the_hook() -> None:
    run(f"{WORKERS}:compiled_model_keeps_the_hook", 2, "gloo")


def test_the_python_reducer_takes_local_hook_and_refuses_onebit_hook() -> None:
    """On processes of its own: compiled autograd, once a hook raised under it, leaves a process where a later
    compiled model's forward lost its inputs (a pooled rank's next case failed)."""
    launcher.run(f"{WORKERS}:python_reducer", 2, "gloo", timeout=180)


@pytest.mark.parametrize("backend", ["threads", "gloo"])
def test_a_nan_skips_the_step_on_every_rank(backend: str) -> None:
    on(backend, "nan_skips_on_every_rank", 3)


@pytest.mark.parametrize("backend, world_size", [("threads", 2), ("gloo", 2)])
def test_ddp_options_users_set_keep_the_hooks_bits(backend: str, world_size: int) -> None:
    on(backend, "ddp_options_keep_the_hook", world_size)


@pytest.mark.parametrize("backend, world_size", [("threads", 3), ("gloo", 2)])
def test_uneven_inputs_under_ddps_join_step_as_on_zero_gradients(backend: str, world_size: int) -> None:
    on(backend, "uneven_inputs_under_ddp_join", world_size)


@pytest.mark.parametrize("backend, world_size", [("threads", 2), ("gloo", 3)])
def test_states_with_different_schedules_fail_at_construction(backend: str, world_size: int) -> None:
    on(backend, "states_refuse_different_schedules", world_size)


@pytest.mark.parametrize("backend, world_size", [("threads", 2), ("gloo", 2)])
def test_a_state_follows_a_new_ddp_over_a_changed_model(backend: str, world_size: int) -> None:
    on(backend, "rewrapped_model", world_size)


@pytest.mark.parametrize("backend, world_size", [("threads", 2), ("gloo", 2)])
def test_a_state_shared_by_two_models_fails_on_every_rank(backend: str, world_size: int) -> None:
    on(backend, "state_shared_by_two_models", world_size)


@pytest.mark.parametrize("backend", ["threads", "gloo"])
def test_a_state_on_another_group_than_ddps_fails_on_every_rank(backend: str) -> None:
    on(backend, "state_on_another_group_than_ddps", 4)


def test_states_take_a_device_mesh() -> None:
    on("gloo", "states_take_a_device_mesh", 4)
