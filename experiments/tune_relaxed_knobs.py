"""Gradient-path tuning of the knobs that had only a hard grid (moejax/tune/zeroth.py), on the
grid's own workloads, for comparison with checkpoints/aep-decay-mixtral-a100x8 and
checkpoints/wafer-alpha-qwen3-wsc-4x4:

- AEP decay delta (002 §3.4 Algorithm 1): relaxation 'smoothed' (Gaussian smoothing of the
  hard objective, antithetic score-function gradient with common random numbers);
- wafer Eq. 2 trigger alpha (001), invasive balancer: relaxation 'system' (the gated wafer
  step, gradient by autodiff), loss = mean forward time per iteration;
- wafer shadow-slot count (001 §V-B/C), same workload: relaxation 'lattice' over one
  separately built System per count.

    python experiments/tune_relaxed_knobs.py [--only aep|wafer|slots]

Writes checkpoints/aep-decay-mixtral-a100x8-smoothed,
checkpoints/wafer-alpha-qwen3-wsc-4x4-invasive-gradient and
checkpoints/wafer-alpha-qwen3-wsc-4x4-invasive-slots-lattice (orbax steps + summary.json).
Run from the repository root (the wafer runs name their base policy by a relative path).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from moejax.tune import TuneConfig, tune

ROOT = Path(__file__).resolve().parents[1]

# the grid run's workload (checkpoints/aep-decay-mixtral-a100x8/summary.json)
AEP = TuneConfig(system="aep", hardware="a100x8-nvswitch", model="mixtral-8x7b",
                 policy="aep-defrag", params=("decay",), relaxation="smoothed",
                 loss="throughput", init="default", steps=20, traces=2, batch=2,
                 eval_traces=2, requests=16, rate_per_s=200.0, workload="medium", seed=0,
                 samples=3, lr=0.3, warmup=2, tau_start=0.2, tau_end=0.05, every=5, keep=2)

# the grid run's workload (checkpoints/wafer-alpha-qwen3-wsc-4x4/summary.json, "invasive")
WAFER = TuneConfig(system="wafer", hardware="wsc-4x4", model="qwen3-30b-a3b",
                   policy="checkpoints/wafer-alpha-qwen3-wsc-4x4/er-mapping-invasive.toml",
                   params=("alpha",), relaxation="system", sim_tau_scale=0.01,
                   loss="forward", init="default", steps=20, traces=16, batch=4,
                   eval_traces=32, tokens=256, iterations=16, layers=2, seed=0,
                   trace_gen="powerlaw:alpha=1.2", lr=0.3, warmup=2, tau_start=1.0,
                   tau_end=0.05, every=5, keep=2)

# the shadow-slot count alone (alpha = the policy's 0.5), relaxation 'lattice' over one
# System per count 0..4; same traces as the grid (whose slot axis was {0, 1, 2, 4})
SLOTS = TuneConfig(**{**WAFER.spec(), "params": ("shadow_slots",), "relaxation": "lattice",
                      "sim_tau_scale": 1.0})


def run(cfg: TuneConfig, name: str) -> None:
    out = ROOT / "checkpoints" / name
    if out.exists():
        shutil.rmtree(out)
    res = tune(cfg, out, progress=False)
    print(name, "tuned", res.hard, "history", [round(x, 5) for x in res.history])
    print(res.evaluation)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("aep", "wafer", "slots"))
    a = ap.parse_args(argv)
    if a.only in (None, "aep"):
        run(AEP, "aep-decay-mixtral-a100x8-smoothed")
    if a.only in (None, "wafer"):
        run(WAFER, "wafer-alpha-qwen3-wsc-4x4-invasive-gradient")
    if a.only in (None, "slots"):
        run(SLOTS, "wafer-alpha-qwen3-wsc-4x4-invasive-slots-lattice")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
