"""compcoll.fsdp on real FSDP2 (fully_shard) over real Gloo ranks.

The reduce-scatter form at 2-4 ranks, HSDP 2 x 2; compcoll's optimizers refuse its sharded parameters.
"""

from __future__ import annotations

import pytest

from tests.pool import run
from tests.versions import NEEDS_FSDP_HOOK

pytestmark = NEEDS_FSDP_HOOK
WORKERS = "tests.fsdp.fsdp_workers"


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_reduce_scatter_matches_reference_for_every_op_and_precision(world_size: int) -> None:
    run(f"{WORKERS}:reduce_scatter", world_size, "gloo", args=(3,))


def test_reduce_scatter_with_nccls_rounds_on_the_device_matches_reference() -> None:
    """The state's rounds as over NCCL (``Communicator.agrees_on_device``), on 3 Gloo ranks, which NCCL cannot run
    on one GPU: every case's reduce-scatters the reference's, every plan's round on the device."""
    run(f"{WORKERS}:reduce_scatter", 3, "gloo", args=(3, "cpu", True))


@pytest.mark.parametrize("world_size", [2, 3])
def test_compress_resumes_exactly_and_a_nan_reaches_every_rank(world_size: int, tmp_path) -> None:
    run(f"{WORKERS}:training", world_size, "gloo", args=(6, str(tmp_path)))


def test_replicas_form_on_two_by_two_ranks(tmp_path) -> None:
    run(f"{WORKERS}:replicas", 4, "gloo", args=(5, str(tmp_path)))


def test_fsdps_replicate_is_refused_naming_the_form_that_compresses_it() -> None:
    pytest.importorskip("torch.distributed._composable.replicate_with_fsdp")
    run(f"{WORKERS}:replicated", 2, "gloo", args=(3,))


def test_reduce_ops_read_as_each_torch_gives_them() -> None:
    run(f"{WORKERS}:reduce_ops_as_each_torch_gives_them", 2, "gloo")


def test_fully_shards_options_keep_the_reference() -> None:
    run(f"{WORKERS}:fsdp_options", 3, "gloo", args=(3,))


def test_the_optimizers_refuse_sharded_parameters() -> None:
    run(f"{WORKERS}:optimizers_refuse_sharded_parameters", 2, "gloo")


def test_states_with_different_start_steps_fail_at_construction() -> None:
    run(f"{WORKERS}:states_refuse_different_start_steps", 2, "gloo")


def test_compressing_a_model_twice_warns_that_the_first_state_is_left_behind() -> None:
    run(f"{WORKERS}:compress_twice_warns", 2, "gloo")


def test_another_ranks_state_loads_with_its_error_buffers_restarted() -> None:
    run(f"{WORKERS}:another_ranks_state_restarts_errors", 2, "gloo")


def test_a_compiled_model_compresses_with_the_eager_bits() -> None:
    run(f"{WORKERS}:compiled_model_compresses", 2, "gloo")


def test_compress_reduces_over_fsdps_own_group_beside_tensor_parallelism_and_native_hsdp() -> None:
    run(f"{WORKERS}:meshes", 4, "gloo", args=(3,))
