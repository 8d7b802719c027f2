"""The hard-only program: params whose temperatures are all 0 run in a program whose conds
on a temperature compile their hard branch only (`relax.hard_program`), with the two-branch
program's results bit for bit; relaxed params never reach it."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax import relax
from moejax.errors import MoejaxError
from moejax.runner import engine
from moejax.systems import SYSTEMS, resolve
from moejax.trace import gen

# one setup per system with conds on a temperature (EP's expert branch, FSE-DP's, the wafer
# layer's and DySHARP's whole-layer branches), and one without (EPS-MoE)
SETUPS = [
    ("chiplet-2x2", "qwen3-30b-a3b", "ep"),
    ("chiplet-2x2", "qwen3-30b-a3b", "fsedp"),
    ("wsc-4x4", "qwen3-30b-a3b", "ep-baseline-map"),
    ("gh200-nvl8", "deepseek-v3", "dysharp"),
    ("h800x8", "mixtral-8x7b", "epsmoe"),
]


def _setup(hw, model, policy, n=4, tokens=32):
    s = resolve(hw, model, policy)
    system, params = SYSTEMS[s.policy.system].from_policy(
        s.platform, s.model, s.policy.options_table(), 1)
    traces = gen.generate("powerlaw:alpha=1.2", jax.random.key(2), num_traces=n, iterations=1,
                          layers=2, tokens=tokens, num_experts=s.model.num_experts,
                          top_k=s.model.top_k)
    keys = jax.random.key_data(jax.random.split(jax.random.key(0), n))
    return system, params, traces, keys


@pytest.mark.parametrize("hw,model,policy", SETUPS, ids=[p for _, _, p in SETUPS])
def test_the_hard_program_equals_the_two_branch_one_bit_for_bit(hw, model, policy):
    system, params, traces, keys = _setup(hw, model, policy)
    hard = engine.program_for(system, params, False, "threefry2x32")
    two = engine.compiled_program(system, False, "threefry2x32", hard=False)
    assert hard.hard and not two.hard and hard is not two
    a, b = hard(params, traces, keys), two(params, traces, keys)
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a),
                            jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y),
                                      err_msg=jax.tree_util.keystr(path))


def test_relaxed_params_get_the_two_branch_program_and_the_hard_one_refuses_them():
    # the EP setup of the test above (4 traces): both of its programs are reused here
    system, params, traces, keys = _setup("chiplet-2x2", "qwen3-30b-a3b", "ep")
    relaxed = dataclasses.replace(params, tau=jnp.float32(0.05))
    assert relax.tau_is_zero(params) and not relax.tau_is_zero(relaxed)
    hard = engine.program_for(system, params, False, "threefry2x32")
    assert hard.hard
    assert not engine.program_for(system, relaxed, False, "threefry2x32").hard
    assert not engine.program_for(system, params, True, "threefry2x32").hard  # a sweep
    with pytest.raises(MoejaxError, match="temperature"):
        hard(relaxed, traces, keys)
    # under a trace (tuning's grad) the temperature is not known: the two-branch program
    seen = []
    jax.jit(lambda p: seen.append(relax.tau_is_zero(p)) or p.tau)(params)
    assert seen == [False]
    # relaxed results are the two-branch program's (finite, and not the hard ones)
    out = engine.simulate(system, relaxed, traces, jax.random.key(0))
    hard_out = engine.simulate(system, params, traces, jax.random.key(0))
    assert np.all(np.isfinite(out["latency_s"]))
    assert not np.array_equal(out["latency_s"], hard_out["latency_s"])


def test_tau_is_zero_reads_every_temperature_field():
    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class P:
        x: jax.Array
        tau: jax.Array
        tau_trigger: jax.Array

    zero, one = jnp.float32(0), jnp.float32(1)
    assert relax.tau_is_zero(P(one, zero, zero))
    assert not relax.tau_is_zero(P(zero, zero, one))
    assert not relax.tau_is_zero(P(zero, jnp.zeros(3).at[1].set(1.0), zero))
    assert not relax.tau_is_zero({"x": zero})  # no temperature: not known to be hard


def test_a_hard_program_given_a_positive_temperature_returns_nan_not_a_wrong_number():
    def f(x, tau):
        return relax.max(x, tau) + relax.branch(tau, lambda t: relax.relu(x, t).sum())

    def f_hard(x, tau):
        with relax.hard_program():
            return f(x, tau)

    x = jnp.array([1.0, -2.0, 3.0])
    assert jax.jit(f_hard)(x, 0.0) == jax.jit(f)(x, 0.0) == 7.0
    assert np.isnan(jax.jit(f_hard)(x, 0.5))
    assert np.isfinite(jax.jit(f)(x, 0.5))
