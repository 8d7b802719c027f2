"""`moentwine.vs_nvl72` (001 §VI-D, Fig. 17) under each mesh network reading (not fitted).

    .venv/bin/python experiments/moentwine_nvl72_readings.py [--iterations 40] [--out FILE]

Runs the study's own Fig. 17 workload (DeepSeek-V3, 256 tokens per TP group, seed 3) on the
stationary Math-only scenario (one drift scenario: the workload the quick grid's mixture
already is before its first switch at iteration `MIX_PERIOD`) and prints the steady (second
half) per-device MoE throughput of NVL72 + greedy and of the 4 x 8x8 WSC with HER (unbalanced
and with the non-invasive topology-aware balancer) under each reading of
`moejax.reproduce.moentwine.READINGS`; NVL72 is a switch fabric, the same in every reading.
The study's own claim reads the primary reading (`eq1`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from moejax.output.results import atomic_write_json
from moejax.reproduce import moentwine as mw
from moejax.reproduce.moentwine_claims import steady

MESH_READINGS = ("eq1", "eq1_4TBps_link", "cut_through", "shipped")
WSC_SYSTEMS = (("wsc+her", "none"), ("wsc+her+topology-ni", "topology-ni"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=mw.QUICK.fig17_iterations)
    ap.add_argument("--out", default="", help="JSON file for the numbers ('' = print only)")
    args = ap.parse_args()
    model = mw.model_of("deepseek-v3")

    def counts(devices):
        return mw.drift_counts(model, iterations=args.iterations, layers=2,
                               tokens=devices // 4 * mw.TOKENS_PER_GROUP, seed=3, mixed=False)

    nv = steady(mw.run_balancing("nvl72", "deepseek-v3", "baseline", 4, counts(72), "greedy",
                                 migration_free=True)["per_iteration"], "moe_throughput")
    res = {"nvl72+balance": nv, "readings": {}}
    wsc = counts(256)
    for reading in MESH_READINGS:
        row = {}
        for name, strategy in WSC_SYSTEMS:
            r = mw.run_balancing("wsc-4x8x8", "deepseek-v3", "her", 4, wsc, strategy,
                                 reading=reading)
            row[name] = steady(r["per_iteration"], "moe_throughput")
            row[f"{name} all_to_all_s"] = float(r["all_to_all_s"])
        row["gain_vs_nvl72"] = row["wsc+her+topology-ni"] / nv - 1.0
        res["readings"][reading] = row
        print(f"{reading:16s} WSC+HER+topology-NI {row['wsc+her+topology-ni'] / 1e6:6.2f} M "
              f"pairs/device/s vs NVL72+greedy {nv / 1e6:6.2f} M: "
              f"{row['gain_vs_nvl72']:+.1%}", flush=True)
    if args.out:
        atomic_write_json(Path(args.out), res)
        print(f"wrote {args.out}")
    else:
        print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
