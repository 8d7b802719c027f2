"""Expert slicing parallelism, ESP (001 §VI-B5): every expert sliced over one EP group.

The (token, expert) pairs enter each expert's EP group once (`mapping.esp_landing`); a ring
all-gather inside the group before the expert slices and a ring reduce-scatter of the
partial sums after them ("all-reduce operations to aggregate partial sums within EP
groups").
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

from moejax import relax
from moejax.physics import collectives, eq1
from moejax.systems.wafer.config import WaferConfig


def esp_member(cfg: WaferConfig) -> np.ndarray:
    """float [D, X]: device d belongs to EP group x."""
    g = cfg.esp_groups
    out = np.zeros((cfg.num_devices, g.shape[0]), np.float32)
    out[g, np.arange(g.shape[0])[:, None]] = 1.0
    return out


@functools.lru_cache(maxsize=64)
def esp_unit_steps(cfg: WaferConfig):
    """Static (link bytes [X, Lk], latency_s [X]) of one ring step of each EP group.

    Member i of group x sends one byte to member i + 1 (`collectives.ring_step_traffic`);
    groups are disjoint tiles, so a step of all groups loads the links with the sum.
    """
    g = cfg.esp_groups
    d = cfg.num_devices
    steps = np.stack([collectives.ring_step_pattern(g[x:x + 1], d)
                      for x in range(g.shape[0])])  # [X, D, D], host NumPy
    loads = cfg.topo.link_loads_np(steps).astype(np.float64)
    ports = eq1.port_parts_np(steps, eq1.tables(cfg.topo, cfg.eq1_ports)) if cfg.eq1 \
        else None
    lat = (cfg.topo.path_latency_s[None] * (steps > 0)).max(axis=(1, 2))
    return loads, lat, ports


def esp_served(cfg: WaferConfig, host):
    """(expert -> EP group shares [E, X], served [E, D]) under ESP (001 §VI-B5).

    host [E, D]: expert e's EP group is that of its native device (soft rows: shares);
    each of the group's S slices serves all of the expert's tokens with 1/S of the work.
    """
    member = jnp.asarray(esp_member(cfg))  # [D, X]
    eg = host @ member
    eg = eg / jnp.maximum(eg.sum(-1, keepdims=True), 1e-30)
    return eg, eg @ member.T / cfg.expert_shards


def esp_dispatch_traffic(cfg: WaferConfig, pairs_hx):
    """ESP all-to-all [D(src), D(dst)] bytes from (token, expert) pairs per holder set and
    EP group [H, X]: each pair enters its group once, where `mapping.esp_landing` puts it
    (free when a holder of the token is in the group, as for every token under ER with
    S = D / TP), fetched from the nearest holder."""
    b = jnp.einsum("hx,hxd->hd", pairs_hx, jnp.asarray(cfg.esp_landing))
    return jnp.einsum("hd,hds->sd", b, jnp.asarray(cfg.source_split)) * cfg.model.token_bytes


def esp_ring(cfg: WaferConfig, vol, tau_s):
    """Ring collectives inside the EP groups (001 §VI-B5), vol [X] bytes gathered per group.

    A ring all-gather of the group's tokens (every slice needs every token) before the
    expert slices and a ring reduce-scatter of the partial sums back to the landing devices
    after them: together the volume of one all-reduce inside the EP group ("all-reduce
    operations to aggregate partial sums within EP groups"), (S - 1) steps each of V_x / S
    per member. Returns (link bytes [Lk], busy_s, latency_s, Eq. 1 port parts of one step
    (bw [Pt], latency [Pt]) or None) of one of the two collectives.
    """
    s = cfg.expert_shards
    unit, lat, ports = esp_unit_steps(cfg)
    loads = (vol / s) @ jnp.asarray(unit, jnp.float32)  # one ring step [Lk]
    bw = jnp.asarray(cfg.topo.sustained_Bps, jnp.float32)
    busy = (s - 1) * relax.max(loads / bw, tau_s, axis=-1)
    ring_lat = (s - 1) * jnp.max((vol > 0) * jnp.asarray(lat, jnp.float32))
    pp = None
    if ports is not None:  # groups are disjoint tiles: their ports never coincide
        pp = ((vol / s) @ jnp.asarray(ports[0], jnp.float32),
              (vol > 0).astype(jnp.float32) @ jnp.asarray(ports[1], jnp.float32))
    return loads * (s - 1), busy, ring_lat, pp
