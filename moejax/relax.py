"""Hard-or-relaxed discrete operations: exact at `tau == 0`, smooth for `tau > 0`.

Every discrete decision of a system (max / min over devices, a threshold comparison, an
argmax assignment, rounding an integer count) goes through here, so one step function
serves exact evaluation and gradient-based tuning. `tau` may be a Python float or a traced
scalar (for temperature schedules); the hard branch is selected with `jnp.where`, and the
smooth branch is evaluated with a safe temperature so it never produces NaNs or NaN grads.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _safe(tau):
    tau = jnp.asarray(tau, jnp.float32)
    return tau, jnp.where(tau > 0, tau, 1.0)


def max(x, tau=0.0, axis=-1):  # noqa: A001 - mirrors jnp.max
    """max over `axis`; for tau > 0, tau * logsumexp(x / tau) (an upper bound, -> max)."""
    tau, t = _safe(tau)
    hard = jnp.max(x, axis=axis)
    soft = t * jax.nn.logsumexp(x / t, axis=axis)
    return jnp.where(tau > 0, soft, hard)


def min(x, tau=0.0, axis=-1):  # noqa: A001
    """min over `axis`; for tau > 0, -tau * logsumexp(-x / tau)."""
    return -max(-x, tau, axis)


def maximum(a, b, tau=0.0):
    """Elementwise max of two arrays; smooth = tau * logaddexp(a / tau, b / tau)."""
    tau, t = _safe(tau)
    return jnp.where(tau > 0, t * jnp.logaddexp(a / t, b / t), jnp.maximum(a, b))


def minimum(a, b, tau=0.0):
    """Elementwise min of two arrays."""
    return -maximum(-a, -b, tau)


def relu(x, tau=0.0):
    """max(x, 0); smooth = tau * softplus(x / tau)."""
    tau, t = _safe(tau)
    return jnp.where(tau > 0, t * jax.nn.softplus(x / t), jnp.maximum(x, 0.0))


def step(x, tau=0.0):
    """Heaviside 1[x > 0] as float; smooth = sigmoid(x / tau)."""
    tau, t = _safe(tau)
    return jnp.where(tau > 0, jax.nn.sigmoid(x / t), (x > 0).astype(jnp.float32))


def positive(x, tau=0.0):
    """Indicator 1[x > 0] for x >= 0; smooth = x / (x + tau), which is 0 at x = 0.

    For "is this expert used at all" (its weights must be loaded once if so): unlike
    `step`, the relaxed form does not charge half a load to an unused expert.
    """
    tau, t = _safe(tau)
    return jnp.where(tau > 0, x / (x + t), (x > 0).astype(jnp.float32))


def where(cond_x, a, b, tau=0.0):
    """`a` where cond_x > 0 else `b`; smooth = step(cond_x) * a + (1 - step) * b."""
    s = step(cond_x, tau)
    return s * a + (1.0 - s) * b


def argmax_onehot(x, tau=0.0, axis=-1):
    """One-hot of the argmax along `axis` (first on ties); smooth = softmax(x / tau)."""
    tau, t = _safe(tau)
    hard = jax.nn.one_hot(jnp.argmax(x, axis=axis), x.shape[axis], axis=axis, dtype=jnp.float32)
    soft = jax.nn.softmax(x / t, axis=axis)
    return jnp.where(tau > 0, soft, hard)


def argmin_onehot(x, tau=0.0, axis=-1):
    """One-hot of the argmin along `axis`."""
    return argmax_onehot(-x, tau, axis)


def round(x, tau=0.0):  # noqa: A001
    """Round to nearest integer; for tau > 0 the identity (linear interpolation between counts).

    Used for integer knobs (micro-slice counts, pipeline numbers): a relaxed system reads a
    fractional count as an interpolation between its floor and ceiling.
    """
    tau = jnp.asarray(tau, jnp.float32)
    return jnp.where(tau > 0, x, jnp.round(x))


def sinkhorn(logits, tau=1.0, row_sums=None, col_sums=None, iters=50):
    """Soft assignment with given row / column sums by Sinkhorn iterations in log space.

    logits [..., R, C]; returns a nonnegative matrix whose rows sum to `row_sums` (default 1)
    and columns to `col_sums` (default R / C). Used for relaxed expert -> device placement.
    """
    r, c = logits.shape[-2:]
    row = jnp.ones(r) if row_sums is None else jnp.asarray(row_sums, jnp.float32)
    col = jnp.full(c, r / c) if col_sums is None else jnp.asarray(col_sums, jnp.float32)
    log_a, log_b = jnp.log(row)[:, None], jnp.log(col)[None, :]
    z = logits / tau

    def body(z, _):
        z = z - jax.nn.logsumexp(z, axis=-1, keepdims=True) + log_a
        z = z - jax.nn.logsumexp(z, axis=-2, keepdims=True) + log_b
        return z, None

    z, _ = jax.lax.scan(body, z, None, length=iters)
    return jnp.exp(z)
