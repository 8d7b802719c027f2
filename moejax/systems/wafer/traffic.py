"""Dispatch and combine all-to-all of one layer (001 §III-B, §IV-A; ESP §VI-B5).

Every (token, expert) pair goes to the devices serving the expert from the member of the
token's TP group inside the destination's Full Token Domain (001 §IV-A; under HER from the
token's holder on the destination's wafer; without the all-gather from the token's single
holder), split evenly over the expert's replicas (shadow slots, §III-C). The combine is the
dispatch reversed. Timed from the per-link loads of the topology's routing
(`moejax.physics.collectives`) or by 001 Eq. 1 per port (`moejax.physics.eq1`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from moejax import relax
from moejax.physics import collectives, eq1
from moejax.systems.wafer import mapping as mp
from moejax.systems.wafer.config import WaferConfig
from moejax.systems.wafer.esp import esp_dispatch_traffic, esp_served
from moejax.systems.wafer.unit_tables import eq1_hard_ports, unit_tables


def served_share(host):
    """[E, D] share of expert e's tokens served by device d: hosts split evenly."""
    return host / jnp.maximum(host.sum(-1, keepdims=True), 1e-30)


def holder_tokens(cfg: WaferConfig, expert_ids, token_mask, counts):
    """[H, E] (token, expert) pairs of each holder set (001 §IV-A: who holds which tokens)."""
    e = cfg.model.num_experts
    if expert_ids.shape[0] > 0:
        hs = mp.token_holder_sets(cfg.mapping, expert_ids.shape[0])
        owner = jax.nn.one_hot(hs, cfg.num_holder_sets)  # [N, H]
        routed = jax.nn.one_hot(expert_ids, e).sum(-2) * token_mask[:, None]
        return owner.T @ routed
    return jnp.asarray(mp.holder_shares(cfg.mapping))[:, None] * counts[None, :]


def dispatch_traffic(cfg: WaferConfig, served, pairs_he):
    """Dispatch traffic [D(src), D(dst)] in bytes (diagonal = local) from pairs [H, E].

    Each (token, expert) pair is fetched by the expert's serving devices from the holder
    `cfg.source_split` names (FTD member, or the nearest holder), one hidden state per pair.
    """
    b = pairs_he @ served  # [H, D(dst)]
    t = jnp.einsum("hd,hds->sd", b, jnp.asarray(cfg.source_split))
    return t * cfg.model.token_bytes


def all_to_all_parts(cfg: WaferConfig, host, expert_ids, token_mask, counts, tau_s):
    """Dispatch and combine of one layer (001 §III-B, §IV-A; ESP §VI-B5).

    Returns (served [E, D] under ESP else None, dict of dispatch / combine busy_s,
    latency_s, link bytes [Lk], avg_hops, remote_bytes, and under ESP the bytes gathered into
    each EP group vol [X]).
    """
    topo = cfg.topo
    tb = cfg.model.token_bytes
    counts_only = expert_ids.shape[0] == 0
    if cfg.expert_shards:
        mix, served = esp_served(cfg, host)  # [E, X]
        scale = jnp.ones(host.shape[0])
    else:  # counts @ served == (counts * scale) @ host: served [E, D] is never built
        mix, served = host, None
        scale = 1.0 / jnp.maximum(host.sum(-1), 1e-30)  # served = host * scale[:, None]
    pairs = None if counts_only else holder_tokens(cfg, expert_ids, token_mask, counts)
    vol = (counts @ mix if counts_only else pairs.sum(0) @ mix) * tb  # [X] (ESP)
    tabs = unit_tables(cfg, counts_only)
    if tabs is None:  # too large for static tables: build the traffic matrix
        if pairs is None:
            pairs = holder_tokens(cfg, expert_ids, token_mask, counts)
        disp = (esp_dispatch_traffic(cfg, pairs @ mix) if cfg.expert_shards
                else dispatch_traffic(cfg, served_share(host), pairs))
        d_busy, d_lat, d_loads = phase_parts(disp, topo, tau_s)
        c_busy, c_lat, c_loads = phase_parts(disp.T, topo, tau_s)
        hops = (disp * jnp.asarray(topo.hops, jnp.float32)).sum() / jnp.maximum(disp.sum(),
                                                                                1e-30)
        remote = (disp * (1.0 - jnp.eye(cfg.num_devices))).sum() * 2.0
        if cfg.eq1:
            tab = eq1.tables(topo, cfg.eq1_ports)
            d_ports, c_ports = eq1.port_parts(disp, tab), eq1.port_parts(disp.T, tab)
    else:
        v = (counts * scale) @ mix if counts_only else ((pairs * scale) @ mix).reshape(-1)
        bw = jnp.asarray(topo.sustained_Bps, jnp.float32)
        eq1_hard = (cfg.eq1 and isinstance(tau_s, float) and tau_s == 0.0
                    and tabs.d_cols is not None)  # `layer`'s hard branch
        if eq1_hard:
            d_loads, c_loads, d_ports, c_ports = eq1_hard_ports(tabs, v, tb)
        else:
            d_loads = (v @ jnp.asarray(tabs.d_loads)) * tb
            c_loads = (v @ jnp.asarray(tabs.c_loads)) * tb
        d_busy = relax.max(d_loads / bw, tau_s, axis=-1)
        c_busy = relax.max(c_loads / bw, tau_s, axis=-1)
        d_lat = jnp.max((v > 0) * jnp.asarray(tabs.d_lat))
        c_lat = jnp.max((v > 0) * jnp.asarray(tabs.c_lat))
        hops = (v @ jnp.asarray(tabs.hops)) / jnp.maximum(v @ jnp.asarray(tabs.total), 1e-30)
        remote = (v @ jnp.asarray(tabs.remote)) * tb * 2.0
        if cfg.eq1 and not eq1_hard:
            on = (v > 0).astype(jnp.float32)
            d_ports = ((v @ jnp.asarray(tabs.d_pbw)) * tb, on @ jnp.asarray(tabs.d_plat))
            c_ports = ((v @ jnp.asarray(tabs.c_pbw)) * tb, on @ jnp.asarray(tabs.c_plat))
    if not cfg.eq1:
        d_ports = c_ports = None
    return served, dict(d_busy=d_busy, d_lat=d_lat, d_loads=d_loads, c_busy=c_busy,
                        c_lat=c_lat, c_loads=c_loads, avg_hops=hops, remote_bytes=remote,
                        vol=vol, d_ports=d_ports, c_ports=c_ports)


def phase_parts(traffic, topo, tau=0.0):
    """(busy_s, latency_s, link bytes [Lk]) of one phase (collectives.phase_time_s split)."""
    loads = topo.link_loads(traffic)
    busy = collectives.busy_of_loads(loads, topo, tau)
    return busy, collectives.path_latency_s(traffic, topo), loads
