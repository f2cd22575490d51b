"""The examples run as their docstrings say, under mpiexec and torchrun, and end with identical replicas (three
launches, each a background job: ``tests/background.py``)."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import sys
from pathlib import Path

import pytest

from compcoll.launcher import _free_port, mpiexec
from tests import background
from tests.example_batch import MARK

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).parent / "torchrun"
TIMEOUT = 900
"""Seconds a test waits for its launch, which runs as a background job (``tests/background.py``)."""


def _torchrun(*args: str) -> list[str]:
    """The guides' torchrun command, on a free rendezvous port (torchrun's 29500 may be taken by a parallel run)."""
    return [str(TORCHRUN), "--master-port", str(_free_port()), *args]


def _output(make: background.Maker) -> str:
    """The standard output of ``make``'s one launch, which must have succeeded."""
    [done] = background.results(make, timeout=TIMEOUT).outcomes
    assert done.returncode == 0, done.output + done.errors
    return done.output


TRAINED = {"onebit_adam": "OneBitAdam", "onebit_lamb": "OneBitLamb", "zero_one_adam": "ZeroOneAdam",
           "birder": "Birder"}


def train_under_mpiexec(folder: Path) -> tuple[list[list[str]], dict[str, str]]:
    """Every optimizer in one launch of 3 MPI ranks (``--optimizer a,b,...``)."""
    return [[mpiexec(), "-n", "3", sys.executable, "examples/train.py", "--optimizer", ",".join(TRAINED),
             "--steps", "60"]], dict(os.environ)


@pytest.mark.parametrize("optimizer", list(TRAINED))
@background.job(train_under_mpiexec)
def test_train_example_under_mpiexec(optimizer: str) -> None:
    """Every optimizer trains in one launch of 3 ranks; each case reads its own line."""
    out = _output(train_under_mpiexec)
    assert f"{TRAINED[optimizer]} on 3 ranks: replicas bit-identical: True" in out, out


BATCHED = ("examples/custom_optimizer.py", "examples/direct_allreduce.py", "examples/overlap.py", "README.md")


def _sections(make: background.Maker, count: int) -> list[str]:
    """The outputs of the ``count`` entries that ``make``'s launch of ``tests/example_batch.py`` ran one after
    another, in order."""
    out = _output(make)
    sections = re.split(rf"^{re.escape(MARK)}.*\n", out, flags=re.MULTILINE)[1:]
    assert len(sections) == count, out
    return sections


def batch_under_mpiexec(folder: Path) -> tuple[list[list[str]], dict[str, str]]:
    """The 2-rank examples and the README's example (written into the job's folder), one after another in one
    launch of 2 MPI ranks."""
    readme = folder / "example.py"
    readme.write_text((ROOT / "README.md").read_text().split("```python\n", 1)[1].split("```", 1)[0])
    scripts = [str(readme) if name == "README.md" else name for name in BATCHED]
    return [[mpiexec(), "-n", "2", sys.executable, "-m", "tests.example_batch", *scripts]], dict(os.environ)


def _batch_outputs() -> dict[str, str]:
    """Each batched example's output by its name."""
    return dict(zip(BATCHED, _sections(batch_under_mpiexec, len(BATCHED))))


TORCHRUN_BATCHED = {"train": "examples/train.py --optimizer zero_one_adam --steps 60",
                    "ddp": "examples/ddp.py --hook onebit,local --steps 60",
                    "fsdp": "examples/fsdp.py --steps 20",
                    "huggingface": "examples/huggingface_trainer.py --output-dir {folder}"}
"""The torchrun examples and their guides' arguments: one launch of 2 ranks runs them all, the Hugging Face one
last (where transformers is installed)."""


def _torchrun_names() -> list[str]:
    return [name for name in TORCHRUN_BATCHED if name != "huggingface" or importlib.util.find_spec("transformers")]


def batch_under_torchrun(folder: Path) -> tuple[list[list[str]], dict[str, str]]:
    """The torchrun examples, one after another in one torchrun launch of 2 ranks (the Trainer's output in the job's
    folder)."""
    entries = [TORCHRUN_BATCHED[name].format(folder=shlex.quote(str(folder))) for name in _torchrun_names()]
    return [[*_torchrun("--nproc-per-node", "2"), "-m", "tests.example_batch", *entries]], dict(os.environ)


def _torchrun_outputs() -> dict[str, str]:
    """Each torchrun example's output by its key."""
    names = _torchrun_names()
    return dict(zip(names, _sections(batch_under_torchrun, len(names))))


@background.job(batch_under_torchrun)
def test_train_example_under_torchrun() -> None:
    out = _torchrun_outputs()["train"]
    assert "ZeroOneAdam on 2 ranks: replicas bit-identical: True" in out, out


@background.job(batch_under_mpiexec)
def test_custom_optimizer_example_learns() -> None:
    out = _batch_outputs()["examples/custom_optimizer.py"]
    error = float(out.strip().splitlines()[-1].split(":")[-1])
    assert error < 0.1, out


@background.job(batch_under_mpiexec)
def test_direct_allreduce_example() -> None:
    out = _batch_outputs()["examples/direct_allreduce.py"]
    assert out.strip().splitlines()[-1].split()[0] == "10", out


@background.job(batch_under_mpiexec)
def test_overlap_example_keeps_replicas_identical() -> None:
    out = _batch_outputs()["examples/overlap.py"]
    assert "replicas bit-identical: True" in out and "started during backward" in out, out


@pytest.mark.parametrize("hook", ["onebit", "local"])
@background.job(batch_under_torchrun)
def test_ddp_example_under_torchrun(hook: str) -> None:
    """Both hooks train one after the other (``--hook onebit,local``); each case reads its own line."""
    out = _torchrun_outputs()["ddp"]
    assert f"{hook} on rank 0 of 2: replicas bit-identical: True" in out, out


@background.job(batch_under_torchrun)
def test_huggingface_trainer_example_under_torchrun() -> None:
    pytest.importorskip("transformers")
    out = _torchrun_outputs()["huggingface"]
    assert "compcoll Trainer: eval loss" in out and "replicas identical" in out, out


@background.job(batch_under_mpiexec)
def test_readme_example_runs_on_two_ranks() -> None:
    """The README's ten-line example, as written, under mpiexec: every rank prints the same first values."""
    out = _batch_outputs()["README.md"]
    printed = re.findall(r"tensor\(\[[^\]]*\]\)", out)
    assert len(printed) == 2 and printed[0] == printed[1], out


@background.job(batch_under_torchrun)
def test_fsdp_example_under_torchrun() -> None:
    """The example's default form on 2 ranks, resumed at half-way (the HSDP form and both forms' numerics are
    tests/fsdp's, on pooled ranks)."""
    out = _torchrun_outputs()["fsdp"]
    assert "reduce_scatter on rank 0 of 2: replicas bit-identical: True" in out and "compcoll's state sent" in out, out
