"""Mixed precision at 1-3 ranks: GradScaler overflows skipped alike with equal loss scales; 16-bit parameters."""

from __future__ import annotations

import pytest

from tests.pool import run

from .test_optimizers import NAMES, RESUME_AT

WORKERS = "tests.optim.amp_workers"


@pytest.mark.parametrize("name", NAMES)
def test_grad_scaler_overflow_on_one_rank_skips_everywhere(name: str) -> None:
    run(f"{WORKERS}:grad_scaler", 3, "mpi", args=(name,))


def test_grad_scaler_over_gloo_and_alone() -> None:
    run(f"{WORKERS}:grad_scaler", 2, "gloo", args=("ZeroOneAdam",))
    run(f"{WORKERS}:grad_scaler", 1, "mpi", args=("OneBitAdam",))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sixteen_bit_parameters_keep_float32_masters(name: str, dtype: str) -> None:
    run(f"{WORKERS}:half_parameters", 2, "threads", args=(name, dtype, RESUME_AT[name][1]))


def test_sixteen_bit_parameters_on_mpi() -> None:
    run(f"{WORKERS}:half_parameters", 3, "mpi", args=("OneBitLamb", "bfloat16", RESUME_AT["OneBitLamb"][1]))
