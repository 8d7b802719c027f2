"""Device-limited routing (DeepSeek-V2 §2.1.2, used by 003's DP+EP baseline, spec E5):
each token first picks the `max_devices` devices whose best expert scores highest, then its
top-k experts among the experts on those devices only, so it reaches at most M devices.

Same popularity families and Gumbel-top-k draw as `moejax.trace.gen.generate` (experts in
contiguous blocks of E / D per device); with M >= D it is exactly `generate`'s routing.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from moejax.errors import ConfigError
from moejax.trace import gen
from moejax.trace.checks import (
    check_int,
    check_key,
    check_shape_args,
    check_tokens_per_iteration,
)
from moejax.trace.core import Trace, counts_from_ids
from moejax.trace.families import draw, log_popularity


def _sample_one(static, floats, key, tpi, iterations, layers, tokens, num_experts, top_k,
                num_devices, max_devices):
    k_pop, k_tok = jax.random.split(key)
    log_p = log_popularity(static, floats, k_pop, iterations, layers, num_experts)
    gumbel = draw(jax.random.gumbel, k_tok, (iterations, layers, tokens, num_experts))
    scores = log_p[:, :, None, :] + gumbel  # [I, L, N, E]
    per_dev = scores.reshape(*scores.shape[:-1], num_devices, num_experts // num_devices)
    _, top_dev = jax.lax.top_k(per_dev.max(-1), max_devices)  # [I, L, N, M]
    allowed = jax.nn.one_hot(top_dev, num_devices, dtype=jnp.bool_).any(-2)  # [I, L, N, D]
    allowed = jnp.repeat(allowed, num_experts // num_devices, axis=-1)
    chosen, ids = jax.lax.top_k(jnp.where(allowed, scores, -jnp.inf), top_k)
    mask = jnp.arange(tokens)[None, :] < tpi[:, None]
    m4 = mask[:, None, :, None]
    ids = jnp.where(m4, ids, -1).astype(jnp.int32)
    weights = jnp.where(m4, jax.nn.softmax(chosen, axis=-1), 0.0)
    return (ids, weights, mask, jnp.full(mask.shape, -1, jnp.int32),
            counts_from_ids(ids, num_experts))


@functools.partial(jax.jit, static_argnums=(0, 4, 5, 6, 7, 8, 9, 10))
def _sample_batch(static, floats, keys, tpi, iterations, layers, tokens, num_experts, top_k,
                  num_devices, max_devices):
    return jax.vmap(lambda k, t: _sample_one(static, floats, k, t, iterations, layers, tokens,
                                             num_experts, top_k, num_devices, max_devices))(
        keys, tpi)


def generate(spec, key, *, num_traces: int, iterations: int, layers: int, tokens: int,
             num_experts: int, top_k: int, num_devices: int, max_devices: int,
             tokens_per_iteration=None) -> Trace:
    """A batch of device-limited traces (see module doc); arguments as `gen.generate` plus
    `num_devices` (divides num_experts) and `max_devices` M (1 <= M, M * E / D >= top_k)."""
    spec = gen.parse_spec(spec)
    key = check_key(key)
    num_traces = check_int("num_traces", num_traces)
    shape = check_shape_args(iterations, layers, tokens, num_experts, top_k)
    if num_devices < 1 or num_experts % num_devices:
        raise ConfigError(f"num_devices = {num_devices}; allowed: a divisor of the "
                          f"{num_experts} experts")
    per_dev = num_experts // num_devices
    if not 1 <= max_devices <= num_devices or max_devices * per_dev < top_k:
        raise ConfigError(f"max_devices = {max_devices}; allowed: {-(-top_k // per_dev)} .. "
                          f"{num_devices} (top-{top_k} must fit on M devices of {per_dev} "
                          "experts)")
    tpi = check_tokens_per_iteration(tokens_per_iteration, (num_traces,), shape[0], shape[2])
    keys = jax.random.split(key, num_traces)
    leaves = _sample_batch(*gen.split_spec(spec), keys, jnp.asarray(tpi), *shape, num_devices,
                           max_devices)
    return Trace(*leaves, num_experts=shape[3], top_k=shape[4])
