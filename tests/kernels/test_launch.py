"""kernels.launch on the CPU: the launcher's choice.

The counts under the simulator are checked by ``cuda_sim_checks`` (tests/kernels/test_cuda.py); the launches
themselves on a GPU (tests/gpu).
"""

from __future__ import annotations

import pytest

from compcoll.kernels.launch import LAUNCHER_ENV, launcher


def test_the_launcher_is_chosen_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LAUNCHER_ENV, raising=False)
    assert launcher() == "bound"
    monkeypatch.setenv(LAUNCHER_ENV, "numba")
    assert launcher() == "numba"
    monkeypatch.setenv(LAUNCHER_ENV, "fast")
    with pytest.raises(ValueError, match="COMPCOLL_CUDA_LAUNCHER='fast'"):
        launcher()
