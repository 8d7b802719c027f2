"""Traces per second of one wafer EP MoE layer (001): vectorized (jit + vmap) vs a plain
per-trace NumPy loop of the same model, measured side by side in one run.

    .venv/bin/python benchmarks/bench_wafer.py [--hardware wsc-8x8] [--model qwen3-235b-a22b]
        [--mapping er] [--traces 1 64 1024] [--network link_load|eq1]

One MoE layer (attention all-reduce, dispatch + experts + combine, micro-batch pipeline) on
counts-only traces (per-expert token counts, 256 tokens per TP group, power-law popularity).
The NumPy loop is vectorized inside a trace (matrix products for the traffic, link loads from
the incidence matrix) and loops over traces, the way a home-grown script would.
Rates and the ratio are in CPU time (`time.process_time`, every thread of the process) of the
fastest of `--reps` repeats on each side, so a loaded shared machine skews them less than
wall time; the wall-time ratio (also fastest repeats) is printed beside.
"""

from __future__ import annotations

import argparse
import os
import time

import _device  # benchmarks/_device.py: --device, environment line
import jax
import numpy as np

from moejax.catalog.hardware import load_platform
from moejax.catalog.models import load_model, with_overrides
from moejax.physics import eq1
from moejax.runner import engine
from moejax.systems.wafer import allreduce as wallreduce
from moejax.systems.wafer import config as wconfig
from moejax.systems.wafer import layer as wlayer
from moejax.systems.wafer import mapping as mp
from moejax.systems.wafer import system as ws
from moejax.trace import from_counts, gen


def eq1_ports(cfg, traffic):
    """001 Eq. 1 (bw part, latency part) per port [2 D P] of one phase, NumPy."""
    tab = eq1.tables(cfg.topo, cfg.eq1_ports)
    off = traffic * (1 - np.eye(traffic.shape[0]))
    bw_c, lat_c = off * tab.inv_bw, (off > 0) * tab.latency
    return tuple(np.concatenate([np.einsum("sd,sdp->sp", c, tab.out_port).ravel(),
                                 np.einsum("sd,sdp->dp", c, tab.in_port).ravel()])
                 for c in (bw_c, lat_c))


def numpy_layer_eq1(cfg, placement, counts, ar_phases):
    """One trace's layer time in Eq. 1 mode with NumPy (same rules as `system.layer`)."""
    m, dev = cfg.model, cfg.platform.device
    served = placement / placement.sum(1, keepdims=True)
    pairs = mp.holder_shares(cfg.mapping)[:, None] * counts[None, :]
    traffic = np.einsum("hd,hds->sd", pairs @ served, cfg.source_split) * m.token_bytes
    dp, cp = eq1_ports(cfg, traffic), eq1_ports(cfg, traffic.T)
    tok = counts[:, None] * served
    t_exp = np.maximum(tok * m.expert_flops_per_token / dev.flops(cfg.expert_dtype),
                       (tok > 0) * m.expert_weight_bytes / dev.memory_Bps).sum(0).max()
    n_tok = counts.sum() / m.top_k
    att = float(wlayer.attention_s(cfg, n_tok, 0.0))
    best = np.inf
    for mb in cfg.micro_batches:
        ar = sum(steps * (lambda b, la: (b / mb + la).max())(*eq1_ports(cfg, raw * n_tok))
                 for steps, _, _, raw in ar_phases)
        a = [att / mb, ar]
        s = [(dp[0] / mb + dp[1]).max(), t_exp / mb, (cp[0] / mb + cp[1]).max()]
        best = min(best, sum(a) + (mb - 1) * max(a) + sum(s) + (mb - 1) * max(s))
    return best


def numpy_layer(cfg, inc, placement, counts, ar_phases):
    """One trace's layer time with NumPy (hard mode, same rules as `system.layer`)."""
    m, dev = cfg.model, cfg.platform.device
    bw = cfg.topo.link_Bps
    served = placement / placement.sum(1, keepdims=True)
    pairs = mp.holder_shares(cfg.mapping)[:, None] * counts[None, :]
    b = pairs @ served
    traffic = np.einsum("hd,hds->sd", b, cfg.source_split) * m.token_bytes
    parts = []
    for tr in (traffic, traffic.T):
        off = tr * (1 - np.eye(tr.shape[0]))
        loads = np.einsum("sd,sdl->l", off, inc)
        parts.append(((loads / bw).max(), (cfg.topo.path_latency_s * (off > 0)).max()))
    tok = counts[:, None] * served
    t_exp = np.maximum(tok * m.expert_flops_per_token / dev.flops(cfg.expert_dtype),
                       (tok > 0) * m.expert_weight_bytes / dev.memory_Bps).sum(0).max()
    n_tok = counts.sum() / m.top_k
    vol = n_tok / cfg.mapping.num_groups * m.token_bytes
    ar_b = ar_l = 0.0
    for steps, pattern, g, _ in ar_phases:
        loads = np.einsum("sd,sdl->l", pattern * vol / g, inc)
        ar_b += steps * (loads / bw).max()
        ar_l += steps * (cfg.topo.path_latency_s * (pattern > 0)).max()
    att = float(wlayer.attention_s(cfg, n_tok, 0.0))
    best = np.inf
    for mb in cfg.micro_batches:
        a = [att / mb, ar_b / mb + ar_l]
        s = [parts[0][0] / mb + parts[0][1], t_exp / mb, parts[1][0] / mb + parts[1][1]]
        best = min(best, sum(a) + (mb - 1) * max(a) + sum(s) + (mb - 1) * max(s))
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default="wsc-8x8")
    ap.add_argument("--model", default="qwen3-235b-a22b")
    ap.add_argument("--mapping", default="er")
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--traces", type=int, nargs="+", default=[1, 64, 1024])
    ap.add_argument("--numpy-max", type=int, default=64, help="traces timed in the NumPy loop")
    ap.add_argument("--reps", type=int, default=8,
                    help="repeats (JAX calls; NumPy blocks of numpy-max / reps traces): the "
                         "fastest is reported")
    ap.add_argument("--network", default="link_load", choices=("link_load", "eq1"),
                    help="eq1: 001 Eq. 1 mode with bidirectional rings")
    _device.add_argument(ap)
    args = ap.parse_args()
    _device.select(args.device)

    model = with_overrides(load_model(args.model), weight_bytes=1.0)
    cfg = wconfig.make_config(load_platform(args.hardware), model, mapping=args.mapping,
                              tp_size=args.tp, network=args.network,
                              bidirectional_rings=args.network == "eq1")
    params = wconfig.default_params(cfg)
    sysm = ws.build(cfg, 1)
    n = cfg.mapping.num_groups * 256
    inc = cfg.topo.incidence()
    ar = []
    for steps, step in wallreduce.allreduce_phases(cfg, 1.0):
        pattern = (np.asarray(step) > 0).astype(np.float32)
        # eq1: the step's traffic per token (1/g of the group's hidden states, halves each way)
        ar.append((steps, pattern, cfg.mapping.groups.shape[1], np.asarray(step, np.float64)))
    place = np.asarray(params.placement)
    print(f"{args.hardware}, {args.model}, mapping={args.mapping}, TP={args.tp}, "
          f"{n} tokens, one MoE layer, backend={jax.default_backend()}")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; traces/s and "
          "ratio in CPU time (process_time, all threads), wall ratio beside")
    print(f"{'traces':>7} {'jax traces/s':>14} {'numpy traces/s':>15} {'ratio':>8} "
          f"{'wall ratio':>11} {'max |diff|':>11}")
    for t in args.traces:
        p = gen.popularity("powerlaw:alpha=1.2", jax.random.key(t), iterations=t, layers=1,
                           num_experts=model.num_experts)
        rng = np.random.default_rng(t)
        counts = np.stack([rng.multinomial(n * model.top_k, np.asarray(p[i, 0], np.float64)
                                           / float(np.asarray(p[i, 0], np.float64).sum()))
                           for i in range(t)]).astype(np.float32)  # [T, E]
        tr = from_counts(counts[:, None, :], model.top_k)  # [I=T, L=1, E] as a batch below
        batch = jax.tree_util.tree_map(lambda x: x[:, None], tr)  # [T, I=1, L=1, ...]
        out = engine.simulate(sysm, params, batch)  # compile + run
        jax.block_until_ready(out["layer_s"])
        jax_w = jax_s = np.inf
        for _ in range(args.reps):  # the fastest repeat: the least disturbed by other load
            t0, c0 = time.perf_counter(), time.process_time()
            out = engine.simulate(sysm, params, batch)
            jax.block_until_ready(out["layer_s"])
            jax_w = min(jax_w, time.perf_counter() - t0)
            jax_s = min(jax_s, time.process_time() - c0)
        k = min(t, args.numpy_max)
        def one(c):
            if args.network == "eq1":
                return numpy_layer_eq1(cfg, place, c, ar)
            return numpy_layer(cfg, inc, place, c, ar)

        one(counts[0])  # warm-up (NumPy / BLAS first-call cost)
        ref, np_w, np_s = [], np.inf, np.inf
        blk = max(1, k // args.reps)
        for a in range(0, k, blk):  # blocks of traces, the fastest block per trace
            t0, c0 = time.perf_counter(), time.process_time()
            ref += [one(counts[i]) for i in range(a, min(a + blk, k))]
            n_b = min(a + blk, k) - a
            np_w = min(np_w, (time.perf_counter() - t0) / n_b * t)
            np_s = min(np_s, (time.process_time() - c0) / n_b * t)
        diff = float(np.max(np.abs(np.asarray(out["layer_s"])[:k] - np.asarray(ref))
                            / np.asarray(ref)))
        print(f"{t:>7} {t / jax_s:>14.1f} {t / np_s:>15.1f} {np_s / jax_s:>8.1f} "
              f"{np_w / jax_w:>11.1f} {diff:>11.2e}")


if __name__ == "__main__":
    main()
