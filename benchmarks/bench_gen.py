"""Generated traces per second, side by side in one run: generator version 1 (Gumbel-top-k,
the default), version 3 (`--generator fast`, with and without gate weights, one thread and
numba's threads, and its ids drawn on the device by `moejax.trace.gen_device`, what
`simulate` uses on an accelerator) and the EP engine's own rate on the same traces; then
`moejax simulate --generator fast` end to end against that engine rate.

    .venv/bin/python benchmarks/bench_gen.py [--traces 16384] [--end-to-end 131072]
        [--against OTHER_CHECKOUT]

--against: also time another checkout's version 3 sampler (e.g. a `git worktree` of an older
commit) in the same run, interleaved with this one's (same traces, same load).

Power-law traces (alpha 1.2) of 256 tokens, top-8 of 128 experts (qwen3-30b-a3b), one layer;
EP on chiplet-2x2. Chunks of 512 traces (the engine's CPU chunk). Rates are the best of
`--rounds` rounds, compile excluded. The end-to-end run is a fresh `moejax simulate` process
(`MOEJAX_COMPILATION_CACHE=off`): its wall time includes start-up and compiles, its summary's
`wall_s` the simulate call alone.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _device  # benchmarks/_device.py: --device, environment line
import jax
import numba

from moejax.catalog.hardware import load_platform
from moejax.catalog.models import load_model
from moejax.runner import engine
from moejax.systems import ep
from moejax.trace import gen, gen_fast

SPEC = "powerlaw:alpha=1.2"
CHUNK = 512
ROOT = Path(__file__).resolve().parents[1]


def rate(fn, n: int, rounds: int) -> float:
    """Best traces/s of `rounds` calls of fn() (which makes or simulates n traces)."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return n / best


def make_all(lazy) -> None:
    for s in range(0, lazy.num_traces, CHUNK):
        jax.block_until_ready(jax.tree_util.tree_leaves(
            lazy.chunk(s, min(s + CHUNK, lazy.num_traces))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=int, default=16384, help="traces per timed round")
    ap.add_argument("--v1-traces", type=int, default=1024, help="version 1 is slower")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--end-to-end", type=int, default=131072,
                    help="traces of the `moejax simulate` run (0: skip it)")
    ap.add_argument("--against", type=Path, default=None,
                    help="another moejax checkout whose version 3 sampler to time beside this one")
    _device.add_argument(ap)
    args = ap.parse_args()
    _device.select(args.device)
    print(f"load average at start: {os.getloadavg()}, numba threads {numba.get_num_threads()}")
    model = load_model("qwen3-30b-a3b")
    shape = dict(iterations=1, layers=1, tokens=256, num_experts=model.num_experts,
                 top_k=model.top_k)
    n, key = args.traces, jax.random.key(0)

    def v1():
        make_all(gen.generate_chunked(SPEC, key, num_traces=args.v1_traces, **shape))

    def v3(**kw):
        return lambda: make_all(gen_fast.generate_chunked(SPEC, key, num_traces=n,
                                                          prefetch=False, **kw, **shape))

    cfg = ep.make_config(load_platform("chiplet-2x2"), model)
    params, system = ep.default_params(cfg), ep.build(cfg, 1)
    traces = gen_fast.generate(SPEC, key, num_traces=n, **shape)

    def engine_run():
        jax.block_until_ready(engine.simulate(system, params, traces, chunk_size=CHUNK,
                                              progress=False))

    other = []
    if args.against is not None:
        path = args.against / "moejax" / "trace" / "gen_fast.py"
        if not path.is_file():
            ap.error(f"--against: {path} does not exist; give a moejax checkout")
        # loaded from a copy: numba caches a module's kernels beside its file, and kernels
        # cached under this one-off module name break the other checkout's own imports
        copy = Path(tempfile.mkdtemp()) / "gen_fast_against.py"
        shutil.copy(path, copy)
        spec = importlib.util.spec_from_file_location("gen_fast_against", copy)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        other = [(f"version 3 at {args.against}, no weights", lambda: make_all(
            mod.generate_chunked(SPEC, key, num_traces=n, prefetch=False, gate_weights=False,
                                 **shape)), n)]
    cases = [("generator version 1", v1, args.v1_traces),
             ("version 3 (fast), gate weights", v3(), n),
             ("version 3 (fast), no gate weights", v3(gate_weights=False, device=False), n),
             *other,
             ("version 3, numba threads, no weights",
              v3(gate_weights=False, parallel=True, device=False), n),
             ("version 3 on the device (JAX), no weights", v3(gate_weights=False, device=True),
              n),
             ("EP engine (traces in memory)", engine_run, n)]
    for _, fn, _ in cases:  # compile everything first
        fn()
    rates = {}
    for name, fn, m in cases:
        rates[name] = rate(fn, m, args.rounds)
        print(f"{name:>40}: {rates[name]:>10,.0f} traces/s")
    for name, _, _ in other:
        print(f"this checkout / {name}: "
              f"{rates['version 3 (fast), no gate weights'] / rates[name]:.2f}x")
    eng = rates["EP engine (traces in memory)"]
    fast = rates["version 3 (fast), gate weights"]
    print(f"version 3 / version 1: {fast / rates[cases[0][0]]:.1f}x; version 3 without "
          f"weights / EP engine: {rates['version 3 (fast), no gate weights'] / eng:.2f}")
    print(f"load average after the side-by-side rates: {os.getloadavg()}")
    if not args.end_to_end:
        return
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "moejax.cli.main", "simulate", "--traces",
               str(args.end_to_end), "--generator", "fast", "--quiet", "--out", out]
        env = dict(os.environ, MOEJAX_COMPILATION_CACHE="off")
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        inner = json.loads((Path(out) / "summary.json").read_text())["wall_s"]
    e2e = args.end_to_end / inner
    print(f"moejax simulate --traces {args.end_to_end} --generator fast: {wall:.1f} s wall "
          f"({args.end_to_end / wall:,.0f} traces/s), simulate call {inner:.1f} s "
          f"({e2e:,.0f} traces/s) = {e2e / eng:.0%} of the engine's own rate")
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
