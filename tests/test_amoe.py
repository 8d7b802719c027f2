"""AMoE (002): vectorized AEP event simulation vs the exact event core's plain-Python form
(`core.simulate_py`, the oracle; tests/test_amoe_core.py checks it equal to the compiled core
and to `reference.py`), and rules (the per-execution logs of `reference.py`)."""

from __future__ import annotations

import collections
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_model, make_platform

from moejax.errors import ConfigError
from moejax.runner import engine
from moejax.systems.amoe import aep, paths, reference, routing, schedulers, steady, sync
from moejax.trace.requests import request_stream

R = 10


@functools.cache
def _system(cfg):
    return paths.build(cfg)


@functools.cache
def _cached_setup(kind="switch", top_k=2, scheduler="defrag"):
    return _setup(kind, top_k, scheduler)


def _setup(kind="switch", top_k=2, scheduler="defrag", experts=4, blocks=3, **kw):
    topo = {"devices": 4} if kind == "switch" else {}
    plat = make_platform(kind, **topo)
    model = make_model(num_experts=experts, top_k=top_k, num_layers=blocks,
                       num_sparse_layers=blocks)
    cfg = aep.make_config(plat, model, scheduler=scheduler, num_requests=R, bin_s=0.01, **kw)
    return cfg


def _streams(n=2, rate=3000.0, seed=1):
    return request_stream(jax.random.key(seed), num_streams=n, num_requests=R,
                          rate_per_s=rate, input_range=(5, 20), output_range=(1, 5))


def _run(cfg, st, decay=0.5, key=2):
    params = paths.params(cfg, decay)
    keys = jax.random.split(jax.random.key(key), st.arrival_s.shape[0])
    out, state = engine.simulate(_system(cfg), params, st, keys=keys, return_state=True)
    return out, state, keys


def _oracle(cfg, st, keys, i, decay=0.5):
    """The exact core's plain-Python form on stream i (real requests: all, here)."""
    assert bool(np.asarray(st.mask[i]).all())
    seed = int(aep.stream_seed(keys[i]))
    return steady.run_open(cfg, np.asarray(st.arrival_s[i]), np.asarray(st.input_len[i]),
                           np.asarray(st.output_len[i]), seed, decay, plain=True)


def _ref(cfg, st, keys, i, decay=0.5):
    seed = int(aep.stream_seed(keys[i]))
    return reference.simulate(cfg, np.asarray(st.arrival_s[i]), np.asarray(st.input_len[i]),
                              np.asarray(st.output_len[i]), np.asarray(st.mask[i]), seed,
                              decay=decay)


@pytest.mark.parametrize("kind,top_k,scheduler", [
    ("switch", 2, "defrag"), ("switch", 2, "mtfs"), ("switch", 2, "flfs"),
    ("switch", 1, "defrag"), ("hierarchical", 2, "defrag"),
])
def test_matches_reference_exactly(scheduler, kind, top_k):
    cfg = _cached_setup(kind, top_k, scheduler)
    st = _streams()
    out, state, keys = _run(cfg, st)
    for i in range(2):
        ref = _oracle(cfg, st, keys, i)
        np.testing.assert_array_equal(np.asarray(out["completion_tick"][i]), ref["complete"])
        np.testing.assert_array_equal(np.asarray(state.first_tok[i]), ref["first_tok"])
        np.testing.assert_array_equal(np.asarray(state.rank[i]), ref["rank"])
        np.testing.assert_array_equal(np.asarray(state.busy[i]), ref["busy"])
        assert int(out["events"][i]) == ref["events"]


def test_reference_decay_not_dyadic():
    cfg = _cached_setup()
    st = _streams(2, seed=5)
    out, _, keys = _run(cfg, st, decay=0.7)
    ref = _oracle(cfg, st, keys, 0, decay=0.7)
    np.testing.assert_array_equal(np.asarray(out["completion_tick"][0]), ref["complete"])
    assert int(out["events"][0]) == ref["events"]


def test_every_token_passes_every_block_once():
    cfg = _cached_setup()
    st = _streams()
    out, state, keys = _run(cfg, st)
    nb, k = cfg.num_blocks, cfg.model.top_k
    outl = np.asarray(st.output_len)
    np.testing.assert_array_equal(np.asarray(state.tokens_done), outl)
    tok = np.asarray(state.exec_tokens)
    att = tok[:, list(cfg.attention_gpus)].sum(1)
    exp = tok[:, sorted(set(cfg.expert_gpus))].sum(1)
    np.testing.assert_array_equal(att, outl.sum(1) * nb)
    np.testing.assert_array_equal(exp, outl.sum(1) * nb * k)
    log = _ref(cfg, st, keys, 0)["log"]
    att_c = collections.Counter((r, i, b) for kind, r, i, b, *_ in log if kind == "att")
    assert set(att_c.values()) == {k}  # one attention execution, K dispatched copies
    exp_c = collections.Counter((r, i, b, kk) for kind, r, i, b, kk, *_ in log if kind == "exp")
    assert set(exp_c.values()) == {1}
    assert len(att_c) == outl[0].sum() * nb


def test_topk_merge_waits_for_all_k():
    cfg = _cached_setup(top_k=2)  # the same config (and compiled system) as the other tests
    st = _streams(2, seed=3)
    _, _, keys = _run(cfg, st)
    log = _ref(cfg, st, keys, 0)["log"]
    nb = cfg.num_blocks
    arrive = collections.defaultdict(list)
    units = collections.defaultdict(set)
    for kind, r, i, b, _k, unit, _start, _end, arr in log:
        if kind == "exp":
            arrive[(r, i, b)].append(arr)
            units[(r, i, b)].add(unit)
    for kind, r, i, b, k, _unit, start, _end, _arr in log:
        if kind != "att" or k != 0:
            continue
        prev = (r, i, b - 1) if b > 0 else (r, i - 1, nb - 1)
        if prev in arrive:
            assert len(arrive[prev]) == 2 and start >= max(arrive[prev])
    assert all(len(u) == 2 for u in units.values())  # distinct experts


def test_kv_capacity_never_exceeded():
    cfg = _setup(kv_fraction=0.9)
    need_max = 25  # input <= 20, output <= 5
    cfg = aep.AEPConfig(**{**cfg.__dict__, "kv_capacity_tokens": need_max + 10})
    st = _streams(2, rate=20000.0)
    out, state, keys = _run(cfg, st)
    assert bool(np.all(out["all_done"]))
    need = np.asarray(st.input_len + st.output_len)
    adm, rel, rank = (np.asarray(x) for x in (state.admitted, state.release, state.rank))
    for s in range(2):
        for t in adm[s]:
            for a in range(cfg.num_ranks):
                held = (rank[s] == a) & (adm[s] <= t) & (rel[s] > t)
                assert need[s][held].sum() <= cfg.kv_capacity_tokens
    assert (adm[0][1:] >= np.asarray(aep.stream_ticks(np, st.arrival_s[0]))[1:]).all()
    assert (adm[0][1:] > np.asarray(aep.stream_ticks(np, st.arrival_s[0]))[1:]).any()


def test_load_balancer_most_free_memory():
    cfg = _cached_setup()
    st = _streams(2, rate=1e6)  # all arrive at once: ranks fill alternately by free memory
    _, state, _ = _run(cfg, st)
    rank = np.asarray(state.rank[0])
    need = np.asarray(st.input_len[0] + st.output_len[0])
    used = np.zeros(cfg.num_ranks)
    for r in range(R):
        free = cfg.kv_capacity_tokens - used
        assert rank[r] == int(np.argmax(free))
        used[rank[r]] += need[r]


@functools.cache
def _sync_system():
    cfg = _cached_setup()
    return sync.build(sync.make_config(cfg.platform, cfg.model, num_requests=R, max_running=1))


@pytest.mark.parametrize("which", ["aep", "sync"])
def test_throughput_below_roofline(which):
    cfg = _cached_setup()
    st = _streams(2, rate=1e6)
    if which == "aep":
        out, _, _ = _run(cfg, st)
        gpus = len(set(cfg.expert_gpus))
    else:
        out = engine.simulate(_sync_system(), sync.SyncParams(), st)
        gpus = cfg.num_devices
    per_token = cfg.num_blocks * cfg.model.top_k * float(cfg.cost.exp_comp)
    bound = gpus / per_token
    assert (np.asarray(out["throughput_tok_s"]) <= bound).all()
    assert (np.asarray(out["throughput_tok_s"]) > 0).all()


def test_vmap_equals_per_stream_runs():
    """A vmapped batch of streams equals running each stream alone (same keys)."""
    cfg = _cached_setup()
    st = _streams(2)
    out, state, keys = _run(cfg, st)
    assert len(set(map(tuple, np.asarray(out["completion_tick"])))) == 2  # streams differ
    for i in range(2):
        one = jax.tree_util.tree_map(lambda x, i=i: x[i:i + 1], st)
        o1, s1 = engine.simulate(_system(cfg), paths.params(cfg), one, keys=keys[i:i + 1],
                                 return_state=True)
        np.testing.assert_array_equal(o1["completion_tick"][0], out["completion_tick"][i])
        np.testing.assert_array_equal(np.asarray(s1.busy[0]), np.asarray(state.busy[i]))
        assert int(o1["events"][0]) == int(out["events"][i])


def test_step_jit_equals_nojit():
    """The event step gives bit-identical states with and without jit (a few events)."""
    cfg = _cached_setup()
    st = jax.tree_util.tree_map(lambda x: x[0], _streams(1, rate=1e5))
    system = aep.build(cfg)  # the event step (path "scan")
    p = aep.AEPParams()
    a = b = system.init(p, st, jax.random.key(0))
    jstep = jax.jit(system.step)
    for t in range(2):  # an admission, then the launch of its token's attention
        a, _ = system.step(p, a, jnp.int32(t))
        b, _ = jstep(p, b, jnp.int32(t))
    assert int(a.events) == 2 and int(a.execs.sum()) == 1
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_algorithm1_scores_match_literal():
    rng = np.random.default_rng(0)
    for _ in range(20):
        q = rng.integers(0, 4, (5, 3)) * (rng.random((5, 3)) < 0.5)
        on = np.array([True, True, False])
        b, u = schedulers.select("defrag", jnp.asarray(q), jnp.asarray(on), jnp.float32(0.7), 3)
        qd = {(i, j): int(q[i, j]) for i in range(5) for j in range(3) if on[j] and q[i, j]}
        if not qd:
            continue
        assert (int(b), int(u)) == reference._algorithm1(qd, [0, 1], 5, 3, 0.7)
        bm, um = schedulers.select("mtfs", jnp.asarray(q), jnp.asarray(on), 0.5, 1)
        assert (int(bm), int(um)) == reference._mtfs(qd, [0, 1], 5)
        bf, uf = schedulers.select("flfs", jnp.asarray(q), jnp.asarray(on), 0.5, 1)
        assert (int(bf), int(uf)) == reference._flfs(qd, [0, 1], 5)


def test_routing_distinct_and_follows_popularity():
    p = np.array([[0.5, 0.25, 0.15, 0.1]])
    cdf = routing.popularity_cdf(p)
    r = np.arange(20000)
    e1 = routing.choose_experts(np, np.uint32(7), r, np.zeros_like(r), np.zeros_like(r), cdf, 1)
    freq = np.bincount(e1[:, 0], minlength=4) / r.size
    np.testing.assert_allclose(freq, p[0], atol=0.015)
    e2 = routing.choose_experts(np, np.uint32(7), r, np.zeros_like(r), np.zeros_like(r), cdf, 2)
    assert (e2[:, 0] != e2[:, 1]).all()
    j2 = routing.choose_experts(jnp, jnp.uint32(7), jnp.asarray(r), jnp.zeros(r.size, jnp.int32),
                                jnp.zeros(r.size, jnp.int32), jnp.asarray(cdf), 2)
    np.testing.assert_array_equal(np.asarray(j2), e2)


def test_sync_conservation_and_running_limit():
    cfg = _cached_setup()
    st = _streams(2, rate=1e5)  # the roofline test's system (max_running = 1), compiled once
    out = engine.simulate(_sync_system(), sync.SyncParams(), st)
    assert bool(np.all(out["all_done"]))
    np.testing.assert_array_equal(out["output_tokens"], np.asarray(st.output_len).sum(1))
    assert (np.asarray(out["mean_batch"]) <= cfg.num_devices).all()
    assert ((0 <= out["stall_fraction"]) & (out["stall_fraction"] <= 1)).all()


def test_bad_input_names_field():
    with pytest.raises(ConfigError, match="scheduler"):
        _setup(scheduler="fifo")
    with pytest.raises(ConfigError, match="expert_gpus"):
        _setup(expert_gpus=(0, 1))
    with pytest.raises(ConfigError, match="lookahead"):
        _setup(lookahead=0)
    with pytest.raises(ConfigError, match="max_running"):
        cfg = _setup()
        sync.make_config(cfg.platform, cfg.model, max_running=-1)


def test_paths_equal_event_for_event():
    """The AEP policies' option `path`: the rounds path (default), the exact numba core (one
    engine step per stream, a host callback) and the one-event-per-step scan give the same
    metrics through the engine (the core records no queue-depth series: NaN)."""
    cfg = _cached_setup()
    st = _streams(2)
    keys = jax.random.split(jax.random.key(2), 2)
    outs = {}
    for path in aep.PATHS:
        c = dataclasses.replace(cfg, path=path)
        outs[path] = engine.simulate(paths.build(c), paths.params(c, 0.7), st, keys=keys)
    for path in ("core", "scan"):
        for k, v in outs["rounds"].items():
            got = np.asarray(outs[path][k])
            if path == "core" and k == "queue_depth":
                assert np.isnan(got).all()
                continue
            np.testing.assert_array_equal(got, np.asarray(v), err_msg=f"{path}: {k}")
    with pytest.raises(ConfigError, match="path = 'bogus'; allowed: rounds, core, scan"):
        _setup(path="bogus")
