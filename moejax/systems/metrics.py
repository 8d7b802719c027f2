"""What a trace system's scan step reads and keeps: one iteration of routing, running metrics.

The runner's scan hands a trace system's `step` one `Iteration` of its trace at a time
(`System.inputs = iterations_of`), so no State holds the trace. The step folds its
per-iteration metrics into a `Running` carry: sums over the iterations that have tokens
(an iteration with none, as padding at a trace's end, counts for nothing), totals over every
iteration, running maxima, and the count of iterations with tokens; `finish` reads the
means, totals and peaks.

The same trace must give the same float32 bits on one device and sharded over several
(`rounded`, `share_of`): XLA optimizes the two programs slightly differently, and where a
rounding depends on that choice the metric is written so that it does not.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from moejax.trace import Trace


@struct.dataclass
class Iteration:
    """One iteration of a trace, as the scan hands it to `step`.

    index       int32 []  iteration number t
    expert_ids  int32 [L, N, K]  chosen experts (-1 in padded slots; N = 0 counts-only)
    token_mask  bool [N]  real token slots
    counts      float32 [L, E]  tokens routed to each expert
    """

    index: jax.Array
    expert_ids: jax.Array
    token_mask: jax.Array
    counts: jax.Array


def iterations_of(trace: Trace, num_steps: int) -> Iteration:
    """A trace's routing as `num_steps` iterations (leaves with a leading `[num_steps]` axis).

    Steps past the trace's last iteration repeat it, as indexing `trace.counts[t]` clamps.
    """
    t = jnp.arange(num_steps, dtype=jnp.int32)
    leaves = (trace.expert_ids, trace.token_mask, trace.counts)
    if num_steps != trace.num_iterations:
        last = trace.num_iterations - 1
        leaves = tuple(x[jnp.minimum(t, last)] for x in leaves)
    return Iteration(t, *leaves)


def inputs(num_steps: int):
    """`System.inputs` of a trace system scanned over `num_steps` iterations."""
    return lambda trace: iterations_of(trace, num_steps)


def real_iteration(tokens) -> jax.Array:
    """float32 1.0 if an iteration has tokens (`tokens` > 0), else 0.0: the weight of its
    metrics in `Running.add`."""
    return (tokens > 0).astype(jnp.float32)


def rounded(*xs):
    """`xs` unchanged, each rounded to float32 on its own before any later use.

    XLA's CPU backend fuses a product and the sum it feeds into one fused multiply-add (one
    rounding instead of two), and in a sum of two products it fuses one of them, which one
    depending on small differences between programs: the same trace gave a forward time
    `a * x + b * y` one float32 ulp apart on one device and sharded over four. Behind this
    barrier every product is rounded before the sum, in every program.
    """
    return jax.lax.optimization_barrier(xs)


def share_of(x, total):
    """`x / total` for a scalar `total`: a scalar divided, an array times `1 / total`.

    XLA rewrites an array divided by a broadcast scalar into the array times the scalar's
    reciprocal (one rounding more) in some programs and not in others: a per-device mean
    came out one ulp apart on one device and sharded over four. Written as the product here,
    it is the same in every program.
    """
    return x / total if jnp.ndim(x) == 0 else x * (1.0 / total)


def _zeros(shapes: dict) -> dict:
    return {k: jnp.zeros(s, jnp.float32) for k, s in shapes.items()}


@struct.dataclass
class Running:
    """Metrics of one trace accumulated over its iterations (float32).

    sums    name -> sum over iterations with tokens of the iteration's value
    totals  name -> sum over every iteration
    peaks   name -> maximum over every iteration (from 0)
    iterations  count of iterations with tokens
    """

    sums: dict
    totals: dict
    peaks: dict
    iterations: jax.Array

    @classmethod
    def zeros(cls, sums: dict, totals: dict | None = None,
              peaks: dict | None = None) -> Running:
        """All zero; each dict maps a name to its shape (`()` for a scalar)."""
        return cls(_zeros(sums), _zeros(totals or {}), _zeros(peaks or {}), jnp.float32(0.0))

    def add(self, real, sums: dict, totals: dict | None = None,
            peaks: dict | None = None) -> Running:
        """Fold in one iteration; `real` (0.0 or 1.0, `real_iteration`) weighs its `sums`.

        Every name of the carry must be given: a metric left out would silently stop.
        """
        totals, peaks = totals or {}, peaks or {}
        for have, got in ((self.sums, sums), (self.totals, totals), (self.peaks, peaks)):
            if have.keys() != got.keys():
                raise KeyError(f"metrics: expected {sorted(have)}, got {sorted(got)}")
        return Running(
            {k: self.sums[k] + real * v for k, v in sums.items()},
            {k: self.totals[k] + v for k, v in totals.items()},
            {k: jnp.maximum(self.peaks[k], v) for k, v in peaks.items()},
            self.iterations + real,
        )

    def count(self) -> jax.Array:
        """Iterations with tokens, at least 1 (the divisor of every mean)."""
        return jnp.maximum(self.iterations, 1.0)

    def means(self) -> dict:
        """name -> mean over iterations with tokens, of every `sums` entry (`share_of`)."""
        n = self.count()
        return {k: share_of(v, n) for k, v in self.sums.items()}
