"""EPS-MoE layer-traces per second vs the plain-Python reference, measured side by side.

    .venv/bin/python benchmarks/bench_epsmoe.py [--tokens 512] [--ref-traces 4] [--repeat 3]

deepseek-v2 on h800x8, DP+EP with the expert pipeline (PN=5, adaptive GEMM switch, GEMM on
116 SMs), device-limited routing, one layer per trace (`moejax.runner.engine.simulate` on the
`epsmoe` system). Compile time is excluded (a warm-up call on the same shape). The
reference (`moejax.systems.epsmoe.reference.block`) runs the same layers as Python loops
over tokens, devices and chunks; both are compared on the reference's traces. Best of
`--repeat` runs per side (the CPU may be shared). Each side reports wall-clock and CPU
time (process_time: all threads of this process, so the vectorized side's CPU-seconds count
both cores it may use); the speedup is given in both, the CPU one being the steadier on a
loaded machine.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from moejax.catalog.hardware import load_platform
from moejax.catalog.models import load_model
from moejax.runner import engine
from moejax.systems.epsmoe import reference
from moejax.systems.epsmoe.config import config_of, default_params, make_config
from moejax.systems.epsmoe.system import build
from moejax.trace import device_limited


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--ref-traces", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    model = load_model("deepseek-v2")
    cfg = make_config(load_platform("h800x8"), model, mode="dp-ep")
    params = default_params(cfg, pn=5, gemm="adaptive", sm_gemm=116)
    system = build(cfg, 1)
    tr = device_limited.generate("uniform", jax.random.key(0), num_traces=1024, iterations=1,
                                 layers=1, tokens=args.tokens, num_experts=160, top_k=6,
                                 num_devices=8, max_devices=3)
    sub = lambda n: jax.tree_util.tree_map(lambda x: x[:n], tr)  # noqa: E731
    print(f"epsmoe dp-ep PN=5, deepseek-v2, {args.tokens} tokens, h800x8; "
          f"{jax.devices()[0].platform}; best of {args.repeat} runs per side")
    rates, cpu_rates = {}, {}
    for n in (1, 64, 1024):
        batch = sub(n)
        jax.block_until_ready(engine.simulate(system, params, batch))
        runs = [_timed(lambda b=batch: jax.block_until_ready(
            engine.simulate(system, params, b))) for _ in range(args.repeat)]
        rates[n] = n / min(r[0] for r in runs)
        cpu_rates[n] = n / min(r[1] for r in runs)
        print(f"  vectorized {n:5d} traces: {rates[n]:10.1f} layer-traces/s wall, "
              f"{cpu_rates[n]:10.1f} per CPU-second")
    rcfg = config_of(cfg, params)
    ids = np.asarray(tr.expert_ids[:args.ref_traces, 0, 0])
    mask = np.asarray(tr.token_mask[:args.ref_traces, 0])

    def ref_all():
        return [reference.block(rcfg, ids[i].tolist(), mask[i].tolist(), 1.0, 2048.0)
                for i in range(args.ref_traces)]

    runs = [_timed(ref_all) for _ in range(args.repeat)]
    ref_rate = args.ref_traces / min(r[0] for r in runs)
    ref_cpu = args.ref_traces / min(r[1] for r in runs)
    got = np.asarray(engine.simulate(system, params, sub(args.ref_traces))["latency_s"])
    want = np.array([r["block_s"] for r in ref_all()])
    print(f"  reference: {ref_rate:10.1f} layer-traces/s wall, {ref_cpu:10.1f} per "
          f"CPU-second; max rel. diff {np.max(np.abs(got / want - 1)):.2e}")
    print(f"  speedup at 1024 traces: {rates[1024] / ref_rate:.0f}x wall, "
          f"{cpu_rates[1024] / ref_cpu:.0f}x CPU")


def _timed(fn):
    """(wall seconds, CPU seconds of this process) of fn()."""
    t, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - c


if __name__ == "__main__":
    main()
