"""Import speed and memory of large recordings: writes a ~50 MB ESFT-format recording and a
JSONL one of the same routing (generated), imports each, prints seconds, MB/s and peak RSS.

    .venv/bin/python benchmarks/bench_import.py [--mb 50] [--dir /tmp/moejax_bench_import]
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import _device  # benchmarks/_device.py: --device, environment line
import numpy as np

from moejax.trace import importers

E, K, LAYERS = 64, 6, 26


def write_esft(folder: Path, target_mb: float, rng) -> tuple[int, int]:
    """ESFT layout: 26 layer files, one line per sequence of ~200 tokens."""
    folder.mkdir(parents=True, exist_ok=True)
    per_token_bytes = K * (3 + 7) * LAYERS  # ~ids "12\t" + weights "0.1234\t"
    tokens = int(target_mb * 1e6 / per_token_bytes)
    lengths = rng.integers(100, 300, size=tokens // 200 + 1)
    lengths = lengths[np.cumsum(lengths) <= tokens]
    p = rng.dirichlet(np.full(E, 0.5))
    handles = [open(folder / f"expert_weights_{layer + 1}.txt", "w") for layer in range(LAYERS)]
    try:
        for t in lengths:  # writing the input, not the code under test
            for f in handles:
                g = np.log(p) + rng.gumbel(size=(t, E))
                ids = np.argsort(-g, axis=-1)[:, :K]
                w = np.round(rng.uniform(0.01, 0.2, size=(t, K)), 4)
                f.write("\t".join(map(str, ids.ravel())) + "\t\t"
                        + "\t".join(f"{x:.4f}" for x in w.ravel()) + "\n")
    finally:
        for f in handles:
            f.close()
    return len(lengths), int(lengths.sum())


def write_jsonl(path: Path, target_mb: float, rng) -> int:
    """Per-step records of 64 tokens for each of 26 layers."""
    p = rng.dirichlet(np.full(E, 0.5))
    size, step = 0, 0
    with open(path, "w") as f:
        f.write(json.dumps({"num_experts": E, "top_k": K}) + "\n")
        while size < target_mb * 1e6:
            for layer in range(LAYERS):
                g = np.log(p) + rng.gumbel(size=(64, E))
                ids = np.argsort(-g, axis=-1)[:, :K]
                w = np.round(rng.uniform(0.01, 0.2, size=(64, K)), 4)
                line = json.dumps({"step": step, "layer": layer, "experts": ids.tolist(),
                                   "weights": w.tolist()}) + "\n"
                f.write(line)
                size += len(line)
            step += 1
    return step


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=50.0)
    ap.add_argument("--dir", default="/tmp/moejax_bench_import")
    _device.add_argument(ap)
    args = ap.parse_args()
    _device.select(args.device)
    rng = np.random.default_rng(0)
    root = Path(args.dir)
    esft = root / "esft"
    if not (esft / "expert_weights_26.txt").exists():
        write_esft(esft, args.mb, rng)
    jsonl = root / "routing.jsonl"
    if not jsonl.exists():
        write_jsonl(jsonl, args.mb, rng)
    esft_mb = sum(f.stat().st_size for f in esft.iterdir()) / 1e6
    rss0 = peak_rss_mb()
    t0 = time.perf_counter()
    tr, meta = importers.import_esft(esft)
    dt = time.perf_counter() - t0
    print(f"esft  {esft_mb:6.1f} MB  {dt:6.2f} s  {esft_mb / dt:6.1f} MB/s  "
          f"{meta['tokens']} tokens x {LAYERS} layers  trace {tr.expert_ids.shape}  "
          f"peak RSS {peak_rss_mb():.0f} MB (before {rss0:.0f} MB)")
    j_mb = jsonl.stat().st_size / 1e6
    t0 = time.perf_counter()
    tr, meta = importers.import_jsonl(jsonl)
    dt = time.perf_counter() - t0
    print(f"jsonl {j_mb:6.1f} MB  {dt:6.2f} s  {j_mb / dt:6.1f} MB/s  "
          f"{meta['tokens']} tokens x {LAYERS} layers  trace {tr.expert_ids.shape}  "
          f"peak RSS {peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    main()
