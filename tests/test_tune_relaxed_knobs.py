"""Relaxed paths of the knobs that had only a hard grid (issue 6): the wafer NI-Balancer
trigger alpha (001 Eq. 2) through the gated wafer step, and AEP's decay delta (002 §3.4
Algorithm 1) through Gaussian smoothing with an antithetic score-function estimator."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax import api, engine
from moejax.systems.wafer import balancer as bal
from moejax.systems.wafer import system as wsys
from moejax.tune.traces import fixed_popularity, sample_from_popularity

# --- wafer: Eq. 2 gate inside the step ------------------------------------------------------


def _wafer(invasive, kind, iterations=6, traces=3):
    s = api.resolve("wsc-4x4", "phi-3.5-moe", "er-mapping")
    pop = fixed_popularity("powerlaw:alpha=1.5", jax.random.key(1), iterations=iterations,
                           layers=2, num_experts=s.model.num_experts)
    tr = sample_from_popularity(pop, jax.random.key(2), num_traces=traces, tokens=32,
                                top_k=s.model.top_k)
    cfg = wsys.make_config(s.platform, s.model, mapping="er", tp_size=4, balancer=kind,
                           invasive=invasive, shadow_slots=1, micro_batches=(1, 2))
    return cfg, wsys.build(cfg, iterations), tr


# Produced by the boolean step of commit 48221d5 (before the gate) on exactly these
# configs, alpha = 0.3: every output leaf was bit-equal to the gated step at tau = 0.
BOOLEAN_PATH = {
    (True, "topology"): ([0.0011325583327561617, 0.0010276850080117583, 0.0010801058961078525],
                         [512.0, 544.0, 480.0]),
    (False, "greedy"): ([0.00045127817429602146, 0.00045118259731680155,
                         0.00045123175368644297], [288.0, 256.0, 272.0]),
}


@pytest.mark.parametrize("invasive,kind", list(BOOLEAN_PATH))
def test_wafer_gated_step_at_tau_zero_is_the_boolean_path(invasive, kind):
    cfg, sysm, tr = _wafer(invasive, kind)
    p = wsys.default_params(cfg, alpha=0.3, beta=1.0 if invasive else 0.0)
    out = engine.simulate(sysm, p, tr)
    fwd, mig = BOOLEAN_PATH[(invasive, kind)]
    np.testing.assert_array_equal(np.asarray(out["forward_s"]), np.float32(fwd))
    np.testing.assert_array_equal(np.asarray(out["migrations"]), np.float32(mig))
    # a threshold above every imbalance never triggers: no copies (and, invasive, no stalls;
    # non-invasive copies are still in flight after 6 iterations, so the time is the same)
    never = engine.simulate(sysm, p.replace(alpha=jnp.float32(1e6)), tr)
    assert float(np.asarray(never["migrations"]).sum()) == 0.0
    assert np.array_equal(np.asarray(never["forward_s"]), np.float32(fwd)) == (not invasive)


def _forward_of_alpha(cfg, sysm, tr, tau):
    base = wsys.default_params(cfg, alpha=0.0, beta=0.0)

    @jax.jit
    def f(alpha):
        p = base.replace(alpha=alpha, tau=jnp.float32(tau))
        return engine.simulate(sysm, p, tr)["forward_s"].mean() * 1e3  # ms
    return f


def test_wafer_relaxed_forward_time_gradient_in_alpha_matches_central_difference():
    cfg, sysm, tr = _wafer(True, "topology", iterations=4, traces=2)
    # alpha near the observed Eq. 2 sums (2 layers; per-iteration loads are layer means),
    # so the gate is not saturated
    loads = engine.simulate(sysm, wsys.default_params(cfg, alpha=1e6), tr)["per_iteration"][
        "device_load"]  # [T, I, D]
    imb = 2.0 * float(np.median(np.asarray(bal.layer_imbalance(loads))))
    f = _forward_of_alpha(cfg, sysm, tr, tau=0.5)
    a = jnp.float32(imb)
    g = float(jax.grad(f)(a))
    h = 0.02
    fd = (float(f(a + h)) - float(f(a - h))) / (2 * h)
    assert abs(g) > 1e-4, g  # alpha reaches the forward time
    np.testing.assert_allclose(g, fd, rtol=0.05)


def test_wafer_relaxed_forward_time_tends_to_hard_as_tau_falls():
    cfg, sysm, tr = _wafer(True, "topology", iterations=4, traces=2)
    alpha = jnp.float32(2.0)
    hard = float(_forward_of_alpha(cfg, sysm, tr, 0.0)(alpha))
    errs = [abs(float(_forward_of_alpha(cfg, sysm, tr, t)(alpha)) - hard) / hard
            for t in (1.0, 0.1, 1e-2, 1e-4)]
    assert all(a > b for a, b in zip(errs, errs[1:], strict=False)) and errs[-1] < 1e-3, errs
