"""The package: ``import compcoll`` alone reaches every subpackage the docs name (``compcoll.ddp.onebit_hook``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import compcoll

REACHED = """
import sys
import compcoll
eager = sorted(n for n in ("compcoll.ddp", "compcoll.optim", "compcoll.fsdp", "compcoll.launcher") if n in sys.modules)
assert not eager, f"import compcoll imported {eager}"
compcoll.ddp.OneBitState, compcoll.ddp.onebit_hook, compcoll.ddp.local_hook
compcoll.optim.OneBitAdam, compcoll.checkpoint.save, compcoll.launcher.run_threads, compcoll.integrations
compcoll.fsdp.compress
print("reached")
"""


def test_a_plain_import_reaches_the_subpackages() -> None:
    """In a fresh interpreter, after ``import compcoll`` and nothing else (no test has imported the subpackages there),
    the README's one-liners resolve: ``compcoll.ddp.OneBitState()``, ``compcoll.fsdp.compress``,
    ``compcoll.optim.OneBitAdam``; and ``import compcoll`` itself imported none of them."""
    done = subprocess.run([sys.executable, "-c", REACHED], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "reached", done.stderr[-2000:]


def test_other_names_still_raise_and_dir_lists_the_subpackages() -> None:
    with pytest.raises(AttributeError, match="no attribute 'onebit_hook'"):
        compcoll.onebit_hook  # noqa: B018
    assert {"ddp", "optim", "fsdp", "TorchComm"} <= set(dir(compcoll))
