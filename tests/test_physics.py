"""Physics primitives against their closed forms and hand-computed small cases."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_platform

from moejax.catalog.hardware import TopologySpec
from moejax.physics import collectives, links, roofline, topology


def test_roofline_is_max_of_compute_and_memory():
    assert roofline.roofline_time_s(1e12, 1e9, 1e12, 1e9) == pytest.approx(1.0)
    assert roofline.roofline_time_s(4e12, 1e9, 1e12, 1e9) == pytest.approx(4.0)
    assert roofline.roofline_time_s(1e12, 8e9, 1e12, 1e9) == pytest.approx(8.0)


def test_eq1_of_001():
    # (volume / bandwidth + link_latency) * hops
    assert links.eq1_latency_s(8e9, 4e9, 1e-6, 3) == pytest.approx((2.0 + 1e-6) * 3)


SPECS = [
    (TopologySpec(kind="mesh2d", link_Bps=1e9, hop_latency_s=1e-9, rows=3, cols=3), 9),
    (TopologySpec(kind="mesh2d", link_Bps=1e9, hop_latency_s=1e-9, rows=2, cols=4), 8),
    (TopologySpec(kind="multi_wafer_mesh", link_Bps=1e9, hop_latency_s=1e-9, rows=2, cols=2,
                  wafer_rows=2, wafer_cols=2, border_Bps=5e8), 16),
    (TopologySpec(kind="ring", link_Bps=1e9, hop_latency_s=1e-9), 6),
    (TopologySpec(kind="switch", link_Bps=1e9, hop_latency_s=1e-9), 5),
    (TopologySpec(kind="hierarchical", link_Bps=1e9, hop_latency_s=1e-9, nodes=2,
                  devices_per_node=3, inter_Bps=1e8, inter_latency_s=1e-6), 6),
]


@pytest.mark.parametrize("spec,d", SPECS, ids=[s.kind + str(d) for s, d in SPECS])
def test_fast_link_loads_equal_incidence(spec, d, rng):
    topo = topology.from_spec(spec, d)
    traffic = rng.random((3, d, d)).astype(np.float32)
    fast = np.asarray(topo.link_loads(jnp.asarray(traffic)))
    inc = topo.incidence()
    slow = np.einsum("tsd,sdl->tl", traffic * (1 - np.eye(d)), inc)
    np.testing.assert_allclose(fast, slow, rtol=1e-5)
    np.testing.assert_array_equal(inc.sum(-1), topo.hops)
    assert len(topo.link_names) == topo.num_links
    # the host version (constant tables) equals the traced one exactly on whole-byte traffic
    whole = np.floor(traffic * 1e3).astype(np.float32)
    np.testing.assert_array_equal(topo.link_loads_np(whole),
                                  np.asarray(topo.link_loads(jnp.asarray(whole))))


def test_xy_routes_on_2x2_and_3x3_by_hand():
    t = topology.from_spec(TopologySpec(kind="mesh2d", link_Bps=1.0, hop_latency_s=0.0,
                                        rows=3, cols=3), 9)
    inc = t.incidence()
    names = np.array(t.link_names)
    # device 0 (r0 c0) -> device 8 (r2 c2): east along row 0, then south along column 2
    assert sorted(names[inc[0, 8] > 0]) == ["E r0 c0", "E r0 c1", "S r0 c2", "S r1 c2"]
    # device 7 (r2 c1) -> device 3 (r1 c0): west in row 2, then north in column 0
    assert sorted(names[inc[7, 3] > 0]) == ["N r1 c0", "W r2 c0"]
    assert t.hops[0, 8] == 4 and t.hops[4, 4] == 0
    # 2x2: one unit from every device to every other; each link carries 2 units (symmetric)
    t2 = topology.from_spec(TopologySpec(kind="mesh2d", link_Bps=1.0, hop_latency_s=0.0,
                                         rows=2, cols=2), 4)
    loads = np.asarray(t2.link_loads(jnp.ones((4, 4))))
    np.testing.assert_allclose(loads, 2.0)


def test_multi_wafer_border_links_share_border_bandwidth():
    spec = TopologySpec(kind="multi_wafer_mesh", link_Bps=8.0, hop_latency_s=0.0, rows=2,
                        cols=2, wafer_rows=1, wafer_cols=2, border_Bps=4.0)
    t = topology.from_spec(spec, 8)
    names = np.array(t.link_names)
    border = [i for i, n in enumerate(names) if n.startswith(("E", "W")) and n.endswith("c1")]
    assert len(border) == 4  # 2 rows x 2 directions cross the border
    np.testing.assert_allclose(t.link_Bps[border], 2.0)  # 4 B/s per direction over 2 links
    assert (np.delete(t.link_Bps, border) == 8.0).all()


def test_switch_all_to_all_closed_form():
    d, bw, lat = 8, 100e9, 1e-6
    topo = topology.from_spec(TopologySpec(kind="switch", link_Bps=bw, hop_latency_s=lat), d)
    v = 1e6  # every device sends v bytes to every other
    traffic = jnp.full((d, d), v)
    t = float(collectives.all_to_all_time_s(traffic, topo))
    assert t == pytest.approx((d - 1) * v / bw + lat, rel=1e-5)


@pytest.mark.parametrize("g", [2, 4, 8])
def test_ring_all_reduce_closed_form_on_switch(g):
    d, bw, lat, v = 8, 50e9, 0.0, 64e6
    topo = topology.from_spec(TopologySpec(kind="switch", link_Bps=bw, hop_latency_s=lat), d)
    groups = np.arange(d).reshape(-1, g)
    t = float(collectives.all_reduce_time_s(v, groups, topo))
    assert t == pytest.approx(2 * (g - 1) / g * v / bw, rel=1e-5)
    rs = float(collectives.reduce_scatter_time_s(v, groups, topo))
    ag = float(collectives.all_gather_time_s(v, groups, topo))
    assert rs == pytest.approx((g - 1) / g * v / bw, rel=1e-5) and ag == pytest.approx(rs)
    assert float(collectives.all_reduce_time_s(v, groups, topo, all_gather=False)) == (
        pytest.approx(rs))


def test_ring_all_reduce_latency_term_and_contention_on_mesh():
    # a 1x4 mesh line; the ring 0-1-2-3-0 closes over 3 hops, so 3 -> 0 shares links
    spec = TopologySpec(kind="mesh2d", link_Bps=1e9, hop_latency_s=1e-6, rows=1, cols=4)
    topo = topology.from_spec(spec, 4)
    v = 4e9
    t = float(collectives.all_reduce_time_s(v, np.arange(4)[None], topo))
    # each step: chunk v/4 = 1e9 B; west links carry the 3 -> 0 chunk only -> 1 s busy,
    # east links carry one chunk each -> 1 s; longest route 3 hops -> 3 us; 6 steps
    assert t == pytest.approx(6 * (1.0 + 3e-6), rel=1e-6)


def test_hierarchical_inter_node_is_the_bottleneck():
    p = make_platform("hierarchical")
    topo = topology.build(p)
    traffic = jnp.zeros((4, 4)).at[0, 2].set(25e9)  # node 0 -> node 1 over the NIC
    t = float(collectives.all_to_all_time_s(traffic, topo))
    assert t == pytest.approx(1.0 + 2e-6)
    traffic = jnp.zeros((4, 4)).at[0, 1].set(288e9)  # inside node 0 over NVSwitch ports
    assert float(collectives.all_to_all_time_s(traffic, topo)) == pytest.approx(1.0 + 4e-9)
