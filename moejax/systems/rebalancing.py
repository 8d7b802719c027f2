"""Synchronous EP that re-plans its expert placement over time: EPLB every R iterations
from a moving window of W iterations of past loads, paying for the weights it moves.

What serving teams run (DeepSeek-V3 §3.4: redundant experts "adjusted periodically (e.g.,
every 10 minutes)" from "statistics collected during the online deployment"; the EPLB
README: "A common method is to use moving average of historical statistics"), as one
init / step / finish system over the iterations of a long trace:

- iteration t runs synchronous EP (`moejax.systems.ep`, per-layer placement [L, E, D]);
- the first plan is made at t = W from iterations [0, W) (until then the initial
  placement, contiguous by default), the next every R iterations (R = 0: once); a plan is
  EPLB (`moejax.placement.eplb`) on the mean per-expert load of the last W iterations, with
  `slots_per_device` slots per device, the even replica split (`moejax.placement.slots`);
- a plan moves the weights of every new (layer, expert, device) replica from its nearest
  old holder over the platform's links (`moejax.placement.migration`), scaled from the
  trace's sampled layers to the model's MoE layers. `migration`: 'blocking' stops the
  iteration for the transfer and serves the new placement at once; 'overlapped' sends the
  weights during the iteration's non-communication time (attention, expert compute: the
  links are idle then in synchronous EP) and stalls only for what does not fit, the new
  placement serving from the next iteration; 'free' charges nothing (an upper bound).

R and W are traced params (floats, floored / rounded here), so a grid of them is one
vmapped sweep and `moejax.tune.rebalancing` smooths over them; W is at most the
static ring length `max_window`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from moejax.catalog.hardware import Platform
from moejax.catalog.models import ModelSpec
from moejax.errors import ConfigError
from moejax.placement import eplb, migration, slots
from moejax.system import System, SystemEntry
from moejax.systems import ep, metrics
from moejax.trace import Trace

MIGRATION_MODES = ("blocking", "overlapped", "free")
PLANNERS = ("eplb",)


@dataclasses.dataclass(frozen=True, eq=False)
class RebalanceConfig:
    """Static configuration (hashable by identity)."""

    ep: ep.EPConfig
    slots_per_device: int
    num_groups: int
    num_nodes: int
    eplb_mode: str  # resolved: hierarchical | global
    migration: str
    max_window: int  # ring of past loads (iterations)

    @property
    def num_slots(self) -> int:
        return self.slots_per_device * self.ep.num_devices


@struct.dataclass
class RebalanceParams:
    """interval: iterations between re-plans (floored; 0 = plan once); window: iterations of
    past loads averaged (rounded, 1 .. max_window); initial: shares [E, D] or [L, E, D]
    before the first plan; tau: EP's temperature (0 = exact)."""

    interval: jax.Array
    window: jax.Array
    initial: jax.Array
    tau: jax.Array = struct.field(default_factory=lambda: jnp.float32(0.0))


def make_config(platform: Platform, model: ModelSpec, *, redundant_slots: int = 0,
                num_groups: int = 1, eplb_mode: str = "auto", migration: str = "overlapped",
                max_window: int = 1, **ep_options) -> RebalanceConfig:
    """Validated config: the redundant slots must fit the device memory, EPLB's shapes must
    nest. num_groups: the model's expert groups (1: no group-limited routing, as in every
    catalog model, so EPLB's rule picks global on multi-node platforms, as vLLM does);
    0: one group per node, so `auto` is hierarchical."""
    if migration not in MIGRATION_MODES:
        raise ConfigError(f"migration = {migration!r}; allowed: {', '.join(MIGRATION_MODES)}")
    if max_window < 1:
        raise ConfigError(f"window = {max_window}; allowed: >= 1 iteration")
    slots.check_redundant_slots(redundant_slots, model, platform)
    cfg = ep.make_config(platform, model, **ep_options)
    nodes = platform.topology.nodes if platform.topology.kind == "hierarchical" else 1
    groups = num_groups or nodes
    per = slots.slots_per_device(model.num_experts, cfg.num_devices, redundant_slots)
    mode = eplb.check_shapes(model.num_experts, per * cfg.num_devices, groups, nodes,
                             cfg.num_devices, eplb_mode)
    return RebalanceConfig(cfg, per, groups, nodes, mode, migration, int(max_window))


def default_params(cfg: RebalanceConfig, interval: int = 0, window: int = 1) -> RebalanceParams:
    e, d = cfg.ep.model.num_experts, cfg.ep.num_devices
    return RebalanceParams(jnp.float32(interval), jnp.float32(window),
                           ep.contiguous_placement(e, d))


def plan_shares(cfg: RebalanceConfig, load_le):
    """EPLB plan [L, E, D] (even shares) for mean loads [L, E]."""
    phy2log, _, _ = eplb.rebalance(load_le, cfg.num_slots, cfg.num_groups, cfg.num_nodes,
                                   cfg.ep.num_devices, cfg.eplb_mode)
    return slots.layout_shares(phy2log, cfg.ep.model.num_experts, cfg.ep.num_devices)


def window_mean(ring, t, window):
    """Mean of the `window` most recent entries of ring [W_max, ...] before step t (step j
    is written to entry j mod W_max)."""
    w_max = ring.shape[0]
    recent = jnp.mod(t - 1 - jnp.arange(w_max), w_max)  # the j-th most recent step's entry
    use = (jnp.arange(w_max) < window).astype(ring.dtype)
    return jnp.tensordot(use, ring[recent], 1) / jnp.maximum(window, 1.0)


def replan_now(t, interval, window):
    """1 at the iterations a plan is made: t = W, then W + k R (R >= 1; R = 0: once)."""
    since = t - window
    periodic = (since >= 0) & (jnp.mod(since, jnp.maximum(interval, 1.0)) == 0)
    return jnp.where(interval >= 1, periodic, since == 0)


def stall_s(mode: str, move_s, forward_s, comm_s):
    """Seconds an iteration waits for a re-plan's weights: all of the transfer (blocking),
    what does not fit in the iteration's non-communication time (overlapped), none (free)."""
    if mode == "blocking":
        return move_s
    if mode == "overlapped":
        return jnp.maximum(move_s - (forward_s - comm_s), 0.0)
    return jnp.zeros_like(move_s)


@struct.dataclass
class RebalanceState:
    placement: jax.Array  # [L, E, D] shares in force
    pending: jax.Array  # [L, E, D] plan going live at the next iteration ('overlapped')
    has_pending: jax.Array
    ring: jax.Array  # [W_max, L, E] loads of past iterations
    run: metrics.Running
    tokens: jax.Array  # real tokens over every iteration of the trace


def build(cfg: RebalanceConfig, num_iterations: int) -> System:
    """The rebalancing EP system over `num_iterations` iterations of each trace."""
    e_cfg = cfg.ep
    m, d = e_cfg.model, e_cfg.num_devices
    w_max = cfg.max_window
    # sums over iterations with tokens (forward_s with migration stalls; load_ratio: the
    # mean over layers of max / mean tokens per device); totals over every iteration
    # (migration_s: transfer time before overlap)
    sums = {"layer_latency_s": (), "forward_s": (), "comm_s": (), "load_ratio": (),
            "device_compute_s": (d,)}
    totals = {"stall_s": (), "migration_bytes": (), "migration_s": (), "replans": ()}

    def init(params: RebalanceParams, trace: Trace, key):
        del key
        num_layers = trace.counts.shape[-2]
        ep.check_layers(params.initial, num_layers)
        place = jnp.broadcast_to(params.initial, (num_layers, m.num_experts, d))
        return RebalanceState(place, place, jnp.bool_(False),
                              jnp.zeros((w_max, num_layers, m.num_experts)),
                              metrics.Running.zeros(sums, totals),
                              trace.tokens_per_iteration().sum())

    def step(params: RebalanceParams, state: RebalanceState, it: metrics.Iteration):
        t, ids, mask, counts = it.index, it.expert_ids, it.token_mask, it.counts
        num_layers = counts.shape[0]
        interval = jnp.floor(params.interval)
        window = jnp.clip(jnp.round(params.window), 1.0, float(w_max))
        # a plan scheduled last iteration ('overlapped') goes live now
        current = jnp.where(state.has_pending, state.pending, state.placement)
        replan = replan_now(t.astype(jnp.float32), interval, window)
        planned = plan_shares(cfg, window_mean(state.ring, t, window))
        old_h, new_h = slots.hosts(current), slots.hosts(planned)
        traffic = migration.traffic_bytes(old_h, new_h, e_cfg.topo.path_latency_s,
                                          m.expert_weight_bytes, m.num_sparse_layers / num_layers)
        traffic = jnp.where(replan, traffic, 0.0)
        move_s = migration.time_s(traffic, e_cfg.topo)
        serve_new = replan & (cfg.migration != "overlapped")
        serving = jnp.where(serve_new, planned, current)
        ep_params = ep.EPParams(placement=serving, tau=params.tau)
        layers, forward, other = ep.iteration_times(e_cfg, ep_params, ids, mask, counts)
        comm = layers["comm_s"].mean() * m.num_sparse_layers
        stall = stall_s(cfg.migration, move_s, forward, comm)
        tok = counts[:, :, None] * serving  # [L, E, D]
        dev = tok.sum(1)  # [L, D]
        ratio = (dev.max(-1) / jnp.maximum(dev.mean(-1), 1e-30)).mean()
        keep_pending = replan & (cfg.migration == "overlapped")
        run = state.run.add(metrics.real_iteration(counts[0].sum()), {
            "layer_latency_s": layers["latency_s"].mean(),
            "forward_s": forward + stall,
            "comm_s": layers["comm_s"].mean(),
            "load_ratio": ratio,
            "device_compute_s": layers["device_compute_s"].sum(0) / num_layers,
        }, totals={
            "stall_s": stall,
            "migration_bytes": traffic.sum(),
            "migration_s": move_s,
            "replans": replan.astype(jnp.float32),
        })
        new = state.replace(
            placement=serving,
            pending=jnp.where(keep_pending, planned, serving),
            has_pending=keep_pending,
            ring=state.ring.at[jnp.mod(t, w_max)].set(counts),
            run=run,
        )
        return new, {"layer_latency_s": layers["latency_s"].mean(), "forward_s": forward + stall,
                     "comm_s": layers["comm_s"].mean(), "replan": replan}

    def finish(params: RebalanceParams, state: RebalanceState, outs):
        s, tot, mean = state.run.sums, state.run.totals, state.run.means()
        util = metrics.share_of(s["device_compute_s"], jnp.maximum(s["layer_latency_s"], 1e-30))
        return {
            "latency_s": mean["layer_latency_s"],
            "forward_s": mean["forward_s"],
            "comm_s": mean["comm_s"],
            "stall_s": tot["stall_s"] / state.run.count(),
            "migration_bytes": tot["migration_bytes"],
            "migration_s": tot["migration_s"],
            "replans": tot["replans"],
            "max_load_ratio": mean["load_ratio"],
            "utilization_mean": util.mean(),
            "tokens_per_s": state.tokens / jnp.maximum(s["forward_s"], 1e-30),
            "layer_latency_per_iter_s": outs["layer_latency_s"],
            "forward_per_iter_s": outs["forward_s"],
            "comm_per_iter_s": outs["comm_s"],
            "replan_per_iter": outs["replan"],
        }

    return System(name="rebalancing", init=init, step=step, finish=finish,
                  num_steps=num_iterations, inputs=metrics.inputs(num_iterations))


# --- policy options ------------------------------------------------------------------------


def _read_options(t):
    opts = dict(
        attention=t.str("attention", "dp", choices=ep.ATTENTION_MODES),
        tp_size=t.int("tp_size", 1),
        context_len=t.int("context_len", 0, lo=0),
        redundant_slots=t.int("redundant_slots", 0, lo=0),
        num_groups=t.int("num_groups", 1, lo=0),
        eplb_mode=t.str("eplb_mode", "auto", choices=eplb.MODES),
        migration=t.str("migration", "overlapped", choices=MIGRATION_MODES),
    )
    t.str("planner", "eplb", choices=PLANNERS)
    interval = t.int("interval", 0, lo=0)
    window = t.int("window", 1, lo=1)
    t.close()
    return opts, interval, window


def check_options(t) -> None:
    """Validate a policy's [options] for the rebalancing system (names, types, ranges)."""
    _read_options(t)


def plan_live_from(window: int, migration: str) -> int:
    """The first iteration a plan made from iterations 0 .. window-1 serves: the plan is made
    at iteration `window` and serves it ('blocking', 'free') or goes live at the next one
    ('overlapped'). The iterations from here on are held out from the first plan."""
    return int(window) + (1 if migration == "overlapped" else 0)


def held_out_from(options) -> int:
    """`plan_live_from` of a policy's options (a mapping; defaults as `_read_options`)."""
    o = dict(options)
    return plan_live_from(int(o.get("window", 1)), str(o.get("migration", "overlapped")))


def from_policy(platform: Platform, model: ModelSpec, t, num_iterations: int):
    """(System, params) from a policy's options. The first plan must go live inside the
    trace: a window as long as the trace (or, with overlapped migration, one iteration
    shorter) would never serve a plan and score plain EP under this policy's name."""
    opts, interval, window = _read_options(t)
    cfg = make_config(platform, model, max_window=window, **opts)
    live = plan_live_from(window, opts["migration"])
    if live >= num_iterations:
        longest = num_iterations - (live - window) - 1
        allowed = f"1 .. {longest}" if longest >= 1 else "none: the trace is too short"
        raise ConfigError(f"{t.where}: key 'window' = {window} iterations leaves no iteration "
                          f"for the plan to serve in a trace of {num_iterations} iterations "
                          f"({opts['migration']} migration: the plan serves from iteration "
                          f"{live}); allowed: {allowed}, or a longer trace")
    return build(cfg, num_iterations), default_params(cfg, interval, window)


ENTRY = SystemEntry(
    "rebalancing", "synchronous EP that re-plans its placement with EPLB every R iterations",
    from_policy, check_options, ("gpu", "chiplet", "wafer"), study="balancing",
    default_policy="eplb")
