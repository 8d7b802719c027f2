"""The hard-only program (`engine.compiled_program(hard=True)`: each cond on a temperature
compiled with its hard branch and a NaN fill) against the two-branch program, bit for bit,
on many catalog setups; and each program's XLA compile time (wall). With --quick: the
hard-only program compiled by default against the same program compiled quickly
(`programs.QUICK_OPTIONS`), with the largest relative difference where they differ.

    .venv/bin/python benchmarks/check_hard_program.py [--set quick|policies|wide]
        [--traces 8] [--layers 2] [--tokens 64] [--quick]

quick: one setup per trace system. policies: every policy of the wide set but EP, once
(33 setups). wide (101 setups): EP on every platform (and two more models on the
chiplets); FSE-DP's policies and Hydra on the three chiplet packages; EPLB's policies on two
platforms; the wafer's policies on the four wafers; DySHARP's policies on GH200 NVL32;
EPS-MoE's on two H800 systems; the four tuned policies. A setup the catalog refuses is
counted apart.
Prints one line per setup and a tally; exit status 1 if any setup differs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import numpy as np

from moejax.catalog import hardware
from moejax.errors import MoejaxError
from moejax.runner import engine, programs
from moejax.systems import SYSTEMS, resolve
from moejax.trace import gen

MODELS = ("qwen3-30b-a3b", "phi-3.5-moe", "deepseek-moe-16b")
CHIPLETS = ("chiplet-2x2", "chiplet-3x3", "chiplet-4x4")
WAFERS = ("wsc-4x4", "wsc-6x6", "wsc-8x8", "wsc-4x8x8")
QUICK = (
    ("chiplet-2x2", "qwen3-30b-a3b", "ep"),
    ("chiplet-2x2", "qwen3-30b-a3b", "fsedp"),
    ("chiplet-2x2", "qwen3-30b-a3b", "hydra"),
    ("wsc-4x4", "qwen3-30b-a3b", "ep-baseline-map"),
    ("chiplet-2x2", "qwen3-30b-a3b", "eplb"),
    ("gh200-nvl32", "deepseek-v3", "dysharp"),
    ("h800x8", "dbrx", "epsmoe-tune"),
)


def wide() -> list[tuple[str, str, str]]:
    """The wide set of (hardware, model, policy)."""
    out = [(hw, MODELS[0], "ep") for hw in hardware.platform_names()]
    out += [(hw, m, "ep") for hw in CHIPLETS for m in MODELS[1:]]
    out += [(hw, MODELS[0], p) for hw in CHIPLETS
            for p in ("fsedp", "fsedp-buffered", "fsedp-paired", "hydra")]
    out += [(hw, MODELS[0], p) for hw in ("chiplet-2x2", "h800x8")
            for p in ("eplb", "eplb-global", "eplb-rebalance")]
    out += [(hw, MODELS[0], p) for hw in WAFERS
            for p in ("ep-baseline-map", "er-mapping", "her-mapping", "esp-er-mapping",
                      "ep-baseline-map-link-load")]
    out += [("gh200-nvl32", "deepseek-v3", p)
            for p in ("dysharp", "dysharp-basic", "dysharp-comet", "deepep", "nvls", "comet",
                      "dualpipe", "tutel", "fastermoe", "ccfuser", "explicit-fused",
                      "fusion-only")]
    out += [(hw, "dbrx", p) for hw in ("h800x8", "h800-2node")
            for p in ("epsmoe", "epsmoe-tune", "tp-tp", "dp-ep", "tp-ep")]
    out += [("chiplet-2x2", "qwen3-30b-a3b", "ep-tuned-qwen3-30b-a3b-chiplet-2x2"),
            ("chiplet-2x2", "qwen3-30b-a3b", "fsedp-tuned-qwen3-30b-a3b-chiplet-2x2"),
            ("chiplet-2x2", "phi-3.5-moe", "fsedp-buffered-tuned-phi-3.5-moe-chiplet-2x2"),
            ("wsc-4x4", "qwen3-30b-a3b", "wafer-tuned-qwen3-30b-a3b-wsc-4x4")]
    return out


def policies() -> list[tuple[str, str, str]]:
    """Every policy of the wide set but EP once, on the first setup it has there."""
    seen: dict[str, tuple[str, str, str]] = {}
    for hw, model, policy in wide():
        if policy != "ep":
            seen.setdefault(policy, (hw, model, policy))
    return list(seen.values())


def compare(hw: str, model: str, policy: str, traces_n: int, layers: int, tokens: int,
            quick: bool = False):
    """(equal, largest relative difference, XLA s of the two-branch program, XLA s of the
    hard-only one), or None when the catalog refuses the setup. quick: the hard-only
    program compiled by default against the same program compiled quickly
    (`programs.QUICK_OPTIONS`) instead."""
    try:
        s = resolve(hw, model, policy)
        iterations = 16 if s.policy.system == "rebalancing" else 1
        system, params = SYSTEMS[s.policy.system].from_policy(
            s.platform, s.model, s.policy.options_table(), iterations)
    except (MoejaxError, ValueError):
        return None
    traces = gen.generate("powerlaw:alpha=1.2", jax.random.key(1), num_traces=traces_n,
                          iterations=iterations, layers=layers, tokens=tokens,
                          num_experts=s.model.num_experts, top_k=s.model.top_k)
    keys = jax.random.key_data(jax.random.split(jax.random.key(0), traces_n))
    outs, times = [], []
    hard = engine.program_for(system, params, False, "threefry2x32")
    pairs = ((hard, None), (hard, programs.QUICK_OPTIONS)) if quick else (
        (engine.compiled_program(system, False, "threefry2x32", hard=False), None), (hard, None))
    for prog, options in pairs:
        lowered = prog.fn.lower(params, traces, keys)
        t0 = time.perf_counter()
        compiled = lowered.compile(compiler_options=options)
        times.append(time.perf_counter() - t0)
        outs.append([np.asarray(x) for x in jax.tree_util.tree_leaves(
            compiled(params, traces, keys))])
    if not prog.hard:
        raise SystemExit(f"{hw} {model} {policy}: params with a temperature that is not 0")
    equal = len(outs[0]) == len(outs[1]) and all(
        a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
        for a, b in zip(*outs, strict=True))
    rel = max((float(np.nanmax(np.abs(a.astype(float) - b) / np.maximum(np.abs(a), 1e-30)))
               for a, b in zip(*outs, strict=True)
               if a.shape == b.shape and a.size and not np.array_equal(a, b, equal_nan=True)),
              default=0.0)
    return equal, rel, times[0], times[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", choices=("quick", "policies", "wide"), default="quick")
    ap.add_argument("--traces", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--quick", action="store_true",
                    help="the hard-only program compiled by default against quick compiles")
    args = ap.parse_args()
    setups = {"quick": lambda: list(QUICK), "policies": policies, "wide": wide}[args.set]()
    print(f"load average at start {os.getloadavg()[0]:.1f}", flush=True)
    same = differ = refused = 0
    xla_two = xla_hard = 0.0
    for hw, model, policy in setups:
        r = compare(hw, model, policy, args.traces, args.layers, args.tokens, args.quick)
        programs.PROGRAMS.clear()
        if r is None:
            refused += 1
            continue
        equal, rel, t_two, t_hard = r
        same += equal
        differ += not equal
        xla_two += t_two
        xla_hard += t_hard
        how = "equal" if equal else f"DIFFERS (largest relative {rel:.1e})"
        print(f"{hw} {model} {policy}: {how}; XLA {t_two:.2f} s -> {t_hard:.2f} s", flush=True)
    print(f"{same} equal, {differ} differ, {refused} refused by the catalog; XLA total "
          f"{xla_two:.1f} s -> {xla_hard:.1f} s; load average at end "
          f"{os.getloadavg()[0]:.1f}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
