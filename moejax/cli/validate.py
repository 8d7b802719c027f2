"""`moejax validate`: every published measurement beside moejax's value for it (the table of
`docs/validation.md`), with `--out DIR` a CSV and a predicted-vs-measured plot."""

from __future__ import annotations

import argparse

from moejax.errors import ConfigError
from moejax.output.staging import staged_dir


def add_parser(sub) -> argparse.ArgumentParser:
    """`moejax validate [--measurements FILE] [--only TEXT] [--out DIR] [--check]`."""
    v = sub.add_parser("validate", help="moejax against published hardware measurements "
                       "(NCCL, DeepEP, DeepGEMM, a serving framework's MoE layer)")
    v.add_argument("--measurements", default=None,
                   help="a measurements TOML (default: the one shipped with moejax)")
    v.add_argument("--only", default=None,
                   help="keep rows whose id contains this text (e.g. deepep-ll)")
    v.add_argument("--out", default=None, help="folder for validation.csv and validation.png")
    v.add_argument("--check", action="store_true",
                   help="exit 1 when a row's band status differs from the one it states")
    v.set_defaults(fn=run)
    return v


def run(args) -> int:
    # matplotlib (validation.table) loads with the command that needs it, not with the parser
    from moejax.validation import rows, table

    selected = [m for m in rows.load(args.measurements) if (args.only or "") in m.id]
    if not selected:
        raise ConfigError(f"--only {args.only!r}: no measurement id contains it")
    results = table.evaluate(selected)
    print(table.format_table(results))
    if args.out:
        with staged_dir(args.out) as tmp:
            table.write_csv(results, tmp / "validation.csv")
            table.plot(results, tmp / "validation.png")
        print(f"wrote {args.out}/validation.csv, {args.out}/validation.png")
    drift = [r["id"] for r in results if r["in_band"] != (r["status"] == "in")]
    if drift:
        print(f"rows whose band status differs from the stated one: {', '.join(drift)}")
    return 1 if (args.check and drift) else 0
