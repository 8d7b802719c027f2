"""Collectives on a topology, timed from the per-link load of their traffic matrices.

Contention model: a communication phase with traffic `[D, D]` (bytes from s to d) ends
when its busiest link has drained its load, plus the latency of the longest route that
carries traffic:

    time = max_l(load_l / bw_l) + max_{s,d: traffic>0} path_latency(s, d)

where bw_l is the rate link l sustains under bulk traffic (`Topology.sustained_Bps`: its
raw bandwidth times its link type's protocol efficiency, 1 on an ideal platform). Per-message
and per-kernel fixed costs and the SM limit of a communication kernel are added by the one
all-to-all entry point every system uses, `moejax.physics.comm`.

It is cut-through: a lone transfer over h hops costs V / bw + h * latency, while 001 Eq. 1
(`links.eq1_latency_s`) charges (V / bw + latency) * h; under all-to-all load the loads of
the shared links carry the hop factor of Eq. 1 (each flow occupies every link on its route).
Ring collectives are a sequence of such phases (one per ring step) with every member
sending one chunk to its ring successor; concurrent groups share links and contend.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from moejax import relax
from moejax.physics.topology import Topology


def phase_time_s(traffic, topo: Topology, tau=0.0):
    """Seconds for one phase moving `traffic` [..., D, D] bytes (diagonal is local, free)."""
    return link_busy_s(traffic, topo, tau) + path_latency_s(traffic, topo)


def link_busy_s(traffic, topo: Topology, tau=0.0):
    """Seconds [...] the busiest link needs to drain its load of `traffic` [..., D, D]."""
    return busy_of_loads(topo.link_loads(traffic), topo, tau)


def busy_of_loads(loads, topo: Topology, tau=0.0):
    """Seconds [...] the busiest link needs to drain `loads` [..., Lk] bytes at the rates it
    sustains (`Topology.sustained_Bps`)."""
    return relax.max(loads / jnp.asarray(topo.sustained_Bps, jnp.float32), tau, axis=-1)


def path_latency_s(traffic, topo: Topology):
    """Latency [...] of the longest route that carries traffic [..., D, D]."""
    d = traffic.shape[-1]
    active = (traffic * (1.0 - jnp.eye(d)) > 0).astype(jnp.float32)
    return jnp.max(active * jnp.asarray(topo.path_latency_s, jnp.float32), axis=(-2, -1))


def all_to_all_time_s(traffic, topo: Topology, tau=0.0):
    """All-to-all (MoE dispatch or combine) with an arbitrary traffic matrix [..., D, D]."""
    return phase_time_s(traffic, topo, tau)


def ring_step_traffic(groups: np.ndarray, chunk_bytes, num_devices: int,
                      bidirectional: bool = False):
    """Traffic [..., D, D] of one ring step: member i of each group sends to member i+1.

    groups: int [G, g] device ids of G concurrent rings of g members.
    chunk_bytes: scalar (or [...]) bytes each member sends in this step.
    bidirectional: half of the chunk goes to the successor and half to the predecessor
    (two rings in opposite directions over halves of the data, the same g - 1 steps;
    001 §IV-B2 "Packages are sent bi-directionally, step by step").
    """
    pattern = ring_step_pattern(groups, num_devices, bidirectional)
    return jnp.asarray(chunk_bytes, jnp.float32)[..., None, None] * pattern


def ring_step_pattern(groups: np.ndarray, num_devices: int,
                      bidirectional: bool = False) -> np.ndarray:
    """Host float32 [D, D] of one ring step with one byte per member (`ring_step_traffic`
    of 1 byte, without an XLA call)."""
    groups = np.asarray(groups)
    src = groups.reshape(-1)
    pattern = np.zeros((num_devices, num_devices), np.float32)
    if bidirectional:
        for shift in (-1, 1):
            np.add.at(pattern, (src, np.roll(groups, shift, axis=1).reshape(-1)), 0.5)
    else:
        pattern[src, np.roll(groups, -1, axis=1).reshape(-1)] = 1.0
    np.fill_diagonal(pattern, 0.0)
    return pattern


def reduce_scatter_time_s(volume_bytes, groups, topo: Topology, tau=0.0):
    """Ring reduce-scatter of `volume_bytes` per member in each group: (g-1) steps of V/g."""
    g = np.asarray(groups).shape[1]
    if g == 1:
        return jnp.zeros(jnp.shape(volume_bytes), jnp.float32)
    step = ring_step_traffic(groups, jnp.asarray(volume_bytes) / g, topo.num_devices)
    return (g - 1) * phase_time_s(step, topo, tau)


def all_gather_time_s(volume_bytes, groups, topo: Topology, tau=0.0):
    """Ring all-gather to `volume_bytes` per member (each holds V/g at the start)."""
    return reduce_scatter_time_s(volume_bytes, groups, topo, tau)


def all_reduce_time_s(volume_bytes, groups, topo: Topology, tau=0.0, all_gather=True):
    """Ring all-reduce = reduce-scatter + all-gather: 2 (g-1) steps of V/g each.

    On a switch this is the closed form 2 (g-1)/g * V / BW + 2 (g-1) * latency.
    `all_gather=False` drops the second half (001 §IV-A / VI-B6: tokens stay sharded).
    """
    rs = reduce_scatter_time_s(volume_bytes, groups, topo, tau)
    return rs * 2 if all_gather else rs
