"""The four optimizers on 1-4 ranks: identical replicas, exact resume, non-finite steps skipped, unused coordinates.

The ranks are threads of this process (``backend="threads"``, the bits of MPI and Gloo ranks:
tests/comm/test_local.py); each optimizer also trains on real MPI and real Gloo ranks.
"""

from __future__ import annotations

import pytest

from tests.pool import run

from .optim_workers import STEPS

WORKERS = "tests.optim.optim_workers"
IN = "threads"
NAMES = ["OneBitAdam", "OneBitLamb", "ZeroOneAdam", "Birder"]
# a warmup / variance-phase step and a compression / local-phase step (ZeroOneAdam: between syncs)
RESUME_AT = {"OneBitAdam": (2, 9), "OneBitLamb": (3, 9), "ZeroOneAdam": (5, 11), "Birder": (1, 9),
             "OneBitLamb layers": (3, 9), "OneBitAdam bc": (2, 9), "ZeroOneAdam bc": (5, 11)}
WITH_LAYERS = [*NAMES, "OneBitLamb layers"]
"""The optimizers, and 1-bit LAMB with a 1-bit scale per layer (its channel has one plan per layer)."""
RESUMED = [*WITH_LAYERS, "OneBitAdam bc", "ZeroOneAdam bc"]
"""Those, and the Adams with bias correction (its step counts come back from the saved counters)."""


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("world_size, transport", [(1, IN), (2, IN), (3, IN), (4, IN), (2, "mpi")])
def test_replicas_stay_identical_and_unused_coordinates_untouched(name: str, world_size: int, transport: str) -> None:
    run(f"{WORKERS}:replicas", world_size, transport, args=(name,))


@pytest.mark.parametrize("name", WITH_LAYERS)
def test_replicas_over_gloo_with_two_nodes(name: str) -> None:
    run(f"{WORKERS}:replicas", 4, "gloo", args=(name,), env={"COMPCOLL_RANKS_PER_NODE": "2"})


@pytest.mark.parametrize("name", RESUMED)
def test_exact_resume_in_both_phases_and_both_orders(name: str) -> None:
    for at in RESUME_AT[name]:
        run(f"{WORKERS}:resume", 4 if name.startswith("ZeroOneAdam") else 3, IN, args=(name, at))


def test_zero_one_adam_resumes_between_syncs_over_gloo() -> None:
    run(f"{WORKERS}:resume", 4, "gloo", args=("ZeroOneAdam", RESUME_AT["ZeroOneAdam"][1]))


@pytest.mark.parametrize("name", WITH_LAYERS)
@pytest.mark.parametrize("policy", ["skip", "raise"])
def test_nonfinite_gradient_skips_alike(name: str, policy: str) -> None:
    for at in RESUME_AT[name]:
        run(f"{WORKERS}:nonfinite", 2, IN, args=(name, at, policy))


def test_nonfinite_gradient_skips_alike_on_mpi() -> None:
    run(f"{WORKERS}:nonfinite", 3, "mpi", args=("OneBitAdam", RESUME_AT["OneBitAdam"][1], "skip"))


@pytest.mark.parametrize("change", ["resume", "lr"])
@pytest.mark.parametrize("name, world_size, transport", [(name, 2, IN) for name in WITH_LAYERS]
                         + [("OneBitAdam", 3, IN), ("ZeroOneAdam", 2, "mpi"), ("OneBitLamb", 2, "gloo")])
def test_ranks_out_of_step_raise_on_every_rank(name: str, world_size: int, transport: str, change: str) -> None:
    """Ranks resumed from saves of different steps, or with a learning rate changed on rank 0 only."""
    run(f"{WORKERS}:step_mismatch", world_size, transport, args=(name, change))


@pytest.mark.parametrize("name", NAMES)
def test_different_models_raise_on_every_rank(name: str) -> None:
    run(f"{WORKERS}:layout_mismatch", 2, IN, args=(name,))


@pytest.mark.parametrize("name, option", [(name, option) for name in ("OneBitAdam", "OneBitLamb", "ZeroOneAdam")
                                          for option in ("compress", "protocol")]
                         + [("OneBitLamb", "variance_refresh"), ("OneBitLamb", "layer_scales"),
                            ("OneBitAdam", "bias_correction"), ("ZeroOneAdam", "bias_correction"),
                            ("OneBitAdam", "freeze_step"), ("ZeroOneAdam", "local_step_clipper"),
                            ("OneBitLamb", "factor_max"), ("Birder", "seed"), ("OneBitAdam", "hierarchical"),
                            ("ZeroOneAdam", "nonfinite"), ("Birder", "nonfinite"),
                            ("OneBitAdam", "lr"), ("Birder", "weight_decay"), ("OneBitLamb", "weight_decay")])
def test_different_options_raise_on_every_rank(name: str, option: str) -> None:
    run(f"{WORKERS}:option_mismatch", 2, IN, args=(name, option))


@pytest.mark.parametrize("name, option, bad, transport", [("OneBitAdam", "lr", -1.0, "mpi"),
                                                          ("ZeroOneAdam", "local_step_clipper", 0, "gloo"),
                                                          ("Birder", "seed", "x", IN), ("OneBitLamb", "params", 0, IN),
                                                          ("OneBitAdam", "hierarchical", "yes", IN)])
def test_a_bad_argument_on_one_rank_fails_every_rank_at_once(name: str, option: str, bad, transport: str) -> None:
    """The construction's local checks run in the ranks' first round (``rounds.checked``): 3 ranks, rank 1's bad."""
    run(f"{WORKERS}:refused_construction", 3, transport, args=(name, option, bad))


@pytest.mark.parametrize("name, option, transport", [("OneBitLamb", "factor_max", "mpi"),
                                                     ("ZeroOneAdam", "nonfinite", "gloo"),
                                                     ("OneBitAdam", "freeze_step", IN)])
def test_different_settings_are_named_on_three_ranks(name: str, option: str, transport: str) -> None:
    """A setting that differs (one that changes what a step computes, which collectives it makes, or what it does
    with a NaN) fails the construction on every rank, naming the setting and which ranks hold each value."""
    run(f"{WORKERS}:option_mismatch", 3, transport, args=(name, option))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_onebit_adam_matches_simulation(world_size: int) -> None:
    run(f"{WORKERS}:onebit_adam_reference", world_size, IN, args=(3, 8))


@pytest.mark.parametrize("compress, scale", [("momentum", "l2"), ("update", "l2")])
def test_onebit_adam_options_match_simulation(compress: str, scale: str) -> None:
    run(f"{WORKERS}:onebit_adam_reference", 3, IN, args=(3, 8, 0, compress, scale))


@pytest.mark.parametrize("compress", ["update", "momentum"])
def test_onebit_adam_bias_correction_matches_simulation(compress: str) -> None:
    run(f"{WORKERS}:onebit_adam_reference", 3, IN, args=(3, 8, 0, compress, "l1", True))


@pytest.mark.parametrize("world_size, ranks_per_node, protocol", [(4, 2, "auto"), (6, 2, "auto"),
                                                                  (6, 3, "gather_scatter"), (6, 2, "allgather")])
def test_onebit_adam_hierarchical_matches_simulation(world_size: int, ranks_per_node: int, protocol: str) -> None:
    """2 nodes: "auto" is allgather between them; 3 nodes: gather-scatter."""
    run(f"{WORKERS}:onebit_adam_reference", world_size, IN,
        args=(3, 8, ranks_per_node, "update", "l1", False, protocol),
        env={"COMPCOLL_RANKS_PER_NODE": str(ranks_per_node)})


@pytest.mark.parametrize("world_size", [1, 3])
def test_zero_one_adam_synchronize_between_syncs(world_size: int) -> None:
    run(f"{WORKERS}:synchronize_between_syncs", world_size, IN, args=(11,))


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_zero_one_adam_matches_simulation(world_size: int) -> None:
    run(f"{WORKERS}:zero_one_adam_reference", world_size, IN, args=(STEPS,))


def test_zero_one_adam_compressing_the_momentum_matches_simulation() -> None:
    run(f"{WORKERS}:zero_one_adam_reference", 3, IN, args=(STEPS, "momentum", "l2"))


@pytest.mark.parametrize("compress", ["update", "momentum"])
def test_zero_one_adam_bias_correction_matches_simulation(compress: str) -> None:
    """Corrected steps stay within the floor's bound in the update form's run; the momentum form's run floors v."""
    run(f"{WORKERS}:zero_one_adam_reference", 3, IN, args=(STEPS, compress, "l1", True, compress == "momentum"))


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_birder_matches_simulation(world_size: int) -> None:
    run(f"{WORKERS}:birder_reference", world_size, IN, args=(8,))


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_onebit_lamb_matches_simulation(world_size: int) -> None:
    run(f"{WORKERS}:onebit_lamb_reference", world_size, IN, args=(10,))


@pytest.mark.parametrize("compress, scale, trust_ratio",
                         [("momentum", "l2", "frozen"), ("update", "l2", "fresh"), ("update", "l1", "frozen")])
def test_onebit_lamb_options_match_simulation(compress: str, scale: str, trust_ratio: str) -> None:
    run(f"{WORKERS}:onebit_lamb_reference", 3, IN, args=(10, compress, scale, trust_ratio))


@pytest.mark.parametrize("world_size, compress, trust_ratio, protocol, refresh, layer_scales",
                         [(3, "update", "fresh", "allgather", 2, False), (4, "update", "fresh", "allgather", 0, False),
                          (2, "momentum", "frozen", "gather_scatter", 3, False),
                          (1, "update", "frozen", "allgather", 2, False), (4, "update", "fresh", "allgather", 3, True),
                          (3, "momentum", "frozen", "gather_scatter", 0, True),
                          (2, "update", "fresh", "allgather", 0, True),
                          (1, "update", "fresh", "gather_scatter", 2, True)])
def test_onebit_lamb_protocol_refresh_and_layer_scales_match_simulation(
        world_size: int, compress: str, trust_ratio: str, protocol: str, refresh: int, layer_scales: bool) -> None:
    run(f"{WORKERS}:onebit_lamb_reference", world_size, IN, args=(12, compress, "l1", trust_ratio, protocol,
                                                                  refresh, layer_scales))
