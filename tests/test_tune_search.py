"""Black-box search of a tuning problem (`moejax tune --search`) and the budget accounting."""

import json

import numpy as np
import pytest

from moejax.errors import ConfigError
from moejax.tune import TuneConfig, restore, tune
from moejax.tune import search as srch
from moejax.tune.loop import build_problem, hard_values

# held-out traces as many as the training ones: one compiled evaluation serves both
SMALL = dict(system="ep", params=("placement",), steps=4, traces=4, batch=4, eval_traces=4,
             tokens=16, every=2)


def test_repair_and_keys_respect_capacity():
    rng = np.random.default_rng(0)
    for _ in range(20):
        ids = srch.repair(rng.integers(0, 4, 32), 4, 8)
        assert np.bincount(ids, minlength=4).max() <= 8
        keys = srch.keys_to_ids(rng.random(32), 8)
        assert (np.bincount(keys, minlength=4) == 8).all()
    ok = np.arange(32) % 4
    assert (srch.repair(ok, 4, 8) == ok).all()  # a valid placement is left alone


@pytest.mark.parametrize("method", ["tpe", "cmaes", "random"])
def test_black_box_placement_summary_restore(tmp_path, method):
    cfg = TuneConfig(**SMALL, search=method)
    res = tune(cfg, tmp_path / "run", progress=False)
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    b = s["budget"]
    assert b["search"] == method and b["hard_evaluations"] == 4
    assert b["layer_traces"] == 4 * 4 * 1 and b["relaxed_evaluations"] == 0
    assert b["wall_s"] > 0 and b["cpu_s"] > 0
    assert [c["evals"] for c in s["curve"]][-1] == 4
    trains = [c["train"] for c in s["curve"]]
    assert all(a >= b for a, b in zip(trains, trains[1:], strict=False))  # best so far
    assert {"tuned", "contiguous", "greedy-balanced"} <= set(s["evaluation"])
    prob, back = restore(tmp_path / "run")
    assert (np.asarray(back.hard["placement"]) == np.asarray(res.hard["placement"])).all()
    assert (np.asarray(hard_values(prob, back.raw)["placement"])
            == np.asarray(res.hard["placement"])).all()
    tuned = s["evaluation"]["tuned"]["latency_ms"]["mean"]
    assert tuned == pytest.approx(s["curve"][-1]["heldout"], rel=1e-5)


def test_black_box_resume_continues(tmp_path):
    cfg = TuneConfig(**{**SMALL, "steps": 6}, search="random")

    def stop(step, loss):
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tune(cfg, tmp_path / "r", progress=False, callback=stop)
    assert not (tmp_path / "r" / "summary.json").exists()
    with pytest.raises(Exception, match="--resume"):
        tune(cfg, tmp_path / "r", progress=False)
    res = tune(cfg, tmp_path / "r", progress=False, resume=True)
    assert res.step == 6 and res.budget["hard_evaluations"] == 6
    lines = (tmp_path / "r" / "trials.jsonl").read_text().splitlines()
    assert len(lines) == 1 + 6
    again = tune(cfg, tmp_path / "r", progress=False, resume=True)  # finished: no new trials
    assert again.step == 6 and (np.asarray(again.hard["placement"])
                                == np.asarray(res.hard["placement"])).all()
    other = TuneConfig(**{**SMALL, "steps": 6, "seed": 1}, search="random")
    with pytest.raises(Exception, match="different run"):
        tune(other, tmp_path / "r", progress=False, resume=True)


def test_grid_integer_knob_every_value(tmp_path):
    cfg = TuneConfig(system="fsedp", params=("num_microslices",), steps=40, traces=2,
                     batch=2, eval_traces=2, tokens=16, search="grid")
    prob = build_problem(cfg)
    f = prob.setup.families["num_microslices"]
    pts = srch.grid_points(prob, 40)
    assert [p["num_microslices"] for p in pts] == list(range(f.lo, f.hi + 1))
    assert len(srch.grid_points(prob, 5)) == 5


def test_gradient_budget(tmp_path):
    res = tune(TuneConfig(**SMALL), tmp_path / "g", progress=False)
    s = json.loads((tmp_path / "g" / "summary.json").read_text())
    assert s["budget"]["layer_traces"] == 4 * 4 and s["budget"]["relaxed_evaluations"] == 4
    assert res.budget["hard_evaluations"] == 0 and s["curve"][-1]["evals"] == 4


def test_search_checks():
    prob = build_problem(TuneConfig(**SMALL))
    with pytest.raises(ConfigError, match="grid"):
        srch.check(prob, "grid")
    rep = build_problem(TuneConfig(**{**SMALL, "params": ("replicas",)}))
    srch.check(rep, "tpe")  # replicas have a black-box encoding now
    with pytest.raises(ConfigError, match="grid"):
        srch.check(rep, "grid")
    per_layer = build_problem(TuneConfig(**{**SMALL, "params": ("replicas",),
                                            "per_layer": True}))
    with pytest.raises(ConfigError, match="per-layer"):
        srch.check(per_layer, "cmaes")
    with pytest.raises(ConfigError, match="search"):
        TuneConfig(search="bayes")


def test_replica_encoding_valid_and_round_trips():
    cfg = TuneConfig(**{**SMALL, "params": ("replicas",), "hardware": "chiplet-4x4",
                        "capacity": 10, "search": "random"})
    prob = build_problem(cfg)
    f = prob.setup.families["replicas"]
    rng = np.random.default_rng(1)
    for _ in range(10):
        p = srch.replica_shares(rng.random(f.num_experts), rng.random(f.extra),
                                rng.random(f.extra), f)
        f.check(p)  # tokens conserved, slots per device respected
        occ = p > 0
        assert occ.sum(1).min() >= 1 and occ.sum(0).max() <= f.slots
        assert np.allclose(p[occ], (1.0 / occ.sum(1, keepdims=True) * occ)[occ])  # even
        got = hard_values(prob, srch.to_raw(prob, {"replicas": p}))["replicas"]
        assert np.allclose(got, p, atol=1e-6)
    empty = srch.replica_shares(rng.random(f.num_experts), np.full(f.extra, 0.9999),
                                rng.random(f.extra), f)
    assert ((empty > 0).sum(1) == 1).all()  # every redundant slot left empty


def test_black_box_replicas_run_and_restore(tmp_path):
    cfg = TuneConfig(**{**SMALL, "params": ("replicas",), "capacity": 34, "search": "tpe"})
    res = tune(cfg, tmp_path / "rep", progress=False)
    s = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert s["budget"]["hard_evaluations"] == 4 and "eplb (34 slots)" in s["evaluation"]
    _, back = restore(tmp_path / "rep")
    assert np.allclose(back.hard["replicas"], res.hard["replicas"])


def test_divisor_knob_searched_by_index():
    cfg = TuneConfig(system="epsmoe", policy="epsmoe-tune", hardware="h800x8",
                     model="deepseek-moe-16b", params=("pn",), steps=8, traces=2, batch=2,
                     eval_traces=2, tokens=512, iterations=1, search="grid")
    prob = build_problem(cfg)
    f = prob.setup.families["pn"]
    import optuna

    pts = srch.grid_points(prob, 8)
    got = [srch.suggest(optuna.trial.FixedTrial(p), prob, "grid")["pn"] for p in pts]
    assert got == list(f.divs[f.lo:f.hi + 1])
    raw = srch.to_raw(prob, {"pn": got[-1]})
    assert hard_values(prob, raw)["pn"] == got[-1]


def test_chunk_assignment_searched_restored_and_grid_refused(tmp_path):
    cfg = TuneConfig(system="epsmoe", policy="epsmoe-tune", hardware="h800x8",
                     model="deepseek-moe-16b", params=("assignment",), steps=3, traces=2,
                     batch=2, eval_traces=2, tokens=256, iterations=1, search="cmaes",
                     every=10)
    prob = build_problem(cfg)
    f = prob.setup.families["assignment"]
    with pytest.raises(ConfigError, match="cannot enumerate assignment"):
        srch.check(prob, "grid")
    import optuna

    for search in ("tpe", "cmaes", "random"):  # one slot per (device, local expert)
        t = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1)).ask()
        v = srch.suggest(t, prob, search)["assignment"]
        assert v.shape == (f.num_devices, f.local_experts)
        assert v.min() >= 0 and v.max() < f.local_experts
        assert np.array_equal(hard_values(prob, srch.to_raw(prob, {"assignment": v}))[
            "assignment"], v)
    res = tune(cfg, tmp_path / "ca", progress=False)
    s = json.loads((tmp_path / "ca" / "summary.json").read_text())
    assert s["budget"]["hard_evaluations"] == 3 and "balanced chunks (pn=2)" in s["evaluation"]
    _, back = restore(tmp_path / "ca")
    assert np.array_equal(back.hard["assignment"], res.hard["assignment"])


@pytest.mark.parametrize("extra", [["--search", "nope"], ["--search", "grid"],
                                   ["--search", "tpe", "--steps", "0"],
                                   ["--search", "cmaes", "--param", "replicas",
                                    "--per-layer"]])
def test_cli_bad_search_exit_2(tmp_path, extra, capsys):
    """In process (no JAX start-up per case): argparse's own errors exit through
    SystemExit(2), moejax's return 2; either way one error line on stderr."""
    from moejax.cli.main import main

    out = tmp_path / "bad"
    try:
        rc = main(["tune", "--traces", "4", "--batch", "4", "--eval-traces", "4", "--quiet",
                   "--out", str(out), *extra])
    except SystemExit as e:
        rc = e.code
    assert rc == 2, capsys.readouterr().err
    lines = capsys.readouterr().err.strip().splitlines()
    assert "error:" in lines[-1]
    assert len(lines) == 1 or lines[0].startswith("usage:")  # argparse prints its usage
    assert not out.exists()


def test_tuning_study_budget_table_and_claims():
    from moejax.reproduce import tuning as study
    from moejax.reproduce import tuning_claims as tc
    from moejax.reproduce.study import Rows

    curve, final = [], []

    def row(m, v, **kw):
        return {"family": "ep_placement", "seed": 0, "method": m, "heldout_ms": v,
                "layer_traces": 0, "wall_s": 0.0, "spread_pct": "", "heuristic": "", **kw}

    for m, pts in {"grad": [(16, 10.5), (160, 9.9)], "tpe": [(32, 10.8), (3200, 9.99)],
                   "random": [(32, 10.6), (6400, 10.3)]}.items():
        for i, (traces, v) in enumerate(pts):
            curve.append({"family": "ep_placement", "seed": 0, "method": m, "evals": i + 1,
                          "layer_traces": traces, "wall_s": traces / 100, "cpu_s": 0.0,
                          "train_ms": v - 0.1, "heldout_ms": v})
        final.append(row(m, pts[-1][1], layer_traces=pts[-1][0], wall_s=1.0))
    final += [row("default", 11.0), row("best-heuristic", 10.1, heuristic="greedy-balanced"),
              row("random-median", 10.5, spread_pct=8.0)]
    table = tc.budget_table(curve, final)
    by = {r["method"]: r for r in table}
    assert by["grad"]["layer_traces_to_1pct"] == 160 and by["grad"]["over_best_pct"] == 0
    assert by["tpe"]["layer_traces_to_1pct"] == 3200  # 9.99 <= 1.01 * 9.9
    assert by["random"]["within_1pct_seeds"] == "0/1"
    assert by["best-heuristic"]["heuristic"] == "greedy-balanced"
    extra = {"curve": curve, "final": final, "table": table,
             "family": study.FAMILIES["ep_placement"]}
    got = {c.id: c for c in tc.family_claims(Rows(curve, extra=extra))}
    assert got["spread_at_least_3pct_ep_placement"].holds
    assert got["grad_10x_fewer_traces_ep_placement"].holds  # 3200 / 160 = 20
    assert got["grad_beats_best_heuristic_ep_placement"].holds
    for r in curve + final:  # the same numbers as a small knob family: the claim flips
        r["family"] = "epsmoe"
    extra = {**extra, "table": tc.budget_table(curve, final), "family": study.FAMILIES["epsmoe"]}
    (small,) = tc.family_claims(Rows(curve, extra=extra))
    assert small.id == "black_box_no_costlier_epsmoe" and not small.holds


def test_tuning_study_every_family_has_a_grid_entry():
    from moejax.reproduce import tuning as study

    for g in (study.QUICK, study.FULL):
        assert {n for n, *_ in g.families} == set(study.FAMILIES)
