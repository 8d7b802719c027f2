"""Asynchronous expert parallelism (002 §3): μ-queues, token pool, layer-wise scheduling.

A queue-level discrete-event simulation of an AMoE decoding cluster serving one request
stream. Attention (with gating and the top-k merge) runs data parallel on the attention
GPUs and the experts run expert parallel on the expert GPUs, each GPU hosting its layer
type for every block (§3.3). Every active request has exactly one token in flight (decoding
is autoregressive), so the state is per request: its block, and K slots (one per routed
expert; slot 0 alone while the token waits for attention). A slot is pending in the
μ-queue of (block, unit) on the unit's GPU once it is ready there (its point-to-point
message arrived, §3.5).

One step is one event, the earliest of:
  * admission: the head-of-line request (arrived, FCFS) is bound to the attention DP rank
    with the most free KV-cache memory, if it fits (load balancer, §3.1); its KV is
    reserved for input + output tokens and released when it completes;
  * launch: the GPU that can start soonest (free, with a ready token) lets its scheduler
    (MTFS, FLFS or Algorithm 1, §3.4) pick one (block, unit) queue, drains it (§3.2
    executor), and its outputs move point-to-point to their next GPU: after attention to
    the K chosen experts (dispatcher), after an expert back to the request's attention rank,
    where the token pool holds it until all K outputs arrived (§3.2 Top-K support).
Ties go to admission, then to the lowest GPU id. The token of a request is emitted when
its last block's K expert outputs are merged at its rank; the next token then queues for
block 0 (the sampler is part of the first attention layer, §3.2).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from moejax.catalog.hardware import Platform
from moejax.catalog.models import ModelSpec
from moejax.errors import ConfigError
from moejax.system import System
from moejax.systems.amoe import routing, schedulers
from moejax.systems.amoe.config import (
    BIG_TICK,
    NUM_ITL_BINS,
    SCHEDULERS,
    TICK_S,
    LayerCost,
    Overheads,
    attention_seconds,
    check_positive,
    expert_seconds,
    exponential_popularity,
    itl_bin_edges_s,
    kv_tokens_per_layerset,
    layer_cost,
    pair_tables,
    to_ticks,
    transfer_ticks,
)
from moejax.trace.core import RequestStream

DEFAULT_OVERHEADS = Overheads()
# How the engine runs an AEP configuration (`paths.build`), all equal event for event:
# "rounds": rounds of launches in an exact lookahead window (JAX, the accelerator path,
# `rounds.py`); "core": the exact event core (numba, the CPU path, `core.py`); "scan": one
# event per engine step (`build` below, the plain vectorized form of the rules).
PATHS = ("rounds", "core", "scan")


@dataclasses.dataclass(frozen=True, eq=False)
class AEPConfig:
    """Static AMoE configuration (hashable by identity).

    attention_gpus [A]: device of each attention DP rank; expert_gpus [E]: device hosting
    expert e in every block (§3.3). kv_capacity_tokens: context tokens (over all blocks)
    each attention rank can cache. cdf [NB, E]: routing popularity per block.
    """

    platform: Platform
    model: ModelSpec
    scheduler: str
    num_requests: int
    attention_gpus: tuple[int, ...]
    expert_gpus: tuple[int, ...]
    lookahead: int
    kv_capacity_tokens: int
    cost: LayerCost
    lat_s: np.ndarray  # [D, D] float32
    per_token_s: np.ndarray  # [D, D] float32
    cdf: np.ndarray  # [NB, E] float32
    num_bins: int  # time bins of the rate / queue-depth series
    bin_ticks: int
    path: str = "rounds"  # how the engine runs it: rounds | core | scan (`paths.build`)

    @property
    def num_blocks(self) -> int:
        return self.model.num_layers

    @property
    def num_ranks(self) -> int:
        return len(self.attention_gpus)

    @property
    def num_units(self) -> int:
        return len(self.attention_gpus) + len(self.expert_gpus)

    @property
    def num_devices(self) -> int:
        return self.platform.num_devices

    @property
    def gpu_of_unit(self) -> np.ndarray:
        """int32 [U]: device of each unit (attention ranks, then experts)."""
        return np.asarray(self.attention_gpus + self.expert_gpus, np.int32)


def default_placement(platform: Platform, num_experts: int, attention_per_node: int | None):
    """§3.3 default: attention and experts disaggregated, each type on its own GPUs.

    Per node the first `attention_per_node` devices (default: half) are attention DP ranks
    and the rest host experts; expert e goes to expert device e * n // E (contiguous).
    """
    t = platform.topology
    per_node = t.devices_per_node if t.kind == "hierarchical" else platform.num_devices
    a = per_node // 2 if attention_per_node is None else attention_per_node
    if not 1 <= a < per_node:
        raise ConfigError(f"attention_per_node = {a}; allowed: 1..{per_node - 1} "
                          f"(devices per node of {platform.name})")
    att, exp = [], []
    for d in range(platform.num_devices):
        (att if d % per_node < a else exp).append(d)
    experts = [exp[e * len(exp) // num_experts] for e in range(num_experts)]
    return tuple(att), tuple(experts)


def make_config(platform: Platform, model: ModelSpec, *, scheduler: str = "defrag",
                num_requests: int = 64, attention_gpus=None, expert_gpus=None,
                attention_per_node: int | None = None, lookahead: int = 2,
                overheads: Overheads = DEFAULT_OVERHEADS, kv_fraction: float = 0.9,
                skew_scale: float = 0.5, skew_seed: int = 0, popularity=None,
                bin_s: float = 1.0, num_bins: int = 64, dtype: str = "bf16",
                path: str = "rounds") -> AEPConfig:
    """Validated AEPConfig: placement, layer costs, transfer tables, KV capacity, routing."""
    if scheduler not in SCHEDULERS:
        raise ConfigError(f"scheduler = {scheduler!r}; allowed: {', '.join(SCHEDULERS)}")
    if path not in PATHS:
        raise ConfigError(f"path = {path!r}; allowed: {', '.join(PATHS)}")
    check_positive("num_requests", num_requests, integer=True)
    check_positive("lookahead", lookahead, integer=True)
    check_positive("bin_s", bin_s)
    check_positive("num_bins", num_bins, integer=True)
    if not 0 < kv_fraction <= 1:
        raise ConfigError(f"kv_fraction = {kv_fraction!r}; allowed: (0, 1]")
    e = model.num_experts
    if attention_gpus is None or expert_gpus is None:
        att, exp = default_placement(platform, e, attention_per_node)
        attention_gpus = att if attention_gpus is None else attention_gpus
        expert_gpus = exp if expert_gpus is None else expert_gpus
    attention_gpus, expert_gpus = tuple(map(int, attention_gpus)), tuple(map(int, expert_gpus))
    d = platform.num_devices
    if len(expert_gpus) != e:
        raise ConfigError(f"expert_gpus: needs {e} device ids (one per expert), "
                          f"got {len(expert_gpus)}")
    for name, ids in (("attention_gpus", attention_gpus), ("expert_gpus", expert_gpus)):
        if not ids or not all(0 <= x < d for x in ids):
            raise ConfigError(f"{name}: device ids must be in [0, {d}) for {platform.name}, "
                              f"got {list(ids)}")
    if len(set(attention_gpus)) != len(attention_gpus):
        raise ConfigError(f"attention_gpus: one DP rank per device, got {list(attention_gpus)}")
    nb = model.num_layers
    weights = np.zeros(d)
    for g in attention_gpus:
        weights[g] += model.attention_weight_bytes * nb
    for g in expert_gpus:
        weights[g] += model.expert_weight_bytes * nb
    cap = platform.device.memory_capacity_bytes
    if (weights > cap).any():
        g = int(np.argmax(weights))
        raise ConfigError(f"placement: device {g} holds {weights[g] / 1e9:.1f} GB of weights, "
                          f"more than its {cap / 1e9:.1f} GB")
    kv_free = cap * kv_fraction - weights[list(attention_gpus)].max()
    kv_tokens = int(kv_free // kv_tokens_per_layerset(model))
    if kv_tokens < 1:
        raise ConfigError(f"kv_fraction = {kv_fraction}: no KV-cache memory left on the "
                          "attention GPUs after their weights")
    lat, per_tok = pair_tables(platform, model.token_bytes, overheads.message_s)
    if popularity is None:
        popularity = exponential_popularity(nb, e, skew_scale, skew_seed)
    popularity = np.asarray(popularity, np.float64)
    if popularity.shape != (nb, e) or (popularity < 0).any():
        raise ConfigError(f"popularity: expected nonnegative [blocks, experts] = {(nb, e)}, "
                          f"got shape {popularity.shape}")
    return AEPConfig(
        platform=platform, model=model, scheduler=scheduler, num_requests=int(num_requests),
        attention_gpus=attention_gpus, expert_gpus=expert_gpus, lookahead=int(lookahead),
        kv_capacity_tokens=kv_tokens, cost=layer_cost(platform, model, overheads, dtype),
        lat_s=lat, per_token_s=per_tok, cdf=routing.popularity_cdf(popularity),
        num_bins=int(num_bins), bin_ticks=max(1, int(round(bin_s / TICK_S))), path=path,
    )


@struct.dataclass
class AEPParams:
    """Tunable parameters: `decay` is delta of Algorithm 1 (lookahead weight decay).

    consts: the per-configuration arrays of the rounds path (`rounds.Consts`, made by
    `paths.params`; None for the other paths). They are params, not constants of the
    compiled program, so that XLA cannot fold them into the float32 arithmetic that must
    round as the core's does (`rounds_ops._mul`), and so that design points that differ
    only in platform values share one compiled program (a sweep batches them).
    """

    decay: jax.Array = struct.field(default_factory=lambda: jnp.float32(0.5))
    consts: Any = None


@struct.dataclass
class AEPState:
    """Per-stream simulation state. Times are int32 ticks (`TICK_S`)."""

    arrival: jax.Array  # [R] arrival tick
    input_len: jax.Array  # [R]
    output_len: jax.Array  # [R]
    mask: jax.Array  # [R] real requests
    seed: jax.Array  # uint32 routing seed of this stream
    clock: jax.Array  # time of the last event
    next_req: jax.Array  # head-of-line request not yet admitted
    gpu_free: jax.Array  # [D] tick each GPU becomes idle
    rank: jax.Array  # [R] attention DP rank (-1: not admitted)
    admitted: jax.Array  # [R] admission tick (BIG until admitted)
    phase: jax.Array  # [R] -1 waiting, 0 attention, 1 experts, 2 finished
    block: jax.Array  # [R] block of the token in flight
    tokens_done: jax.Array  # [R] output tokens emitted
    slot_unit: jax.Array  # [R, K] unit whose queue holds the slot
    slot_state: jax.Array  # [R, K] 0 idle, 1 pending (in transit or queued), 2 in token pool
    slot_ready: jax.Array  # [R, K] tick the slot is ready at its destination
    release: jax.Array  # [R] tick its KV is freed (BIG until known)
    first_tok: jax.Array  # [R] tick of the first output token
    last_tok: jax.Array  # [R] tick of the latest output token
    complete: jax.Array  # [R] tick of the last output token (BIG until done)
    itl_hist: jax.Array  # [H] inter-token latencies
    busy: jax.Array  # [D] busy ticks
    execs: jax.Array  # [D] executions
    exec_tokens: jax.Array  # [D] tokens executed
    done_bins: jax.Array  # [TB] completions per time bin
    qdepth: jax.Array  # [TB, NB] ready tokens per block at attention rank 0, summed
    qdepth_n: jax.Array  # [TB] samples
    events: jax.Array  # events processed


def stream_ticks(xp, arrival_s):
    """int32 arrival ticks of a stream (identical in numpy and jax)."""
    return xp.ceil(xp.asarray(arrival_s, xp.float32) * xp.float32(1.0 / TICK_S)).astype(
        xp.int32)


def stream_seed(key) -> jax.Array:
    """uint32 routing seed of one stream from its key."""
    return jax.random.bits(key, (), jnp.uint32)


def _time_bin(cfg: AEPConfig, tick):
    return jnp.clip(tick // cfg.bin_ticks, 0, cfg.num_bins - 1)


def _itl_bin(itl_ticks):
    edges = jnp.asarray(itl_bin_edges_s() / TICK_S, jnp.float32)
    return jnp.searchsorted(edges, itl_ticks.astype(jnp.float32), side="right")


def build(cfg: AEPConfig, num_steps: int = 2048) -> System:
    """The AEP serving simulation as an engine System over request streams, one event per
    step (`path = "scan"`); the engine runs segments of `num_steps` events until done."""
    r_, k_ = cfg.num_requests, cfg.model.top_k
    nb, a_, d_ = cfg.num_blocks, cfg.num_ranks, cfg.num_devices
    gpu_of_unit = jnp.asarray(cfg.gpu_of_unit)
    att_gpu = jnp.asarray(cfg.attention_gpus, jnp.int32)
    exp_gpu = jnp.asarray(cfg.expert_gpus, jnp.int32)
    lat, per_tok = jnp.asarray(cfg.lat_s), jnp.asarray(cfg.per_token_s)
    cdf = jnp.asarray(cfg.cdf)
    big = jnp.int32(BIG_TICK)
    reqs = jnp.arange(r_, dtype=jnp.int32)

    def init(params: AEPParams, stream: RequestStream, key) -> AEPState:
        if stream.arrival_s.shape != (r_,):
            raise ConfigError(f"stream: expected {r_} requests (num_requests), got "
                              f"{stream.arrival_s.shape}")
        zr = jnp.zeros(r_, jnp.int32)
        zrk = jnp.zeros((r_, k_), jnp.int32)
        return AEPState(
            arrival=stream_ticks(jnp, stream.arrival_s),
            input_len=stream.input_len.astype(jnp.int32),
            output_len=stream.output_len.astype(jnp.int32),
            mask=stream.mask.astype(bool), seed=stream_seed(key),
            clock=jnp.int32(0), next_req=jnp.int32(0), gpu_free=jnp.zeros(d_, jnp.int32),
            rank=zr - 1, admitted=zr + big, phase=zr - 1, block=zr, tokens_done=zr,
            slot_unit=zrk, slot_state=zrk, slot_ready=zrk,
            release=zr + big, first_tok=zr, last_tok=zr, complete=zr + big,
            itl_hist=jnp.zeros(NUM_ITL_BINS, jnp.int32), busy=jnp.zeros(d_, jnp.int32),
            execs=jnp.zeros(d_, jnp.int32), exec_tokens=jnp.zeros(d_, jnp.int32),
            done_bins=jnp.zeros(cfg.num_bins, jnp.int32),
            qdepth=jnp.zeros((cfg.num_bins, nb), jnp.float32),
            qdepth_n=jnp.zeros(cfg.num_bins, jnp.int32), events=jnp.int32(0),
        )

    def admission(s: AEPState):
        """(tick or BIG, rank) of admitting the head-of-line request (§3.1 load balancer)."""
        hol = jnp.minimum(s.next_req, r_ - 1)
        valid = (s.next_req < r_) & s.mask[hol]
        t_a = jnp.maximum(s.arrival[hol], s.clock)
        need = s.input_len + s.output_len
        holding = (s.rank >= 0) & (s.release > t_a)
        used = jnp.zeros(a_, jnp.int32).at[jnp.maximum(s.rank, 0)].add(
            jnp.where(holding, need, 0))
        free = cfg.kv_capacity_tokens - used
        best = jnp.argmax(free).astype(jnp.int32)
        fits = free[best] >= need[hol]
        return jnp.where(valid & fits, t_a, big), best, hol

    def admit(s: AEPState, t, rank, hol):
        return s.replace(
            clock=t, next_req=s.next_req + 1,
            rank=s.rank.at[hol].set(rank), admitted=s.admitted.at[hol].set(t),
            phase=s.phase.at[hol].set(0),
            block=s.block.at[hol].set(0),
            slot_unit=s.slot_unit.at[hol, 0].set(rank),
            slot_state=s.slot_state.at[hol, 0].set(1),
            slot_ready=s.slot_ready.at[hol, 0].set(t),
        )

    def launch(params: AEPParams, s: AEPState, g, t):
        pending = s.slot_state == 1
        slot_gpu = gpu_of_unit[s.slot_unit]
        elig = pending & (slot_gpu == g) & (s.slot_ready <= t)
        blk = jnp.broadcast_to(s.block[:, None], (r_, k_))
        q = jnp.zeros((nb, cfg.num_units), jnp.int32).at[blk, s.slot_unit].add(
            elig.astype(jnp.int32))
        on = gpu_of_unit == g
        b_sel, u_sel = schedulers.select(cfg.scheduler, q, on, params.decay, cfg.lookahead)
        batch = elig & (blk == b_sel) & (s.slot_unit == u_sel)
        n = batch.sum().astype(jnp.int32)
        is_att = u_sel < a_
        ctx = jnp.where(batch[:, 0], s.input_len + s.tokens_done, 0).sum()
        secs = jnp.where(is_att, attention_seconds(jnp, cfg.cost, n, ctx),
                         expert_seconds(jnp, cfg.cost, n))
        dur = to_ticks(jnp, secs)
        end = t + dur
        # dispatcher (§3.2): attention -> the K routed experts; expert -> the request's rank
        att_rows = batch[:, 0] & is_att
        experts = routing.choose_experts(jnp, s.seed, reqs, s.tokens_done, s.block, cdf, k_)
        dest = jnp.where(is_att, exp_gpu[experts],
                         att_gpu[jnp.maximum(s.rank, 0)][:, None])  # [R, K]
        moving = jnp.where(is_att, jnp.broadcast_to(att_rows[:, None], (r_, k_)), batch)
        cnt = jnp.zeros(d_, jnp.int32).at[dest].add(moving.astype(jnp.int32))
        arrive = end + transfer_ticks(jnp, lat[g, dest], per_tok[g, dest], cnt[dest])
        slot_state = jnp.where(moving, jnp.where(is_att, 1, 2), s.slot_state)
        slot_unit = jnp.where(moving & is_att, a_ + experts, s.slot_unit)
        slot_ready = jnp.where(moving, arrive, s.slot_ready)
        phase = jnp.where(att_rows, 1, s.phase)
        # token pool (§3.2 Top-K support): merge once all K expert outputs have arrived
        touched = (batch & ~is_att).any(1)
        merge = touched & (slot_state == 2).all(1) & (phase == 1)
        t_m = slot_ready.max(1)
        emit = merge & (s.block == nb - 1)
        done_now = s.tokens_done + emit.astype(jnp.int32)
        finished = emit & (done_now >= s.output_len)
        itl = t_m - s.last_tok
        has_itl = emit & (s.tokens_done > 0)
        itl_hist = s.itl_hist.at[_itl_bin(itl)].add(has_itl.astype(jnp.int32))
        requeue = merge & ~finished
        slot0 = jnp.arange(k_)[None, :] == 0
        slot_state = jnp.where(merge[:, None], jnp.where(requeue[:, None] & slot0, 1, 0),
                               slot_state)
        slot_unit = jnp.where(requeue[:, None] & slot0, jnp.maximum(s.rank, 0)[:, None],
                              slot_unit)
        slot_ready = jnp.where(requeue[:, None] & slot0, t_m[:, None], slot_ready)
        qsample = g == gpu_of_unit[0]
        tb = _time_bin(cfg, t)
        return s.replace(
            clock=t,
            gpu_free=s.gpu_free.at[g].set(end),
            phase=jnp.where(finished, 2, jnp.where(merge, 0, phase)),
            block=jnp.where(merge, jnp.where(s.block == nb - 1, 0, s.block + 1), s.block),
            tokens_done=done_now,
            slot_unit=slot_unit, slot_state=slot_state, slot_ready=slot_ready,
            release=jnp.where(finished, t_m, s.release),
            first_tok=jnp.where(emit & (s.tokens_done == 0), t_m, s.first_tok),
            last_tok=jnp.where(emit, t_m, s.last_tok),
            complete=jnp.where(finished, t_m, s.complete),
            itl_hist=itl_hist,
            busy=s.busy.at[g].add(dur), execs=s.execs.at[g].add(1),
            exec_tokens=s.exec_tokens.at[g].add(n),
            done_bins=s.done_bins.at[_time_bin(cfg, t_m)].add(finished.astype(jnp.int32)),
            qdepth=s.qdepth.at[tb].add(jnp.where(qsample, q[:, 0], 0).astype(jnp.float32)),
            qdepth_n=s.qdepth_n.at[tb].add(qsample.astype(jnp.int32)),
        )

    def step(params: AEPParams, s: AEPState, t):
        del t
        t_adm, rank, hol = admission(s)
        pending = s.slot_state == 1
        slot_gpu = gpu_of_unit[s.slot_unit]
        earliest = jnp.full(d_, big).at[slot_gpu].min(jnp.where(pending, s.slot_ready, big))
        start = jnp.where(earliest < big, jnp.maximum(s.gpu_free, earliest), big)
        g = jnp.argmin(start).astype(jnp.int32)
        t_l = start[g]
        do_admit = (t_adm <= t_l) & (t_adm < big)
        do_launch = ~do_admit & (t_l < big)
        a = admit(s, t_adm, rank, hol)
        b = launch(params, s, g, t_l)
        new = jax.tree_util.tree_map(
            lambda x, y, z: jnp.where(do_admit, x, jnp.where(do_launch, y, z)), a, b, s)
        new = new.replace(events=s.events + (do_admit | do_launch).astype(jnp.int32))
        return new, None

    def is_done(s: AEPState):
        return ((s.phase == 2) | ~s.mask).all()

    def finish(params: AEPParams, s: AEPState, outs):
        del outs
        return metrics(cfg, s)

    return System(name=f"aep-{cfg.scheduler}", init=init, step=step, finish=finish,
                  num_steps=num_steps, is_done=is_done)


def metrics(cfg: AEPConfig, s: AEPState) -> dict:
    """Per-stream metrics (throughput, ITL, TTFT, stalls, series) from a final state.

    cfg: an AEPConfig, or anything with its `num_devices`, `attention_gpus`, `expert_gpus`
    (`paths.Layout`)."""
    real = s.mask
    out = jnp.where(real, s.tokens_done, 0)
    start = jnp.min(jnp.where(real, s.arrival, BIG_TICK))
    end = jnp.max(jnp.where(real & (s.complete < BIG_TICK), s.complete, 0))
    makespan_s = jnp.maximum(end - start, 1).astype(jnp.float32) * TICK_S
    gaps = jnp.where(real & (s.tokens_done > 1), s.last_tok - s.first_tok, 0).astype(
        jnp.float32)
    n_gaps = jnp.where(real & (s.tokens_done > 1), s.tokens_done - 1, 0)
    ttft = jnp.where(real & (s.tokens_done > 0), s.first_tok - s.arrival, 0).astype(
        jnp.float32)
    n_first = (real & (s.tokens_done > 0)).sum()
    busy_frac = s.busy.astype(jnp.float32) * TICK_S / makespan_s
    is_exp = np.zeros(cfg.num_devices, bool)
    is_exp[list(cfg.expert_gpus)] = True
    is_att = np.zeros(cfg.num_devices, bool)
    is_att[list(cfg.attention_gpus)] = True
    att_tok = jnp.where(is_att, s.exec_tokens, 0).sum()
    att_execs = jnp.where(is_att, s.execs, 0).sum()
    exp_tok = jnp.where(is_exp, s.exec_tokens, 0).sum()
    exp_execs = jnp.where(is_exp, s.execs, 0).sum()
    return {
        "throughput_tok_s": out.sum().astype(jnp.float32) / makespan_s,
        "itl_mean_s": gaps.sum() * TICK_S
        / jnp.maximum(n_gaps.sum(), 1).astype(jnp.float32),
        "itl_hist": s.itl_hist,
        "ttft_mean_s": ttft.sum() * TICK_S
        / jnp.maximum(n_first, 1).astype(jnp.float32),
        "makespan_s": makespan_s,
        "completion_tick": s.complete,
        "output_tokens": out.sum(),
        "all_done": ((s.phase == 2) | ~real).all(),
        "busy_fraction": busy_frac,
        "expert_stall_fraction": 1.0 - jnp.where(is_exp, busy_frac, 0).sum() / is_exp.sum(),
        "attention_stall_fraction": 1.0 - jnp.where(is_att, busy_frac, 0).sum() / is_att.sum(),
        "mean_attention_batch": att_tok / jnp.maximum(att_execs, 1),
        "mean_expert_batch": exp_tok / jnp.maximum(exp_execs, 1),
        "done_per_bin": s.done_bins,
        "queue_depth": s.qdepth / jnp.maximum(s.qdepth_n, 1)[:, None].astype(jnp.float32),
        "events": s.events,
    }
