"""Train / held-out trace batches that share one expert popularity.

`moejax.trace.gen.generate` draws a fresh popularity (e.g. the power-law rank permutation)
from each trace's key, so two calls never share which experts are hot: nothing a placement
could learn. Here the popularity p[I, L, E] is drawn once (`gen.popularity` with a
popularity key) and the tokens of the train and held-out traces are sampled from it with
different keys, by the same Gumbel-top-k rule as the generators.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from moejax.trace import gen
from moejax.trace.core import Trace, counts_from_ids


def fixed_popularity(spec, key, *, iterations: int, layers: int, num_experts: int):
    """Expert popularity float32 [I, L, E] of generator `spec` drawn with `key`."""
    return gen.popularity(spec, key, iterations=iterations, layers=layers,
                          num_experts=num_experts)


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _sample(log_p, keys, tokens: int, top_k: int, num_experts: int):
    def one(key):
        i, l, e = log_p.shape
        g = jax.random.gumbel(key, (i * l * tokens * e,), jnp.float32).reshape(i, l, tokens, e)
        scores, ids = jax.lax.top_k(log_p[:, :, None, :] + g, top_k)  # [I, L, N, K]
        return (ids.astype(jnp.int32), jax.nn.softmax(scores, axis=-1),
                jnp.ones((i, tokens), bool), jnp.full((i, tokens), -1, jnp.int32),
                counts_from_ids(ids, num_experts))

    return jax.vmap(one)(keys)


def sample_from_popularity(popularity, key, *, num_traces: int, tokens: int,
                           top_k: int) -> Trace:
    """`num_traces` token-level traces [T, I, L, N, K] routed by `popularity` [I, L, E]:
    each token's top-k experts without replacement (Gumbel-top-k), gate weights = softmax
    of the perturbed scores over its k choices."""
    log_p = jnp.log(jnp.maximum(jnp.asarray(popularity, jnp.float32), 1e-30))
    e = log_p.shape[-1]
    leaves = _sample(log_p, jax.random.split(key, num_traces), tokens, top_k, e)
    return Trace(*leaves, num_experts=e, top_k=top_k)
