"""A batch of traces made on demand, one chunk at a time, so it never exists whole.

`moejax.runner.engine.simulate` asks a `ChunkedTraces` for the chunk of each compiled call and
drops it after the call; memory then grows with the chunk, not with the batch (a whole
generated batch of 20 000 traces peaked at 21.5 GB).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import numpy as np

from moejax.errors import ConfigError
from moejax.trace.core import Trace


@dataclasses.dataclass(frozen=True, eq=False)
class ChunkedTraces:
    """`num_traces` traces; `chunk(start, stop)` makes traces [start, stop) as a `Trace`
    batch. Shape attributes mirror `Trace`'s, so shape checks need no chunk.

    scratch_bytes_per_trace: what making one trace holds at once besides its leaves (the
    generator's Gumbel scores), for sizing chunks.
    """

    num_traces: int
    make: Callable[[int, int], Trace]
    num_experts: int
    top_k: int
    num_iterations: int
    num_layers: int
    num_tokens: int
    scratch_bytes_per_trace: int = 0

    @property
    def has_tokens(self) -> bool:
        return self.num_tokens > 0

    @property
    def batch_shape(self) -> tuple[int]:
        return (self.num_traces,)

    @property
    def bytes_per_trace(self) -> int:
        """Bytes of one trace's leaves (ids, gate weights, mask, request, counts)."""
        i, l, n, k, e = (self.num_iterations, self.num_layers, self.num_tokens, self.top_k,
                         self.num_experts)
        return 4 * i * l * n * k * 2 + i * n * (1 + 4) + 4 * i * l * e

    def chunk(self, start: int, stop: int) -> Trace:
        """Traces [start, stop), leaves with a leading axis of stop - start."""
        if not 0 <= start < stop <= self.num_traces:
            raise ConfigError(f"chunk: [{start}, {stop}) is not a non-empty range within "
                              f"[0, {self.num_traces})")
        return self.make(int(start), int(stop))

    def rows(self, start: int, stop: int) -> ChunkedTraces:
        """Traces [start, stop) as a `ChunkedTraces` of their own (nothing made yet): one
        process's block of a multi-process run (`moejax.runner.distributed.Partition.take`)."""
        if not 0 <= start < stop <= self.num_traces:
            raise ConfigError(f"rows: [{start}, {stop}) is not a non-empty range within "
                              f"[0, {self.num_traces})")
        make = self.make
        return dataclasses.replace(self, num_traces=stop - start,
                                   make=lambda a, b: make(start + a, start + b))

    def materialize(self) -> Trace:
        """The whole batch at once (small batches, tests)."""
        return self.chunk(0, self.num_traces)


def key_data_of(key: jax.Array, num: int) -> tuple[np.ndarray, str]:
    """(raw data of `jax.random.split(key, num)` on host, key impl name): sliced per chunk
    without a compile per offset, wrapped back inside the chunk's compiled call."""
    if not jax.numpy.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)  # a legacy uint32 PRNGKey
    keys = jax.random.split(key, num)
    return np.asarray(jax.random.key_data(keys)), str(jax.random.key_impl(keys))
