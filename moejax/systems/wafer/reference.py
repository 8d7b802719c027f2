"""Plain-Python reference of one wafer EP layer (001 §III-B, §IV, §V-A), for tests.

Same rules as `layer.layer` in hard mode, written as loops over tokens, routes and ring
steps (mesh platforms only): each (token, expert) pair is fetched from the token's TP-group
member inside the destination's FTD (all-gather kept), else from the nearest holder (ties
split evenly), routes are walked link by link in XY order, a phase lasts
max(link bytes / bandwidth) + the longest active route's latency.

ESP (001 §VI-B5, `cfg.expert_shards` > 0): every (token, expert) pair enters the expert's
EP group once, on the group's holders of the token (split evenly) or else on the member at
position (holder set mod S), fetched from the nearest holder; inside each group a ring
all-gather of the group's tokens and a ring reduce-scatter of the partial sums, (S - 1)
steps of V_group / S per member each; every slice computes all of its expert's tokens.
"""

from __future__ import annotations

import numpy as np

from moejax.catalog.shapes import attention_shapes, context_macs, count, kv_cache_width
from moejax.systems.wafer import mapping as mp


def xy_links(rows: int, cols: int, s: int, d: int) -> list[int]:
    """Directed link indices of the XY route s -> d (moejax.physics.topology link order)."""
    nh, nv = rows * (cols - 1), (rows - 1) * cols
    (r, c), (tr, tc) = divmod(s, cols), divmod(d, cols)
    out = []
    while c != tc:
        if tc > c:
            out.append(r * (cols - 1) + c)
            c += 1
        else:
            out.append(nh + r * (cols - 1) + c - 1)
            c -= 1
    while r != tr:
        if tr > r:
            out.append(2 * nh + r * cols + c)
            r += 1
        else:
            out.append(2 * nh + nv + (r - 1) * cols + c)
            r -= 1
    return out


def phase(traffic: np.ndarray, topo) -> tuple[float, float, np.ndarray]:
    """(busy_s, latency_s, loads [Lk]) of one phase, walking every route."""
    d = traffic.shape[0]
    loads = np.zeros(topo.num_links)
    lat = 0.0
    for s in range(d):
        for t in range(d):
            if s == t or traffic[s, t] <= 0:
                continue
            for link in xy_links(topo.rows, topo.cols, s, t):
                loads[link] += traffic[s, t]
            lat = max(lat, float(topo.path_latency_s[s, t]))
    return float((loads / topo.sustained_Bps).max()), lat, loads


def link_direction(rows: int, cols: int, link: int) -> int:
    """0 E, 1 W, 2 S, 3 N of a directed mesh link index."""
    nh, nv = rows * (cols - 1), (rows - 1) * cols
    return 0 if link < nh else 1 if link < 2 * nh else 2 if link < 2 * nh + nv else 3


def eq1_phase(traffic: np.ndarray, topo, ports: str = "link", m: int = 1) -> float:
    """001 Eq. 1 seconds of one phase (per micro-batch of 1/m), by a loop over transfers.

    Each transfer walks its XY links paying (V / bw_l + lat_l) per link; a die's transfers
    queue on their first link's direction (out-port) and their last link's (in-port), or on
    one port per die (ports = "device"); the phase lasts as long as the busiest port.
    """
    d = traffic.shape[0]
    busy: dict = {}
    for s in range(d):
        for t in range(d):
            if s == t or traffic[s, t] <= 0:
                continue
            links = xy_links(topo.rows, topo.cols, s, t)
            cost = sum(traffic[s, t] / m / topo.link_Bps[k] + topo.link_latency_s[k]
                       for k in links)
            if ports == "link":
                out = ("out", s, link_direction(topo.rows, topo.cols, links[0]))
                inn = ("in", t, link_direction(topo.rows, topo.cols, links[-1]))
            else:
                out, inn = ("out", s), ("in", t)
            busy[out] = busy.get(out, 0.0) + cost
            busy[inn] = busy.get(inn, 0.0) + cost
    return max(busy.values(), default=0.0)


def ring_step(rings, chunk: float, d: int, bidirectional: bool) -> np.ndarray:
    """Traffic [D, D] of one step of concurrent rings (half each way when bidirectional)."""
    step = np.zeros((d, d))
    for members in rings:
        g = len(members)
        for i in range(g):
            nbrs = [(i + 1) % g, (i - 1) % g] if bidirectional else [(i + 1) % g]
            for j in nbrs:
                if members[i] != members[j]:
                    step[members[i], members[j]] += chunk / len(nbrs)
    return step


def dispatch(cfg, host: np.ndarray, expert_ids: np.ndarray, token_mask: np.ndarray):
    """Dispatch traffic [D, D] bytes by a loop over tokens and their experts."""
    m = cfg.mapping
    d = cfg.num_devices
    hops = mp.mesh_hops(m.rows, m.cols)
    hs = mp.token_holder_sets(m, expert_ids.shape[0])
    traffic = np.zeros((d, d))
    ftd_rule = m.name != "her" and m.retain_allgather
    for n in range(expert_ids.shape[0]):
        if not token_mask[n]:
            continue
        holders = [x for x in range(d) if m.holders[hs[n], x] > 0]
        if m.name == "her":  # 001 §IV-B4: the holder on the destination's wafer
            for e in expert_ids[n]:
                hosts = [x for x in range(d) if host[e, x] > 0]
                for dst in hosts:
                    w = next(i for i in range(m.wafer_peers.shape[1])
                             if dst in m.wafer_peers[:, i])
                    traffic[m.wafer_peers[hs[n], w], dst] += cfg.model.token_bytes / len(hosts)
            continue
        if ftd_rule:  # 001 §IV-A: fetch from the group's member in the destination's FTD
            for e in expert_ids[n]:
                hosts = [x for x in range(d) if host[e, x] > 0]
                for dst in hosts:
                    ftd = next(f for f in m.ftds if dst in f)
                    traffic[ftd[hs[n]], dst] += cfg.model.token_bytes / len(hosts)
            continue
        for e in expert_ids[n]:
            hosts = [x for x in range(d) if host[e, x] > 0]
            for dst in hosts:
                best = min(hops[h, dst] for h in holders)
                near = [h for h in holders if hops[h, dst] == best]
                for h in near:
                    traffic[h, dst] += cfg.model.token_bytes / len(hosts) / len(near)
    return traffic


def esp_group_of_expert(cfg, host: np.ndarray) -> list[int]:
    """EP group of each expert: the group of its (first) hosting device."""
    out = []
    for e in range(host.shape[0]):
        dev = next(x for x in range(host.shape[1]) if host[e, x] > 0)
        out.append(next(i for i, grp in enumerate(cfg.esp_groups) if dev in grp))
    return out


def esp_dispatch(cfg, host, expert_ids, token_mask):
    """ESP dispatch traffic [D, D] and the bytes gathered into each EP group, by loops."""
    m = cfg.mapping
    d, s = cfg.num_devices, cfg.expert_shards
    hops = mp.mesh_hops(m.rows, m.cols)
    hs = mp.token_holder_sets(m, expert_ids.shape[0])
    group_of = esp_group_of_expert(cfg, host)
    traffic = np.zeros((d, d))
    vol = np.zeros(len(cfg.esp_groups))
    b = cfg.model.token_bytes
    for n in range(expert_ids.shape[0]):
        if not token_mask[n]:
            continue
        holders = [x for x in range(d) if m.holders[hs[n], x] > 0]
        for e in expert_ids[n]:
            members = list(cfg.esp_groups[group_of[e]])
            vol[group_of[e]] += b
            inside = [x for x in members if x in holders]
            landing = inside if inside else [members[hs[n] % s]]
            for dst in landing:
                best = min(hops[h, dst] for h in holders)
                near = [h for h in holders if hops[h, dst] == best]
                for h in near:
                    traffic[h, dst] += b / len(landing) / len(near)
    return traffic, vol


def esp_step(cfg, vol: np.ndarray) -> np.ndarray:
    """Traffic [D, D] of one ring step inside every EP group."""
    d, s = cfg.num_devices, cfg.expert_shards
    step = np.zeros((d, d))
    for x, members in enumerate(cfg.esp_groups):
        for i in range(s):
            a, b = members[i], members[(i + 1) % s]
            step[a, b] += vol[x] / s
    return step


def esp_ring(cfg, vol: np.ndarray):
    """(busy_s, latency_s, loads) of one ring collective (all-gather or reduce-scatter)."""
    s = cfg.expert_shards
    b_s, l_s, ld = phase(esp_step(cfg, vol), cfg.topo)
    return (s - 1) * b_s, (s - 1) * l_s, (s - 1) * ld


def allreduce(cfg, n_tokens: float, mb: int = 1):
    """(busy_s, latency_s, loads, Eq. 1 seconds per micro-batch of 1/mb) of the all-reduce
    by explicit ring steps."""
    m = cfg.mapping
    d = cfg.num_devices
    vol = n_tokens / m.num_groups * cfg.model.token_bytes
    rings = []
    g = m.groups.shape[1]
    if g > 1:
        rings.append(m.groups)
        if m.name != "her" and m.retain_allgather:
            rings.append(m.groups)
    if m.name == "her":
        rings.append(m.wafer_peers)
    busy = lat = e1 = 0.0
    loads = np.zeros(cfg.topo.num_links)
    for ring in rings:
        step = ring_step(ring, vol / g, d, cfg.bidirectional_rings)
        b_s, l_s, ld = phase(step, cfg.topo)
        steps = len(ring[0]) - 1
        busy, lat, loads = busy + steps * b_s, lat + steps * l_s, loads + steps * ld
        if cfg.eq1:
            e1 += steps * eq1_phase(step, cfg.topo, cfg.eq1_ports, mb)
    return busy, lat, loads, e1


def layer(cfg, host: np.ndarray, expert_ids: np.ndarray, token_mask: np.ndarray) -> dict:
    """Hard-mode timing of one layer with token-level routing (mesh platforms)."""
    mdl, dev = cfg.model, cfg.platform.device
    e, d = host.shape
    counts = np.zeros(e)
    for n in range(expert_ids.shape[0]):
        if token_mask[n]:
            for x in expert_ids[n]:
                counts[x] += 1
    n_tokens = counts.sum() / mdl.top_k
    s = cfg.expert_shards
    if s:
        traffic, vol = esp_dispatch(cfg, host, expert_ids, token_mask)
        eb, el, eloads = esp_ring(cfg, vol)
        served = np.zeros((e, d))
        for y, x in enumerate(esp_group_of_expert(cfg, host)):
            served[y, cfg.esp_groups[x]] = 1.0 / s
    else:
        traffic = dispatch(cfg, host, expert_ids, token_mask)
        eb = el = 0.0
        eloads = np.zeros(cfg.topo.num_links)
        served = host / host.sum(1, keepdims=True)
    db, dl, dloads = phase(traffic, cfg.topo)
    cb, cl, cloads = phase(traffic.T, cfg.topo)
    dev_s = np.zeros(d)
    for x in range(d):
        for y in range(e):
            tok = counts[y] * served[y, x]
            comp = tok * mdl.expert_flops_per_token / (dev.flops(cfg.expert_dtype)
                                                       * dev.gemm_efficiency
                                                       * dev.grouped_gemm_derate)
            mem = (tok > 0) * mdl.expert_weight_bytes / max(s, 1) / dev.memory_Bps
            dev_s[x] += max(comp, mem)
    t_exp = dev_s.max()
    ab, al, aloads, _ = allreduce(cfg, n_tokens)
    groups, g = cfg.mapping.groups.shape
    tok = n_tokens / groups
    ctx = cfg.context_len if cfg.context_len > 0 else tok / 2
    if mdl.sliding_window_layers:  # windowed blocks see at most sliding_window tokens
        ctx = (ctx * (mdl.num_layers - mdl.sliding_window_layers)
               + min(ctx, mdl.sliding_window) * mdl.sliding_window_layers) / mdl.num_layers
    # attention from its weight matrices (HF shapes): one MAC per weight per token, plus the
    # q.k and p.v MACs of every context token
    att_weights = count(attention_shapes(mdl))
    flops = tok * 2.0 * (att_weights + ctx * context_macs(mdl)) / g
    kv = tok * ctx * kv_cache_width(mdl) * mdl.act_bytes * (cfg.context_len > 0)
    att = max(flops / (dev.flops(cfg.attention_dtype) * dev.gemm_efficiency),
              (att_weights * mdl.weight_bytes + kv) / g / dev.memory_Bps)
    best = None
    for m in cfg.micro_batches:
        a_st = [att / m, ab / m + al]
        m_st = [db / m + dl, t_exp / m, cb / m + cl]
        if s:  # ESP: all-gather before and reduce-scatter after the expert slices
            m_st = [db / m + dl, eb / m + el, t_exp / m, eb / m + el, cb / m + cl]
        if cfg.eq1:  # 001 Eq. 1 for every communication stage
            p = cfg.eq1_ports
            dm, cm = eq1_phase(traffic, cfg.topo, p, m), eq1_phase(traffic.T, cfg.topo, p, m)
            a_st = [att / m, allreduce(cfg, n_tokens, m)[3]]
            m_st = [dm, t_exp / m, cm]
            if s:
                em = (s - 1) * eq1_phase(esp_step(cfg, vol), cfg.topo, p, m)
                m_st = [dm, em, t_exp / m, em, cm]
        total = sum(a_st) + (m - 1) * max(a_st) + sum(m_st) + (m - 1) * max(m_st)
        if best is None or total < best[0]:
            best = (total, m)
    hops = mp.mesh_hops(cfg.mapping.rows, cfg.mapping.cols)
    a2a_s, ar_s, esp_s = db + dl + cb + cl, ab + al, 2 * (eb + el)
    if cfg.eq1:
        p = cfg.eq1_ports
        a2a_s = eq1_phase(traffic, cfg.topo, p) + eq1_phase(traffic.T, cfg.topo, p)
        ar_s = allreduce(cfg, n_tokens)[3]
        esp_s = 2 * (s - 1) * eq1_phase(esp_step(cfg, vol), cfg.topo, p) if s else 0.0
    return {
        "layer_s": best[0], "micro_batches": best[1], "all_to_all_s": a2a_s,
        "all_reduce_s": ar_s, "esp_reduce_s": esp_s, "moe_compute_s": t_exp,
        "attention_s": att,
        "avg_hops": (traffic * hops).sum() / max(traffic.sum(), 1e-30),
        "a2a_link_bytes": dloads + cloads, "ar_link_bytes": aloads, "esp_link_bytes": 2 * eloads,
        "device_tokens": (counts[:, None] * served).sum(0),
    }
