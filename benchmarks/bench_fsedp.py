"""FSE-DP layer-traces per second vs the plain-Python reference, measured side by side.

    .venv/bin/python benchmarks/bench_fsedp.py [--ablation A2] [--ref-traces 4] [--chunk 64]
                                               [--repeat 3]

qwen3-30b-a3b, 256 tokens per iteration, chiplet-2x2, one MoE layer per trace
(`moejax.runner.engine.simulate` on the `fsedp` system: routing -> tokens per die -> Algorithm 1 +
Rules 1-4 event scan). Compile time is excluded (a warm-up call on the same chunk shape).
The reference (`moejax.systems.fsedp.reference.simulate_layer`) runs the same layers in a
plain-Python event loop; both latencies are compared on the reference's traces. Each side
is timed `--repeat` times and the best time is kept (the CPU may be shared: best-of-N on
both sides keeps the ratio from following other jobs' load).
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
from moejax.systems.fsedp import build, default_params, layer, make_config, reference
from moejax.trace import gen


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ablation", default="A2", help="A2 (policy fsedp) or A3 / A4")
    ap.add_argument("--ref-traces", type=int, default=4)
    # 64: on a 2-core CPU the event loop's per-step [T, D, E] arrays then stay in cache;
    # 1024 traces ran ~1.7x faster than with 256 per call (docs/reproduction/fsedp.md)
    ap.add_argument("--chunk", type=int, default=64, help="traces per compiled call")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per side; best kept")
    _device.add_argument(ap)
    args = ap.parse_args()
    _device.select(args.device)
    model = load_model("qwen3-30b-a3b")
    cfg = make_config(load_platform("chiplet-2x2"), model, ablation=args.ablation)
    params = default_params(cfg)
    system = build(cfg, 1)
    tr = gen.generate("powerlaw:alpha=1.2", jax.random.key(0), num_traces=1024, iterations=1,
                      layers=1, tokens=256, num_experts=model.num_experts, top_k=model.top_k)
    sub = lambda n: jax.tree_util.tree_map(lambda x: x[:n], tr)  # noqa: E731
    print(f"fsedp {args.ablation}, qwen3-30b-a3b, 256 tokens, chiplet-2x2, "
          f"{float(params.num_microslices):g} micro-slices; {jax.devices()[0].platform}; "
          f"best of {args.repeat} runs per side")
    rates = {}
    for n in (1, 64, 1024):
        c = min(n, args.chunk)
        engine.simulate(system, params, sub(c), chunk_size=c, progress=False)  # compile
        dt = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            out = engine.simulate(system, params, sub(n), chunk_size=c, progress=False)
            jax.block_until_ready(out)
            dt = min(dt, time.perf_counter() - t0)
        rates[n] = n / dt
        print(f"  vectorized {n:5d} traces: {dt:8.3f} s  {rates[n]:9.1f} layer-traces/s")
    lat = np.asarray(out["latency_s"])
    k = args.ref_traces
    toks = [np.asarray(layer.tokens_per_die(cfg, tr.expert_ids[t, 0, 0], tr.token_mask[t, 0],
                                            tr.counts[t, 0, 0])) for t in range(k)]
    dt = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        ref = [reference.simulate_layer(cfg, float(params.num_microslices), tok)["latency_s"]
               for tok in toks]
        dt = min(dt, time.perf_counter() - t0)
    ref_rate = k / dt
    err = float(np.max(np.abs(lat[:k] - np.asarray(ref)) / np.asarray(ref)))
    print(f"  reference  {k:5d} traces: {dt:8.3f} s  {ref_rate:9.2f} layer-traces/s "
          f"(max rel. latency diff vs vectorized {err:.1e})")
    for n in (1, 64, 1024):
        print(f"  ratio at {n:5d} traces: {rates[n] / ref_rate:7.1f}x")


if __name__ == "__main__":
    main()
