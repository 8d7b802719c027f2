"""`moejax trace slice | concat | split`: cut and join recordings for held-out work
(`moejax.trace.tools`); each output keeps its data's provenance in the .npz meta."""

from __future__ import annotations

from moejax.errors import ConfigError
from moejax.trace import io as trace_io
from moejax.trace import tools


def add_parsers(tsub) -> None:
    """The three subcommands, under `moejax trace`."""
    s = tsub.add_parser("slice", help="keep some iterations, layers or token slots of a trace",
                        description="Write the selected part of one trace; ranges are "
                        "START:STOP (Python-style, STOP excluded).")
    s.add_argument("file", help="trace file (.npz)")
    s.add_argument("--out", required=True, help="trace file to write (.npz)")
    s.add_argument("--iterations", help="START:STOP, e.g. 0:8 (default: all)")
    s.add_argument("--layers", help="comma-separated indices or START:STOP (default: all)")
    s.add_argument("--tokens", help="token slots START:STOP (token-level traces)")
    s.set_defaults(trace_fn=run_slice)
    c = tsub.add_parser("concat", help="join traces along iterations (plan on one, score on "
                        "the next)")
    c.add_argument("files", nargs="+", help="trace files (.npz), in order")
    c.add_argument("--out", required=True, help="trace file to write (.npz)")
    c.set_defaults(trace_fn=run_concat)
    p = tsub.add_parser("split", help="split a trace's iterations into a training part and a "
                        "held-out part")
    p.add_argument("file", help="trace file (.npz)")
    p.add_argument("--train-fraction", type=float, required=True,
                   help="share of iterations in the training part (the first ones)")
    p.add_argument("--train", required=True, help="trace file of the training part (.npz)")
    p.add_argument("--heldout", required=True, help="trace file of the held-out part (.npz)")
    p.set_defaults(trace_fn=run_split)


def _wrote(path, tr, meta) -> None:
    trace_io.save(path, tr, meta)
    steps = meta.get("provenance", {}).get("derived", [])
    print(f"wrote {path}: {tr.num_iterations} iterations x {tr.num_layers} layers"
          + (f" x {tr.num_tokens} token slots" if tr.has_tokens else " (counts only)")
          + (f"; {steps[-1]}" if steps else ""))


def run_slice(args) -> int:
    tr, meta = trace_io.load(args.file)
    out, m = tools.slice_trace(tr, meta, iterations=args.iterations, layers=args.layers,
                               tokens=args.tokens)
    m["provenance"]["derived"][-1] += f" of {args.file}"
    _wrote(args.out, out, m)
    return 0


def run_concat(args) -> int:
    parts = [trace_io.load(f) for f in args.files]
    out, m = tools.concat(parts, [str(f) for f in args.files])
    _wrote(args.out, out, m)
    return 0


def run_split(args) -> int:
    if args.train == args.heldout:
        raise ConfigError("--train / --heldout: the same file; give two")
    tr, meta = trace_io.load(args.file)
    (a, ma), (b, mb) = tools.split(tr, meta, args.train_fraction)
    _wrote(args.train, a, ma)
    _wrote(args.heldout, b, mb)
    return 0
