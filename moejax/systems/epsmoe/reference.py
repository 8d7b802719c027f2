"""Plain-Python reference of `layer.block` (hard mode, switch topologies only): the same
rules written as loops over tokens, devices, chunks and an event-by-event two-stream
(comm, compute) list scheduler, for the `vectorized == reference` tests and the benchmark.

It shares nothing with the vectorized code but the config: GEMM waves, the switch all2all
time, ring steps, dedup and the flow shop are re-derived here.
"""

from __future__ import annotations

import math

from moejax.catalog.shapes import attention_shapes, context_macs, count, kv_cache_width
from moejax.systems.epsmoe.config import EPSConfig


def _gemm_one(cfg: EPSConfig, rows_list, k_dim, n_out, kernel, sms):
    dev, m, p = cfg.platform.device, cfg.model, cfg.profile
    mma = 1.0 if kernel == "dense" else p.mma_group
    clock = min(1.0, p.clock_share * cfg.sm_total / sms)  # power-capped clock (gemm.py)
    t_tile = 2.0 * p.tile_m * p.tile_n * k_dim / (dev.flops("bf16") / cfg.sm_total * mma
                                                   * clock)
    n_tiles_col = math.ceil(n_out / p.tile_n)

    def nbytes(r):
        w = k_dim * n_out * m.weight_bytes if r > 0 else 0.0
        return w + r * (k_dim + n_out) * m.act_bytes

    if kernel == "dense":  # per expert, the faster of the library's tile heights
        # work items per tile under the dense schedule: 1 (data parallel), k_splits (split-K)
        # or the tile's k-loop iterations (stream-K: every iteration dealt over the SMs)
        parts = {"data_parallel": 1, "split_k": p.k_splits,
                 "stream_k": max(math.ceil(k_dim / p.tile_k), 1)}[cfg.dense_schedule]
        total = 0.0
        for r in rows_list:
            if r > 0:
                comp = min(math.ceil(math.ceil(r / tm) * n_tiles_col * parts / sms) / parts
                           * t_tile * tm / p.tile_m for tm in p.dense_tile_m)
                total += p.launch_s + max(comp, nbytes(r) / dev.memory_Bps)
        return total
    if sum(rows_list) <= 0:
        return 0.0
    tiles = sum(math.ceil(r / p.tile_m) * n_tiles_col for r in rows_list)
    comp = math.ceil(tiles / sms) * t_tile
    mem = sum(nbytes(r) for r in rows_list) / dev.memory_Bps
    return p.launch_s + max(comp, mem)


def ffn_s(cfg: EPSConfig, rows_list, ffn, kernel, sms):
    h = cfg.model.hidden_size
    return (2.0 * _gemm_one(cfg, rows_list, h, ffn, kernel, sms)
            + _gemm_one(cfg, rows_list, ffn, h, kernel, sms))


def kernel_s(cfg: EPSConfig, rows_list, ffn, sms, switch_rows):
    """(time, dense used) under the config's kernel policy."""
    tg = ffn_s(cfg, rows_list, ffn, "group", sms)
    td = ffn_s(cfg, rows_list, ffn, "dense", sms)
    if cfg.gemm == "group":
        dense = False
    elif cfg.gemm == "dense":
        dense = True
    elif cfg.gemm == "threshold":
        active = sum(1 for r in rows_list if r > 0)
        dense = sum(rows_list) / max(active, 1) >= switch_rows
    else:
        dense = td < tg
    return (td if dense else tg), dense


def switch_a2a_s(cfg: EPSConfig, traffic):
    """All2all on a switch: busiest uplink or downlink, plus the path latency if any moves."""
    d = cfg.num_devices
    bw = cfg.platform.topology.link_Bps * cfg.platform.topology.protocol_efficiency
    out = [sum(traffic[s][t] for t in range(d) if t != s) for s in range(d)]
    inn = [sum(traffic[s][t] for s in range(d) if s != t) for t in range(d)]
    busy = max(max(out), max(inn)) / bw
    moving = any(traffic[s][t] > 0 for s in range(d) for t in range(d) if s != t)
    return busy + (cfg.platform.topology.hop_latency_s if moving else 0.0)


def ring_s(cfg: EPSConfig, volume, steps):
    d = cfg.num_devices
    bw = cfg.platform.topology.link_Bps * cfg.platform.topology.protocol_efficiency
    step = (volume / d) / bw + (cfg.platform.topology.hop_latency_s if volume > 0 else 0.0)
    return steps * step + cfg.alpha_s * steps / (d - 1), steps * volume / d


def two_stream(x, y):
    """Event-by-event list schedule: the comm stream runs chunk c's comm after chunk c-1's;
    the compute stream runs chunk c's GEMM after its comm and after GEMM c-1. Makespan."""
    comm_free = comp_free = 0.0
    for xc, yc in zip(x, y, strict=True):
        comm_free = comm_free + xc
        comp_free = max(comp_free, comm_free) + yc
    return comp_free


def block(cfg: EPSConfig, expert_ids, token_mask, scale, switch_rows, seq_len=None):
    """Reference metrics of one block: block_s, comm_s, compute_s, bytes_per_device."""
    m = cfg.model
    d, e_loc, pn = cfg.num_devices, cfg.local_experts, cfg.pn
    toks = [n for n in range(len(token_mask)) if token_mask[n]]
    n_real = len(toks) * scale
    full = n_real * m.token_bytes
    dev = cfg.platform.device
    ctx = (cfg.seq_len if seq_len is None else seq_len) / 2.0
    if m.sliding_window_layers:  # windowed blocks see at most sliding_window tokens
        ctx = (ctx * (m.num_layers - m.sliding_window_layers)
               + min(ctx, m.sliding_window) * m.sliding_window_layers) / m.num_layers
    # attention from its weight matrices (HF shapes), one MAC per weight per token, plus q.k
    # over the q/k head width and p.v over the value head width for every context token
    att_weights = count(attention_shapes(m))
    flops = n_real * 2.0 * (att_weights + ctx * context_macs(m)) / d
    tp = cfg.mode != "dp-ep"
    att = max(flops / (dev.flops("bf16") * cfg.profile.eff_dense),
              (att_weights * m.weight_bytes / (d if tp else 1)
               + n_real / d * (2 * m.token_bytes + kv_cache_width(m) * m.act_bytes))
              / dev.memory_Bps)
    lr_owned = n_real / d * (m.top_k + 1) * m.token_bytes / dev.memory_Bps
    shared_ffn = m.shared_ffn_size * m.num_shared_experts
    if cfg.mode == "tp-tp":
        rows = [0.0] * m.num_experts
        for n in toks:
            for e in expert_ids[n]:
                if e >= 0:
                    rows[e] += scale
        g, _ = kernel_s(cfg, rows, m.expert_ffn_size // d, cfg.sm_total, switch_rows)
        ar, ar_b = ring_s(cfg, full, 2 * (d - 1))
        sh = ffn_s(cfg, [n_real], shared_ffn // d, "dense", cfg.sm_total) if shared_ffn else 0.0
        tail = lr_owned * d + sh
        return {"block_s": att + g + tail + 2 * ar, "comm_s": 2 * ar, "compute_s": g + tail,
                "bytes_per_device": 2 * ar_b}
    group = e_loc // pn
    # chunk of (device, local expert): the config's assignment, else E11's contiguous groups
    chunk_of = [list(r) for r in cfg.chunk_assignment] or [
        [j // group for j in range(e_loc)] for _ in range(d)]
    sent = [[[0.0] * d for _ in range(d)] for _ in range(pn)]
    rows = [[0.0] * e_loc for _ in range(d)]
    for n in toks:
        owner = n % d
        seen = set()
        first_chunk = {}  # send-once reading: device -> earliest chunk that needs the token
        for e in expert_ids[n]:
            if e < 0:
                continue
            dv, loc = e // e_loc, e % e_loc
            c = chunk_of[dv][loc]
            rows[dv][loc] += scale
            first_chunk[dv] = min(first_chunk.get(dv, c), c)
            if cfg.resend and (dv, c) not in seen:
                seen.add((dv, c))
                sent[c][owner][dv] += scale
        if not cfg.resend:
            for dv, c in first_chunk.items():
                sent[c][owner][dv] += scale
    tb = cfg.comm_token_bytes
    slow = max(1.0, cfg.c_sat / cfg.sm_comm)
    x, y = [], []
    pipelined = pn > 1 and cfg.overlap
    sms = (cfg.sm_total if cfg.sm_gemm <= 0 else cfg.sm_gemm) if pipelined else cfg.sm_total
    nbytes = 0.0
    for c in range(pn):
        tr = [[sent[c][s][t] * tb for t in range(d)] for s in range(d)]
        trt = [[tr[t][s] for t in range(d)] for s in range(d)]
        x.append((switch_a2a_s(cfg, tr) + switch_a2a_s(cfg, trt)) * slow + 2 * cfg.alpha_s)
        y.append(max(kernel_s(cfg, [rows[dv][j] for j in range(e_loc) if chunk_of[dv][j] == c],
                              m.expert_ffn_size, sms, switch_rows)[0] for dv in range(d)))
        nbytes += sum(2 * tr[s][t] for s in range(d) for t in range(d) if s != t) / d
    if pipelined:
        free = cfg.sm_total - (cfg.sm_total if cfg.sm_gemm <= 0 else cfg.sm_gemm)
        phi = 1.0 if free >= cfg.sm_comm else max(cfg.phi_min, free / cfg.sm_comm)
        core = two_stream([phi * v for v in x], y) + (1 - phi) * sum(x)
    else:
        core = sum(x) + sum(y)
    core += cfg.chunk_overhead_s * (pn - 1)
    comm = sum(x)
    if tp:
        rs, rs_b = ring_s(cfg, full, d - 1)
        core += 2 * rs
        comm += 2 * rs
        nbytes += 2 * rs_b
    sh = ffn_s(cfg, [n_real / d], shared_ffn, "dense", cfg.sm_total) if shared_ffn else 0.0
    tail = lr_owned + sh
    return {"block_s": att + core + tail, "comm_s": comm, "compute_s": sum(y) + tail,
            "bytes_per_device": nbytes}
