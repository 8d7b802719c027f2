"""Plain-Python event loop of one FSE-DP layer: the rules of `layer.py`, written as loops.

Used by the tests on small cases: in hard mode the vectorized `layer.simulate_layer` must
give the same latency, busy time per die and resource, and peak weight bytes per die.
Every rule cites the same place in paper 000 as the vectorized version.
"""

from __future__ import annotations

import math

import numpy as np

from moejax.systems.fsedp.config import SLOTS_PER_RUNNING_EXPERT, FSEDPConfig

PENDING, STREAMING, DRAINING, DONE = 0, 1, 2, 3
REL_TOL = 1e-5


def _order(cfg: FSEDPConfig, counts):
    """Position of each expert in E_sorted (Algorithm 1 line 1; paired-load §IV-A: pair
    u = (rank u, rank n - 1 - u) at positions 2u, 2u + 1; each expert scheduled alone)."""
    e_n = len(counts)
    active = [c > 0 for c in counts]
    act_ids = [e for e in range(e_n) if active[e]]
    unit = [e_n] * e_n
    if cfg.paired_load:
        ranked = sorted(act_ids, key=lambda e: (-counts[e], e))
        n = len(ranked)
        for p, e in enumerate(ranked):
            unit[e] = 2 * min(p, n - 1 - p) + (1 if p > n - 1 - p else 0)
    else:
        for r, e in enumerate(act_ids):
            unit[e] = r
    return unit


def simulate_layer(cfg: FSEDPConfig, m: float, tok) -> dict:
    """Reference of `layer.simulate_layer` (tok [D, E] as nested lists or an array)."""
    tok = np.asarray(tok, np.float64)
    d_n, e_n = tok.shape
    mod = cfg.model
    w = mod.expert_weight_bytes
    f_tok = mod.expert_flops_per_token
    pos = [int(x) for x in cfg.ring_order]
    hops_tab = cfg.topo.hops
    member = [[tok[d, e] > 0 for d in range(d_n)] for e in range(e_n)]
    n_t = [sum(member[e]) for e in range(e_n)]
    counts = [float(tok[:, e].sum()) for e in range(e_n)]
    unit = _order(cfg, counts)
    w_ms = w / m
    slot = SLOTS_PER_RUNNING_EXPERT * w_ms
    cap = cfg.weight_buffer_bytes
    reserve = slot  # room for one more starting expert

    # per-expert demands (layer.expert_demands); D2D resources: dies ("sender") or links
    # per-transfer overhead (layer.with_transfer_overhead): x per micro-slice of W / M bytes
    ddr_bps, link_bps = cfg.ddr_Bps, cfg.link_Bps
    if cfg.xfer_overhead_s > 0:
        ddr_bps = 1.0 / (1.0 / ddr_bps + cfg.xfer_overhead_s * m / w)
        link_bps = 1.0 / (1.0 / link_bps + cfg.xfer_overhead_s * m / w)
    link_mode = cfg.d2d == "link"
    die_mode = cfg.d2d == "die"  # links on the route, charged to the die each leaves
    inc = cfg.topo.incidence() if (link_mode or die_mode) else None
    r_n = cfg.topo.num_links if link_mode else d_n
    link_src = {}  # directed link -> the die it leaves (its single-hop route)
    if die_mode:
        for x in range(d_n):
            for y in range(d_n):
                if hops_tab[x, y] == 1:
                    for lk in range(cfg.topo.num_links):
                        if inc[x, y, lk]:
                            link_src[lk] = x
    comp, share, hops = {}, {}, {}
    send = [[0.0] * r_n for _ in range(e_n)]
    active = [n_t[e] > 0 for e in range(e_n)]
    loader = [[member[e][d] or (cfg.ddr_loading == "any" and active[e]) for d in range(d_n)]
              for e in range(e_n)]

    def flow(e, src, dst, nbytes):  # D2D bytes src -> dst of expert e's stream
        if nbytes <= 0 or src == dst:
            return
        if link_mode:
            for lk in range(r_n):
                if inc[src, dst, lk]:
                    send[e][lk] += nbytes / link_bps
        elif die_mode:
            for lk in range(cfg.topo.num_links):
                if inc[src, dst, lk]:
                    send[e][link_src[lk]] += nbytes / link_bps
        else:
            send[e][src] += nbytes * float(hops_tab[src, dst]) / link_bps

    drain = [0.0] * e_n
    stage = [0.0] * e_n  # longest compute / D2D stage of one micro-slice (pipeline max)
    for e in range(e_n):
        n = max(n_t[e], 1)
        for d in range(d_n):
            if not member[e][d]:
                comp[e, d] = share[e, d] = hops[e, d] = 0.0
                if cfg.ddr_loading == "any" and active[e]:  # forward to the nearest member
                    near = min((x for x in range(d_n) if member[e][x]),
                               key=lambda x: (hops_tab[d, x], x))
                    flow(e, d, near, w / d_n)
                continue
            best, nxt = None, d
            for d2 in range(d_n):
                if member[e][d2]:
                    dist = (pos[d2] - pos[d]) % d_n or d_n
                    if best is None or dist < best:
                        best, nxt = dist, d2
            hops[e, d] = float(hops_tab[d, nxt])
            comp[e, d] = tok[d, e] * f_tok / cfg.peak_flops + m * cfg.ctrl_overhead_s
            share[e, d] = w / n
            flow(e, d, nxt, w * (n_t[e] - 1) / n)
        hs = [hops[e, d] for d in range(d_n)]
        per_ms = max(tok[d, e] * f_tok / cfg.peak_flops / m
                     + (cfg.ctrl_overhead_s if member[e][d] else 0.0) for d in range(d_n))
        drain[e] = (max(n_t[e] - 1, 0) * w_ms / link_bps
                    + (sum(hs) - max(hs)) * cfg.hop_latency_s + per_ms)
        stage[e] = max(per_ms, w_ms / link_bps if n_t[e] > 1 else 0.0)
    fill = w_ms / ddr_bps

    status = [PENDING if n_t[e] > 0 else DONE for e in range(e_n)]
    prog = [0.0] * e_n
    drain_end = [0.0] * e_n
    dem = {}
    ddr_total = [0.0] * e_n
    pipe = [0.0] * e_n
    pre = {(e, d): 0.0 for e in range(e_n) for d in range(d_n)}
    busy = [[0.0, 0.0, 0.0] for _ in range(d_n)]
    peak = [0.0] * d_n
    t = 0.0

    def occupancy():
        occ = [0.0] * d_n
        for e in range(e_n):
            for d in range(d_n):
                if status[e] in (STREAMING, DRAINING) and member[e][d]:
                    occ[d] += slot
                elif status[e] == PENDING:
                    occ[d] += pre[e, d]
        return occ

    def start(e, occ):
        pre_tot = sum(pre[e, d] for d in range(d_n))
        if cfg.rule5:  # Rule 5: spread the remaining DDR load by free space
            free = [max(cap - occ[d], 0.0) + 1e-30 if loader[e][d] else 0.0
                    for d in range(d_n)]
            tot = sum(free)
            ddr = [free[d] / tot * max(w - pre_tot, 0.0) / ddr_bps for d in range(d_n)]
        else:
            ddr = [0.0] * d_n  # pooled (Rule 4): split at every event below
        ddr_total[e] = max(w - pre_tot, 0.0) / ddr_bps
        for d in range(d_n):
            dem[e, d] = (comp[e, d], ddr[d])
            pre[e, d] = 0.0
        # pipeline of M micro-slices = sum of one micro-slice's stages + (M - 1) x the
        # longest stage; the stream (M x its bottleneck) holds one of them already
        # (layer.pipeline_tail)
        f = 0.0 if pre_tot >= w_ms else fill
        pipe[e] = drain[e] + f - max(f, stage[e])
        status[e] = STREAMING
        prog[e] = 0.0

    steps = 2 * e_n + 2
    for _ in range(steps):
        if all(s == DONE for s in status):
            break
        # Algorithm 1 lines 3-10: in E_sorted order, start the first pending expert whose
        # trajectory meets an idle die and whose slots fit; repeat while one does
        for _round in range(d_n):
            idle = [not any(status[e] == STREAMING and member[e][d] for e in range(e_n))
                    for d in range(d_n)]
            occ = occupancy()
            chosen = None
            for e in sorted((e for e in range(e_n) if status[e] == PENDING),
                            key=lambda x: unit[x]):
                if not any(member[e][d] and idle[d] for d in range(d_n)):
                    continue
                add = [(slot if member[e][d] else 0.0) - pre[e, d] for d in range(d_n)]
                if all(occ[d] + add[d] <= cap * (1 + REL_TOL) for d in range(d_n)):
                    chosen = e
                    break
            if chosen is None:
                break
            start(chosen, occ)
        occ = occupancy()
        peak = [max(peak[d], occ[d]) for d in range(d_n)]
        stream = [e for e in range(e_n) if status[e] == STREAMING]
        if not cfg.rule5:  # Rule 4: DDR load pooled over T_e, 1/c of a die shared by c
            users = [sum(1 for e in stream if loader[e][d]) for d in range(d_n)]
            for e in stream:
                inv = [1.0 / users[d] if loader[e][d] else 0.0 for d in range(d_n)]
                tot = sum(inv)
                for d in range(d_n):
                    c, _ = dem[e, d]
                    dem[e, d] = (c, inv[d] / tot * ddr_total[e])
        load = [[sum(dem[e, d][k] for e in stream) for k in range(2)] for d in range(d_n)]
        load_r = [sum(send[e][r] for e in stream) for r in range(r_n)]
        bott, rate, t_end = {}, {}, math.inf
        for e in stream:
            bott[e] = max([load[d][k] for d in range(d_n) for k in range(2) if dem[e, d][k] > 0]
                          + [load_r[r] for r in range(r_n) if send[e][r] > 0], default=0.0)
            rate[e] = 1.0 / bott[e] if bott[e] > 0 else 0.0
            t_end = min(t_end, (1.0 - prog[e]) * bott[e])
        for e in range(e_n):
            if status[e] == DRAINING:
                t_end = min(t_end, drain_end[e] - t)
        dt = max(t_end, 0.0) if math.isfinite(t_end) else 0.0
        use_r = [sum(rate[e] * send[e][r] for e in stream) for r in range(r_n)]
        if link_mode:  # a die's D2D usage: its busiest outgoing (single-hop) link
            u_send = [max([use_r[lk] for lk in range(r_n) for x in range(d_n)
                           if hops_tab[d, x] == 1 and inc[d, x, lk]], default=0.0)
                      for d in range(d_n)]
        else:
            u_send = use_r
        usage = [[sum(rate[e] * dem[e, d][k] for e in stream) for k in range(2)] + [u_send[d]]
                 for d in range(d_n)]
        # Rule 4: each die pre-loads the next pending expert with a share left on it
        adds = []
        left_e = {e: max(w - sum(pre[e, d] for d in range(d_n)), 0.0) for e in range(e_n)}
        target = {}
        for d in range(d_n):
            cands = [e for e in range(e_n)
                     if status[e] == PENDING and loader[e][d] and left_e[e] > 0]
            if cands:
                target[d] = min(cands, key=lambda x: (unit[x], x))
        for d, e in target.items():
            n_tgt = sum(1 for x in target.values() if x == e)
            room = max(cap - reserve - occ[d], 0.0)
            left = max(1.0 - usage[d][1], 0.0) * ddr_bps * dt
            add = max(min(left, left_e[e] / n_tgt, room), 0.0)
            adds.append((e, d, add))
        for e, d, add in adds:
            pre[e, d] += add
            busy[d][1] += add / ddr_bps
        for d in range(d_n):
            for k in range(3):
                busy[d][k] += usage[d][k] * dt
        t_new = t + dt
        tol = REL_TOL * t_new + 1e-15
        for e in stream:
            if (1.0 - prog[e]) * bott[e] <= dt + tol:
                prog[e] = 1.0
                status[e] = DRAINING
                drain_end[e] = t_new + pipe[e]
            else:
                prog[e] = min(prog[e] + rate[e] * dt, 1.0)
        for e in range(e_n):
            if status[e] == DRAINING and drain_end[e] <= t_new + tol:
                status[e] = DONE
        t = t_new
        occ = occupancy()
        peak = [max(peak[d], occ[d]) for d in range(d_n)]
    return {
        "latency_s": t,
        "busy_s": np.asarray(busy),
        "peak_weight_bytes": np.asarray(peak),
        "finished": all(s == DONE for s in status),
    }


def plan_iterations(cfg: FSEDPConfig, iterations) -> list[dict]:
    """Reference of `buffering.plan_iteration` in hard mode, Algorithm 2 (000 §V-A) as loops.

    iterations: per iteration (tok_r [R][L][D][E] fresh tokens per request, size_r [R]).
    Returns per iteration {"tok_l" [L, D, E], "done", "deferred"}. A request holds at most
    one paused pass: it resumes from the layer it stopped at in the next iteration; with
    `cfg.refill` its slot also runs a fresh pass (and cannot defer again that iteration),
    without it its new tokens wait.
    """
    n_thr = max(1, int(round(1.0 / cfg.slack)))
    r_n = cfg.num_requests
    qos, cfw = [0.0] * r_n, [0.0] * r_n
    paused_at = [None] * r_n
    carry = [None] * r_n
    carry_tok = [0.0] * r_n
    out = []
    for tok_r, size_r in iterations:
        tok_r = np.asarray(tok_r, np.float64)
        n_l = tok_r.shape[1]
        fresh = [size_r[r] > 0 and (cfg.refill or paused_at[r] is None) for r in range(r_n)]
        for r in range(r_n):  # lines 2-5: a buffering opportunity every N_threshold passes
            if cfw[r] >= n_thr:
                qos[r] += 1.0
                cfw[r] = 0.0
        f = [1.0 if fresh[r] else 0.0 for r in range(r_n)]
        g = [0.0] * r_n
        dfr_at = [None] * r_n  # (layer, which pass) deferred this iteration
        tok_l = np.zeros(tok_r.shape[1:])
        deferred = 0.0
        for lyr in range(n_l):
            for r in range(r_n):
                if paused_at[r] == lyr:
                    g[r] = 1.0
            live = [f[r] * tok_r[r, lyr] + (g[r] * carry[r][lyr] if g[r] else 0.0)
                    for r in range(r_n)]
            n_e = sum(x.sum(0) for x in live)  # [E]
            for r in range(r_n):
                if f[r] + g[r] == 0:
                    continue
                used = (f[r] * tok_r[r, lyr]).sum(0) > 0
                if g[r]:
                    used = used | (carry[r][lyr].sum(0) > 0)
                if not used.any() or n_e[used].min() >= cfg.theta_min:
                    continue  # lines 6-7: no cold expert (fewer than theta_min tokens)
                if qos[r] < 1.0 or (cfg.refill and paused_at[r] is not None):
                    continue  # line 8: no timer left (or the slot holds a paused pass)
                qos[r] -= f[r] + g[r]
                dfr_at[r] = (lyr, "fresh" if f[r] else "resumed")
                deferred += f[r] + g[r]
                f[r] = g[r] = 0.0
            for r in range(r_n):
                tok_l[lyr] += f[r] * tok_r[r, lyr] + (g[r] * carry[r][lyr] if g[r] else 0.0)
        done = sum(f[r] * size_r[r] + g[r] * carry_tok[r] for r in range(r_n))
        for r in range(r_n):
            cfw[r] += f[r] + g[r]
            if dfr_at[r] is None:
                paused_at[r], carry[r], carry_tok[r] = None, None, 0.0
            else:
                lyr, which = dfr_at[r]
                if which == "fresh":
                    carry[r], carry_tok[r] = tok_r[r], float(size_r[r])
                paused_at[r] = lyr
        out.append({"tok_l": tok_l, "done": float(done), "deferred": deferred})
    return out
