"""Hard-or-relaxed discrete operations: exact at `tau == 0`, smooth for `tau > 0`.

Every discrete decision of a system (max / min over devices, a threshold comparison, an
argmax assignment, rounding an integer count) goes through here, so one step function
serves exact evaluation and gradient-based tuning. `tau` may be a Python float (the branch is
chosen statically) or a traced scalar (temperature schedules, `lax.cond`, so hard mode does
not pay for the smooth branch); the smooth branch always sees a safe positive temperature,
so neither branch produces NaNs or NaN gradients.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _choose(tau, hard_fn, soft_fn):
    """hard_fn() if tau == 0 else soft_fn(t): statically for Python numbers, by `lax.cond`
    for a traced scalar (so hard mode skips the smooth branch's exp / log; under a vmap
    with a batched tau it becomes a select)."""
    if isinstance(tau, (int, float)):
        return soft_fn(jnp.float32(tau)) if tau > 0 else hard_fn()
    tau = jnp.asarray(tau, jnp.float32)
    return jax.lax.cond(tau > 0, lambda: soft_fn(jnp.where(tau > 0, tau, 1.0)), hard_fn)


def branch(tau, fn):
    """fn(0.0) if tau == 0 else fn(tau): one `lax.cond` around a whole computation.

    Inside the hard branch `tau` is the Python float 0.0, so every relax op in `fn` takes
    its hard form statically and XLA fuses `fn` into plain arithmetic; with a traced tau
    each op's own cond would cut the fusion and write its operands out. The smooth branch
    passes a traced positive tau on.
    """
    return _choose(tau, lambda: fn(0.0), fn)


def max(x, tau=0.0, axis=-1):  # noqa: A001 - mirrors jnp.max
    """max over `axis`; for tau > 0, tau * logsumexp(x / tau) (an upper bound, -> max)."""
    return _choose(tau, lambda: jnp.max(x, axis=axis),
                   lambda t: t * jax.nn.logsumexp(x / t, axis=axis))


def min(x, tau=0.0, axis=-1):  # noqa: A001
    """min over `axis`; for tau > 0, -tau * logsumexp(-x / tau)."""
    return -max(-x, tau, axis)


def maximum(a, b, tau=0.0):
    """Elementwise max of two arrays; smooth = tau * logaddexp(a / tau, b / tau)."""
    return _choose(tau, lambda: jnp.maximum(a, b), lambda t: t * jnp.logaddexp(a / t, b / t))


def minimum(a, b, tau=0.0):
    """Elementwise min of two arrays."""
    return -maximum(-a, -b, tau)


def relu(x, tau=0.0):
    """max(x, 0); smooth = tau * softplus(x / tau)."""
    return _choose(tau, lambda: jnp.maximum(x, 0.0), lambda t: t * jax.nn.softplus(x / t))


def step(x, tau=0.0):
    """Heaviside 1[x > 0] as float; smooth = sigmoid(x / tau)."""
    return _choose(tau, lambda: (x > 0).astype(jnp.float32), lambda t: jax.nn.sigmoid(x / t))


def positive(x, tau=0.0):
    """Indicator 1[x > 0] for x >= 0; smooth = x / (x + tau), which is 0 at x = 0.

    For "is this expert used at all" (its weights must be loaded once if so): unlike
    `step`, the relaxed form does not charge half a load to an unused expert.
    """
    return _choose(tau, lambda: (x > 0).astype(jnp.float32), lambda t: x / (x + t))


def where(cond_x, a, b, tau=0.0):
    """`a` where cond_x > 0 else `b`; smooth = step(cond_x) * a + (1 - step) * b."""
    s = step(cond_x, tau)
    return s * a + (1.0 - s) * b


def argmax_onehot(x, tau=0.0, axis=-1):
    """One-hot of the argmax along `axis` (first on ties); smooth = softmax(x / tau)."""
    return _choose(
        tau,
        lambda: jax.nn.one_hot(jnp.argmax(x, axis=axis), x.shape[axis], axis=axis,
                               dtype=jnp.float32),
        lambda t: jax.nn.softmax(x / t, axis=axis),
    )


def argmin_onehot(x, tau=0.0, axis=-1):
    """One-hot of the argmin along `axis`."""
    return argmax_onehot(-x, tau, axis)


def round(x, tau=0.0):  # noqa: A001
    """Round to nearest integer; for tau > 0 the identity (linear interpolation between counts).

    Used for integer knobs (micro-slice counts, pipeline numbers): a relaxed system reads a
    fractional count as an interpolation between its floor and ceiling.
    """
    return _choose(tau, lambda: jnp.round(x), lambda t: x)


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
