"""AMoE (002) calibration inputs and the K / delta tuning rule:
each calibrated value reaches the cost it names, and only that cost."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_model, make_platform

from moejax.catalog.policies import load_policy
from moejax.errors import ConfigError
from moejax.reproduce import amoe_knobs
from moejax.systems.amoe import aep, sync
from moejax.systems.amoe.config import FIG3_EXPERT_EFFICIENCY, Overheads, expert_seconds
from moejax.trace.core import RequestStream


def _small(**ov):
    plat = make_platform("switch", devices=4)
    model = make_model(num_experts=4, top_k=1, num_layers=3, num_sparse_layers=3)
    return aep.make_config(plat, model, num_requests=4, overheads=Overheads(**ov))


def test_fig3_efficiency_puts_the_knee_at_128_on_a100_40g():
    # Fig. 3: linear up to 128 tokens; the knee of max(n c / eff, w) is where n c / eff = w
    assert FIG3_EXPERT_EFFICIENCY * 312e12 / 1.555e12 == pytest.approx(128)
    base, cal = _small(), _small(expert_efficiency=0.5)
    assert float(cal.cost.exp_comp) == pytest.approx(2 * float(base.cost.exp_comp), rel=1e-6)
    for f in ("exp_weight", "att_comp", "att_kv", "att_weight", "att_fixed"):
        assert getattr(cal.cost, f) == getattr(base.cost, f), f
    big = 10_000  # compute-bound: time scales with 1 / efficiency
    assert float(expert_seconds(np, cal.cost, big)) > 1.9 * float(
        expert_seconds(np, base.cost, big)) - 2 * float(base.cost.exp_fixed)


def test_kv_reads_and_message_cost_reach_only_their_terms():
    base, cal = _small(), _small(attention_kv_reads=32.0, message_s=30e-6)
    assert float(cal.cost.att_kv) == pytest.approx(32 * float(base.cost.att_kv), rel=1e-6)
    assert cal.cost.exp_comp == base.cost.exp_comp
    off = ~np.eye(4, dtype=bool)
    np.testing.assert_allclose(cal.lat_s[off], base.lat_s[off] + np.float32(30e-6), rtol=1e-6)
    assert (np.diag(cal.lat_s) == 0).all()
    np.testing.assert_array_equal(cal.per_token_s, base.per_token_s)


def test_sync_gather_allreduce_costs_more_than_routed_all_to_all():
    plat = make_platform("switch", devices=4, link_Bps=1e9, hop_latency_s=2e-6)  # comm shows
    model = make_model(num_experts=4, top_k=1, num_layers=3, num_sparse_layers=3)
    r = 32
    st = RequestStream(arrival_s=jnp.zeros(r), input_len=jnp.full(r, 10, jnp.int32),
                       output_len=jnp.full(r, 3, jnp.int32), mask=jnp.ones(r, bool))
    dur = {}
    for comm in sync.COMM_MODES:
        cfg = sync.make_config(plat, model, num_requests=r,
                               overheads=sync.SyncOverheads(comm=comm))
        system = sync.build(cfg)
        s = system.init(sync.SyncParams(), st, jax.random.key(0))
        s2, _ = jax.jit(system.step)(sync.SyncParams(), s, jnp.int32(0))
        dur[comm] = int(s2.clock - s.clock)
        assert int(s2.tokens_done.sum()) == r  # one iteration: every request one token
    # every token visits every GPU twice per block instead of only its expert's GPU
    assert dur["gather_allreduce"] > dur["all_to_all"] > 0
    with pytest.raises(ConfigError, match="comm = 'ring'; allowed: all_to_all"):
        sync.make_config(plat, model, overheads=sync.SyncOverheads(comm="ring"))


def test_catalog_policies_carry_the_calibration():
    for name in ("aep-defrag", "aep-mtfs", "aep-flfs"):
        o = dict(load_policy(name).options)
        assert o["expert_efficiency"] == pytest.approx(FIG3_EXPERT_EFFICIENCY, abs=1e-3)
        assert o["skew_scale"] == dict(load_policy("ep-sync").options)["skew_scale"]
    s, roof = dict(load_policy("ep-sync").options), dict(load_policy("ep-sync-roofline").options)
    assert s["comm"] == "gather_allreduce" and roof["comm"] == "all_to_all"
    assert roof["expert_efficiency"] == 1.0 and s["max_running"] == 4096
    tuned = dict(load_policy("aep-defrag-tuned-mixtral-8x7b-a100x8").options)
    assert tuned["lookahead"] >= 1 and 0.0 <= tuned["decay"] <= 1.0
    assert {k: v for k, v in tuned.items() if k not in ("lookahead", "decay")} == {
        k: v for k, v in dict(load_policy("aep-defrag").options).items()
        if k not in ("lookahead", "decay")}


def test_knob_choice_is_lowest_itl_within_the_throughput_share():
    rows = [{"throughput_tok_s": 100.0, "itl_mean_s": 0.20},
            {"throughput_tok_s": 99.0, "itl_mean_s": 0.10},
            {"throughput_tok_s": 90.0, "itl_mean_s": 0.05}]  # fast but drops throughput
    assert amoe_knobs.best_of(rows) is rows[1]
    assert amoe_knobs.best_of(rows[:1]) is rows[0]
    assert amoe_knobs.KnobGrid().rate == 250.0  # 002 Fig. 11: 80% throughput, top-1 medium
