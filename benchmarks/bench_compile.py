"""What a user waits for before the first answer: per system, the first and the second
`api.simulate` call at 16 traces (the second identical call must not compile), the split of
the first call into tracing, lowering and XLA compile, and the lowered program's size (HLO
op lines); wall time, and the process's CPU time for the first call and the XLA compile (a
loaded machine moves it less); cold (no persistent cache) and with JAX's persistent
compilation cache warm (a second process reading what the first wrote). Every measurement
runs in a fresh process.

    .venv/bin/python benchmarks/bench_compile.py [--systems ep,fsedp] [--traces 16]
        [--repo OTHER_CHECKOUT ...] [--repeat N] [--no-warm] [--quick]

--repo: also measure other checkouts of moejax (e.g. a `git worktree` of an older commit),
side by side in the same run, on the same machine load. --quick: also this checkout with
quick compiles (`programs.quick_compile`), in the same run. A checkout without
`moejax.runner.programs` has no persistent cache: its "warm" columns are left empty.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import _device  # benchmarks/_device.py: --device, the environment line

HERE = Path(__file__).resolve().parents[1]
# system -> (hardware, model, policy): one catalog setup per trace system
SETUPS = {
    "ep": ("chiplet-2x2", "qwen3-30b-a3b", "ep"),
    "fsedp": ("chiplet-2x2", "qwen3-30b-a3b", "fsedp"),
    "hydra": ("chiplet-2x2", "qwen3-30b-a3b", "hydra"),
    "wafer": ("wsc-4x4", "qwen3-30b-a3b", "ep-baseline-map"),
    "rebalancing": ("chiplet-2x2", "qwen3-30b-a3b", "eplb"),
    "dysharp": ("gh200-nvl32", "deepseek-v3", "dysharp"),
    "epsmoe": ("h800x8", "dbrx", "epsmoe-tune"),
}

# One measurement, run as `python -c CHILD system hw model policy traces cache_dir|off`.
CHILD = r"""
import json, sys, time
system, hw, model, policy, n, cache = sys.argv[1:7]
n = int(n)
iterations = 16 if system == "rebalancing" else 1  # EPLB: an 8-iteration window, then 8 served
t0 = time.perf_counter()
import jax
from moejax import api
from moejax.systems import SYSTEMS, resolve
from moejax.trace import gen
try:
    from moejax.runner import programs
except ImportError:
    programs = None
if programs is not None and cache != "off":
    programs.enable_persistent_cache(cache)
imported = time.perf_counter() - t0
s = resolve(hw, model, policy)
traces = gen.generate("powerlaw:alpha=1.2", jax.random.key(0), num_traces=n,
                      iterations=iterations,
                      layers=1, tokens=256, num_experts=s.model.num_experts,
                      top_k=s.model.top_k)
jax.block_until_ready(traces)
t, c = time.perf_counter(), time.process_time()
out = api.simulate(hw, model, policy, traces)
first, first_cpu = time.perf_counter() - t, time.process_time() - c
t = time.perf_counter()
again = api.simulate(hw, model, policy, traces)
second = time.perf_counter() - t
import numpy as np
same = all(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True) for a, b in
           zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(again), strict=True))
# the first call's phases: the engine's own function for a system built anew, jitted anew
system_, params = SYSTEMS[s.policy.system].from_policy(s.platform, s.model,
                                                       s.policy.options_table(), iterations)
from moejax.runner import engine
keys = jax.random.key_data(jax.random.split(jax.random.key(0), n))
if hasattr(engine, "program_for"):  # the program simulate runs these params with
    prog = engine.program_for(system_, params, False, "threefry2x32")
else:
    prog = engine.compiled_program(system_, False, "threefry2x32")
inner = getattr(prog, "fn", prog).__wrapped__
options = programs.compiler_options() if hasattr(programs, "compiler_options") else None
# a new function: traced, lowered and compiled anew (with the options simulate compiled with)
fn = jax.jit(lambda *a: inner(*a), compiler_options=options)
t = time.perf_counter(); traced = fn.trace(params, traces, keys); t_trace = time.perf_counter() - t
t = time.perf_counter(); lowered = traced.lower(); t_lower = time.perf_counter() - t
t, c = time.perf_counter(), time.process_time()
lowered.compile()
t_compile, c_compile = time.perf_counter() - t, time.process_time() - c
hlo = sum(1 for line in lowered.as_text().splitlines() if " = " in line)
print(json.dumps(dict(import_s=imported, first_s=first, second_s=second, same=bool(same),
                      trace_s=t_trace, lower_s=t_lower, compile_s=t_compile, hlo_ops=hlo,
                      first_cpu_s=first_cpu, compile_cpu_s=c_compile)))
"""


def measure(repo: Path, setup, traces: int, cache: str, quick: bool = False) -> dict:
    env = dict(os.environ, PYTHONPATH=str(repo), MOEJAX_COMPILATION_CACHE="off",
               MOEJAX_QUICK_COMPILE="1" if quick else "0")
    r = subprocess.run([sys.executable, "-c", CHILD, *setup, str(traces), cache], cwd=repo,
                       env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "failed"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def _fastest(runs: list[dict]) -> dict:
    """The minimum of each time column over runs (an error if every run failed); `same`
    only if every run's second call gave the first call's numbers."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    out = {k: min(r[k] for r in ok) for k in ok[0] if k.endswith("_s")}
    return {**ok[0], **out, "same": all(r["same"] for r in ok)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--systems", default=",".join(SETUPS))
    ap.add_argument("--traces", type=int, default=16)
    ap.add_argument("--repo", action="append", default=[],
                    help="another checkout to measure beside this one")
    ap.add_argument("--no-warm", action="store_true", help="skip the persistent-cache runs")
    ap.add_argument("--quick", action="store_true",
                    help="also this checkout with quick compiles (MOEJAX_QUICK_COMPILE=1)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="cold runs per checkout, interleaved across checkouts; each time "
                         "column is the minimum over them (a loaded machine)")
    _device.add_argument(ap)
    args = ap.parse_args()
    _device.select(args.device)
    os.environ["JAX_PLATFORMS"] = args.device.replace("gpu", "cuda")
    print(f"load average at start {os.getloadavg()[0]:.1f}")
    # (label, checkout, quick compiles): this checkout, with --quick this checkout compiling
    # quickly, then the other checkouts
    runs = [(HERE.name, HERE, False), *([(f"{HERE.name}, quick", HERE, True)] * args.quick),
            *((Path(r).resolve().name, Path(r).resolve(), False) for r in args.repo)]
    head = ("system", "checkout", "first s", "first CPU s", "second s", "trace s", "lower s",
            "XLA s", "XLA CPU s", "HLO ops", "warm first s")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name in args.systems.split(","):
        setup = (name, *SETUPS[name])
        colds = {label: [] for label, _, _ in runs}
        for _ in range(max(1, args.repeat)):
            for label, repo, quick in runs:
                colds[label].append(measure(repo, setup, args.traces, "off", quick))
        for label, repo, quick in runs:
            cold = _fastest(colds[label])
            warm = {}
            has_cache = (repo / "moejax" / "runner" / "programs.py").exists()
            if not args.no_warm and has_cache and "error" not in cold:
                with tempfile.TemporaryDirectory() as d:
                    measure(repo, setup, args.traces, d, quick)  # writes
                    warm = measure(repo, setup, args.traces, d, quick)  # reads
            if "error" in cold:
                print(f"| {name} | {label} | error: {cold['error'][:80]} |")
                continue
            second = f"{cold['second_s'] * 1e3:.0f} ms" + ("" if cold["same"] else " (differs!)")
            print(f"| {name} | {label} | {cold['first_s']:.2f} | "
                  f"{cold['first_cpu_s']:.2f} | {second} | "
                  f"{cold['trace_s']:.2f} | {cold['lower_s']:.2f} | {cold['compile_s']:.2f} | "
                  f"{cold['compile_cpu_s']:.2f} | {cold['hlo_ops']} | "
                  f"{warm.get('first_s', float('nan')):.2f} |", flush=True)
    print(f"load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
