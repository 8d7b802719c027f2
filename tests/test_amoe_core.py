"""AMoE (002) exact CPU event core: compiled == plain-Python form == reference == JAX path,
and the steady-state workload metrics (Little's law, closed loop keeps N constant)."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
from conftest import make_model, make_platform

from moejax.runner import engine
from moejax.systems.amoe import aep, paths, reference, steady
from moejax.systems.amoe.config import BIG_TICK
from moejax.trace.requests import request_stream

R = 10


@functools.cache
def _cfg(kind, top_k, scheduler):
    topo = {"devices": 4} if kind == "switch" else {}
    plat = make_platform(kind, **topo)
    model = make_model(num_experts=4, top_k=top_k, num_layers=3, num_sparse_layers=3)
    return aep.make_config(plat, model, scheduler=scheduler, num_requests=R, bin_s=0.01)


def _stream():
    st = request_stream(jax.random.key(1), num_streams=2, num_requests=R, rate_per_s=3000.0,
                        input_range=(5, 20), output_range=(1, 5))
    return st, jax.random.split(jax.random.key(2), 2)


def _jax_run(kind, top_k, scheduler):
    cfg = _cfg(kind, top_k, scheduler)
    st, keys = _stream()
    out, state = engine.simulate(paths.build(cfg), paths.params(cfg, 0.5), st, keys=keys,
                                 return_state=True)
    return jax.tree_util.tree_map(np.asarray, out), jax.tree_util.tree_map(np.asarray, state)


CASES = [(k, t, s) for k in ("switch", "hierarchical") for t in (1, 2)
         for s in ("defrag", "mtfs", "flfs")]
# the JAX path is compiled per case (seconds each); tests/test_amoe.py checks it against the
# reference on 5 more, so here one case per scheduler covers both platforms and top-1 / top-2
JAX_CASES = {("switch", 1, "defrag"), ("hierarchical", 2, "mtfs"), ("hierarchical", 1, "flfs")}


@pytest.mark.parametrize("kind,top_k,scheduler", CASES)
def test_core_equals_plain_reference_and_jax(kind, top_k, scheduler):
    cfg = _cfg(kind, top_k, scheduler)
    st, keys = _stream()
    with_jax = (kind, top_k, scheduler) in JAX_CASES
    out, state = _jax_run(kind, top_k, scheduler) if with_jax else (None, None)
    for i in range(2):
        seed = int(aep.stream_seed(keys[i]))
        args = (np.asarray(st.arrival_s[i]), np.asarray(st.input_len[i]),
                np.asarray(st.output_len[i]))
        fast = steady.run_open(cfg, *args, seed)
        slow = steady.run_open(cfg, *args, seed, plain=True)
        ref = reference.simulate(cfg, *args, np.ones(R, bool), seed)
        for k in ("complete", "first_tok", "last_tok", "tokens_done", "rank", "admitted",
                  "busy", "execs", "exec_tokens", "tok_bins", "itl_hist"):
            np.testing.assert_array_equal(fast[k], slow[k], err_msg=k)
        assert fast["events"] == slow["events"] == ref["events"]
        np.testing.assert_array_equal(fast["complete"], ref["complete"])
        np.testing.assert_array_equal(fast["first_tok"], ref["first_tok"])
        np.testing.assert_array_equal(fast["last_tok"], ref["last_tok"])
        np.testing.assert_array_equal(fast["rank"], ref["rank"])
        np.testing.assert_array_equal(fast["busy"], ref["busy"])
        assert fast["tok_bins"].sum() == np.asarray(st.output_len[i]).sum()
        if not with_jax:
            continue
        assert fast["events"] == int(out["events"][i])
        np.testing.assert_array_equal(fast["complete"], out["completion_tick"][i])
        np.testing.assert_array_equal(fast["first_tok"], state.first_tok[i])
        np.testing.assert_array_equal(fast["last_tok"], state.last_tok[i])
        np.testing.assert_array_equal(fast["busy"], state.busy[i])
        np.testing.assert_array_equal(fast["exec_tokens"], state.exec_tokens[i])


def test_decay_not_dyadic_and_closed_loop_forms_agree():
    cfg = _cfg("switch", 2, "defrag")
    a = steady.run_closed(cfg, 6, 0.004, seed=7, decay=0.7, workload=((5, 20), (1, 5)))
    b = steady.run_closed(cfg, 6, 0.004, seed=7, decay=0.7, workload=((5, 20), (1, 5)),
                          plain=True)
    for k in ("complete", "first_tok", "tokens_done", "busy", "itl_hist", "tok_bins"):
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert a["events"] == b["events"] and a["n_req"] > 6  # requests were resubmitted


@functools.cache
def _steady_cfg():
    plat = make_platform("switch", devices=4)
    model = make_model(num_experts=4, top_k=1, num_layers=4, num_sparse_layers=4)
    return aep.make_config(plat, model, scheduler="defrag", num_requests=1)


def test_closed_loop_keeps_n_constant():
    cfg = _steady_cfg()
    n = 64
    res = steady.run_closed(cfg, n, 0.5, seed=3, workload=((10, 30), (5, 15)))
    arr = np.where(np.arange(res["n_req"]) < n, 0, res["arrival"])
    comp = np.where(res["complete"] >= BIG_TICK, np.iinfo(np.int64).max, res["complete"])
    for t in np.linspace(0, res["horizon"] - 1, 23).astype(np.int64):
        assert ((arr <= t) & (comp > t)).sum() == n
    m = steady.window_metrics(cfg, res)
    assert m["concurrency"] == pytest.approx(n)
    assert res["n_req"] > 2 * n


def test_littles_law_on_the_steady_window():
    cfg = _steady_cfg()
    rng = np.random.default_rng(0)
    rate, t_arr = 3000.0, 1.0
    arrival = np.cumsum(rng.exponential(1 / rate, int(rate * t_arr)))
    inp = rng.integers(10, 31, len(arrival))
    outl = rng.integers(5, 16, len(arrival))
    res = steady.run_open(cfg, arrival, inp, outl, seed=5)
    m = steady.window_metrics(cfg, res)
    n = m["request_rate_per_s"] * (res["window"][1] - res["window"][0]) * 1e-6
    # Little's law within sampling error: relative s.e. of the mean sojourn ~ 1/sqrt(n)
    tol = 4 / np.sqrt(n) + 0.05
    assert m["little_n"] == pytest.approx(m["concurrency"], rel=tol)
    assert m["concurrency"] > 10  # queues actually hold tokens
    assert m["throughput_tok_s"] == pytest.approx(m["offered_tok_s"], rel=0.15)
    assert 0 < m["finished_at_last_arrival"] < 1
    assert m["itl_mean_s"] <= m["itl_p99_s"]


@pytest.mark.parametrize("layers,lookahead", [(70, 3), (3, 5)])
def test_many_blocks_and_lookahead_wrap(layers, lookahead):
    """The core's block bitmask spans two 64-bit words past 64 blocks, and the lookahead
    wraps around NB more than once when it exceeds NB: compiled == plain == reference for
    each scheduler (open loop), and compiled == plain from a spread closed-loop start."""
    plat = make_platform("switch", devices=4)
    model = make_model(num_experts=4, top_k=2, num_layers=layers, num_sparse_layers=layers)
    # staggered arrivals (2 ms apart, ~1/7 of a 70-block pass): at 70 blocks, ~7 % of the
    # scheduling decisions see tokens in blocks below and above 64 on one GPU
    r = 6
    args = (np.arange(r) * 0.002, 5 + np.arange(r) % 7, 1 + np.arange(r) % 2)
    for scheduler in ("defrag", "mtfs", "flfs"):
        cfg = aep.make_config(plat, model, scheduler=scheduler, num_requests=r,
                              lookahead=lookahead, bin_s=0.01)
        fast = steady.run_open(cfg, *args, 11, 0.7)
        slow = steady.run_open(cfg, *args, 11, 0.7, plain=True)
        ref = reference.simulate(cfg, *args, np.ones(r, bool), 11, decay=0.7)
        for k in ("complete", "first_tok", "last_tok", "rank", "busy", "execs", "exec_tokens"):
            np.testing.assert_array_equal(fast[k], slow[k], err_msg=k)
        assert fast["events"] == slow["events"] == ref["events"]
        for k in ("complete", "first_tok", "last_tok", "rank", "busy"):
            np.testing.assert_array_equal(fast[k], ref[k], err_msg=k)
    a = steady.run_closed(cfg, 8, 0.01, seed=5, decay=0.7, workload=((5, 20), (1, 3)))
    b = steady.run_closed(cfg, 8, 0.01, seed=5, decay=0.7, workload=((5, 20), (1, 3)),
                          plain=True)
    for k in ("complete", "first_tok", "tokens_done", "busy", "itl_hist", "tok_bins"):
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert a["events"] == b["events"]


@pytest.mark.parametrize("decay", [1e9, np.inf])
def test_algorithm1_large_and_nan_scores(decay):
    """Scores past 2^22 (float32 steps over 1/4: decay 1e9) or NaN (decay = inf: 0 x inf)
    take the reference's scan of every unit instead of the core's one comparison per block:
    compiled == plain == reference (the NaN case fails if the shortcut is taken there)."""
    cfg = _cfg("hierarchical", 2, "defrag")
    st, keys = _stream()
    args = tuple(np.asarray(x[0]) for x in (st.arrival_s, st.input_len, st.output_len))
    seed = int(aep.stream_seed(keys[0]))
    with np.errstate(all="ignore"):
        fast = steady.run_open(cfg, *args, seed, decay)
        slow = steady.run_open(cfg, *args, seed, decay, plain=True)
        ref = reference.simulate(cfg, *args, np.ones(R, bool), seed, decay=decay)
    assert fast["events"] == slow["events"] == ref["events"]
    for k in ("complete", "first_tok", "last_tok", "rank", "busy"):
        np.testing.assert_array_equal(fast[k], slow[k], err_msg=k)
        np.testing.assert_array_equal(fast[k], ref[k], err_msg=k)
