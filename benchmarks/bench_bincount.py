"""The dispatch histogram behind EP on a GPU: `ops.bincount` with int16, int32 and float32
counts, a default-vmap scatter, and the whole EP layer with int16 or int32 counts.

    python3 benchmarks/bench_bincount.py --device gpu [--traces 65536]

Why it exists: at 64k resident traces on an H100 (2026-11-26, docs/results/gpu/h100/
bincount_gpu.txt) EP ran 25.8 ms per call with int16 counts and 2.7 ms with int32: a GPU has
no 16-bit atomic add, so XLA emulates each int16 scatter-add with a compare-and-swap loop on
the 32-bit word around it, and 2,048 (token, choice) pairs land on 512 bins per trace. On CPU
int16 is the faster one (docs/performance.md, "What the layer costs"), so `ops.bincount`
narrows mask counts to int16 on CPU only. Keys are [T, 2048] in [-1, 512) (EP's 256 tokens x
top-8 into 4 devices x 128 experts); each line is the best of 5 calls after a compile.
"""

from __future__ import annotations

import argparse
import time

import _device  # benchmarks/_device.py: --device, environment line
import jax
import jax.numpy as jnp

from moejax import ops
from moejax.catalog.hardware import load_platform
from moejax.catalog.models import load_model
from moejax.runner import engine
from moejax.systems import ep


def best(f, *args, repeat=5) -> float:
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=int, default=65536)
    _device.add_argument(ap)
    args = ap.parse_args()
    _device.select(args.device)
    n = args.traces
    default_narrow = ops._narrow_counts
    keys = jax.random.randint(jax.random.key(0), (n, 2048), -1, 512)
    for name, dtype in [("bool mask -> int16", None), ("int32", jnp.int32),
                        ("float32", jnp.float32)]:
        ops._narrow_counts = lambda: True
        weights = keys >= 0 if dtype is None else (keys >= 0).astype(dtype)
        f = jax.jit(jax.vmap(lambda k, w: ops.bincount(k, w, 512)))
        print(f"bincount {name:<20} {best(f, keys, weights) * 1e3:9.2f} ms", flush=True)
    f = jax.jit(jax.vmap(lambda k: jnp.zeros(512, jnp.int32).at[k].add(1, mode="drop")))
    print(f"default-vmap scatter (int32)  {best(f, keys) * 1e3:9.2f} ms", flush=True)

    import bench_backends  # the same EP workload as the backend table

    q3 = load_model("qwen3-30b-a3b")
    cfg = ep.make_config(load_platform("chiplet-2x2"), q3)
    traces = jax.device_put(bench_backends.routed(q3, n))
    for name, narrow in [("EP layer, int16 counts", True), ("EP layer, int32 counts", False)]:
        ops._narrow_counts = lambda narrow=narrow: narrow
        system, params = ep.build(cfg, 1), ep.default_params(cfg)  # a fresh compile

        def run(system=system, params=params):
            return engine.simulate(system, params, traces, chunk_size=n, progress=False)

        s = best(run)
        print(f"{name:<29} {s * 1e3:9.2f} ms  {n / s / 1e6:8.2f} M traces/s", flush=True)
    ops._narrow_counts = default_narrow


if __name__ == "__main__":
    main()
