"""Relaxed paths of the knobs that had only a hard grid: the wafer NI-Balancer
trigger alpha (001 Eq. 2) through the gated wafer step, and AEP's decay delta (002 §3.4
Algorithm 1) through Gaussian smoothing with an antithetic score-function estimator."""

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax import api
from moejax.catalog.policies import load_policy
from moejax.errors import ConfigError
from moejax.runner import engine
from moejax.systems.wafer import balancer as bal
from moejax.systems.wafer import config as wconfig
from moejax.systems.wafer import system as wsys
from moejax.trace.popularity import fixed_popularity, sample_from_popularity

# --- wafer: Eq. 2 gate inside the step ------------------------------------------------------


def _wafer(invasive, kind, iterations=6, traces=3):
    s = api.resolve("wsc-4x4", "phi-3.5-moe", "er-mapping")
    pop = fixed_popularity("powerlaw:alpha=1.5", jax.random.key(1), iterations=iterations,
                           layers=2, num_experts=s.model.num_experts)
    tr = sample_from_popularity(pop, jax.random.key(2), num_traces=traces, tokens=32,
                                top_k=s.model.top_k)
    cfg = wconfig.make_config(s.platform, s.model, mapping="er", tp_size=4, balancer=kind,
                              invasive=invasive, shadow_slots=1, micro_batches=(1, 2),
                              network="link_load", bidirectional_rings=False)  # BOOLEAN_PATH's
    return cfg, wsys.build(cfg, iterations), tr


# Produced by the boolean step of commit 48221d5 (before the gate) on exactly these
# configs (the cut-through network and one-way rings, the wafer defaults then), alpha = 0.3:
# every output leaf was bit-equal to the gated step at tau = 0.
BOOLEAN_PATH = {
    (True, "topology"): ([0.0011325583327561617, 0.0010276850080117583, 0.0010801058961078525],
                         [512.0, 544.0, 480.0]),
    (False, "greedy"): ([0.00045127817429602146, 0.00045118259731680155,
                         0.00045123175368644297], [288.0, 256.0, 272.0]),
}


@pytest.mark.parametrize("invasive,kind", list(BOOLEAN_PATH))
def test_wafer_gated_step_at_tau_zero_is_the_boolean_path(invasive, kind):
    cfg, sysm, tr = _wafer(invasive, kind)
    p = wconfig.default_params(cfg, alpha=0.3, beta=1.0 if invasive else 0.0)
    out = engine.simulate(sysm, p, tr)
    fwd, mig = BOOLEAN_PATH[(invasive, kind)]
    np.testing.assert_array_equal(np.asarray(out["forward_s"]), np.float32(fwd))
    np.testing.assert_array_equal(np.asarray(out["migrations"]), np.float32(mig))
    # a threshold above every imbalance never triggers: no copies (and, invasive, no stalls;
    # non-invasive copies are still in flight after 6 iterations, so the time is the same)
    never = engine.simulate(sysm, p.replace(alpha=jnp.float32(1e6)), tr)
    assert float(np.asarray(never["migrations"]).sum()) == 0.0
    assert np.array_equal(np.asarray(never["forward_s"]), np.float32(fwd)) == (not invasive)


@pytest.fixture(scope="module")
def forward_of_alpha():
    """Mean forward time (ms) as a function of (alpha, tau, tau_trigger), all traced, with its
    gradient in alpha and the per-iteration device loads: one compile (value_and_grad with
    the loads as aux) serves every temperature below and the loads (three compiles before:
    the loads' run, f and grad f; the gradient is computed at every call, cheap here)."""
    cfg, sysm, tr = _wafer(True, "topology", iterations=4, traces=2)
    base = wconfig.default_params(cfg, alpha=0.0, beta=0.0)

    @jax.jit
    @functools.partial(jax.value_and_grad, has_aux=True)
    def run(alpha, tau, tau_trigger):
        p = base.replace(alpha=alpha, tau=tau, tau_trigger=tau_trigger)
        out = engine.simulate(sysm, p, tr)
        return out["forward_s"].mean() * 1e3, out["per_iteration"]["device_load"]  # ms

    def f(alpha, tau, tau_trigger):
        return run(alpha, tau, tau_trigger)[0][0]

    def grad_f(alpha, tau, tau_trigger):
        return run(alpha, tau, tau_trigger)[1]

    def loads(alpha):  # [T, I, D] at the hard layer and the boolean trigger
        return run(jnp.float32(alpha), jnp.float32(0.0), jnp.float32(0.0))[0][1]
    return cfg, loads, f, grad_f


def test_wafer_relaxed_forward_time_gradient_in_alpha_matches_central_difference(
        forward_of_alpha):
    cfg, loads, f, grad_f = forward_of_alpha
    # alpha near the observed Eq. 2 sums (2 layers; per-iteration loads are layer means),
    # so the gate is not saturated; the loads of a run that never triggers (alpha = 1e6:
    # default_params(cfg, alpha=1e6), as this test ran it before)
    imb = 2.0 * float(np.median(np.asarray(bal.layer_imbalance(loads(1e6)))))
    a = jnp.float32(imb)
    for tau, tau_trigger in ((0.5, 0.5), (0.0, 0.5)):  # relaxed layer, or hard layer + gate
        t, tt = jnp.float32(tau), jnp.float32(tau_trigger)
        g = float(grad_f(a, t, tt))
        h = 0.02
        fd = (float(f(a + h, t, tt)) - float(f(a - h, t, tt))) / (2 * h)
        assert abs(g) > 1e-4, g  # alpha reaches the forward time
        np.testing.assert_allclose(g, fd, rtol=0.05)


def test_wafer_relaxed_forward_time_tends_to_hard_as_tau_falls(forward_of_alpha):
    f = forward_of_alpha[2]
    alpha = jnp.float32(2.0)

    def ms(tau):
        return float(f(alpha, jnp.float32(tau), jnp.float32(tau)))
    hard = ms(0.0)
    errs = [abs(ms(t) - hard) / hard for t in (1.0, 0.1, 1e-2, 1e-4)]
    assert all(a > b for a, b in zip(errs, errs[1:], strict=False)) and errs[-1] < 1e-3, errs


# --- AEP decay: Gaussian smoothing, antithetic score-function gradient ---------------------


def _smoothed_by_quadrature(f_grid, grid, x, sigma):
    """F_sigma(x) = E f(clip(x + sigma eps, 0, 1)) for f piecewise constant on [0, 1],
    f = f_grid[i] on [grid[i], grid[i + 1]) (and f_grid[-1] at 1), by the normal cdf."""
    from scipy.stats import norm

    edges = np.concatenate([[-np.inf], grid[1:], [np.inf]])  # clip: f(0) below, f(1) above
    vals = np.concatenate([f_grid[:-1], [f_grid[-1]]])
    return float(np.sum(vals * np.diff(norm.cdf((edges - x) / sigma))))


def test_antithetic_estimator_mean_is_the_derivative_of_the_smoothed_step_function():
    from moejax.tune import smoothed

    # f = a staircase on [0, 1] (piecewise constant, as AEP's metrics are in delta)
    grid = np.array([0.0, 0.3, 0.55, 0.8])
    f_grid = np.array([2.0, 1.0, 1.5, 0.25])

    def f_many(xs):
        xs = np.clip(np.asarray(xs), 0.0, 1.0)
        return f_grid[np.searchsorted(grid, xs, side="right") - 1]

    for x, sigma in ((0.35, 0.1), (0.7, 0.2), (0.95, 0.1)):
        h = 1e-4
        fd = (_smoothed_by_quadrature(f_grid, grid, x + h, sigma)
              - _smoothed_by_quadrature(f_grid, grid, x - h, sigma)) / (2 * h)
        eps = np.asarray(jax.random.normal(jax.random.key(int(x * 100)), (20000,)))
        value, g, se = smoothed.antithetic_gradient(f_many, x, sigma, eps)
        # unbiased (Stein's identity): the mean of 20000 pairs is within 4 standard errors
        # of the exact derivative (a false failure has probability ~6e-5 per check)
        assert abs(g - fd) < 4 * se and se < 0.1 * abs(fd), (x, g, fd, se)
        assert abs(value - _smoothed_by_quadrature(f_grid, grid, x, sigma)) < 0.01
    # sigma -> 0: the smoothed value is the hard one away from the steps
    for x in (0.1, 0.42, 0.9):
        assert abs(_smoothed_by_quadrature(f_grid, grid, x, 1e-4) - f_many([x])[0]) < 1e-9
        v, _, _ = smoothed.antithetic_gradient(f_many, x, 1e-4, np.linspace(-3, 3, 8))
        assert v == f_many([x])[0]
    with pytest.raises(ConfigError, match="sigma"):
        smoothed.antithetic_gradient(f_many, 0.5, 0.0, eps)


def _tiny_aep_cfg(**kw):
    from moejax.tune import TuneConfig

    base = dict(system="aep", hardware="a100x8-nvswitch", model="mixtral-8x7b",
                policy="aep-defrag", params=("decay",), relaxation="smoothed",
                loss="throughput", init="default", steps=3, traces=1, batch=1, eval_traces=1,
                requests=2, rate_per_s=400.0, samples=2, lr=0.3, warmup=1, tau_start=0.2,
                tau_end=0.05, every=2, keep=2)
    return TuneConfig(**{**base, **kw})


def _loss_in_whole_groups(prob, decays):
    """`prob.loss(decays)`, padded with copies of the last decay to whole groups of 8 (the
    size the antithetic gradient's 24 points run in): every member runs alone under vmap, so
    the padding reuses one compiled loop instead of compiling one per group size."""
    decays = np.asarray(decays)
    pad = -decays.size % 8
    return prob.loss(np.concatenate([decays, np.repeat(decays[-1:], pad)]))[:decays.size]


def test_aep_estimator_agrees_with_the_smoothed_hard_objective():
    from moejax.tune import smoothed

    prob = smoothed.aep_problem(_tiny_aep_cfg())
    # the batched runner is the runner: same metrics, one decay at a time
    one = engine.simulate(prob.system, prob.base.replace(decay=jnp.float32(0.0)),
                          prob.train, prob.sim_key)
    np.testing.assert_array_equal(prob.metrics([0.0])["throughput_tok_s"],
                                  np.asarray(one["throughput_tok_s"]).mean(keepdims=True))
    # f on a grid, refined where it changes: a piecewise-constant model of the hard objective
    coarse = np.linspace(0.0, 1.0, 6)
    fc = _loss_in_whole_groups(prob, coarse)
    steps = np.flatnonzero(np.diff(fc))
    assert steps.size > 0  # delta changes the hard result on this config
    fine = np.unique(np.concatenate([coarse] + [np.linspace(coarse[i], coarse[i + 1], 9)
                                                for i in steps]))
    ff = _loss_in_whole_groups(prob, fine)
    sigma = 0.2
    x = float(fine[np.argmax(np.abs(np.diff(ff)))])  # at the largest step: F' is not ~0
    h = 1e-4
    fd = (_smoothed_by_quadrature(ff, fine, x + h, sigma)
          - _smoothed_by_quadrature(ff, fine, x - h, sigma)) / (2 * h)
    # the model locates each step of f to within the fine spacing dx; moving a step of
    # height dv by dx moves F' by at most dv * dx * max|phi'| / sigma^2 (max|phi'| = 0.242)
    model_err = np.abs(np.diff(ff)).sum() * np.diff(fine).max() * 0.242 / sigma ** 2
    eps = np.asarray(jax.random.normal(jax.random.key(5), (12,)))
    _, g, se = smoothed.antithetic_gradient(prob.loss, x, sigma, eps)
    assert abs(fd) > model_err  # the check can fail
    assert abs(g - fd) < 4 * se + model_err, (g, fd, se, model_err)
    # sigma -> 0 on the real simulator: every pair lands on the hard value
    v, g0, _ = smoothed.antithetic_gradient(prob.loss, 0.5, 1e-6, eps[:2])
    assert v == float(prob.loss([0.5])[0]) and g0 == 0.0


def test_aep_smoothed_run_keeps_its_objective_and_its_range(tmp_path):
    from moejax import tunable
    from moejax.tune import restore, smoothed, tune

    cfg = _tiny_aep_cfg()
    res = tune(cfg, tmp_path / "a", progress=False)
    assert 0.0 <= res.hard["decay"] <= 1.0 and len(res.history) == 3
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert s["train_loss_hard"]["tuned"] <= s["train_loss_hard"]["start"]
    assert set(s["evaluation"]) == {"tuned", "default"}
    # restore gives the same hard value; the export is a valid aep policy with that decay
    _, back = restore(tmp_path / "a")
    assert back.hard == res.hard and back.step == 3
    pol = smoothed.write_policy(tmp_path / "p.toml", cfg, res.hard, 3)
    assert dict(load_policy(str(pol)).options)["decay"] == pytest.approx(res.hard["decay"])
    # outside [0, 1]: a clear error
    knob = tunable.SmoothedKnob("decay", 0.0, 1.0)
    with pytest.raises(ConfigError, match=r"decay = 1.5 lies outside .*\[0, 1\]"):
        knob.init(None, 1.5)
    with pytest.raises(ConfigError, match="relaxation = 'smoothed'"):
        tune(_tiny_aep_cfg(relaxation="system"), tmp_path / "b", progress=False)
    with pytest.raises(ConfigError, match="only aep"):
        _tiny_aep_cfg(system="ep")
    with pytest.raises(ConfigError, match="allowed for aep: decay"):
        smoothed.aep_problem(_tiny_aep_cfg(params=("alpha",)))


# --- wafer shadow-slot count: a lattice over separately built systems ----------------------


def test_wafer_shadow_slot_lattice_interpolates_separate_builds():
    from moejax.tune import loop

    cfg = loop.TuneConfig(system="wafer", hardware="wsc-4x4", model="phi-3.5-moe",
                          policy="checkpoints/wafer-alpha-qwen3-wsc-4x4/er-mapping-invasive.toml",
                          params=("shadow_slots",), relaxation="lattice", loss="forward",
                          steps=2, traces=2, batch=2, eval_traces=2, tokens=32, iterations=3,
                          layers=1)
    prob = loop.build_problem(cfg)
    setup, f = prob.setup, prob.setup.families["shadow_slots"]
    assert len(setup.variants) == f.hi - f.lo + 1

    @jax.jit
    @jax.value_and_grad
    def ms(x):  # the lattice objective at a fractional slot count
        return loop.lattice_metrics(setup, {"shadow_slots": x}, prob.train)[
            "forward_s"].mean() * 1e3

    (v1, _), (v15, g15), (v2, _) = (ms(jnp.float32(x)) for x in (1.0, 1.5, 2.0))
    hard = [float(loop.evaluate_values(prob, {"shadow_slots": n}, prob.train)["forward_s"]
                  .mean()) * 1e3 for n in (1, 2)]
    assert hard[0] != hard[1]  # the slot count changes the result
    np.testing.assert_allclose([float(v1), float(v2)], hard, rtol=1e-6)  # exact at integers
    np.testing.assert_allclose(float(v15), (hard[0] + hard[1]) / 2, rtol=1e-6)
    np.testing.assert_allclose(float(g15), hard[1] - hard[0], rtol=1e-4)  # = the difference
    with pytest.raises(ConfigError, match="tuned alone"):
        loop.build_problem(dataclasses.replace(cfg, params=("shadow_slots", "alpha")))
