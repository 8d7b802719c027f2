"""AMoE (002) calibration runs of docs/reproduction/amoe.md ("Calibration to what the paper
measured").

    python experiments/amoe_calibration.py skew         # Fig. 4b: sync stall vs skew scale
    python experiments/amoe_calibration.py sensitivity  # ratio vs each calibrated value
    python experiments/amoe_calibration.py page-table   # §5.4 attention step -> per-token cost

Closed loops on the quick grid's horizon (`steady_amoe.QUICK`), medium top-1, 8x A100.
"""

from __future__ import annotations

import argparse

import numpy as np

from moejax.reproduce import steady_amoe as S
from moejax.systems.amoe.config import FIG3_EXPERT_EFFICIENCY, attention_seconds
from moejax.trace.requests import WORKLOADS

AEP_VARIANTS = {
    "calibrated": {},
    "skew 0.5": {"skew_scale": 0.5},
    "expert eff 1.0": {"expert_efficiency": 1.0},
    "kv reads 1": {"attention_kv_reads": 1.0},
    "page table 0.7us": {"page_table_s_per_token": 0.7e-6},
    "page table 1.34us": {"page_table_s_per_token": 1.34e-6},
    "page table 2us (old)": {"page_table_s_per_token": 2e-6},
    "message 30us": {"message_s": 30e-6},
}
SYNC_VARIANTS = {
    "calibrated": {},
    "skew 0.5": {"skew_scale": 0.5},
    "expert eff 1.0": {"expert_efficiency": 1.0},
    "comm all_to_all": {"comm": "all_to_all"},
    "max_running 0": {"max_running": 0},
}


def skew(scales=(0.5, 0.3, 0.23, 0.2), ns=(2048, 8192, 32768)) -> None:
    for sc in scales:
        for n in ns:
            r = S.closed_point("sync", S.ONE_NODE, 1, "medium", n, S.QUICK,
                               over={"skew_scale": sc})
            print(f"skew {sc} N {n}: sync {r['throughput_tok_s']:.0f} tok/s, "
                  f"stall {r['stall_fraction']:.3f}", flush=True)


def sensitivity() -> None:
    jobs = [(S.closed_point, ("aep", S.ONE_NODE, 1, "medium", 32768, S.QUICK), {"over": o})
            for o in AEP_VARIANTS.values()]
    jobs += [(S.closed_point, ("sync", S.ONE_NODE, 1, "medium", 8192, S.QUICK), {"over": o})
             for o in SYNC_VARIANTS.values()]
    rows = S._parallel(jobs)
    names = [f"aep {k}" for k in AEP_VARIANTS] + [f"sync {k}" for k in SYNC_VARIANTS]
    for name, r in zip(names, rows, strict=True):
        print(f"{name}: {r['throughput_tok_s']:.0f} tok/s, ITL {r['itl_mean_s'] * 1e3:.1f} ms,"
              f" stall {r['stall_fraction']:.3f}")


def page_table(busy=(0.7, 0.8, 0.9)) -> None:
    """§5.4: 2.7 ms attention step at 250 req/s (Fig. 11's 80 % point) -> page-table cost."""
    (ilo, ihi), (olo, ohi) = WORKLOADS["medium"]
    out = np.arange(olo, ohi + 1)
    ctx = (ilo + ihi) / 2 + (out ** 2).mean() / (2 * out.mean())  # length-biased progress
    lam = 250 * out.mean() * 32 / 4  # token-layers/s per attention GPU (4 of 8, §5.1)
    cfg, _ = S.aep_config(S.ONE_NODE, "aep-defrag", 1, 8, {"page_table_s_per_token": 0.0})
    c = cfg.cost
    for rho in busy:
        n = lam * 2.7e-3 / rho
        kernel = float(attention_seconds(np, c, n, n * ctx)) - float(c.att_fixed)
        p = (2.7e-3 - float(c.att_fixed) - kernel) / n
        print(f"attention busy {rho}: batch {n:.0f}, kernel {kernel * 1e3:.2f} ms, page table "
              f"{p * 1e6:.2f} us/token (expert efficiency {FIG3_EXPERT_EFFICIENCY:.3f})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("skew", "sensitivity", "page-table"))
    a = ap.parse_args(argv)
    {"skew": skew, "sensitivity": sensitivity, "page-table": page_table}[a.what]()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
