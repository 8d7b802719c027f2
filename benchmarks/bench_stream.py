"""Rate and peak memory of `moejax simulate --stream` against the in-memory run.

    .venv/bin/python benchmarks/bench_stream.py [--traces 1000000] [--tokens 256]

Runs `moejax simulate` (EP, qwen3-30b-a3b, chiplet-2x2) as child processes, each with
`--out` (the in-memory run writes results.csv at the end; the streamed one Parquet parts as
it goes), and reads each child's own peak RSS and CPU time from `os.wait4`. Rates are traces
per wall second and per CPU second (user + sys; on a shared machine the CPU rate is the one
that does not depend on the load). Both include the first call's compile. The streamed
run's summary is checked against the in-memory one (p50 / p99 within the sketch's stated
relative error, means to 1e-6).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import _device  # noqa: E402


def run(argv: list[str], device: str) -> dict:
    env = dict(os.environ, JAX_PLATFORMS={"cpu": "cpu", "gpu": "cuda"}[device])
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "moejax.cli.main", *argv], env=env,
                         stdout=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"error: {' '.join(argv)} exited {os.waitstatus_to_exitcode(status)}")
    return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime,
            "peak_rss_gb": ru.ru_maxrss * 1024 / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=int, default=1_000_000)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--modes", default="stream,memory", help="order of the runs")
    _device.add_argument(ap)
    args = ap.parse_args()
    _device.select(args.device)
    base = ["simulate", "--hardware", "chiplet-2x2", "--model", "qwen3-30b-a3b", "--policy",
            "ep", "--tokens", str(args.tokens), "--traces", str(args.traces), "--quiet"]
    print(f"load average at start: {os.getloadavg()}")
    res, summ = {}, {}
    with tempfile.TemporaryDirectory(prefix="bench-stream-") as tmp:
        for mode in args.modes.split(","):
            out = Path(tmp) / mode
            extra = ["--stream"] if mode == "stream" else []
            res[mode] = r = run(base + extra + ["--out", str(out)], args.device)
            summ[mode] = json.loads((out / "summary.json").read_text())
            print(f"{mode:7s} {args.traces} traces: wall {r['wall_s']:.1f} s "
                  f"({args.traces / r['wall_s']:.0f} traces/s), CPU {r['cpu_s']:.1f} s "
                  f"({args.traces / r['cpu_s']:.0f} traces/CPU-s), peak RSS "
                  f"{r['peak_rss_gb']:.3f} GB, load now {os.getloadavg()[0]:.1f}", flush=True)
    if {"stream", "memory"} <= res.keys():
        s, m = res["stream"], res["memory"]
        print(f"streamed / in-memory rate: {m['wall_s'] / s['wall_s']:.3f} (wall), "
              f"{m['cpu_s'] / s['cpu_s']:.3f} (CPU time)")
        for k in ("latency_s", "forward_s"):
            a, b = summ["stream"][k], summ["memory"][k]
            print(f"{k}: " + ", ".join(f"{q} {a[q] / b[q] - 1:+.2e}" for q in a))
        print(json.dumps({"traces": args.traces, **{k: v for k, v in res.items()}}))


if __name__ == "__main__":
    main()
