"""Topologies as directed links plus a routing rule, built once per platform (host NumPy).

Every topology answers two questions used in hot paths, both vectorized over leading axes:
`link_loads(traffic)` — bytes on each directed link for a device-to-device traffic matrix
`[..., D, D]` under the topology's deterministic routing — and the per-pair path latency.
`incidence()` gives the same routing as a dense link-incidence matrix `[D, D, Lk]`
(`routes[s, d, l] = 1` if the route s -> d uses link l), the definition the fast paths are
tested against.

Routing rules: 2D mesh (and multi-wafer mesh) — dimension-order XY routing (first along
the row to the destination column, then along the column); ring — shortest direction
(clockwise on ties); switch — device uplink then the destination's downlink; hierarchical —
inside a node through the NVSwitch ports, between nodes through the source's NIC uplink and
the destination's NIC downlink (rail-optimized, non-blocking fabric).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from moejax.catalog.hardware import Platform, TopologySpec


@dataclasses.dataclass(frozen=True, eq=False)
class Topology:
    """Directed links of a platform. Hashable by identity (it is static config)."""

    kind: str
    num_devices: int
    link_Bps: np.ndarray  # [Lk] bandwidth of each directed link, bytes/s
    link_latency_s: np.ndarray  # [Lk] traversal latency of each link
    link_names: tuple[str, ...]  # [Lk] readable names ("E r0 c1", "up 3", ...)
    path_latency_s: np.ndarray  # [D, D] summed link latency of the route s -> d (0 on diag)
    hops: np.ndarray  # [D, D] links traversed by the route s -> d (0 on the diagonal)
    rows: int = 0
    cols: int = 0
    devices_per_node: int = 0
    # [Lk] bytes/s a bulk transfer sustains on each link: link_Bps x the link type's
    # protocol efficiency (`TopologySpec.protocol_efficiency`; None: link_Bps itself)
    effective_Bps: np.ndarray | None = None
    message_latency_s: float = 0.0  # fixed cost per message a sender issues
    kernel_latency_s: float = 0.0  # fixed cost per communication kernel
    sm_comm_Bps: float = 0.0  # bytes/s one SM of a device drives into the fabric (0: no limit)

    @property
    def sustained_Bps(self):
        """[Lk] bytes/s of each link under bulk traffic (protocol efficiency applied)."""
        return self.link_Bps if self.effective_Bps is None else self.effective_Bps

    @property
    def num_links(self) -> int:
        return int(self.link_Bps.shape[0])

    def link_loads(self, traffic):
        """Bytes on each directed link, [..., Lk], for traffic [..., D, D] (diagonal ignored)."""
        return self._loads(_off_diagonal(traffic), jnp)

    def link_loads_np(self, traffic) -> np.ndarray:
        """`link_loads` on the host for static geometry (traffic [..., D, D] -> float32
        [..., Lk]): the float32 traffic summed in float64 and rounded once, so a constant table
        costs no XLA compile while a system is traced."""
        t = np.asarray(traffic, np.float32).astype(np.float64)
        return self._loads(t * (1.0 - np.eye(t.shape[-1])), np).astype(np.float32)

    def _loads(self, traffic, xp):
        """Link loads of off-diagonal traffic with `xp` (jax.numpy traced, NumPy on the host)."""
        if self.kind in ("mesh2d", "multi_wafer_mesh"):
            return _mesh_loads(traffic, self.rows, self.cols, xp)
        if self.kind == "switch":
            return xp.concatenate([traffic.sum(-1), traffic.sum(-2)], axis=-1)
        if self.kind == "hierarchical":
            same = _same_node(self.num_devices, self.devices_per_node)
            intra, inter = traffic * same, traffic * (1.0 - same)
            return xp.concatenate(
                [intra.sum(-1), intra.sum(-2), inter.sum(-1), inter.sum(-2)], axis=-1
            )
        return xp.einsum("...sd,sdl->...l", traffic, xp.asarray(self.incidence()))

    def incidence(self) -> np.ndarray:
        """Dense routing matrix [D, D, Lk] of 0/1 (the definition `link_loads` implements)."""
        return _incidence(self)


def _off_diagonal(traffic):
    d = traffic.shape[-1]
    return traffic * (1.0 - jnp.eye(d, dtype=traffic.dtype))


def _same_node(num_devices: int, per_node: int) -> np.ndarray:
    node = np.arange(num_devices) // per_node
    return (node[:, None] == node[None, :]).astype(np.float32)


def build(platform: Platform) -> Topology:
    """The Topology of a platform spec."""
    topo = from_spec(platform.topology, platform.num_devices)
    if platform.device.sm_comm_Bps:
        topo = dataclasses.replace(topo, sm_comm_Bps=platform.device.sm_comm_Bps)
    return topo


def from_spec(spec: TopologySpec, num_devices: int) -> Topology:
    """The Topology of a topology spec with `num_devices` devices."""
    if spec.kind in ("mesh2d", "multi_wafer_mesh"):
        topo = _mesh(spec)
    elif spec.kind == "ring":
        topo = _ring(spec, num_devices)
    elif spec.kind == "switch":
        topo = _switch(spec, num_devices)
    else:
        topo = _hierarchical(spec)
    return _calibrated(topo, spec)


def _calibrated(topo: Topology, spec: TopologySpec) -> Topology:
    """`topo` with the spec's protocol efficiency per link type and fixed latencies.

    An efficiency of 1 leaves the bandwidths untouched (the ideal reading of a paper's
    model); the NICs of a hierarchical topology (its last 2 D links) take the inter-node one.
    """
    xp = _xp(topo.link_Bps, spec.protocol_efficiency, spec.inter_protocol_efficiency)
    eff = xp.full(topo.num_links, spec.protocol_efficiency)
    if topo.kind == "hierarchical":
        d = topo.num_devices
        eff = xp.concatenate([eff[:2 * d], xp.full(2 * d, spec.inter_protocol_efficiency)])
    ideal = (not isinstance(eff, jax.core.Tracer)) and bool(np.all(np.asarray(eff) == 1.0))
    return dataclasses.replace(
        topo, effective_Bps=None if ideal else topo.link_Bps * eff,
        message_latency_s=spec.message_latency_s, kernel_latency_s=spec.kernel_latency_s)


# --- 2D mesh with XY routing ---------------------------------------------------------------


def _mesh_link_index(rows: int, cols: int):
    """Link order: east [R, C-1], west [R, C-1], south [R-1, C], north [R-1, C]."""
    nh, nv = rows * (cols - 1), (rows - 1) * cols
    return {"E": 0, "W": nh, "S": 2 * nh, "N": 2 * nh + nv}, nh, nv


def _xp(*values):
    """NumPy for plain numbers; jax.numpy when a value is traced (a `moejax.runner.sweep` of a
    bandwidth or latency builds the topology inside a vmapped function)."""
    return jnp if any(isinstance(v, jax.core.Tracer) for v in values) else np


def _mesh(spec: TopologySpec) -> Topology:
    wr, wc = spec.wafer_rows, spec.wafer_cols
    rows, cols = spec.rows * wr, spec.cols * wc
    off, nh, nv = _mesh_link_index(rows, cols)
    lk = 2 * nh + 2 * nv
    xp = _xp(spec.link_Bps, spec.hop_latency_s, spec.border_Bps)
    bw = xp.full(lk, spec.link_Bps, xp.float64 if xp is np else None)
    names = []
    for d, (nr, nc) in zip("EWSN", [(rows, cols - 1)] * 2 + [(rows - 1, cols)] * 2, strict=True):
        names += [f"{d} r{r} c{c}" for r in range(nr) for c in range(nc)]
    if spec.kind == "multi_wafer_mesh":
        # 001 §VI-A: a cross-wafer border carries border_Bps per direction, shared by the
        # die-to-die links that cross it (one per die row / column along the border).
        h_border = spec.border_Bps / spec.rows
        v_border = spec.border_Bps / spec.cols
        h_mask, v_mask = np.zeros(lk, bool), np.zeros(lk, bool)
        for c in range(cols - 1):
            if (c + 1) % spec.cols == 0:
                for r in range(rows):
                    h_mask[off["E"] + r * (cols - 1) + c] = True
                    h_mask[off["W"] + r * (cols - 1) + c] = True
        for r in range(rows - 1):
            if (r + 1) % spec.rows == 0:
                for c in range(cols):
                    v_mask[off["S"] + r * cols + c] = True
                    v_mask[off["N"] + r * cols + c] = True
        bw = xp.where(h_mask, h_border, xp.where(v_mask, v_border, bw))
    r_of, c_of = np.divmod(np.arange(rows * cols), cols)
    hops = np.abs(r_of[:, None] - r_of[None, :]) + np.abs(c_of[:, None] - c_of[None, :])
    return Topology(
        kind=spec.kind, num_devices=rows * cols, link_Bps=bw,
        link_latency_s=xp.full(lk, spec.hop_latency_s), link_names=tuple(names),
        path_latency_s=hops * spec.hop_latency_s, hops=hops, rows=rows, cols=cols,
    )


def _mesh_loads(traffic, rows: int, cols: int, xp=jnp):
    """XY-routed link loads by prefix masks: O(D * (R + C)) per matrix, no incidence matrix
    (`xp`: jax.numpy in a traced program, NumPy for host tables)."""
    t = traffic.reshape(*traffic.shape[:-2], rows, cols, rows, cols)  # [.., sr, sc, dr, dc]
    a = t.sum(-2)  # [.., r, sc, dc]: X leg happens in the source row
    b = t.sum(-3)  # [.., sr, dr, c]: Y leg happens in the destination column
    cc = np.arange(cols)
    le_c = (cc[None, :] <= cc[:-1, None]).astype(np.float32)  # [C-1 (cut), C]
    gt_c = (cc[None, :] > cc[:-1, None]).astype(np.float32)
    rr = np.arange(rows)
    le_r = (rr[None, :] <= rr[:-1, None]).astype(np.float32)  # [R-1 (cut), R]
    gt_r = (rr[None, :] > rr[:-1, None]).astype(np.float32)
    east = xp.einsum("...rsd,cs,cd->...rc", a, le_c, gt_c)
    west = xp.einsum("...rsd,cs,cd->...rc", a, gt_c, le_c)
    south = xp.einsum("...sdc,rs,rd->...rc", b, le_r, gt_r)
    north = xp.einsum("...sdc,rs,rd->...rc", b, gt_r, le_r)
    lead = traffic.shape[:-2]
    return xp.concatenate(
        [x.reshape(*lead, -1) for x in (east, west, south, north)], axis=-1
    )


# --- ring, switch, hierarchical ------------------------------------------------------------


def _ring(spec: TopologySpec, d: int) -> Topology:
    # links: clockwise i -> i+1 (index i), counter-clockwise i -> i-1 (index d + i)
    dist = (np.arange(d)[None, :] - np.arange(d)[:, None]) % d
    hops = np.minimum(dist, d - dist)
    names = tuple([f"cw {i}" for i in range(d)] + [f"ccw {i}" for i in range(d)])
    xp = _xp(spec.link_Bps, spec.hop_latency_s)
    return Topology(
        kind="ring", num_devices=d, link_Bps=xp.full(2 * d, spec.link_Bps),
        link_latency_s=xp.full(2 * d, spec.hop_latency_s), link_names=names,
        path_latency_s=hops * spec.hop_latency_s, hops=hops,
    )


def _switch(spec: TopologySpec, d: int) -> Topology:
    off = 1 - np.eye(d, dtype=np.int64)
    names = tuple([f"up {i}" for i in range(d)] + [f"down {i}" for i in range(d)])
    xp = _xp(spec.link_Bps, spec.hop_latency_s)
    return Topology(
        kind="switch", num_devices=d, link_Bps=xp.full(2 * d, spec.link_Bps),
        link_latency_s=xp.full(2 * d, spec.hop_latency_s / 2), link_names=names,
        path_latency_s=off * spec.hop_latency_s, hops=2 * off,
    )


def _hierarchical(spec: TopologySpec) -> Topology:
    d = spec.nodes * spec.devices_per_node
    same = _same_node(d, spec.devices_per_node).astype(np.int64)
    off = 1 - np.eye(d, dtype=np.int64)
    intra, inter = off * same, 1 - same
    names = []
    for kind in ("nvl up", "nvl down", "nic up", "nic down"):
        names += [f"{kind} {i}" for i in range(d)]
    xp = _xp(spec.link_Bps, spec.inter_Bps, spec.hop_latency_s, spec.inter_latency_s)
    bw = xp.concatenate([xp.full(2 * d, spec.link_Bps), xp.full(2 * d, spec.inter_Bps)])
    lat = xp.concatenate(
        [xp.full(2 * d, spec.hop_latency_s / 2), xp.full(2 * d, spec.inter_latency_s / 2)]
    )
    return Topology(
        kind="hierarchical", num_devices=d, link_Bps=bw, link_latency_s=lat,
        link_names=tuple(names),
        path_latency_s=intra * spec.hop_latency_s + inter * spec.inter_latency_s,
        hops=2 * off, devices_per_node=spec.devices_per_node,
    )


def _incidence(topo: Topology) -> np.ndarray:
    d, lk = topo.num_devices, topo.num_links
    inc = np.zeros((d, d, lk), np.float32)
    if topo.kind in ("mesh2d", "multi_wafer_mesh"):
        rows, cols = topo.rows, topo.cols
        off, _, _ = _mesh_link_index(rows, cols)
        for s in range(d):
            for t in range(d):
                (sr, sc), (tr, tc) = divmod(s, cols), divmod(t, cols)
                c = sc
                while c != tc:  # X leg in the source row
                    if tc > c:
                        inc[s, t, off["E"] + sr * (cols - 1) + c] = 1
                        c += 1
                    else:
                        inc[s, t, off["W"] + sr * (cols - 1) + c - 1] = 1
                        c -= 1
                r = sr
                while r != tr:  # Y leg in the destination column
                    if tr > r:
                        inc[s, t, off["S"] + r * cols + tc] = 1
                        r += 1
                    else:
                        inc[s, t, off["N"] + (r - 1) * cols + tc] = 1
                        r -= 1
    elif topo.kind == "ring":
        for s in range(d):
            for t in range(d):
                cw = (t - s) % d
                if cw == 0:
                    continue
                if cw <= d - cw:
                    for j in range(cw):
                        inc[s, t, (s + j) % d] = 1
                else:
                    for j in range(d - cw):
                        inc[s, t, d + (s - j) % d] = 1
    elif topo.kind == "switch":
        for s in range(d):
            for t in range(d):
                if s != t:
                    inc[s, t, s] = inc[s, t, d + t] = 1
    else:
        node = np.arange(d) // topo.devices_per_node
        for s in range(d):
            for t in range(d):
                if s == t:
                    continue
                base = 0 if node[s] == node[t] else 2 * d
                inc[s, t, base + s] = inc[s, t, base + d + t] = 1
    return inc
