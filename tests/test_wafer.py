"""Wafer EP (001): mappings and FTD geometry, mesh contention by hand, system == reference."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_model, make_platform, random_trace

from moejax.errors import ConfigError
from moejax.physics import collectives, topology
from moejax.runner import engine
from moejax.systems.wafer import config as wconfig
from moejax.systems.wafer import layer as wlayer
from moejax.systems.wafer import mapping as mp
from moejax.systems.wafer import reference, system
from moejax.systems.wafer import traffic as wtraffic
from moejax.systems.wafer import unit_tables as wtables

# The exact layer, compiled once per (config, shapes) and shared by the module's hard-mode tests:
# an eager `wlayer.layer` call re-traces and re-compiles its whole `lax.cond` (both branches)
# on every call, ~3-4 s CPU each; this compiles only the exact branch (`relax.branch` at a
# Python 0.0: the very function the traced cond runs at tau = 0), about 1 s.
_hard_layer = jax.jit(lambda cfg, p, *a: wlayer.layer(cfg, p.replace(tau=0.0), *a),
                      static_argnums=0)

# --- FTD geometry (001 §IV-A, Fig. 8) ------------------------------------------------------


def test_ftd_hops_of_the_4x4_tp4_example():
    base = mp.build_mapping("baseline", 4, 4, 4)
    er = mp.build_mapping("er", 4, 4, 4)
    # 001 §IV-A: 3x3-area FTDs, hops 2, 2, 4 with probability 1/3 each -> 2.7 hops
    assert mp.ftd_average_hops(base) == pytest.approx(8 / 3)
    # 001 §IV-B1: ER's 2x2 FTDs halve the average hops
    assert mp.ftd_average_hops(er) == pytest.approx(4 / 3)
    assert sorted(base.ftds[0].tolist()) == [0, 2, 8, 10]  # {D11, D13, D31, D33}
    assert sorted(er.ftds[0].tolist()) == [0, 1, 4, 5]  # {D11, D12, D21, D22}


def test_ftd_overlaps_baseline_centre_vs_er_disjoint():
    base = mp.ftd_overlaps(mp.build_mapping("baseline", 4, 4, 4))
    er = mp.ftd_overlaps(mp.build_mapping("er", 4, 4, 4))
    assert base["mean_area"] == 9 and er["mean_area"] == 4
    assert base["max_cover"] == 4  # every FTD covers the central four devices
    assert er["shared_devices"] == 0 and er["max_cover"] == 1


@pytest.mark.parametrize("rows,cols,tp", [(4, 4, 2), (4, 4, 8), (6, 6, 4), (8, 8, 16), (6, 6, 9)])
def test_mappings_are_partitions_and_er_never_worse(rows, cols, tp):
    d = rows * cols
    for name in ("baseline", "er"):
        m = mp.build_mapping(name, rows, cols, tp)
        assert sorted(m.groups.ravel().tolist()) == list(range(d))
        assert sorted(m.ftds.ravel().tolist()) == list(range(d))
        group_of = np.empty(d, int)
        group_of[m.groups] = np.arange(m.num_groups)[:, None]
        for f in m.ftds:  # an FTD holds one member of every TP group
            assert sorted(group_of[f].tolist()) == list(range(m.num_groups))
    base, er = (mp.build_mapping(n, rows, cols, tp) for n in ("baseline", "er"))
    assert mp.ftd_average_hops(er) <= mp.ftd_average_hops(base)
    assert mp.ftd_overlaps(er)["shared_devices"] == 0


def test_ring_steps_one_hop_baseline_two_hops_er():
    hops = mp.mesh_hops(4, 4)
    for name, want in (("baseline", 1), ("er", 2)):
        g = mp.build_mapping(name, 4, 4, 4).groups
        steps = hops[g, np.roll(g, -1, axis=1)]
        assert (steps == want).all(), name


def test_her_groups_stay_on_their_wafer():
    m = mp.build_mapping("her", 4, 8, 2, wafer_rows=1, wafer_cols=2)
    wafer = (np.arange(32) % 8) // 4
    for grp in m.groups:
        assert len(set(wafer[grp].tolist())) == 1
    assert m.wafer_peers.shape == (16, 2)
    assert (wafer[m.wafer_peers] == np.arange(2)[None]).all()


def test_bad_mapping_inputs_name_the_field():
    with pytest.raises(ConfigError, match="mapping"):
        mp.build_mapping("zigzag", 4, 4, 4)
    with pytest.raises(ConfigError, match="tp_size"):
        mp.build_mapping("er", 4, 4, 3)
    with pytest.raises(ConfigError, match="multi-wafer"):
        mp.build_mapping("her", 4, 4, 4)
    with pytest.raises(ConfigError, match="mesh"):
        wconfig.make_config(make_platform("switch", devices=8), make_model(), mapping="er",
                            tp_size=2)


# --- contention on small meshes, by hand ---------------------------------------------------


def _mesh(rows, cols, bw=1e9, lat=1e-6):
    return topology.build(make_platform("mesh2d", rows=rows, cols=cols, link_Bps=bw,
                                        hop_latency_s=lat))


def test_3x3_crossing_routes_by_hand():
    topo = _mesh(3, 3)
    t = np.zeros((9, 9), np.float32)
    t[0, 8] = 4e3  # (0,0)->(0,1)->(0,2)->(1,2)->(2,2)
    t[2, 6] = 2e3  # (0,2)->(0,1)->(0,0)->(1,0)->(2,0): opposite directions, no shared link
    t[1, 7] = 1e3  # (0,1)->(1,1)->(2,1)
    assert float(collectives.phase_time_s(t, topo)) == pytest.approx(4e-6 + 4e-6)
    t[3, 5] = 3e3  # (1,0)->(1,1)->(1,2); (1,2)->(2,2) is also on 0->8's route
    t[4, 8] = 5e3  # (1,1)->(1,2)->(2,2): link (1,1)->(1,2) carries 3e3 + 5e3, S (1,2) 4e3 + 5e3
    assert float(collectives.phase_time_s(t, topo)) == pytest.approx(9e-6 + 4e-6)


def test_dispatch_fetches_inside_the_ftd_or_from_the_nearest_holder():
    e, d = 16, 16
    served = np.zeros((e, d), np.float32)
    served[0, 15] = 1.0  # expert 0 lives on device 15 = (3, 3)
    served[1, 5] = 1.0  # expert 1 on device 5 = (1, 1)
    b = make_model(num_experts=16).token_bytes
    plat = make_platform("mesh2d", rows=4, cols=4)
    # ER, all-gather kept: TP group 0 = devices 0, 2, 10, 8; FTDs are the 2x2 quadrants
    cfg = wconfig.make_config(plat, make_model(num_experts=16), mapping="er", tp_size=4)
    pairs = np.zeros((cfg.num_holder_sets, e), np.float32)
    pairs[0, 0] = pairs[0, 1] = 1.0  # one token of group 0 to expert 0 and one to expert 1
    tr = np.asarray(wtraffic.dispatch_traffic(cfg, jnp.asarray(served), jnp.asarray(pairs)))
    assert tr[10, 15] == pytest.approx(b)  # 15's FTD {10, 11, 14, 15} holds group 0 at 10
    assert tr[0, 5] == pytest.approx(b)  # 5's FTD {0, 1, 4, 5} holds group 0 at 0
    assert tr.sum() == pytest.approx(2 * b)
    # HER on two 2x2 wafers (TP=2): one holder per wafer, fetched on the destination's wafer
    her = wconfig.make_config(make_platform("multi_wafer_mesh"), make_model(num_experts=16),
                              mapping="her", tp_size=2)
    hol = her.mapping.holders
    split = her.source_split
    for h in range(hol.shape[0]):
        for dst in range(8):
            src = int(np.argmax(split[h, dst]))
            assert split[h, dst].sum() == pytest.approx(1.0)
            assert hol[h, src] == 1 and (src % 4) // 2 == (dst % 4) // 2  # same wafer
    # nearest-holder rule splits ties evenly (path diversity, 001 Fig. 9)
    hold = np.zeros((1, 16), np.float32)
    hold[0, [0, 2, 8, 10]] = 1.0
    sp = mp.source_split(hold, mp.mesh_hops(4, 4).astype(float))
    np.testing.assert_allclose(sp[0, 5, [0, 2, 8, 10]], 0.25)
    assert sp[0, 15, 10] == 1.0


# --- the system against the plain reference ------------------------------------------------


@functools.cache  # one config per case: its compiled layer and unit tables are shared
def _cfg(mapping="baseline", tp=2, kind="mesh2d", retain=True, network="eq1", bidi=True,
         **topo):
    plat = make_platform(kind, **topo)
    model = make_model(num_experts=8, top_k=2)
    return wconfig.make_config(plat, model, mapping=mapping, tp_size=tp, retain_allgather=retain,
                               network=network, bidirectional_rings=bidi)


CASES = [
    dict(mapping="baseline", tp=2, rows=2, cols=4),
    dict(mapping="er", tp=2, rows=2, cols=4),
    dict(mapping="baseline", tp=4, rows=4, cols=4),
    dict(mapping="er", tp=4, rows=4, cols=4),
    dict(mapping="er", tp=4, rows=4, cols=4, retain=False),
    dict(mapping="her", tp=2, kind="multi_wafer_mesh"),
    dict(mapping="baseline", tp=2, kind="multi_wafer_mesh"),
    # the earlier default, now a named alternative: cut-through, one-way rings
    dict(mapping="er", tp=4, rows=4, cols=4, network="link_load", bidi=False),
]


@pytest.mark.parametrize("case", CASES)
def test_layer_matches_plain_reference(case):
    cfg = _cfg(**case)
    e, d = cfg.model.num_experts, cfg.num_devices
    params = wconfig.default_params(cfg)
    rng = np.random.default_rng(0)
    host = np.asarray(params.placement).copy()
    host[rng.integers(0, e, 3), rng.integers(0, d, 3)] = 1.0  # a few replicas
    tr = random_trace(jax.random.key(1), 1, 1, 1, 24, e, 2, valid=[[19]])
    ids, mask, counts = tr.expert_ids[0, 0, 0], tr.token_mask[0, 0], tr.counts[0, 0, 0]
    out = _hard_layer(cfg, params, jnp.asarray(host), ids, mask, counts)
    ref = reference.layer(cfg, host, np.asarray(ids), np.asarray(mask))
    for k in ("layer_s", "all_to_all_s", "all_reduce_s", "moe_compute_s", "attention_s",
              "avg_hops", "micro_batches"):
        np.testing.assert_allclose(float(out[k]), ref[k], rtol=2e-5, err_msg=k)
    for k in ("a2a_link_bytes", "ar_link_bytes", "device_tokens"):
        np.testing.assert_allclose(np.asarray(out[k]), ref[k], rtol=2e-5, atol=1e-3, err_msg=k)


def test_bytes_conserved_and_latency_bounds():
    cfg = _cfg(mapping="er", tp=4, rows=4, cols=4)
    params = wconfig.default_params(cfg)
    tr = random_trace(jax.random.key(2), 1, 1, 1, 32, 8, 2)
    ids, mask, counts = tr.expert_ids[0, 0, 0], tr.token_mask[0, 0], tr.counts[0, 0, 0]
    pairs = wtraffic.holder_tokens(cfg, ids, mask, counts)
    traffic = wtraffic.dispatch_traffic(cfg, wtraffic.served_share(params.placement), pairs)
    assert float(traffic.sum()) == pytest.approx(32 * 2 * cfg.model.token_bytes, rel=1e-6)
    out = _hard_layer(cfg, params, params.placement, ids, mask, counts)
    assert float(out["layer_s"]) >= float(out["moe_compute_s"])
    assert float(out["layer_s"]) >= float(out["attention_s"])
    serial = out["attention_s"] + out["all_reduce_s"] + out["all_to_all_s"] + out["moe_compute_s"]
    assert float(out["layer_s"]) <= float(serial) * (1 + 1e-6)


def test_counts_only_equals_token_level_expectation_for_uniform_shares():
    cfg = _cfg(mapping="er", tp=2, rows=2, cols=4)
    params = wconfig.default_params(cfg)
    e = cfg.model.num_experts
    counts = jnp.full((e,), 8.0)
    empty = jnp.zeros((0, 2), jnp.int32)
    out = _hard_layer(cfg, params, params.placement, empty, jnp.zeros((0,), bool), counts)
    assert float(out["all_to_all_s"]) > 0
    assert float(jnp.asarray(out["device_tokens"]).sum()) == pytest.approx(8.0 * e)


def _system(iters=2, **kw):
    cfg = _cfg(**kw)
    return cfg, system.build(cfg, iters), wconfig.default_params(cfg)


@pytest.fixture(scope="module")
def er_run():
    """One wafer system (ER, TP = 4, 4x4 mesh, 2 iterations x 2 layers), a batch of 3 traces
    and the jitted single-trace run: shared by the engine-level tests below, which would each
    compile the whole scanned step again (about 20 s CPU each) for their own config."""
    _, sysm, params = _system(mapping="er", tp=4, rows=4, cols=4)
    tr = random_trace(jax.random.key(3), 3, 2, 2, 16, 8, 2)
    one_run = jax.jit(lambda p, trace: engine.run_one(sysm, p, trace, jax.random.key(0)))
    return sysm, params, tr, one_run


def test_vmap_equals_loop_of_single_runs(er_run):
    sysm, params, tr, one_run = er_run
    batched = engine.simulate(sysm, params, tr)
    for t in range(3):
        one = one_run(params, tr[t])
        np.testing.assert_allclose(batched["layer_s"][t], one["layer_s"], rtol=1e-6)
        np.testing.assert_allclose(batched["link_bytes"][t], one["link_bytes"], rtol=1e-5)


def test_jit_equals_no_jit(er_run):
    sysm, params, tr, one_run = er_run
    eager = engine.run_one(sysm, params, tr[0], jax.random.key(0))
    np.testing.assert_allclose(one_run(params, tr[0])["forward_s"], eager["forward_s"],
                               rtol=1e-6)


def test_relaxed_approaches_hard_as_tau_shrinks(er_run):
    sysm, params, tr, _ = er_run
    hard = np.asarray(engine.simulate(sysm, params, tr)["layer_s"])
    soft = np.asarray(engine.simulate(sysm, params.replace(tau=jnp.float32(1e-4)), tr)["layer_s"])
    assert not np.array_equal(soft, hard)  # the relaxed path ran
    np.testing.assert_allclose(soft, hard, rtol=1e-2)


def test_dropping_allgather_halves_the_allreduce():
    keep = _cfg(mapping="er", tp=4, rows=4, cols=4)
    drop = _cfg(mapping="er", tp=4, rows=4, cols=4, retain=False)
    p = wconfig.default_params(keep)
    counts = jnp.full((8,), 16.0)
    empty = jnp.zeros((0, 2), jnp.int32)
    a = _hard_layer(keep, p, p.placement, empty, jnp.zeros((0,), bool), counts)
    b = _hard_layer(drop, p, p.placement, empty, jnp.zeros((0,), bool), counts)
    assert float(b["all_reduce_s"]) == pytest.approx(float(a["all_reduce_s"]) / 2, rel=1e-6)
    assert float(b["avg_hops"]) >= float(a["avg_hops"])  # fewer holders: no nearer source


def test_catalog_4x4_example_er_halves_all_to_all_doubles_all_reduce():
    from moejax.reproduce import moentwine as mt

    base = mt.comm_point("wsc-4x4", "qwen3-235b-a22b", "baseline", 4)
    er = mt.comm_point("wsc-4x4", "qwen3-235b-a22b", "er", 4)
    # 001 §IV-B1: ER's disjoint 2x2 FTDs halve the all-to-all; §IV-B2: 2-hop rings double
    # the all-reduce (here through two overlapping flows on each FTD-border link)
    assert er["all_to_all_s"] == pytest.approx(base["all_to_all_s"] / 2, rel=1e-4)
    assert er["all_reduce_s"] == pytest.approx(base["all_reduce_s"] * 2, rel=1e-4)
    assert er["avg_hops"] < base["avg_hops"]


def test_relaxed_layer_time_has_finite_gradients_wrt_placement():
    cfg = _cfg(mapping="er", tp=2, rows=2, cols=4)
    params = wconfig.default_params(cfg).replace(tau=jnp.float32(0.05))
    counts = jnp.asarray(np.random.default_rng(6).integers(1, 20, 8), jnp.float32)
    empty = jnp.zeros((0, 2), jnp.int32)

    def loss(logits):
        place = jax.nn.softmax(logits, axis=-1)  # a relaxed expert x device placement
        out = wlayer.layer(cfg, params, place, empty, jnp.zeros((0,), bool), counts)
        return out["layer_s"] / wconfig.time_scale_s(cfg)

    vg = jax.jit(jax.value_and_grad(loss))  # one compile gives both the loss and its gradient
    logits = jnp.log(params.placement + 0.1)
    here, g = vg(logits)
    assert bool(jnp.isfinite(g).all()) and float(jnp.abs(g).max()) > 0
    step = 1e-2 * g / jnp.abs(g).max()
    assert float(vg(logits - step)[0]) < float(here)  # descent direction


def test_policy_options_placement_and_errors():
    from moejax.catalog.schema import Table

    plat, model = make_platform("mesh2d", rows=2, cols=4), make_model(num_experts=8)
    ids = [7, 6, 5, 4, 3, 2, 1, 0]
    _, params = system.from_policy(plat, model, Table({"mapping": "er", "tp_size": 2,
                                                      "placement": ids}, "t"), 2)
    assert np.asarray(params.placement).argmax(1).tolist() == ids
    for bad, field in (({"placement": [0, 1]}, "placement"), ({"balancer": "lpt"}, "balancer"),
                       ({"invasive": False, "beta": 2.0}, "beta"), ({"zap": 1}, "zap")):
        with pytest.raises(ConfigError, match=field):
            system.from_policy(plat, model, Table({"tp_size": 2, **bad}, "t"), 2)


# --- ESP: expert sharding (001 §VI-B5) -----------------------------------------------------


@functools.cache
def _esp_cfg(mapping="er", tp=4, shards=4, kind="mesh2d", retain=True, experts=8, **topo):
    plat = make_platform(kind, **topo)
    model = make_model(num_experts=experts, top_k=2)
    return wconfig.make_config(plat, model, mapping=mapping, tp_size=tp, retain_allgather=retain,
                               expert_shards=shards)


ESP_CASES = [
    dict(mapping="baseline", tp=4, shards=4, rows=4, cols=4),
    dict(mapping="er", tp=4, shards=4, rows=4, cols=4),
    dict(mapping="baseline", tp=2, shards=2, rows=2, cols=4),
    dict(mapping="er", tp=2, shards=8, rows=2, cols=4, retain=False),
]


@pytest.mark.parametrize("case", ESP_CASES)
def test_esp_layer_matches_plain_reference(case):
    cfg = _esp_cfg(**case)
    params = wconfig.default_params(cfg)
    tr = random_trace(jax.random.key(7), 1, 1, 1, 24, 8, 2, valid=[[21]])
    ids, mask, counts = tr.expert_ids[0, 0, 0], tr.token_mask[0, 0], tr.counts[0, 0, 0]
    out = _hard_layer(cfg, params, params.placement, ids, mask, counts)
    ref = reference.layer(cfg, np.asarray(params.placement), np.asarray(ids), np.asarray(mask))
    assert ref["esp_reduce_s"] > 0
    for k in ("layer_s", "all_to_all_s", "all_reduce_s", "esp_reduce_s", "moe_compute_s",
              "avg_hops", "micro_batches"):
        np.testing.assert_allclose(float(out[k]), ref[k], rtol=2e-5, atol=1e-12, err_msg=k)
    for k in ("a2a_link_bytes", "esp_link_bytes", "device_tokens"):
        np.testing.assert_allclose(np.asarray(out[k]), ref[k], rtol=2e-5, atol=1e-3, err_msg=k)


def test_esp_groups_tile_the_mesh_and_er_ftds_are_ep_groups():
    g = mp.esp_groups(4, 4, 4)
    assert sorted(g.ravel().tolist()) == list(range(16))
    hops = mp.mesh_hops(4, 4)
    assert (hops[g, np.roll(g, -1, axis=1)] == 1).all()  # 2x2 tiles: unit-step rings
    er = mp.build_mapping("er", 4, 4, 4)
    assert {frozenset(x) for x in g.tolist()} == {frozenset(f) for f in er.ftds.tolist()}
    land = mp.esp_landing(er.holders, g)
    np.testing.assert_allclose(land.sum(-1), 1.0)
    assert (land * (1 - er.holders[:, None, :]) == 0).all()  # ER: every token already inside
    base = mp.build_mapping("baseline", 4, 4, 4)
    land_b = mp.esp_landing(base.holders, g)
    np.testing.assert_allclose(land_b.sum(-1), 1.0)
    assert (land_b * (1 - base.holders[:, None, :])).sum() > 0  # baseline: some come in
    assert mp.esp_groups(1, 8, 4).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]  # GPU blocks


def test_esp_er_has_no_all_to_all_conserves_tokens_and_bounds():
    er, base = _esp_cfg("er", rows=4, cols=4), _esp_cfg("baseline", rows=4, cols=4)
    counts = jnp.asarray(np.random.default_rng(8).integers(1, 30, 8), jnp.float32)
    empty = jnp.zeros((0, 2), jnp.int32)
    outs = {}
    for name, cfg in (("er", er), ("baseline", base)):
        p = wconfig.default_params(cfg)
        assert np.asarray(p.placement).sum(0).reshape(-1).tolist().count(2.0) == 4  # 2 per group
        out = _hard_layer(cfg, p, p.placement, empty, jnp.zeros((0,), bool), counts)
        tok = np.asarray(out["device_tokens"])
        assert tok.sum() == pytest.approx(float(counts.sum()), rel=1e-6)
        for grp in cfg.esp_groups:  # every slice of a group sees all of the group's tokens / S
            assert np.ptp(tok[grp]) < 1e-4
        assert float(out["layer_s"]) >= float(out["moe_compute_s"])
        serial = (out["attention_s"] + out["all_reduce_s"] + out["all_to_all_s"]
                  + out["esp_reduce_s"] + out["moe_compute_s"])
        assert float(out["layer_s"]) <= float(serial) * (1 + 1e-6)
        outs[name] = out
    assert float(outs["er"]["all_to_all_s"]) == 0.0  # 001 §VI-B5: all-to-all eliminated
    assert float(outs["baseline"]["all_to_all_s"]) > 0.0
    # same EP-group tiles in both mappings: the same partial-sum all-reduce
    assert float(outs["er"]["esp_reduce_s"]) == pytest.approx(
        float(outs["baseline"]["esp_reduce_s"]), rel=1e-6)
    # slicing: the expert time of a sharded layer is below the unsharded one (weights / S)
    plain = _cfg(mapping="er", tp=4, rows=4, cols=4)
    pp = wconfig.default_params(plain)
    o = _hard_layer(plain, pp, pp.placement, empty, jnp.zeros((0,), bool), counts)
    assert float(outs["er"]["moe_compute_s"]) < float(o["moe_compute_s"])


def test_esp_on_gpu_nodes_and_as_a_policy_with_errors():
    from moejax.catalog.schema import Table

    cfg = _esp_cfg("baseline", tp=2, shards=2, kind="hierarchical")
    assert cfg.esp_groups.tolist() == [[0, 1], [2, 3]]  # one node each
    sysm, params = system.from_policy(make_platform("mesh2d", rows=4, cols=4),
                                      make_model(num_experts=8),
                                      Table({"mapping": "er", "expert_shards": 4}, "t"), 2)
    tr = random_trace(jax.random.key(9), 1, 2, 1, 16, 8, 2)
    res = engine.simulate(sysm, params, tr)
    assert float(res["esp_reduce_s"][0]) > 0 and float(res["all_to_all_s"][0]) == 0.0
    assert float(res["comm_s"][0]) == pytest.approx(
        float(res["all_reduce_s"][0] + res["esp_reduce_s"][0]), rel=1e-6)
    plat, model = make_platform("mesh2d", rows=4, cols=4), make_model(num_experts=8)
    for bad, msg in (({"expert_shards": 3}, "expert_shards"),
                     ({"expert_shards": 4, "balancer": "greedy", "shadow_slots": 1}, "balancer"),
                     ({"expert_shards": -1}, "expert_shards")):
        with pytest.raises(ConfigError, match=msg):
            system.from_policy(plat, model, Table(dict(bad), "t"), 2)
    with pytest.raises(ConfigError, match="expert_shards = 6"):
        wconfig.make_config(plat, model, tp_size=2, expert_shards=6)  # does not divide 16
    with pytest.raises(ConfigError, match="her"):
        wconfig.make_config(make_platform("multi_wafer_mesh"), model, mapping="her", tp_size=2,
                            expert_shards=2)


@pytest.mark.parametrize("esp", [False, True])
@pytest.mark.parametrize("counts_only", [False, True])
def test_unit_tables_equal_the_traffic_matrix_path(monkeypatch, esp, counts_only):
    """The static per-unit tables (`wtables.unit_tables`) and the per-trace traffic matrix
    they replace give the same layer, hard and relaxed, with soft (split) hosts too."""
    cfg = _esp_cfg(mapping="baseline", tp=4, shards=4, rows=4, cols=4) if esp else _cfg(
        mapping="er", tp=4, rows=4, cols=4)
    e, d = cfg.model.num_experts, cfg.num_devices
    tr = random_trace(jax.random.key(11), 1, 1, 1, 24, e, 2, valid=[[20]])
    ids, mask, counts = tr.expert_ids[0, 0, 0], tr.token_mask[0, 0], tr.counts[0, 0, 0]
    if counts_only:
        ids, mask = jnp.zeros((0, 2), jnp.int32), jnp.zeros((0,), bool)
    soft = jax.nn.softmax(jax.random.normal(jax.random.key(3), (e, d)), -1)
    keys = ("layer_s", "all_to_all_s", "avg_hops", "remote_bytes", "a2a_link_bytes",
            "device_tokens", "device_busy_s")

    def run():  # a new function: traced afresh under the current UNIT_TABLE_MAX, compiled
        layer = jax.jit(lambda *a: wlayer.layer(cfg, *a))  # once, run at both temperatures
        outs = []
        for tau, host in ((0.0, None), (0.3, soft)):
            p = wconfig.default_params(cfg).replace(tau=jnp.float32(tau))
            h = p.placement if host is None else host
            outs.append(layer(p, h, ids, mask, counts))
        return outs

    assert wtables.unit_tables(cfg, counts_only) is not None
    tables = run()
    monkeypatch.setattr(wtables, "UNIT_TABLE_MAX", 0)
    wtables.unit_tables.cache_clear()
    try:
        assert wtables.unit_tables(cfg, counts_only) is None
        dense = run()
    finally:
        wtables.unit_tables.cache_clear()
    for a, b in zip(tables, dense, strict=True):
        for k in keys:
            np.testing.assert_allclose(np.asarray(a[k]), np.asarray(b[k]), rtol=2e-5,
                                       atol=1e-12, err_msg=k)


def test_binary_fast_expert_roofline_equals_the_dense_one():
    cfg = _cfg(mapping="er", tp=2, rows=2, cols=4)
    p = wconfig.default_params(cfg)
    host = np.asarray(p.placement).copy()
    host[[0, 3, 5], [1, 6, 2]] = 1.0  # replicas: experts split over several hosts
    counts = jnp.asarray([0.0, 3.0, 50.0, 7.0, 0.0, 400.0, 1.0, 12.0])
    fast = wlayer.expert_times(cfg, jnp.asarray(host), counts, 0.0, 0.0, jnp.bool_(True))
    dense = wlayer.expert_times(cfg, jnp.asarray(host), counts, 0.0, 0.0, jnp.bool_(False))
    for a, b in zip(fast, dense, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
    assert bool(wlayer.is_binary(jnp.asarray(host)))
    assert not bool(wlayer.is_binary(jnp.asarray(host) * 0.5))
