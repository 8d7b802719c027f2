"""000 FSE-DP Fig. 9 + 12: single-layer latency and on-chip memory, 4 models x 16-1024 tokens.

    .venv/bin/python experiments/fsedp_fig9.py [--quick] [--out results/fsedp]
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
    rows = study.fig9_fig12(out, study.QUICK if args.quick else study.FULL, print)
    for c in study.fig9_claims(rows):
        print(f"{c.id}: holds={c.holds} {c.simulated if 'min' not in c.simulated else ''}")
    print(f"wrote CSV + PNG to {out}")


if __name__ == "__main__":
    main()
