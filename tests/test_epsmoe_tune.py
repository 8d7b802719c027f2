"""EPS-MoE relaxed mode and `moejax tune --system epsmoe`: the tuning system equals the hard
system at tau = 0, approaches it as tau -> 0, and its gradient matches finite differences."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax import api, engine
from moejax.errors import ConfigError, UnknownNameError
from moejax.hardware import load_platform
from moejax.models import load_model
from moejax.systems.epsmoe import system as esys
from moejax.systems.epsmoe.config import default_params, make_config
from moejax.trace import gen
from moejax.tune import targets

H8 = load_platform("h800x8")
MODEL = load_model("deepseek-moe-16b")  # 64 experts, top-6: 8 local, divisors 1 2 4 8
NAMES = ("pn", "switch_rows", "sm_comm")


@pytest.fixture(scope="module")
def tuned():
    """(setup, trace, jitted latency(values vector [pn index, sm_comm, log switch], tau),
    its jitted gradient): one compile each."""
    policy = api.resolve("h800x8", "deepseek-moe-16b", "epsmoe-tune").policy
    setup = targets.build_setup(policy, H8, MODEL, 1, NAMES)
    tr = gen.generate("powerlaw:alpha=1.2", jax.random.key(5), num_traces=1, iterations=1,
                      layers=1, tokens=256, num_experts=64, top_k=6)

    def latency_ms(v, tau):
        values = {"pn": v[0], "sm_comm": v[1], "switch_rows": jnp.exp(v[2])}
        p = setup.apply(setup.base, values, tau)
        return engine.run_one(setup.system, p, tr[0], jax.random.key(0))["latency_s"] * 1e3

    return setup, tr, jax.jit(latency_ms), jax.jit(jax.grad(latency_ms))


def test_relaxed_equals_hard_at_zero_and_converges(tuned):
    setup, tr, f, _ = tuned
    # the rows per expert of this trace scale to ~1536 per chunk at PN=1: a switch at 1400
    # rows sits near them, so the gate matters at tau > 0
    cfg = make_config(H8, MODEL, mode="tp-ep", gemm="threshold", tokens_per_forward=16384)
    hard_system = esys.build(cfg)  # one compile: pn and the SMs are traced params
    for pn, sm_c in ((1, 16), (4, 20)):
        v = jnp.array([setup.families["pn"].as_value(pn), sm_c, np.log(1400.0)], jnp.float32)
        p = default_params(cfg, pn=pn, sm_gemm=132 - sm_c, sm_comm=sm_c, switch_rows=1400.0)
        hard = engine.simulate(hard_system, p, tr)
        np.testing.assert_allclose(float(f(v, 0.0)), hard["latency_s"][0] * 1e3, rtol=1e-6)
        gaps = [abs(float(f(v, t)) - float(f(v, 0.0))) for t in (1.0, 0.1, 0.01, 1e-4)]
        assert gaps[0] > 0 and gaps[-1] <= 1e-3 * gaps[0] + 1e-7
        assert all(b <= a + 1e-7 for a, b in zip(gaps, gaps[1:], strict=False))


def test_gradient_matches_finite_differences(tuned):
    _, _, f, g = tuned
    v = jnp.array([1.4, 17.3, np.log(1500.0)], jnp.float32)
    tau = 0.3
    grad = np.asarray(g(v, tau))
    for i, eps in enumerate((0.02, 0.02, 0.01)):
        e = jnp.zeros(3).at[i].set(eps)
        fd = (float(f(v + e, tau)) - float(f(v - e, tau))) / (2 * eps)
        assert grad[i] == pytest.approx(fd, rel=0.03, abs=1e-4), i
    assert np.all(np.isfinite(grad)) and np.abs(grad).max() > 0


def test_setup_refuses_and_maps_divisors(tuned):
    setup, *_ = tuned
    knob = setup.families["pn"]
    assert knob.divs == (1, 2, 4, 8) and knob.hard(knob.init(None, 4)) == 4
    assert setup.options({"pn": 4, "sm_comm": 20}) == {"pn": 4, "sm_comm": 20, "sm_gemm": 112}
    base = setup.baselines(np.ones(64))
    paper = next(v for k, v in base.items() if k.startswith("paper (N*="))
    assert paper["pn"] in knob.divs and paper["switch_rows"] == 2048.0
    policy = api.resolve("h800x8", "deepseek-moe-16b", "epsmoe").policy
    with pytest.raises(UnknownNameError, match="chunks"):
        targets.build_setup(policy, H8, MODEL, 1, ("chunks",))
    tp = api.resolve("h800x8", "deepseek-moe-16b", "tp-tp").policy
    with pytest.raises(ConfigError, match="tp-tp"):
        targets.build_setup(tp, H8, MODEL, 1, ("pn",))
