"""Plain-Python reference of `system.moe_layer` in hard mode (tests: vectorized == reference).

Loops over tokens and their experts for the port bytes (one packet decision per token and
destination, spec §2 table), over GPUs, experts and GEMM tiles for the expert time, and
applies the schedule rules of `schedule.py` with Python `max`. Same rules, no JAX.
Attention is counted from the block's weight matrices (`catalog.shapes`, the Hugging Face
module shapes), not from `ModelSpec`'s closed forms that the system uses, so a wrong
attention formula (e.g. MLA counted as full multi-head attention) shows as a mismatch.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from moejax.catalog.shapes import attention_shapes, context_macs, count
from moejax.systems.dysharp import packet
from moejax.systems.dysharp.config import (
    COMM_SMS,
    COUNT_BYTES,
    NOTIFY_BARRIERS,
    OVERLAPPED,
    WGMMA_M,
    DyConfig,
)

BACKWARD_GEMM_FACTOR = 2.0  # as system.BACKWARD_GEMM_FACTOR (spec §7.3)


def port_loads(cfg: DyConfig, expert_ids, token_mask, placement):
    """[4][G] token vectors (dispatch up/down, combine up/down) of the config's primitive;
    placement must be one-hot (an expert on one GPU)."""
    g = cfg.num_devices
    home = [int(np.argmax(row)) for row in np.asarray(placement)]
    loads = [[0.0] * g for _ in range(4)]
    n_tok = [0] * g
    tokens = []
    for n in range(len(expert_ids)):
        experts = [int(e) for e in expert_ids[n] if e >= 0]
        if not token_mask[n] or not experts:
            continue
        s = n % g
        n_tok[s] += 1
        per_gpu: dict[int, int] = {}
        for e in experts:
            per_gpu[home[e]] = per_gpu.get(home[e], 0) + 1
        tokens.append((s, per_gpu))
    total = sum(n_tok)
    if cfg.primitive == "nvls":
        for d in range(g):
            others = total - n_tok[d] + (n_tok[d] if cfg.nvls_self_copy else 0)
            loads[0][d] += n_tok[d]
            loads[1][d] += others
            loads[2][d] += others
            loads[3][d] += n_tok[d]
        return loads
    literal = cfg.primitive in ("dymultimem", "explicit") and cfg.combine == "per_expert"
    for s, per_gpu in tokens:
        remote = {d: c for d, c in per_gpu.items() if d != s}
        if cfg.primitive == "unicast_pair":
            up = sum(remote.values())
            for d, c in remote.items():
                loads[1][d] += c
                loads[2][d] += c
        elif cfg.primitive == "unicast_rank":
            up = len(remote)
            for d in remote:
                loads[1][d] += 1
                loads[2][d] += 1
        elif literal:  # every target through the switch, one partial per expert
            up = 1
            for d, c in per_gpu.items():
                loads[1][d] += 1
                loads[2][d] += c
        else:  # dymultimem / explicit, per-GPU combine: one copy up, one partial per GPU
            up = 1 if remote else 0
            for d in remote:
                loads[1][d] += 1
                loads[2][d] += 1
        loads[0][s] += up
        loads[3][s] += up
    return loads


def gemm_times_s(cfg: DyConfig, tokens_de, share=1.0):
    """(GEMM-1 [G], GEMM-2 [G]) seconds: whole tiles per expert (a tile computes at least
    WGMMA_M rows), weights read once; compute on `share` of the SMs, weight reads at the
    HBM rate whatever the share."""
    m, dev = cfg.model, cfg.platform.device
    peak = dev.flops(cfg.gemm_dtype) * (dev.gemm_efficiency * dev.grouped_gemm_derate)
    hf = m.hidden_size * m.expert_ffn_size
    x1, x2 = [], []
    for d in range(cfg.num_devices):
        t1 = t2 = 0.0
        for e in range(m.num_experts):
            rows = float(tokens_de[d][e])
            tiles = 0
            while tiles * cfg.tile_tokens < rows - 1e-6 * cfg.tile_tokens:  # tile by tile
                tiles += 1
            used = 1.0 if rows > 0 else 0.0
            for mats, acc in ((m.ffn_matrices - 1, 1), (1, 2)):
                comp = tiles * max(cfg.tile_tokens, WGMMA_M) * 2.0 * mats * hf / (peak * share)
                mem = used * mats * hf * m.weight_bytes / dev.memory_Bps
                if acc == 1:
                    t1 += max(comp, mem)
                else:
                    t2 += max(comp, mem)
        x1.append(t1)
        x2.append(t2)
    return x1, x2


def attention_s(cfg: DyConfig, n_tokens: float, share: float = 1.0) -> float:
    """One attention block, data parallel (each GPU attends its n_tokens / G tokens, causal
    prefill: half of them as context on average), from the block's weight matrices: one
    multiply-accumulate per weight per token, q.k and p.v per context token
    (`shapes.context_macs`), BF16 dense GEMMs on `share` of the SMs, weights read once."""
    m, dev = cfg.model, cfg.platform.device
    tok = n_tokens / cfg.num_devices
    ctx = tok / 2
    if m.sliding_window and m.sliding_window_layers:  # windowed blocks see at most the window
        ctx = (ctx * (m.num_layers - m.sliding_window_layers)
               + min(ctx, m.sliding_window) * m.sliding_window_layers) / m.num_layers
    weights = count(attention_shapes(m))
    flops = tok * 2.0 * (weights + ctx * context_macs(m))
    comp = flops / (dev.flops("bf16") * dev.gemm_efficiency * share)
    return max(comp, weights * m.weight_bytes / dev.memory_Bps)


def unicast_rate_share(cfg: DyConfig) -> float:
    """Share of link_Bps unicast bytes (headers included) move at: 1 under 004's packet
    model, the platform's measured protocol efficiency otherwise."""
    return 1.0 if cfg.link_model == "packet" else cfg.platform.topology.protocol_efficiency


def link_share(cfg: DyConfig) -> float:
    """Share of link_Bps that carries the primitive's payload (`system.efficiency`)."""
    eta = packet.payload_efficiency(cfg.platform, cfg.primitive, cfg.model.top_k)
    if cfg.link_model == "packet":
        return eta
    return unicast_rate_share(cfg) * eta / packet.payload_efficiency(
        cfg.platform, "unicast_rank", cfg.model.top_k)


def layer_time_s(cfg: DyConfig, wire, tokens_de, n_tokens, factor=1.0):
    """Schedule rules of `schedule.layer_time_s` on Python floats: (latency, comm, gemm) of
    one pass whose GEMMs do `factor` x the forward work; with `adaptive_comm_sms`, the
    fastest of the candidate comm SM counts."""
    if cfg.adaptive_comm_sms:
        runs = [_layer_time_s(dataclasses.replace(cfg, comm_sms=n), wire, tokens_de,
                              n_tokens, factor) for n in cfg.adaptive_comm_sms]
        return min(runs, key=lambda r: r[0])
    return _layer_time_s(cfg, wire, tokens_de, n_tokens, factor)


def _layer_time_s(cfg: DyConfig, wire, tokens_de, n_tokens, factor):
    overlapped = cfg.schedule in OVERLAPPED
    sms = cfg.platform.device.sm_count
    share = 1.0 - min(cfg.comm_sms, sms - 1) / sms if overlapped else 1.0
    rate = min(1.0, cfg.comm_sms / COMM_SMS) if overlapped else 1.0
    bw, lat = cfg.platform.topology.link_Bps * rate, cfg.latency_s
    eta = link_share(cfg)
    cd = max(max(wire[0][d], wire[1][d]) for d in range(cfg.num_devices)) / bw + lat
    cc = max(max(wire[2][d], wire[3][d]) for d in range(cfg.num_devices)) / bw + lat
    x1, x2 = gemm_times_s(cfg, tokens_de)
    x1s, x2s = gemm_times_s(cfg, tokens_de, share)
    x1, x2, x1s, x2s = ([factor * v for v in xs] for xs in (x1, x2, x1s, x2s))
    x = max(a + b for a, b in zip(x1, x2, strict=True))
    xs = max(a + b for a, b in zip(x1s, x2s, strict=True))
    m = cfg.model
    tok = cfg.tile_tokens
    occ = min(tok, n_tokens * m.top_k / m.num_experts)  # tokens in the first / last tile
    hf = m.hidden_size * m.expert_ffn_size
    dev = cfg.platform.device
    peak = dev.flops(cfg.gemm_dtype) * (dev.gemm_efficiency * dev.grouped_gemm_derate) * share
    tile_comm = occ * cfg.token_bytes / (eta * bw)
    rows = max(tok, WGMMA_M)
    fill = (2 * tile_comm + rows * 2.0 * (m.ffn_matrices - 1) * hf / peak
            + rows * 2.0 * hf / peak + 2 * lat)
    if cfg.schedule == "serial":
        t = cd + max(x1) + max(x2) + cc
    elif cfg.schedule == "coarse":
        c = cd + cc
        t = min(max(c, xn) + min(c, xn) / n + (n - 1) * 2 * lat
                for n in cfg.chunks for xn in [x if n == 1 else xs])
    elif cfg.schedule == "fine":
        t = max(cd, max(x1s)) + max(max(x2s), cc) + fill
    else:
        up = max(wire[0][d] + wire[2][d] for d in range(cfg.num_devices)) / bw
        down = max(wire[1][d] + wire[3][d] for d in range(cfg.num_devices)) / bw
        t = max(up, down, xs) + fill
    return t, cd + cc, x


def moe_layer(cfg: DyConfig, expert_ids, token_mask, counts, placement):
    """dict latency_s / comm_s / gemm_s / traffic_bytes of one layer (hard mode)."""
    expert_ids, token_mask = np.asarray(expert_ids), np.asarray(token_mask)
    placement = np.asarray(placement)
    n_real = sum(1 for n in range(len(expert_ids))
                 if token_mask[n] and any(e >= 0 for e in expert_ids[n]))
    scale = (cfg.tokens_per_gpu * cfg.num_devices / max(n_real, 1)
             if cfg.tokens_per_gpu > 0 else 1.0)
    eta = link_share(cfg)
    loads = port_loads(cfg, expert_ids, token_mask, placement)
    wire = [[v * scale * cfg.token_bytes / eta for v in row] for row in loads]
    tokens_de = [[float(counts[e]) * float(placement[e][d]) * scale
                  for e in range(cfg.model.num_experts)] for d in range(cfg.num_devices)]
    n_tok = n_real * scale
    t, c, x = layer_time_s(cfg, wire, tokens_de, n_tok)
    if cfg.notify:  # DeepEP notify_dispatch: two barriers, counts to every peer
        g, e = cfg.num_devices, cfg.model.num_experts
        t_n = (NOTIFY_BARRIERS * 2 * cfg.latency_s
               + (g - 1) * (1 + e / g) * COUNT_BYTES / (cfg.platform.topology.link_Bps
                                                         * unicast_rate_share(cfg)))
        t, c = t + t_n, c + t_n
    passes = 1.0
    # DualPipe's block: comm beside compute on comm_sms SMs (DeepSeek-V3 §3.2.2)
    sms = cfg.platform.device.sm_count
    share_dp = 1.0 - min(cfg.comm_sms, sms - 1) / sms
    x1d, x2d = gemm_times_s(cfg, tokens_de, share_dp)
    x_dp = max(a + b for a, b in zip(x1d, x2d, strict=True))
    att, att_dp = attention_s(cfg, n_tok), attention_s(cfg, n_tok, share_dp)
    if cfg.phase == "training":
        f = BACKWARD_GEMM_FACTOR
        tb, cb, xb = layer_time_s(cfg, wire, tokens_de, n_tok, f)
        t, c, x, passes = t + tb, c + cb, x + xb, 2.0
        att, att_dp, x_dp = att * (1 + f), att_dp * (1 + f), x_dp * (1 + f)
    total = sum(sum(row) for row in loads) * scale * cfg.token_bytes * passes
    assert math.isfinite(t)
    return {"latency_s": t, "comm_s": c, "gemm_s": x, "traffic_bytes": total,
            "attention_s": att, "block_dualpipe_s": max(c, x_dp + att_dp)}
