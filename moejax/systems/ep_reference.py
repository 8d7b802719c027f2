"""Plain NumPy / Python reference of synchronous EP (`ep.py`) for tests and benchmarks.

Straight loops over tokens, devices, experts and links, written from the rules in
`ep.py`'s docstrings, not from its code: hard mode only.
"""

from __future__ import annotations

import numpy as np

from moejax.systems.ep import EPConfig, token_owner


def _phase_time(traffic: np.ndarray, cfg: EPConfig) -> float:
    inc = cfg.topo.incidence()
    d = traffic.shape[0]
    loads = np.zeros(cfg.topo.num_links)
    lat = 0.0
    for s in range(d):
        for t in range(d):
            if s != t and traffic[s, t] > 0:
                loads += traffic[s, t] * inc[s, t]
                lat = max(lat, cfg.topo.path_latency_s[s, t])
    # the link's rate under bulk traffic (protocol efficiency; 1 on an ideal platform), the
    # kernel's fixed cost, and one message per destination (`physics.comm`)
    spec = cfg.platform.topology
    rate = cfg.topo.link_Bps * spec.protocol_efficiency
    if cfg.topo.kind == "hierarchical":
        rate = np.concatenate([rate[:2 * d], cfg.topo.link_Bps[2 * d:]
                               * spec.inter_protocol_efficiency])
    peers = max(sum(1 for t in range(d) if t != s and traffic[s, t] > 0) for s in range(d))
    fixed = peers * spec.message_latency_s + spec.kernel_latency_s
    return float(np.max(loads / rate)) + lat + fixed, loads


def moe_layer(cfg: EPConfig, placement: np.ndarray, expert_ids, token_mask, counts):
    """Latency (s) of one layer and per-device compute-busy seconds."""
    m, dev = cfg.model, cfg.platform.device
    peak, bw = dev.flops(cfg.dtype) * dev.gemm_efficiency, dev.memory_Bps
    peak_grouped = peak * dev.grouped_gemm_derate  # the experts' grouped kernel
    d, e = cfg.num_devices, m.num_experts
    n = expert_ids.shape[0]
    traffic = np.zeros((d, d))
    owned = np.zeros(d)
    if n:
        owner = token_owner(cfg, n)
        for tok in range(n):
            if not token_mask[tok]:
                continue
            owned[owner[tok]] += 1
            for x in expert_ids[tok]:
                for dst in range(d):
                    traffic[owner[tok], dst] += placement[x, dst] * m.token_bytes
    else:
        owned[:] = counts.sum() / m.top_k / d
        for x in range(e):
            for src in range(d):
                for dst in range(d):
                    traffic[src, dst] += counts[x] / d * placement[x, dst] * m.token_bytes
    dispatch, _ = _phase_time(traffic, cfg)
    combine, _ = _phase_time(traffic.T.copy(), cfg)
    busy = np.zeros(d)
    compute = np.zeros(d)
    for dev_i in range(d):
        for x in range(e):
            tok = counts[x] * placement[x, dev_i]
            c = tok * m.expert_flops_per_token / peak_grouped
            w = (m.expert_weight_bytes / bw) if tok > 0 else 0.0
            busy[dev_i] += max(c, w)
            compute[dev_i] += c
        if m.num_shared_experts:
            c = owned[dev_i] * m.shared_flops_per_token / peak
            busy[dev_i] += max(c, m.shared_weight_bytes / bw)
            compute[dev_i] += c
    return dispatch + busy.max() + combine, compute


def layer_latency(cfg: EPConfig, placement, expert_ids, token_mask, counts) -> np.ndarray:
    """Mean MoE-layer latency of each trace of a batch, [T] (iterations with tokens only).

    placement [E, D] for every layer, or [L, E, D] one per layer."""
    placement = np.asarray(placement, np.float64)
    expert_ids, token_mask = np.asarray(expert_ids), np.asarray(token_mask)
    counts = np.asarray(counts, np.float64)
    t_, i_, l_ = counts.shape[:3]
    out = np.zeros(t_)
    for t in range(t_):
        total, iters = 0.0, 0
        for it in range(i_):
            if counts[t, it, 0].sum() == 0:
                continue
            lat = [moe_layer(cfg, placement[layer] if placement.ndim == 3 else placement,
                             expert_ids[t, it, layer], token_mask[t, it],
                             counts[t, it, layer])[0] for layer in range(l_)]
            total += float(np.mean(lat))
            iters += 1
        out[t] = total / max(iters, 1)
    return out
