"""Black-box search of AEP's decay (`moejax.tune.search_aep`), the smoothed run's budget, and
the tuning study's recorded-routing family."""

import json

import numpy as np
import pytest

from moejax.errors import ConfigError
from moejax.tune import TuneConfig, restore, search_aep, tune
from moejax.tune import search as srch

AEP = dict(system="aep", hardware="a100x8-nvswitch", model="mixtral-8x7b", policy="aep-defrag",
           params=("decay",), relaxation="smoothed", loss="mean", init="default", steps=3,
           traces=1, batch=1, eval_traces=1, requests=2, rate_per_s=400.0, samples=1, lr=0.3,
           warmup=1, tau_start=0.2, tau_end=0.05, every=2, keep=2)


def test_aep_grid_search_summary_restore_and_resume(tmp_path):
    cfg = TuneConfig(**{**AEP, "search": "grid"})
    res = tune(cfg, tmp_path / "a", progress=False)
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    us = np.linspace(srch.U_LO, srch.U_HI, 3)
    prob = search_aep.smoothed.aep_problem(cfg)
    train = search_aep.objective(prob, [search_aep.decay_of(prob, u) for u in us], prob.train)
    assert s["budget"] == {**s["budget"], "search": "grid", "unit": "streams",
                           "layer_traces": 3, "hard_evaluations": 3}
    assert s["final_loss"] == pytest.approx(float(train.min()))
    assert res.hard["decay"] == pytest.approx(search_aep.decay_of(prob, us[train.argmin()]))
    assert s["tuned"] == res.hard["decay"] and s["curve"][-1]["evals"] == 3
    assert s["curve"][-1]["heldout"] == pytest.approx(s["evaluation"]["tuned"]["itl_mean_s"]
                                                      * 1e3, rel=1e-6)
    _, back = restore(tmp_path / "a")
    assert back.hard["decay"] == res.hard["decay"]

    def stop(n, _):
        if n == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tune(cfg, tmp_path / "b", progress=False, callback=stop)
    again = tune(cfg, tmp_path / "b", progress=False, resume=True)
    assert again.hard == res.hard and again.history == res.history  # the grid is fixed


@pytest.mark.parametrize("method", ["tpe", "random"])
def test_aep_sampled_search_stays_in_range(tmp_path, method):
    res = tune(TuneConfig(**{**AEP, "search": method, "steps": 2}), tmp_path / "r",
               progress=False, evaluate_heldout=False)
    assert 0.0 < res.hard["decay"] < 1.0 and res.budget["hard_evaluations"] == 2


def test_aep_gradient_reports_budget_and_curve(tmp_path):
    tune(TuneConfig(**{**AEP, "steps": 2}), tmp_path / "g", progress=False)
    s = json.loads((tmp_path / "g" / "summary.json").read_text())
    assert s["budget"]["unit"] == "streams" and s["budget"]["relaxed_evaluations"] == 2
    assert s["budget"]["layer_traces"] == 2 * 2 * 1 * 1  # steps x 2 x samples x traces
    assert [c["evals"] for c in s["curve"]] == [1, 2] and "train_loss_hard" in s
    assert s["curve"][-1]["decay"] == s["tuned"]


def test_aep_cmaes_refused():
    with pytest.raises(ConfigError, match="cmaes.*allowed: grad, tpe, random, grid"):
        TuneConfig(**{**AEP, "search": "cmaes"})


def test_cli_aep_cmaes_exit_2(tmp_path, capsys):
    """In process (no JAX start-up): exit code 2, one line naming cmaes, nothing written."""
    from moejax.cli.main import main

    out = tmp_path / "bad"
    rc = main(["tune", "--system", "aep", "--param", "decay", "--relaxation", "smoothed",
               "--search", "cmaes", "--quiet", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and "cmaes" in err
    assert not out.exists()


def test_recorded_family_recording_and_problem():
    from moejax.reproduce import balancing_data as bdata
    from moejax.reproduce import tuning as study
    from moejax.tune.loop import build_problem

    fam = study.FAMILIES["ep_recorded"]
    cfg = study.base_config(fam, 0, 64)
    prob = build_problem(cfg)
    counts = bdata.recordings()["esft_intent"]["counts"]
    half = counts.shape[0] // 2
    assert np.shape(prob.train.counts)[0] == 16  # the first 16 sequences of the first half
    assert np.shape(prob.heldout.counts)[0] == min(64, counts.shape[0] - half)
    np.testing.assert_array_equal(np.asarray(prob.heldout.counts)[0, 0],
                                  counts[half][list(fam.recorded[1])])
    (f,) = prob.setup.families.values()
    assert f.num_layers * f.num_experts >= 100  # a placement family of the claims' rules
    assert srch.engine_traces(prob.train) == 16 * 2


def test_tuning_study_aep_claims_are_small_knob_rules():
    from moejax.reproduce import tuning as study
    from moejax.reproduce import tuning_claims as tc
    from moejax.reproduce.study import Rows

    curve, final = [], []
    for m, pts in {"grad": [(8, 20.0), (96, 19.8)], "grid": [(2, 20.5), (48, 19.7)]}.items():
        for i, (n, v) in enumerate(pts):
            curve.append({"family": "aep_decay", "seed": 0, "method": m, "evals": i + 1,
                          "layer_traces": n, "wall_s": 1.0, "cpu_s": 0.0, "train_ms": v,
                          "heldout_ms": v})
        final.append({"family": "aep_decay", "seed": 0, "method": m, "heldout_ms": pts[-1][1],
                      "layer_traces": pts[-1][0], "wall_s": 1.0, "spread_pct": "",
                      "heuristic": ""})
    final.append({"family": "aep_decay", "seed": 0, "method": "random-median",
                  "heldout_ms": 20.0, "layer_traces": 0, "wall_s": 0.0, "spread_pct": 4.0,
                  "heuristic": ""})
    table = tc.budget_table(curve, final)
    extra = {"curve": curve, "final": final, "table": table,
             "family": study.FAMILIES["aep_decay"]}
    (c,) = tc.family_claims(Rows(curve, extra=extra))
    assert c.id == "black_box_no_costlier_aep_decay" and c.holds  # grid 2 <= grad 8
    assert study.mean_ms({"t": {"itl_mean_s": 0.02}}, "t") == pytest.approx(20.0)
