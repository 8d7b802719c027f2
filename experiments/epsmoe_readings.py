"""Every EPS-MoE claim under each reading of the kernels and the pipelined dispatch (not fitted).

    .venv/bin/python experiments/epsmoe_readings.py [--full] [--only NAME,...] [--out DIR]

Runs the whole study (`moejax.reproduce.epsmoe.STUDY`, quick grid unless --full) once per
reading and records each claim's verdict and simulated values (`readings.json`):

- grouped kernel's per-SM share of the dense (wgmma) rate (`GemmProfile.mma_group`):
  0.995 ("wgmma", the default: DeepGEMM's measured grouped / dense ratio on H800, a wgmma
  kernel like 003's CUTLASS Pingpong), 0.85 (a reading between the two, no source), 2/3
  ("warp-mma": NVIDIA's cuBLAS grouped GEMMs use warp-level MMA);
- the dense kernel's tile schedule: stream-K (default) or data-parallel waves;
- the pipelined dispatch: send-once (default) or re-send per chunk (E11 read literally).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import time
from pathlib import Path

from moejax.physics.gemm import GemmProfile
from moejax.reproduce import epsmoe as study
from moejax.reproduce.study import run_study
from moejax.systems.epsmoe import config as ecfg


def _reading(mma: float, schedule: str = "stream_k", resend: bool = False) -> dict:
    return {"profile": dataclasses.replace(GemmProfile(), mma_group=mma),
            "dense_schedule": schedule, "resend": resend}


READINGS = {
    "wgmma 0.995, stream-K, send-once (default)": _reading(0.995),
    "0.85, stream-K, send-once": _reading(0.85),
    "warp-mma 2/3, stream-K, send-once": _reading(2 / 3),
    "wgmma 0.995, data-parallel, send-once": _reading(0.995, "data_parallel"),
    "0.85, data-parallel, send-once": _reading(0.85, "data_parallel"),
    "warp-mma 2/3, data-parallel, send-once": _reading(2 / 3, "data_parallel"),
    "wgmma 0.995, stream-K, re-send": _reading(0.995, resend=True),
    "warp-mma 2/3, data-parallel, re-send (the shipped model before)":
        _reading(2 / 3, "data_parallel", resend=True),
}


def _clear_caches() -> None:
    for f in (study.runner_for, study.table2, study.table3):
        f.cache_clear()


def measure(changes: dict, quick: bool, out: Path) -> dict:
    """{claim id: {"holds", "simulated"}} of the study under `changes` (make_config keywords)."""
    orig = study.make_config
    study.make_config = functools.partial(ecfg.make_config, **changes)
    _clear_caches()
    try:
        report = run_study(study.STUDY, out, quick)
    finally:
        study.make_config = orig
        _clear_caches()
    return {c.id: {"holds": bool(c.holds), "simulated": c.simulated} for c in report.claims}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--full", action="store_true", help="the full grid (default: quick)")
    ap.add_argument("--only", default=None, help="comma-separated reading names (prefixes)")
    ap.add_argument("--out", default="/tmp/epsmoe_readings", help="write readings.json here")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = list(READINGS)
    if args.only:
        want = [w.strip() for w in args.only.split(",")]
        names = [n for n in names if any(n.startswith(w) for w in want)]
    res = {}
    for name in names:
        t0 = time.perf_counter()
        claims = measure(READINGS[name], not args.full, out / "runs")
        held = sorted(k for k, v in claims.items() if v["holds"])
        res[name] = {"holds": len(held), "total": len(claims), "claims": claims,
                     "wall_s": time.perf_counter() - t0}
        print(f"{name}: {len(held)}/{len(claims)} hold: {', '.join(held)}", flush=True)
        (out / "readings.json").write_text(json.dumps(res, indent=1, default=float))


if __name__ == "__main__":
    main()
