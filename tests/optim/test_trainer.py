"""The Hugging Face Trainer trial (needs transformers; skipped elsewhere): 1-bit Adam trains and resumes under it."""

from __future__ import annotations

import json

import pytest

from tests.pool import run

pytest.importorskip("transformers")
pytest.importorskip("accelerate")


def test_onebit_adam_trains_and_resumes_under_the_trainer(tmp_path) -> None:
    """2 Gloo ranks, 60 steps of a 2-layer byte-level GPT-2: 1-bit Adam (warmup 15% of the run, local_hook) ends
    within 10% of AdamW's eval loss, having moved the model (the Trainer moves it after the optimizer exists), and
    resumes from the Trainer's own checkpoint (rank 0's optimizer state on both ranks)."""
    run("tests.optim.trainer_workers:trains_and_resumes", 2, "gloo", args=(str(tmp_path),), timeout=900)
    losses = json.loads((tmp_path / "losses.json").read_text())
    adamw = losses["AdamW"]
    assert losses["1-bit Adam"] < 1.10 * adamw, losses
    assert losses["1-bit Adam resumed at 30"] < 1.10 * adamw, losses
    assert adamw < 4.0, f"AdamW did not train: {losses}"
