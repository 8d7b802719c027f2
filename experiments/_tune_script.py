"""What every `experiments/tune_*.py` script does before its own report: parse the common
flags, run (or resume) the shipped tuning run, export the tuned policy.

The scripts run as `python experiments/NAME.py`, so this folder is on `sys.path`.
"""

from __future__ import annotations

import argparse

from moejax.tune import TuneConfig, export, tune
from moejax.tune import loop as tl


def parser(doc: str, *, out: str, export_to: str, plots: str | None = None,
           export_help: str | None = None) -> argparse.ArgumentParser:
    """--out, --export (and --plots when given a default), --resume, --quiet; a script adds
    its own flags before `parse_args`."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", default=out, help="checkpoint folder")
    ap.add_argument("--export", default=export_to, help=export_help or "tuned policy TOML "
                    "('' = none)")
    if plots is not None:
        ap.add_argument("--plots", default=plots)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--quiet", action="store_true")
    return ap


def train(cfg: TuneConfig, args, **export_kw):
    """(result, problem): `tune` into args.out, then the policy to args.export if set."""
    res = tune(cfg, args.out, resume=args.resume, progress=not args.quiet)
    prob = tl.build_problem(cfg)
    if args.export:
        export.write_policy(args.export, prob, res.hard, res.step, **export_kw)
        print(f"wrote {args.export}")
    return res, prob
