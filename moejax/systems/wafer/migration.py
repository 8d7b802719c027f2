"""Moving expert replicas to new shadow slots (001 §III-C, §V-A).

Invasive: the copies are one phase of transfers on the critical path (Fig. 7(b)).
Non-invasive (001 §V-A): Local steps on links that are cold during the all-reduce and
Global steps on links cold during the all-to-all, off the critical path; the replicas go
live once the cold capacity has carried them (`ni_delay_iterations`).
"""

from __future__ import annotations

import jax.numpy as jnp

from moejax.physics import eq1
from moejax.systems.wafer.config import WaferConfig
from moejax.systems.wafer.traffic import phase_parts


def migration_traffic(cfg: WaferConfig, native, new_copies):
    """[D(src), D(dst)] bytes of expert copies: new_copies [L, E, D] 0/1, from the native host."""
    per = new_copies.sum(0)  # [E, D(dst)]
    return native.T @ per * cfg.model.expert_weight_bytes


def migration_time_s(cfg: WaferConfig, mig):
    """Seconds of an invasive migration `mig` [D, D] bytes (001 §III-C, Fig. 7(b)): the copies
    as one phase of transfers, timed by the layer's network model (Eq. 1 per port, or the
    cut-through busiest link + longest route latency)."""
    if cfg.eq1:
        return eq1.phase_time_s(mig, cfg.topo, cfg.eq1_ports)
    busy, lat, _ = phase_parts(mig, cfg.topo)
    return busy + lat


def cold_links(loads, cold_fraction):
    """[Lk] bool: links whose load in a phase is at most `cold_fraction` of the phase's peak."""
    return loads <= cold_fraction * jnp.max(loads)


def non_invasive_split(cfg: WaferConfig, need, ar_loads, ar_s, a2a_loads, a2a_s):
    """Split migration link bytes `need` [Lk] over the cold links of each phase (001 §V-A).

    Local steps ride links cold during the all-reduce, Global steps links cold during the
    all-to-all; each phase's spare capacity on a cold link is (phase time * bw - its load)
    summed over the model's layers. Returns (local [Lk], global [Lk], spill [Lk]) bytes.
    """
    bw = jnp.asarray(cfg.topo.sustained_Bps, jnp.float32)
    layers = cfg.model.num_layers
    cold_ar = cold_links(ar_loads, cfg.cold_fraction)
    cold_a2a = cold_links(a2a_loads, cfg.cold_fraction)
    cap_ar = jnp.where(cold_ar, jnp.maximum(ar_s * bw - ar_loads, 0.0), 0.0) * layers
    cap_a2a = jnp.where(cold_a2a, jnp.maximum(a2a_s * bw - a2a_loads, 0.0), 0.0) * layers
    local = jnp.minimum(need, cap_ar)
    glob = jnp.minimum(need - local, cap_a2a)
    return local, glob, need - local - glob


def ni_delay_iterations(cfg: WaferConfig, need, ar_loads, ar_s, a2a_loads, a2a_s):
    """Iterations the non-invasive stream needs to move `need` [Lk] bytes (>= 1).

    Each iteration offers the cold capacity of `non_invasive_split` (Local + Global steps).
    A link on a migration route that is hot in both phases offers nothing there; the paper
    routes around it (Local -> Global -> Local, Fig. 11(d)), which we approximate by letting
    such a link use the spare capacity of its less loaded phase.
    """
    bw = jnp.asarray(cfg.topo.sustained_Bps, jnp.float32)
    layers = cfg.model.num_layers
    cold_ar = cold_links(ar_loads, cfg.cold_fraction)
    cold_a2a = cold_links(a2a_loads, cfg.cold_fraction)
    spare_ar = jnp.maximum(ar_s * bw - ar_loads, 0.0)
    spare_a2a = jnp.maximum(a2a_s * bw - a2a_loads, 0.0)
    cap = (jnp.where(cold_ar, spare_ar, 0.0) + jnp.where(cold_a2a, spare_a2a, 0.0))
    cap = jnp.where(cold_ar | cold_a2a, cap, jnp.where(ar_loads < a2a_loads, spare_ar,
                                                      spare_a2a)) * layers
    ratio = jnp.where(need > 0, need / jnp.maximum(cap, 1e-30), 0.0)
    return jnp.maximum(jnp.ceil(jnp.max(ratio)), 1.0)
