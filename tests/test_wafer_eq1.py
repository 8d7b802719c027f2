"""001 Eq. 1 network mode (`physics.eq1`, wafer `network = "eq1"`): hand-computed phases,
bidirectional rings, and the vectorized layer against the plain-Python reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_model, make_platform, random_trace

from moejax.errors import ConfigError
from moejax.physics import collectives, eq1, topology
from moejax.systems.wafer import config as wconfig
from moejax.systems.wafer import layer as wlayer
from moejax.systems.wafer import migration as wmigration
from moejax.systems.wafer import reference
from moejax.systems.wafer import unit_tables as wtables

BW, LAT = 1e9, 1e-6

# The exact layer jitted (an eager `wlayer.layer` call compiles its whole `lax.cond`, both
# branches, again on every call): `relax.branch` at a Python 0.0 is the very function the
# traced cond runs at tau = 0, and only that branch is compiled.
_hard_layer = jax.jit(lambda cfg, p, *a: wlayer.layer(cfg, p.replace(tau=0.0), *a),
                      static_argnums=0)


def _mesh(rows, cols, kind="mesh2d"):
    if kind == "mesh2d":
        return topology.build(make_platform(kind, rows=rows, cols=cols, link_Bps=BW,
                                            hop_latency_s=LAT))
    return topology.build(make_platform(kind))


def test_one_transfer_is_volume_over_bw_plus_latency_times_hops():
    topo = _mesh(1, 3)
    t = np.zeros((3, 3), np.float32)
    t[0, 2] = 4e3  # two hops east
    assert float(eq1.phase_time_s(t, topo)) == pytest.approx((4e3 / BW + LAT) * 2)
    # the cut-through model charges the latency once per hop but the volume once
    assert float(collectives.phase_time_s(t, topo)) == pytest.approx(4e3 / BW + 2 * LAT)


def test_two_transfers_sharing_a_port_serialize_and_different_ports_do_not():
    topo = _mesh(2, 2)  # devices 0 1 / 2 3
    t = np.zeros((4, 4), np.float32)
    t[0, 1] = 2e3  # leaves 0 east, 1 hop
    t[0, 3] = 3e3  # leaves 0 east too (X first), 2 hops
    both = (2e3 / BW + LAT) * 1 + (3e3 / BW + LAT) * 2
    assert float(eq1.phase_time_s(t, topo)) == pytest.approx(both)
    u = np.zeros((4, 4), np.float32)
    u[0, 1] = 2e3  # east port
    u[0, 2] = 3e3  # south port: no queueing behind the east transfer
    assert float(eq1.phase_time_s(u, topo)) == pytest.approx(3e3 / BW + LAT)
    # one port per die: every transfer of device 0 queues
    assert float(eq1.phase_time_s(u, topo, "device")) == pytest.approx(5e3 / BW + 2 * LAT)
    # in-ports: two transfers into device 3 both arrive from the north (Y last)
    v = np.zeros((4, 4), np.float32)
    v[1, 3] = 1e3
    v[0, 3] = 1e3  # 0 -> 1 -> 3: last hop south into 3 as well
    assert float(eq1.phase_time_s(v, topo)) == pytest.approx((1e3 / BW + LAT) * 3)


def test_bidirectional_ring_step_halves_the_volume_term():
    topo = _mesh(2, 2)
    ring = np.array([[0, 1, 3, 2]])
    chunk = 8e3
    uni = collectives.ring_step_traffic(ring, chunk, 4)
    bi = collectives.ring_step_traffic(ring, chunk, 4, bidirectional=True)
    np.testing.assert_allclose(np.asarray(bi).sum(1), chunk)  # same bytes leave each member
    assert float(eq1.phase_time_s(uni, topo)) == pytest.approx(chunk / BW + LAT)
    assert float(eq1.phase_time_s(bi, topo)) == pytest.approx(chunk / 2 / BW + LAT)
    # on one port per die the two halves queue: no gain
    assert float(eq1.phase_time_s(bi, topo, "device")) == pytest.approx(chunk / BW + 2 * LAT)
    # the same in the plain reference
    assert reference.eq1_phase(np.asarray(bi), topo) == pytest.approx(chunk / 2 / BW + LAT)


def test_path_bandwidth_equals_the_incidence_matrix_on_wafer_borders():
    topo = _mesh(0, 0, "multi_wafer_mesh")
    tab = eq1.tables(topo)
    inc = topo.incidence()
    np.testing.assert_allclose(tab.inv_bw, np.einsum("sdl,l->sd", inc, 1 / topo.link_Bps),
                               rtol=1e-12)
    np.testing.assert_allclose(tab.latency, np.einsum("sdl,l->sd", inc, topo.link_latency_s),
                               rtol=1e-12)
    assert len(set(topo.link_Bps.tolist())) > 1  # the border links differ


def _cfg(mapping="baseline", tp=2, kind="mesh2d", retain=True, shards=0, ports="link",
         bidi=True, network="eq1", **topo):
    plat = make_platform(kind, **topo)
    return wconfig.make_config(plat, make_model(num_experts=8, top_k=2), mapping=mapping,
                               tp_size=tp, retain_allgather=retain, expert_shards=shards,
                               network=network, eq1_ports=ports, bidirectional_rings=bidi)


CASES = [
    dict(mapping="baseline", tp=2, rows=2, cols=4),
    dict(mapping="er", tp=4, rows=4, cols=4),
    dict(mapping="er", tp=4, rows=4, cols=4, ports="device", bidi=False),
    dict(mapping="baseline", tp=4, rows=4, cols=4, retain=False),
    dict(mapping="her", tp=2, kind="multi_wafer_mesh"),
    dict(mapping="er", tp=4, shards=4, rows=4, cols=4),
    dict(mapping="baseline", tp=2, rows=2, cols=4, network="link_load"),  # bidi, cut-through
]


@pytest.mark.parametrize("case", CASES)
def test_eq1_layer_matches_plain_reference(case):
    cfg = _cfg(**case)
    e, d = cfg.model.num_experts, cfg.num_devices
    params = wconfig.default_params(cfg)
    host = np.asarray(params.placement).copy()
    if not case.get("shards"):
        rng = np.random.default_rng(0)
        host[rng.integers(0, e, 3), rng.integers(0, d, 3)] = 1.0
    tr = random_trace(jax.random.key(1), 1, 1, 1, 24, e, 2, valid=[[19]])
    ids, mask, counts = tr.expert_ids[0, 0, 0], tr.token_mask[0, 0], tr.counts[0, 0, 0]
    out = _hard_layer(cfg, params, jnp.asarray(host), ids, mask, counts)
    ref = reference.layer(cfg, host, np.asarray(ids), np.asarray(mask))
    for k in ("layer_s", "all_to_all_s", "all_reduce_s", "esp_reduce_s", "moe_compute_s",
              "micro_batches"):
        np.testing.assert_allclose(float(out[k]), ref[k], rtol=2e-5, atol=1e-12, err_msg=k)
    np.testing.assert_allclose(np.asarray(out["ar_link_bytes"]), ref["ar_link_bytes"],
                               rtol=2e-5, atol=1e-3)


@pytest.mark.parametrize("counts_only", [False, True])
def test_eq1_unit_tables_equal_the_traffic_matrix_path(monkeypatch, counts_only):
    cfg = _cfg(mapping="er", tp=4, rows=4, cols=4)
    e = cfg.model.num_experts
    tr = random_trace(jax.random.key(11), 1, 1, 1, 24, e, 2, valid=[[20]])
    ids, mask, counts = tr.expert_ids[0, 0, 0], tr.token_mask[0, 0], tr.counts[0, 0, 0]
    if counts_only:
        ids, mask = jnp.zeros((0, 2), jnp.int32), jnp.zeros((0,), bool)
    p = wconfig.default_params(cfg)

    def run():
        return jax.jit(lambda c: wlayer.layer(cfg, p, p.placement, ids, mask, c))(counts)

    assert wtables.unit_tables(cfg, counts_only) is not None
    fast = run()
    monkeypatch.setattr(wtables, "UNIT_TABLE_MAX", 0)
    wtables.unit_tables.cache_clear()
    try:
        dense = run()
    finally:
        wtables.unit_tables.cache_clear()
    for k in ("layer_s", "all_to_all_s", "all_reduce_s"):
        np.testing.assert_allclose(float(fast[k]), float(dense[k]), rtol=2e-5, err_msg=k)


def test_eq1_costs_more_than_cut_through_and_bad_values_name_the_field():
    kw = dict(mapping="baseline", tp=4, rows=4, cols=4)
    c1, c0 = _cfg(**kw), _cfg(network="link_load", bidi=False, **kw)
    counts = jnp.full((8,), 24.0)
    ids, mask = jnp.zeros((0, 2), jnp.int32), jnp.zeros((0,), bool)
    a = _hard_layer(c1, wconfig.default_params(c1), wconfig.default_params(c1).placement, ids,
                    mask, counts)
    b = _hard_layer(c0, wconfig.default_params(c0), wconfig.default_params(c0).placement, ids,
                    mask, counts)
    assert float(a["all_to_all_s"]) >= float(b["all_to_all_s"])  # store-and-forward
    with pytest.raises(ConfigError, match="network"):
        _cfg(network="ideal", **kw)
    with pytest.raises(ConfigError, match="eq1_ports"):
        _cfg(ports="router", **kw)


def test_invasive_migration_is_timed_by_the_layer_network_model():
    # one expert copy (V bytes) two hops east: Eq. 1 store-and-forward vs cut-through
    v = 3e3
    mig = np.zeros((4, 4), np.float32)
    mig[0, 2] = v
    t = {net: float(wmigration.migration_time_s(_cfg(network=net, rows=1, cols=4, link_Bps=BW,
                                                     hop_latency_s=LAT), jnp.asarray(mig)))
         for net in ("eq1", "link_load")}
    assert t["eq1"] == pytest.approx((v / BW + LAT) * 2)
    assert t["link_load"] == pytest.approx(v / BW + 2 * LAT)
