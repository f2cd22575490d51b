"""bench/convergence runs end to end on a short schedule and writes its table, JSON and plot.

Its ranks are in-process: the optimizers on real MPI and Gloo ranks are tests/optim's.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests import background


def short_run(folder: Path) -> tuple[list[list[str]], dict[str, str]]:
    """The run, as a background job (``tests/background.py``), writing into the job's folder."""
    return [[sys.executable, "bench/convergence/run.py", "--ranks", "2", "--steps", "40", "--eval-every", "20",
             "--hidden", "32", "--eps", "1e-4", "--backend", "threads", "--out", str(folder / "conv")]], \
        dict(os.environ)


@background.job(short_run)
def test_short_convergence_run_writes_results() -> None:
    finished = background.results(short_run, timeout=900)
    [done] = finished.outcomes
    assert done.returncode == 0, done.output + done.errors
    out = finished.folder / "conv"
    runs = json.loads(out.with_suffix(".json").read_text())["runs"]
    assert [r["name"] for r in runs] == ["Adam", "1-bit Adam", "Adam frozen v", "1-bit Adam bf16", "1-bit Adam m",
                                         "0/1 Adam", "0/1 Adam exact", "0/1 Adam clipper 1", "Birder exact", "Birder",
                                         "LAMB", "LAMB frozen v", "1-bit LAMB", "1-bit LAMB m", "1-bit LAMB refresh"]
    by_name = {r["name"]: r for r in runs}
    plain = by_name["Adam"]["bytes_per_rank"][0]
    assert by_name["Birder"]["bytes_per_rank"][0] * 20 < plain
    assert by_name["Birder exact"]["bytes_per_rank"][0] >= plain
    assert by_name["LAMB frozen v"]["bytes_per_rank"][0] > by_name["1-bit LAMB"]["bytes_per_rank"][0] * 4
    assert by_name["Adam frozen v"]["bytes_per_rank"][0] > by_name["1-bit Adam"]["bytes_per_rank"][0] * 4
    assert by_name["0/1 Adam exact"]["bytes_per_rank"][0] > by_name["0/1 Adam"]["bytes_per_rank"][0] * 2
    assert by_name["1-bit Adam"]["bytes_per_rank"][0] < plain
    for r in runs:
        assert r["curve"][-1]["train_loss"] < r["curve"][0]["train_loss"], r["name"]
    table = out.with_suffix(".txt").read_text()
    assert "reduction" in table and out.with_suffix(".png").stat().st_size > 10000
