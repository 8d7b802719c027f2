"""AMoE (002) accelerator path in rounds (`systems/amoe/rounds.py`, review §7.4 B): equal to
the exact CPU core and its plain-Python form event for event; vmap == loop; jit == no-jit."""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import pytest
from conftest import make_model, make_platform

from moejax.systems.amoe import aep, core, rounds, steady
from moejax.trace.gen import request_stream

R = 12
SCHEDS = ("defrag", "mtfs", "flfs")
KEYS = ("complete", "first_tok", "last_tok", "tokens_done", "rank", "admitted", "busy",
        "execs", "exec_tokens", "events", "clock", "itl_sum", "itl_n", "tok_bins", "itl_hist")
# core.simulate's result tuple, by name (steady._call's keys)
OUT = ("complete", "first_tok", "last_tok", "tokens_done", "rank", "admitted", "arrival",
       "output_len", "busy", "execs", "exec_tokens", "events", "clock", "n_req", "itl_sum",
       "itl_n", "exhausted")


def _cfg(kind, top_k, scheduler):
    topo = {"devices": 4} if kind == "switch" else {}
    model = make_model(num_experts=4, top_k=top_k, num_layers=3, num_sparse_layers=3)
    cfg = aep.make_config(make_platform(kind, **topo), model, scheduler=scheduler,
                          num_requests=R, bin_s=0.01)
    # two nodes: KV for about one request per rank (needs 6-25), so admissions wait for releases
    return dataclasses.replace(cfg, kv_capacity_tokens=26) if kind != "switch" else cfg


def _core_runs(kind, top_k):
    """[(core result, plain result, core.simulate's args)] for 3 schedulers x 2 seeds."""
    st = request_stream(jax.random.key(1), num_streams=1, num_requests=R, rate_per_s=3000.0,
                        input_range=(5, 20), output_range=(1, 5))
    stream = [np.asarray(x[0]) for x in (st.arrival_s, st.input_len, st.output_len)]
    runs = []
    real = core.simulate
    for sched in SCHEDS:
        cfg = _cfg(kind, top_k, sched)
        for seed, decay in ((11, 0.5), (12, 0.7)):
            args = []

            def capture(*a, args=args):
                args.append(tuple(x.copy() if isinstance(x, np.ndarray) else x for x in a))
                return real(*a)

            core.simulate = capture
            try:
                fast = steady.run_open(cfg, *stream, seed, decay)
            finally:
                core.simulate = real
            # the plain-Python form is slow: once per scheduler (test_amoe_core has more)
            slow = steady.run_open(cfg, *stream, seed, decay, plain=True) if seed == 11 else None
            runs.append((fast, slow, args[0]))
    return runs


def _batch(runs):
    """(spec, consts, stacked streams) of the runs, one compilation (scheduler per stream)."""
    prepared = [rounds.prepare(*a, sched_per_stream=True) for _, _, a in runs]
    spec, cs, _ = prepared[0]
    assert all(p[0] == spec for p in prepared)
    st = jax.tree_util.tree_map(lambda *x: np.stack(x), *[p[2] for p in prepared])
    return spec, cs, st, [p[2] for p in prepared]


def _result(spec, s, st, args):
    tok = np.zeros_like(args[31])
    hist = np.zeros_like(args[32])
    res = dict(zip(OUT, rounds.unpack(spec, s, st, tok, hist), strict=True))
    res["complete"] = np.where(res["complete"] >= core.BIG, steady.BIG_TICK, res["complete"])
    res["admitted"] = np.where(res["admitted"] >= core.BIG, steady.BIG_TICK, res["admitted"])
    return {**res, "tok_bins": tok, "itl_hist": hist}


@functools.cache
def _case(kind, top_k, batched):
    """The 6 runs of a case through the rounds path: jit(vmap) or a loop of jit(one)."""
    runs = _core_runs(kind, top_k)
    spec, cs, st, streams = _batch(runs)
    ini, adv = rounds.compiled(spec, batched=batched)
    if batched:
        s = adv(cs, st, ini(st), rounds.BIG)
        outs = [jax.tree_util.tree_map(lambda x, i=i: x[i], s) for i in range(len(runs))]
    else:
        outs = [adv(cs, x, ini(x), rounds.BIG) for x in streams]
    return runs, spec, cs, streams, outs


# one compilation each (a few CPU-s): together every scheduler, top-1 and top-2, both
# platforms, KV-blocked admissions (two nodes), a stream batch and a loop of single streams
CASES = [("switch", 1, False), ("hierarchical", 2, True)]


@pytest.mark.parametrize("kind,top_k,batched", CASES)
def test_rounds_equal_core_and_plain(kind, top_k, batched):
    runs, spec, _, streams, outs = _case(kind, top_k, batched)
    for i, ((fast, slow, args), s) in enumerate(zip(runs, outs, strict=True)):
        got = _result(spec, s, streams[i], args)
        for k in KEYS:
            if slow is not None:
                np.testing.assert_array_equal(fast[k], slow[k], err_msg=f"plain {k}")
            np.testing.assert_array_equal(got[k], fast[k], err_msg=f"rounds {k} run {i}")
        assert got["tokens_done"].sum() == fast["output_len"].sum()
        assert int(s.rounds) < int(s.events)  # launches were batched into rounds
    if kind == "hierarchical":  # admissions waited for KV releases (else at arrival)
        assert any((f["admitted"] > a[0][:R]).any() for f, _, a in runs)


def test_vmap_equals_loop():
    runs, spec, cs, streams, outs = _case("hierarchical", 2, True)
    ini, adv = rounds.compiled(spec)
    for i in (1, 5):  # defrag, FLFS
        one = adv(cs, streams[i], ini(streams[i]), rounds.BIG)
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(a, b), outs[i], one)


def test_float_arithmetic_jit_equals_nojit_and_core():
    """Durations and Algorithm 1 scores: jit == eager == the core's float32 (numba/numpy).

    XLA:CPU contracts x + a * b into a fused multiply-add under jit; at n = 11, ctx = 160
    that once moved an attention launch from 152 to 151 ticks (`rounds._mul`).
    """
    cfg = _cfg("switch", 1, "defrag")
    cost = np.asarray(steady._cost(cfg), np.float32)
    n = np.arange(1, 400, dtype=np.int32)
    ctx = (n * 14.5 + 3).astype(np.int32)
    one = np.int32(0)  # Consts.zero
    f = functools.partial(rounds._layer_ticks, cost)
    for is_att in (True, False):
        got = np.asarray(jax.jit(f)(n, ctx, is_att, one))
        with jax.disable_jit():
            eager = np.asarray(f(n, ctx, is_att, one))
        ref = np.array([_core_ticks(cost, int(a), int(c), is_att) for a, c in zip(n, ctx,
                                                                                   strict=True)])
        np.testing.assert_array_equal(got, ref)
        np.testing.assert_array_equal(eager, ref)
    spec = rounds.Spec(num_blocks=5, top_k=1, num_ranks=1, num_devices=2, num_units=4,
                       slots=1, requests=1, sched=0, lookahead=3, tok_bins=1, itl_bins=1)
    q = np.random.default_rng(0).integers(0, 9, (5, 4)).astype(np.int32)
    on = np.array([[1, 1, 0, 0], [0, 0, 1, 1]], bool)
    sel = functools.partial(rounds._select, spec)
    for decay in (0.3, 0.7, 0.9):
        a = jax.jit(sel)(q, on, np.float32(decay), one, np.int32(0))
        with jax.disable_jit():
            b = sel(q, on, np.float32(decay), one, np.int32(0))
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _core_ticks(cost, n, ctx, is_att):
    """core.simulate's duration arithmetic (numpy float32, one rounding per operation)."""
    f = np.float32
    (exp_comp, exp_weight, exp_act, exp_fixed, att_comp, att_ctx_comp, att_weight, att_kv,
     att_act, att_fixed, att_per_token) = cost
    nf, cf = f(n), f(ctx)
    if is_att:
        comp = f(f(nf * att_comp) + f(cf * att_ctx_comp))
        mem = f(f(att_weight + f(cf * att_kv)) + f(nf * att_act))
        secs = f(f(max(comp, mem) + att_fixed) + f(nf * att_per_token))
    else:
        secs = f(max(f(nf * exp_comp), f(exp_weight + f(nf * exp_act))) + exp_fixed)
    return int(np.ceil(f(secs * f(1.0 / 1e-6))))
