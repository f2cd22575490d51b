"""bench/scaling/scale.py: the rows each world size trains, and gaps taken against the baseline at the same n."""

from __future__ import annotations

import pytest

from tests.bench import bench_script


@pytest.fixture(scope="module")
def scale():
    """The benchmark script as a module (it puts bench/convergence on the path, whose ``run`` lists the runs)."""
    return bench_script("scaling/scale.py", "scaling_bench")


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


def test_the_lr_part_sets_each_run_against_its_baseline_at_the_same_rate_and_best_against_best(scale,
                                                                                               monkeypatch) -> None:
    """Every learning rate of a row runs, its baseline named with the same rate; baselines at the first n only; the
    summary takes each optimizer's best against its baseline's best, whatever their rates."""
    import argparse

    args = argparse.Namespace(ranks=[2, 16], adam_lrs=[1e-3, 4e-3], lamb_lrs=[5e-3], steps=400, only=None)
    rows = {}
    monkeypatch.setattr(scale, "train_rows", lambda args, rows_at, launch, metric: rows.update(
        {n: rows_at(n) for n in args.ranks}) or {"runs": [], "table": ""})
    scale.lr_part(args)
    names = {n: [(r["name"], r["baseline"], r["kwargs"]["lr"]) for r in found] for n, found in rows.items()}
    assert ("1-bit Adam lr=0.004", "Adam lr=0.004", 4e-3) in names[2]
    assert ("1-bit LAMB lr=0.005", "LAMB lr=0.005", 5e-3) in names[16]
    assert [name for name, _, _ in names[16]] == [
        "1-bit Adam lr=0.001", "1-bit Adam lr=0.004", "1-bit Adam bc lr=0.001", "1-bit Adam bc lr=0.004",
        "0/1 Adam lr=0.001", "0/1 Adam lr=0.004", "0/1 Adam bc lr=0.001", "0/1 Adam bc lr=0.004",
        "1-bit LAMB lr=0.005"]
    assert len(names[2]) == len(names[16]) + 3
    assert [r["kwargs"].get("bias_correction") for r in rows[16][:4]] == [None, None, True, True]
    args.only = ["1-bit Adam bc"]
    scale.lr_part(args)
    assert [r["name"] for r in rows[2]] == ["1-bit Adam bc lr=0.001", "1-bit Adam bc lr=0.004"]

    def run(name: str, baseline: str | None, n: int, lr: float, loss: float) -> dict:
        return {"name": f"{name} lr={lr:g}", "baseline": baseline and f"{baseline} lr={lr:g}", "n": n,
                "kwargs": {"lr": lr}, "curve": [{"val_loss": loss}]}

    table = scale.lr_report([run("Adam", None, 2, 1e-3, 2.0), run("Adam", None, 2, 4e-3, 1.6),
                             run("1-bit Adam", "Adam", 2, 1e-3, 1.92), run("1-bit Adam", "Adam", 2, 4e-3, 2.4),
                             run("1-bit Adam", "Adam", 16, 1e-3, 1.76)]).splitlines()
    assert table[2].split()[-4:] == ["1.9200", "at", "0.001", "+20.0%"]
    assert table[3].split()[:2] == ["16", "1-bit"] and table[3].endswith("+10.0%")


def test_the_stages_part_runs_each_exact_row_once_and_splits_a_gap_into_its_three_factors(scale, monkeypatch) -> None:
    """Baselines and frozen-variance rows (exact averages) run at the first n only, the hierarchical rows from two
    nodes of 8 on, the other compressed rows at every n; the report's factors are ratios of losses: frozen v /
    baseline, allgather / frozen v, gather-scatter / allgather, gather-scatter / baseline in all, and the
    hierarchical run / baseline."""
    import argparse

    args = argparse.Namespace(ranks=[2, 8, 16], adam_lrs=[2e-3], lamb_lrs=[1e-2], steps=400, only=None)
    rows = {}
    monkeypatch.setattr(scale, "train_rows", lambda args, rows_at, launch, metric: rows.update(
        {n: rows_at(n) for n in args.ranks}) or {"runs": [], "table": ""})
    scale.stages_part(args)
    assert [r["name"] for r in rows[16]] == ["1-bit Adam bc allgather lr=0.002",
                                             "1-bit Adam bc gather-scatter lr=0.002", "1-bit Adam bc 8/node lr=0.002",
                                             "1-bit LAMB allgather lr=0.01", "1-bit LAMB gather-scatter lr=0.01",
                                             "1-bit LAMB 8/node lr=0.01"]
    assert [r["name"] for r in rows[8]] == [r["name"] for r in rows[16] if "8/node" not in r["name"]]
    assert rows[16][2]["kwargs"]["ranks_per_node"] == rows[16][5]["kwargs"]["ranks_per_node"] == 8
    by_name = {r["name"]: r for r in rows[2]}
    assert len(by_name) == 8
    frozen = by_name["Adam frozen v bc lr=0.002"]
    assert (frozen["optimizer"], frozen["baseline"], frozen["kwargs"]["bias_correction"]) == (
        "FrozenVarianceAdam", "Adam lr=0.002", True)
    assert by_name["1-bit Adam bc allgather lr=0.002"]["kwargs"]["protocol"] == "allgather"
    assert by_name["1-bit Adam bc gather-scatter lr=0.002"]["kwargs"]["protocol"] == "gather_scatter"
    assert by_name["1-bit LAMB gather-scatter lr=0.01"]["kwargs"]["protocol"] == "gather_scatter"
    assert by_name["1-bit LAMB gather-scatter lr=0.01"]["kwargs"]["lr"] == 1e-2
    assert "protocol" not in rows[16][2]["kwargs"]
    assert by_name["LAMB frozen v lr=0.01"]["optimizer"] == "FrozenVarianceLamb"
    assert by_name["1-bit LAMB allgather lr=0.01"]["kwargs"]["lr"] == 1e-2

    def run(name: str, n: int, loss: float) -> dict:
        return {"name": f"{name} lr=0.002", "n": n, "kwargs": {"lr": 2e-3}, "curve": [{"val_loss": loss}]}

    table = scale.stage_report([run("Adam", 2, 1.0), run("Adam frozen v bc", 2, 1.1),
                                run("1-bit Adam bc allgather", 2, 1.21), run("1-bit Adam bc gather-scatter", 2, 1.21),
                                run("1-bit Adam bc allgather", 16, 1.32),
                                run("1-bit Adam bc gather-scatter", 16, 1.452),
                                run("1-bit Adam bc 8/node", 16, 1.05)])
    lines = table.splitlines()
    assert lines[1].split()[-5:] == ["+10.0%", "+10.0%", "+0.0%", "+21.0%", "-"]
    assert lines[2].split()[:3] == ["16", "Adam", "0.002"]
    assert lines[2].split()[-5:] == ["+10.0%", "+20.0%", "+10.0%", "+45.2%", "+5.0%"]
    assert len(lines) == 3
