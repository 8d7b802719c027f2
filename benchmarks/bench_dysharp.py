"""DySHARP layer-traces per second vs the plain-Python reference, measured side by side.

    .venv/bin/python benchmarks/bench_dysharp.py [--tokens 256] [--ref-traces 8] [--repeat 3]

deepseek-v3 on gh200-nvl32, `normal:std=0.032` routing, one MoE layer per trace, the
`dysharp` catalog policy (dynamic multimem, fused schedule) through `moejax.runner.engine.simulate`
at 1 / 64 / 1024 traces. Compile time is excluded (a warm-up call of the same shape). The
reference (`moejax.systems.dysharp.reference.moe_layer`) runs `--ref-traces` of the same
layers in Python loops; its rate is per trace, and both latencies are compared on them.
Best of `--repeat` on both sides (the CPU may be shared). Rates are given in wall time and in
CPU time of this process (`time.process_time`, all its threads): on a shared, loaded machine
the wall rate of the multi-threaded vectorized path suffers more than the single-threaded
reference's, so the CPU-time ratio is the one that carries over to an idle machine.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from moejax.catalog.hardware import load_platform
from moejax.catalog.models import load_model
from moejax.runner import engine
from moejax.systems.dysharp import reference
from moejax.systems.dysharp import system as dys
from moejax.systems.dysharp.config import DyParams, contiguous_placement, make_config
from moejax.trace import gen


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=256, help="sampled tokens per trace")
    ap.add_argument("--ref-traces", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    model = load_model("deepseek-v3")
    platform = load_platform("gh200-nvl32")
    cfg = make_config(platform, model, tokens_per_gpu=8192)
    system = dys.build(cfg, 1)
    place = contiguous_placement(model.num_experts, platform.num_devices)
    params = DyParams(placement=jnp.asarray(place))
    traces = gen.generate("normal:std=0.032", jax.random.key(0), num_traces=1024,
                          iterations=1, layers=1, tokens=args.tokens,
                          num_experts=model.num_experts, top_k=model.top_k)
    ids, mask, counts = (np.asarray(traces.expert_ids), np.asarray(traces.token_mask),
                         np.asarray(traces.counts))
    best_ref = cpu_ref = float("inf")
    for _ in range(args.repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        ref = [reference.moe_layer(cfg, ids[i, 0, 0], mask[i, 0], counts[i, 0, 0], place)
               for i in range(args.ref_traces)]
        best_ref = min(best_ref, time.perf_counter() - t0)
        cpu_ref = min(cpu_ref, time.process_time() - c0)
    ref_rate, ref_cpu = args.ref_traces / best_ref, args.ref_traces / cpu_ref
    print(f"reference: {ref_rate:,.1f} layer-traces/s wall, {ref_cpu:,.1f} per CPU-s "
          f"({args.ref_traces} traces)")
    for n in (1, 64, 1024):
        sub = jax.tree_util.tree_map(lambda x, n=n: x[:n], traces)
        jax.block_until_ready(engine.simulate(system, params, sub))  # compile
        best = cpu = float("inf")
        for _ in range(args.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            out = jax.block_until_ready(engine.simulate(system, params, sub))
            best = min(best, time.perf_counter() - t0)
            cpu = min(cpu, time.process_time() - c0)
        rate = n / best
        print(f"vectorized, {n:5d} traces: {rate:,.1f} layer-traces/s wall = "
              f"{rate / ref_rate:,.1f}x the reference; {n / cpu:,.1f} per CPU-s = "
              f"{n / cpu / ref_cpu:,.1f}x")
    k = min(args.ref_traces, 1024)
    diff = np.max(np.abs(np.asarray(out["latency_s"][:k])
                         - np.array([r["latency_s"] for r in ref[:k]]))
                  / np.array([r["latency_s"] for r in ref[:k]]))
    print(f"max relative latency difference vs the reference: {diff:.2e}")


if __name__ == "__main__":
    main()
