"""FSE-DP hardware knobs under 000 §VI-D Eq. (1)-(2) (moejax.systems.fsedp.budget): the budget
against a hand computation, the penalty, relaxed -> hard, gradients vs finite differences,
a short tuning run, export -> simulate round trip, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from moejax import api
from moejax.catalog.policies import load_policy
from moejax.cli.main import main
from moejax.errors import ConfigError
from moejax.systems.fsedp.budget import ChipletBudget
from moejax.tune import TuneConfig, export, restore
from moejax.tune import loop as tl

ROOT = Path(__file__).resolve().parents[1]
MiB = 2.0**20
HW = ("weight_buffer_bytes", "ddr_Bps", "link_Bps")
SMALL = dict(system="fsedp", hardware="chiplet-2x2", model="qwen3-30b-a3b", params=HW,
             steps=12, traces=4, batch=2, eval_traces=4, tokens=32, iterations=1, every=6,
             lr=0.15, warmup=2, init="default", tau_start=0.3, tau_end=0.01)


@pytest.fixture(scope="module")
def prob():
    # The FSE-DP defaults (any-die DDR loading, per-link D2D, shared experts streamed, refill).
    return tl.build_problem(TuneConfig(**SMALL))


def _raw(prob, **v):
    return {k: f.init(None, v[k]) for k, f in prob.setup.families.items()}


def test_eq1_eq2_match_a_hand_computation(prob):
    c = prob.setup.constraint
    assert (c.num_devices, c.num_links) == (4, 8)  # 2x2 mesh: 4 links, both directions
    rep = c.report({"weight_buffer_bytes": 16 * MiB, "ddr_Bps": 48e9, "link_Bps": 288e9})
    # Eq. (1): ceil(288 / 192) = 2 modules x 0.19 + 10.32 + 16 MiB x 0.25 mm^2 / MiB
    assert rep["ucie_modules"] == 2
    assert rep["area_mm2"] == pytest.approx(2 * 0.19 + 10.32 + 16 * 0.25, rel=1e-6)
    # Eq. (2): 4 dies x 2.187 W + 8 links x 288 GB/s x 8 bit x 0.52 pJ + 4 x 48 GB/s x 8 x 20 pJ
    power = 4 * 2.187 + 8 * 288e9 * 8 * 0.52e-12 + 4 * 48e9 * 8 * 20e-12
    assert rep["power_w"] == pytest.approx(power, rel=1e-6)
    assert rep["feasible"] and power < 60.0
    assert c.report({})["feasible"]  # the platform itself (8 MiB, 25.6, 288 GB/s)


def test_penalty_is_zero_inside_the_budget_and_grows_outside(prob):
    c, b = prob.setup.constraint, ChipletBudget()
    for tau in (0.0, 0.1):
        assert float(c.penalty({}, tau)) == 0.0
        assert float(c.penalty({"weight_buffer_bytes": 60 * MiB, "ddr_Bps": 60e9}, tau)) == 0.0
    big_buffer = {"weight_buffer_bytes": 100 * MiB}  # area 10.32 + 0.38 + 25 = 35.7 mm^2
    assert float(c.penalty(big_buffer)) == pytest.approx(
        b.penalty_weight * (35.7 / 30.0 - 1.0), rel=1e-5)
    fast_ddr = {"ddr_Bps": 150e9}  # power 8.748 + 9.585 + 96 W
    assert float(c.penalty(fast_ddr)) == pytest.approx(
        b.penalty_weight * ((8.748 + 8 * 288e9 * 8 * 0.52e-12 + 96.0) / 60.0 - 1.0), rel=1e-5)
    both = float(c.penalty({**big_buffer, **fast_ddr}))
    assert both == pytest.approx(float(c.penalty(big_buffer)) + float(c.penalty(fast_ddr)),
                                 rel=1e-5)


def test_relaxed_ceil_and_objective_tend_to_hard_as_tau_goes_to_zero(prob):
    b = ChipletBudget()
    x = jnp.array([100e9, 250e9, 500e9, 900e9])  # 0.52, 1.30, 2.60, 4.69 modules
    hard = np.asarray(b.ucie_modules(x, 0.0))
    np.testing.assert_array_equal(hard, [1, 2, 3, 5])
    errs = [float(jnp.abs(b.ucie_modules(x, tau) - hard).max()) for tau in (0.3, 0.1, 0.03)]
    assert errs[0] > 0.01 and errs[-1] < 1e-4 and errs == sorted(errs, reverse=True), errs
    # the whole objective: latency + penalty (area violated, link off a module boundary)
    point = {"weight_buffer_bytes": 80 * MiB, "ddr_Bps": 40e9, "link_Bps": 250e9}
    raw = _raw(prob, **point)
    hard_pt = {k: f.hard(raw[k]) for k, f in prob.setup.families.items()}  # no projection
    ref = (tl.evaluate_values(prob, hard_pt, prob.train)["latency_s"].mean() * 1e3
           + float(prob.setup.constraint.penalty(hard_pt, 0.0)))
    assert float(prob.setup.constraint.penalty(hard_pt, 0.0)) > 1.0
    objective = jax.jit(tl.make_objective(prob))
    errs = [abs(float(objective(raw, prob.train, tau)) - ref) for tau in (0.3, 0.1, 0.01, 0.0)]
    assert errs[0] > 10 * errs[2] and errs[-1] < 1e-5 * ref, errs


def test_gradient_matches_finite_differences_of_the_relaxed_objective(prob):
    """The whole loss (FSE-DP layer latency + Eq. (1)-(2) penalty) in float32 (the FSE-DP
    event loop builds float32 state, so it does not run under x64), and the budget
    penalty alone under x64 with jax.test_util.check_grads.

    The buffer moves the latency only where some DDR channel has bandwidth left over while
    streams run: Rule 4 pre-loads pending experts into free buffer space (`room` in
    `layer.simulate_layer`). Under any-die loading every channel loads a share of every
    streaming expert, so where the streams are DDR-bound (250 GB/s links) no channel idles
    and the buffer only enters the discrete "slots fit" test: its gradient is exactly 0 and
    so is a finite difference of the hard model (the zero is the model's, not the
    relaxation's). With 100 GB/s links the streams are D2D-bound, the channels idle ~25%
    of the layer, pre-loads fill the buffer, and a larger buffer is faster."""
    objective = tl.make_objective(prob)
    f = jax.jit(lambda a, b, c: objective(
        {"weight_buffer_bytes": a, "ddr_Bps": b, "link_Bps": c}, prob.train, 0.3))
    # D2D-bound: the buffer binds; power over the budget (63.3 W), so the penalty is live
    raw = _raw(prob, weight_buffer_bytes=7 * MiB, ddr_Bps=80e9, link_Bps=100e9)
    args = tuple(raw[k] for k in HW)
    g = jax.grad(f, argnums=(0, 1, 2))(*args)
    assert all(abs(float(x)) > 1e-3 for x in g), g  # every knob moves the loss here
    assert float(g[0]) < 0  # a larger buffer pre-loads more: faster
    check_grads(f, args, order=1, modes=["rev"], eps=3e-3, atol=2e-2, rtol=3e-2)
    # DDR-bound on every channel: the buffer's gradient and hard finite difference are 0
    flat = _raw(prob, weight_buffer_bytes=7 * MiB, ddr_Bps=80e9, link_Bps=250e9)
    # (the gradient of all three knobs, as above: its compiled backward pass is reused; a
    # grad in the buffer alone compiled another one, ~10 s)
    assert float(jax.grad(f, argnums=(0, 1, 2))(*(flat[k] for k in HW))[0]) == 0.0
    lat = [tl.evaluate_values(prob, {"weight_buffer_bytes": b * MiB, "ddr_Bps": 80e9,
                                     "link_Bps": 250e9}, prob.train)["latency_s"]
           for b in (6.86, 7.14)]
    np.testing.assert_array_equal(lat[0], lat[1])
    c, fams = prob.setup.constraint, prob.setup.families
    with jax.enable_x64(True):
        def pen(a, b, cc):
            vals = {k: fams[k].relaxed(r, 0.3) for k, r in zip(HW, (a, b, cc), strict=True)}
            return c.penalty(vals, 0.3)

        over = _raw(prob, weight_buffer_bytes=80 * MiB, ddr_Bps=70e9, link_Bps=250e9)
        args64 = tuple(over[k].astype(jnp.float64) for k in HW)
        assert float(pen(*args64)) > 1.0  # area and power both violated: both terms live
        check_grads(pen, args64, order=1, modes=["rev"], eps=1e-5, atol=1e-6, rtol=1e-6)


def test_projection_pulls_an_infeasible_point_onto_the_budget(prob):
    c = prob.setup.constraint
    out = {"weight_buffer_bytes": 16 * MiB, "ddr_Bps": 120e9, "link_Bps": 288e9}
    assert not c.feasible(out)
    proj = c.project(out)
    rep = c.report(proj)
    assert rep["feasible"] and rep["power_w"] == pytest.approx(60.0, rel=1e-3)
    assert 25.6e9 < proj["ddr_Bps"] < 120e9
    assert c.project(c.project(proj)) == proj  # feasible points are kept


def test_cli_short_run_lowers_the_loss_ends_feasible_and_exports(prob, tmp_path, capsys):
    """`moejax tune` on SMALL's problem (the same traces as `prob`) under a custom budget
    (29 mm^2 of area, no looser than the default anywhere: the tuned design is feasible
    under the default too): one tuning run serves the CLI's budget and export checks and
    the run's own (the loss falls, the tuned design is feasible and faster than the
    default, the exported policy and platform simulate as the problem evaluates them).
    A budget that binds here (50 W, say) makes the 12-step run's loss rise instead."""
    flags = {"system": "fsedp", "hardware": "chiplet-2x2", "model": "qwen3-30b-a3b",
             "param": ",".join(HW), "steps": 12, "traces": 4, "batch": 2, "eval-traces": 4,
             "tokens": 32, "iterations": 1, "every": 6, "lr": 0.15, "warmup": 2,
             "init": "default", "tau-start": 0.3, "tau-end": 0.01,
             "budget": "area_limit_mm2=29,power_limit_w=60"}
    assert {k.replace("-", "_") for k in flags} - {"param", "budget"} <= set(SMALL)
    args = ["tune", *(x for k, v in flags.items() for x in (f"--{k}", str(v))), "--quiet",
            "--out", str(tmp_path / "c"), "--export", str(tmp_path / "p.toml"),
            "--export-hardware", str(tmp_path / "hw.toml")]
    assert main(args) == 0
    assert "wrote platform" in capsys.readouterr().out
    summary = json.loads((tmp_path / "c" / "summary.json").read_text())
    assert summary["run"]["budget"] == "area_limit_mm2=29,power_limit_w=60"
    assert summary["evaluation"]["tuned"]["budget"]["area_limit_mm2"] == 29.0
    assert "memory_Bps" in (tmp_path / "hw.toml").read_text()
    # the run itself
    _, res = restore(tmp_path / "c")
    assert np.mean(res.history[-3:]) < res.history[0]
    ev = summary["evaluation"]
    assert ev["tuned"]["budget"]["feasible"]
    assert prob.setup.constraint.report(res.hard)["feasible"]  # the default budget's check
    assert ev["tuned"]["latency_ms"]["mean"] < ev["default"]["latency_ms"]["mean"]
    assert all(v["budget"]["feasible"] for k, v in ev.items() if k.startswith("grid"))
    with pytest.raises(ConfigError, match="export-hardware"):
        export.write_policy(tmp_path / "p2.toml", prob, res.hard, res.step)
    pol = tmp_path / "p.toml"
    assert dict(load_policy(str(pol)).options)["weight_buffer_bytes"] == \
        res.hard["weight_buffer_bytes"]
    sim = api.simulate(str(tmp_path / "hw.toml"), "qwen3-30b-a3b", str(pol), prob.heldout)
    ref = tl.evaluate_values(prob, res.hard)
    # the same float32 values, once traced params and once compile-time platform constants
    # (XLA folds those differently): equal to float32 rounding
    np.testing.assert_allclose(np.asarray(sim["latency_s"]), ref["latency_s"], rtol=1e-6)
    other = tl.evaluate_values(prob, {**res.hard, "ddr_Bps": 25.6e9})["latency_s"]
    assert np.abs(other / ref["latency_s"] - 1.0).max() > 1e-3  # the platform file matters


def test_bad_budget_and_box_values_are_clear():
    with pytest.raises(ConfigError, match="power_limit_w = -1"):
        TuneConfig(**{**SMALL, "budget": "power_limit_w=-1"})
    with pytest.raises(ConfigError, match="name=value"):
        ChipletBudget.parse("area=30")
    with pytest.raises(ConfigError, match="sram_mm2_per_MiB = 'x'"):
        ChipletBudget.parse("sram_mm2_per_MiB=x")
    with pytest.raises(ConfigError, match="hardware params only"):
        tl.build_problem(TuneConfig(**{**SMALL, "params": ("num_microslices",),
                                       "budget": "area_limit_mm2=25"}), traces=False)
    prob = tl.build_problem(TuneConfig(**SMALL), traces=False)
    with pytest.raises(ConfigError, match=r"ddr_Bps = 1e\+12 lies outside"):
        prob.setup.families["ddr_Bps"].init(None, 1e12)


def test_shipped_checkpoint_restores_the_reported_feasible_design():
    from pathlib import Path

    from moejax.tune import restore

    folder = Path(__file__).parent.parent / "checkpoints" / "fsedp-hardware-qwen3-chiplet-2x2"
    prob, res = restore(folder)
    reported = json.loads((folder / "hardware_grid.json").read_text())["rows"]["tuned"]
    assert res.hard == reported["values"]  # bit-exact, including the projection
    assert prob.setup.constraint.report(res.hard)["feasible"]
