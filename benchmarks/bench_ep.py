"""Traces per second of the synchronous-EP layer model: vectorized (jit + vmap) vs a
plain per-trace NumPy loop of the same model, measured side by side in one run.

    .venv/bin/python benchmarks/bench_ep.py [--hardware chiplet-2x2] [--model qwen3-30b-a3b]

The NumPy loop is vectorized inside a trace (matrix products for traffic, link loads from
the incidence matrix) and loops over traces, the way a home-grown script would.
"""

from __future__ import annotations

import argparse
import time

import _device  # benchmarks/_device.py: --device, environment line
import jax
import numpy as np

from moejax.catalog.hardware import load_platform
from moejax.catalog.models import load_model
from moejax.runner import engine
from moejax.systems import ep
from moejax.trace import gen


def numpy_layer_latency(cfg, placement, ids, mask, counts):
    """One trace's mean layer latency with NumPy (hard mode), [I, L] looped in Python."""
    m, dev = cfg.model, cfg.platform.device
    peak, bw = dev.flops(cfg.dtype), dev.memory_Bps
    d, e = cfg.num_devices, m.num_experts
    inc = INC[id(cfg)]
    owner = np.eye(d)[ep.token_owner(cfg, ids.shape[-2])]
    bw_l = cfg.topo.link_Bps
    total, n_it = 0.0, 0
    for i in range(ids.shape[0]):
        lat = []
        for layer in range(ids.shape[1]):
            routed = np.zeros((ids.shape[2], e))
            np.add.at(routed, (np.repeat(np.arange(ids.shape[2]), ids.shape[3]),
                               ids[i, layer].ravel()), 1.0)
            routed *= mask[i][:, None]
            traffic = owner.T @ routed @ placement * m.token_bytes
            np.fill_diagonal(traffic, 0.0)
            comm = 0.0
            for tr in (traffic, traffic.T):
                loads = np.einsum("sd,sdl->l", tr, inc)
                comm += (loads / bw_l).max() + (cfg.topo.path_latency_s * (tr > 0)).max()
            tok = (counts[i, layer][:, None] * placement).T
            t = np.maximum(tok * m.expert_flops_per_token / peak,
                           (tok > 0) * m.expert_weight_bytes / bw).sum(-1)
            lat.append(comm + t.max())
        total += np.mean(lat)
        n_it += 1
    return total / n_it


INC: dict[int, np.ndarray] = {}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default="chiplet-2x2")
    ap.add_argument("--model", default="qwen3-30b-a3b")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--sizes", default="1,16,256,4096")
    ap.add_argument("--numpy-traces", type=int, default=128,
                    help="traces timed per NumPy round (its rate is per trace)")
    _device.add_argument(ap)
    args = ap.parse_args()
    _device.select(args.device)
    platform, model = load_platform(args.hardware), load_model(args.model)
    cfg = ep.make_config(platform, model)
    INC[id(cfg)] = cfg.topo.incidence()
    params = ep.default_params(cfg)
    system = ep.build(cfg, 1)
    sizes = [int(s) for s in args.sizes.split(",")]
    traces = gen.generate("powerlaw:alpha=1.2", jax.random.key(0), num_traces=max(sizes),
                          iterations=1, layers=1, tokens=args.tokens,
                          num_experts=model.num_experts, top_k=model.top_k)
    print(f"EP layer model, {model.name} on {platform.name}, {args.tokens} tokens, "
          f"{jax.devices()[0].platform} backend")

    ids, mask = np.asarray(traces.expert_ids), np.asarray(traces.token_mask)
    counts, place = np.asarray(traces.counts), np.asarray(params.placement)
    n_np = min(args.numpy_traces, max(sizes))

    def numpy_rate():
        t0 = time.perf_counter()
        lat = [numpy_layer_latency(cfg, place, ids[t], mask[t], counts[t]) for t in range(n_np)]
        return n_np / (time.perf_counter() - t0), lat

    def jax_rate(sub, n):
        reps = max(1, 16384 // max(n, 8))  # rounds of tens of ms, not one short call
        t0 = time.perf_counter()
        for _ in range(reps):
            out = engine.simulate(system, params, sub, progress=False)
            jax.block_until_ready(out)
        return n * reps / (time.perf_counter() - t0), out

    # The machine is shared: interleave the two and keep each one's best of 5 rounds.
    print(f"{'traces':>8} {'jax traces/s':>14} {'numpy traces/s':>15} {'ratio':>8}")
    for n in sizes:
        sub = traces[:n]
        jax.block_until_ready(engine.simulate(system, params, sub, progress=False))  # compile
        best_np, best_jax = 0.0, 0.0
        for _ in range(5):
            r_np, np_lat = numpy_rate()
            r_jax, out = jax_rate(sub, n)
            best_np, best_jax = max(best_np, r_np), max(best_jax, r_jax)
        print(f"{n:>8} {best_jax:>14.1f} {best_np:>15.1f} {best_jax / best_np:>7.1f}x")
    same = np.allclose(np.asarray(out["latency_s"])[:n_np], np_lat, rtol=1e-4)
    print(f"vectorized == numpy loop on {n_np} traces: {same}")


if __name__ == "__main__":
    main()
