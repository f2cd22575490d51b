"""bench/scaling/scale.py: the rows each world size trains, and gaps taken against the baseline at the same n."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def scale():
    """The benchmark script as a module (it puts bench/convergence on the path, whose ``run`` lists the runs)."""
    spec = importlib.util.spec_from_file_location("scaling_bench", ROOT / "bench" / "scaling" / "scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_birders_exact_baseline_trains_at_every_n_and_adams_once(scale) -> None:
    """Adam and LAMB average every gradient exactly: one run serves every n. Birder's exact form averages each rank's
    own m / b, which changes with n, so it trains at every n, beside every compressed run."""
    from run import runs

    specs = {s["name"]: s for s in runs(400, 1e-8, 1e-3, 5e-3, False)}
    names = {n: [r["name"] for r in scale.optimizer_rows(specs, n, first=2)] for n in (2, 16, 64)}
    assert names[2] == list(scale.OPTIMIZER_ROWS)
    for n in (16, 64):
        assert names[n] == [name for name in scale.OPTIMIZER_ROWS if name not in ("Adam", "LAMB")]
    assert "Birder exact" in scale.PER_N_BASELINES


def test_a_gap_is_taken_against_the_baseline_at_the_same_n_else_the_one_run(scale) -> None:
    """A baseline run at this n is the one; a baseline run once (at the first n) serves every n."""
    def run(name: str, baseline: str | None, n: int, loss: float) -> dict:
        return {"name": name, "baseline": baseline, "n": n, "curve": [{"val_loss": loss}]}

    runs = [run("exact", None, 2, 2.0), run("adam", None, 2, 1.0), run("exact", None, 16, 3.0),
            run("birder", "exact", 16, 3.3), run("one-bit", "adam", 16, 1.1)]
    assert scale.gap(runs[3], runs, "val_loss") == pytest.approx(10.0)
    assert scale.gap(runs[4], runs, "val_loss") == pytest.approx(10.0)
