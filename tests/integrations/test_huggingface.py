"""compcoll under Hugging Face (needs transformers and accelerate; skipped elsewhere): 2 Gloo ranks, a tiny GPT-2."""

from __future__ import annotations

import json

import pytest

from tests.pool import run

pytest.importorskip("transformers")
pytest.importorskip("accelerate")


def test_trainer_trains_in_one_bit_and_resumes_exactly(tmp_path) -> None:
    """compcoll's Trainer: with the defaults within 5% of AdamW's eval loss, and so is an AdamW run switched to it
    from its checkpoint (AdamW's moments and step carried into 1-bit Adam); resumed from the Trainer's own checkpoint,
    the same bits as the run it interrupted; a 1-bit Adam passed in, with gradient accumulation and bf16, and SGD
    through onebit_hook train, SGD's resume (the hook's error buffers) exact too; under a torch GradScaler (what
    Accelerate's fp16 makes on GPUs), where rank 0 alone overflows at 2 steps, both ranks skip those and back off
    alike; every run ends with identical replicas (and loss scales); the default run's checkpoint resumes on 3 ranks
    (an elastic restart: error buffers at zero)."""
    run("tests.integrations.huggingface_workers:trainer_runs", 2, "gloo", args=(str(tmp_path),), timeout=900)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    print(json.dumps(ranks[0], indent=1))
    for name in ranks[0]:
        assert ranks[0][name] == ranks[1][name], f"{name}: replicas differ"
    runs = ranks[0]
    adamw = runs["AdamW"]["loss"]
    assert adamw < 4.0, f"AdamW did not train: {runs}"
    assert runs["default"]["loss"] < 1.05 * adamw, runs
    assert runs["AdamW, switched to 1-bit Adam at 30"]["loss"] < 1.05 * adamw, runs
    assert runs["default, resumed at 30"] == runs["default"], runs
    assert runs["OneBitAdam given, accumulation 2, bf16"]["loss"] < 1.10 * adamw, runs
    assert runs["SGD, onebit_hook"]["loss"] < 4.0, runs
    scaled = runs["OneBitAdam given, a loss scaler, rank 0 overflowing"]
    assert scaled["skipped"] == 2 and scaled["scale"] == 2.0 ** 14, scaled  # 2 OVERFLOW_STEPS, halved from 2^16
    assert scaled["loss"] < 1.10 * adamw, scaled
    assert runs["SGD, onebit_hook, resumed at 30"] == runs["SGD, onebit_hook"], runs

    run("tests.integrations.huggingface_workers:trainer_resumes_on_another_world_size", 3, "gloo",
        args=(str(tmp_path),), timeout=900)
    elastic = [json.loads((tmp_path / f"rank{r}.json").read_text())["default, resumed at 30 on 3 ranks"]
               for r in range(3)]
    assert elastic[0] == elastic[1] == elastic[2] and elastic[0]["loss"] < 1.05 * adamw, elastic


def test_a_compiled_model_gets_its_hook(tmp_path) -> None:
    """The Trainer's ``torch_compile=True`` and Accelerate's ``dynamo_backend``: the compiled model's DDP gets
    ``local_hook`` and 1-bit Adam trains; identical replicas."""
    run("tests.integrations.huggingface_workers:trainer_compiles", 2, "gloo", args=(str(tmp_path),), timeout=900)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text())["compiled"] for r in range(2)]
    assert ranks[0] == ranks[1], ranks
    run("tests.integrations.huggingface_workers:accelerate_compiles", 2, "gloo", timeout=900)


def test_accelerate_hook_accumulates_and_resumes_exactly(tmp_path) -> None:
    """Accelerate (gradient accumulation 2, bf16) with ``register_hook``: 1-bit Adam resumed through
    ``accelerator.load_state`` and ``compcoll.checkpoint.load`` ends with the uninterrupted run's bits; SGD through
    onebit_hook; identical replicas."""
    run("tests.integrations.huggingface_workers:accelerate_runs", 2, "gloo", args=(str(tmp_path),), timeout=900)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0] == ranks[1], ranks
    assert ranks[0]["1-bit Adam, resumed at 12"] == ranks[0]["1-bit Adam"], ranks[0]


def test_the_trainer_refuses_deepspeed(tmp_path) -> None:
    """Where DeepSpeed is installed (not in CI: transformers needs it to take a DeepSpeed config at all)."""
    pytest.importorskip("deepspeed")
    run("tests.integrations.huggingface_workers:trainer_refuses_deepspeed", 2, "gloo", args=(str(tmp_path),))


def test_register_hook_builds_its_state_on_ddps_group() -> None:
    run("tests.integrations.huggingface_workers:register_hook_takes_ddps_group", 4, "gloo")
