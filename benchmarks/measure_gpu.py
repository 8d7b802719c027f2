"""Measure one GPU against the physics layer: dense GEMM and grouped GEMM (`jax.lax.ragged_dot`)
time vs rows, HBM bandwidth, and a one-GPU MoE layer, each beside moejax's prediction for the
`--hardware` platform (through `moejax.validation.predict`, the adapter `moejax validate` uses).

    python3 benchmarks/measure_gpu.py --hardware dgx-h100 --out docs/results/gpu/measure
    .venv/bin/python benchmarks/measure_gpu.py                 # no GPU: a seconds-long smoke run
    .venv/bin/python benchmarks/measure_gpu.py --smoke         # the smoke run, GPU or not

With a GPU it writes `measure_gpu.csv` (one row per measurement: what, shape, measured and
predicted seconds, their ratio) and `measure_gpu.md` (the environment and the same table) to
`--out`. Without one it says so, runs every measurement at toy sizes on the CPU to check the
harness, and writes only when `--out` is given (its ratios compare a CPU with a GPU's model and
mean nothing). Each case is compiled first, then timed `--repeat` times after
`block_until_ready`; the median is kept.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from moejax.catalog.hardware import load_platform
from moejax.output.results import atomic_write_rows, atomic_write_text
from moejax.validation import predict

GPU_SIZES = dict(ms=(16, 64, 128, 256, 512, 1024, 2048, 4096, 8192), n=4096, k=4096,
                 experts=8, per_expert=(8, 32, 128, 512, 2048), hbm_bytes=4 << 30,
                 moe=dict(tokens=(64, 1024, 8192), experts=8, topk=2, hidden=4096, inter=14336))
SMOKE_SIZES = dict(ms=(8, 32), n=64, k=64, experts=2, per_expert=(4, 16), hbm_bytes=1 << 20,
                   moe=dict(tokens=(16,), experts=4, topk=2, hidden=64, inter=128))


def gpu_present() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


def time_s(fn, *args, repeat: int) -> float:
    """Median wall seconds of `fn(*args)` after one compiling call."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def dense_rows(p, sizes, repeat, key):
    n, k = sizes["n"], sizes["k"]
    w = jax.random.normal(key, (k, n), jnp.bfloat16)
    f = jax.jit(lambda a, b: a @ b)
    out = []
    for m in sizes["ms"]:
        a = jax.random.normal(key, (m, k), jnp.bfloat16)
        t = time_s(f, a, w, repeat=repeat)
        tflops = predict.gemm_dense(p, m=m, n=n, k=k, dtype="bf16", kernel="cublas")
        out.append(("dense GEMM bf16", f"m={m} n={n} k={k}", t, 2 * m * n * k / tflops / 1e12))
    return out


def grouped_rows(p, sizes, repeat, key):
    e, n, k = sizes["experts"], sizes["n"], sizes["k"]
    w = jax.random.normal(key, (e, k, n), jnp.bfloat16)
    f = jax.jit(lambda a, b, g: jax.lax.ragged_dot(a, b, g))
    out = []
    for m in sizes["per_expert"]:
        a = jax.random.normal(key, (e * m, k), jnp.bfloat16)
        groups = jnp.full((e,), m, jnp.int32)
        t = time_s(f, a, w, groups, repeat=repeat)
        tflops = predict.gemm_grouped(p, groups=e, m=m, n=n, k=k, dtype="bf16",
                                      kernel="cublas")
        out.append(("grouped GEMM bf16 (ragged_dot)", f"{e} x m={m} n={n} k={k}", t,
                    2 * e * m * n * k / tflops / 1e12))
    return out


def hbm_rows(p, sizes, repeat, key):
    count = sizes["hbm_bytes"] // 4
    x = jnp.ones((count,), jnp.float32)
    f = jax.jit(lambda v: v * 2.0)
    t = time_s(f, x, repeat=repeat)
    moved = 2 * count * 4  # read + write
    return [("HBM stream (read + write)", f"{moved / 1e9:.3g} GB", t,
             moved / p.device.memory_Bps)]


def moe_layer_fn(topk: int):
    """One MoE layer's expert part on one device: route, sort by expert, up (gate and up),
    SiLU, down, weighted sum back (the vLLM fused-MoE structure, in plain JAX)."""

    def layer(x, router, w_up, w_down):
        e = router.shape[1]
        scores, idx = jax.lax.top_k(x @ router, topk)
        weights = jax.nn.softmax(scores.astype(jnp.float32), axis=-1)
        flat = idx.reshape(-1)
        order = jnp.argsort(flat)
        tokens = jnp.repeat(jnp.arange(x.shape[0]), topk)[order]
        counts = jnp.bincount(flat, length=e).astype(jnp.int32)
        h = jax.lax.ragged_dot(x[tokens], w_up, counts)
        gate, up = jnp.split(h, 2, axis=-1)
        y = jax.lax.ragged_dot(jax.nn.silu(gate) * up, w_down, counts)
        y = y * weights.reshape(-1)[order][:, None].astype(y.dtype)
        return jnp.zeros_like(x).at[tokens].add(y)

    return jax.jit(layer)


def moe_rows(p, sizes, repeat, key):
    c = sizes["moe"]
    e, hidden, inter, topk = c["experts"], c["hidden"], c["inter"], c["topk"]
    ks = jax.random.split(key, 4)
    router = jax.random.normal(ks[0], (hidden, e), jnp.bfloat16)
    w_up = jax.random.normal(ks[1], (e, hidden, 2 * inter), jnp.bfloat16) * 0.02
    w_down = jax.random.normal(ks[2], (e, inter, hidden), jnp.bfloat16) * 0.02
    f = moe_layer_fn(topk)
    out = []
    for tokens in c["tokens"]:
        x = jax.random.normal(ks[3], (tokens, hidden), jnp.bfloat16)
        t = time_s(f, x, router, w_up, w_down, repeat=repeat)
        us = predict.moe_layer(p, tokens=tokens, experts=e, topk=topk, hidden=hidden,
                               inter=inter, dtype="bf16")
        out.append(("MoE layer bf16 (experts)", f"T={tokens} E={e} k={topk} h={hidden} "
                    f"i={inter}", t, us * 1e-6))
    return out


def write(out_dir: Path, rows: list[dict], env: str, hardware: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_rows(out_dir / "measure_gpu.csv", rows)
    lines = [f"# One-GPU measurements vs moejax ({hardware})", "", env, "",
             "| measurement | shape | measured (us) | moejax (us) | moejax / measured |",
             "|---|---|---:|---:|---:|"]
    lines += [f"| {r['what']} | {r['shape']} | {r['measured_s'] * 1e6:.4g} | "
              f"{r['moejax_s'] * 1e6:.4g} | {r['ratio']:.3f} |" for r in rows]
    atomic_write_text(out_dir / "measure_gpu.md", "\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default="dgx-h100",
                    help="platform whose predictions sit beside the measurements")
    ap.add_argument("--out", default=None,
                    help="folder for measure_gpu.csv / .md (with a GPU: default "
                         "docs/results/gpu/measure)")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--smoke", action="store_true", help="toy sizes even when a GPU is present")
    args = ap.parse_args(argv)
    p = load_platform(args.hardware)
    gpu = gpu_present() and not args.smoke
    device = jax.devices("gpu" if gpu else "cpu")[0]
    env = (f"device {device.device_kind} ({device.platform}), jax {jax.__version__}, "
           f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    if gpu:
        jax.config.update("jax_default_device", device)
        sizes, repeat, out = GPU_SIZES, args.repeat, Path(args.out or "docs/results/gpu/measure")
    else:
        print("smoke mode" if args.smoke else "no GPU: smoke mode",
              "(toy sizes on the CPU; ratios mean nothing)")
        sizes, repeat, out = SMOKE_SIZES, 2, Path(args.out) if args.out else None
    print(env)
    key = jax.random.PRNGKey(0)
    rows = []
    for part in (dense_rows, grouped_rows, hbm_rows, moe_rows):
        for what, shape, measured, moejax in part(p, sizes, repeat, key):
            rows.append(dict(what=what, shape=shape, measured_s=measured, moejax_s=moejax,
                             ratio=moejax / measured, gpu=int(gpu)))
            print(f"{what:32s} {shape:36s} measured {measured * 1e6:10.4g} us   "
                  f"moejax {moejax * 1e6:10.4g} us   ratio {moejax / measured:6.3f}")
    if out is not None:
        write(out, rows, env, args.hardware)
        print(f"wrote {out}/measure_gpu.csv, {out}/measure_gpu.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
