"""Wafer-scale expert parallelism (001 MoEntwine) as an init / step / finish system.

One step is one inference iteration over the trace's sampled MoE layers (vmapped); per
layer (001 §II-B Fig. 5, §IV, §V-A):

1. attention (DP over TP groups, TP inside each group) by roofline, then the TP ring
   all-reduce = reduce-scatter + all-gather (the all-gather can be dropped, §IV-A, VI-B6;
   HER-Mapping: intra-wafer reduce-scatter + inter-wafer all-gather, §IV-B4);
2. MoE dispatch all-to-all: every (token, expert) pair goes to the devices serving the
   expert from the member of the token's TP group inside the destination's Full Token
   Domain (§IV-A: after the all-gather "any device [of an FTD] can access all required
   tokens, confining communication to this domain"; under HER from the token's holder on
   the destination's wafer; without the all-gather from the token's single holder), split
   evenly over the expert's replicas (shadow slots, §III-C); contention from the per-link
   loads of XY routing (`moejax.physics.collectives`), Eq. 1 latency;
3. experts by roofline on each device; 4. combine all-to-all (the dispatch reversed).

Attention with its all-reduce, and dispatch / experts / combine, are pipelined over
micro-batches (PipeMoE-like, §V-A Fig. 11(e), §VI-B: the best count of `micro_batches`).
A balancer (`balancer.py`) re-plans the shadow slots when Eq. 2 triggers; the copies move
on a migration stream: invasive = a migration phase on the critical path (the new replicas
serve from the next iteration); non-invasive = Local steps on links that are cold during the
all-reduce and Global steps on links cold during the all-to-all (§V-A), nothing on the
critical path: the replicas go live once the cold capacity has carried them (a delay in
iterations, `ni_delay_iterations`), and no new plan starts while one is in flight.

The package, by concern: `config` (WaferConfig, WaferParams, `make_config`), `mapping` (TP
groups, FTDs, ER / HER, §IV), `traffic` (dispatch / combine all-to-all), `allreduce` (TP ring
phases), `esp` (expert slicing, §VI-B5), `unit_tables` (the all-to-all as static tables with
Eq. 1 port parts), `layer` (one layer's timing and pipeline), `balancer` (shadow-slot plans,
Eq. 2), `migration` (invasive and non-invasive copies), this module (the System: init, step,
finish, policy options), `placement` (EPLB plans as params), `reference` (plain-Python
layer for tests).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from moejax.catalog.hardware import Platform
from moejax.catalog.models import ModelSpec
from moejax.errors import ConfigError
from moejax.physics import eq1
from moejax.system import System
from moejax.systems import metrics
from moejax.systems.wafer import balancer as bal
from moejax.systems.wafer import mapping as mp
from moejax.systems.wafer.config import (
    NETWORKS,
    WaferConfig,
    WaferParams,
    default_params,
    make_config,
    one_hot_np,
)
from moejax.systems.wafer.layer import is_binary, layer
from moejax.systems.wafer.migration import (
    migration_time_s,
    migration_traffic,
    ni_delay_iterations,
)
from moejax.systems.wafer.traffic import phase_parts
from moejax.trace import Trace

# Traces per compiled call on an accelerator (`System.accelerator_chunk`): XLA's GPU
# compile of this layer's largest reduce fusion grows steeply with the batch (Eq. 1 network,
# wsc-8x8, TP 4: 7-9 s at 4,096 traces, 20-25 s at 8,192 on an H200 and over 2.5 minutes on
# an H100, over 4 minutes at 16,384; docs/performance.md "Running on an accelerator").
ACCELERATOR_CHUNK = 4096


class Routing(NamedTuple):
    """One iteration's routing, the input of a step (the trace's leaves at iteration i).

    expert_ids int32 [L, N, K], token_mask bool [N], counts float32 [L, E].
    """

    expert_ids: jax.Array
    token_mask: jax.Array
    counts: jax.Array


def routing_of(trace: Trace) -> Routing:
    """The step inputs of one trace: its routing with the leading `[I]` iterations axis."""
    return Routing(trace.expert_ids, trace.token_mask, trace.counts)


@struct.dataclass
class WaferState:
    """Balancer state and accumulators (float32); the routing comes in each step's input."""

    shadow: jax.Array  # [L, E, D] current shadow-slot assignment
    history: jax.Array  # [L, E] EMA of expert loads (Alg. 1 Load_e)
    since_migration: jax.Array  # iterations since the last migration (Eq. 2 dt_mig)
    pending: jax.Array  # [L, E, D] non-invasive: shadow plan still moving on cold links
    pending_left: jax.Array  # iterations until `pending` is in place (<= 0: none pending)
    metrics: metrics.Running  # SCALARS and the per-link bytes [Lk], over iterations with tokens


SCALARS = ("layer_s", "forward_s", "all_to_all_s", "all_reduce_s", "esp_reduce_s",
           "attention_s", "moe_compute_s", "moe_phase_s", "attention_phase_s", "avg_hops",
           "max_over_mean",
           "migrations", "migration_s", "migration_bytes", "spill_bytes", "micro_batches",
           "moe_throughput", "utilization_mean", "tokens", "activation_delay")


def build(cfg: WaferConfig, num_iterations: int) -> System:
    """The wafer EP system over `num_iterations` iterations (one step = one iteration)."""
    d, lk, e = cfg.num_devices, cfg.topo.num_links, cfg.model.num_experts
    hops = np.asarray(cfg.topo.hops)
    # statically nothing to move: the shadow slots stay params.shadow for the whole run
    static = cfg.balancer == "none" or cfg.shadow_slots == 0

    def init(params: WaferParams, trace: Trace, key):
        del key
        n_layers = trace.counts.shape[-2]
        z = jnp.float32(0.0)
        # static (nothing moves): the step reads params.shadow, so the state carries an empty
        # [L, 0, D] placeholder instead of a per-trace [L, E, D] copy (32 MB at 1024 traces)
        shadow = (jnp.zeros((n_layers, 0, d)) if static else
                  jnp.broadcast_to(params.shadow, (n_layers, e, d)).astype(jnp.float32))
        running = metrics.Running.zeros(
            {**{k: () for k in SCALARS}, "link_bytes": (lk,), "ar_link_bytes": (lk,)})
        return WaferState(shadow, jnp.zeros((n_layers, e)), jnp.float32(1e9), shadow, z,
                          running)

    def step(params: WaferParams, state: WaferState, x: Routing):
        native = params.placement.astype(jnp.float32)
        ids, mask, counts = x
        # host = clip(native + shadow) is 0/1 when the params are (plans add 0/1 replicas);
        # a relaxed trigger (tau > 0) leaves soft shadows, but `binary` only selects the
        # fast expert path in hard mode (`expert_times`)
        binary = is_binary(params.placement) & is_binary(params.shadow)
        if static:  # the shadow slots never move: one host for every layer and trace, so
            # under the engine's vmap over traces the layer's host products stay matrix
            # products with a shared [E, D] (not a [T, E, D] batch; 25x less work at 8x8)
            host1 = jnp.clip(native + params.shadow, 0.0, 1.0)  # [E, D]
            out = jax.vmap(lambda i, c: layer(cfg, params, host1, i, mask, c, binary))(ids,
                                                                                      counts)
        else:
            host = jnp.clip(native[None] + state.shadow, 0.0, 1.0)  # [L, E, D]
            out = jax.vmap(lambda h, i, c: layer(cfg, params, h, i, mask, c, binary))(
                host, ids, counts)
        real = (counts.sum() > 0).astype(jnp.float32)
        m = cfg.model
        dev_load = out["device_tokens"]  # [L, D]
        ratio = dev_load.max(-1) / jnp.maximum(dev_load.mean(-1), 1e-30)
        history = jnp.where(state.metrics.iterations > 0,
                            cfg.history_decay * state.history + (1 - cfg.history_decay) * counts,
                            counts)
        idle = state.pending_left <= 0  # no non-invasive migration still in flight
        # the trace's layers sample the model's sparse layers: each of those layers migrates
        layer_scale = m.num_sparse_layers / counts.shape[0]
        if static:
            trigger = jnp.float32(0.0)
            planned = plan_shadow = state.shadow
            copies = jnp.float32(0.0)
            mig = jnp.zeros((d, d))
            mig_busy, mig_lat, need = jnp.float32(0.0), jnp.float32(0.0), jnp.zeros(lk)
        else:
            # 001 Eq. 2 as a gate g in [0, 1] (1[trigger] at tau_trigger = 0; the imbalance
            # comparison a sigmoid of width tau_trigger > 0, so alpha has a gradient; the
            # iteration counters are compared hard). Every decision below is the blend
            # g * (re-plan) + (1 - g) * (keep), which is the boolean path at g in {0, 1}.
            trigger = (bal.eq2_gate(dev_load, state.since_migration, params.alpha,
                                    params.beta, params.tau_trigger, tau_since=0.0)
                       * (real > 0) * idle)
            planned = jnp.clip(jax.vmap(lambda ld: bal.plan(
                ld, native, cfg.shadow_slots, hops, cfg.balancer))(history) - native[None],
                0.0, 1.0)  # [L, E, D] shadow slots of a new plan
            plan_shadow = trigger * planned + (1.0 - trigger) * state.shadow
            copies = jnp.clip(planned - host, 0.0, 1.0) * trigger  # replicas that move
            mig = migration_traffic(cfg, native, copies) * layer_scale
            mig_busy, mig_lat, need = phase_parts(mig, cfg.topo)
        a2a_loads = out["a2a_link_bytes"].mean(0)
        ar_loads = out["ar_link_bytes"].mean(0)
        delay = jnp.float32(0.0)
        spill = jnp.zeros_like(need)
        if cfg.migration_free:  # NVL72 with NVMe channels: off the network (001 §VI-D)
            mig_s = jnp.float32(0.0)
            new_shadow, pending, left = plan_shadow, state.pending, state.pending_left
        elif cfg.invasive:  # 001 §III-C, Fig. 7(b): iterations stop while experts move
            mig_s = mig_busy + mig_lat if static else migration_time_s(cfg, mig)
            spill = need
            new_shadow, pending, left = plan_shadow, state.pending, state.pending_left
        else:  # 001 §V-A: a background stream on cold links; replicas go live when moved
            mig_s = jnp.float32(0.0)
            delay = ni_delay_iterations(cfg, need, ar_loads, out["ar_busy_s"].mean(),
                                        a2a_loads, out["a2a_busy_s"].mean())
            pending = trigger * planned + (1.0 - trigger) * state.pending
            left = trigger * delay + (1.0 - trigger) * state.pending_left - 1.0
            new_shadow = jnp.where(left <= 0, pending, state.shadow)
        att_only = out["attention_phase_s"].mean()
        forward = (out["layer_s"].mean() * m.num_sparse_layers
                   + att_only * m.num_dense_layers + mig_s)
        moe_tp = (counts.sum(-1) / jnp.maximum(out["moe_phase_s"], 1e-30)).mean() / d
        vals = {
            "layer_s": out["layer_s"].mean(), "forward_s": forward,
            "all_to_all_s": out["all_to_all_s"].mean(), "all_reduce_s": out["all_reduce_s"].mean(),
            "esp_reduce_s": out["esp_reduce_s"].mean(),
            "attention_s": out["attention_s"].mean(), "moe_compute_s": out["moe_compute_s"].mean(),
            "moe_phase_s": out["moe_phase_s"].mean(),
            "attention_phase_s": out["attention_phase_s"].mean(),
            "avg_hops": out["avg_hops"].mean(), "max_over_mean": ratio.mean(),
            "migrations": copies.sum() * layer_scale, "migration_s": mig_s,
            "migration_bytes": mig.sum() - jnp.trace(mig), "spill_bytes": spill.sum(),
            "micro_batches": out["micro_batches"].mean(), "moe_throughput": moe_tp,
            "utilization_mean": (out["device_compute_s"].mean(-1)
                                 / jnp.maximum(out["layer_s"], 1e-30)).mean(),
            "tokens": counts[0].sum() / m.top_k, "activation_delay": delay,
        }
        running = state.metrics.add(
            real, {**vals, "link_bytes": a2a_loads, "ar_link_bytes": ar_loads})
        new = state.replace(
            shadow=jnp.where(real > 0, new_shadow, state.shadow),
            history=jnp.where(real > 0, history, state.history),
            since_migration=(1.0 - trigger) * (state.since_migration + 1.0),
            pending=jnp.where(real > 0, pending, state.pending),
            pending_left=jnp.where(real > 0, left, state.pending_left),
            metrics=running,
        )
        per_iter = {"max_over_mean": ratio.mean(), "migrations": copies.sum() * layer_scale,
                    "migration_s": mig_s, "forward_s": forward,
                    "device_load": dev_load.mean(0), "moe_throughput": moe_tp}
        return new, per_iter

    def finish(params: WaferParams, state: WaferState, outs):
        sums = state.metrics.sums
        res = state.metrics.means()  # link_bytes, ar_link_bytes: per-iteration means too
        res["migrations"] = sums["migrations"]
        res["activation_delay"] = sums["activation_delay"] / jnp.maximum(
            (outs["migrations"] > 0).sum(), 1.0)
        res["comm_s"] = res["all_to_all_s"] + res["all_reduce_s"] + res["esp_reduce_s"]
        res["migration_ratio"] = res["migration_s"] / jnp.maximum(res["forward_s"], 1e-30)
        res["latency_s"] = res["layer_s"]
        res["compute_s"] = res["moe_compute_s"]
        res["tokens_per_s"] = sums["tokens"] / jnp.maximum(sums["forward_s"], 1e-30)
        res["per_iteration"] = outs
        return res

    return System(name="wafer", init=init, step=step, finish=finish, num_steps=num_iterations,
                  accelerator_chunk=ACCELERATOR_CHUNK, inputs=routing_of)


# --- policy options ------------------------------------------------------------------------


def _read_options(t) -> tuple[dict, dict]:
    """(make_config kwargs, params kwargs) from a policy's [options] Table."""
    opts = dict(
        mapping=t.str("mapping", "baseline", choices=mp.MAPPINGS),
        tp_size=t.int("tp_size", 4),
        retain_allgather=t.bool("retain_allgather", True),
        balancer=t.str("balancer", "none", choices=bal.BALANCERS),
        invasive=t.bool("invasive", True),
        shadow_slots=t.int("shadow_slots", 0, lo=0),
        history_decay=t.float("history_decay", 0.8, positive=False, hi=0.999),
        cold_fraction=t.float("cold_fraction", 0.5, hi=1.0),
        context_len=t.int("context_len", 0, lo=0),
        expert_shards=t.int("expert_shards", 0, lo=0),  # ESP, 001 §VI-B5 (0 = off)
        network=t.str("network", "link_load", choices=NETWORKS),  # cut-through or 001 Eq. 1
        eq1_ports=t.str("eq1_ports", "link", choices=eq1.PORTS),
        bidirectional_rings=t.bool("bidirectional_rings", True),  # 001 §IV-B2
    )
    mbs = t._get("micro_batches", [1, 2, 4, 8], False)
    if not (isinstance(mbs, list) and mbs and all(isinstance(x, int) and not isinstance(x, bool)
                                                   and x >= 1 for x in mbs)):
        raise ConfigError(f"{t.where}: key 'micro_batches' must be a non-empty list of "
                          f"integers >= 1, got {mbs!r}")
    opts["micro_batches"] = tuple(mbs)
    pk = dict(alpha=t.float("alpha", 0.0, positive=False),
              beta=t.float("beta", 0.0, positive=False))
    placement = t._get("placement", "contiguous", False)
    t.close()
    if isinstance(placement, str):
        if placement != "contiguous":
            raise ConfigError(f"{t.where}: key 'placement' = {placement!r}; allowed: "
                              "contiguous, or a list of one device id per expert")
    elif not (isinstance(placement, list) and placement
              and all(isinstance(x, int) and not isinstance(x, bool) for x in placement)):
        raise ConfigError(f"{t.where}: key 'placement' must be 'contiguous' or a list of "
                          f"device ids, got {placement!r}")
    pk["placement"] = placement
    if not opts["invasive"] and pk["beta"] != 0.0:
        raise ConfigError(f"{t.where}: key 'beta' = {pk['beta']} must be 0 when invasive = false "
                          "(001 Eq. 2: beta = 0 for non-invasive)")
    return opts, pk


def check_options(t) -> None:
    """Validate a policy's [options] for the wafer system (names, types, ranges)."""
    _read_options(t)


def from_policy(platform: Platform, model: ModelSpec, t, num_iterations: int):
    """(System, params) for the wafer system from a policy's options Table."""
    opts, pk = _read_options(t)
    placement = pk.pop("placement")
    cfg = make_config(platform, model, **opts)
    params = default_params(cfg, **pk)
    if not isinstance(placement, str):
        e, d = model.num_experts, cfg.num_devices
        if len(placement) != e or not all(0 <= x < d for x in placement):
            raise ConfigError(f"{t.where}: key 'placement' needs {e} device ids in [0, {d}), "
                              f"got {len(placement)} ids")
        params = params.replace(placement=jax.device_put(one_hot_np(placement, d)))
    return build(cfg, num_iterations), params
