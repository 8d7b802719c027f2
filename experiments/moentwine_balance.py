"""001 MoEntwine Fig. 15, 16: no / greedy / topology-aware / non-invasive balancing on wsc-8x8.

    .venv/bin/python experiments/moentwine_balance.py [--quick] [--out results/moentwine]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from moejax.reproduce import moentwine as mt


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="results/moentwine")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    f15 = mt.fig15(out, args.quick)
    for s, r in f15.items():
        print(f"{s:12s} max/mean {float(r['max_over_mean']):.2f}  migrations "
              f"{float(r['migrations']):.0f}  overhead {float(r['migration_ratio']):.1%}")
    mt.fig16(out, args.quick)
    print(f"wrote CSV + PNG to {out}")


if __name__ == "__main__":
    main()
