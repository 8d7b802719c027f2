"""relax: exact at tau = 0, smooth and convergent as tau -> 0, finite gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from moejax import relax

X = jnp.array([0.3, -1.2, 2.5, 2.4])


def test_hard_mode_is_exact():
    assert relax.max(X, 0.0) == 2.5 and relax.min(X, 0.0) == -1.2
    np.testing.assert_array_equal(relax.step(X, 0.0), [1, 0, 1, 1])
    np.testing.assert_array_equal(relax.argmax_onehot(X, 0.0), [0, 0, 1, 0])
    np.testing.assert_array_equal(relax.relu(X, 0.0), jnp.maximum(X, 0))
    np.testing.assert_array_equal(relax.positive(jnp.array([0.0, 0.5, 3.0]), 0.0), [0, 1, 1])
    np.testing.assert_array_equal(relax.round(jnp.array([1.4, 1.6]), 0.0), [1, 2])


@pytest.mark.parametrize("fn", [
    lambda x, t: relax.max(x, t), lambda x, t: relax.min(x, t),
    lambda x, t: relax.relu(x, t).sum(), lambda x, t: relax.step(x, t).sum(),
    lambda x, t: relax.argmax_onehot(x, t)[2],
    lambda x, t: relax.maximum(x, x[::-1], t).sum(),
])
def test_relaxed_converges_to_hard(fn):
    hard = fn(X, 0.0)
    errs = [abs(float(fn(X, t) - hard)) for t in (1.0, 0.1, 0.01, 0.001)]
    assert errs[-1] < 1e-2 and errs[-1] <= errs[0]


def test_gradients_match_finite_differences():
    for f in (lambda x: relax.max(x, 0.5), lambda x: relax.relu(x, 0.5).sum(),
              lambda x: relax.step(x, 0.5).sum(), lambda x: relax.positive(x ** 2, 0.5).sum()):
        check_grads(f, (X,), order=1, modes=["rev"], atol=1e-2, rtol=1e-2)


def test_traced_tau_and_no_nan_gradients_at_zero():
    g = jax.grad(lambda x, t: relax.max(x, t))(X, jnp.float32(0.0))
    assert np.isfinite(np.asarray(g)).all()
    f = jax.jit(lambda t: relax.max(X, t))
    assert float(f(0.0)) == 2.5 and float(f(1.0)) > 2.5


def test_sinkhorn_marginals():
    logits = jax.random.normal(jax.random.key(0), (8, 4))
    p = relax.sinkhorn(logits, tau=0.5)
    np.testing.assert_allclose(p.sum(1), 1.0, atol=1e-4)
    np.testing.assert_allclose(p.sum(0), 2.0, atol=1e-4)


def test_branch_picks_hard_or_smooth_once():
    f = lambda t: relax.max(X, t) + relax.relu(X, t).sum()  # noqa: E731
    # a traced tau: the hard branch sees the Python float 0.0, the smooth one the tau
    g = jax.jit(lambda tau: relax.branch(tau, f))
    np.testing.assert_allclose(g(jnp.float32(0.0)), f(0.0), rtol=1e-6)
    np.testing.assert_allclose(g(jnp.float32(0.3)), f(0.3), rtol=1e-6)
    assert relax.branch(0.0, lambda t: t) == 0.0 and isinstance(relax.branch(0, lambda t: t),
                                                                  float)
    # gradients flow through the chosen branch, in x and in tau
    dx = jax.grad(lambda x: relax.branch(jnp.float32(0.3), lambda t: relax.max(x, t)))(X)
    np.testing.assert_allclose(dx, jax.grad(lambda x: relax.max(x, 0.3))(X), rtol=1e-5)
    dt = jax.grad(lambda tau: relax.branch(tau, lambda t: relax.max(X, t)))(jnp.float32(0.3))
    assert np.isfinite(dt) and dt > 0
