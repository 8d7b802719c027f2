"""000 FSE-DP Fig. 14/15: end-to-end ablation A1-A5 (token buffering slack 10/20/30%).

    .venv/bin/python experiments/fsedp_ablation.py [--quick] [--out results/fsedp]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from moejax.reproduce import fsedp as study


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="results/fsedp")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = study.fig15(out, study.QUICK if args.quick else study.FULL, print)
    for k, (util, tps) in res.items():
        print(f"{k:10s} utilization {util:.3f}  throughput {tps:8.1f} tok/s")
    for c in study.fig15_claims(res):
        print(f"{c.id}: holds={c.holds} {c.simulated}")


if __name__ == "__main__":
    main()
