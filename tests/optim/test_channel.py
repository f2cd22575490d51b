"""ErrorFeedbackChannel's choice of algorithm over real ranks."""

from __future__ import annotations

import pytest

from compcoll.launcher import BACKENDS
from tests.pool import run


@pytest.mark.parametrize("backend", BACKENDS)
def test_layout_disagreement_raises_on_every_rank(backend: str) -> None:
    run("tests.optim.channel_workers:layout_disagreement", 2, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_ranks_per_node_on_one_rank_raises_on_every_rank(backend: str) -> None:
    run("tests.optim.channel_workers:bad_request_on_one_rank", 3, backend)


def test_ranks_that_cannot_form_equal_nodes_go_flat() -> None:
    run("tests.optim.channel_workers:uneven_nodes_go_flat", 3, "mpi")


@pytest.mark.parametrize("backend, world_size", [("mpi", 4), ("gloo", 6)])
def test_auto_protocol_is_allgather_between_two_members_and_a_bad_one_raises(backend: str, world_size: int) -> None:
    run("tests.optim.channel_workers:protocol_choice", world_size, backend)
