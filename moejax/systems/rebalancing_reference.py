"""Plain-Python reference of the rebalancing EP system (`rebalancing.py`) for tests: loops
over iterations, layers, experts and devices, written from the module's rules (re-plan at
t = W, W + R, ...; EPLB on the mean of the last W loads; copies from the nearest old
holders; 'blocking' and 'free' migration), with `eplb_reference` and `ep_reference`.
"""

from __future__ import annotations

import numpy as np

from moejax.placement import eplb_reference
from moejax.systems import ep_reference
from moejax.systems.rebalancing import RebalanceConfig


def plan(cfg: RebalanceConfig, load_le: np.ndarray) -> np.ndarray:
    """EPLB shares [L, E, D] (even split) of mean loads [L, E]."""
    e, d = load_le.shape[-1], cfg.ep.num_devices
    phy2log, _, _ = eplb_reference.rebalance(load_le, cfg.num_slots, cfg.num_groups,
                                             cfg.num_nodes, d, cfg.eplb_mode)
    out = np.zeros((load_le.shape[0], e, d))
    for l, row in enumerate(phy2log):
        for s, x in enumerate(row):
            out[l, x, s // cfg.slots_per_device] += 1
    return out / out.sum(-1, keepdims=True)


def copy_traffic(cfg: RebalanceConfig, old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Bytes [D, D] of the copies from old to new shares [L, E, D]."""
    m, d = cfg.ep.model, cfg.ep.num_devices
    lat = cfg.ep.topo.path_latency_s
    scale = m.expert_weight_bytes * m.num_sparse_layers / old.shape[0]
    traffic = np.zeros((d, d))
    for l in range(old.shape[0]):
        for e in range(old.shape[1]):
            holders = [s for s in range(d) if old[l, e, s] > 0]
            for dst in range(d):
                if new[l, e, dst] > 0 and old[l, e, dst] == 0:
                    best = min(lat[s, dst] for s in holders)
                    near = [s for s in holders if lat[s, dst] <= best]
                    for s in near:
                        traffic[s, dst] += scale / len(near)
    return traffic


def run(cfg: RebalanceConfig, interval: int, window: int, initial: np.ndarray, trace) -> dict:
    """Metrics of one trace (counts [I, L, E], token-level ids or counts-only)."""
    counts = np.asarray(trace.counts, np.float64)
    ids, mask = np.asarray(trace.expert_ids), np.asarray(trace.token_mask)
    iters, layers, _ = counts.shape
    place = np.broadcast_to(initial, (layers, *initial.shape[-2:])).astype(np.float64)
    out = {"latency": [], "moved_bytes": 0.0, "move_s": 0.0, "stall_s": 0.0, "replans": 0,
           "placements": []}
    for t in range(iters):
        due = t == window if interval == 0 else (t >= window and (t - window) % interval == 0)
        if due:
            new = plan(cfg, counts[t - window:t].mean(0).astype(np.float32))
            traffic = copy_traffic(cfg, place, new)
            move = ep_reference._phase_time(traffic, cfg.ep)[0] if traffic.any() else 0.0
            out["moved_bytes"] += traffic.sum()
            out["move_s"] += move
            out["stall_s"] += move if cfg.migration == "blocking" else 0.0
            out["replans"] += 1
            place = new
        out["placements"].append(place)
        lat = [ep_reference.moe_layer(cfg.ep, place[l], ids[t, l], mask[t], counts[t, l])[0]
               for l in range(layers)]
        out["latency"].append(float(np.mean(lat)))
    return out
