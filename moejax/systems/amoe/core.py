"""Exact AEP event core with O(batch) work per event (the CPU path and the oracle).

The rules of `reference.py` / `aep.py` (002 §3: most-free-memory admission §3.1, μ-queues
drained by Algorithm 1 / MTFS / FLFS §3.4, point-to-point messages §3.5, the top-k token
pool §3.2), with data structures that make each event's work O(batch):

* one binary heap per GPU of in-flight token slots, keyed by the tick they become ready;
* one intrusive linked list (with a count) per (block, unit) μ-queue;
* per-GPU ready-token totals and a heap of KV releases;
* per GPU and block: the ready-token count, the longest local queue, and a bitmask of the
  blocks holding a token, so a scheduler visits only those blocks, one comparison each
  (each cache's comment in `simulate` says why it is exact).

A launch pops the slots that have arrived on its GPU, scores only that GPU's non-empty
blocks, drains one list and pushes its outputs: O(batch + NB + log heap) per event instead
of O(R). Durations, transfer times and routing use the same float32 /
uint32 arithmetic as `config.py` and `routing.py`, and ties follow the reference (admission
first, then the lowest GPU id), so results equal `reference.py` and `aep.py` event for
event (tests/test_amoe_core.py).

Two forms of the same source: `simulate` compiled with numba (`cache=True`) and
`simulate_py`, the identical code run by the Python interpreter (helpers rebound to their
plain-Python versions), for small tests without compilation.

Beyond the reference it serves two workloads (002 §5):
* open loop: a finite Poisson stream, run until every request completes;
* closed loop (`closed = N`): N requests in the system, each completion submits the next
  one at once (arriving at the completion tick), run until `horizon` ticks. Resubmissions
  are numbered in a canonical total order, independent of the heap layout: by the launch
  that completes them (tick, then GPU id: the core's event order), then by request id;
  `rounds.py` numbers them the same way;
and it records the steady-window metrics at emission time: tokens emitted per time bin,
inter-token latencies of tokens emitted in [w0, w1) (sum, count, log histogram).
"""

from __future__ import annotations

import types

import numba as nb
import numpy as np
from numba.cpython.unsafe.numbers import trailing_zeros

BIG = np.int64(2**62)
F32 = np.float32


@nb.njit(cache=True, inline="always")
def _mul32(a, b):
    return np.uint32((np.uint64(a) * np.uint64(b)) & np.uint64(0xFFFFFFFF))


@nb.njit(cache=True, inline="always")
def _mix32(x):
    """lowbias32 finalizer (routing._mix32)."""
    x = np.uint32(x ^ (x >> np.uint32(16)))
    x = _mul32(x, np.uint32(0x7FEB352D))
    x = np.uint32(x ^ (x >> np.uint32(15)))
    x = _mul32(x, np.uint32(0x846CA68B))
    return np.uint32(x ^ (x >> np.uint32(16)))


@nb.njit(cache=True, _nrt=False)
def _experts(seed, req, tok, blk, cdf, top_k, out, draws):
    """routing.choose_experts for one (req, tok, blk) into out[:top_k] (same hash, order)."""
    e_n = cdf.shape[1]
    m = 1 if top_k == 1 else 4 * top_k
    base = np.uint32(_mul32(np.uint32(req), np.uint32(0x9E3779B1))
                     ^ _mul32(np.uint32(tok), np.uint32(0x85EBCA77)))
    base = np.uint32(base ^ _mul32(np.uint32(blk), np.uint32(0xC2B2AE3D)) ^ np.uint32(seed))
    base = _mix32(base)
    for i in range(m):
        h = _mix32(np.uint32(base ^ _mul32(np.uint32(i), np.uint32(0x27D4EB2F))))
        h = _mix32(np.uint32((np.uint64(h) + np.uint64(0x165667B1)) & np.uint64(0xFFFFFFFF)))
        u = F32(F32(h >> np.uint32(8)) * F32(2.0**-24))
        c = 0
        for e in range(e_n - 1):
            if u >= cdf[blk, e]:
                c += 1
        draws[i] = c
    if top_k == 1:
        out[0] = draws[0]
        return
    got = 0
    for i in range(m):  # first K distinct draws, in draw order
        new = True
        for j in range(i):
            if draws[j] == draws[i]:
                new = False
                break
        if new and got < top_k:
            out[got] = draws[i]
            got += 1
    while got < top_k:  # the lowest unused ids fill in
        for e in range(e_n):
            free = True
            for j in range(got):
                if out[j] == e:
                    free = False
                    break
            if free:
                out[got] = e
                got += 1
                break


@nb.njit(cache=True, inline="always")
def _ctz(m):
    """Index of the lowest set bit of a nonzero uint64."""
    return np.int64(trailing_zeros(m))


def _ctz_py(m):  # _ctz in the plain-Python form
    m = int(m)
    return (m & -m).bit_length() - 1


@nb.njit(cache=True, inline="always")
def _ticks(secs):
    """config.to_ticks: ceil(seconds * 1e6) in float32."""
    return np.int64(np.ceil(F32(F32(secs) * F32(1.0 / 1e-6))))


# the helpers that take arrays are compiled without reference counting (`_nrt=False`: they
# allocate nothing) and called, not inlined: inlined, each call increfs / decrefs its arrays
# (atomic operations, ~10 % of the core's time in a perf profile)
@nb.njit(cache=True, _nrt=False)
def _hpush(hk, hv, hs, g, key, val):
    i = hs[g]
    hs[g] += 1
    while i > 0:
        p = (i - 1) >> 1
        if hk[g, p] <= key:
            break
        hk[g, i] = hk[g, p]
        hv[g, i] = hv[g, p]
        i = p
    hk[g, i] = key
    hv[g, i] = val


@nb.njit(cache=True, _nrt=False)
def _hpop(hk, hv, hs, g):
    key, val = hk[g, 0], hv[g, 0]
    hs[g] -= 1
    n = hs[g]
    lk, lv = hk[g, n], hv[g, n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and hk[g, c + 1] < hk[g, c]:
            c += 1
        if hk[g, c] >= lk:
            break
        hk[g, i] = hk[g, c]
        hv[g, i] = hv[g, c]
        i = c
    if n > 0:
        hk[g, i] = lk
        hv[g, i] = lv
    return key, val


@nb.njit(cache=True, nogil=True)  # nogil: streams run in parallel threads
def simulate(arrival, inp, outl, n_req0, closed, horizon, new_inp, new_outl,
             sched, nb_, k_, a_, d_, gpu_of_unit, att_gpu, exp_gpu, kvcap,
             cost, lat, ptok, cdf, seed, decay, lookahead, max_events, init_block, init_done,
             w0, w1, bin_ticks, itl_edges, tok_bins, itl_hist, conc_cap):
    """One stream. `arrival`/`inp`/`outl` have room for every request that may be submitted
    (closed loop appends resubmissions). Returns per-request ticks and per-GPU counters;
    `tok_bins` (tokens emitted per bin of `bin_ticks`) and `itl_hist` are filled in place."""
    rmax = arrival.shape[0]
    u_n = gpu_of_unit.shape[0]
    need = inp + outl
    rank = np.full(rmax, -1, np.int64)
    phase = np.full(rmax, -1, np.int64)
    block = np.zeros(rmax, np.int64)
    done = np.zeros(rmax, np.int64)
    first = np.zeros(rmax, np.int64)
    last = np.zeros(rmax, np.int64)
    complete = np.full(rmax, BIG, np.int64)
    admitted = np.full(rmax, BIG, np.int64)
    s_state = np.zeros(rmax * k_, np.int8)
    s_ready = np.zeros(rmax * k_, np.int64)
    s_unit = np.zeros(rmax * k_, np.int64)
    nxt = np.full(rmax * k_, -1, np.int64)
    s_req = np.arange(rmax * k_) // k_  # slot -> its request (a load, not a division)
    head = np.full((nb_, u_n), -1, np.int64)
    tail = np.full((nb_, u_n), -1, np.int64)
    qc = np.zeros((nb_, u_n), np.int64)
    qtot = np.zeros(d_, np.int64)
    # gq[g, b]: ready tokens in GPU g's local queues of block b (the sum of qc[b, u] over
    # g's units), kept as queues grow and drain. Integer, so it equals the per-event re-sum
    # in any order; a block with gq = 0 holds no token and the schedulers skip it.
    gq = np.zeros((d_, nb_), np.int64)
    # Algorithm 1's terms, memoized (each is the value the reference computes, so equal):
    # gqf[g, b] = F32(F32(gq[g, b]) / n_e), block b's mean queue length on GPU g (n_e: g's
    # local units), recomputed whenever gq[g, b] changes; dkp[k] = decay^k as the reference
    # forms it, k sequential float32 products
    gqf = np.zeros((d_, nb_), np.float32)
    # nz[g, w] bit i: gq[g, 64 w + i] > 0, so the schedulers visit the blocks holding a
    # token in increasing order (lowest set bit first) without testing the empty ones
    nw = (nb_ + 63) // 64
    nz = np.zeros((d_, nw), np.uint64)
    one = np.uint64(1)
    dkp = np.zeros(lookahead + 1, np.float32)
    dk = F32(1.0)
    for k in range(1, lookahead + 1):
        dk = F32(dk * F32(decay))
        dkp[k] = dk
    cap = conc_cap * k_ + 16
    hk = np.zeros((d_, cap), np.int64)
    hv = np.zeros((d_, cap), np.int64)
    hs = np.zeros(d_, np.int64)
    rk_ = np.zeros((1, conc_cap + 16), np.int64)
    rv_ = np.zeros((1, conc_cap + 16), np.int64)
    rs_ = np.zeros(1, np.int64)
    used = np.zeros(a_, np.int64)
    gpu_free = np.zeros(d_, np.int64)
    busy = np.zeros(d_, np.int64)
    execs = np.zeros(d_, np.int64)
    ntok = np.zeros(d_, np.int64)
    local = np.zeros((d_, u_n), np.int64)
    nloc = np.zeros(d_, np.int64)
    jof = np.zeros(u_n, np.int64)  # unit -> its position in its GPU's local list
    for u in range(u_n):
        g = gpu_of_unit[u]
        local[g, nloc[g]] = u
        jof[u] = nloc[g]
        nloc[g] += 1
    # bq[g, b], bu[g, b]: the longest local queue of block b on GPU g and its unit (the first
    # in local order among equals; bu = -1 when the block is empty), kept as queues grow
    # (one comparison) and drain (a rescan of the block's local units)
    bq = np.zeros((d_, nb_), np.int64)
    bu = np.full((d_, nb_), -1, np.int64)
    batch = np.zeros(conc_cap * k_ + 16, np.int64)
    ex = np.zeros(k_, np.int64)
    draws = np.zeros(4 * k_, np.int64)
    cnt = np.zeros(d_, np.int64)
    xfer = np.zeros(d_, np.int64)
    fin = np.zeros(conc_cap * k_ + 16, np.int64)  # requests completed by one launch
    nfin = 0
    n_req = n_req0
    for r in range(init_done.shape[0]):
        done[r] = init_done[r]
    next_req = 0
    clock = 0
    events = 0
    finished = 0
    exhausted = 0
    itl_sum = 0
    itl_n = 0
    n_bins = tok_bins.shape[0]
    (exp_comp, exp_weight, exp_act, exp_fixed, att_comp, att_ctx_comp, att_weight, att_kv,
     att_act, att_fixed, att_per_token) = cost
    while True:
        if closed > 0:
            if clock >= horizon:
                break
        elif finished >= n_req:
            break
        if events >= max_events:
            break
        # admission candidate: head of line, most-free rank, KV released by then (§3.1)
        t_adm = BIG
        best = 0
        if next_req < n_req:
            t_a = max(arrival[next_req], clock)
            while rs_[0] > 0 and rk_[0, 0] <= t_a:
                _, rr = _hpop(rk_, rv_, rs_, 0)
                used[rank[rr]] -= need[rr]
            bf = -(1 << 62)
            for a in range(a_):
                f = kvcap - used[a]
                if f > bf:
                    bf = f
                    best = a
            if bf >= need[next_req]:
                t_adm = t_a
        # launch candidate: the GPU that can start soonest (ties: lowest id)
        g = 0
        t_l = BIG
        for gg in range(d_):
            if qtot[gg] > 0:
                sg = gpu_free[gg]
            elif hs[gg] > 0:
                sg = max(gpu_free[gg], hk[gg, 0])
            else:
                sg = BIG
            if sg < t_l:
                t_l = sg
                g = gg
        if t_adm < BIG and t_adm <= t_l:
            r = next_req
            rank[r] = best
            phase[r] = 0
            admitted[r] = t_adm
            block[r] = init_block[r] if r < init_block.shape[0] else 0
            s_state[r * k_] = 1
            s_ready[r * k_] = t_adm
            s_unit[r * k_] = best
            used[best] += need[r]
            _hpush(hk, hv, hs, att_gpu[best], t_adm, r * k_)
            next_req += 1
            clock = t_adm
            events += 1
            continue
        if t_l >= BIG:
            break  # deadlock: a request never fits
        clock = t_l
        events += 1
        while hs[g] > 0 and hk[g, 0] <= t_l:  # arrived slots join their μ-queues
            _, sl = _hpop(hk, hv, hs, g)
            b = block[s_req[sl]]
            u = s_unit[sl]
            nxt[sl] = -1
            if tail[b, u] >= 0:
                nxt[tail[b, u]] = sl
            else:
                head[b, u] = sl
            tail[b, u] = sl
            qc[b, u] += 1
            if qc[b, u] > bq[g, b] or (qc[b, u] == bq[g, b] and jof[u] < jof[bu[g, b]]):
                bq[g, b] = qc[b, u]
                bu[g, b] = u
            if gq[g, b] == 0:
                nz[g, b >> 6] |= one << np.uint64(b & 63)
            gq[g, b] += 1
            gqf[g, b] = F32(F32(gq[g, b]) / F32(nloc[g]))
            qtot[g] += 1
        nl = nloc[g]
        b_sel = -1
        u_sel = -1
        # Only blocks holding a token can be chosen: each scheduler visits those (the set
        # bits of nz[g], in increasing block order, as the reference's scan over all blocks)
        if sched == 2:  # FLFS: the first block with a ready token, its fullest queue
            for w in range(nw):
                m = nz[g, w]
                if m == 0:
                    continue
                b_sel = (w << 6) + _ctz(m)
                u_sel = bu[g, b_sel]
                break
        elif sched == 1:  # MTFS: the fullest queue
            most = 0
            for w in range(nw):
                m = nz[g, w]
                while m != 0:
                    b = (w << 6) + _ctz(m)
                    m &= m - one
                    if bq[g, b] > most:
                        most = bq[g, b]
                        b_sel = b
                        u_sel = bu[g, b]
        else:  # Algorithm 1 (§3.4), float32 in the reference's order
            # the lookahead sums of the blocks visited only: the reference's float32 sequence
            # over its terms (gqf, dkp)
            bestsc = F32(0.0)
            for w in range(nw):
                m = nz[g, w]
                while m != 0:
                    b = (w << 6) + _ctz(m)
                    m &= m - one
                    ls = F32(0.0)
                    bk = b
                    for k in range(1, lookahead + 1):
                        bk += 1  # (b + k) % nb_
                        if bk == nb_:
                            bk = 0
                        ls = F32(ls + F32(gqf[g, bk] * dkp[k]))
                    sc = F32(ls + F32(bq[g, b]))
                    if F32(-4194304.0) < ls and sc < F32(4194304.0):
                        # within +-2^22 float32 steps are <= 1/4, so ls + q rises strictly
                        # with the integer q: the block's first best unit is bu (the
                        # reference's scan below, in one comparison)
                        take = (sc > bestsc) | (b_sel < 0)
                        bestsc = sc if take else bestsc
                        b_sel = b if take else b_sel
                        u_sel = bu[g, b] if take else u_sel
                        continue
                    for j in range(nl):  # the reference's scan (also for NaN scores)
                        u = local[g, j]
                        q = qc[b, u]
                        sc = F32(ls + F32(q))
                        take = (q > 0) & ((sc > bestsc) | (b_sel < 0))
                        bestsc = sc if take else bestsc
                        b_sel = b if take else b_sel
                        u_sel = u if take else u_sel
        n = 0  # drain the chosen queue (§3.2 executor)
        sl = head[b_sel, u_sel]
        while sl >= 0:
            batch[n] = sl
            n += 1
            sl = nxt[sl]
        head[b_sel, u_sel] = -1
        tail[b_sel, u_sel] = -1
        qtot[g] -= qc[b_sel, u_sel]
        gq[g, b_sel] -= qc[b_sel, u_sel]
        if gq[g, b_sel] == 0:
            nz[g, b_sel >> 6] &= ~(one << np.uint64(b_sel & 63))
        gqf[g, b_sel] = F32(F32(gq[g, b_sel]) / F32(nl))
        qc[b_sel, u_sel] = 0
        bq[g, b_sel] = 0
        bu[g, b_sel] = -1
        for j in range(nl):
            u = local[g, j]
            if qc[b_sel, u] > bq[g, b_sel]:
                bq[g, b_sel] = qc[b_sel, u]
                bu[g, b_sel] = u
        nf = F32(n)
        is_att = u_sel < a_
        if is_att:  # config.attention_seconds
            ctx = 0
            for i in range(n):
                r = s_req[batch[i]]
                ctx += inp[r] + done[r]
            cf = F32(ctx)
            comp = F32(F32(nf * att_comp) + F32(cf * att_ctx_comp))
            mem = F32(F32(att_weight + F32(cf * att_kv)) + F32(nf * att_act))
            secs = F32(F32(max(comp, mem) + att_fixed) + F32(nf * att_per_token))
        else:  # config.expert_seconds
            secs = F32(max(F32(nf * exp_comp), F32(exp_weight + F32(nf * exp_act))) + exp_fixed)
        dur = _ticks(secs)
        end = t_l + dur
        gpu_free[g] = end
        busy[g] += dur
        execs[g] += 1
        ntok[g] += n
        for h in range(d_):
            cnt[h] = 0
        if is_att:  # dispatcher: each token to its K experts (one message per GPU)
            for i in range(n):
                r = s_req[batch[i]]
                _experts(seed, r, done[r], block[r], cdf, k_, ex, draws)
                phase[r] = 1
                for k in range(k_):
                    s_unit[r * k_ + k] = a_ + ex[k]
                    cnt[exp_gpu[ex[k]]] += 1
            for h in range(d_):
                if cnt[h] > 0:
                    xfer[h] = _ticks(F32(lat[g, h] + F32(F32(cnt[h]) * ptok[g, h])))
            for i in range(n):
                r = s_req[batch[i]]
                for k in range(k_):
                    s2 = r * k_ + k
                    h = exp_gpu[s_unit[s2] - a_]
                    s_state[s2] = 1
                    s_ready[s2] = end + xfer[h]
                    _hpush(hk, hv, hs, h, end + xfer[h], s2)
            continue
        for i in range(n):  # expert outputs back to each request's attention rank
            cnt[att_gpu[rank[s_req[batch[i]]]]] += 1
        for h in range(d_):
            if cnt[h] > 0:
                xfer[h] = _ticks(F32(lat[g, h] + F32(F32(cnt[h]) * ptok[g, h])))
        for i in range(n):
            s2 = batch[i]
            h = att_gpu[rank[s_req[s2]]]
            s_state[s2] = 2
            s_ready[s2] = end + xfer[h]
        for i in range(n):  # token pool (§3.2): merge once all K outputs arrived
            r = s_req[batch[i]]
            if phase[r] != 1:
                continue
            ok = True
            t_m = 0
            for k in range(k_):
                if s_state[r * k_ + k] != 2:
                    ok = False
                    break
                t_m = max(t_m, s_ready[r * k_ + k])
            if not ok:
                continue
            for k in range(k_):
                s_state[r * k_ + k] = 0
            if block[r] == nb_ - 1:  # a token is emitted
                if w0 <= t_m < w1 and done[r] > 0 and last[r] > 0:
                    itl = t_m - last[r]
                    itl_sum += itl
                    itl_n += 1
                    itl_hist[np.searchsorted(itl_edges, itl, side="right")] += 1
                tb = t_m // bin_ticks
                if tb < n_bins:
                    tok_bins[tb] += 1
                if done[r] == 0:
                    first[r] = t_m
                last[r] = t_m
                done[r] += 1
                block[r] = 0
                if done[r] >= outl[r]:
                    phase[r] = 2
                    complete[r] = t_m
                    finished += 1
                    _hpush(rk_, rv_, rs_, 0, t_m, r)
                    if closed > 0:  # closed loop: resubmitted after this launch (below)
                        fin[nfin] = r
                        nfin += 1
                    continue
            else:
                block[r] += 1
            phase[r] = 0
            s2 = r * k_
            s_state[s2] = 1
            s_ready[s2] = t_m
            s_unit[s2] = rank[r]
            _hpush(hk, hv, hs, att_gpu[rank[r]], t_m, s2)
        if nfin > 0:  # closed loop: each completion submits the next request at once,
            # numbered in the canonical order (launch tick, GPU id, request id): the batch's
            # order follows the heap layout among equal ready ticks, so sort by request id
            order = np.sort(fin[:nfin])
            for i in range(nfin):
                r = order[i]
                if n_req < rmax:
                    arrival[n_req] = complete[r]
                    inp[n_req] = new_inp[n_req]
                    outl[n_req] = new_outl[n_req]
                    need[n_req] = inp[n_req] + outl[n_req]
                    n_req += 1
                else:
                    exhausted = 1
            nfin = 0
    return (complete[:n_req], first[:n_req], last[:n_req], done[:n_req], rank[:n_req],
            admitted[:n_req], arrival[:n_req].copy(), outl[:n_req].copy(), busy, execs, ntok,
            events, clock, n_req, itl_sum, itl_n, exhausted)


def _plain(fn, glb):
    return types.FunctionType(fn.py_func.__code__, glb, fn.py_func.__name__)


_PY = dict(globals())
for _name in ("_mul32", "_mix32", "_experts", "_ticks", "_hpush", "_hpop"):
    _PY[_name] = _plain(globals()[_name], _PY)
_PY["_ctz"] = _ctz_py
simulate_py = _plain(simulate, _PY)  # the same source, interpreted (small tests only)
