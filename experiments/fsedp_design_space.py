"""000 FSE-DP Fig. 16 (buffer x DDR, DDR x D2D: one vmapped sweep), Fig. 17, Fig. 18.

    .venv/bin/python experiments/fsedp_design_space.py [--quick] [--out results/fsedp]
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
    grid = study.QUICK if args.quick else study.FULL
    f16 = study.fig16(out, grid, print)
    best = max(range(len(f16["utilization"])), key=lambda i: f16["utilization"][i])
    print(f"Fig. 16: {len(f16['utilization'])} points in one sweep; best utilization "
          f"{f16['utilization'][best]:.3f} at buffer {f16['buffer_mb'][best]:g} MB, DDR "
          f"{f16['ddr_gbps'][best]:g} GB/s, D2D {f16['d2d_gbps'][best]:g} GB/s")
    print(study.fig17_claim(study.fig17(out, grid, print)))
    print(study.fig18_claim(study.fig18(out, grid, print)))


if __name__ == "__main__":
    main()
