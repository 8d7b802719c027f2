"""Hard-or-relaxed discrete operations: exact at `tau == 0`, smooth for `tau > 0`.

Every discrete decision of a system (max / min over devices, a threshold comparison, an
argmax assignment, rounding an integer count) goes through here, so one step function
serves exact evaluation and gradient-based tuning. `tau` may be a Python float (the branch is
chosen statically) or a traced scalar (temperature schedules, `lax.cond`, so hard mode does
not pay for the smooth branch); the smooth branch always sees a safe positive temperature,
so neither branch produces NaNs or NaN gradients. A program traced in `hard_program` (params
whose temperatures are all 0) compiles each such cond's hard branch only.
"""

from __future__ import annotations

import contextlib
import threading

import jax
import jax.numpy as jnp
import numpy as np

# True while a program is traced whose temperatures are all known to be 0 (`hard_program`).
_HARD = threading.local()


@contextlib.contextmanager
def hard_program():
    """Trace a program that only ever runs hard (every `tau` it reads is 0 when it runs):
    inside, each `lax.cond` on a traced temperature keeps its hard branch as it is and gets
    a NaN fill of the same shapes as its smooth branch, so XLA compiles one real branch.

    The cond stays (rather than the hard ops inlined): XLA compiles a branch as its own
    computation, so the hard branch fuses and rounds exactly as in the two-branch program,
    bit for bit; inlined, XLA fused the hard ops with their neighbours and the results moved
    by float32 rounding. A program traced here that meets tau > 0 returns NaN, never a
    silently wrong number. The engine traces in here when the params' temperatures are
    concretely 0 (`tau_is_zero`) and keys that program apart from the two-branch one."""
    before = getattr(_HARD, "on", False)
    _HARD.on = True
    try:
        yield
    finally:
        _HARD.on = before


def tau_is_zero(params) -> bool:
    """True when every temperature in `params` (the fields named `tau` or `tau_*` of its
    dataclasses, at any depth) is a concrete array or number equal to 0 everywhere: the
    params can run in a `hard_program`. False for a traced temperature (tuning) or any
    nonzero one, and for params with no temperature field."""
    found = False
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        name = getattr(path[-1], "name", None) if path else None
        if not isinstance(name, str) or not (name == "tau" or name.startswith("tau_")):
            continue
        if isinstance(leaf, jax.core.Tracer):
            return False
        if not np.all(np.asarray(leaf) == 0):
            return False
        found = True
    return found


def _choose(tau, hard_fn, soft_fn):
    """hard_fn() if tau == 0 else soft_fn(t): statically for Python numbers, by `lax.cond`
    for a traced scalar (so hard mode skips the smooth branch's exp / log; under a vmap
    with a batched tau it becomes a select). In a `hard_program` the smooth branch is a NaN
    fill, never run."""
    if isinstance(tau, (int, float)):
        return soft_fn(jnp.float32(tau)) if tau > 0 else hard_fn()
    tau = jnp.asarray(tau, jnp.float32)
    if getattr(_HARD, "on", False):
        return _hard_only(tau, hard_fn)
    return jax.lax.cond(tau > 0, lambda: soft_fn(jnp.where(tau > 0, tau, 1.0)), hard_fn)


def _hard_only(tau, hard_fn):
    """`lax.cond(tau > 0, NaN fill, hard_fn)`. `lax.cond` traces its true branch first, so
    the hard branch goes first (predicate `not tau > 0`) and the fill takes its shapes."""
    shapes = []

    def hard():
        out = hard_fn()
        shapes.append(jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(
            jnp.shape(x), jnp.result_type(x)), out))
        return out

    def fill():
        spec = shapes[0] if shapes else jax.eval_shape(hard_fn)
        return jax.tree_util.tree_map(lambda s: jnp.full(s.shape, jnp.nan, s.dtype)
                                      if jnp.issubdtype(s.dtype, jnp.floating)
                                      else jnp.zeros(s.shape, s.dtype), spec)

    return jax.lax.cond(jnp.logical_not(tau > 0), hard, fill)


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
