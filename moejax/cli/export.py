"""`moejax export latency-table`: MoE layer latency vs batch tokens per policy, as CSV for
request-level serving simulators (`moejax.latency_table`), one file per policy, with a
provenance file beside each (`<file>.provenance.json`)."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from moejax import latency_table
from moejax.cli.args import int_list, positive_int
from moejax.errors import ConfigError
from moejax.output import provenance as run_provenance
from moejax.output.results import atomic_write_csv, atomic_write_json
from moejax.trace import fit, gen, provenance
from moejax.trace import io as trace_io


def add_parser(sub) -> argparse.ArgumentParser:
    """`moejax export latency-table ...`."""
    e = sub.add_parser("export", help="export moejax's models for other tools")
    esub = e.add_subparsers(dest="export_cmd", required=True)
    t = esub.add_parser("latency-table", help="MoE layer latency vs batch tokens per policy, "
                        "CSV for request-level serving simulators (Vidur, SplitwiseSim)")
    t.add_argument("--hardware", required=True)
    t.add_argument("--model", required=True)
    t.add_argument("--policy", default="ep", help="comma-separated policies, e.g. ep,eplb "
                   "(several: one file each, --out's name with -POLICY added)")
    t.add_argument("--tokens", type=int_list, default=[64, 256, 1024, 4096, 16384],
                   help="comma-separated batch sizes (tokens per iteration of the EP group)")
    src = t.add_mutually_exclusive_group()
    src.add_argument("--trace-gen", default=None,
                     help="routing: a generator spec (powerlaw:alpha=1.2) or a fit file "
                     "(.json from `moejax trace fit --out`); default: the measured fit "
                     "shipped with moejax (DeepSeek-V2-Lite on ESFT's intent task)")
    src.add_argument("--trace", default=None,
                     help="routing: a recording (.npz): its per-iteration expert shares")
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


def routing_of(args) -> tuple[object, str, dict]:
    """(routing for `latency_table.table`, its label, its provenance)."""
    if args.trace:
        tr, meta = trace_io.load(args.trace)
        data = provenance.describe(args.trace, meta)
        return tr, f"recording {args.trace}", data
    spec = args.trace_gen or latency_table.DEFAULT_FIT
    if spec.strip().endswith(".json"):
        doc = fit.load_fit(spec)
        label = (f"shipped fit {Path(spec).name}" if args.trace_gen is None else
                 f"fit {spec}") + f" ({doc.get('family')})"
        return spec, label, {"kind": "fit", "file": spec, "family": doc.get("family"),
                             "fitted_to": doc.get("provenance") or doc.get("source"),
                             "seed": args.seed, "derived": []}
    spec_s = gen.spec_to_str(gen.parse_spec(spec))
    return spec_s, f"generated {spec_s}", provenance.generated(spec_s, args.seed)


def run(args) -> int:
    out = Path(args.out)
    if out.suffix != ".csv":
        raise ConfigError(f"--out {out}: must end in .csv")
    routing, label, data = routing_of(args)
    cols = latency_table.table(args.hardware, args.model,
                               [p.strip() for p in args.policy.split(",") if p.strip()],
                               args.tokens, trace_gen=routing, routing_label=label,
                               traces=args.traces, layers=args.layers,
                               iterations=args.iterations, seed=args.seed,
                               vocab_size=args.vocab_size)
    prov = run_provenance.record(args.seed, data)
    for path, part in latency_table.per_policy(cols, out).items():
        atomic_write_csv(path, {k: np.asarray(v) for k, v in part.items()})
        atomic_write_json(path.with_name(path.name + ".provenance.json"),
                          {**prov, "policy": part["policy"][0], "routing": label,
                           "columns": "moejax.latency_table (docs/traces.md: serving "
                                      "simulators)"})
        print(f"wrote {path}: {part['policy'][0]} x {len(args.tokens)} batch sizes "
              f"({label})")
    return 0
