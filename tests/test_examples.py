"""The examples run as their docstrings say, under mpiexec and torchrun, and end with identical replicas."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

from compcoll.launcher import _free_port, mpiexec

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).parent / "torchrun"


def _torchrun(*args: str) -> list[str]:
    """The guides' torchrun command, on a free rendezvous port (torchrun's 29500 may be taken by a parallel run)."""
    return [str(TORCHRUN), "--master-port", str(_free_port()), *args]


def _run(command: list[str]) -> str:
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


TRAINED = {"onebit_adam": "OneBitAdam", "onebit_lamb": "OneBitLamb", "zero_one_adam": "ZeroOneAdam",
           "birder": "Birder"}


@functools.lru_cache(maxsize=None)
def _train_run() -> str:
    return _run([mpiexec(), "-n", "3", sys.executable, "examples/train.py", "--optimizer", ",".join(TRAINED),
                 "--steps", "60"])


@pytest.mark.parametrize("optimizer", list(TRAINED))
def test_train_example_under_mpiexec(optimizer: str) -> None:
    """Every optimizer trains in one launch of 3 ranks (``--optimizer a,b,...``); each case reads its own line."""
    out = _train_run()
    assert f"{TRAINED[optimizer]} on 3 ranks: replicas bit-identical: True" in out, out


def test_train_example_under_torchrun() -> None:
    out = _run(_torchrun("--nproc-per-node", "2", "examples/train.py", "--optimizer", "zero_one_adam",
                         "--steps", "60"))
    assert "ZeroOneAdam on 2 ranks: replicas bit-identical: True" in out


def test_custom_optimizer_example_learns() -> None:
    out = _run([mpiexec(), "-n", "2", sys.executable, "examples/custom_optimizer.py"])
    error = float(out.strip().splitlines()[-1].split(":")[-1])
    assert error < 0.1, out


def test_direct_allreduce_example() -> None:
    out = _run([mpiexec(), "-n", "2", sys.executable, "examples/direct_allreduce.py"])
    assert out.strip().splitlines()[-1].split()[0] == "10", out


def test_overlap_example_keeps_replicas_identical() -> None:
    out = _run([mpiexec(), "-n", "2", sys.executable, "examples/overlap.py"])
    assert "replicas bit-identical: True" in out and "started during backward" in out, out


@functools.lru_cache(maxsize=None)
def _ddp_run() -> str:
    return _run(_torchrun("--nproc-per-node", "2", "examples/ddp.py", "--hook", "onebit,local", "--steps", "60"))


@pytest.mark.parametrize("hook", ["onebit", "local"])
def test_ddp_example_under_torchrun(hook: str) -> None:
    """Both hooks train in one torchrun launch (``--hook onebit,local``); each case reads its own line."""
    out = _ddp_run()
    assert f"{hook} on rank 0 of 2: replicas bit-identical: True" in out, out


def test_huggingface_trainer_example_under_torchrun(tmp_path) -> None:
    pytest.importorskip("transformers")
    out = _run(_torchrun("--nproc-per-node", "2", "examples/huggingface_trainer.py", "--output-dir", str(tmp_path)))
    assert "compcoll Trainer: eval loss" in out and "replicas identical" in out, out


def test_readme_example_runs_on_two_ranks(tmp_path) -> None:
    """The README's ten-line example, as written, under mpiexec: every rank prints the same first values."""
    text = (ROOT / "README.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "example.py").write_text(code)
    out = _run([mpiexec(), "-n", "2", sys.executable, str(tmp_path / "example.py")])
    printed = re.findall(r"tensor\(\[[^\]]*\]\)", out)  # the ranks' lines may interleave
    assert len(printed) == 2 and printed[0] == printed[1], out


def test_fsdp_example_under_torchrun() -> None:
    """The example's default form on 2 ranks, resumed at half-way (the HSDP form and both forms' numerics are
    tests/fsdp's, on pooled ranks)."""
    out = _run(_torchrun("--nproc-per-node", "2", "examples/fsdp.py", "--steps", "20"))
    assert "reduce_scatter on rank 0 of 2: replicas bit-identical: True" in out and "compcoll's state sent" in out, out
