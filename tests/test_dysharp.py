"""004 DySHARP: closed forms (spec §5), primitive ordering, vectorized == reference, vmap ==
loop, payload efficiencies, edge cases, EPLB placements, the CLI error on a platform without
in-switch compute."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moejax.catalog.hardware import load_platform
from moejax.catalog.models import load_model, with_overrides
from moejax.placement import eplb, slots
from moejax.runner import engine
from moejax.systems.dysharp import closed_form as cf
from moejax.systems.dysharp import reference, schedule, traffic
from moejax.systems.dysharp import system as dys
from moejax.systems.dysharp.config import DyParams, contiguous_placement, make_config
from moejax.systems.dysharp.packet import payload_efficiency
from moejax.trace import gen

G, E, K, N = 8, 16, 4, 64
_loads = jax.jit(traffic.port_loads)
RANK, DYN, PAIR, NVLS = (traffic.LOAD_KINDS.index(k) for k in
                         ("unicast_rank", "dymultimem", "unicast_pair", "nvls"))

# (primitive, schedule, extra) of the twelve catalog policies, small shapes
SYSTEMS = [  # every primitive and schedule once (compiles dominate the test time)
    ("unicast_rank", "serial", {"notify": True}), ("nvls", "serial", {}),
    ("unicast_pair", "coarse", {"chunks": (1, 2, 4, 8)}),
    ("unicast_pair", "fine", {"comm_sms": 10, "notify": True}),  # comm below saturation
    ("dymultimem", "fused", {}),
    ("explicit", "fused", {"combine": "per_expert", "phase": "training", "tokens_per_gpu": 512,
                           "tile_tokens": 32,  # a tile below WGMMA_M rows
                           "adaptive_comm_sms": (4, 12, 20)}),  # COMET's per-shape split
]


@pytest.fixture(scope="module")
def setup():
    platform = load_platform("gh200-nvl8")
    model = with_overrides(load_model("dysharp-s"), num_experts=E, top_k=K)
    traces = gen.generate("normal:std=0.05", jax.random.key(1), num_traces=3, iterations=1,
                          layers=2, tokens=N, num_experts=E, top_k=K)
    return platform, model, traces


def _ids(seed, n, e, k):
    """Uniform top-k without replacement [N, K]."""
    rng = np.random.default_rng(seed)
    return np.argsort(rng.random((n, e)), axis=1)[:, :k].astype(np.int32)


# --- closed forms (spec §5) ----------------------------------------------------------------


def test_closed_forms_match_spec_worked_numbers():
    assert cf.expected_distinct_gpus(256, 32, 8) == pytest.approx(7.267, abs=1e-3)
    assert cf.expected_remote_gpus(256, 32, 8) == pytest.approx(7.040, abs=1e-3)
    assert cf.expected_distinct_gpus(64, 32, 8) == pytest.approx(7.556, abs=1e-3)  # S-8
    assert cf.nvls_useless(256, 32, 8) == pytest.approx(3.404, abs=1e-3)  # 004 §I "340%"
    assert cf.ideal_speedup(256, 32, 8) == pytest.approx(1.751, abs=1e-3)
    assert cf.ideal_speedup(256, 32, 32) == pytest.approx(1.907, abs=1e-3)
    assert [round(100 * cf.redundancy(256, 32, k), 1) for k in (1, 2, 4, 8, 16, 32)] == [
        0.0, 23.9, 36.6, 42.9, 46.0, 47.6]
    t = cf.traffic_per_token(256, 32, 8)
    assert t["unicast_pair"] == pytest.approx(31.0)
    assert t["unicast_rank"] == pytest.approx(28.16, abs=0.01)
    assert t["dymultimem"] == pytest.approx(16.08, abs=0.01)
    assert t["nvls"] == 64


def test_sampled_traffic_matches_closed_form():
    """Uniform routing at L-8 (G 32, E 256): per-token loads of the traces within 3%."""
    ids = _ids(0, 2048, 256, 8)
    loads = _loads(jnp.asarray(ids), jnp.ones(2048, bool),
                               jnp.asarray(contiguous_placement(256, 32)))
    per_tok = np.asarray(loads.sum((1, 2))) / 2048
    want = cf.traffic_per_token(256, 32, 8)
    for kind in ("unicast_pair", "unicast_rank", "dymultimem", "nvls"):
        assert per_tok[traffic.LOAD_KINDS.index(kind)] == pytest.approx(want[kind], rel=0.03)
    r = np.asarray(traffic.distinct_remote_gpus(jnp.asarray(ids), jnp.ones(2048, bool),
                                                jnp.asarray(contiguous_placement(256, 32))))
    assert r.mean() == pytest.approx(cf.expected_remote_gpus(256, 32, 8), rel=0.03)


def test_edge_cases_k1_and_e_equals_g():
    place = jnp.asarray(contiguous_placement(8, 8))
    ids = _ids(2, 256, 8, 1)
    loads = np.asarray(_loads(jnp.asarray(ids), jnp.ones(256, bool), place))
    assert loads[DYN].sum() == pytest.approx(loads[RANK].sum())  # k = 1: nothing redundant
    assert cf.redundancy(256, 32, 1) == 0.0
    ids = _ids(3, 256, 8, 3)  # E = G: every expert on its own GPU, D = k exactly
    r = np.asarray(traffic.distinct_remote_gpus(jnp.asarray(ids), jnp.ones(256, bool), place))
    local = (ids == (np.arange(256) % 8)[:, None]).any(1)
    np.testing.assert_array_equal(r, 3 - local)
    assert cf.expected_distinct_gpus(8, 8, 3) == pytest.approx(3.0)


def test_payload_efficiencies():
    p = load_platform("gh200-nvl32")
    assert payload_efficiency(p, "unicast_rank", 8) == pytest.approx(0.80)
    assert [round(payload_efficiency(p, "dymultimem", k), 3) for k in (8, 16, 32)] == [
        0.762, 0.727, 0.667]
    assert payload_efficiency(p, "explicit", 8) == pytest.approx(2 / 3)
    # k = 1: one 8 B address beats one 16 B target flit; from k = 2 on, DySHARP is never worse
    for k in (2, 4, 8, 16, 32):
        assert payload_efficiency(p, "explicit", k) <= payload_efficiency(p, "dymultimem", k)


def _symmetric(g, k, n_per):
    """Every GPU sends each of its tokens to the next k GPUs (one expert each): port loads
    are equal on every port and direction (the flow model's symmetric case)."""
    n = g * n_per
    own = np.arange(n) % g
    ids = (own[:, None] + 1 + np.arange(k)[None]) % g
    return jnp.asarray(ids, jnp.int32), jnp.ones(n, bool), jnp.asarray(contiguous_placement(g, g))


def test_multicast_only_and_fusion_only_are_exactly_one():
    """004 Fig. 4c / 4e: Basic's dispatch = DeepEP's (downlink-bound); fused DeepEP bytes =
    serial DeepEP comm; fused DySHARP = 2R / (R + 1) of DeepEP (spec §5.4)."""
    k = 5
    ids, mask, place = _symmetric(8, k, 16)
    loads = _loads(ids, mask, place)
    rank_cd, rank_cc = schedule.phase_times_s(loads[RANK], 1.0, 0.0)
    dyn_cd, dyn_cc = schedule.phase_times_s(loads[DYN], 1.0, 0.0)
    assert float(dyn_cd) == float(rank_cd) and float(dyn_cc) == float(rank_cc)
    fused_rank = max(float((loads[RANK][0] + loads[RANK][2]).max()),
                     float((loads[RANK][1] + loads[RANK][3]).max()))
    assert fused_rank == float(rank_cd + rank_cc)
    fused_dyn = max(float((loads[DYN][0] + loads[DYN][2]).max()),
                    float((loads[DYN][1] + loads[DYN][3]).max()))
    assert float(rank_cd + rank_cc) / fused_dyn == pytest.approx(2 * k / (k + 1), rel=1e-6)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 6), frac=st.floats(0.3, 1.0))
def test_dysharp_le_deepep_le_pair_on_every_port(seed, k, frac):
    rng = np.random.default_rng(seed)
    ids = np.argsort(rng.random((48, 12)), axis=1)[:, :6].astype(np.int32)
    ids[:, k:] = -1  # one shape for every k (one compile)
    mask = rng.random(48) < frac
    place = contiguous_placement(12, 4)[rng.permutation(12)]
    loads = np.asarray(_loads(jnp.asarray(ids), jnp.asarray(mask),
                                          jnp.asarray(place)))
    assert (loads[DYN] <= loads[RANK] + 1e-6).all()
    assert (loads[RANK] <= loads[PAIR] + 1e-6).all()
    # bytes needed: DeepEP's dispatch downlink is what DySHARP delivers too (variant A)
    np.testing.assert_allclose(loads[DYN][1], loads[RANK][1])
    # NVLS: every GPU receives every other GPU's tokens
    assert loads[NVLS][1].sum() == pytest.approx((4 - 1) * mask.sum())


# --- the system ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def layer_fns(setup):
    platform, model, _ = setup
    fns = {}
    for prim, sched, extra in SYSTEMS:
        cfg = make_config(platform, model, primitive=prim, schedule=sched, **extra)
        fns[(prim, sched, tuple(sorted(extra.items())))] = (cfg, jax.jit(
            lambda p, i, m, c, cfg=cfg: dys.moe_layer(cfg, p, i, m, c)))
    return fns


def test_vectorized_equals_reference(setup, layer_fns):
    _, _, traces = setup
    ids, mask, counts = (np.asarray(traces.expert_ids[0, 0, 0]),
                         np.asarray(traces.token_mask[0, 0]), np.asarray(traces.counts[0, 0, 0]))
    place = contiguous_placement(E, G)[np.random.default_rng(0).permutation(E)]
    params = DyParams(placement=jnp.asarray(place))
    for cfg, fn in layer_fns.values():
        got = fn(params, ids, mask, counts)
        want = reference.moe_layer(cfg, ids, mask, counts, place)
        for key in ("latency_s", "comm_s", "gemm_s", "traffic_bytes", "attention_s",
                    "block_dualpipe_s"):
            assert float(got[key]) == pytest.approx(want[key], rel=2e-6), (cfg.primitive,
                                                                           cfg.schedule, key)


def test_fused_bounds_and_utilization(setup, layer_fns):
    _, _, traces = setup
    params = DyParams(placement=jnp.asarray(contiguous_placement(E, G)))
    for cfg, fn in layer_fns.values():
        out = fn(params, traces.expert_ids[1, 0, 0], traces.token_mask[1, 0],
                 traces.counts[1, 0, 0])
        assert float(out["latency_s"]) >= float(out["gemm_s"]) * (1 - 1e-6)
        assert 0.0 <= float(out["bw_util"]) <= 1.0 + 1e-6
        if cfg.schedule == "fused" and cfg.phase == "forward":
            port = max(float(out["port_up_bytes"].max()), float(out["port_down_bytes"].max()))
            assert float(out["latency_s"]) >= port / cfg.platform.topology.link_Bps


def test_vmap_equals_loop(setup, layer_fns):
    """The system (scan over iterations, vmap over layers and traces) == a loop of layers."""
    _, _, traces = setup
    cfg, fn = layer_fns[("dymultimem", "fused", ())]
    params = DyParams(placement=jnp.asarray(contiguous_placement(E, G)))
    batch = engine.simulate(dys.build(cfg, 1), params, traces)
    for i in range(3):
        layers = [fn(params, traces.expert_ids[i, 0, j], traces.token_mask[i, 0],
                     traces.counts[i, 0, j]) for j in range(2)]
        np.testing.assert_allclose(batch["latency_s"][i],
                                   np.mean([float(x["latency_s"]) for x in layers]), rtol=1e-6)
        np.testing.assert_allclose(batch["port_up_bytes"][i],
                                   np.mean([np.asarray(x["port_up_bytes"]) for x in layers], 0),
                                   rtol=1e-6)


def test_eplb_placement_conserves_tokens(setup, layer_fns):
    """EPLB (with redundant replicas) as the placement: every routed token is computed once
    (the GPUs' expert tokens sum to the layer's (token, expert) pairs), bytes still ordered."""
    _, _, traces = setup
    counts = np.asarray(traces.counts[0, 0])  # [L, E]
    phy2log, _, _ = eplb.rebalance(counts, E + G, 1, 1, G)
    shares = np.asarray(slots.layout_shares(phy2log, E, G))  # [L, E, G]
    assert (shares > 0).sum() > E * 2  # replicas present
    _, fn = layer_fns[("unicast_rank", "serial", (("notify", True),))]
    for layer in range(2):
        out = fn(DyParams(placement=jnp.asarray(shares[layer])), traces.expert_ids[0, 0, layer],
                 traces.token_mask[0, 0], traces.counts[0, 0, layer])
        np.testing.assert_allclose(float(out["expert_tokens"].sum()), counts[layer].sum(),
                                   rtol=1e-5)
        by = np.asarray(out["traffic_by_primitive_bytes"])
        assert by[DYN] <= by[RANK] * (1 + 1e-6) and by[RANK] <= by[PAIR] * (1 + 1e-6)


def test_relaxed_tends_to_hard(setup, layer_fns):
    _, _, traces = setup
    cfg, fn = layer_fns[("dymultimem", "fused", ())]
    args = (traces.expert_ids[0, 0, 0], traces.token_mask[0, 0], traces.counts[0, 0, 0])
    place = jnp.asarray(contiguous_placement(E, G))
    hard = float(fn(DyParams(placement=place), *args)["latency_s"])
    soft = [float(fn(DyParams(placement=place, tau=jnp.float32(t)), *args)["latency_s"])
            for t in (1e-1, 1e-3)]
    assert abs(soft[1] - hard) <= abs(soft[0] - hard) + 1e-12
    assert soft[1] == pytest.approx(hard, rel=0.05)
    assert math.isfinite(soft[0])


def test_cli_dysharp_without_in_switch_compute_is_one_line_exit_2(capsys, tmp_path):
    from moejax.cli.main import main

    rc = main(["simulate", "--hardware", "a100x8-nvswitch", "--model", "dysharp-s",
               "--policy", "dysharp", "--traces", "2", "--tokens", "64", "--out",
               str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "in-switch" in err
    assert not (tmp_path / "o").exists()


def test_relaxed_gradient_matches_finite_differences(setup):
    """d(layer time)/d(placement mix) at tau > 0 (the tuning path) vs central differences."""
    platform, model, traces = setup
    cfg = make_config(platform, model)
    p0 = jnp.asarray(contiguous_placement(E, G))
    p1 = p0[np.random.default_rng(1).permutation(E)]
    args = (traces.expert_ids[0, 0, 0], traces.token_mask[0, 0], traces.counts[0, 0, 0])

    def f(a):
        params = DyParams(placement=(1 - a) * p0 + a * p1, tau=jnp.float32(0.05))
        return dys.moe_layer(cfg, params, *args)["latency_s"] * 1e6  # us

    val_grad = jax.jit(jax.value_and_grad(f))
    a, h = jnp.float32(0.3), 1e-2
    _, g = val_grad(a)
    fd = (val_grad(a + h)[0] - val_grad(a - h)[0]) / (2 * h)
    assert float(g) == pytest.approx(float(fd), rel=0.05, abs=1e-3)


# --- tuning (moejax tune --system dysharp) -------------------------------------------------


def test_traced_knobs_equal_config_knobs(setup, layer_fns):
    """comm_sms / tile_tokens / chunks as traced DyParams fields (what tuning sets) give the
    config's hard-mode layer exactly; fewer comm SMs slow an overlapped schedule's comm."""
    _, _, traces = setup
    args = (traces.expert_ids[0, 0, 0], traces.token_mask[0, 0], traces.counts[0, 0, 0])
    place = jnp.asarray(contiguous_placement(E, G))
    cfg, fn = layer_fns[("unicast_pair", "fine", (("comm_sms", 10), ("notify", True)))]
    base = make_config(cfg.platform, cfg.model, primitive="unicast_pair", schedule="fine",
                       notify=True)  # comm_sms 20: ports at the full link rate
    knobs = jax.jit(lambda p, i, m, c: dys.moe_layer(base, p, i, m, c))
    got = knobs(DyParams(placement=place, comm_sms=jnp.float32(10.0),
                         tile_tokens=jnp.float32(128.0)), *args)
    want = fn(DyParams(placement=place), *args)
    assert float(got["latency_s"]) == pytest.approx(float(want["latency_s"]), rel=1e-6)
    full = knobs(DyParams(placement=place, comm_sms=jnp.float32(20.0),
                          tile_tokens=jnp.float32(128.0)), *args)
    assert float(full["comm_s"]) < float(got["comm_s"])


def test_tune_dysharp_placement_and_knob_errors(tmp_path):
    """A short `tune` run of the DySHARP target: a valid hard placement within capacity, a
    held-out evaluation beside contiguous placement; knobs a schedule lacks are one-line
    ConfigErrors naming the param."""
    from moejax.errors import ConfigError
    from moejax.tune import TuneConfig, tune

    cfg = TuneConfig(system="dysharp", hardware="gh200-nvl4", model="dysharp-s",
                     policy="dysharp", params=("placement",), steps=2, traces=2, batch=1,
                     eval_traces=2, tokens=8, iterations=1, layers=1, every=2)
    res = tune(cfg, tmp_path / "ck", progress=False)
    ids = np.asarray(res.hard["placement"])
    e = load_model("dysharp-s").num_experts
    assert ids.shape == (e,) and np.bincount(ids, minlength=4).max() <= e // 4
    assert {"tuned", "default", "contiguous", "greedy-balanced"} <= set(res.evaluation)
    assert all(math.isfinite(r["latency_ms"]["mean"]) for r in res.evaluation.values())
    for policy, param in (("deepep", "comm_sms"), ("comet", "chunks")):
        with pytest.raises(ConfigError, match=f"param {param}"):
            tune(TuneConfig(system="dysharp", hardware="gh200-nvl4", model="dysharp-s",
                            policy=policy, params=(param,), steps=1, traces=2, batch=1,
                            eval_traces=2, tokens=8), tmp_path / policy, progress=False)
