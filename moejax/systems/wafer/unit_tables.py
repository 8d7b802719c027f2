"""The all-to-all of one layer as static tables over a per-trace driver (link loads,
route latencies, hops and 001 Eq. 1 port parts per unit of traffic).

Built once per config (`functools.lru_cache`) on the host, so a layer's dispatch and
combine (001 §III-B, §IV-A; ESP §VI-B5) are matrix-vector products with the trace's
driver instead of a [D, D] traffic matrix per trace.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from moejax.physics import eq1
from moejax.systems.wafer import mapping as mp
from moejax.systems.wafer.config import WaferConfig

UNIT_TABLE_MAX = 1 << 24  # entries of a unit table; beyond it the traffic matrix is built


@dataclasses.dataclass(frozen=True)
class UnitTables:
    """The all-to-all of one layer as a static linear map of a per-trace driver v [U].

    The dispatch traffic is sum_u v_u * T_u for static matrices T_u [D, D] (bytes per pair
    over token_bytes); everything the layer needs from it is linear in v (link loads) or a
    max over the units in use (latency: T_u >= 0 and v >= 0, so a route carries traffic iff
    some unit with v_u > 0 uses it). The [D, D] matrix never has to be built per trace.
    """

    d_loads: np.ndarray  # [U, Lk] dispatch link bytes per unit of v
    c_loads: np.ndarray  # [U, Lk] combine (the dispatch reversed)
    d_lat: np.ndarray  # [U] longest route latency of T_u (0 if all local)
    c_lat: np.ndarray  # [U] same for T_u transposed
    hops: np.ndarray  # [U] sum of T_u * hops
    remote: np.ndarray  # [U] off-diagonal sum of T_u
    total: np.ndarray  # [U] sum of T_u
    # Eq. 1 (`physics.eq1.port_parts`) per unit, dispatch d_ / combine c_, [U, Pt]; exact as
    # bw = v @ pbw, latency = [v > 0] @ plat because the units' supports are disjoint
    # (checked when built; None when not in Eq. 1 mode)
    d_pbw: np.ndarray | None = None
    d_plat: np.ndarray | None = None
    c_pbw: np.ndarray | None = None
    c_plat: np.ndarray | None = None
    # hard mode (`eq1_hard_ports`): the dispatch / combine ports split into a block that is
    # diagonal in the units (counts-only: unit u = device u, whose own in-ports (dispatch) or
    # out-ports (combine) only it loads) and the other ports some unit uses (nonzero
    # bandwidth part; unused ones stay 0, every part is >= 0, so the max does not need them)
    d_cols: np.ndarray | None = None  # matrix-product ports of the dispatch
    c_cols: np.ndarray | None = None
    d_diag: tuple | None = None  # (bw [U, P], latency [U, P]) diagonal block, or None
    c_diag: tuple | None = None


def _unit_weights(cfg: WaferConfig, counts_only: bool) -> np.ndarray:
    """W [U, H, D]: T_u[s, d] = sum_h W[u, h, d] * source_split[h, d, s].

    Drivers: counts-only: v = counts @ served [D] (holder sets share tokens evenly), ESP
    v = counts @ eg [X]; token-level: v = (pairs @ served) [H * D], ESP (pairs @ eg) [H * X].
    """
    h, d = cfg.num_holder_sets, cfg.num_devices
    share = mp.holder_shares(cfg.mapping)
    if cfg.expert_shards:
        land = cfg.esp_landing.astype(np.float64)  # [H, X, D]
        if counts_only:
            return np.einsum("h,hxd->xhd", share, land)
        x = land.shape[1]
        w = np.zeros((h, x, h, d))
        w[np.arange(h), :, np.arange(h), :] = land
        return w.reshape(h * x, h, d)
    if counts_only:
        w = np.zeros((d, h, d))
        w[np.arange(d), :, np.arange(d)] = share[None, :]
        return w
    return np.eye(h * d).reshape(h * d, h, d)


@functools.lru_cache(maxsize=64)
def unit_tables(cfg: WaferConfig, counts_only: bool) -> UnitTables | None:
    """Static UnitTables of `cfg` (None when larger than UNIT_TABLE_MAX entries)."""
    h, d, lk = cfg.num_holder_sets, cfg.num_devices, cfg.topo.num_links
    n = {True: (cfg.esp_groups.shape[0] if cfg.expert_shards else d),
         False: h * (cfg.esp_groups.shape[0] if cfg.expert_shards else d)}[counts_only]
    pt = eq1.tables(cfg.topo, cfg.eq1_ports).num_ports if cfg.eq1 else 0
    if n * max(lk, h * d, 2 * pt) > UNIT_TABLE_MAX:
        return None
    w = _unit_weights(cfg, counts_only)
    split = cfg.source_split.astype(np.float64)
    off = 1.0 - np.eye(d)
    plat = cfg.topo.path_latency_s
    keys = ("d_loads", "c_loads", "d_lat", "c_lat", "hops", "remote", "total")
    if cfg.eq1:
        keys += ("d_pbw", "d_plat", "c_pbw", "c_plat")
        support = np.zeros((d, d))
    parts = {k: [] for k in keys}
    step = max(1, (1 << 22) // (d * d * max(1, pt // d)))
    for a in range(0, n, step):
        t = np.einsum("uhd,hds->usd", w[a:a + step], split)  # [u, D(src), D(dst)]
        parts["d_loads"].append(cfg.topo.link_loads_np(t))  # host NumPy: static geometry
        parts["c_loads"].append(cfg.topo.link_loads_np(t.transpose(0, 2, 1)))
        if cfg.eq1:  # host NumPy: static geometry
            tab = eq1.tables(cfg.topo, cfg.eq1_ports)
            for k, tt in (("d", t), ("c", t.transpose(0, 2, 1))):
                pb, pl = eq1.port_parts_np(tt, tab)
                parts[f"{k}_pbw"].append(pb)
                parts[f"{k}_plat"].append(pl)
            support += (t * off > 0).sum(0)
        used = t * off > 0
        parts["d_lat"].append((used * plat).max(axis=(1, 2)))
        parts["c_lat"].append((used.transpose(0, 2, 1) * plat).max(axis=(1, 2)))
        parts["hops"].append((t * cfg.topo.hops).sum(axis=(1, 2)))
        parts["remote"].append((t * off).sum(axis=(1, 2)))
        parts["total"].append(t.sum(axis=(1, 2)))
    if cfg.eq1 and support.max() > 1:  # overlapping units: the latency indicator is not linear
        return None
    xp = jnp if isinstance(plat, jax.core.Tracer) else np  # a swept hop latency (runner.sweep)
    cols = {}
    if cfg.eq1 and xp is np:  # a port is used iff its bandwidth part is > 0 (inv_bw > 0)
        for k in ("d", "c"):
            cols.update(_hard_port_split(k, np.concatenate(parts[f"{k}_pbw"]),
                                         np.concatenate(parts[f"{k}_plat"]), d))
    return UnitTables(**{k: xp.concatenate(v).astype(xp.float32) for k, v in parts.items()},
                      **cols)


def _hard_port_split(k: str, pbw: np.ndarray, plat: np.ndarray, d: int) -> dict:
    """UnitTables' `{k}_cols` / `{k}_diag` from a phase's port tables [U, 2 D P] (out, in)."""
    u, pt = pbw.shape
    p = pt // (2 * d)
    used = pbw.max(0) > 0
    diag = None
    if u == d:
        for blk in (1, 0):  # in-ports (dispatch), out-ports (combine)
            sl = slice(blk * d * p, (blk + 1) * d * p)
            w = pbw[:, sl].reshape(u, d, p)
            if not (w * (1.0 - np.eye(d))[:, :, None]).any():
                idx = np.arange(d)
                diag = (w[idx, idx].astype(np.float32),
                        plat[:, sl].reshape(u, d, p)[idx, idx].astype(np.float32))
                used[sl] = False
                break
    cols = np.flatnonzero(used)
    return {f"{k}_cols": cols if cols.size or diag else np.zeros(1, np.int64),
            f"{k}_diag": diag}


def eq1_hard_ports(tabs: UnitTables, v, tb):
    """(dispatch link bytes [Lk], combine link bytes [Lk], Eq. 1 port parts ((bw, latency)
    of the dispatch, of the combine)) in hard mode: only the ports a unit uses, the link
    loads and both phases' bandwidth parts in one matrix product, the latency parts in one
    more, the diagonal blocks elementwise. Same max as the full port vectors (parts >= 0)."""
    on = (v > 0).astype(jnp.float32)
    nd, lk = len(tabs.d_cols), tabs.d_loads.shape[1]
    prod = v @ jnp.asarray(np.concatenate([tabs.d_loads, tabs.c_loads,
                                           tabs.d_pbw[:, tabs.d_cols],
                                           tabs.c_pbw[:, tabs.c_cols]], axis=1)) * tb
    d_loads, c_loads, pbw = prod[:lk], prod[lk:2 * lk], prod[2 * lk:]
    plat = on @ jnp.asarray(np.concatenate([tabs.d_plat[:, tabs.d_cols],
                                            tabs.c_plat[:, tabs.c_cols]], axis=1))
    out = []
    for diag, b, lat in ((tabs.d_diag, pbw[:nd], plat[:nd]), (tabs.c_diag, pbw[nd:],
                                                               plat[nd:])):
        if diag is not None:
            b = jnp.concatenate([b, (v[:, None] * diag[0]).reshape(-1) * tb])
            lat = jnp.concatenate([lat, (on[:, None] * diag[1]).reshape(-1)])
        out.append((b, lat))
    return d_loads, c_loads, out[0], out[1]
