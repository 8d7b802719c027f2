"""Hard-mode grid tuning of the knobs without a relaxed path (moejax/tune/zeroth.py):
AEP's Algorithm 1 decay delta (002 §3.4) and the wafer NI-Balancer trigger alpha (001 Eq. 2).

    python experiments/tune_grid_knobs.py [--only aep|wafer]

Writes checkpoints/aep-decay-mixtral-a100x8/summary.json,
checkpoints/wafer-alpha-qwen3-wsc-4x4/summary.json and the AEP policy
policies/aep-defrag-tuned-mixtral-8x7b-a100x8.toml. Not gradient descent: why is in the
module docstring of moejax/tune/zeroth.py and in docs/tuning.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from moejax.catalog.policies import load_policy
from moejax.output.results import atomic_write_json, atomic_write_text
from moejax.tune import export, zeroth

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("aep", "wafer"))
    a = ap.parse_args(argv)
    if a.only in (None, "wafer"):
        out = {}
        for name, over in (("non-invasive (er-mapping as shipped)", {}),
                           ("invasive", {"invasive": True})):
            out[name] = zeroth.tune_wafer_alpha(overrides=over, slots=(0, 1, 2, 4))
            r = out[name]
            print(name, {n: [round(x * 1e3, 4) for x in v]
                         for n, v in r["train_forward_s"].items()},
                  "tuned", r["tuned"], r["tuned_shadow_slots"], r["heldout"])
        atomic_write_json(ROOT / "checkpoints/wafer-alpha-qwen3-wsc-4x4/summary.json", out)
    if a.only in (None, "aep"):
        r = zeroth.tune_aep_decay()
        print("aep grid", dict(zip(r["grid"], [round(x, 1) for x in r["train_objective"]],
                                   strict=True)),
              "tuned", r["tuned"], r["heldout"])
        atomic_write_json(ROOT / "checkpoints/aep-decay-mixtral-a100x8/summary.json", r)
        write_aep_policy(r)
    return 0


def write_aep_policy(r: dict) -> None:
    """The tuned decay as a policy file (the base policy with `decay` replaced)."""
    base = load_policy(r["policy"])
    run = {"params": ["decay"], "model": r["model"], "hardware": r["hardware"]}
    text = export.policy_text(base, {"decay": float(r["tuned"])}, run, len(r["grid"]))
    head = (f"# Tuned by hard-mode grid search (moejax/tune/zeroth.py, not gradient "
            f"descent): decay of policy {base.name!r},\n# grid {r['grid']} on "
            f"{r['train_streams']} streams x {r['requests']} requests, Poisson "
            f"{r['rate_per_s']}/s, {r['workload']} workload, seed {r['seed']}, "
            f"by {r['metric']}.\n")
    text = head + "\n".join(text.split("\n")[2:])
    atomic_write_text(ROOT / "policies/aep-defrag-tuned-mixtral-8x7b-a100x8.toml", text)


if __name__ == "__main__":
    raise SystemExit(main())
