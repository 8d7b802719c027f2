"""The routing-trace pytree: which experts each token of each layer and iteration chose.

Axes (STYLE.md): `[T]` traces (only in a batch), `[I]` iterations, `[L]` MoE layers,
`[N]` token slots (padded, see `token_mask`), `[K]` top-k, `[E]` experts.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from moejax.errors import TraceError
from moejax.ops import bincount

SCHEMA_VERSION = 1


@struct.dataclass
class Trace:
    """Routing of one trace (or a batch of traces, with a leading `[T]` axis on every leaf).

    expert_ids    int32 [I, L, N, K]  chosen experts, -1 in padded token slots
    gate_weights  float32 [I, L, N, K]  gate weight of each choice (0 in padded slots)
    token_mask    bool [I, N]  which token slots hold a real token this iteration
    token_request int32 [I, N]  request that owns each token (-1 when not tracked)
    counts        float32 [I, L, E]  tokens routed to each expert (always present; the only
                  routing data of a counts-only trace, whose N axis has length 0)
    """

    expert_ids: jax.Array
    gate_weights: jax.Array
    token_mask: jax.Array
    token_request: jax.Array
    counts: jax.Array
    num_experts: int = struct.field(pytree_node=False)
    top_k: int = struct.field(pytree_node=False)

    @property
    def has_tokens(self) -> bool:
        """False for a counts-only trace (per-expert counts, no per-token choices)."""
        return self.expert_ids.shape[-2] > 0

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """Leading axes before `[I, L, E]` (empty for a single trace)."""
        return self.counts.shape[:-3]

    @property
    def num_iterations(self) -> int:
        return self.counts.shape[-3]

    @property
    def num_layers(self) -> int:
        return self.counts.shape[-2]

    @property
    def num_tokens(self) -> int:
        """Token slots per iteration (padded length N; 0 for counts-only)."""
        return self.expert_ids.shape[-2]

    def tokens_per_iteration(self) -> jax.Array:
        """Real tokens per iteration, float32 [..., I] (from counts for counts-only traces)."""
        if self.has_tokens:
            return self.token_mask.sum(-1).astype(jnp.float32)
        return self.counts[..., 0, :].sum(-1) / self.top_k

    def __getitem__(self, idx) -> Trace:
        """Index the leading `[T]` axis of a batch."""
        return jax.tree_util.tree_map(lambda x: x[idx], self)


def counts_from_ids(expert_ids: jax.Array, num_experts: int) -> jax.Array:
    """Per-expert token counts, float32 [..., E], from ids [..., N, K] (-1 ignored).

    A histogram per leading index (`ops.bincount`, one flat scatter-add), not a one-hot sum:
    the float32 one-hot [..., N, K, E] took 1 MB per 256-token trace at E = 128 and made a
    20 000-trace batch peak at 21.5 GB. Counts are integers, so the two agree
    exactly.
    """
    ids = jnp.asarray(expert_ids)
    lead = ids.shape[:-2]
    if ids.size == 0:
        return jnp.zeros((*lead, num_experts), jnp.float32)
    rows = ids.reshape(-1, ids.shape[-2] * ids.shape[-1])
    counts = jax.vmap(lambda k: bincount(k, k >= 0, num_experts))(rows)
    return counts.astype(jnp.float32).reshape(*lead, num_experts)


def from_ids(expert_ids, gate_weights, token_mask, num_experts: int,
             token_request=None) -> Trace:
    """Build and validate a token-level trace from arrays [I, L, N, K], [I, N]."""
    expert_ids = np.asarray(expert_ids)
    gate_weights = np.asarray(gate_weights)
    token_mask = np.asarray(token_mask)
    if token_request is None:
        token_request = np.full(token_mask.shape, -1, np.int32)
    valid = token_mask[..., None, :, None] if token_mask.ndim else token_mask
    ids = jnp.asarray(np.where(valid, expert_ids, -1), jnp.int32)  # padding never counts
    t = Trace(
        expert_ids=ids,
        gate_weights=jnp.asarray(gate_weights, jnp.float32),
        token_mask=jnp.asarray(token_mask, bool),
        token_request=jnp.asarray(token_request, jnp.int32),
        counts=counts_from_ids(ids, num_experts),
        num_experts=num_experts,
        top_k=expert_ids.shape[-1] if expert_ids.ndim else 0,
    )
    validate(t, raw=(expert_ids, gate_weights, token_mask))
    return t


def from_counts(counts, top_k: int) -> Trace:
    """Build and validate a counts-only trace from counts [I, L, E]."""
    counts = np.asarray(counts)
    if counts.ndim != 3:
        raise TraceError(f"counts: expected shape [I, L, E], got {counts.shape}")
    i, l, e = counts.shape
    t = Trace(
        expert_ids=jnp.zeros((i, l, 0, top_k), jnp.int32),
        gate_weights=jnp.zeros((i, l, 0, top_k), jnp.float32),
        token_mask=jnp.zeros((i, 0), bool),
        token_request=jnp.zeros((i, 0), jnp.int32),
        counts=jnp.asarray(counts, jnp.float32),
        num_experts=e,
        top_k=top_k,
    )
    validate(t, raw=(None, None, None, counts))
    return t


def validate(t: Trace, raw=None) -> Trace:
    """Check shapes, dtypes, id ranges, finiteness; raise TraceError naming the field.

    Works on a single trace or a batch. Runs on host (NumPy), so call it on inputs, not
    inside jit.
    """
    ids = np.asarray(t.expert_ids)
    w = np.asarray(t.gate_weights)
    mask = np.asarray(t.token_mask)
    req = np.asarray(t.token_request)
    counts = np.asarray(t.counts)
    if raw is not None and raw[0] is not None:
        ids_raw, w_raw = raw[0], raw[1]
        if not np.issubdtype(ids_raw.dtype, np.integer):
            raise TraceError(f"expert_ids: dtype must be integer, got {ids_raw.dtype}")
        if not np.issubdtype(w_raw.dtype, np.floating):
            raise TraceError(f"gate_weights: dtype must be floating, got {w_raw.dtype}")
    if ids.ndim < 4:
        raise TraceError(f"expert_ids: expected shape [I, L, N, K], got {ids.shape}")
    batch = ids.shape[:-4]
    i, l, n, k = ids.shape[-4:]
    e = t.num_experts
    if isinstance(e, np.integer):
        e = int(e)
    if not isinstance(e, int) or e < 1:
        raise TraceError(f"num_experts: must be an integer >= 1, got {e!r}")
    if not isinstance(t.top_k, int) or t.top_k < 1 or t.top_k != k:
        raise TraceError(f"top_k: {t.top_k!r} must equal the K axis of expert_ids ({k})")
    if k > e:
        raise TraceError(f"top_k: {k} is larger than num_experts {e}")
    expect = {
        "gate_weights": (w, (*batch, i, l, n, k)),
        "token_mask": (mask, (*batch, i, n)),
        "token_request": (req, (*batch, i, n)),
        "counts": (counts, (*batch, i, l, e)),
    }
    for name, (arr, shape) in expect.items():
        if arr.shape != shape:
            raise TraceError(f"{name}: expected shape {shape}, got {arr.shape}")
    if i < 1 or l < 1:
        raise TraceError(f"expert_ids: needs at least one iteration and layer, got {ids.shape}")
    valid = np.broadcast_to(mask[..., None, :, None], ids.shape)
    if n:
        bad = valid & ((ids < 0) | (ids >= e))
        if bad.any():
            where = tuple(int(x) for x in np.argwhere(bad)[0])
            raise TraceError(
                f"expert_ids: id {int(ids[where])} at index {where} out of range [0, {e})"
            )
        sorted_ids = np.sort(np.where(valid, ids, -1 - np.arange(k)), axis=-1)
        if (np.diff(sorted_ids, axis=-1) == 0).any():
            where = tuple(int(x) for x in np.argwhere(np.diff(sorted_ids, axis=-1) == 0)[0])
            raise TraceError(f"expert_ids: a token chose the same expert twice, near {where[:-1]}")
        if not np.isfinite(w).all():
            where = tuple(int(x) for x in np.argwhere(~np.isfinite(w))[0])
            raise TraceError(f"gate_weights: non-finite value at index {where}")
    if not np.isfinite(counts).all() or (counts < 0).any():
        raise TraceError("counts: must be finite and >= 0")
    return t


def stack(traces: list[Trace]) -> Trace:
    """Stack traces of equal shape into a batch with a leading `[T]` axis."""
    if not traces:
        raise TraceError("stack: no traces given")
    first = traces[0]
    for j, t in enumerate(traces[1:], 1):
        if (t.num_experts, t.top_k) != (first.num_experts, first.top_k) or (
            t.expert_ids.shape != first.expert_ids.shape
        ):
            raise TraceError(
                f"stack: trace {j} has shape {t.expert_ids.shape} / E={t.num_experts}, "
                f"trace 0 has {first.expert_ids.shape} / E={first.num_experts}"
            )
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *traces)


@struct.dataclass
class RequestStream:
    """A stream of inference requests (002 §5): arrival times and lengths, padded to R.

    arrival_s   float32 [R]  arrival time of each request (Poisson process)
    input_len   int32 [R]    prompt tokens
    output_len  int32 [R]    tokens to generate
    mask        bool [R]     real requests (padding is False)
    """

    arrival_s: jax.Array
    input_len: jax.Array
    output_len: jax.Array
    mask: jax.Array
