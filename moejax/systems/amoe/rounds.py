"""Exact AEP event simulation in rounds: the accelerator path (JAX), equal to `core.py`.

The rules are those of `core.simulate` (002 §3.1 admission, §3.2 executor / dispatcher /
token pool, §3.4 schedulers, §3.5 messages); the schedule of the computation is the
review's §7.4 B (shared/reviews/amoe.md): one `lax.while_loop` step is a *round*,

1. batched admissions (§3.1): every head-of-line request that fits and arrives no later
   than the earliest launch is admitted (ties go to admission, as in the core);
2. every GPU's candidate launch (start s_g, scheduler choice, duration d_g) in one
   vectorized pass; all GPUs with s_g < H = min_g (s_g + d_g) launch together.

Why a round is exact: an output of any launch arrives at or after its end, so no launch
of the round can add a ready token to a queue another launch of the round reads (their
starts are < H <= every end); each GPU launches at most once (its next start is >= its
end >= H); merges, emissions and KV releases of the round fall at or after H, after
every start of the round. Two event orders still matter and cap the round:

* the next admission at t: only launches with s_g < t go (a tie goes to admission);
* a blocked head-of-line request (its KV does not fit) is admitted right after the first
  event at which a pending release lets it fit: launches go up to and including the first
  one, in (start, GPU id) order, at or after the earliest pending release tick.

State is sized by concurrency: C request slots (recycled once a finished request's KV is
released), K token slots each, fed from the stream by a pointer; the per-request outputs
[R] are written once per emission / completion. `simulate` takes the inputs of
`core.simulate` (open loop) and returns its tuple; `run_streams` gives the old JAX path's
per-stream metrics (`aep.metrics`), vmapped over streams.

Speed (CPU, many streams; docs/performance.md): a round's work is O(C) vector ops, so
the rest of a round runs on few rows. Only the rows with a token in a launch change, so
the dispatcher and token pool run on those rows gathered (`Spec.compact` of them) and
scattered back, or on all C rows in a round where some stream moves more (a `lax.cond`
on a predicate shared by all streams: under vmap with `axis_name`, `lax.pmax` over the
stream axis keeps it one branch instead of a select that runs both). The round and
admission loops take their predicates the same way and gate each stream's updates, so
vmap does not select the whole State per iteration. Schedulers score each GPU's local
queues only ([D, NB, L]); small scatters over D are one-hot reductions. One stream (no vmap
axis): `lax.cond`s skip the ITL / token / completion histograms in rounds that emit nothing
and the queue-depth sample when unit 0's GPU does not launch; its round is bound by its
~110 XLA:CPU thunks at C = 200 (docs/reproduction/amoe.md, "One stream").

The closed loop (`Spec.closed`: each completion submits the next request at once, until
the first event at or after `Stream.horizon`) numbers the resubmissions in the core's
canonical order: by the launch that completes them, (start, GPU id), then by request id
(a sort of the round's completions); the horizon caps a round like a blocked head (up to
and including the first launch at or after it). Spread starts (`Stream.blk0` / `done0`:
each request's block and tokens done at admission) are per-request inputs.

Not covered: `max_events` below the stream's total (rounds stop at the first round
boundary past it).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from moejax.errors import ConfigError
from moejax.systems.amoe import routing
from moejax.systems.amoe.config import BIG_TICK

BIG = np.int32(BIG_TICK)
I32 = jnp.int32
F32 = jnp.float32
COST_FIELDS = ("exp_comp", "exp_weight", "exp_act", "exp_fixed", "att_comp", "att_ctx_comp",
               "att_weight", "att_kv", "att_act", "att_fixed", "att_per_token")


@dataclasses.dataclass(frozen=True)
class Spec:
    """Static shapes and choices of one compiled simulation (hashable)."""

    num_blocks: int  # NB
    top_k: int  # K
    num_ranks: int  # A attention DP ranks
    num_devices: int  # D
    num_units: int  # U = A + E
    slots: int  # C: concurrency cap (requests holding KV at once)
    requests: int  # R: stream length (padded)
    sched: int  # 0 defrag (Algorithm 1), 1 MTFS, 2 FLFS; -1: per stream (Stream.sched)
    lookahead: int  # Algorithm 1's K
    tok_bins: int  # emitted tokens per `bin_ticks` (core's tok_bins)
    itl_bins: int  # len(itl_edges) + 1
    itl_span: int = 1  # most ITL edges inside one log bucket (`itl_table`)
    series: int = 0  # > 0: aep.metrics' done_bins / queue-depth series with this many bins
    closed: bool = False  # closed loops compiled in (per stream: Stream.closed)
    compact: int = 0  # > 0: rounds move at most this many rows gathered (`_moves_compact`)


@struct.dataclass
class Consts:
    """Per-configuration arrays shared by every stream (int32 ticks, float32 seconds)."""

    gpu_of_unit: jax.Array  # [U]
    att_gpu: jax.Array  # [A]
    exp_gpu: jax.Array  # [E]
    kvcap: jax.Array  # () KV tokens per attention rank
    cost: jax.Array  # [11] float32 (COST_FIELDS)
    lat: jax.Array  # [D, D] float32 s
    ptok: jax.Array  # [D, D] float32 s per token
    cdf: jax.Array  # [NB, E] float32
    w0: jax.Array  # () ITL window [w0, w1)
    w1: jax.Array
    bin_ticks: jax.Array  # () ticks per tok_bins bin
    itl_edges: jax.Array  # [H + span] int32 ITL histogram inner edges, BIG-padded
    itl_lo: jax.Array  # [KEYS] edges below each log bucket (`itl_table`)
    series_ticks: jax.Array  # () ticks per series bin
    zero: jax.Array  # () int32 0, a runtime value (see `_mul`)
    local: jax.Array  # [D, L] each GPU's units, ascending, padded with U (`local_units`)
    lslot: jax.Array  # [U] each unit's column in its GPU's row of `local`
    nloc: jax.Array  # [D] units per GPU


@struct.dataclass
class Stream:
    """One request stream (leaves get a leading [T] axis under vmap)."""

    arrival: jax.Array  # [R] int32 ticks, nondecreasing
    inp: jax.Array  # [R]
    outl: jax.Array  # [R]
    n_req: jax.Array  # () real requests (a prefix)
    seed: jax.Array  # () uint32 routing seed
    decay: jax.Array  # () float32 Algorithm 1 delta
    sched: jax.Array  # () int32 scheduler when Spec.sched == -1
    max_events: jax.Array  # () stop at the first round boundary past this
    closed: jax.Array  # () bool: completions resubmit, `horizon` ends the run (Spec.closed)
    horizon: jax.Array  # () closed loop: stop after the first event at or after this tick
    blk0: jax.Array  # [R] block at admission (spread start; 0 = aligned)
    done0: jax.Array  # [R] output tokens already done at admission (spread start)


@struct.dataclass
class State:
    # request slots [C]
    req: jax.Array
    rank: jax.Array
    block: jax.Array
    done: jax.Array
    inp: jax.Array
    outl: jax.Array
    phase: jax.Array  # -1 free, 0 attention, 1 experts, 2 finished (KV until release)
    release: jax.Array  # KV release tick (BIG while running)
    last: jax.Array
    first: jax.Array
    # token slots [C, K]
    unit: jax.Array
    sstate: jax.Array  # 0 idle, 1 pending (in flight or queued), 2 in the token pool
    ready: jax.Array
    # GPUs [D]
    gpu_free: jax.Array
    busy: jax.Array
    execs: jax.Array
    ntok: jax.Array
    # outputs [R]
    o_complete: jax.Array
    o_first: jax.Array
    o_last: jax.Array
    o_done: jax.Array
    o_rank: jax.Array
    o_admitted: jax.Array
    # stream [R] and its length (the closed loop appends resubmissions)
    arr: jax.Array
    n_req: jax.Array
    exhausted: jax.Array  # closed loop: more completions than R (raise R)
    # scalars
    clock: jax.Array
    next_req: jax.Array
    events: jax.Array
    rounds: jax.Array
    finished: jax.Array
    itl_sum: jax.Array
    itl_n: jax.Array
    overflow: jax.Array  # a request fitted but no slot was free (raise C)
    wide: jax.Array  # rounds that moved more than `Spec.compact` rows of this stream
    stop: jax.Array
    # accumulators
    tok_bins: jax.Array  # [TB]
    itl_hist: jax.Array  # [H + 1]
    done_bins: jax.Array  # [S] (spec.series)
    qdepth: jax.Array  # [S, NB]
    qdepth_n: jax.Array  # [S]


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


def init(spec: Spec, st: Stream) -> State:
    c, k, d, r = spec.slots, spec.top_k, spec.num_devices, spec.requests
    zc = jnp.zeros(c, I32)
    zck = jnp.zeros((c, k), I32)
    zd = jnp.zeros(d, I32)
    zr = jnp.zeros(r, I32)
    s_ = max(spec.series, 1)
    return State(
        req=zc - 1, rank=zc, block=zc, done=zc, inp=zc, outl=zc, phase=zc - 1,
        release=zc + BIG, last=zc, first=zc, unit=zck, sstate=zck, ready=zck,
        gpu_free=zd, busy=zd, execs=zd, ntok=zd,
        o_complete=zr + BIG, o_first=zr, o_last=zr, o_done=st.done0, o_rank=zr - 1,
        o_admitted=zr + BIG, arr=st.arrival, n_req=st.n_req, exhausted=jnp.bool_(False),
        clock=I32(0), next_req=I32(0), events=I32(0), rounds=I32(0), finished=I32(0),
        itl_sum=I32(0), itl_n=I32(0), overflow=jnp.bool_(False), wide=I32(0),
        stop=st.n_req <= 0,
        tok_bins=jnp.zeros(spec.tok_bins, I32), itl_hist=jnp.zeros(spec.itl_bins, I32),
        done_bins=jnp.zeros(s_, I32), qdepth=jnp.zeros((s_, spec.num_blocks), F32),
        qdepth_n=jnp.zeros(s_, I32),
    )


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
    edges in v's bucket are the next ones after lo (the review's integer-log ITL binning,
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


def _starts(spec: Spec, cs: Consts, s: State):
    """[D] earliest pending ready tick per GPU (BIG: none) and each token slot's GPU."""
    gpu = cs.gpu_of_unit[s.unit]  # [C, K]
    pend = s.sstate == 1
    hit = gpu.reshape(-1)[:, None] == jnp.arange(spec.num_devices, dtype=I32)  # [C K, D]
    earliest = jnp.where(hit & pend.reshape(-1)[:, None], s.ready.reshape(-1)[:, None],
                         BIG).min(0)
    return earliest, gpu, pend


def _head(spec: Spec, cs: Consts, st: Stream, s: State):
    """Head-of-line admission: (t_adm or BIG, rank, slot, has_slot, blocked, t_a)."""
    hol = jnp.minimum(s.next_req, spec.requests - 1)
    valid = s.next_req < s.n_req
    t_a = jnp.maximum(s.arr[hol], s.clock)
    holding = (s.phase >= 0) & (s.release > t_a)
    ranks = jnp.arange(spec.num_ranks, dtype=I32)[:, None]
    used = jnp.where(holding[None] & (s.rank[None] == ranks), (s.inp + s.outl)[None], 0).sum(1)
    free = cs.kvcap - used
    best = _first_max(free)
    fits = free[best] >= st.inp[hol] + st.outl[hol]
    # the first free slot as one reduction (C: none free)
    first = jnp.where(holding, spec.slots, jnp.arange(spec.slots, dtype=I32)).min()
    has_slot = first < spec.slots
    slot = jnp.where(has_slot, first, 0)
    t_adm = jnp.where(valid & fits, t_a, BIG)
    return t_adm, best, slot, has_slot, valid & ~fits, t_a


def _any(x, axis):
    """x, or (under `jax.vmap(..., axis_name=axis)`) whether any stream's x holds.

    A loop predicate that is the same for every stream keeps `lax.while_loop` a plain
    loop under vmap; a per-stream predicate makes vmap select every carried array (the
    whole State) per iteration. The bodies gate their updates per stream instead.
    """
    return x if axis is None else jax.lax.pmax(x, axis)


def _admissions(spec: Spec, cs: Consts, st: Stream, s: State, live, axis=None):
    """Admit every head-of-line request with t_adm <= the earliest launch start (§3.1).

    One admission per iteration; a stream admits only while its own condition holds
    (`live`: the stream runs this round), so the loop may run on for other streams.
    """
    earliest, _, _ = _starts(spec, cs, s)

    def lmin(earliest, gpu_free):
        return jnp.where(earliest < BIG, jnp.maximum(gpu_free, earliest), BIG).min()

    def admit(s, earliest, head):
        t_adm, _, _, has_slot, _, _ = head
        go = (t_adm < BIG) & (t_adm <= lmin(earliest, s.gpu_free)) & has_slot & live
        return go & (s.clock < st.horizon) if spec.closed else go

    def body(c):
        s, earliest, (t_adm, best, slot, _, _, _), ok = c
        c_, r_ = spec.slots, spec.requests
        r = s.next_req
        g = cs.att_gpu[best]
        kz = jnp.arange(spec.top_k) == 0
        # a stream whose condition fails writes nowhere (indices past the end are dropped)
        sw = jnp.where(ok, slot, c_)
        rw = jnp.where(ok, r, r_)
        rr = jnp.minimum(r, r_ - 1)
        prev = s.req[slot]
        old = jnp.where(ok & (prev >= 0), prev, r_)  # recycled slot: its request's outputs
        s = s.replace(
            o_first=s.o_first.at[old].set(s.first[slot], mode="drop"),
            o_complete=s.o_complete.at[old].set(s.release[slot], mode="drop"),
            o_last=s.o_last.at[old].set(s.last[slot], mode="drop"),
            o_done=s.o_done.at[old].set(s.done[slot], mode="drop"))
        s = s.replace(
            req=s.req.at[sw].set(r, mode="drop"), rank=s.rank.at[sw].set(best, mode="drop"),
            block=s.block.at[sw].set(st.blk0[rr], mode="drop"),
            done=s.done.at[sw].set(st.done0[rr], mode="drop"),
            inp=s.inp.at[sw].set(st.inp[rr], mode="drop"),
            outl=s.outl.at[sw].set(st.outl[rr], mode="drop"),
            phase=s.phase.at[sw].set(0, mode="drop"),
            release=s.release.at[sw].set(BIG, mode="drop"),
            last=s.last.at[sw].set(0, mode="drop"), first=s.first.at[sw].set(0, mode="drop"),
            unit=s.unit.at[sw].set(jnp.where(kz, best, 0), mode="drop"),
            sstate=s.sstate.at[sw].set(kz.astype(I32), mode="drop"),
            ready=s.ready.at[sw].set(jnp.where(kz, t_adm, 0), mode="drop"),
            o_rank=s.o_rank.at[rw].set(best, mode="drop"),
            o_admitted=s.o_admitted.at[rw].set(t_adm, mode="drop"),
            clock=jnp.where(ok, t_adm, s.clock), next_req=r + ok,
            events=s.events + ok,
        )
        earliest = earliest.at[g].min(jnp.where(ok, t_adm, BIG))
        head = _head(spec, cs, st, s)
        return s, earliest, head, admit(s, earliest, head)

    head = _head(spec, cs, st, s)
    c = (s, earliest, head, admit(s, earliest, head))
    s, earliest, head, _ = jax.lax.while_loop(lambda c: _any(c[3], axis), body, c)
    t_adm, _, _, has_slot, blocked, t_a = head
    overflow = (t_adm < BIG) & ~has_slot & live
    return s.replace(overflow=s.overflow | overflow), earliest, t_adm, blocked, t_a


def _bins(idx, w, n: int):
    """[n] sums of w by bin idx (bins outside [0, n) dropped): a scatter-add.

    Small n: one-hot compare and sum (vectorizes; XLA:CPU scatters over the C slot rows
    cost ~20 ns per row, batched under vmap); large n: a scatter.
    """
    idx, w = idx.reshape(-1), w.reshape(-1)
    if n > 8:
        return jnp.zeros(n, w.dtype).at[idx].add(w, mode="drop")
    return jnp.where(idx[:, None] == jnp.arange(n, dtype=idx.dtype), w[:, None], 0).sum(0)


ROWS = ("req", "rank", "block", "done", "outl", "phase", "release", "last", "first", "unit",
        "sstate", "ready")  # the slot fields a round reads per row
ACC = ("finished", "itl_sum", "itl_n", "tok_bins", "itl_hist")  # `_moves` accumulators


def _all(x, axis):
    """x, or (under `jax.vmap(..., axis_name=axis)`) whether every stream's x holds."""
    return x if axis is None else ~jax.lax.pmax(~x, axis)


def _moves(spec: Spec, cs: Consts, st: Stream, r, batch, gpu, is_att, end, acc0, axis=None):
    """Dispatcher (§3.2) and token pool on rows `r` (slot fields by name, [N] / [N, K]).

    acc0: the accumulators (`ACC`) before the round. Returns (updated fields, updated
    accumulators, fin, merge ticks, expert moves).
    """
    a_, d_, k_, nb = spec.num_ranks, spec.num_devices, spec.top_k, spec.num_blocks
    # attention -> the K routed experts; expert -> the request's rank. Optimization
    # barriers: XLA would otherwise recompute these expressions (the routing hash above
    # all) inside every fusion that consumes them
    experts = _once(routing.choose_experts(jnp, st.seed, r["req"], r["done"], r["block"],
                                           cs.cdf, k_))
    att_row = batch[:, 0] & is_att[gpu[:, 0]]  # [N]
    exp_mv = batch & ~is_att[gpu]  # [N, K]
    att_mv = jnp.broadcast_to(att_row[:, None], r["unit"].shape)
    mv = att_mv | exp_mv
    src = jnp.where(att_mv, gpu[:, :1], gpu)
    dst = _once(jnp.where(att_mv, cs.exp_gpu[experts], cs.att_gpu[r["rank"]][:, None]))
    pair = src * d_ + dst  # [N, K]
    cnt = _bins(pair, mv.astype(I32), d_ * d_)  # tokens per (source, destination)
    # transfer ticks per pair ([D x D], the core's float32), looked up per token
    xfer = _ticks(cs.lat.reshape(-1) + _mul(cnt.astype(F32), cs.ptok.reshape(-1), cs.zero))[pair]
    arrive = _once(jnp.where(mv, end[src] + xfer, 0))
    sstate = jnp.where(att_mv, 1, jnp.where(exp_mv, 2, r["sstate"]))
    unit = jnp.where(att_mv, a_ + experts, r["unit"])
    ready = jnp.where(mv, arrive, r["ready"])
    phase = jnp.where(att_row, 1, r["phase"])
    # token pool (§3.2 Top-K support): merge once all K expert outputs arrived
    merge, t_m = _once(((phase == 1) & (sstate == 2).all(1) & exp_mv.any(1), ready.max(1)))
    emit = merge & (r["block"] == nb - 1)
    has_itl = emit & (t_m >= cs.w0) & (t_m < cs.w1) & (r["done"] > 0) & (r["last"] > 0)
    itl = t_m - r["last"]
    done = r["done"] + emit.astype(I32)
    fin = emit & (done >= r["outl"])
    requeue = merge & ~fin
    kz = (jnp.arange(k_) == 0)[None, :]

    def stats(_):
        inc = dict(
            itl_hist=_bins(_itl_bin(spec, cs, itl), has_itl.astype(I32), spec.itl_bins),
            tok_bins=_bins(jnp.where(emit, t_m // cs.bin_ticks, spec.tok_bins),
                           emit.astype(I32), spec.tok_bins),
            finished=fin.sum(dtype=I32), itl_sum=jnp.where(has_itl, itl, 0).sum(dtype=I32),
            itl_n=has_itl.sum(dtype=I32))
        if spec.series:
            sb = jnp.clip(t_m // cs.series_ticks, 0, spec.series - 1)
            inc["done_bins"] = _bins(sb, fin.astype(I32), spec.series)
        return {k: acc0[k] + v for k, v in inc.items()}

    def none(_):  # no emission: every increment is 0
        return acc0

    # one stream: a token is emitted in about one merge of NB (a request's last block), so
    # most rounds emit none and the cond skips the ITL / token / completion histograms. A
    # batch (`axis`) has some stream emitting in most rounds: no cond
    acc = stats(None) if axis is not None else jax.lax.cond(emit.any(), stats, none, None)
    upd = dict(
        block=jnp.where(merge, jnp.where(r["block"] == nb - 1, 0, r["block"] + 1), r["block"]),
        done=done, phase=jnp.where(fin, 2, jnp.where(merge, 0, phase)),
        release=jnp.where(fin, t_m, r["release"]), last=jnp.where(emit, t_m, r["last"]),
        first=jnp.where(emit & (r["done"] == 0), t_m, r["first"]),
        unit=jnp.where(requeue[:, None] & kz, r["rank"][:, None], unit),
        sstate=jnp.where(merge[:, None], jnp.where(requeue[:, None] & kz, 1, 0), sstate),
        ready=jnp.where(requeue[:, None] & kz, t_m[:, None], ready))
    return upd, acc, fin, t_m, exp_mv


def _acc0(spec: Spec, s: State):
    """The accumulators `_moves` updates, before the round."""
    return {k: getattr(s, k) for k in ACC + (("done_bins",) if spec.series else ())}


def _moves_full(spec, cs, st, s, batch, gpu, is_att, end, go, start, axis):
    """`_moves` on all C rows."""
    r = {f: getattr(s, f) for f in ROWS}
    upd, acc, fin, t_m, exp_mv = _moves(spec, cs, st, r, batch, gpu, is_att, end,
                                        _acc0(spec, s), axis)
    sub = (_resubmit(spec, s, fin & st.closed, t_m, go, start, gpu, exp_mv, r["req"])
           if spec.closed else {})
    return upd, acc, sub


def _moves_compact(spec, cs, st, s, batch, gpu, is_att, end, go, start, axis):
    """`_moves` on the moving rows gathered (at most `spec.compact`), scattered back; all
    C rows in a round where a stream has more (one branch for every stream under vmap)."""
    c_ = spec.slots
    rows = batch.any(1)

    def compact(_):
        idx = jnp.nonzero(rows, size=spec.compact, fill_value=c_)[0]
        valid = idx < c_
        r = {f: getattr(s, f)[idx] for f in ROWS}
        upd, acc, fin, t_m, exp_mv = _moves(spec, cs, st, r, batch[idx] & valid[:, None],
                                            gpu[idx], is_att, end, _acc0(spec, s), axis)
        upd = {f: getattr(s, f).at[idx].set(v, mode="drop") for f, v in upd.items()}
        sub = (_resubmit(spec, s, fin & valid & st.closed, t_m, go, start, gpu[idx], exp_mv,
                         r["req"]) if spec.closed else {})
        return upd, acc, sub

    def full(_):
        return _moves_full(spec, cs, st, s, batch, gpu, is_att, end, go, start, axis)

    return jax.lax.cond(_all(rows.sum() <= spec.compact, axis), compact, full, None)


def _round(spec: Spec, cs: Consts, st: Stream, limit, axis, s: State) -> State:
    """One round; a no-op for a stream that does not run (stopped, or at `limit`)."""
    a_, d_, nb = spec.num_ranks, spec.num_devices, spec.num_blocks
    live = ~s.stop & (s.rounds < limit)
    s, earliest, t_adm, blocked, t_a = _admissions(spec, cs, st, s, live, axis)
    gpu = cs.gpu_of_unit[s.unit]  # [C, K]
    pend = s.sstate == 1
    start = jnp.where(earliest < BIG, jnp.maximum(s.gpu_free, earliest), BIG)  # [D]
    cand = start < BIG
    elig = pend & (s.ready <= start[gpu])
    # eligible tokens per (GPU, block, local unit): one flat scatter-add
    nl = cs.local.shape[1]
    key = (gpu * nb + s.block[:, None]) * nl + cs.lslot[s.unit]  # [C, K]
    qm = jnp.zeros(d_ * nb * nl, I32).at[jnp.where(elig, key, d_ * nb * nl)].add(
        1, mode="drop").reshape(d_, nb, nl)
    ids = jnp.arange(d_, dtype=I32)
    b_sel, l_sel = _select(spec, qm, cs.nloc, st.decay, cs.zero, st.sched)
    u_sel = cs.local[ids, l_sel]
    sel = (ids * nb + b_sel) * nl + l_sel  # [D] the chosen queue's key
    batch0 = elig & (key == sel[gpu])
    n = qm.reshape(-1)[sel]  # [D] the chosen queue's eligible tokens
    is_att = u_sel < a_
    ctx = _bins(gpu[:, 0], jnp.where(batch0[:, 0], s.inp + s.done, 0), d_)
    dur = _layer_ticks(cs.cost, n, ctx, is_att, cs.zero)
    end = jnp.where(cand, start + dur, BIG)
    horizon = end.min()
    # caps: the next admission (ties to admission); a blocked head's first possible release
    rel = jnp.where((s.phase == 2) & (s.release > t_a), s.release, BIG).min()
    rho = jnp.where(blocked, rel, BIG)
    if spec.closed:  # the run ends after the first event at or after the horizon
        rho = jnp.minimum(rho, st.horizon)
    late = cand & (start >= rho)
    c_star = jnp.where(late, start, BIG).min()
    g_star = jnp.where(late & (start == c_star), ids, d_).min()
    before_rho = (start < c_star) | ((start == c_star) & (ids <= g_star))
    go = cand & (start < horizon) & (start < t_adm) & before_rho & live  # [D]
    if spec.closed:  # an admission at or after the horizon was the last event
        go = go & (s.clock < st.horizon)
    gi = go.astype(I32)
    # dispatcher and token pool: only the rows with a token in a launch change this round
    # (a row merges only when its last expert output was sent in this round), so they run
    # on those rows gathered (`spec.compact` of them) when every stream's fit, else on all
    batch = batch0 & go[gpu]
    gather = 0 < spec.compact < spec.slots
    moved = _moves_compact if gather else _moves_full
    upd, acc, sub = moved(spec, cs, st, s, batch, gpu, is_att, end, go, start, axis)
    wide = s.wide + (batch.any(1).sum() > spec.compact) if gather else s.wide
    new = s.replace(
        **upd, **acc, wide=wide,
        gpu_free=jnp.where(go, end, s.gpu_free), busy=s.busy + gi * dur,
        execs=s.execs + gi, ntok=s.ntok + gi * n,
        clock=jnp.maximum(s.clock, jnp.where(go, start, 0).max()),
        events=s.events + gi.sum(),
        rounds=s.rounds + live)
    if spec.series:  # aep.metrics' series: completions per bin, queue depth at unit 0's GPU
        g0 = cs.gpu_of_unit[0]
        sample = go[g0]
        qb = jnp.clip(start[g0] // cs.series_ticks, 0, spec.series - 1)

        def depth(_):
            return (s.qdepth.at[qb].add(jnp.where(sample, qm[g0, :, cs.lslot[0]], 0).astype(F32)),
                    s.qdepth_n.at[qb].add(sample.astype(I32)))

        # one stream: no sample (unit 0's GPU does not launch) skips the scatters
        qd = (depth(None) if axis is not None else
              jax.lax.cond(sample, depth, lambda _: (s.qdepth, s.qdepth_n), None))
        new = new.replace(qdepth=qd[0], qdepth_n=qd[1])
    if spec.closed:  # each completion submits the next request at once (core's order)
        new = new.replace(**sub)
    # a deadlock (nothing to launch, nobody fits) or a full slot table stops the stream
    stuck = ~cand.any() | new.overflow
    over = new.events >= st.max_events
    end_ = new.finished >= new.n_req
    if spec.closed:
        end_ = jnp.where(st.closed, new.clock >= st.horizon, end_)
    # stuck: nothing launched this round (no candidate), or overflow (`unpack` raises)
    return new.replace(stop=jnp.where(live, end_ | over | stuck, s.stop))


def _resubmit(spec: Spec, s: State, fin, t_m, go, start, gpu, exp_mv, req):
    """Closed loop: number the round's completions as the core does and append them.

    The core resubmits after each launch, in launch order (start, GPU id), the requests
    that launch completed, by request id. A request completes at the launch, in that
    order, of the last of its expert outputs sent this round. Rows: all C or the moving
    ones (every completion is a moving row). Returns the stream fields to replace.
    """
    d_, r_ = spec.num_devices, spec.requests
    nr = fin.shape[0]
    ids = jnp.arange(d_, dtype=I32)
    # rank of each launching GPU in (start, id) order
    before = go[None, :] & ((start[None, :] < start[:, None])
                            | ((start[None, :] == start[:, None]) & (ids[None, :] < ids[:, None])))
    order = before.sum(1, dtype=I32)  # [D]
    row = jnp.where(exp_mv, order[gpu], -1).max(1)  # [N]
    key = jnp.where(fin, row, d_)
    _, _, idx = jax.lax.sort((key, jnp.where(fin, req, 0), jnp.arange(nr, dtype=I32)),
                             num_keys=2)
    nfin = fin.sum(dtype=I32)
    j = jnp.arange(nr, dtype=I32)
    tgt = jnp.where((j < nfin) & (s.n_req + j < r_), s.n_req + j, r_)
    arr = s.arr.at[tgt].set(t_m[idx], mode="drop")
    return dict(arr=arr, n_req=jnp.minimum(s.n_req + nfin, r_),
                exhausted=s.exhausted | (s.n_req + nfin > r_))


def outputs(spec: Spec, s: State):
    """Per-request [R] (complete, first, last, done) with the requests still in slots."""
    idx = jnp.where(s.req >= 0, s.req, spec.requests)
    return (s.o_complete.at[idx].set(s.release, mode="drop"),
            s.o_first.at[idx].set(s.first, mode="drop"),
            s.o_last.at[idx].set(s.last, mode="drop"),
            s.o_done.at[idx].set(s.done, mode="drop"))


def advance(spec: Spec, cs: Consts, st: Stream, s: State, limit, axis=None) -> State:
    """Rounds until the stream is done or `s.rounds` reaches `limit` (chunks for progress).

    Under `jax.vmap(..., axis_name=axis)` the loop runs while any stream runs; a round is
    a no-op for the others (`_round`), so the loop carries no per-stream select.
    """
    return jax.lax.while_loop(lambda s: _any(~s.stop & (s.rounds < limit), axis),
                              functools.partial(_round, spec, cs, st, limit, axis), s)


def run(spec: Spec, cs: Consts, st: Stream) -> State:
    """One stream to completion (a `lax.while_loop` of rounds); vmap over `st` for many."""
    return advance(spec, cs, st, init(spec, st), BIG)


@functools.lru_cache(maxsize=32)
def compiled(spec: Spec, batched: bool = False):
    """(init, advance) jitted for one stream, or vmapped over streams (Consts shared)."""
    ini = functools.partial(init, spec)
    adv = functools.partial(advance, spec)
    if batched:
        ini = jax.vmap(ini)
        adv = jax.vmap(functools.partial(adv, axis="streams"), in_axes=(None, 0, 0, None),
                       axis_name="streams")
    return jax.jit(ini), jax.jit(adv, donate_argnums=2)


def consts(gpu_of_unit, att_gpu, exp_gpu, kvcap, cost, lat, ptok, cdf, w0=0, w1=BIG,
           bin_ticks=1, itl_edges=None, series_ticks=1) -> Consts:
    i32 = functools.partial(np.asarray, dtype=np.int32)
    edges = np.zeros(0, np.int64) if itl_edges is None else np.asarray(itl_edges)
    if edges.dtype.kind == "f":  # float32 tick edges (aep.py): v >= e  <=>  v >= ceil(e)
        edges = np.ceil(edges.astype(np.float64))
    edges = np.minimum(edges, BIG).astype(np.int64)
    lo, span = itl_table(edges)
    local, lslot, nloc = local_units(gpu_of_unit, np.shape(lat)[0])
    edges = np.concatenate([edges, np.full(span + 1, BIG)]).astype(np.int32)
    return Consts(
        gpu_of_unit=i32(gpu_of_unit), att_gpu=i32(att_gpu), exp_gpu=i32(exp_gpu),
        kvcap=np.int32(min(int(kvcap), BIG)), cost=np.asarray(cost, np.float32).reshape(-1),
        lat=np.asarray(lat, np.float32), ptok=np.asarray(ptok, np.float32),
        cdf=np.asarray(cdf, np.float32), w0=np.int32(min(int(w0), BIG)),
        w1=np.int32(min(int(w1), BIG)), bin_ticks=np.int32(bin_ticks),
        itl_edges=edges, itl_lo=lo, series_ticks=np.int32(series_ticks), zero=np.int32(0),
        local=local, lslot=lslot, nloc=nloc)


def prepare(arrival, inp, outl, n_req0, closed, horizon, new_inp, new_outl,
            sched, nb_, k_, a_, d_, gpu_of_unit, att_gpu, exp_gpu, kvcap,
            cost, lat, ptok, cdf, seed, decay, lookahead, max_events, init_block, init_done,
            w0, w1, bin_ticks, itl_edges, tok_bins, itl_hist, conc_cap, *,
            sched_per_stream: bool = False, requests: int = 0, slots: int = 0,
            closed_spec: bool | None = None, compact: int | None = None):
    """(Spec, Consts, Stream) of one `core.simulate` call (see `simulate`).

    Shapes for one compilation over several calls: `requests` / `slots` raise R / C (the
    streams are padded), `closed_spec` compiles the closed loop in for open streams too,
    `sched_per_stream` takes the scheduler per stream, `compact` sets `Spec.compact`
    (default `default_compact(C)`: all rows for one stream).
    """
    if len(itl_hist) != len(itl_edges) + 1:
        raise ConfigError("itl_hist: needs len(itl_edges) + 1 bins")
    n = int(n_req0)
    r = max(int(len(arrival)), 1, int(requests))
    arr = np.zeros(r, np.int64)
    arr[:len(arrival)] = np.asarray(arrival, np.int64)
    if n and arr[:n].max() >= BIG:
        raise ConfigError(f"arrival: ticks up to {BIG} (int32 µs); got {arr[:n].max()}")
    closed = int(closed) > 0
    if closed:  # requests past the first n_req0 take new_inp / new_outl (core.simulate)
        inp = np.concatenate([np.asarray(inp)[:n], np.asarray(new_inp)[n:]])
        outl = np.concatenate([np.asarray(outl)[:n], np.asarray(new_outl)[n:]])
    cs = consts(gpu_of_unit, att_gpu, exp_gpu, kvcap, np.asarray(cost, np.float32), lat,
                ptok, cdf, w0, w1, bin_ticks, np.asarray(itl_edges, np.int64))
    spec = Spec(num_blocks=int(nb_), top_k=int(k_), num_ranks=int(a_),
                num_devices=int(d_), num_units=len(gpu_of_unit),
                slots=max(1, min(int(conc_cap), max(n, 1)), int(slots)), requests=r,
                sched=-1 if sched_per_stream else int(sched), lookahead=int(lookahead),
                tok_bins=len(tok_bins), itl_bins=len(itl_hist),
                itl_span=len(cs.itl_edges) - len(itl_hist),
                closed=closed if closed_spec is None else bool(closed_spec))
    spec = dataclasses.replace(spec, compact=default_compact(spec.slots) if compact is None
                               else int(compact))
    if closed and not spec.closed:
        raise ConfigError("closed = N: needs closed_spec (a closed-loop compilation)")

    def pad(x):
        out = np.zeros(r, np.int32)
        out[:len(x)] = np.minimum(np.asarray(x, np.int64), BIG)
        return out

    st = Stream(arrival=pad(arr), inp=pad(inp), outl=pad(outl), n_req=np.int32(n),
                seed=np.uint32(seed), decay=np.float32(decay), sched=np.int32(sched),
                max_events=np.int32(min(int(max_events), BIG)),
                closed=np.bool_(closed),
                horizon=np.int32(min(int(horizon), BIG) if closed else BIG),
                blk0=pad(init_block), done0=pad(init_done))
    return spec, cs, st


def unpack(spec: Spec, s: State, st: Stream, tok_bins=None, itl_hist=None):
    """`core.simulate`'s result tuple from a final State (int64, core.BIG for never)."""
    from moejax.systems.amoe import core

    n = int(s.n_req)
    complete, first, last, done = (np.asarray(x) for x in outputs(spec, s))
    s = jax.tree_util.tree_map(np.asarray, s)
    if s.overflow:
        raise ConfigError(f"conc_cap = {spec.slots}: more requests hold KV at once; raise it")
    if tok_bins is not None:
        tok_bins[:] = s.tok_bins
    if itl_hist is not None:
        itl_hist[:] = s.itl_hist

    def i64(x, big=False):
        x = np.asarray(x)[:n].astype(np.int64)
        return np.where(x >= BIG, core.BIG, x) if big else x

    return (i64(complete, True), i64(first), i64(last), i64(done), i64(s.o_rank),
            i64(s.o_admitted, True), i64(s.arr), i64(st.outl), s.busy.astype(np.int64),
            s.execs.astype(np.int64), s.ntok.astype(np.int64), int(s.events),
            int(s.clock), n, int(s.itl_sum), int(s.itl_n), int(s.exhausted))


def simulate(*args, jit: bool = True):
    """`core.simulate`'s inputs and outputs (open or closed loop), in rounds on JAX.

    `conc_cap` (the last argument) sizes the request slots (C). Ticks go through int32
    (BIG_TICK = never): arrivals past 2^31 - 1 µs (35 min) are refused. Returns core's
    tuple; `tok_bins` / `itl_hist` are filled in place.
    """
    spec, cs, st = prepare(*args)
    if jit:
        ini, adv = compiled(spec)
        s = adv(cs, st, ini(st), BIG)
    else:
        s = run(spec, cs, st)
    return unpack(spec, s, st, args[31], args[32])


def default_compact(slots: int, streams: int = 1) -> int:
    """Rows per round on the gathered path (`Spec.compact`) for C slots and a batch of
    `streams`: 0 (all rows) for one stream or up to 32 slots, else max(16, C / 32).

    Measured at C = 200 (200-request benchmark streams: 13.5 tokens moved per round on
    average, at most 16 per stream in rounds 200-400), CPU-µs per stream-round, all rows
    vs 16 gathered: 1 stream 32.7 vs 39.0 (a lone round is bound by its ~180 XLA thunks,
    and gathering adds ~25); 16 streams 27.9 vs 21.9; 128 streams 25.0 vs 20.4; 1,024
    streams 12-24 gathered rows best, 32 no better than all rows (docs/performance.md).
    """
    return 0 if streams <= 1 or slots <= 32 else max(16, slots // 32)


def from_aep(cfg, streams, keys, decay, *, slots: int | None = None,
             compact: int | None = None):
    """(Spec, Consts, Stream [T]) of `aep.build(cfg)` runs: the old JAX path's conventions.

    streams: RequestStream leaves [T, R] (real requests a prefix, `mask`); keys [T] give
    the routing seeds (`aep.stream_seed`); decay: scalar or [T]. ITL histogram on
    `config.itl_bin_edges_s` (float32 ticks, as aep.py bins them), completions and queue
    depth per `cfg.bin_ticks` series bin. slots: the concurrency cap C (default R);
    compact: rows per round on the gathered path (default `default_compact(C, T)`).
    """
    from moejax.systems.amoe import aep, config

    arrival = np.asarray(aep.stream_ticks(np, np.asarray(streams.arrival_s)), np.int32)
    t_, r_ = arrival.shape
    mask = np.asarray(streams.mask, bool)
    n_req = np.where(mask.all(1), r_, np.argmin(mask, 1)).astype(np.int32)
    seeds = np.asarray(jax.vmap(aep.stream_seed)(keys), np.uint32)
    sched = {"defrag": 0, "mtfs": 1, "flfs": 2}[cfg.scheduler]
    edges = config.itl_bin_edges_s() / np.float32(config.TICK_S)
    cs = consts(cfg.gpu_of_unit, cfg.attention_gpus, cfg.expert_gpus, cfg.kv_capacity_tokens,
                [getattr(cfg.cost, f) for f in COST_FIELDS], cfg.lat_s, cfg.per_token_s, cfg.cdf,
                itl_edges=edges.astype(np.float32), series_ticks=cfg.bin_ticks)
    spec = Spec(num_blocks=cfg.num_blocks, top_k=cfg.model.top_k, num_ranks=cfg.num_ranks,
                num_devices=cfg.num_devices, num_units=cfg.num_units,
                slots=int(slots or r_), requests=r_, sched=sched, lookahead=cfg.lookahead,
                compact=(default_compact(int(slots or r_), t_) if compact is None
                         else int(compact)),
                tok_bins=1, itl_bins=config.NUM_ITL_BINS,
                itl_span=len(cs.itl_edges) - config.NUM_ITL_BINS, series=cfg.num_bins)
    st = Stream(arrival=arrival, inp=np.asarray(streams.input_len, np.int32),
                outl=np.asarray(streams.output_len, np.int32), n_req=n_req, seed=seeds,
                decay=np.broadcast_to(np.asarray(decay, np.float32), (t_,)).copy(),
                sched=np.full(t_, sched, np.int32), max_events=np.full(t_, BIG, np.int32),
                closed=np.zeros(t_, bool), horizon=np.full(t_, BIG, np.int32),
                blk0=np.zeros((t_, r_), np.int32),
                done0=np.zeros((t_, r_), np.int32))
    return spec, cs, st


def aep_state(spec: Spec, s: State, st: Stream, mask):
    """An `aep.AEPState` of a final rounds State (the fields `aep.metrics` reads)."""
    from moejax.systems.amoe import aep

    complete, first, last, done = outputs(spec, s)
    fin = complete < BIG
    zr = jnp.zeros(spec.requests, I32)
    zrk = jnp.zeros((spec.requests, spec.top_k), I32)
    return aep.AEPState(
        arrival=st.arrival, input_len=st.inp, output_len=st.outl, mask=mask, seed=st.seed,
        clock=s.clock, next_req=s.next_req, gpu_free=s.gpu_free, rank=s.o_rank,
        admitted=s.o_admitted, phase=jnp.where(fin, 2, jnp.where(s.o_rank >= 0, 0, -1)),
        block=zr, tokens_done=done, slot_unit=zrk, slot_state=zrk, slot_ready=zrk,
        release=complete, first_tok=first, last_tok=last, complete=complete,
        itl_hist=s.itl_hist, busy=s.busy, execs=s.execs, exec_tokens=s.ntok,
        done_bins=s.done_bins, qdepth=s.qdepth, qdepth_n=s.qdepth_n, events=s.events)


def run_streams(cfg, params, streams, keys, *, params_batched: bool = False,
                slots: int | None = None, chunk_rounds: int = 1 << 16,
                max_steps: int = 50_000_000, return_state: bool = False, progress=None):
    """`runner.run_streams` for an `aep.build(cfg)` system, in rounds (same metrics)."""
    from moejax.errors import MoejaxError

    if np.shape(streams.arrival_s)[1:] != (cfg.num_requests,):
        raise ConfigError(f"stream: expected {cfg.num_requests} requests (num_requests), got "
                          f"{np.shape(streams.arrival_s)[1:]}")
    decay = np.asarray(params.decay, np.float32)
    spec, cs, st = from_aep(cfg, streams, keys, decay if params_batched else decay.item(),
                            slots=slots)
    say = progress or (lambda text: None)
    say("compiling")
    ini, adv = compiled(spec, batched=True)
    s = ini(st)
    limit = 0
    while True:
        limit += chunk_rounds
        s = adv(cs, st, s, limit)
        stop = np.asarray(s.stop)
        ev = int(np.asarray(s.events).sum())
        say(f"{ev} events simulated, {int(stop.sum())} of {stop.size} streams done")
        if stop.all():
            break
        if int(np.asarray(s.events).max()) >= max_steps:
            raise MoejaxError(f"aep-{cfg.scheduler}: streams not done after max_steps = "
                              f"{max_steps} events; raise max_steps or lower the load")
    if np.asarray(s.overflow).any():
        raise MoejaxError(f"slots = {spec.slots}: more requests held KV at once; raise slots")
    state, out = _finisher(spec, cfg)(s, st, jnp.asarray(streams.mask, bool))
    return (out, state) if return_state else out


@functools.lru_cache(maxsize=32)
def _finisher(spec: Spec, cfg):
    """jit(vmap) of final State -> (AEPState, aep.metrics), compiled once per config."""
    from moejax.systems.amoe import aep

    def one(s, st, mask):
        state = aep_state(spec, s, st, mask)
        return state, aep.metrics(cfg, state)

    return jax.jit(jax.vmap(one))
