"""Memory I/O of the two ways to split a device's expert GEMMs into N pipeline chunks
(003 §4.3, Fig. 9; spec E8, check 4).

(a) Horizontal split (EPS-MoE's): the input rows are split, the weights by expert (chunk c
    holds whole experts), so every expert's weights are read once and every output row is
    written once:   V(a) = m P0 + E W + m P1.
(b) Vertical split: the input columns (the hidden dimension) are split, the weights by
    columns, so each chunk produces a partial sum of every output row, written (and
    accumulated) N times:   V(b) = m P0 + E W + N m P1.

m: rows on the device (its tokens x the experts they chose there), E: its local experts with
rows (whose weights are read), W: one expert's weight bytes, P0 / P1: bytes of an input /
output row. The rows come from the simulated routing (`rows_per_device`), not a formula.
Elementwise over leading axes; jit / vmap safe.
"""

from __future__ import annotations

import jax.numpy as jnp

from moejax import ops


def split_io_bytes(rows, n, expert_weight_bytes: float, in_row_bytes: float,
                   out_row_bytes: float):
    """(V(a), V(b)) bytes of one device with `rows` [..., E_loc] rows per local expert split
    into `n` chunks (broadcasts with the leading axes)."""
    rows = jnp.asarray(rows, jnp.float32)
    m = rows.sum(-1)
    used = (rows > 0).sum(-1).astype(jnp.float32)
    base = m * in_row_bytes + used * expert_weight_bytes
    horizontal = base + m * out_row_bytes
    vertical = base + jnp.asarray(n, jnp.float32) * m * out_row_bytes
    return tuple(jnp.broadcast_arrays(horizontal, vertical))


def rows_per_device(expert_ids, token_mask, num_devices: int, num_experts: int, scale=1.0):
    """Rows [D, E_loc] of each device's local experts from one layer's routing [N, K]
    (contiguous expert blocks, as `layer.chunk_demand`), x scale real tokens per slot."""
    valid = (expert_ids >= 0) & token_mask[:, None]
    counts = ops.bincount(jnp.where(valid, expert_ids, -1), valid, num_experts)
    return counts.astype(jnp.float32).reshape(num_devices, -1) * scale
