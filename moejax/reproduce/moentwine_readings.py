"""Readings of 001 Eq. 1 (MoEntwine §III-B) that the reproduction measures beside its primary
one, and the all-to-all under the two that are not wafer network modes.

001 prices one transfer, "(volume / bandwidth + link_latency) x hops", and says concurrent
transfers congest shared links, without a rule for how. The primary reading (`moejax.physics.
eq1`, one port per mesh direction) serializes every transfer's whole cost on its ports; the
other readings are named here and in docs/reproduction/moentwine.md.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from moejax.physics import eq1
from moejax.systems.wafer import traffic as wtraffic

# Fig. 13(d) beside the primary reading: one port per die, cut-through link loads (contention
# on every link of a route) and a 20 ns hop latency (001 names none; at TP = 16 the serialized
# hop latencies dominate the primary reading's all-to-all)
HER_READINGS = ("eq1_device_ports", "cut_through", "eq1_hop20ns")
# Fig. 14(a) / 14(b) beside the primary reading (001 gives no port rule and reads 8 TB/s per die)
COMM_READINGS = ("cut_through", "eq1_4TBps_link", "eq1_device_ports")
# Two more readings of Eq. 1's serialization (`eq1_variants_s`), computed beside the primary
# rows of Fig. 13(b), 13(d) and 14(b) from the same traffic
EQ1_VARIANTS = ("unserialized", "latency_once")


def eq1_variants_s(cfg, host, counts) -> dict:
    """{variant: dispatch + combine seconds} of one layer of a mesh `cfg` (WaferConfig) with
    hosts `host` [E, D] and per-expert pair counts `counts` [E], under `EQ1_VARIANTS`:

    - "unserialized": each transfer on its own, a phase lasts as long as its longest transfer
      (nothing shared: the congestion-unaware reading);
    - "latency_once": a port serializes the transfers' V / bw x hops, and their link latency
      is paid once per port (the longest route's, as when transfers pipeline behind each other).
    """
    pairs = wtraffic.holder_tokens(cfg, jnp.zeros((0, cfg.model.top_k), jnp.int32),
                                   jnp.zeros((0,), bool), counts)
    disp = np.asarray(wtraffic.dispatch_traffic(cfg, wtraffic.served_share(host), pairs),
                      np.float64)
    tab = eq1.tables(cfg.topo, "link")
    off = 1.0 - np.eye(disp.shape[0])
    res = dict.fromkeys(EQ1_VARIANTS, 0.0)
    for t in (disp * off, disp.T * off):
        bw_c, lat_c = t * tab.inv_bw, (t > 0) * tab.latency
        res["unserialized"] += float((bw_c + lat_c).max())
        bw_p = np.concatenate([np.einsum("sd,sdp->sp", bw_c, tab.out_port).ravel(),
                               np.einsum("sd,sdp->dp", bw_c, tab.in_port).ravel()])
        lat_p = np.concatenate([(lat_c[:, :, None] * tab.out_port).max(1).ravel(),
                                (lat_c[:, :, None] * tab.in_port).max(0).ravel()])
        res["latency_once"] += float((bw_p + lat_p).max())
    return res
