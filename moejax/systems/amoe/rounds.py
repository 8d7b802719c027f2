"""Exact AEP event simulation in rounds: the accelerator path (JAX), equal to `core.py`.

The rules are those of `core.simulate` (002 §3.1 admission, §3.2 executor / dispatcher /
token pool, §3.4 schedulers, §3.5 messages); the schedule of the computation batches events into
rounds: one `lax.while_loop` step is a *round*,

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
[R] are written once per emission / completion. This module holds the types and the
round; `rounds_ops.py` the arithmetic that must equal the core's; `rounds_io.py` the
conventions of `core.simulate` (`simulate` takes its inputs and returns its tuple) and of
the AEP System (`from_aep`, `aep_state`); `paths.py` the engine System that runs rounds
(the AEP policies' default `path = "rounds"`).

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
from flax import struct

from moejax.systems.amoe import routing
from moejax.systems.amoe.rounds_ops import (
    BIG,
    F32,
    I32,
    _all,
    _any,
    _bins,
    _first_max,
    _itl_bin,
    _layer_ticks,
    _mul,
    _once,
    _select,
    _ticks,
)


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


ROWS = ("req", "rank", "block", "done", "outl", "phase", "release", "last", "first", "unit",
        "sstate", "ready")  # the slot fields a round reads per row
ACC = ("finished", "itl_sum", "itl_n", "tok_bins", "itl_hist")  # `_moves` accumulators


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
