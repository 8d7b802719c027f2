"""Fitting generator families to recorded traces (moejax.trace.fit) and the saved fit."""

from __future__ import annotations

import json
import statistics

import jax
import numpy as np
import pytest

from moejax.cli import main as cli
from moejax.errors import ConfigError, TraceError
from moejax.trace import core, fit, gen, io

SHAPE = dict(iterations=8, layers=2, tokens=256, num_experts=16, top_k=2)


def recording(spec, seed=0):
    """A synthetic 'recording' drawn from a known generator (one trace, no [T] axis)."""
    return gen.generate(spec, jax.random.key(seed), num_traces=1, **SHAPE)[0]


@pytest.fixture(scope="module")
def powerlaw_fit():
    tr = recording("powerlaw:alpha=1.0")
    return tr, fit.fit(tr, ("powerlaw", "exponential"))


def test_recovers_known_powerlaw_and_reproduces_heldout_skew(powerlaw_fit):
    tr, res = powerlaw_fit
    r = res["families"]["powerlaw"]
    alphas = [gen.parse_spec(s)["alpha"] for s in r["layers"]]
    # each layer has 4 x 256 tokens of its own: alpha recovered to about 15%
    np.testing.assert_allclose(alphas, 1.0, rtol=0.15)
    assert all(r["moments_matched"])
    v = r["verdict"]
    assert v["skew_max_abs_err"] <= 0.10
    assert v["curve_max_abs_err"] <= 0.05
    # the misspecified paper choice alpha=1.5 is measurably worse on the same held-out part
    paper = res["paper_specs"]["powerlaw"]["verdict"]
    assert paper["skew_max_abs_err"] > v["skew_max_abs_err"]
    assert res["best"] in ("powerlaw", "exponential")
    assert "method of simulated moments" in res["method"]
    assert "powerlaw" in fit.format_fit(res)


def test_exponential_is_matched_in_skew_too(powerlaw_fit):
    _, res = powerlaw_fit
    ev = res["families"]["exponential"]["heldout"]
    # exponential matched on skew reproduces it, even though its tail differs
    assert np.max(np.abs(ev["skew_rel_err"])) <= 0.15


def test_lognormal_popularity_is_the_expected_quantile_shape_and_is_recovered():
    e, sigma = SHAPE["num_experts"], 0.8
    z = np.array([statistics.NormalDist().inv_cdf(1 - (r + 0.5) / e) for r in range(e)])
    want = np.exp(sigma * z) / np.exp(sigma * z).sum()
    p = np.asarray(gen.popularity(f"lognormal:sigma={sigma}", jax.random.key(3),
                                  iterations=2, layers=3, num_experts=e))
    np.testing.assert_allclose(-np.sort(-p, axis=-1), np.broadcast_to(want, p.shape),
                               rtol=1e-4)
    assert len({tuple(np.argsort(p[0, layer])) for layer in range(3)}) > 1  # shuffled
    res = fit.fit(recording(f"lognormal:sigma={sigma}"), ("lognormal",),
                  compare_papers=False)
    r = res["families"]["lognormal"]
    sigmas = [gen.parse_spec(s)["sigma"] for s in r["layers"]]
    np.testing.assert_allclose(sigmas, sigma, rtol=0.15)
    assert r["verdict"]["skew_max_abs_err"] <= 0.10
    assert r["verdict"]["curve_max_abs_err"] <= 0.05


def test_skew_is_monotone_so_inversion_is_exact():
    values = np.array([0.5, 1.0, 1.5, 2.0])
    sim = np.array([1.2, 2.0, 3.5, 5.0])
    est, inside = fit._invert_monotone(values, sim, np.array([2.0, 3.5, 9.0]))
    np.testing.assert_allclose(est, [1.0, 1.5, 2.0])
    assert inside.tolist() == [True, True, False]


def test_drift_needs_iterations_and_counts_only_fits(powerlaw_fit):
    tr, _ = powerlaw_fit
    few = fit._take(tr, slice(0, 3))
    with pytest.raises(TraceError, match="drift needs a recording with >= 4 iterations"):
        fit.fit_family(few, "drift")
    res = fit.fit(gen.counts_only(tr), ("powerlaw",), compare_papers=False)
    assert res["paper_specs"] == {}
    v = res["families"]["powerlaw"]["verdict"]
    assert v["skew_max_abs_err"] <= 0.10
    with pytest.raises(ConfigError, match="powerlaw, exponential, normal, lognormal, drift"):
        fit.fit_family(tr, "zipf")


def test_drift_fit_recovers_a_quantile_drift_recording():
    tr = recording("drift:rho=0.0,scale=0.8,noise=0.5,shared=1.0,scenarios=1,quantile=1")
    r = fit.fit_family(tr, "drift")
    assert len(r["layers"]) == SHAPE["layers"]
    specs = [gen.parse_spec(s) for s in r["layers"]]
    assert all(s.family == "drift" and s["scenarios"] == 1 and s["quantile"] for s in specs)
    # the scale is interpolated per layer to the layer's skew, not left on the coarse grid
    assert all(0.3 <= s["scale"] <= 2.0 for s in specs)
    assert not set(s["scale"] for s in specs) & set(fit._DRIFT_SCALE.tolist())
    v = fit.verdict(fit.evaluate(r["layers"], tr, repeats=1))
    assert v["skew_max_abs_err"] <= 0.10


def test_quantile_drift_has_the_same_target_shape_in_every_layer():
    e = SHAPE["num_experts"]
    p = np.asarray(gen.popularity("drift:rho=0.0,scale=0.9,noise=0.0,shared=1.0,scenarios=1,"
                                  "quantile=1", jax.random.key(2), iterations=2, layers=4,
                                  num_experts=e))
    z = np.array([statistics.NormalDist().inv_cdf(1 - (r + 0.5) / e) for r in range(e)])
    want = np.exp(0.9 * z) / np.exp(0.9 * z).sum()
    np.testing.assert_allclose(-np.sort(-p, axis=-1), np.broadcast_to(want, p.shape),
                               rtol=1e-4)


def test_saved_fit_drives_generation_and_simulate(powerlaw_fit, tmp_path, capsys):
    tr, res = powerlaw_fit
    path = fit.save_fit(tmp_path / "fit.json", res, "powerlaw", source="synthetic")
    doc = json.loads(path.read_text())
    assert doc["moejax_fit"] == 1 and len(doc["layers"]) == 2
    assert fit.load_spec(str(path)) == gen.parse_spec(doc["pooled"])
    assert fit.load_spec("normal:std=0.02")["std"] == 0.02
    batch = fit.generate_fitted(path, jax.random.key(1), num_traces=2, iterations=1, layers=3,
                                tokens=64, num_experts=16, top_k=2)
    core.validate(batch)
    assert batch.expert_ids.shape == (2, 1, 3, 64, 2)
    np.testing.assert_array_equal(np.asarray(batch.counts).sum(-1), 128)
    # CLI: simulate with the fit (phi-3.5-moe has 16 experts, top-2)
    assert cli.main(["simulate", "--trace-gen", str(path), "--model", "phi-3.5-moe",
                     "--hardware", "chiplet-2x2", "--traces", "2", "--tokens", "32",
                     "--quiet"]) == 0
    with pytest.raises(ConfigError, match="moejax_fit"):
        bad = tmp_path / "bad.json"
        bad.write_text("{}")
        fit.load_fit(bad)
    with pytest.raises(ConfigError, match="no fit for 'drift'"):
        fit.save_fit(tmp_path / "x.json", res, "drift")


def test_cli_fit_writes_spec(tmp_path, capsys):
    tr = recording("exponential:scale=0.3", seed=2)
    path = tmp_path / "r.npz"
    io.save(path, tr)
    out = tmp_path / "f.json"
    assert cli.main(["trace", "fit", str(path), "--family", "exponential", "--out", str(out),
                     "--report", str(tmp_path / "rep.json")]) == 0
    text = capsys.readouterr().out
    assert "exponential" in text and "held out" in text
    assert fit.load_fit(out)["family"] == "exponential"
    rep = json.loads((tmp_path / "rep.json").read_text())
    scales = [gen.parse_spec(s)["scale"] for s in rep["families"]["exponential"]["layers"]]
    np.testing.assert_allclose(scales, 0.3, rtol=0.25)
