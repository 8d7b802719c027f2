"""001 MoEntwine Fig. 14(a): ESP (expert sharding) on WSC vs DGX, baseline vs ER-Mapping.

    .venv/bin/python experiments/moentwine_esp.py [--quick] [--out results/moentwine]

Writes fig14a_esp.csv / .png and prints the `moentwine.esp` claim (the same one
`moejax reproduce moentwine` puts in summary.json).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from moejax.reproduce import moentwine as mt


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="6x6 vs 4-node DGX only")
    ap.add_argument("--out", default="results/moentwine")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = mt.fig14a(out, args.quick)
    for i in range(len(rows["model"])):
        print(f"{rows['model'][i]:14s} {rows['system'][i]:24s} "
              + " ".join(f"{k}={rows[k][i] * 1e6:7.2f}us" for k in
                         ("all_to_all_s", "all_reduce_s", "esp_reduce_s", "comm_s", "layer_s")))
    c = mt.esp_claim(rows)
    print(json.dumps({"id": c.id, "paper": c.paper, "simulated": c.simulated,
                      "holds": c.holds, "note": c.note}, indent=1))


if __name__ == "__main__":
    main()
