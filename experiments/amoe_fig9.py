"""002 Fig. 9 / 10 / 11 / 12 (AMoE vs synchronous EP): the whole `moejax reproduce amoe` study.

    python experiments/amoe_fig9.py --out results/amoe [--quick]
"""

import argparse
from pathlib import Path

from moejax import reproduce

ap = argparse.ArgumentParser()
ap.add_argument("--out", default="results/amoe")
ap.add_argument("--quick", action="store_true")
a = ap.parse_args()
report = reproduce.run("amoe", Path(a.out), a.quick)
for c in report.claims:
    print(f"{c.id:32s} holds={c.holds!s:5s} simulated={c.simulated}")
