"""001 MoEntwine Fig. 17: 4 x 8x8 WSC (EP=256) ablation vs NVL72 (EP=72), DeepSeek-V3.

    .venv/bin/python experiments/moentwine_nvl72.py [--quick] [--out results/moentwine]
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
    for name, r in mt.fig17(out, args.quick).items():
        print(f"{name:22s} per-device MoE throughput {float(r['moe_throughput']):.3e} pairs/s")
    print(f"wrote CSV + PNG to {out}")


if __name__ == "__main__":
    main()
