"""The examples run as their docstrings say, under mpiexec and torchrun, and end with identical replicas."""

from __future__ import annotations

import functools
import importlib.util
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from compcoll.launcher import _free_port, mpiexec_command
from tests.example_batch import MARK
from tests.versions import FSDP_COMPRESSES, NEEDS_FSDP_HOOK

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
    return _run([*mpiexec_command(), "-n", "3", sys.executable, "examples/train.py", "--optimizer",
                 ",".join(TRAINED), "--steps", "60"])


@pytest.mark.parametrize("optimizer", list(TRAINED))
def test_train_example_under_mpiexec(optimizer: str) -> None:
    """Every optimizer trains in one launch of 3 ranks (``--optimizer a,b,...``); each case reads its own line."""
    out = _train_run()
    assert f"{TRAINED[optimizer]} on 3 ranks: replicas bit-identical: True" in out, out


def test_train_example_under_torchrun() -> None:
    out = _torchrun_outputs()["train"]
    assert "ZeroOneAdam on 2 ranks: replicas bit-identical: True" in out, out


BATCHED = ("examples/custom_optimizer.py", "examples/direct_allreduce.py", "examples/overlap.py", "README.md")


def _sections(launch: list[str], entries: list[str]) -> list[str]:
    """Run ``entries`` (a script and its arguments each) one after another in one launch (``launch`` followed by
    ``tests/example_batch.py``); each entry's output, in order."""
    out = _run([*launch, "-m", "tests.example_batch", *entries])
    sections = re.split(rf"^{re.escape(MARK)}.*\n", out, flags=re.MULTILINE)[1:]
    assert len(sections) == len(entries), out
    return sections


@functools.lru_cache(maxsize=None)
def _batch_outputs() -> dict[str, str]:
    """The 2-rank examples and the README's example, run one after another in one launch of 2 MPI ranks: each
    one's output by its name."""
    with tempfile.TemporaryDirectory() as folder:
        readme = Path(folder) / "example.py"
        readme.write_text((ROOT / "README.md").read_text().split("```python\n", 1)[1].split("```", 1)[0])
        scripts = [str(readme) if name == "README.md" else name for name in BATCHED]
        return dict(zip(BATCHED, _sections([*mpiexec_command(), "-n", "2", sys.executable], scripts)))


TORCHRUN_BATCHED = {"train": "examples/train.py --optimizer zero_one_adam --steps 60",
                    "ddp": "examples/ddp.py --hook onebit,local --steps 60",
                    "fsdp": "examples/fsdp.py --steps 20",
                    "huggingface": "examples/huggingface_trainer.py --output-dir {folder}"}
"""The torchrun examples and their guides' arguments: one launch of 2 ranks runs them all, the Hugging Face one
last (where transformers is installed; the FSDP one where torch's FSDP2 takes compcoll's reduce-scatter)."""


@functools.lru_cache(maxsize=None)
def _torchrun_outputs() -> dict[str, str]:
    """The torchrun examples, one after another in one torchrun launch of 2 ranks: each one's output by its key."""
    names = [name for name in TORCHRUN_BATCHED if (name != "huggingface" or importlib.util.find_spec("transformers"))
             and (name != "fsdp" or FSDP_COMPRESSES)]
    with tempfile.TemporaryDirectory() as folder:
        entries = [TORCHRUN_BATCHED[name].format(folder=shlex.quote(folder)) for name in names]
        launch = _torchrun("--nproc-per-node", "2", "--log-dir", str(Path(folder) / "torchrun"))
        return dict(zip(names, _sections(launch, entries)))


def test_custom_optimizer_example_learns() -> None:
    out = _batch_outputs()["examples/custom_optimizer.py"]
    error = float(out.strip().splitlines()[-1].split(":")[-1])
    assert error < 0.1, out


def test_direct_allreduce_example() -> None:
    out = _batch_outputs()["examples/direct_allreduce.py"]
    assert out.strip().splitlines()[-1].split()[0] == "10", out


def test_overlap_example_keeps_replicas_identical() -> None:
    out = _batch_outputs()["examples/overlap.py"]
    assert "replicas bit-identical: True" in out and "started during backward" in out, out


@pytest.mark.parametrize("hook", ["onebit", "local"])
def test_ddp_example_under_torchrun(hook: str) -> None:
    """Both hooks train one after the other (``--hook onebit,local``); each case reads its own line."""
    out = _torchrun_outputs()["ddp"]
    assert f"{hook} on rank 0 of 2: replicas bit-identical: True" in out, out


def test_huggingface_trainer_example_under_torchrun() -> None:
    pytest.importorskip("transformers")
    out = _torchrun_outputs()["huggingface"]
    assert "compcoll Trainer: eval loss" in out and "replicas identical" in out, out


def test_readme_example_runs_on_two_ranks() -> None:
    """The README's ten-line example, as written, under mpiexec: every rank prints the same first values."""
    out = _batch_outputs()["README.md"]
    printed = re.findall(r"tensor\(\[[^\]]*\]\)", out)
    assert len(printed) == 2 and printed[0] == printed[1], out


@NEEDS_FSDP_HOOK
def test_fsdp_example_under_torchrun() -> None:
    """The example's default form on 2 ranks, resumed at half-way (the HSDP form and both forms' numerics are
    tests/fsdp's, on pooled ranks)."""
    out = _torchrun_outputs()["fsdp"]
    assert "reduce_scatter on rank 0 of 2: replicas bit-identical: True" in out and "compcoll's state sent" in out, out


@pytest.mark.parametrize("hook", [True, False])
def test_lightning_trains_one_bit_adam_on_cpus_with_the_hook_registered_at_train_start(hook: bool) -> None:
    """examples/lightning_trainer.py under Lightning's own launcher (2 Gloo ranks), where Lightning is installed:
    replicas bit-identical; without the hook (Lightning's ddp_comm_hook is CUDA-only) the optimizer warns that
    every rank handed it the same gradient, with it no warning."""
    pytest.importorskip("lightning")
    done = subprocess.run([sys.executable, "examples/lightning_trainer.py", "--devices", "2",
                           *([] if hook else ["--without-hook"])], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "replicas bit-identical on 2 ranks" in done.stdout, done.stdout
    assert ("every rank handed the optimizer the same gradient" in done.stderr) != hook, done.stderr[-2000:]


@pytest.mark.parametrize("optimizer, warmup", [("adam", 40), ("zeroone", 40), ("birder", 0), ("lamb", 4)])
def test_lightning_base_finetuning_adds_the_unfrozen_backbone(optimizer: str, warmup: int) -> None:
    """examples/lightning_finetuning.py under Lightning's own launcher (2 Gloo ranks), where Lightning is installed:
    BaseFinetuning unfreezes the backbone at epoch 1 (step 8) through add_param_group, which trains it with
    replicas bit-identical; 1-bit LAMB past its 4-step warm-up refuses it on both ranks, naming the step."""
    pytest.importorskip("lightning")
    done = subprocess.run([sys.executable, "examples/lightning_finetuning.py", "--devices", "2", "--optimizer",
                           optimizer, "--warmup", str(warmup)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    if optimizer == "lamb":
        assert done.returncode != 0 and done.stderr.count("add_param_group at step 8: its variance froze") == 2, \
            done.stderr[-3000:]
        return
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 groups, the backbone moved" in done.stdout and "bit-identical on 2 ranks" in done.stdout, done.stdout
