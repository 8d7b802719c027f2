"""Plain-Python discrete-event reference of AEP serving (002 §3), for small cases.

The same rules as `aep.py`, written as a straightforward event loop over Python lists and
dicts: admission by the most-free-memory load balancer (§3.1), per-GPU μ-queues drained by
the chosen scheduler (Algorithm 1 as printed in §3.4, MTFS, FLFS), point-to-point messages,
the top-k token pool (§3.2). Durations, transfer times and routing use the shared float32 /
uint32 helpers, so in hard mode the vectorized simulation matches it exactly (tests).
It scans every request per event; the oracle at scale is `core.py` (same rules, O(batch)
per event, equal to this loop event for event: tests/test_amoe_core.py).
"""

from __future__ import annotations

import numpy as np

from moejax.systems.amoe import routing
from moejax.systems.amoe.aep import AEPConfig, stream_ticks
from moejax.systems.amoe.config import (
    attention_seconds,
    expert_seconds,
    to_ticks,
    transfer_ticks,
)

BIG = 2**31 - 1


def _algorithm1(q, local_units, nb, lookahead, decay):
    """Algorithm 1 (§3.4) literally: (b*, e*) maximising LScore[b] + Q[b][e] over Q > 0."""
    n_e = np.float32(len(local_units))
    best, best_score = None, None
    for b in range(nb):
        lscore = np.float32(0.0)
        dk = np.float32(1.0)
        for k in range(1, lookahead + 1):
            bp = (b + k) % nb
            total = np.float32(sum(q.get((bp, u), 0) for u in local_units))
            dk = np.float32(dk * np.float32(decay))
            lscore = np.float32(lscore + np.float32(np.float32(total / n_e) * dk))
        for u in local_units:
            if q.get((b, u), 0) > 0:
                score = np.float32(lscore + np.float32(q[(b, u)]))
                if best is None or score > best_score:
                    best, best_score = (b, u), score
    return best


def _mtfs(q, local_units, nb):
    best, most = None, 0
    for b in range(nb):
        for u in local_units:
            if q.get((b, u), 0) > most:
                best, most = (b, u), q[(b, u)]
    return best


def _flfs(q, local_units, nb):
    for b in range(nb):
        counts = [q.get((b, u), 0) for u in local_units]
        if max(counts) > 0:
            return b, local_units[int(np.argmax(counts))]
    return None


def simulate(cfg: AEPConfig, arrival_s, input_len, output_len, mask, seed, decay=0.5,
             max_events: int = 10_000_000) -> dict:
    """Run one stream to completion; returns per-request ticks and event counts."""
    r_n, k_n, nb = cfg.num_requests, cfg.model.top_k, cfg.num_blocks
    a_n, d_n = cfg.num_ranks, cfg.num_devices
    gpu_of_unit = [int(x) for x in cfg.gpu_of_unit]
    arrival = [int(x) for x in stream_ticks(np, arrival_s)]
    inp = [int(x) for x in input_len]
    outl = [int(x) for x in output_len]
    real = [bool(x) for x in mask]
    seed = np.uint32(seed)
    need = [inp[r] + outl[r] for r in range(r_n)]

    clock, next_req = 0, 0
    gpu_free = [0] * d_n
    rank = [-1] * r_n
    phase = [-1] * r_n
    block = [0] * r_n
    done = [0] * r_n
    slots = [[[0, 0, 0] for _ in range(k_n)] for _ in range(r_n)]  # [unit, state, ready]
    release = [BIG] * r_n
    first = [0] * r_n
    last = [0] * r_n
    complete = [BIG] * r_n
    admitted = [BIG] * r_n
    busy = [0] * d_n
    batches = []
    log = []  # (kind, r, token, block, k, unit, start, end, arrival)
    events = 0

    while not all(phase[r] == 2 or not real[r] for r in range(r_n)):
        if events >= max_events:
            raise RuntimeError("reference: too many events")
        t_adm, best = BIG, 0
        if next_req < r_n and real[next_req]:
            t_a = max(arrival[next_req], clock)
            used = [0] * a_n
            for r in range(r_n):
                if rank[r] >= 0 and release[r] > t_a:
                    used[rank[r]] += need[r]
            free = [cfg.kv_capacity_tokens - u for u in used]
            best = int(np.argmax(free))
            if free[best] >= need[next_req]:
                t_adm = t_a
        start = []
        for g in range(d_n):
            ready = [s[2] for r in range(r_n) for s in slots[r]
                     if s[1] == 1 and gpu_of_unit[s[0]] == g]
            start.append(max(gpu_free[g], min(ready)) if ready else BIG)
        g = int(np.argmin(start))
        t_l = start[g]
        if t_adm < BIG and t_adm <= t_l:
            r = next_req
            rank[r], phase[r], block[r] = best, 0, 0
            admitted[r] = t_adm
            slots[r][0] = [best, 1, t_adm]
            next_req += 1
            clock = t_adm
            events += 1
            continue
        if t_l >= BIG:
            raise RuntimeError("reference: deadlock (a request never fits)")
        clock = t_l
        events += 1
        queues: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for r in range(r_n):
            for k, (u, st, rd) in enumerate(slots[r]):
                if st == 1 and gpu_of_unit[u] == g and rd <= t_l:
                    queues.setdefault((block[r], u), []).append((r, k))
        q = {key: len(v) for key, v in queues.items()}
        local = [u for u in range(cfg.num_units) if gpu_of_unit[u] == g]
        if cfg.scheduler == "defrag":
            b_sel, u_sel = _algorithm1(q, local, nb, cfg.lookahead, decay)
        elif cfg.scheduler == "mtfs":
            b_sel, u_sel = _mtfs(q, local, nb)
        else:
            b_sel, u_sel = _flfs(q, local, nb)
        batch = queues[(b_sel, u_sel)]
        n = len(batch)
        is_att = u_sel < a_n
        if is_att:
            ctx = sum(inp[r] + done[r] for r, _ in batch)
            secs = attention_seconds(np, cfg.cost, n, ctx)
        else:
            secs = expert_seconds(np, cfg.cost, n)
        dur = int(to_ticks(np, secs))
        end = t_l + dur
        gpu_free[g] = end
        busy[g] += dur
        batches.append((t_l, g, b_sel, u_sel, n))
        moves = []  # (r, k, dest gpu, new unit)
        if is_att:
            for r, _ in batch:
                ex = routing.choose_experts(np, seed, np.array([r]), np.array([done[r]]),
                                            np.array([block[r]]), cfg.cdf, k_n)[0]
                for k in range(k_n):
                    e = int(ex[k])
                    moves.append((r, k, cfg.expert_gpus[e], a_n + e))
                phase[r] = 1
        else:
            for r, k in batch:
                moves.append((r, k, cfg.attention_gpus[rank[r]], slots[r][k][0]))
        count: dict[int, int] = {}
        for _, _, dst, _ in moves:
            count[dst] = count.get(dst, 0) + 1
        for r, k, dst, unit in moves:
            xfer = int(transfer_ticks(np, cfg.lat_s[g, dst], cfg.per_token_s[g, dst],
                                      count[dst]))
            log.append(("att" if is_att else "exp", r, done[r], block[r], k,
                        u_sel if is_att else unit, t_l, end, end + xfer))
            slots[r][k] = [unit, 1 if is_att else 2, end + xfer]
        if is_att:
            continue
        for r in sorted({r for r, _ in batch}):
            if phase[r] != 1 or any(s[1] != 2 for s in slots[r]):
                continue
            t_m = max(s[2] for s in slots[r])
            for s in slots[r]:
                s[1] = 0
            if block[r] == nb - 1:
                if done[r] == 0:
                    first[r] = t_m
                last[r] = t_m
                done[r] += 1
                block[r] = 0
                if done[r] >= outl[r]:
                    phase[r], release[r], complete[r] = 2, t_m, t_m
                    continue
            else:
                block[r] += 1
            phase[r] = 0
            slots[r][0] = [rank[r], 1, t_m]
    return {"complete": complete, "first_tok": first, "last_tok": last, "tokens_done": done,
            "rank": rank, "busy": busy, "events": events, "batches": batches, "log": log,
            "admitted": admitted}
