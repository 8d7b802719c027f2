"""001 MoEntwine Fig. 11, 13(a-d), 14(b): mappings, FTD hops and communication on WSC vs DGX.

    .venv/bin/python experiments/moentwine_comm.py [--quick] [--out results/moentwine]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from moejax.reproduce import moentwine as mt
from moejax.systems.wafer import mapping as mp


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="results/moentwine")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("baseline", "er"):
        m = mp.build_mapping(name, 4, 4, 4)
        print(f"4x4 TP=4 {name}: FTD hops {mp.ftd_average_hops(m):.2f}, "
              f"overlaps {mp.ftd_overlaps(m)}")
    for fig in (mt.fig13a, mt.fig13b, mt.fig13c, mt.fig13d, mt.fig14b):
        fig(out, args.quick)
    mt.fig11_heatmaps(out)
    print(f"wrote CSV + PNG to {out}")


if __name__ == "__main__":
    main()
