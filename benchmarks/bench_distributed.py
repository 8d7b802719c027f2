"""Traces per second of EP over 1 and over N jax.distributed processes on this machine
(loopback coordinator, gloo collectives on CPU): is there hidden serialization?

    .venv/bin/python benchmarks/bench_distributed.py [--processes 2] [--traces 8192] [--reps 4]

Each process generates the same traces (same key), simulates its block of whole chunks and
all-gathers the per-trace results (`moejax.runner.distributed`); the timed calls follow a first
one (which compiles), and includes the all-gather. Rounds alternate 1 and N processes and
the best of each is kept (the machine is shared). Besides the wall rate it reports the rate per
CPU-second (`time.process_time` of every process, all threads: the work done, which a loaded
machine does not inflate). Also checks the N-process result equals the 1-process one bit for
bit.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import _device  # noqa: E402


def worker(args) -> None:
    import jax
    import numpy as np

    from moejax.catalog.hardware import load_platform
    from moejax.catalog.models import load_model
    from moejax.runner import distributed, engine
    from moejax.systems import ep
    from moejax.trace import gen

    distributed.initialize(distributed.launch_from_args(args))
    if distributed.is_writer():
        _device.select(args.device)
    cfg = ep.make_config(load_platform(args.hardware), load_model(args.model))
    system, params = ep.build(cfg, 1), ep.default_params(cfg)
    lazy = gen.generate_chunked("powerlaw:alpha=1.2", jax.random.key(0),
                                num_traces=args.traces, iterations=1, layers=1,
                                tokens=args.tokens, num_experts=cfg.model.num_experts,
                                top_k=cfg.model.top_k)
    # made 512 at a time: a whole batch's generator scratch (Gumbel scores [T, N, E]) is
    # 4.3 GB per process at 16,384 x 256 tokens (two processes were killed for memory)
    parts = [lazy.chunk(s, min(s + 512, args.traces)) for s in range(0, args.traces, 512)]
    traces = jax.tree_util.tree_map(lambda *xs: np.concatenate([np.asarray(x) for x in xs]),
                                    *parts)
    jax.block_until_ready(engine.simulate(system, params, traces, progress=False))
    distributed.sync("timed")
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(args.reps):
        out = jax.block_until_ready(engine.simulate(system, params, traces, progress=False))
    wall = (time.perf_counter() - t0) / args.reps
    cpu = (time.process_time() - c0) / args.reps  # this process, all its threads
    if distributed.is_writer():
        np.save(args.save, np.asarray(out["latency_s"]))
    print(f"RESULT {wall:.4f} {cpu:.4f}")


def launch(n: int, args, save: str) -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = [sys.executable, __file__, "--worker", "--traces", str(args.traces), "--tokens",
            str(args.tokens), "--reps", str(args.reps), "--hardware", args.hardware,
            "--model", args.model, "--save", save, "--device", args.device]
    dist = lambda r: ["--coordinator", f"127.0.0.1:{port}", "--num-processes", str(n),  # noqa: E731
                      "--process-id", str(r)] if n > 1 else []
    env = {**os.environ, "JAX_PLATFORMS": args.device}
    procs = [subprocess.Popen(base + dist(r), env=env, stdout=subprocess.PIPE, text=True)
             for r in range(n)]
    outs = [p.communicate()[0] for p in procs]
    res = []
    for r, o in enumerate(outs):
        line = [x for x in o.splitlines() if x.startswith("RESULT")]
        if not line:
            sys.exit(f"process {r} of {n} failed:\n{o}")
        res.append(tuple(float(v) for v in line[0].split()[1:]))
    return res[0][0], sum(c for _, c in res)  # process 0's wall, CPU of all processes


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--traces", type=int, default=8192)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--hardware", default="chiplet-2x2")
    ap.add_argument("--model", default="qwen3-30b-a3b")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=4, help="timed calls per process run")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--save", help=argparse.SUPPRESS)
    _device.add_argument(ap)
    from moejax.cli.args import add_distributed_arguments

    add_distributed_arguments(ap)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    _device.select(args.device)  # the backend must exist here before workers start
    import numpy as np

    print(f"EP, {args.model} on {args.hardware}, {args.traces} traces x {args.tokens} tokens; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    best = {1: float("inf"), args.processes: float("inf")}
    cpu = {1: float("inf"), args.processes: float("inf")}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for n in best:
                w, c = launch(n, args, f"{tmp}/lat{n}.npy")
                best[n], cpu[n] = min(best[n], w), min(cpu[n], c)
        same = np.array_equal(np.load(f"{tmp}/lat1.npy"), np.load(f"{tmp}/lat{args.processes}.npy"))
    for n, w in best.items():
        print(f"{n} process(es): {args.traces / w:10.0f} traces/s wall ({w:.3f} s), "
              f"{args.traces / cpu[n]:10.0f} traces per CPU-second (all processes' CPU "
              f"{cpu[n]:.3f} s)")
    print(f"{args.processes} / 1 processes: {best[1] / best[args.processes]:.2f}x wall, "
          f"{cpu[1] / cpu[args.processes]:.2f}x in CPU time (work done per CPU-second: below "
          f"1 is the cost of the extra processes); results equal bit for bit: {same}; "
          f"load average now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
