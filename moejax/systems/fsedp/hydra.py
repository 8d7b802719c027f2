"""Baselines of 000 §VI-A on the same package: EP and Hydra, with on-chip memory (Fig. 12).

EP: experts distributed over the dies, tokens all-to-all, each die loads its experts from
its own DDR channel (`moejax.systems.ep.moe_layer`). Hydra [17] as §VI-A isolates it: EP
whose experts are relocated by their popularity to cut inter-chiplet imbalance and traffic.
The trace's own routing history gives the popularity (counts over all iterations of each
layer; "cross-layer" profiling in [17]); experts are placed greedily, most popular first,
on the die with the least popularity so far (LPT), one placement per layer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from moejax.catalog.hardware import Platform
from moejax.catalog.models import ModelSpec
from moejax.system import System
from moejax.systems import ep, metrics
from moejax.trace import Trace


def popularity_placement(popularity, num_devices: int):
    """One-hot placement [E, D] by greedy LPT over popularity [E] (Hydra relocation)."""
    e = popularity.shape[0]
    order = jnp.argsort(-popularity, stable=True)
    cap = -(-e // num_devices)  # equal expert counts per die (same weight storage)

    def place(carry, i):
        load, used = carry
        score = jnp.where(used < cap, load, jnp.inf)
        d = jnp.argmin(score)
        return (load.at[d].add(popularity[i]), used.at[d].add(1)), d

    _, dev = jax.lax.scan(place, (jnp.zeros(num_devices), jnp.zeros(num_devices)), order)
    return jnp.zeros((e, num_devices)).at[order].set(jax.nn.one_hot(dev, num_devices))


def ep_memory_bytes(cfg: ep.EPConfig, placement, expert_ids, token_mask, counts):
    """Per-die on-chip bytes of EP (weights [D], tokens [D]) for one layer.

    Weights: the expert being computed plus the next one being prefetched (double buffer),
    or one if the die runs a single expert. Tokens: its own tokens plus every (token,
    expert) copy dispatched to it (EP replicates tokens, §II-B), input and output.
    """
    m = cfg.model
    _, tokens_de = ep.layer_demand(cfg, ep.EPParams(placement=placement), expert_ids,
                                   token_mask, counts)
    used = (tokens_de > 0).sum(-1)
    weights = jnp.minimum(used, 2) * m.expert_weight_bytes
    own = ep.owned_tokens(cfg, token_mask, counts.sum() / m.top_k)
    tokens = 2.0 * (own + tokens_de.sum(-1)) * m.token_bytes
    return weights, tokens


@struct.dataclass
class EPMemState:
    placement: jax.Array  # [L, E, D]
    run: metrics.Running
    tokens: jax.Array  # real tokens over every iteration of the trace


def build(cfg: ep.EPConfig, num_iterations: int, relocate: bool) -> System:
    """EP (relocate=False, contiguous placement) or Hydra (relocate=True) with memory."""
    d = cfg.num_devices
    base = ep.default_params(cfg)
    sums = {"layer_latency_s": (), "forward_s": (), "device_compute_s": (d,)}
    peaks = {"peak_weight_bytes": (d,), "peak_token_bytes": (d,)}

    def init(params, trace: Trace, key):
        del key
        n_l = trace.counts.shape[-2]
        if relocate:
            pop = trace.counts.sum(0)  # [L, E] popularity over the trace's history
            place = jax.vmap(lambda p: popularity_placement(p, d))(pop)
        else:
            place = jnp.broadcast_to(base.placement, (n_l, *base.placement.shape))
        return EPMemState(place, metrics.Running.zeros(sums, peaks=peaks),
                          trace.tokens_per_iteration().sum())

    def step(params, state: EPMemState, it: metrics.Iteration):
        ids, mask, counts = it.expert_ids, it.token_mask, it.counts

        def one(pl, i, c):
            out = ep.moe_layer(cfg, ep.EPParams(placement=pl, tau=params.tau), i, mask, c)
            w, tk = ep_memory_bytes(cfg, pl, i, mask, c)
            return out, w, tk

        layers, w, tk = jax.vmap(one)(state.placement, ids, counts)
        m = cfg.model
        n_tokens = counts[0].sum() / m.top_k
        att, _ = ep.attention_time_s(cfg, n_tokens, 0.0)
        dense = ep.dense_ffn_time_s(cfg, n_tokens, 0.0)
        lat = layers["latency_s"].mean()
        run = state.run.add(metrics.real_iteration(n_tokens), {
            "layer_latency_s": lat,
            "forward_s": (lat * m.num_sparse_layers + m.num_layers * att
                          + m.num_dense_layers * dense),
            "device_compute_s": layers["device_compute_s"].mean(0),
        }, peaks={"peak_weight_bytes": w.max(0), "peak_token_bytes": tk.max(0)})
        return state.replace(run=run), lat

    def finish(params, state: EPMemState, outs):
        s, peak, mean = state.run.sums, state.run.peaks, state.run.means()
        util = metrics.share_of(s["device_compute_s"], jnp.maximum(s["layer_latency_s"], 1e-30))
        return {
            "latency_s": mean["layer_latency_s"],
            "forward_s": mean["forward_s"],
            "utilization": util,
            "utilization_mean": util.mean(),
            "peak_weight_bytes": peak["peak_weight_bytes"],
            "peak_token_bytes": peak["peak_token_bytes"],
            "onchip_bytes": (peak["peak_weight_bytes"] + peak["peak_token_bytes"]).sum(),
            "tokens_per_s": state.tokens / jnp.maximum(s["forward_s"], 1e-30),
            "layer_latency_per_iter_s": outs,
        }

    return System(name="hydra" if relocate else "ep-mem", init=init, step=step, finish=finish,
                  num_steps=num_iterations, inputs=metrics.inputs(num_iterations))


def _read_options(t):
    opts = dict(attention=t.str("attention", "tp", choices=ep.ATTENTION_MODES),
                context_len=t.int("context_len", 0, lo=0))
    relocate = t.bool("relocate", True)
    t.close()
    return opts, relocate


def check_options(t) -> None:
    """Validate a policy's [options] for Hydra."""
    _read_options(t)


def from_policy(platform: Platform, model: ModelSpec, t, num_iterations: int):
    """(System, params) for Hydra (or EP with memory when relocate = false)."""
    opts, relocate = _read_options(t)
    tp = platform.num_devices if opts["attention"] == "tp" else 1
    cfg = ep.make_config(platform, model, tp_size=tp, **opts)
    return build(cfg, num_iterations, relocate), ep.default_params(cfg)
