"""The TP all-reduce of one attention layer as ring phases (001 §III-B, §IV-B2, §IV-B4).

Ring reduce-scatter (+ all-gather when retained, 001 §IV-A, §VI-B6) inside each TP group;
under HER-Mapping the intra-wafer reduce-scatter and the inter-wafer all-gather (§IV-B4).
`allreduce_unit_phases` is the same per token, static, with its link loads and its 001
Eq. 1 port parts, so the layer scales it by its token count.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from moejax.physics import collectives, eq1
from moejax.systems.wafer.config import WaferConfig


def allreduce_phases(cfg: WaferConfig, n_tokens):
    """Ring phases of one attention layer's all-reduce.

    Ring reduce-scatter (+ all-gather when retained) of each TP group's hidden states,
    `tokens per group * token_bytes` per member (001 §III-B, §IV-B2 entwined rings).
    HER (§IV-B4): the intra-wafer reduce-scatter, then the inter-wafer all-gather ring over
    the devices at the same wafer position. Returns [(steps, one step's traffic [D, D])].
    Like the paper, no mapping pays for merging combined partial outputs back into the next
    layer's input (the combine is the dispatch reversed, §IV-A).
    """
    m = cfg.mapping
    d = cfg.num_devices
    vol = n_tokens / m.num_groups * cfg.model.token_bytes
    phases = []  # (steps, traffic of one step [D, D])
    g = m.groups.shape[1]
    if g > 1:
        step = _ring_step(m.groups, vol / g, d, cfg.bidirectional_rings)
        phases.append((g - 1, step))
        if m.name != "her" and m.retain_allgather:
            phases.append((g - 1, step))
    if m.name == "her":
        w = m.wafer_peers.shape[1]
        step = _ring_step(m.wafer_peers, vol / g, d, cfg.bidirectional_rings)
        phases.append((w - 1, step))
    return phases


def _ring_step(groups, chunk_bytes, num_devices: int, bidirectional: bool):
    """`collectives.ring_step_traffic`; a Python-number chunk (the static per-token table)
    on the host: the same float32 product without an XLA call."""
    if isinstance(chunk_bytes, (int, float)):
        return np.float32(chunk_bytes) * collectives.ring_step_pattern(groups, num_devices,
                                                                       bidirectional)
    return collectives.ring_step_traffic(groups, chunk_bytes, num_devices, bidirectional)


@functools.lru_cache(maxsize=64)
def allreduce_unit_phases(cfg: WaferConfig):
    """Static [(steps, link bytes per token [Lk] of one step, latency_s of one step,
    Eq. 1 port parts per token (bw [Pt], latency [Pt]) of one step or None)]."""
    out = []
    # static geometry on the host (NumPy), also when first called under jit
    phases = [(steps, np.asarray(step, np.float32))
              for steps, step in allreduce_phases(cfg, 1.0)]
    loads_of = [cfg.topo.link_loads_np(st).astype(np.float64) for _, st in phases]
    ports_of = [eq1.port_parts_np(st, eq1.tables(cfg.topo, cfg.eq1_ports)) if cfg.eq1
                else None for _, st in phases]
    for (steps, step), loads, ports in zip(phases, loads_of, ports_of, strict=True):
        # a phase equal to an earlier one (the retained all-gather repeats the reduce-scatter's
        # ring steps) folds into it: k * x + k * x == (2 k) * x exactly in floating point
        same = [i for i, (k, st) in enumerate(phases[:len(out)])
                if out[i] is not None and k == steps and np.array_equal(st, step)]
        if same:
            s0, l0, lat0, p0 = out[same[0]]
            out[same[0]] = (s0 + steps, l0, lat0, p0)
            out.append(None)
            continue
        lat = (cfg.topo.path_latency_s * (step * (1 - np.eye(len(step))) > 0)).max()
        out.append((steps, loads, lat if isinstance(lat, jax.core.Tracer) else float(lat),
                    ports))
    return tuple(o for o in out if o is not None)
