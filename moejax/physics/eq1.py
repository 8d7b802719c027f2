"""001 Eq. 1 network mode: store-and-forward per transfer, transfers serialized per port.

001 §III-B: "Communication latency comprises two components: data transfer time (determined
by data volume and bandwidth) and link latency ... approximated by Eq. 1,
latency = (volume / bandwidth + link_latency) x hops, where both components are summed and
multiplied by hop count". A transfer of V bytes from s to d over the route's links l costs

    c_sd = sum_{l in route(s, d)} (V / bw_l + lat_l)    (= (V / bw + lat) * hops, uniform links)

and a phase (one traffic matrix) ends when the busiest port has carried its transfers one
after the other:

    time = max( max_{s, p} sum_{d: out(s, d) = p} c_sd , max_{d, p} sum_{s: in(s, d) = p} c_sd )

001 names no serialization rule ("concurrent transmissions congesting shared links", §III-B),
so the port is a reading, `ports`:
- "link" (default): a die has one port per mesh direction (E, W, S, N); a transfer leaves
  through the direction of its first XY hop and enters through that of its last. Four ports
  per die at `link_Bps` each is the 001 §VI-A "8 TB/s bidirectional per die" read as
  4 x 1 TB/s per direction.
- "device": one port per die (every transfer of a die serialized; a stricter reading of
  001 Eq. 1).
Intermediate routers are not a contention point in Eq. 1 (only the endpoints serialize);
`moejax.physics.collectives` is the cut-through link-load model, kept as the robustness check.
Mesh topologies only (Eq. 1 is 001's mesh model); other kinds have no hop structure here.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np

from moejax import relax
from moejax.physics.topology import Topology

PORTS = ("link", "device")


@dataclasses.dataclass(frozen=True, eq=False)
class Eq1Tables:
    """Static per-pair quantities of Eq. 1 on a mesh (host NumPy)."""

    inv_bw: np.ndarray  # [D, D] sum over the route's links of 1 / bw_l (s / byte)
    latency: np.ndarray  # [D, D] sum over the route's links of lat_l (0 on the diagonal)
    out_port: np.ndarray  # [D, D, P] one-hot: transfer s -> d leaves s through port p
    in_port: np.ndarray  # [D, D, P] one-hot: transfer s -> d enters d through port p

    @property
    def num_ports(self) -> int:
        """Ports per phase vector: P out-ports and P in-ports per device."""
        return 2 * self.inv_bw.shape[0] * self.out_port.shape[-1]


def _directions(rows: int, cols: int):
    """(first-hop direction, last-hop direction) [D, D] of XY routes: 0 E, 1 W, 2 S, 3 N."""
    r, c = np.divmod(np.arange(rows * cols), cols)
    dr = r[None, :] - r[:, None]
    dc = c[None, :] - c[:, None]
    x_dir = np.where(dc > 0, 0, 1)
    y_dir = np.where(dr > 0, 2, 3)
    first = np.where(dc != 0, x_dir, y_dir)
    last = np.where(dr != 0, y_dir, x_dir)
    return first, last


@functools.lru_cache(maxsize=32)
def tables(topo: Topology, ports: str = "link") -> Eq1Tables:
    """Eq1Tables of a mesh topology (XY routing; per-link bandwidths, e.g. wafer borders)."""
    if topo.kind not in ("mesh2d", "multi_wafer_mesh"):
        raise ValueError(f"Eq. 1 mode needs a mesh topology, got {topo.kind!r}")
    if ports not in PORTS:
        raise ValueError(f"ports = {ports!r}; allowed: {', '.join(PORTS)}")
    rows, cols = topo.rows, topo.cols
    nh, nv = rows * (cols - 1), (rows - 1) * cols
    inv = 1.0 / np.asarray(topo.link_Bps, np.float64)
    e = inv[:nh].reshape(rows, cols - 1)
    w = inv[nh:2 * nh].reshape(rows, cols - 1)
    s = inv[2 * nh:2 * nh + nv].reshape(rows - 1, cols)
    n = inv[2 * nh + nv:].reshape(rows - 1, cols)
    zc = np.zeros((rows, 1))
    zr = np.zeros((1, cols))
    ce, cw = np.concatenate([zc, np.cumsum(e, 1)], 1), np.concatenate([zc, np.cumsum(w, 1)], 1)
    cs, cn = np.concatenate([zr, np.cumsum(s, 0)], 0), np.concatenate([zr, np.cumsum(n, 0)], 0)
    r, c = np.divmod(np.arange(rows * cols), cols)
    sr, sc, tr, tc = r[:, None], c[:, None], r[None, :], c[None, :]
    # X leg in the source row, then the Y leg in the destination column (dimension order)
    xleg = np.where(tc > sc, ce[sr, tc] - ce[sr, sc], cw[sr, sc] - cw[sr, tc])
    yleg = np.where(tr > sr, cs[tr, tc] - cs[sr, tc], cn[sr, tc] - cn[tr, tc])
    inv_bw = xleg + yleg
    np.fill_diagonal(inv_bw, 0.0)
    first, last = _directions(rows, cols)
    d = rows * cols
    if ports == "link":
        out_p, in_p = np.eye(4)[first], np.eye(4)[last]
    else:
        out_p = in_p = np.ones((d, d, 1))
    off = (1.0 - np.eye(d))[:, :, None]
    return Eq1Tables(inv_bw, np.asarray(topo.path_latency_s, np.float64), out_p * off,
                     in_p * off)


def port_parts(traffic, tab: Eq1Tables):
    """(bandwidth part, latency part) [..., 2 D P] of every port's serialized transfers.

    traffic [..., D, D] bytes (diagonal local, free). Port time = bw part / m + latency part
    when the phase is cut into m micro-batches (each carries 1/m of every transfer).
    """
    d = traffic.shape[-1]
    off = traffic * (1.0 - jnp.eye(d, dtype=traffic.dtype))
    bw_c = off * jnp.asarray(tab.inv_bw, jnp.float32)
    lat_c = (off > 0).astype(jnp.float32) * jnp.asarray(tab.latency, jnp.float32)
    op, ip = jnp.asarray(tab.out_port, jnp.float32), jnp.asarray(tab.in_port, jnp.float32)

    def ports(c):
        out = jnp.einsum("...sd,sdp->...sp", c, op)
        inn = jnp.einsum("...sd,sdp->...dp", c, ip)
        lead = c.shape[:-2]
        return jnp.concatenate([out.reshape(*lead, -1), inn.reshape(*lead, -1)], axis=-1)

    return ports(bw_c), ports(lat_c)


def port_parts_np(traffic: np.ndarray, tab: Eq1Tables):
    """`port_parts` in host NumPy (static tables: no per-shape XLA compile)."""
    traffic = np.asarray(traffic, np.float64)
    d = traffic.shape[-1]
    off = traffic * (1.0 - np.eye(d))
    out = []
    for c in (off * tab.inv_bw, (off > 0) * tab.latency):
        o = np.einsum("...sd,sdp->...sp", c, tab.out_port)
        i = np.einsum("...sd,sdp->...dp", c, tab.in_port)
        lead = c.shape[:-2]
        out.append(np.concatenate([o.reshape(*lead, -1), i.reshape(*lead, -1)], axis=-1))
    return tuple(out)


def envelope(bw_part: np.ndarray, lat_part: np.ndarray):
    """The ports of static parts [Pt] that can be the busiest: (bw [K], latency [K]), K >= 1.

    For a phase that scales as a whole (x * bw + latency, x >= 0: a ring step of n tokens
    cut into m micro-batches), a port whose parts are both <= another's never sets the max;
    dropping it, and duplicates, leaves `time_s` unchanged exactly (max of the same values).
    A ring step of equal transfers keeps one port. Hard mode only: a relaxed max
    (logsumexp over the ports) counts every port.
    """
    a, b = np.asarray(bw_part, np.float64), np.asarray(lat_part, np.float64)
    order = np.lexsort((-b, -a))  # by bw part, then latency part, descending
    keep, top = [], -np.inf
    for p in order:  # static host loop over ports, once per configuration
        if b[p] > top:
            keep.append(p)
            top = b[p]
    keep = np.sort(np.asarray(keep))
    return a[keep], b[keep]


def time_s(bw_part, lat_part, m=1.0, tau=0.0):
    """Seconds of one phase (per micro-batch when m > 1): the busiest port."""
    return relax.max(bw_part / m + lat_part, tau, axis=-1)


def phase_time_s(traffic, topo: Topology, ports: str = "link", tau=0.0):
    """Eq. 1 seconds of one phase moving `traffic` [..., D, D] bytes on a mesh."""
    b, lat = port_parts(traffic, tables(topo, ports))
    return time_s(b, lat, 1.0, tau)
