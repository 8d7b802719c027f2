"""Generator version 2 (experimental, not the default): the same distribution as
`moejax.trace.gen.generate`, drawn with 2k uniforms per token instead of a Gumbel score for
every expert.

`generate` draws E Gumbel scores per token and keeps the top k (the Gumbel-top-k trick):
for 256 tokens of 128 experts that is 32,768 threefry words per layer and iteration, and the
random bits are most of its time on CPU. Version 2 samples the same law sequentially:

- expert j+1 is drawn from the popularity with the j chosen experts removed (inverse CDF of
  one uniform mapped past the removed intervals, then a binary search in the CDF); this is
  the law of the argmax of the remaining perturbed scores, which is independent of the
  value of that maximum (Gumbel-max);
- the chosen experts' perturbed scores, which set the gate weights (softmax over the k),
  are drawn top down: the largest is Gumbel(log 1), each next one a Gumbel(log of the
  remaining mass) truncated below the previous, `-log(exp(-z_prev) + exp(-G))`.

So (ids, scores) have the joint law of Gumbel-top-k, and the traces the law of version 1;
the random stream differs, so a trace from version 2 is not the trace of version 1 with the
same key (the committed study results use version 1).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from moejax.trace.checks import (
    check_int,
    check_key,
    check_shape_args,
    check_tokens_per_iteration,
)
from moejax.trace.core import Trace, counts_from_ids
from moejax.trace.families import draw, log_popularity
from moejax.trace.gen import parse_spec, split_spec

VERSION = 2


def _sample_one(static, floats, key, tpi, iterations, layers, tokens, num_experts, top_k):
    """Leaves of one trace (tpi int32 [I]), version 2."""
    k_pop, k_tok = jax.random.split(key)
    log_p = log_popularity(static, floats, k_pop, iterations, layers, num_experts)
    p = jax.nn.softmax(log_p, axis=-1)  # [I, L, E]
    cdf = jnp.cumsum(p, axis=-1)
    start = cdf - p  # each expert's interval [start, cdf)
    u = draw(jax.random.uniform, k_tok, (iterations, layers, tokens, 2 * top_k))
    pick_u, score_u = u[..., :top_k], u[..., top_k:]
    find = jax.vmap(jax.vmap(lambda c, y: jnp.searchsorted(c, y, side="right")))  # over I, L
    # experts by falling popularity: among the first j + 1 of them one is still free
    likeliest = jnp.argsort(-p, axis=-1, stable=True)[..., : top_k].astype(jnp.int32)
    ids, widths, starts, scores = [], [], [], []
    left = jnp.ones((iterations, layers, tokens), jnp.float32)  # mass not yet chosen
    z_prev = None
    for j in range(top_k):  # static k: each step is O(j) per token
        x = pick_u[..., j] * left
        y = x
        for _ in range(j):  # past the removed intervals: a fixed point reached in j steps
            y = x + sum(jnp.where(s <= y, w, 0.0) for s, w in zip(starts, widths, strict=True))
        e = jnp.minimum(find(cdf, y), num_experts - 1).astype(jnp.int32)
        pe = jnp.take_along_axis(p, e, axis=-1)
        taken = functools.reduce(jnp.logical_or, [e == c for c in ids], pe <= 0)
        # float rounding at an interval's edge: the likeliest expert still free instead
        fallback = likeliest[:, :, None, j] + jnp.zeros_like(e)
        for r in range(j - 1, -1, -1):
            cand = likeliest[:, :, None, r]
            free = ~functools.reduce(jnp.logical_or, [cand == c for c in ids],
                                     jnp.zeros_like(e, bool))
            fallback = jnp.where(free, cand, fallback)
        e = jnp.where(taken, fallback, e)
        pe = jnp.take_along_axis(p, e, axis=-1)
        g = jnp.log(left) - jnp.log(-jnp.log(score_u[..., j]))  # Gumbel(log left)
        z = g if z_prev is None else -jnp.logaddexp(-z_prev, -g)  # truncated below z_prev
        ids.append(e)
        scores.append(z)
        widths.append(pe)
        starts.append(jnp.take_along_axis(start, e, axis=-1))
        left = jnp.maximum(left - pe, 0.0)
        z_prev = z
    ids = jnp.stack(ids, axis=-1)  # [I, L, N, K], in score order like `lax.top_k`
    scores = jnp.stack(scores, axis=-1)
    real = jnp.arange(tokens)[None, :] < tpi[:, None]  # [I, N]
    m4 = real[:, None, :, None]
    ids = jnp.where(m4, ids, -1).astype(jnp.int32)
    weights = jnp.where(m4, jax.nn.softmax(scores, axis=-1), 0.0)
    return (ids, weights, real, jnp.full(real.shape, -1, jnp.int32),
            counts_from_ids(ids, num_experts))


@functools.partial(jax.jit, static_argnums=(0, 4, 5, 6, 7, 8))
def _sample_batch(static, floats, keys, tpi, iterations, layers, tokens, num_experts, top_k):
    one = functools.partial(_sample_one, static, floats, iterations=iterations, layers=layers,
                            tokens=tokens, num_experts=num_experts, top_k=top_k)
    return jax.vmap(one)(keys, tpi)


def generate(spec, key, *, num_traces: int, iterations: int, layers: int, tokens: int,
             num_experts: int, top_k: int, tokens_per_iteration=None) -> Trace:
    """`moejax.trace.gen.generate`'s arguments and law, drawn by version 2 (see the module
    docstring); trace t uses `jax.random.split(key, num_traces)[t]`."""
    spec = parse_spec(spec)
    key = check_key(key)
    num_traces = check_int("num_traces", num_traces)
    shape = check_shape_args(iterations, layers, tokens, num_experts, top_k)
    tpi = check_tokens_per_iteration(tokens_per_iteration, (num_traces,), shape[0], shape[2])
    keys = jax.random.split(key, num_traces)
    leaves = _sample_batch(*split_spec(spec), keys, jnp.asarray(tpi), *shape)
    return Trace(*leaves, num_experts=shape[3], top_k=shape[4])
