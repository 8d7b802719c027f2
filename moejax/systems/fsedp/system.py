"""FSE-DP over the iterations of a trace: MoE layers (Algorithm 1, Rules 1-5), attention
with head parallelism over the dies (§VI-C), token buffering (Algorithm 2) across iterations.

One engine step = one forward iteration; its layers run through `layer.moe_layer` one after
another (`lax.map`; token buffering has decided each layer's tokens beforehand).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from moejax import relax
from moejax.catalog.hardware import Platform
from moejax.catalog.models import ModelSpec
from moejax.system import System
from moejax.systems import ep, metrics
from moejax.systems.fsedp import buffering
from moejax.systems.fsedp.config import (
    ABLATIONS,
    D2D_ACCOUNTING,
    DDR_LOADING,
    DEFAULT_CTRL_OVERHEAD_S,
    SHARED,
    FSEDPConfig,
    FSEDPParams,
    check_microslices,
    make_config,
    min_microslices,
)
from moejax.systems.fsedp.layer import (
    hardware_of,
    moe_layer,
    token_owner,
    tokens_per_die,
    with_shared,
)
from moejax.trace import Trace


@struct.dataclass
class FSEDPState:
    """Token buffering's carry (Algorithm 2) and the metrics over iterations."""

    buf: buffering.BufferState
    run: metrics.Running


def attention_config(cfg: FSEDPConfig) -> ep.EPConfig:
    """Head-parallel attention over all dies (000 §VI-C), timed by `ep.attention_time_s`."""
    return ep.make_config(cfg.platform, cfg.model, attention="tp", tp_size=cfg.num_devices)


def token_bytes_per_die(cfg: FSEDPConfig, token_mask, n_tokens):
    """[D]: one copy of each token's activation and output on its die (§VI-B, no replicas)."""
    d = cfg.num_devices
    if token_mask.shape[-1] > 0:
        owned = token_mask.astype(jnp.float32) @ jax.nn.one_hot(
            token_owner(token_mask.shape[-1], d), d)
    else:
        owned = jnp.full((d,), n_tokens / d)
    return 2.0 * owned * cfg.model.token_bytes


def build(cfg: FSEDPConfig, num_iterations: int, num_layers: int | None = None) -> System:
    """FSE-DP as an init / step / finish system over `num_iterations` iterations."""
    d = cfg.num_devices
    att_cfg = attention_config(cfg)
    mod = cfg.model
    flop_per_tok_s = mod.expert_flops_per_token / cfg.peak_flops

    # sums over iterations with tokens: busy_s [D, 3] busy time per die (compute, DDR, D2D)
    # per mean layer; flop_s [D] expert FLOPs / peak per die per mean layer (no control
    # overhead). Totals: deferrals, and layers whose event loop ran out of steps (should
    # stay 0). Peaks: on-chip bytes per die.
    sums = {"layer_latency_s": (), "forward_s": (), "busy_s": (d, 3), "flop_s": (d,),
            "tokens_done": ()}
    totals = {"deferrals": (), "unfinished": ()}
    peaks = {"peak_weight_bytes": (d,), "peak_token_bytes": (d,)}

    def init(params: FSEDPParams, trace: Trace, key):
        del key
        n_l = trace.counts.shape[-2]
        return FSEDPState(buffering.init_state(cfg, n_l),
                          metrics.Running.zeros(sums, totals, peaks))

    def step(params: FSEDPParams, state: FSEDPState, it: metrics.Iteration):
        m = jnp.maximum(relax.round(params.num_microslices, params.tau), 1.0)
        ids, mask, counts = it.expert_ids, it.token_mask, it.counts
        n_tokens = counts[0].sum() / mod.top_k
        if cfg.token_buffering and ids.shape[-2] > 0:
            tok_r, size_r = buffering.tokens_per_request(cfg, ids, mask)
            tok_l, done_tok, deferred, buf = buffering.plan_iteration(
                cfg, state.buf, tok_r, size_r, True, params)
        else:
            tok_l = jax.vmap(lambda i, c: tokens_per_die(cfg, i, mask, c))(ids, counts)
            done_tok, deferred, buf = n_tokens, jnp.float32(0.0), state.buf
        tok_l = with_shared(cfg, tok_l)  # shared experts streamed as extra units
        hw = hardware_of(cfg, params)  # FSEDPParams bandwidths / buffer (§VI-D sweeps)
        # layers in sequence (lax.map), each vmapped over traces by the runner: a nested
        # [T, L] vmap ran the event scan 2x slower on CPU at L = 1 (benchmarks/bench_fsedp.py)
        layers = jax.lax.map(lambda tk: moe_layer(cfg, m, tk, tk.sum(0), hw), tok_l)
        tau_s = params.tau * mod.expert_weight_bytes / cfg.ddr_Bps
        att, _ = ep.attention_time_s(att_cfg, n_tokens, tau_s)
        dense = ep.dense_ffn_time_s(att_cfg, n_tokens, tau_s)
        lat = layers["latency_s"]
        forward = (lat.mean() * mod.num_sparse_layers + mod.num_layers * att
                   + mod.num_dense_layers * dense)
        run = state.run.add(metrics.real_iteration(n_tokens), {
            "layer_latency_s": lat.mean(),
            "forward_s": forward,
            "busy_s": layers["busy_s"].mean(0),
            "flop_s": flop_per_tok_s * (
                jnp.broadcast_to(tok_l.sum((-1, -2)).mean() / d, (d,)) if cfg.naive  # A1: even
                else tok_l.sum(-1).mean(0)),
            "tokens_done": done_tok,
        }, totals={
            "deferrals": deferred,
            "unfinished": (~layers["finished"]).sum().astype(jnp.float32),
        }, peaks={
            "peak_weight_bytes": layers["peak_weight_bytes"].max(0),
            "peak_token_bytes": token_bytes_per_die(cfg, mask, n_tokens),
        })
        return state.replace(buf=buf, run=run), lat.mean()

    def finish(params: FSEDPParams, state: FSEDPState, outs):
        s, peak = state.run.sums, state.run.peaks
        lat = jnp.maximum(s["layer_latency_s"], 1e-30)
        # [D, 3], compute including the per-micro-slice overhead
        util = metrics.share_of(s["busy_s"], lat)
        pe = metrics.share_of(s["flop_s"], lat)  # [D] PE-array use: expert FLOPs only, as EP's
        mean = state.run.means()
        return {
            "latency_s": mean["layer_latency_s"],
            "forward_s": mean["forward_s"],
            "utilization": pe,
            "utilization_mean": pe.mean(),
            "utilization_split": util,
            "peak_weight_bytes": peak["peak_weight_bytes"],
            "peak_token_bytes": peak["peak_token_bytes"],
            "onchip_bytes": (peak["peak_weight_bytes"] + peak["peak_token_bytes"]).sum(),
            "tokens_per_s": s["tokens_done"] / jnp.maximum(s["forward_s"], 1e-30),
            "deferrals": state.run.totals["deferrals"],
            "unfinished_layers": state.run.totals["unfinished"],
            "layer_latency_per_iter_s": outs,
        }

    return System(name="fsedp", init=init, step=step, finish=finish, num_steps=num_iterations,
                  inputs=metrics.inputs(num_iterations))


# --- policy options ------------------------------------------------------------------------


def _read_options(t):
    ablation = t.str("ablation", "A3", choices=tuple(ABLATIONS))
    opts = dict(
        ablation=ablation,
        slack=t.float("slack", 0.2, hi=1.0),
        theta_min=t.float("theta_min", 2.0, positive=False),
        num_requests=t.int("num_requests", 4, lo=1),
        weight_buffer_bytes=t.float("weight_buffer_bytes", 0.0, positive=False),
        ctrl_overhead_s=t.float("ctrl_overhead_s", DEFAULT_CTRL_OVERHEAD_S, positive=False),
        ddr_loading=t.str("ddr_loading", "any", choices=DDR_LOADING),
        d2d=t.str("d2d", "link", choices=D2D_ACCOUNTING),
        xfer_overhead_s=t.float("xfer_overhead_s", 0.0, positive=False),
        shared=t.str("shared", "stream", choices=SHARED),
        refill=t.bool("refill", True),
    )
    m = t.float("num_microslices", 8.0, lo=1.0)
    auto = t.bool("raise_microslices_to_fit", True)
    t.close()
    return opts, m, auto


def check_options(t) -> None:
    """Validate a policy's [options] for FSE-DP (names, types, ranges)."""
    _read_options(t)


def from_policy(platform: Platform, model: ModelSpec, t, num_iterations: int):
    """(System, params) for FSE-DP from a policy's options Table."""
    opts, m, auto = _read_options(t)
    cfg = make_config(platform, model, **opts)
    if auto:
        m = max(m, float(min_microslices(cfg)))
    check_microslices(cfg, m)
    return build(cfg, num_iterations), FSEDPParams(num_microslices=jnp.float32(m))
