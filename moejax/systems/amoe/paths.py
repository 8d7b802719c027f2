"""The AEP serving simulation (002 §3) as an engine System, by path (`AEPConfig.path`).

The three paths run the same rules and give the same metrics event for event
(tests/test_amoe_core.py, tests/test_amoe_rounds.py); the AEP policies choose one with the
option `path`:

* "rounds" (default): rounds of launches inside an exact lookahead window (`rounds.py`), in
  JAX; one engine step runs up to `ROUNDS_PER_STEP` rounds, vmapped over the streams with
  the engine's named batch axis, so the round loops run as one loop for the batch;
* "core": the exact event core (`core.py`, numba, O(batch) work per event), the CPU path;
  one engine step runs a whole stream through a host callback;
* "scan": one event per engine step (`aep.build`), the plain vectorized form of the rules.

`params(cfg, decay)` gives the params of every path (`AEPParams` with the rounds path's
per-configuration arrays).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from moejax.errors import ConfigError
from moejax.system import BATCH_AXIS, System
from moejax.systems.amoe import aep, config, rounds, rounds_io
from moejax.systems.amoe.rounds_ops import BIG

# Rounds per engine step on the rounds path: the host checks between steps whether every
# stream is done (one check per 65,536 rounds, as the rounds loop always did).
ROUNDS_PER_STEP = 1 << 16


def build(cfg: aep.AEPConfig) -> System:
    """The engine System of `cfg` on its path (`cfg.path`: rounds, core or scan)."""
    if cfg.path == "rounds":
        return rounds_system(cfg)
    if cfg.path == "core":
        return core_system(cfg)
    return aep.build(cfg)


def params(cfg: aep.AEPConfig, decay=0.5) -> aep.AEPParams:
    """AEPParams of `cfg` for every path: Algorithm 1's delta and the rounds path's
    per-configuration arrays (`rounds.Consts`)."""
    return aep.AEPParams(decay=jnp.float32(decay), consts=rounds_io.aep_consts(cfg))


@dataclasses.dataclass(frozen=True)
class Layout:
    """The placement `aep.metrics` reads (hashable: systems of equal layout and Spec share
    one compiled program)."""

    num_devices: int
    attention_gpus: tuple[int, ...]
    expert_gpus: tuple[int, ...]


def _layout(cfg: aep.AEPConfig) -> Layout:
    return Layout(cfg.num_devices, tuple(cfg.attention_gpus), tuple(cfg.expert_gpus))


def _check_stream(stream, r_: int) -> None:
    if stream.arrival_s.shape != (r_,):
        raise ConfigError(f"stream: expected {r_} requests (num_requests), got "
                          f"{stream.arrival_s.shape}")


# --- rounds ------------------------------------------------------------------------------


@struct.dataclass
class RoundsCarry:
    """State of the rounds System: the rounds State, its stream's inputs and the mask of
    real requests. The per-request results read under `aep.AEPState`'s names (final once
    the stream is done: each step writes the requests still in slots to the outputs)."""

    s: rounds.State
    st: rounds.Stream
    mask: jax.Array

    @property
    def first_tok(self):
        return self.s.o_first

    @property
    def last_tok(self):
        return self.s.o_last

    @property
    def tokens_done(self):
        return self.s.o_done

    @property
    def complete(self):
        return self.s.o_complete

    release = complete

    @property
    def rank(self):
        return self.s.o_rank

    @property
    def admitted(self):
        return self.s.o_admitted

    @property
    def busy(self):
        return self.s.busy

    @property
    def execs(self):
        return self.s.execs

    @property
    def exec_tokens(self):
        return self.s.ntok

    @property
    def events(self):
        return self.s.events


def rounds_system(cfg: aep.AEPConfig) -> System:
    """The rounds path of `cfg`: one System per (Spec, placement, scheduler), so design
    points that differ only in platform values (`params.consts`) share one program."""
    return _rounds_system(rounds_io.aep_spec(cfg, cfg.num_requests), _layout(cfg),
                          f"aep-{cfg.scheduler}")


@functools.lru_cache(maxsize=64)
def _rounds_system(spec0: rounds.Spec, layout: Layout, name: str) -> System:
    r_ = spec0.requests

    def spec_here():
        """Spec with the gathered-rows width for this batch (`rounds_io.default_compact`)."""
        n = jax.lax.axis_size(BATCH_AXIS)
        return dataclasses.replace(spec0, compact=rounds_io.default_compact(spec0.slots, n))

    def init(p: aep.AEPParams, stream, key) -> RoundsCarry:
        _check_stream(stream, r_)
        mask = stream.mask.astype(bool)
        zr = jnp.zeros(r_, jnp.int32)
        st = rounds.Stream(
            arrival=aep.stream_ticks(jnp, stream.arrival_s),
            inp=stream.input_len.astype(jnp.int32), outl=stream.output_len.astype(jnp.int32),
            n_req=jnp.where(mask.all(), r_, jnp.argmin(mask)).astype(jnp.int32),
            seed=aep.stream_seed(key), decay=jnp.asarray(p.decay, jnp.float32),
            sched=jnp.int32(spec0.sched), max_events=jnp.int32(BIG), closed=jnp.bool_(False),
            horizon=jnp.int32(BIG), blk0=zr, done0=zr)
        return RoundsCarry(s=rounds.init(spec0, st), st=st, mask=mask)

    def step(p: aep.AEPParams, c: RoundsCarry, t):
        del t
        if p.consts is None:
            raise ConfigError("params.consts: the rounds path needs its per-configuration "
                              "arrays; make params with `paths.params(cfg, decay)`")
        spec = spec_here()
        s = rounds.advance(spec, p.consts, c.st, c.s, c.s.rounds + ROUNDS_PER_STEP,
                           axis=BATCH_AXIS)
        complete, first, last, done = rounds.outputs(spec, s)
        s = s.replace(o_complete=complete, o_first=first, o_last=last, o_done=done)
        return c.replace(s=s), None

    def is_done(c: RoundsCarry):
        return c.s.stop

    def finish(p: aep.AEPParams, c: RoundsCarry, outs):
        del outs
        return aep.metrics(layout, rounds_io.aep_state(spec0, c.s, c.st, c.mask))

    return System(name=name, init=init, step=step, finish=finish, num_steps=1,
                  is_done=is_done)


# --- core --------------------------------------------------------------------------------


@struct.dataclass
class CoreCarry:
    """State of the core System: the stream, and the core's per-request results [R] and
    per-GPU counters [D] once its one step has run (int32 ticks, BIG_TICK for never)."""

    arrival: jax.Array
    input_len: jax.Array
    output_len: jax.Array
    mask: jax.Array
    seed: jax.Array
    complete: jax.Array
    first_tok: jax.Array
    last_tok: jax.Array
    tokens_done: jax.Array
    rank: jax.Array
    admitted: jax.Array
    busy: jax.Array
    execs: jax.Array
    exec_tokens: jax.Array
    itl_hist: jax.Array
    events: jax.Array
    done: jax.Array

    @property
    def release(self):
        return self.complete


_CORE_OUT = ("complete", "first_tok", "last_tok", "tokens_done", "rank", "admitted", "busy",
             "execs", "exec_tokens", "itl_hist", "events")


def run_core(cfg: aep.AEPConfig, arrival, input_len, output_len, n_req, seed, decay):
    """The exact core on one stream's first `n_req` requests, in the AEP System's
    conventions: int32 [R] per-request results (BIG_TICK for never), [D] counters, the
    ITL histogram on `config.itl_bin_edges_s`, the event count (`_CORE_OUT` order)."""
    from moejax.systems.amoe import core  # numba: a heavy import, deliberately lazy

    r_, n = len(arrival), int(n_req)
    arr = np.asarray(arrival, np.int64)[:n]
    inp = np.asarray(input_len, np.int64)[:n].copy()
    outl = np.asarray(output_len, np.int64)[:n].copy()
    cs = rounds_io.aep_consts(cfg)
    edges = np.asarray(cs.itl_edges[:config.NUM_ITL_BINS - 1], np.int64)
    itl_hist = np.zeros(config.NUM_ITL_BINS, np.int64)
    z = np.zeros(0, np.int64)
    out = core.simulate(
        arr, inp, outl, n, 0, 0, inp, outl, rounds_io.SCHED[cfg.scheduler], cfg.num_blocks,
        cfg.model.top_k, cfg.num_ranks, cfg.num_devices, np.asarray(cfg.gpu_of_unit, np.int64),
        np.asarray(cfg.attention_gpus, np.int64), np.asarray(cfg.expert_gpus, np.int64),
        int(cfg.kv_capacity_tokens), tuple(np.float32(c) for c in cs.cost),
        np.asarray(cfg.lat_s, np.float32), np.asarray(cfg.per_token_s, np.float32),
        np.asarray(cfg.cdf, np.float32), np.uint32(seed), np.float32(decay),
        int(cfg.lookahead), 2**62, z, z, 0, int(BIG), 1, edges, np.zeros(1, np.int64),
        itl_hist, max(n, 1))
    complete, first, last, done, rank, admitted = out[:6]
    busy, execs, ntok, events = out[8:12]

    def per_request(x, fill, big=False):
        y = np.full(r_, fill, np.int32)
        x = np.asarray(x[:n], np.int64)
        y[:n] = np.where(x >= core.BIG, BIG, x) if big else x
        return y

    i32 = functools.partial(np.asarray, dtype=np.int32)
    return (per_request(complete, BIG, True), per_request(first, 0), per_request(last, 0),
            per_request(done, 0), per_request(rank, -1), per_request(admitted, BIG, True),
            i32(busy), i32(execs), i32(ntok), i32(itl_hist), np.int32(events))


def core_system(cfg: aep.AEPConfig) -> System:
    """The core path of `cfg`: one step runs each stream through the numba core (a host
    callback, one stream after another under vmap). `queue_depth` is not recorded on this
    path (NaN); every other metric equals the rounds path's."""
    r_, d_ = cfg.num_requests, cfg.num_devices
    i32 = jnp.int32
    shapes = tuple(jax.ShapeDtypeStruct(s, i32) for s in (
        (r_,), (r_,), (r_,), (r_,), (r_,), (r_,), (d_,), (d_,), (d_,),
        (config.NUM_ITL_BINS,), ()))

    def init(p: aep.AEPParams, stream, key) -> CoreCarry:
        _check_stream(stream, r_)
        zr, zd = jnp.zeros(r_, i32), jnp.zeros(d_, i32)
        return CoreCarry(
            arrival=aep.stream_ticks(jnp, stream.arrival_s),
            input_len=stream.input_len.astype(i32), output_len=stream.output_len.astype(i32),
            mask=stream.mask.astype(bool), seed=aep.stream_seed(key), complete=zr + BIG,
            first_tok=zr, last_tok=zr, tokens_done=zr, rank=zr - 1, admitted=zr + BIG,
            busy=zd, execs=zd, exec_tokens=zd, itl_hist=jnp.zeros(config.NUM_ITL_BINS, i32),
            events=i32(0), done=jnp.bool_(False))

    def step(p: aep.AEPParams, c: CoreCarry, t):
        del t
        n_req = jnp.where(c.mask.all(), r_, jnp.argmin(c.mask)).astype(i32)
        res = jax.pure_callback(functools.partial(run_core, cfg), shapes, c.arrival,
                                c.input_len, c.output_len, n_req, c.seed,
                                jnp.asarray(p.decay, jnp.float32), vmap_method="sequential")
        return c.replace(**dict(zip(_CORE_OUT, res, strict=True)), done=jnp.bool_(True)), None

    def is_done(c: CoreCarry):
        return c.done

    def finish(p: aep.AEPParams, c: CoreCarry, outs):
        del outs
        fin = c.complete < BIG
        tb = jnp.clip(c.complete // cfg.bin_ticks, 0, cfg.num_bins - 1)
        zr = jnp.zeros(r_, i32)
        zrk = jnp.zeros((r_, cfg.model.top_k), i32)
        state = aep.AEPState(
            arrival=c.arrival, input_len=c.input_len, output_len=c.output_len, mask=c.mask,
            seed=c.seed, clock=i32(0), next_req=i32(0), gpu_free=jnp.zeros(d_, i32),
            rank=c.rank, admitted=c.admitted,
            phase=jnp.where(fin, 2, jnp.where(c.rank >= 0, 0, -1)), block=zr,
            tokens_done=c.tokens_done, slot_unit=zrk, slot_state=zrk, slot_ready=zrk,
            release=c.complete, first_tok=c.first_tok, last_tok=c.last_tok,
            complete=c.complete, itl_hist=c.itl_hist, busy=c.busy, execs=c.execs,
            exec_tokens=c.exec_tokens,
            done_bins=jnp.zeros(cfg.num_bins, i32).at[tb].add((fin & c.mask).astype(i32)),
            qdepth=jnp.full((cfg.num_bins, cfg.num_blocks), jnp.nan, jnp.float32),
            qdepth_n=jnp.ones(cfg.num_bins, i32), events=c.events)
        return aep.metrics(cfg, state)

    return System(name=f"aep-{cfg.scheduler}", init=init, step=step, finish=finish,
                  num_steps=1, is_done=is_done)
