"""AMoE (002) accelerator path in rounds (`systems/amoe/rounds.py`, review §7.4 B): equal to
the exact CPU core and its plain-Python form event for event, open loops and closed loops
(spread and aligned starts; the closed loop keeps N requests in the system); vmap == loop;
jit == no-jit."""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import pytest
from conftest import make_model, make_platform

from moejax.systems.amoe import aep, core, rounds, rounds_io, rounds_ops, steady
from moejax.trace.requests import request_stream

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


N, HORIZON_S = 6, 0.008  # closed loops: N requests kept in the system for 8 ms


def _capture(run, *a, plain=False, **kw):
    """(result, core.simulate's args) of one steady.run_* call."""
    args = []
    real = core.simulate

    def capture(*x):
        args.append(tuple(v.copy() if isinstance(v, np.ndarray) else v for v in x))
        return real(*x)

    core.simulate = capture
    try:
        fast = run(*a, **kw)
    finally:
        core.simulate = real
    return fast, args[0]


def _core_runs(kind, top_k):
    """[(core result, plain result or None, core.simulate's args, closed)]: per scheduler,
    2 open streams (seeds / decays 0.5 and 0.7) and 2 closed loops (spread, aligned)."""
    st = request_stream(jax.random.key(1), num_streams=1, num_requests=R, rate_per_s=3000.0,
                        input_range=(5, 20), output_range=(1, 5))
    stream = [np.asarray(x[0]) for x in (st.arrival_s, st.input_len, st.output_len)]
    runs = []
    for sched in SCHEDS:
        cfg = _cfg(kind, top_k, sched)
        for seed, decay in ((11, 0.5), (12, 0.7)):
            fast, args = _capture(steady.run_open, cfg, *stream, seed, decay)
            # the plain-Python form is slow: once per scheduler (test_amoe_core has more)
            slow = steady.run_open(cfg, *stream, seed, decay, plain=True) if seed == 11 else None
            runs.append((fast, slow, args, False))
        for spread, decay in ((True, 0.7), (False, 0.5)):
            kw = dict(workload=((5, 20), (1, 5)), spread=spread)
            fast, args = _capture(steady.run_closed, cfg, N, HORIZON_S, 13, decay, **kw)
            slow = (steady.run_closed(cfg, N, HORIZON_S, 13, decay, plain=True, **kw)
                    if spread and sched == "defrag" else None)
            runs.append((fast, slow, args, True))
    return runs


COMPACT = 2  # rows per round on the gathered path: tiny, so rounds take both paths
SERIES = 8  # series bins (Spec.series)


def _prepare(runs):
    """(spec, [(consts, stream)]) of the runs, one compilation: shapes padded to the largest
    (R, C, token bins), scheduler per stream, the closed loop compiled in, rounds on the
    gathered rows (`Spec.compact`) or, with more moving rows, all rows."""
    r = max(len(a[0]) for _, _, a, _ in runs)
    c = max(a[33] for _, _, a, _ in runs)  # conc_cap
    tb = max(len(a[31]) for _, _, a, _ in runs)
    prepared = [rounds_io.prepare(*a[:31], np.zeros(tb, np.int64), *a[32:], sched_per_stream=True,
                               requests=r, slots=c, closed_spec=True, compact=COMPACT)
                for _, _, a, _ in runs]
    spec = prepared[0][0]
    assert all(p[0] == spec for p in prepared) and spec.closed and spec.compact == COMPACT
    # aep.metrics' series compiled in (completions and queue depth per 1 ms bin), so the
    # one-stream form's conds on them run (`test_vmap_equals_loop`)
    spec = dataclasses.replace(spec, series=SERIES)
    return spec, [(cs.replace(series_ticks=np.int32(1000)), st) for _, cs, st in prepared]


def _result(spec, s, st, args):
    tok = np.zeros(spec.tok_bins, np.int64)
    hist = np.zeros_like(args[32])
    res = dict(zip(OUT, rounds_io.unpack(spec, s, st, tok, hist), strict=True))
    res["complete"] = np.where(res["complete"] >= core.BIG, steady.BIG_TICK, res["complete"])
    res["admitted"] = np.where(res["admitted"] >= core.BIG, steady.BIG_TICK, res["admitted"])
    return {**res, "tok_bins": tok[:len(args[31])], "itl_hist": hist}


def _stack(items):
    return jax.tree_util.tree_map(lambda *x: np.stack(x), *items)


@functools.cache
def _case(kind, top_k, batched):
    """The 12 runs of a case through the rounds path: jit(vmap) (open and closed streams in
    two batches: their Consts differ) or a loop of jit(one)."""
    runs = _core_runs(kind, top_k)
    spec, cs_st = _prepare(runs)
    ini, adv = rounds.compiled(spec, batched=batched)
    if not batched:
        return runs, spec, cs_st, [adv(cs, x, ini(x), rounds.BIG) for cs, x in cs_st]
    outs = [None] * len(runs)
    for closed in (False, True):
        idx = [i for i, r in enumerate(runs) if r[3] == closed]
        cs = cs_st[idx[0]][0]
        for i in idx:  # one window and cost table per group
            jax.tree_util.tree_map(np.testing.assert_array_equal, cs_st[i][0], cs)
        st = _stack([cs_st[i][1] for i in idx])
        s = adv(cs, st, ini(st), rounds.BIG)
        for j, i in enumerate(idx):
            outs[i] = jax.tree_util.tree_map(lambda x, j=j: x[j], s)
    return runs, spec, cs_st, outs


# one compilation each (a few CPU-s): together every scheduler, top-1 and top-2, both
# platforms, open and closed loops (spread and aligned starts), KV-blocked admissions (two
# nodes), a stream batch and a loop of single streams
CASES = [("switch", 1, False), ("hierarchical", 2, True)]


@pytest.mark.parametrize("kind,top_k,batched", CASES)
def test_rounds_equal_core_and_plain(kind, top_k, batched):
    runs, spec, cs_st, outs = _case(kind, top_k, batched)
    wide = narrow = 0  # rounds with more / at most COMPACT moving rows (per stream)
    for i, ((fast, slow, args, closed), s) in enumerate(zip(runs, outs, strict=True)):
        got = _result(spec, s, cs_st[i][1], args)
        for k in KEYS + ("n_req", "arrival", "output_len", "exhausted"):
            if slow is not None:
                np.testing.assert_array_equal(fast[k], slow[k], err_msg=f"plain {k}")
            np.testing.assert_array_equal(got[k], fast[k], err_msg=f"rounds {k} run {i}")
        assert int(s.rounds) < int(s.events)  # launches were batched into rounds
        wide += int(s.wide)
        narrow += int(s.rounds) - int(s.wide)
        if not closed:
            assert got["tokens_done"].sum() == fast["output_len"].sum()
            continue
        assert got["n_req"] >= N + 4 and not got["exhausted"]  # requests were resubmitted
        # the closed loop keeps N requests in the system (arrived, not completed)
        arr = np.where(np.arange(got["n_req"]) < N, 0, got["arrival"])
        for t in np.linspace(0, fast["horizon"] - 1, 17).astype(np.int64):
            assert ((arr <= t) & (got["complete"] > t)).sum() == N
    # both paths ran: the gathered rows (a loop of single streams takes it whenever the
    # stream's moving rows fit) and the fallback to all rows
    assert wide > 0 and narrow > 0
    if kind == "hierarchical":  # admissions waited for KV releases (else at arrival)
        assert any((f["admitted"] > a[0][:len(f["admitted"])]).any() for f, _, a, _ in runs)
    # the spread start began requests mid-way (tokens already done, blocks > 0)
    spread = [a for _, _, a, c in runs if c and len(a[25])]  # init_block, init_done
    assert spread and all(a[25].any() and a[26].any() for a in spread)


def test_vmap_equals_loop():
    """jit(vmap) == a loop of the one-stream compilation on every State field (the
    one-stream form skips, under `lax.cond`, the histograms in rounds that emit nothing and
    the queue-depth sample when unit 0's GPU does not launch; the batch does not)."""
    runs, spec, cs_st, outs = _case("hierarchical", 2, True)
    ini, adv = rounds.compiled(spec)
    for i in (1, 2, 11):  # defrag open / closed spread, FLFS closed aligned
        cs, st = cs_st[i]
        one = adv(cs, st, ini(st), rounds.BIG)
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(a, b), outs[i], one)
        # unit 0's GPU launched in some rounds, not in all; completions fell in >1 bin
        assert 0 < int(one.qdepth_n.sum()) < int(one.rounds)
        assert int(one.done_bins.sum()) == int(one.finished)
        assert (np.asarray(one.done_bins) > 0).sum() > 1


def test_float_arithmetic_jit_equals_nojit_and_core():
    """Durations and Algorithm 1 scores: jit == eager == the core's float32 (numba/numpy).

    XLA:CPU contracts x + a * b into a fused multiply-add under jit; at n = 11, ctx = 160
    that once moved an attention launch from 152 to 151 ticks (`rounds_ops._mul`).
    """
    cfg = _cfg("switch", 1, "defrag")
    cost = np.asarray(steady._cost(cfg), np.float32)
    n = np.arange(1, 400, dtype=np.int32)
    ctx = (n * 14.5 + 3).astype(np.int32)
    one = np.int32(0)  # Consts.zero
    f = functools.partial(rounds_ops._layer_ticks, cost)
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
    local, _, nloc = rounds_ops.local_units([0, 0, 1, 1], 2)  # GPU 0: units 0, 1; GPU 1: 2, 3
    qm = np.concatenate([q, np.zeros((5, 1), np.int32)], 1)[:, local].transpose(1, 0, 2)
    sel = functools.partial(rounds_ops._select, spec)
    for decay in (0.3, 0.7, 0.9):
        a = jax.jit(sel)(qm, nloc, np.float32(decay), one, np.int32(0))
        with jax.disable_jit():
            b = sel(qm, nloc, np.float32(decay), one, np.int32(0))
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
