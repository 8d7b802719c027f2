"""What a re-plan costs: the expert weights that move, over the platform's real links.

When a new placement puts expert e on a device that did not hold it, the device copies e's
weights (`ModelSpec.expert_weight_bytes` per MoE layer) from a device that held it: the
nearest old holders (smallest path latency, e.g. the same node before another node over
InfiniBand), split evenly among them. Replicas that leave a device cost nothing (the slot
is overwritten). The copies of one re-plan form one traffic matrix [D, D] that drains
like an all-to-all phase over the topology (`moejax.physics.collectives`, per-link
contention), which is how SGLang's and vLLM's EPLB rebalance exchanges weights (point to
point sends of the changed slots).
"""

from __future__ import annotations

import jax.numpy as jnp

from moejax.physics import collectives
from moejax.physics.topology import Topology


def new_copies(old_hosts, new_hosts):
    """[..., E, D] 1 where device d must fetch expert e's weights (held now, not before)."""
    return jnp.maximum(new_hosts - old_hosts, 0.0)


def source_split(old_hosts, path_latency_s):
    """[..., E, D(src), D(dst)] share of a copy of e to dst fetched from src: the old holders
    nearest to dst, evenly."""
    cost = jnp.asarray(path_latency_s, jnp.float32)  # [D, D]
    held = old_hosts[..., :, None] > 0  # [..., E, D(src), 1]
    c = jnp.where(held, cost, jnp.inf)
    nearest = held & (c <= c.min(-2, keepdims=True))
    n = nearest.astype(jnp.float32)
    return n / jnp.maximum(n.sum(-2, keepdims=True), 1.0)


def traffic_bytes(old_hosts, new_hosts, path_latency_s, expert_bytes, layer_scale=1.0):
    """Copy traffic [D(src), D(dst)] in bytes of moving from hosts old to new [..., E, D]
    (0/1), summed over the leading (layer) axes and scaled by `layer_scale` (the model's
    MoE layers per traced layer)."""
    need = new_copies(old_hosts, new_hosts)  # [..., E, D(dst)]
    split = source_split(old_hosts, path_latency_s)
    t = jnp.einsum("...ed,...esd->sd", need, split)
    return t * (expert_bytes * layer_scale)


def time_s(traffic, topo: Topology, tau=0.0):
    """Seconds the copy traffic [D, D] takes over the platform's links (one phase)."""
    return collectives.all_to_all_time_s(traffic, topo, tau)
