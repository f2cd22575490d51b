"""The named-values option: its code, and a mismatch named alike on every rank, on threads, MPI and Gloo."""

from __future__ import annotations

import numpy as np
import pytest

from compcoll import spec
from compcoll.algorithms.differences import ranks_text, values_option
from tests.pool import run
from tests.worlds import worlds

WORKERS = "tests.algorithms.differences_workers"


def test_ranks_text_shortens_runs_of_three_or_more() -> None:
    assert ranks_text([0]) == "[0]"
    assert ranks_text([0, 1]) == "[0, 1]"
    assert ranks_text([0, 1, 2, 5, 7, 8, 9, 10]) == "[0-2, 5, 7-10]"
    assert ranks_text([3, 5, 6]) == "[3, 5, 6]"


def test_the_code_is_that_of_the_values_whatever_their_order() -> None:
    code = values_option("s", {"a": 1, "b": [0.9, "x"], "c": None}).code
    assert values_option("s", {"c": None, "b": [0.9, "x"], "a": 1}).code == code
    assert values_option("s", {"a": 1, "b": [0.9, "x"]}).code != code
    assert values_option("s", {"a": 1.0, "b": [0.9, "x"], "c": None}).code != code
    assert values_option("s", {"a": np.int64(1), "b": [np.float64(0.9), "x"], "c": None}).code == code
    with pytest.raises(TypeError, match="a setting must be a number, string, boolean, None or a list of them"):
        values_option("s", {"a": object()})


@pytest.mark.parametrize("backend, world_size", worlds((2, 3, 5), mpi=3, gloo=3))
def test_a_mismatch_names_the_value_and_its_ranks_alike_on_every_rank(backend: str, world_size: int) -> None:
    run(f"{WORKERS}:named_alike", world_size, backend, args=(False,))


def test_a_mismatch_is_named_where_the_round_is_an_allreduce(monkeypatch: pytest.MonkeyPatch) -> None:
    """As at more than 64 ranks (``spec.GATHERED_AGREEMENT_RANKS`` forced to 0 before the threads start: they share
    the module)."""
    monkeypatch.setattr(spec, "GATHERED_AGREEMENT_RANKS", 0)
    run(f"{WORKERS}:named_alike", 4, "threads", args=(True,))
