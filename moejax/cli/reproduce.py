"""`moejax reproduce STUDY`: a paper's headline results (CSV, PNG, summary.json) and its claims
as a table; `--replot DIR` redraws the figures of a run without simulating."""

from __future__ import annotations

import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from moejax import reproduce, systems
from moejax.cli.args import add_distributed_arguments
from moejax.errors import ConfigError
from moejax.reproduce import study
from moejax.runner import distributed


def add_parser(sub):
    r = sub.add_parser("reproduce", help="regenerate a paper's headline results")
    r.add_argument("study", help=f"study name, one of: {', '.join(systems.studies())}")
    r.add_argument("--quick", action="store_true", help="small grid, a few minutes on 2 cores")
    r.add_argument("--out", help="folder for CSV, PNG and summary.json (required unless "
                   "--replot; with --replot, where the PNGs go, default DIR itself)")
    r.add_argument("--replot", metavar="DIR", help="redraw the PNGs from the CSVs a run wrote "
                   "into DIR (e.g. docs/results/STUDY); simulates nothing")
    r.add_argument("--only", metavar="FIGURE[,FIGURE]", help="run (or --replot) only these "
                   "figures, named by their CSV stem (e.g. fig9_layer_latency)")
    r.add_argument("--assemble", metavar="DIR", nargs="+", help="tuning only: write --out "
                   "from result folders of runs that each computed some families (a later "
                   "folder wins a family both hold); headline and claims are read back from "
                   "the family CSVs, nothing is simulated")
    r.set_defaults(fn=run)
    add_distributed_arguments(r)
    return r


def _brief(value, depth: int = 0, width: int = 6) -> str:
    """A claim's simulated value for a table cell: numbers to 3 significant digits, the
    first `width` entries of dicts and lists, nesting shown to one level."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, (int, float)):
        return f"{value:.3g}"
    if isinstance(value, dict):
        if depth > 0:
            return "{...}"
        items = [f"{k}: {_brief(v, depth + 1)}" for k, v in list(value.items())[:width]]
        return "\n".join(items + (["..."] if len(value) > width else []))
    if isinstance(value, (list, tuple)):
        if depth > 1:
            return "[...]"
        items = [_brief(v, depth + 1) for v in list(value)[:width]]
        return "[" + ", ".join(items) + (", ..." if len(value) > width else "") + "]"
    return str(value)


def _assemble(args) -> int:
    if args.study != "tuning":
        raise ConfigError(f"reproduce --assemble: study {args.study!r}; allowed: tuning")
    if args.only or args.quick:
        raise ConfigError("reproduce --assemble: --only and --quick do not apply (the grid "
                          "is the sources'); allowed: --assemble DIR [DIR ...] --out OUT")
    from moejax.reproduce import tuning_assemble

    report = tuning_assemble.assemble(args.assemble, args.out)
    n = study.tally(report.claims)
    print(f"assembled {len(report.files)} files and summary.json into {args.out}: "
          f"{n['reproduced']} of {n['total']} claims reproduced")
    return 0


def run(args) -> int:
    if args.replot:  # figures from a run's CSVs, no simulation
        names = reproduce.replot(args.study, args.replot, args.out, args.only)
        print(f"drew {len(names)} figures into {args.out or args.replot}")
        return 0
    if not args.out:
        raise ConfigError("reproduce: --out DIR is required (or --replot DIR to redraw figures)")
    if args.assemble:
        return _assemble(args)
    if not distributed.is_writer():  # multi-process run: the others write to a scratch folder
        with tempfile.TemporaryDirectory(prefix="moejax-rank-") as scratch:
            reproduce.run(args.study, Path(scratch), args.quick, args.only)
        return 0
    report = reproduce.run(args.study, Path(args.out), args.quick, args.only)
    t = Table(title=f"{args.study}: claims ({'quick' if args.quick else 'full'} run)")
    for c in ("id", "paper", "simulated", "verdict"):
        t.add_column(c)
    for c in report.claims:
        t.add_row(c.id, c.paper, _brief(c.simulated),
                  {"reproduced": "holds", "calibrated": "calibrated", "fails": "NO"}[c.verdict])
    Console().print(t)
    n = study.tally(report.claims)
    print(f"{n['reproduced']} of {n['total']} claims reproduced, {n['calibrated']} calibrated "
          f"(a constant fitted to the number the claim tests), {n['fails']} fail")
    print("(simulated values abridged; summary.json holds them in full, with notes)")
    print(f"wrote {len(report.files)} files and summary.json to {args.out}")
    return 0
