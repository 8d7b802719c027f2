"""Synchronous EP serving: the SGLang-style baseline of 002 §5 (DP attention + EP experts).

Every GPU is an attention DP rank and hosts E / D experts of every block. One step is one
decoding iteration: the whole running batch goes through all blocks together; in each block
attention runs on every rank, then a barrier all-to-all dispatches tokens to their experts,
the experts run, and a barrier all-to-all combines them back (002 §2.1, Fig. 1, Fig. 4), so
each block lasts as long as the slowest rank's attention plus the slowest GPU's experts.
Continuous batching: requests join and leave only at iteration boundaries; at a boundary
up to `admit_per_iteration` arrived requests are admitted in FCFS order, each to the rank
with the most free KV-cache memory (the same load balancer as AEP, §3.1), while it fits
and the rank runs fewer than `max_running` requests. Every running request emits one token
at the end of the iteration.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from moejax.catalog.hardware import Platform
from moejax.catalog.models import ModelSpec
from moejax.errors import ConfigError
from moejax.physics import collectives, topology
from moejax.system import System
from moejax.systems.amoe import routing
from moejax.systems.amoe.aep import _itl_bin, stream_seed, stream_ticks
from moejax.systems.amoe.config import (
    BIG_TICK,
    NUM_ITL_BINS,
    TICK_S,
    LayerCost,
    Overheads,
    attention_seconds,
    check_positive,
    exponential_popularity,
    kv_tokens_per_layerset,
    layer_cost,
    to_ticks,
)
from moejax.trace.core import RequestStream

COMM_MODES = ("all_to_all", "gather_allreduce")


@dataclasses.dataclass(frozen=True)
class SyncOverheads:
    """Per-iteration and per-layer costs of a synchronous serving engine (seconds), its
    expert communication and its kernel efficiencies.

    iteration_fixed_s: scheduler, batch preparation and sampling once per iteration.
    page_table_s_per_token: KV slot allocation and block-table lookup once per iteration.
    layer_fixed_s: kernel launches of one block (CUDA graphs amortise them).
    comm: how tokens reach the experts in each block.
      "all_to_all": barrier all-to-all of the routed tokens only (dispatch, combine).
      "gather_allreduce": SGLang's DP attention + EP MoE of early 2025: the DP
        ranks' hidden states are all-gathered to every rank (`dp_gather`), each rank runs
        its experts on the tokens routed to them, and the outputs are combined by an
        all-reduce of the global batch (`tensor_model_parallel_all_reduce`); ring
        collectives over all GPUs (`physics.collectives`).
    expert_efficiency, attention_kv_reads: as `config.Overheads` (Fig. 3 GEMM efficiency;
      KV read multiplicity of the decode kernel: 1 for FlashInfer, SGLang's default
      attention backend, whose GQA/MQA decode loads each KV head once for its group).
    """

    iteration_fixed_s: float = 1e-3
    page_table_s_per_token: float = 2e-6
    layer_fixed_s: float = 20e-6
    comm: str = "all_to_all"
    expert_efficiency: float = 1.0
    attention_kv_reads: float = 1.0


@dataclasses.dataclass(frozen=True, eq=False)
class SyncConfig:
    """Static configuration of synchronous EP serving (hashable by identity)."""

    platform: Platform
    model: ModelSpec
    topo: topology.Topology
    num_requests: int
    expert_gpus: tuple[int, ...]  # [E] device of expert e (every block)
    kv_capacity_tokens: int  # per rank
    max_running: int  # per rank
    admit_per_iteration: int
    cost: LayerCost  # roofline coefficients (fixed terms zero: overheads are separate)
    overheads: SyncOverheads
    cdf: np.ndarray  # [NB, E]
    num_bins: int
    bin_ticks: int

    @property
    def num_devices(self) -> int:
        return self.platform.num_devices

    @property
    def num_blocks(self) -> int:
        return self.model.num_layers


def make_config(platform: Platform, model: ModelSpec, *, num_requests: int = 64,
                expert_gpus=None, max_running: int = 0, admit_per_iteration: int = 64,
                overheads: SyncOverheads | None = None, kv_fraction: float = 0.9,
                skew_scale: float = 0.5, skew_seed: int = 0, popularity=None,
                bin_s: float = 1.0, num_bins: int = 64, dtype: str = "bf16") -> SyncConfig:
    """Validated SyncConfig; max_running = 0 means bounded by KV capacity only."""
    overheads = SyncOverheads() if overheads is None else overheads
    if overheads.comm not in COMM_MODES:
        raise ConfigError(f"comm = {overheads.comm!r}; allowed: {', '.join(COMM_MODES)}")
    check_positive("num_requests", num_requests, integer=True)
    check_positive("admit_per_iteration", admit_per_iteration, integer=True)
    if max_running < 0:
        raise ConfigError(f"max_running = {max_running}; allowed: 0 (no limit) or >= 1")
    d, e, nb = platform.num_devices, model.num_experts, model.num_layers
    if expert_gpus is None:
        expert_gpus = tuple(x * d // e for x in range(e))  # contiguous (SGLang default)
    expert_gpus = tuple(int(x) for x in expert_gpus)
    if len(expert_gpus) != e or not all(0 <= x < d for x in expert_gpus):
        raise ConfigError(f"expert_gpus: needs {e} device ids in [0, {d}), got "
                          f"{list(expert_gpus)}")
    weights = np.full(d, model.attention_weight_bytes * nb)
    for g in expert_gpus:
        weights[g] += model.expert_weight_bytes * nb
    cap = platform.device.memory_capacity_bytes
    kv_tokens = int((cap * kv_fraction - weights.max()) // kv_tokens_per_layerset(model))
    if kv_tokens < 1:
        raise ConfigError(f"kv_fraction = {kv_fraction}: weights of {weights.max() / 1e9:.1f}"
                          f" GB leave no KV-cache memory on {platform.name}")
    if popularity is None:
        popularity = exponential_popularity(nb, e, skew_scale, skew_seed)
    zero = Overheads(schedule_s=0.0, attention_fixed_s=0.0, page_table_s_per_token=0.0,
                     expert_fixed_s=0.0, expert_efficiency=overheads.expert_efficiency,
                     attention_kv_reads=overheads.attention_kv_reads)
    return SyncConfig(
        platform=platform, model=model, topo=topology.build(platform),
        num_requests=int(num_requests), expert_gpus=expert_gpus,
        kv_capacity_tokens=kv_tokens, max_running=int(max_running) or 2**30,
        admit_per_iteration=int(admit_per_iteration),
        cost=layer_cost(platform, model, zero, dtype), overheads=overheads,
        cdf=routing.popularity_cdf(popularity), num_bins=int(num_bins),
        bin_ticks=max(1, int(round(bin_s / TICK_S))),
    )


@struct.dataclass
class SyncParams:
    """No tunable parameter yet (kept for the System signature)."""

    tau: jax.Array = struct.field(default_factory=lambda: jnp.float32(0.0))


@struct.dataclass
class SyncState:
    arrival: jax.Array
    input_len: jax.Array
    output_len: jax.Array
    mask: jax.Array
    seed: jax.Array
    clock: jax.Array
    next_req: jax.Array
    rank: jax.Array  # [R] -1 not admitted
    phase: jax.Array  # [R] -1 waiting, 0 running, 2 finished
    tokens_done: jax.Array
    first_tok: jax.Array
    last_tok: jax.Array
    complete: jax.Array
    itl_hist: jax.Array
    busy_s: jax.Array  # [D] attention + expert seconds per GPU
    stall_s: jax.Array  # [D] seconds waiting at the barriers
    iter_tokens: jax.Array  # tokens processed in iterations
    iterations: jax.Array
    done_bins: jax.Array
    events: jax.Array


def expert_kernel_s(c: LayerCost, n):
    """Seconds of one expert on n tokens; 0 if it received none (weights not loaded)."""
    nf = n.astype(jnp.float32)
    t = jnp.maximum(nf * c.exp_comp, c.exp_weight + nf * c.exp_act)
    return jnp.where(n > 0, t, 0.0)


def build(cfg: SyncConfig, num_steps: int = 2048) -> System:
    """Synchronous EP serving as an engine System over request streams (1 step = 1
    iteration); the engine runs segments of `num_steps` iterations until done."""
    r_, d_, nb, k_ = cfg.num_requests, cfg.num_devices, cfg.num_blocks, cfg.model.top_k
    e_ = cfg.model.num_experts
    big = jnp.int32(BIG_TICK)
    place = jax.nn.one_hot(np.asarray(cfg.expert_gpus), d_, dtype=jnp.float32)  # [E, D]
    cdf = jnp.asarray(cfg.cdf)
    reqs = jnp.arange(r_, dtype=jnp.int32)
    ov = cfg.overheads
    groups = np.arange(d_)[None, :]  # one ring over every GPU (gather_allreduce)

    def init(params, stream: RequestStream, key):
        zr = jnp.zeros(r_, jnp.int32)
        zd = jnp.zeros(d_, jnp.float32)
        return SyncState(
            arrival=stream_ticks(jnp, stream.arrival_s),
            input_len=stream.input_len.astype(jnp.int32),
            output_len=stream.output_len.astype(jnp.int32),
            mask=stream.mask.astype(bool), seed=stream_seed(key), clock=jnp.int32(0),
            next_req=jnp.int32(0), rank=zr - 1, phase=zr - 1, tokens_done=zr,
            first_tok=zr, last_tok=zr, complete=zr + big,
            itl_hist=jnp.zeros(NUM_ITL_BINS, jnp.int32), busy_s=zd, stall_s=zd,
            iter_tokens=jnp.int32(0), iterations=jnp.int32(0),
            done_bins=jnp.zeros(cfg.num_bins, jnp.int32), events=jnp.int32(0),
        )

    def admit_all(s: SyncState, t0):
        need = s.input_len + s.output_len

        def one(carry, _):
            rank, next_req, blocked = carry
            hol = jnp.minimum(next_req, r_ - 1)
            running = rank >= 0
            active = running & (s.phase != 2)
            used = jnp.zeros(d_, jnp.int32).at[jnp.maximum(rank, 0)].add(
                jnp.where(active, need, 0))
            nrun = jnp.zeros(d_, jnp.int32).at[jnp.maximum(rank, 0)].add(
                active.astype(jnp.int32))
            free = cfg.kv_capacity_tokens - used
            best = jnp.argmax(free).astype(jnp.int32)
            ok = ((next_req < r_) & s.mask[hol] & (s.arrival[hol] <= t0) & ~blocked
                  & (free[best] >= need[hol]) & (nrun[best] < cfg.max_running))
            rank = jnp.where(ok, rank.at[hol].set(best), rank)
            return (rank, next_req + ok.astype(jnp.int32), blocked | ~ok), None

        (rank, next_req, _), _ = jax.lax.scan(one, (s.rank, s.next_req, jnp.bool_(False)),
                                              None, length=cfg.admit_per_iteration)
        newly = (rank >= 0) & (s.rank < 0)
        return rank, next_req, jnp.where(newly, 0, s.phase)

    def step(params, s: SyncState, t):
        del t
        hol = jnp.minimum(s.next_req, r_ - 1)
        idle = ~(s.phase == 0).any()
        waiting = (s.next_req < r_) & s.mask[hol]
        t0 = jnp.where(idle & waiting, jnp.maximum(s.clock, s.arrival[hol]), s.clock)
        rank, next_req, phase = admit_all(s, t0)
        running = phase == 0
        n_run = running.sum()
        own = jax.nn.one_hot(jnp.maximum(rank, 0), d_, dtype=jnp.float32) * running[:, None]
        # routing of every running token in every block: [R, NB, K]
        ex = routing.choose_experts(jnp, s.seed, reqs[:, None], s.tokens_done[:, None],
                                    jnp.arange(nb, dtype=jnp.int32)[None, :], cdf, k_)
        routed = jax.nn.one_hot(ex, e_, dtype=jnp.float32).sum(2)  # [R, NB, E]
        src_e = jnp.einsum("rd,rbe->bde", own, routed)  # [NB, D, E]
        tokens_e = src_e.sum(1)  # [NB, E]
        exp_dev = expert_kernel_s(cfg.cost, tokens_e.astype(jnp.int32)) @ place  # [NB, D]
        n_dev = own.sum(0)
        if ov.comm == "gather_allreduce":  # every rank gets the global batch, then all-reduce
            vol = n_run.astype(jnp.float32) * cfg.model.token_bytes
            dispatch = jnp.broadcast_to(collectives.all_gather_time_s(vol, groups, cfg.topo),
                                        (nb,))
            combine = jnp.broadcast_to(collectives.all_reduce_time_s(vol, groups, cfg.topo),
                                       (nb,))
        else:
            traffic = jnp.einsum("bde,ef->bdf", src_e, place) * cfg.model.token_bytes
            dispatch = collectives.all_to_all_time_s(traffic, cfg.topo)  # [NB]
            combine = collectives.all_to_all_time_s(jnp.swapaxes(traffic, -1, -2), cfg.topo)
        ctx_dev = (own * (s.input_len + s.tokens_done)[:, None]).sum(0)
        att_dev = jnp.where(n_dev > 0, attention_seconds(jnp, cfg.cost, n_dev, ctx_dev), 0.0)
        block_s = att_dev.max() + dispatch + exp_dev.max(-1) + combine + ov.layer_fixed_s
        iter_s = ov.iteration_fixed_s + ov.page_table_s_per_token * n_run.astype(jnp.float32)
        dur = to_ticks(jnp, block_s).sum() + to_ticks(jnp, jnp.float32(iter_s))
        any_run = n_run > 0
        end = jnp.where(any_run, t0 + dur, t0)
        done_now = s.tokens_done + running.astype(jnp.int32)
        finished = running & (done_now >= s.output_len)
        has_itl = running & (s.tokens_done > 0)
        busy = att_dev[None, :] + exp_dev  # [NB, D]
        run_f = any_run.astype(jnp.float32)
        return s.replace(
            clock=end, next_req=next_req, rank=rank,
            phase=jnp.where(finished, 2, phase), tokens_done=done_now,
            first_tok=jnp.where(running & (s.tokens_done == 0), end, s.first_tok),
            last_tok=jnp.where(running, end, s.last_tok),
            complete=jnp.where(finished, end, s.complete),
            itl_hist=s.itl_hist.at[_itl_bin(end - s.last_tok)].add(has_itl.astype(jnp.int32)),
            busy_s=s.busy_s + run_f * busy.sum(0),
            stall_s=s.stall_s + run_f * (block_s[:, None] - busy).sum(0),
            iter_tokens=s.iter_tokens + n_run, iterations=s.iterations + any_run,
            done_bins=s.done_bins.at[jnp.clip(end // cfg.bin_ticks, 0, cfg.num_bins - 1)].add(
                finished.sum().astype(jnp.int32)),
            events=s.events + 1,
        ), None

    def is_done(s: SyncState):
        return ((s.phase == 2) | ~s.mask).all()

    def finish(params, s: SyncState, outs):
        del outs
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
        layer_s = s.busy_s + s.stall_s
        return {
            "throughput_tok_s": out.sum().astype(jnp.float32) / makespan_s,
            "itl_mean_s": gaps.sum() * TICK_S
            / jnp.maximum(n_gaps.sum(), 1).astype(jnp.float32),
            "itl_hist": s.itl_hist,
            "ttft_mean_s": ttft.sum() * TICK_S
            / jnp.maximum((real & (s.tokens_done > 0)).sum(), 1).astype(jnp.float32),
            "makespan_s": makespan_s,
            "completion_tick": s.complete,
            "output_tokens": out.sum(),
            "all_done": ((s.phase == 2) | ~real).all(),
            "stall_fraction": s.stall_s.sum() / jnp.maximum(layer_s.sum(), 1e-30),
            "mean_batch": s.iter_tokens / jnp.maximum(s.iterations, 1),
            "done_per_bin": s.done_bins,
            "events": s.events,
        }

    return System(name="ep-sync", init=init, step=step, finish=finish, num_steps=num_steps,
                  is_done=is_done)
