"""Synchronous EP: reference equality, vmap == loop, jit == no-jit, bounds, conservation."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_model, make_platform, random_trace

from moejax.physics import collectives
from moejax.runner import engine
from moejax.systems import ep, ep_reference
from moejax.trace import from_counts

KINDS = ["mesh2d", "ring", "switch", "hierarchical", "multi_wafer_mesh"]


def _setup(kind="mesh2d", shared=0, attention="dp", tp=1, iters=2, **model_kw):
    return _built(kind, shared, attention, tp, iters, tuple(sorted(model_kw.items())))


@functools.cache
def _built(kind, shared, attention, tp, iters, model_kw):
    """One System object per setup: the engine caches its compiled run by the System, so
    tests of the default setup whose traces share a shape share one compile (below: traces
    of [5 or 2, 2, 2, 16] wherever the test allows)."""
    cfg = ep.make_config(make_platform(kind), make_model(shared=shared, **dict(model_kw)),
                         attention=attention, tp_size=tp)
    return cfg, ep.build(cfg, iters), ep.default_params(cfg)


@pytest.mark.parametrize("kind", KINDS)
def test_matches_plain_reference(kind):
    cfg, system, params = _setup(kind, shared=1)
    tr = random_trace(jax.random.key(1), 3, 2, 2, 24, 16, 2, valid=[[24, 17]] * 3)
    out = engine.simulate(system, params, tr)
    ref = ep_reference.layer_latency(cfg, params.placement, tr.expert_ids, tr.token_mask,
                                     tr.counts)
    np.testing.assert_allclose(np.asarray(out["latency_s"]), ref, rtol=2e-5)


def test_counts_only_trace_matches_reference():
    cfg, system, params = _setup()
    tr = random_trace(jax.random.key(2), 1, 2, 2, 32, 16, 2)
    counts_only = from_counts(np.asarray(tr.counts[0]), top_k=2)
    batch = jax.tree_util.tree_map(lambda x: x[None], counts_only)
    out = engine.simulate(system, params, batch)
    ref = ep_reference.layer_latency(cfg, params.placement, batch.expert_ids,
                                     batch.token_mask, batch.counts)
    np.testing.assert_allclose(np.asarray(out["latency_s"]), ref, rtol=2e-5)


def test_vmap_equals_loop_of_single_runs():
    _, system, params = _setup()
    tr = random_trace(jax.random.key(3), 5, 2, 2, 16, 16, 2)
    batched = engine.simulate(system, params, tr)
    # the single runs compiled once (an eager run_one compiles its scan again on every call)
    one_run = jax.jit(lambda trace: engine.run_one(system, params, trace, jax.random.key(0)))
    for t in range(5):
        one = one_run(tr[t])
        np.testing.assert_allclose(batched["latency_s"][t], one["latency_s"], rtol=1e-6)
        np.testing.assert_allclose(batched["link_bytes"][t], one["link_bytes"], rtol=1e-6)


def test_jit_equals_no_jit():
    _, system, params = _setup("switch")
    tr = random_trace(jax.random.key(4), 1, 2, 2, 16, 16, 2)[0]

    def f(p, t):
        return engine.run_one(system, p, t, jax.random.key(0))

    np.testing.assert_allclose(jax.jit(f)(params, tr)["latency_s"], f(params, tr)["latency_s"],
                               rtol=1e-6)


def test_sweep_over_params_equals_separate_runs():
    cfg, system, params = _setup()
    tr = random_trace(jax.random.key(5), 2, 2, 2, 16, 16, 2)
    rr = ep.EPParams(placement=ep.round_robin_placement(16, 4))
    both = engine.simulate(system, engine.stack_params([params, rr]), tr, sweep=True)
    assert both["latency_s"].shape == (2, 2)
    np.testing.assert_allclose(both["latency_s"][1],
                               engine.simulate(system, rr, tr)["latency_s"], rtol=1e-6)


def test_chunked_run_equals_one_call():
    _, system, params = _setup()
    tr = random_trace(jax.random.key(6), 5, 2, 2, 16, 16, 2)
    a = engine.simulate(system, params, tr)
    b = engine.simulate(system, params, tr, chunk_size=2, progress=False)  # 2 + 2 + 1
    np.testing.assert_allclose(a["latency_s"], b["latency_s"], rtol=1e-6)


def test_latency_above_compute_memory_and_link_bounds():
    cfg, system, params = _setup("mesh2d")
    tr = random_trace(jax.random.key(7), 8, 1, 1, 64, 16, 2)
    out = engine.simulate(system, params, tr)
    m, dev = cfg.model, cfg.platform.device
    total_flops = np.asarray(tr.counts).sum((1, 2, 3)) * m.expert_flops_per_token
    compute_bound = total_flops / cfg.num_devices / dev.flops("bf16")
    active = (np.asarray(tr.counts)[:, 0, 0] > 0).sum(-1)
    memory_bound = active * m.expert_weight_bytes / cfg.num_devices / dev.memory_Bps
    link_bound = np.asarray(out["link_bytes"]).max(-1) / cfg.topo.link_Bps.max() / 2
    lat = np.asarray(out["latency_s"])
    assert (lat >= compute_bound).all() and (lat >= memory_bound).all()
    assert (lat >= link_bound).all()
    u = np.asarray(out["utilization"])
    assert ((u >= 0) & (u <= 1)).all()


def test_bytes_moved_equal_bytes_needed():
    """Conservation: dispatch moves each remote (token, expert) pair exactly once."""
    cfg, _, params = _setup("switch")
    tr = random_trace(jax.random.key(8), 1, 1, 1, 32, 16, 2)[0]
    ids, mask, counts = tr.expert_ids[0, 0], tr.token_mask[0], tr.counts[0, 0]
    traffic, tokens_de = ep.layer_demand(cfg, params, ids, mask, counts)
    owner = ep.token_owner(cfg, 32)
    dev_of_expert = np.asarray(params.placement).argmax(1)
    remote = (dev_of_expert[np.asarray(ids)] != owner[:, None]).sum()
    assert float(traffic.sum() - jnp.trace(traffic)) == pytest.approx(
        remote * cfg.model.token_bytes)
    assert float(tokens_de.sum()) == 32 * 2  # every (token, expert) pair computed once
    # on a switch, bytes over the uplinks == bytes sent remotely
    loads = np.asarray(cfg.topo.link_loads(traffic))
    assert loads[:4].sum() == pytest.approx(remote * cfg.model.token_bytes)


def test_relaxed_converges_to_hard_and_has_gradients():
    cfg, system, params = _setup()
    tr = random_trace(jax.random.key(9), 2, 2, 2, 16, 16, 2)
    hard = np.asarray(engine.simulate(system, params, tr)["latency_s"])
    errs = []
    for tau in (1e-3, 1e-5, 1e-7):
        p = params.replace(tau=jnp.float32(tau))
        errs.append(np.abs(np.asarray(engine.simulate(system, p, tr)["latency_s"]) - hard).max())
    assert errs[-1] < 1e-3 * hard.max() and errs[-1] <= errs[0]

    def loss(logits):
        p = ep.EPParams(placement=jax.nn.softmax(logits, -1), tau=jnp.float32(1e-4))
        return engine.run_one(system, p, tr[0], jax.random.key(0))["latency_s"]

    g = jax.jit(jax.grad(loss))(jnp.log(params.placement + 1e-3))  # one compile, not op-by-op
    assert np.isfinite(np.asarray(g)).all() and np.abs(np.asarray(g)).sum() > 0


def test_tp_attention_adds_an_all_reduce():
    cfg_dp, _, _ = _setup("switch")
    cfg_tp, _, _ = _setup("switch", attention="tp", tp=2)
    t_dp, _ = ep.attention_time_s(cfg_dp, 64.0, 0.0)
    t_tp, _ = ep.attention_time_s(cfg_tp, 64.0, 0.0)
    ar = collectives.all_reduce_time_s(32 * cfg_tp.model.token_bytes, cfg_tp.tp_groups,
                                       cfg_tp.topo)
    assert float(ar) > 0 and float(t_tp) >= float(ar)
    assert float(t_tp) != pytest.approx(float(t_dp))


def test_bad_placement_and_options():
    from moejax.errors import ConfigError

    with pytest.raises(ConfigError, match="placement"):
        ep.check_placement(np.ones((16, 3)), 16, 4)
    with pytest.raises(ConfigError, match="tp_size"):
        ep.make_config(make_platform(), make_model(), attention="tp", tp_size=3)
    with pytest.raises(ConfigError, match="attention"):
        ep.make_config(make_platform(), make_model(), attention="pp")


def test_replicated_placement_matches_reference():
    cfg, system, params = _setup()
    e, d = cfg.model.num_experts, cfg.num_devices
    place = np.asarray(params.placement).copy()
    place[:3] = 1.0 / d  # three experts replicated on every device, tokens split evenly
    params = params.replace(placement=jnp.asarray(place))
    tr = random_trace(jax.random.key(5), 2, 2, 2, 16, e, 2)
    out = engine.simulate(system, params, tr)
    ref = ep_reference.layer_latency(cfg, params.placement, tr.expert_ids, tr.token_mask,
                                     tr.counts)
    np.testing.assert_allclose(np.asarray(out["latency_s"]), ref, rtol=2e-5)

