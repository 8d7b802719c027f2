"""The rounds simulation (`rounds.py`) in its callers' conventions.

`prepare` / `simulate` / `unpack`: the inputs and result tuple of `core.simulate` (open or
closed loop, one stream), so the exact CPU core and the rounds path are compared call for
call. `from_aep` / `aep_state`: the conventions of the AEP event System (`aep.build`):
request streams in seconds with a mask, routing seeds from keys, the ITL histogram on
`config.itl_bin_edges_s`, completions and queue depth per series bin, metrics by
`aep.metrics`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from moejax.errors import ConfigError
from moejax.systems.amoe import aep, config
from moejax.systems.amoe.rounds import (
    Consts,
    Spec,
    State,
    Stream,
    compiled,
    outputs,
    run,
)
from moejax.systems.amoe.rounds_ops import BIG, COST_FIELDS, I32, itl_table, local_units


def consts(gpu_of_unit, att_gpu, exp_gpu, kvcap, cost, lat, ptok, cdf, w0=0, w1=BIG,
           bin_ticks=1, itl_edges=None, series_ticks=1) -> Consts:
    i32 = functools.partial(np.asarray, dtype=np.int32)
    edges = np.zeros(0, np.int64) if itl_edges is None else np.asarray(itl_edges)
    if edges.dtype.kind == "f":  # float32 tick edges (aep.py): v >= e  <=>  v >= ceil(e)
        edges = np.ceil(edges.astype(np.float64))
    edges = np.minimum(edges, BIG).astype(np.int64)
    lo, span = itl_table(edges)
    local, lslot, nloc = local_units(gpu_of_unit, np.shape(lat)[0])
    edges = np.concatenate([edges, np.full(span + 1, BIG)]).astype(np.int32)
    return Consts(
        gpu_of_unit=i32(gpu_of_unit), att_gpu=i32(att_gpu), exp_gpu=i32(exp_gpu),
        kvcap=np.int32(min(int(kvcap), BIG)), cost=np.asarray(cost, np.float32).reshape(-1),
        lat=np.asarray(lat, np.float32), ptok=np.asarray(ptok, np.float32),
        cdf=np.asarray(cdf, np.float32), w0=np.int32(min(int(w0), BIG)),
        w1=np.int32(min(int(w1), BIG)), bin_ticks=np.int32(bin_ticks),
        itl_edges=edges, itl_lo=lo, series_ticks=np.int32(series_ticks), zero=np.int32(0),
        local=local, lslot=lslot, nloc=nloc)


def prepare(arrival, inp, outl, n_req0, closed, horizon, new_inp, new_outl,
            sched, nb_, k_, a_, d_, gpu_of_unit, att_gpu, exp_gpu, kvcap,
            cost, lat, ptok, cdf, seed, decay, lookahead, max_events, init_block, init_done,
            w0, w1, bin_ticks, itl_edges, tok_bins, itl_hist, conc_cap, *,
            sched_per_stream: bool = False, requests: int = 0, slots: int = 0,
            closed_spec: bool | None = None, compact: int | None = None):
    """(Spec, Consts, Stream) of one `core.simulate` call (see `simulate`).

    Shapes for one compilation over several calls: `requests` / `slots` raise R / C (the
    streams are padded), `closed_spec` compiles the closed loop in for open streams too,
    `sched_per_stream` takes the scheduler per stream, `compact` sets `Spec.compact`
    (default `default_compact(C)`: all rows for one stream).
    """
    if len(itl_hist) != len(itl_edges) + 1:
        raise ConfigError("itl_hist: needs len(itl_edges) + 1 bins")
    n = int(n_req0)
    r = max(int(len(arrival)), 1, int(requests))
    arr = np.zeros(r, np.int64)
    arr[:len(arrival)] = np.asarray(arrival, np.int64)
    if n and arr[:n].max() >= BIG:
        raise ConfigError(f"arrival: ticks up to {BIG} (int32 µs); got {arr[:n].max()}")
    closed = int(closed) > 0
    if closed:  # requests past the first n_req0 take new_inp / new_outl (core.simulate)
        inp = np.concatenate([np.asarray(inp)[:n], np.asarray(new_inp)[n:]])
        outl = np.concatenate([np.asarray(outl)[:n], np.asarray(new_outl)[n:]])
    cs = consts(gpu_of_unit, att_gpu, exp_gpu, kvcap, np.asarray(cost, np.float32), lat,
                ptok, cdf, w0, w1, bin_ticks, np.asarray(itl_edges, np.int64))
    spec = Spec(num_blocks=int(nb_), top_k=int(k_), num_ranks=int(a_),
                num_devices=int(d_), num_units=len(gpu_of_unit),
                slots=max(1, min(int(conc_cap), max(n, 1)), int(slots)), requests=r,
                sched=-1 if sched_per_stream else int(sched), lookahead=int(lookahead),
                tok_bins=len(tok_bins), itl_bins=len(itl_hist),
                itl_span=len(cs.itl_edges) - len(itl_hist),
                closed=closed if closed_spec is None else bool(closed_spec))
    spec = dataclasses.replace(spec, compact=default_compact(spec.slots) if compact is None
                               else int(compact))
    if closed and not spec.closed:
        raise ConfigError("closed = N: needs closed_spec (a closed-loop compilation)")

    def pad(x):
        out = np.zeros(r, np.int32)
        out[:len(x)] = np.minimum(np.asarray(x, np.int64), BIG)
        return out

    st = Stream(arrival=pad(arr), inp=pad(inp), outl=pad(outl), n_req=np.int32(n),
                seed=np.uint32(seed), decay=np.float32(decay), sched=np.int32(sched),
                max_events=np.int32(min(int(max_events), BIG)),
                closed=np.bool_(closed),
                horizon=np.int32(min(int(horizon), BIG) if closed else BIG),
                blk0=pad(init_block), done0=pad(init_done))
    return spec, cs, st


def unpack(spec: Spec, s: State, st: Stream, tok_bins=None, itl_hist=None):
    """`core.simulate`'s result tuple from a final State (int64, core.BIG for never)."""
    from moejax.systems.amoe import core  # numba: a heavy import, deliberately lazy

    n = int(s.n_req)
    complete, first, last, done = (np.asarray(x) for x in outputs(spec, s))
    s = jax.tree_util.tree_map(np.asarray, s)
    if s.overflow:
        raise ConfigError(f"conc_cap = {spec.slots}: more requests hold KV at once; raise it")
    if tok_bins is not None:
        tok_bins[:] = s.tok_bins
    if itl_hist is not None:
        itl_hist[:] = s.itl_hist

    def i64(x, big=False):
        x = np.asarray(x)[:n].astype(np.int64)
        return np.where(x >= BIG, core.BIG, x) if big else x

    return (i64(complete, True), i64(first), i64(last), i64(done), i64(s.o_rank),
            i64(s.o_admitted, True), i64(s.arr), i64(st.outl), s.busy.astype(np.int64),
            s.execs.astype(np.int64), s.ntok.astype(np.int64), int(s.events),
            int(s.clock), n, int(s.itl_sum), int(s.itl_n), int(s.exhausted))


def simulate(*args, jit: bool = True):
    """`core.simulate`'s inputs and outputs (open or closed loop), in rounds on JAX.

    `conc_cap` (the last argument) sizes the request slots (C). Ticks go through int32
    (BIG_TICK = never): arrivals past 2^31 - 1 µs (35 min) are refused. Returns core's
    tuple; `tok_bins` / `itl_hist` are filled in place.
    """
    spec, cs, st = prepare(*args)
    if jit:
        ini, adv = compiled(spec)
        s = adv(cs, st, ini(st), BIG)
    else:
        s = run(spec, cs, st)
    return unpack(spec, s, st, args[31], args[32])


def default_compact(slots: int, streams: int = 1) -> int:
    """Rows per round on the gathered path (`Spec.compact`) for C slots and a batch of
    `streams`: 0 (all rows) for one stream or up to 32 slots, else max(16, C / 32).

    Measured at C = 200 (200-request benchmark streams: 13.5 tokens moved per round on
    average, at most 16 per stream in rounds 200-400), CPU-µs per stream-round, all rows
    vs 16 gathered: 1 stream 32.7 vs 39.0 (a lone round is bound by its ~180 XLA thunks,
    and gathering adds ~25); 16 streams 27.9 vs 21.9; 128 streams 25.0 vs 20.4; 1,024
    streams 12-24 gathered rows best, 32 no better than all rows (docs/performance.md).
    """
    return 0 if streams <= 1 or slots <= 32 else max(16, slots // 32)


SCHED = {"defrag": 0, "mtfs": 1, "flfs": 2}  # Spec.sched of each scheduler


def aep_consts(cfg) -> Consts:
    """Consts of an AEPConfig in the AEP System's conventions: the ITL histogram on
    `config.itl_bin_edges_s` (float32 ticks, as aep.py bins them), completions and queue
    depth per `cfg.bin_ticks` series bin."""
    edges = config.itl_bin_edges_s() / np.float32(config.TICK_S)
    return consts(cfg.gpu_of_unit, cfg.attention_gpus, cfg.expert_gpus, cfg.kv_capacity_tokens,
                  [getattr(cfg.cost, f) for f in COST_FIELDS], cfg.lat_s, cfg.per_token_s,
                  cfg.cdf, itl_edges=edges.astype(np.float32), series_ticks=cfg.bin_ticks)


def aep_spec(cfg, requests: int, *, slots: int | None = None, compact: int = 0) -> Spec:
    """Spec of an AEPConfig's runs on streams of `requests` (C = `slots`, default R)."""
    span = len(aep_consts(cfg).itl_edges) - config.NUM_ITL_BINS
    return Spec(num_blocks=cfg.num_blocks, top_k=cfg.model.top_k, num_ranks=cfg.num_ranks,
                num_devices=cfg.num_devices, num_units=cfg.num_units,
                slots=int(slots or requests), requests=int(requests),
                sched=SCHED[cfg.scheduler], lookahead=cfg.lookahead, compact=int(compact),
                tok_bins=1, itl_bins=config.NUM_ITL_BINS, itl_span=span, series=cfg.num_bins)


def from_aep(cfg, streams, keys, decay, *, slots: int | None = None,
             compact: int | None = None):
    """(Spec, Consts, Stream [T]) of AEP runs on `streams`, as the rounds System makes
    them one stream at a time (`paths.rounds_system`), for callers that drive the rounds
    loop themselves (benchmarks/bench_amoe.py).

    streams: RequestStream leaves [T, R] (real requests a prefix, `mask`); keys [T] give
    the routing seeds (`aep.stream_seed`); decay: scalar or [T]. slots: the concurrency
    cap C (default R); compact: rows per round on the gathered path (default
    `default_compact(C, T)`).
    """
    arrival = np.asarray(aep.stream_ticks(np, np.asarray(streams.arrival_s)), np.int32)
    t_, r_ = arrival.shape
    mask = np.asarray(streams.mask, bool)
    n_req = np.where(mask.all(1), r_, np.argmin(mask, 1)).astype(np.int32)
    seeds = np.asarray(jax.vmap(aep.stream_seed)(keys), np.uint32)
    c = int(slots or r_)
    spec = aep_spec(cfg, r_, slots=c,
                    compact=default_compact(c, t_) if compact is None else int(compact))
    st = Stream(arrival=arrival, inp=np.asarray(streams.input_len, np.int32),
                outl=np.asarray(streams.output_len, np.int32), n_req=n_req, seed=seeds,
                decay=np.broadcast_to(np.asarray(decay, np.float32), (t_,)).copy(),
                sched=np.full(t_, spec.sched, np.int32), max_events=np.full(t_, BIG, np.int32),
                closed=np.zeros(t_, bool), horizon=np.full(t_, BIG, np.int32),
                blk0=np.zeros((t_, r_), np.int32),
                done0=np.zeros((t_, r_), np.int32))
    return spec, aep_consts(cfg), st


def aep_state(spec: Spec, s: State, st: Stream, mask):
    """An `aep.AEPState` of a final rounds State (the fields `aep.metrics` reads)."""
    complete, first, last, done = outputs(spec, s)
    fin = complete < BIG
    zr = jnp.zeros(spec.requests, I32)
    zrk = jnp.zeros((spec.requests, spec.top_k), I32)
    return aep.AEPState(
        arrival=st.arrival, input_len=st.inp, output_len=st.outl, mask=mask, seed=st.seed,
        clock=s.clock, next_req=s.next_req, gpu_free=s.gpu_free, rank=s.o_rank,
        admitted=s.o_admitted, phase=jnp.where(fin, 2, jnp.where(s.o_rank >= 0, 0, -1)),
        block=zr, tokens_done=done, slot_unit=zrk, slot_state=zrk, slot_ready=zrk,
        release=complete, first_tok=first, last_tok=last, complete=complete,
        itl_hist=s.itl_hist, busy=s.busy, execs=s.execs, exec_tokens=s.ntok,
        done_bins=s.done_bins, qdepth=s.qdepth, qdepth_n=s.qdepth_n, events=s.events)
