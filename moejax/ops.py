"""Array primitives whose batched form JAX's default vmap rule makes slow on CPU.

`bincount` is a weighted histogram of integer keys. Under `vmap`, a scatter-add becomes a
batched scatter (an operand batch dimension per vmap), which XLA's CPU backend runs about
2.5x slower than one flat scatter over `[batch * length]` bins; the `custom_vmap` rule below
offsets each batch row's keys into its own bin range and scatters once. Nested vmaps
(params x traces) recurse into the same rule, so they stay one flat scatter too.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import custom_batching


@functools.cache
def _bincount(length: int):
    @custom_batching.custom_vmap
    def f(keys, weights):
        keys = jnp.where(keys < 0, length, keys)  # negative keys would wrap around
        # segment_sum drops out-of-range keys like .at[].add(mode="drop") and its scatter
        # runs ~25% faster on CPU (1.5 vs 1.9-2.3 us per 2048 keys, measured)
        return jax.ops.segment_sum(weights, keys, length)

    @f.def_vmap
    def rule(axis_size, in_batched, keys, weights):
        keys_b, w_b = in_batched
        if not keys_b:
            keys = jnp.broadcast_to(keys, (axis_size, *keys.shape))
        if not w_b:
            weights = jnp.broadcast_to(weights, (axis_size, *weights.shape))
        # out-of-range keys must still be dropped, not spill into the next row's bins
        ok = (keys >= 0) & (keys < length)
        offset = jnp.arange(axis_size, dtype=keys.dtype).reshape((-1,) + (1,) * (keys.ndim - 1))
        flat = jnp.where(ok, keys + offset * length, axis_size * length)
        out = _bincount(axis_size * length)(flat.ravel(), weights.ravel())
        return out.reshape(axis_size, length), True

    return f


def bincount(keys: jax.Array, weights: jax.Array, length: int) -> jax.Array:
    """[length] sums of `weights` per integer key (keys outside [0, length) are dropped).

    Same as `jnp.zeros(length).at[keys].add(weights, mode="drop")` (keys and weights of one
    shape), with a fast batched form under `vmap`. Boolean weights (a mask) give integer
    counts: on CPU int16 when there are fewer than 2**15 keys (no bin can overflow), else
    int32 (and int32 on accelerators: `_narrow_counts`);
    integer weights sum as int32. XLA's CPU scatter adds integers ~1.4x faster than
    float32 (1.1 vs 1.5 us per 2048 keys, measured) and the histogram is memory-bound, so
    pass the mask, not its float. Not differentiable in `weights` (use it for counts derived
    from routing, not for quantities that carry gradients).
    """
    keys = jnp.asarray(keys)
    weights = jnp.asarray(weights)
    if weights.dtype == jnp.bool_:
        weights = weights.astype(jnp.int16 if keys.size < 2**15 and _narrow_counts()
                                 else jnp.int32)
    elif jnp.issubdtype(weights.dtype, jnp.integer):
        weights = weights.astype(jnp.int32)
    weights = jnp.broadcast_to(weights, keys.shape)
    return _bincount(int(length))(keys.ravel(), weights.ravel())


def _narrow_counts() -> bool:
    """int16 counts only on CPU: GPUs have no 16-bit atomic add (XLA emulates it)."""
    return jax.default_backend() == "cpu"
