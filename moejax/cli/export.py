"""`moejax export latency-table`: MoE layer latency vs batch tokens per policy, as a CSV for
request-level serving simulators (`moejax.latency_table`)."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from moejax import latency_table
from moejax.cli.args import int_list, positive_int
from moejax.errors import ConfigError
from moejax.output.results import atomic_write_csv


def add_parser(sub) -> argparse.ArgumentParser:
    """`moejax export latency-table ...`."""
    e = sub.add_parser("export", help="export moejax's models for other tools")
    esub = e.add_subparsers(dest="export_cmd", required=True)
    t = esub.add_parser("latency-table", help="MoE layer latency vs batch tokens per policy, "
                        "a CSV for request-level serving simulators (Vidur, SplitwiseSim)")
    t.add_argument("--hardware", required=True)
    t.add_argument("--model", required=True)
    t.add_argument("--policy", default="ep", help="comma-separated policies, e.g. ep,eplb")
    t.add_argument("--tokens", type=int_list, default=[64, 256, 1024, 4096, 16384],
                   help="comma-separated batch sizes (tokens per iteration)")
    t.add_argument("--trace-gen", default="powerlaw:alpha=1.2")
    t.add_argument("--traces", type=positive_int, default=8)
    t.add_argument("--layers", type=positive_int, default=1)
    t.add_argument("--iterations", type=positive_int, default=2,
                   help="iterations measured (after a re-planning policy's window)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--vocab-size", type=int, default=0,
                   help="written to Vidur's vocab_size column (match your Vidur model config)")
    t.add_argument("--out", required=True, help="CSV file")
    t.set_defaults(fn=run)
    return e


def run(args) -> int:
    out = Path(args.out)
    if out.suffix != ".csv":
        raise ConfigError(f"--out {out}: must end in .csv")
    cols = latency_table.table(args.hardware, args.model, [p.strip() for p in args.policy.split(",")
                                             if p.strip()], args.tokens,
                 trace_gen=args.trace_gen, traces=args.traces, layers=args.layers,
                 iterations=args.iterations, seed=args.seed, vocab_size=args.vocab_size)
    atomic_write_csv(out, {k: np.asarray(v) for k, v in cols.items()})
    print(f"wrote {out}: {len(cols['policy'])} rows ({', '.join(sorted(set(cols['policy'])))} "
          f"x {len(args.tokens)} batch sizes)")
    return 0
