"""Layer-traces per second of EP, FSE-DP and the wafer layer through `engine.simulate` at
1 / 1k / 64k traces on one backend: the numbers behind docs/performance.md's GPU section.

    .venv/bin/python benchmarks/bench_backends.py --device cpu [--sizes 1,1024,65536]
    python3 benchmarks/bench_backends.py --device gpu            # on a machine with a GPU

Run it once with `--device cpu` on the 2-core machine and once with `--device gpu` the same
day; the ratio of the two rates is the GPU's speed-up. Each size is compiled
first (the compile is timed and printed apart), then timed `--repeat` times: the fastest
repeat is kept, in wall time after `block_until_ready`, with the CPU time of the process
(`time.process_time`, every thread) of that repeat beside it: on a shared CPU machine the
CPU-time rate is the one that does not follow other jobs' load. The chunk size is the engine's
default for the backend (512 traces on CPU; on an accelerator 8,192, or the system's own
`accelerator_chunk`) unless `--chunk` (a comma list compares several).

Workloads (those of bench_ep / bench_fsedp / bench_wafer): qwen3-30b-a3b, 256 tokens, one MoE
layer on chiplet-2x2 for EP and FSE-DP (A2, the `fsedp` policy); qwen3-235b-a22b on wsc-8x8
(ER mapping, TP 4, Eq. 1 network) for the wafer. 1,024 distinct power-law traces are
generated and tiled to the larger sizes (the generator's Gumbel scores for 64k traces of
256 tokens would need 8.6 GB; the simulated work per trace is the same).
AMoE is a request stream, not a batch of traces: its GPU numbers come from
`bench_amoe.py --rounds --device gpu --batch N`.
"""

from __future__ import annotations

import argparse
import time

import _device  # benchmarks/_device.py: --device, environment line
import jax
import numpy as np

from moejax.catalog.hardware import load_platform
from moejax.catalog.models import load_model, with_overrides
from moejax.runner import engine
from moejax.systems import ep, fsedp
from moejax.systems.wafer import config as wconfig
from moejax.systems.wafer import system as ws
from moejax.trace import from_counts, gen

DISTINCT = 1024


def tile(tr, n):
    """The first n traces of `tr` repeated along the trace axis (host arrays)."""
    def one(x):
        x = np.asarray(x)
        return np.concatenate([x] * -(-n // x.shape[0]))[:n]
    return jax.tree_util.tree_map(one, tr)


def resident(tr):
    """The batch put on the default device once: `engine.simulate` then slices each chunk
    there (the engine slices it) instead of copying it from the host, as when the traces are
    generated on the device."""
    return jax.device_put(tr)


def routed(model, n):
    tr = gen.generate("powerlaw:alpha=1.2", jax.random.key(0), num_traces=min(n, DISTINCT),
                      iterations=1, layers=1, tokens=256, num_experts=model.num_experts,
                      top_k=model.top_k)
    return tile(tr, n)


def counts_only(model, groups, n):
    """Counts-only wafer traces as bench_wafer makes them ([T, I=1, L=1, E])."""
    k = min(n, DISTINCT)
    p = np.asarray(gen.popularity("powerlaw:alpha=1.2", jax.random.key(1), iterations=k,
                                  layers=1, num_experts=model.num_experts)[:, 0], np.float64)
    rng = np.random.default_rng(1)
    counts = rng.multinomial(groups * 256 * model.top_k, p / p.sum(-1, keepdims=True))
    tr = from_counts(counts.astype(np.float32)[:, None, :], model.top_k)
    return tile(jax.tree_util.tree_map(lambda x: x[:, None], tr), n)


def peak_header() -> str:
    return f" {'peak GB':>8}" if peak() else ""


def peak() -> str:
    """The device's peak memory in use so far (accelerators report it; CPU does not)."""
    stats = jax.devices()[0].memory_stats() or {}
    return f" {stats['peak_bytes_in_use'] / 1e9:>8.2f}" if "peak_bytes_in_use" in stats else ""


def systems(names):
    q3 = load_model("qwen3-30b-a3b")
    chip = load_platform("chiplet-2x2")
    if "ep" in names:
        cfg = ep.make_config(chip, q3)
        yield "ep", ep.build(cfg, 1), ep.default_params(cfg), lambda n: routed(q3, n)
    if "fsedp" in names:
        cfg = fsedp.make_config(chip, q3, ablation="A2")
        yield "fsedp", fsedp.build(cfg, 1), fsedp.default_params(cfg), lambda n: routed(q3, n)
    if "wafer" in names:
        big = with_overrides(load_model("qwen3-235b-a22b"), weight_bytes=1.0)
        cfg = wconfig.make_config(load_platform("wsc-8x8"), big, mapping="er", tp_size=4,
                                  network="eq1", bidirectional_rings=True)
        g = cfg.mapping.num_groups
        yield "wafer", ws.build(cfg, 1), wconfig.default_params(cfg), \
            lambda n: counts_only(big, g, n)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--systems", default="ep,fsedp,wafer", help="comma list of ep,fsedp,wafer")
    ap.add_argument("--sizes", default="1,1024,65536")
    ap.add_argument("--chunk", default="0",
                    help="traces per compiled call, or a comma list to compare (0: default)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--resident", action="store_true",
                    help="traces live on the device (no host-to-device copy per chunk)")
    _device.add_argument(ap)
    args = ap.parse_args()
    backend = _device.select(args.device)
    sizes = [int(s) for s in args.sizes.split(",")]
    names = set(args.systems.split(","))
    chunks = [int(c) for c in args.chunk.split(",")]
    print(f"{'system':<7} {'traces':>7} {'chunk':>6} {'compile s':>10} {'best s':>9} "
          f"{'traces/s':>12} {'CPU-s':>8} {'per CPU-s':>12}{peak_header()}")
    for name, system, params, make in systems(names):
        for n, given in ((n, c) for n in sizes for c in chunks):
            tr = make(n)
            chunk = min(n, given or engine.default_chunk(tr, system))
            if args.resident:
                tr = resident(tr)
            t0 = time.perf_counter()  # compile: one call on one chunk
            jax.block_until_ready(engine.simulate(system, params, tile(tr, chunk),
                                                  chunk_size=chunk, progress=False))
            comp = time.perf_counter() - t0
            best, cpu = float("inf"), float("inf")
            for _ in range(args.repeat):
                t0, c0 = time.perf_counter(), time.process_time()
                out = engine.simulate(system, params, tr, chunk_size=chunk, progress=False)
                jax.block_until_ready(out)
                best = min(best, time.perf_counter() - t0)
                cpu = min(cpu, time.process_time() - c0)
            print(f"{name:<7} {n:>7} {chunk:>6} {comp:>10.2f} {best:>9.4f} {n / best:>12.1f} "
                  f"{cpu:>8.3f} {n / cpu:>12.1f}{peak()}", flush=True)
    print(f"backend {backend}: done")


if __name__ == "__main__":
    main()
