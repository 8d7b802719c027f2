"""Arithmetic of the rounds simulation (`rounds.py`) that must equal the numba core's.

Durations in float32 rounded as numba rounds them (`_mul`, `_layer_ticks`), the schedulers
of 002 §3.4 over each GPU's local queues (`_select`), the log-bucketed ITL histogram bin
(`itl_table`, `_itl_bin`), small scatter-adds (`_bins`) and the loop predicates shared by a
vmapped batch (`_any`, `_all`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from moejax.systems.amoe.config import BIG_TICK

if TYPE_CHECKING:
    from moejax.systems.amoe.rounds import Consts, Spec

BIG = np.int32(BIG_TICK)
I32 = jnp.int32
F32 = jnp.float32
COST_FIELDS = ("exp_comp", "exp_weight", "exp_act", "exp_fixed", "att_comp", "att_ctx_comp",
               "att_weight", "att_kv", "att_act", "att_fixed", "att_per_token")


def _ticks(secs):
    """config.to_ticks / core._ticks: ceil(seconds x 1e6) in float32."""
    return jnp.ceil(secs * F32(1.0 / 1e-6)).astype(I32)


def _mul(a, b, zero):
    """float32 a x b rounded on its own, as numba / numpy do.

    XLA:CPU contracts `x + a * b` into one fused multiply-add (a single rounding), and
    reassociates products with scalars, which moves a duration across a tick boundary now
    and then. The product's bits pass through an integer add of a runtime 0 (`Consts.zero`,
    unknown to the compiler), so it is rounded before any sum it enters.
    """
    p = jax.lax.bitcast_convert_type(a * b, I32) + zero
    return jax.lax.bitcast_convert_type(p, F32)


def _once(x):
    """x materialized once (an optimization barrier: no recomputation in consumers)."""
    return jax.lax.optimization_barrier(x)


def _layer_ticks(cost, n, ctx, is_att, zero):
    """Duration ticks of a launch of n tokens (attention: ctx KV tokens), core's float32."""
    (exp_comp, exp_weight, exp_act, exp_fixed, att_comp, att_ctx_comp, att_weight, att_kv,
     att_act, att_fixed, att_per_token) = (cost[i] for i in range(len(COST_FIELDS)))
    nf = n.astype(F32)
    cf = ctx.astype(F32)
    comp = _mul(nf, att_comp, zero) + _mul(cf, att_ctx_comp, zero)
    mem = (att_weight + _mul(cf, att_kv, zero)) + _mul(nf, att_act, zero)
    att = (jnp.maximum(comp, mem) + att_fixed) + _mul(nf, att_per_token, zero)
    exp = jnp.maximum(_mul(nf, exp_comp, zero), exp_weight + _mul(nf, exp_act, zero)) + exp_fixed
    return _ticks(jnp.where(is_att, att, exp))


def _first_max(x):
    """argmax over the last axis (the first maximum) as two plain reductions.

    XLA:CPU lowers `jnp.argmax` to a variadic (value, index) reduce that does not vectorize;
    max, then the smallest index holding it, is the same index (no NaN here).
    """
    m = x.max(-1, keepdims=True)
    idx = jax.lax.broadcasted_iota(I32, x.shape, x.ndim - 1)
    return jnp.where(x == m, idx, x.shape[-1]).min(-1)


def _select(spec: Spec, qm, nloc, decay, zero, sched):
    """Per-GPU (block, local unit) [D] chosen from its local queue counts qm [D, NB, L].

    qm[g, b, l] counts the eligible tokens of block b at GPU g's l-th unit (`local_units`:
    ascending unit ids, padding columns stay 0), so the (b, l) order is the core's (b, u)
    order over the GPU's units and its tie rules hold. spec.sched 0 / 1 / 2 compiles one
    scheduler; -1 computes all three and picks the stream's `sched` (one compilation for
    a sweep over schedulers).
    """
    d_, nb, nl = qm.shape
    kinds = (spec.sched,) if spec.sched >= 0 else (0, 1, 2)
    picks = []
    for kind in kinds:
        if kind == 2:  # FLFS: first block with a ready token, its fullest local queue
            b = _first_max((qm.sum(2) > 0).astype(I32))
            picks.append((b, _first_max(jnp.take_along_axis(qm, b[:, None, None], 1)[:, 0])))
            continue
        if kind == 1:  # MTFS: the fullest queue, block-major first
            score = qm.astype(F32)
        else:  # Algorithm 1 (§3.4), float32 in the core's order
            total = qm.sum(2).astype(F32)  # [D, NB]
            n_e = nloc.astype(F32)[:, None]
            ls = jnp.zeros_like(total)
            dk = F32(1.0)
            for k in range(1, spec.lookahead + 1):
                dk = dk * decay
                ls = ls + _mul(jnp.roll(total, -k, axis=1) / n_e, dk, zero)
            score = jnp.where(qm > 0, ls[:, :, None] + qm.astype(F32), 0.0)
        flat = _first_max(score.reshape(d_, nb * nl))
        picks.append((flat // nl, flat % nl))
    if len(picks) == 1:
        return picks[0]
    b = jnp.select([sched == 0, sched == 1], [picks[0][0], picks[1][0]], picks[2][0])
    u = jnp.select([sched == 0, sched == 1], [picks[0][1], picks[1][1]], picks[2][1])
    return b, u


def local_units(gpu_of_unit, num_devices: int):
    """(local [D, L], slot [U], nloc [D]): each GPU's units in ascending order (padded with
    U), each unit's column in its GPU's row, units per GPU (int32)."""
    g = np.asarray(gpu_of_unit, np.int64)
    u_n = len(g)
    nloc = np.bincount(g, minlength=num_devices)[:num_devices]
    local = np.full((num_devices, max(int(nloc.max(initial=0)), 1)), u_n, np.int32)
    slot = np.zeros(u_n, np.int32)
    for u in range(u_n):  # setup only (U is small)
        slot[u] = (g[:u] == g[u]).sum()
        local[g[u], slot[u]] = u
    return local, slot, nloc.astype(np.int32)


ITL_M = 6  # log buckets: values < 64 exact, then 64 sub-buckets per power of two


def _itl_key(v):
    """Log bucket of int32 ticks v >= 0 (HDR-histogram style, integer ops only)."""
    v = jnp.maximum(v, 0)
    e = 31 - jax.lax.clz(jnp.maximum(v, 1))
    shift = jnp.maximum(e - ITL_M, 0)
    return jnp.where(e < ITL_M, v, (shift << ITL_M) + (v >> shift))


def itl_table(edges):
    """(lo [KEYS], span): edges below each bucket of `_itl_key`, most edges in one bucket.

    searchsorted(edges, v, 'right') == lo[key(v)] + #{j < span: edges[lo + j] <= v}: the
    edges in v's bucket are the next ones after lo (an integer-log ITL binning,
    §7.4 B, exact for any sorted int edges).
    """
    e = np.asarray(edges, np.int64)
    keys = np.arange((32 - ITL_M) << ITL_M, dtype=np.int64)
    shift = np.maximum((keys >> ITL_M) - 1, 0)
    top = np.where(keys < (1 << ITL_M), keys, keys - (shift << ITL_M))
    bmin = np.where(keys < (1 << ITL_M), keys, top << shift)
    bmax = np.where(keys < (1 << ITL_M), keys, ((top + 1) << shift) - 1)
    lo = np.searchsorted(e, bmin, side="left")
    hi = np.searchsorted(e, bmax, side="right")
    return np.minimum(lo, len(e)).astype(np.int32), max(int((hi - lo).max(initial=0)), 1)


def _itl_bin(spec: Spec, cs: Consts, v):
    """searchsorted(itl_edges, v, side='right') for int32 ticks v (`itl_table`)."""
    lo = cs.itl_lo[_itl_key(v)]
    hb = lo
    for j in range(spec.itl_span):
        hb = hb + (cs.itl_edges[lo + j] <= v).astype(I32)
    return hb


def _any(x, axis):
    """x, or (under `jax.vmap(..., axis_name=axis)`) whether any stream's x holds.

    A loop predicate that is the same for every stream keeps `lax.while_loop` a plain
    loop under vmap; a per-stream predicate makes vmap select every carried array (the
    whole State) per iteration. The bodies gate their updates per stream instead.
    """
    return x if axis is None else jax.lax.pmax(x, axis)


def _bins(idx, w, n: int):
    """[n] sums of w by bin idx (bins outside [0, n) dropped): a scatter-add.

    Small n: one-hot compare and sum (vectorizes; XLA:CPU scatters over the C slot rows
    cost ~20 ns per row, batched under vmap); large n: a scatter.
    """
    idx, w = idx.reshape(-1), w.reshape(-1)
    if n > 8:
        return jnp.zeros(n, w.dtype).at[idx].add(w, mode="drop")
    return jnp.where(idx[:, None] == jnp.arange(n, dtype=idx.dtype), w[:, None], 0).sum(0)


def _all(x, axis):
    """x, or (under `jax.vmap(..., axis_name=axis)`) whether every stream's x holds."""
    return x if axis is None else ~jax.lax.pmax(~x, axis)
