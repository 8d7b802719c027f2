"""`moejax trace gen | inspect | import | fit | compare`: make, read, summarize, import,
fit and compare routing traces; and the `simulate --trace` argument check."""

from __future__ import annotations

import sys
from pathlib import Path

import jax

from moejax.cli import trace_tools
from moejax.cli.args import (
    add_generator_argument,
    generate_chunked,
    generator_version,
    positive_int,
)
from moejax.errors import ConfigError
from moejax.output import provenance as run_provenance
from moejax.output.progress import study_progress
from moejax.output.results import atomic_write_json
from moejax.runner import budget
from moejax.trace import analysis, compare, fit, gen, importers, provenance, summary
from moejax.trace import io as trace_io


def add_parser(sub):
    t = sub.add_parser("trace", help="generate or inspect routing traces")
    tsub = t.add_subparsers(dest="trace_cmd", required=True)
    g = tsub.add_parser("gen", help="generate traces to an .npz file")
    g.add_argument("spec", help="generator spec, e.g. powerlaw:alpha=1.5")
    g.add_argument("--out", required=True)
    g.add_argument("--experts", type=positive_int, required=True)
    g.add_argument("--top-k", type=positive_int, required=True)
    g.add_argument("--tokens", type=positive_int, default=256)
    g.add_argument("--traces", type=positive_int, default=16)
    g.add_argument("--iterations", type=positive_int, default=1)
    g.add_argument("--layers", type=positive_int, default=1)
    g.add_argument("--seed", type=int, default=0)
    add_generator_argument(g)
    g.set_defaults(trace_fn=run_gen)
    i = tsub.add_parser("inspect", help="summarize a trace file")
    i.add_argument("file")
    i.add_argument("--plot", help="write a PNG of load skew, activated experts, affinity")
    i.add_argument("--json", help="write activated experts / affinity / locality as JSON")
    i.set_defaults(trace_fn=run_inspect)
    _add_import_parser(tsub)
    _add_fit_parser(tsub)
    _add_compare_parser(tsub)
    trace_tools.add_parsers(tsub)
    t.set_defaults(fn=run)
    return t


def run(args) -> int:
    return args.trace_fn(args)


def run_gen(args) -> int:
    """`moejax trace gen SPEC --out FILE.npz ...`."""
    spec = gen.parse_spec(args.spec)
    version = generator_version(args.generator)
    lazy = generate_chunked(version, spec, jax.random.key(args.seed), num_traces=args.traces,
                            iterations=args.iterations, layers=args.layers,
                            tokens=args.tokens, num_experts=args.experts, top_k=args.top_k)
    budget.check_whole_batch(lazy)  # the file is written whole: fits, or one line
    tr = lazy.materialize()
    spec_s = gen.spec_to_str(spec)
    trace_io.save(args.out, tr, {"generator": spec_s, "seed": args.seed,
                                 provenance.KEY: provenance.generated(spec_s, args.seed,
                                                                      version)})
    print(f"wrote {args.out}: {args.traces} traces x {args.iterations} iterations x "
          f"{args.layers} layers x {args.tokens} tokens, E={args.experts}, k={args.top_k}")
    return 0


def _add_import_parser(tsub) -> None:
    """`moejax trace import --format FORMAT SRC [SRC ...] --out FILE.npz`."""
    p = tsub.add_parser("import", help="import a recorded routing trace to .npz")
    p.add_argument("--format", required=True, choices=importers.FORMATS,
                   help="esft (task folder), olmoe (.pkl files, one iteration each), "
                   "jsonl, counts-csv; see docs/traces.md")
    p.add_argument("src", nargs="+", help="source file(s) or folder")
    p.add_argument("--out", required=True, help="trace file to write (.npz)")
    p.add_argument("--experts", type=positive_int, default=None, help="experts per layer")
    p.add_argument("--top-k", type=positive_int, default=None)
    p.add_argument("--tokens-per-iteration", type=positive_int, default=None,
                   help="esft: cut the token stream into iterations of this many tokens "
                   "(default: one iteration per sequence); jsonl without a step field: cut "
                   "each layer's tokens into iterations of this many")
    p.add_argument("--last-iteration", choices=importers.LAST_ITERATION, default=None,
                   help="with --tokens-per-iteration, a last iteration shorter than the rest: "
                   "keep or drop it (default: keep it, with a warning)")
    p.add_argument("--keep-last-token", action="store_true",
                   help="esft: keep each sequence's last token (a logging artifact)")
    p.add_argument("--field", action="append", metavar="OURS=THEIRS", default=None,
                   help="jsonl: read field OURS (layer, experts, weights, step, request(s), "
                   "token) from the recorder's key THEIRS, a dotted path for nested objects; "
                   "repeatable, e.g. --field layer=layer_idx --field experts=topk.ids")
    p.add_argument("--ignore-unknown-fields", action="store_true",
                   help="jsonl: drop fields moejax does not read (dataset names, token text) "
                   "instead of refusing the record")
    p.add_argument("--truncate-to-common", action="store_true",
                   help="jsonl: when the layers of a step hold different token counts (a "
                   "recorder that drops records), keep each layer's first n tokens, n = the "
                   "step's smallest layer, and report how many were dropped")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(trace_fn=run_import)


def _add_fit_parser(tsub) -> None:
    """`moejax trace fit FILE --family F [--family F ...] [--out FIT.json]`."""
    p = tsub.add_parser("fit", help="fit generator families to a recorded trace")
    p.add_argument("file", help="trace file (.npz), e.g. from `moejax trace import`")
    p.add_argument("--family", action="append", choices=fit.FIT_FAMILIES,
                   help="family to fit (repeatable; default: all)")
    p.add_argument("--out", help="write the fit of the best (or the only) family as JSON; "
                   "`moejax simulate --trace-gen FILE.json` generates from it")
    p.add_argument("--report", help="write the full fit report as JSON")
    p.add_argument("--no-holdout", action="store_true",
                   help="fit on all iterations (no held-out evaluation)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(trace_fn=run_fit)


def _add_compare_parser(tsub) -> None:
    """`moejax trace compare A B [--json OUT]`."""
    p = tsub.add_parser(
        "compare", help="compare a recording or a fit (A) with a recording (B)",
        description="Per-layer skew and activated-expert curve of A (a trace .npz or a fit "
        ".json) against recording B, PASS when every layer's skew is within 10% and the "
        "curve within 5% (docs/traces.md). A fit describes a workload, not a model.")
    p.add_argument("a", help="trace file (.npz) or fit (.json from `moejax trace fit --out`)")
    p.add_argument("b", help="reference recording (.npz)")
    p.add_argument("--json", help="write the comparison as JSON")
    p.add_argument("--seed", type=int, default=12345, help="generation seed (fits)")
    p.set_defaults(trace_fn=run_compare)


def run_compare(args) -> int:
    """`moejax trace compare A B`: print `compare.format_compare`, write JSON on request."""
    if args.json and Path(args.json).is_dir():
        raise ConfigError(f"--json: {args.json} is a folder; give a file name")
    r = compare.compare(args.a, args.b, seed=args.seed)
    print(compare.format_compare(r))
    if args.json:
        atomic_write_json(Path(args.json), r)
        print(f"wrote {args.json}")
    return 0


def run_import(args) -> int:
    """`moejax trace import`: write the trace with its provenance (source, importer and
    options) in the meta; print what was mapped, dropped and assumed, and any warning."""
    opts = {}
    cut = {"tokens_per_iteration": args.tokens_per_iteration,
           "last_iteration": args.last_iteration}
    if args.format == "esft":
        opts = {**cut, "drop_last_token": not args.keep_last_token}
    elif args.keep_last_token:
        raise ConfigError("--keep-last-token: esft format only")
    elif args.format != "jsonl" and (args.tokens_per_iteration or args.last_iteration):
        raise ConfigError("--tokens-per-iteration / --last-iteration: esft and jsonl formats "
                          "only")
    if args.last_iteration and not args.tokens_per_iteration:
        raise ConfigError("--last-iteration: only with --tokens-per-iteration (the "
                          "iterations it cuts can end short)")
    jsonl_opts = {"fields": importers.parse_field_map(args.field),
                  "ignore_unknown": args.ignore_unknown_fields,
                  "ragged": "truncate" if args.truncate_to_common else "error", **cut}
    if args.format == "jsonl":
        opts = jsonl_opts
    elif args.field or args.ignore_unknown_fields or args.truncate_to_common:
        raise ConfigError("--field / --ignore-unknown-fields / --truncate-to-common: jsonl "
                          "format only")
    tr, meta = importers.import_trace(args.format, args.src, num_experts=args.experts,
                                      top_k=args.top_k, progress=not args.quiet, **opts)
    given = {"num_experts": args.experts, "top_k": args.top_k, **opts}
    meta[provenance.KEY] = provenance.imported(
        args.format, args.src, {k: v for k, v in given.items() if v is not None},
        run_provenance.version())
    for w in meta.get("warnings", ()):
        print(f"moejax: warning: {w}", file=sys.stderr)
    print_report(meta.get("report", {}))
    trace_io.save(args.out, tr, meta)
    kind = "token-level" if tr.has_tokens else "counts-only"
    print(f"wrote {args.out}: {tr.num_iterations} iterations x {tr.num_layers} layers, "
          f"E={tr.num_experts}, top_k={tr.top_k}, {kind}")
    if meta.get("ragged") == "truncate":
        total = meta["tokens"] * tr.num_layers + meta["dropped_tokens"]
        print(f"--truncate-to-common: dropped {meta['dropped_tokens']} of {total} token "
              f"records ({meta['dropped_tokens'] / max(total, 1):.2%}) and "
              f"{meta['dropped_steps']} steps with no token common to every layer")
    return 0


def print_report(report: dict) -> None:
    """The import's "mapped", "dropped" and "assumed" lines."""
    mapped = report.get("mapped") or {}
    if mapped:
        print("mapped:  " + "; ".join(f"{k} <- {v}" for k, v in mapped.items()))
    print("dropped: " + ("; ".join(report.get("dropped") or ()) or "nothing"))
    for a in report.get("assumed") or ():
        print(f"assumed: {a}")


def run_fit(args) -> int:
    tr, meta = trace_io.load(args.file)
    if tr.batch_shape:
        if tr.batch_shape != (1,):
            raise ConfigError(f"file: fit takes one recording, {args.file} holds "
                              f"{tr.batch_shape[0]} traces")
        tr = tr[0]
    families = tuple(args.family or fit.FIT_FAMILIES)
    with study_progress("trace fit", len(families) + 1) as tick:  # a family a step, + papers'
        res = fit.fit(tr, families, holdout=not args.no_holdout, key=jax.random.key(args.seed),
                      progress=tick)
    print(fit.format_fit(res))
    if args.report:
        atomic_write_json(Path(args.report), res)
    if args.out:
        fam = families[0] if len(families) == 1 else res.get("best")
        if fam is None:
            raise ConfigError("family: no family could be fitted; see the errors above")
        fit.save_fit(args.out, res, fam, source=str(args.file),
                     data=provenance.describe(args.file, meta))
        print(f"wrote {args.out} ({fam}); use: moejax simulate --trace-gen {args.out}")
    return 0


def run_inspect(args) -> int:
    """`moejax trace inspect FILE [--plot PNG] [--json JSON]`."""
    for opt in ("plot", "json"):
        out = getattr(args, opt)
        if out and Path(out).is_dir():
            raise ConfigError(f"--{opt}: {out} is a folder; give a file name")
    tr, meta = trace_io.load(args.file)
    print(f"data: {run_provenance.one_line(provenance.describe(args.file, meta))}")
    s = summary.summarize(tr)
    print(summary.format_summary(s))
    inspect_extra(tr, meta, args.plot, args.json, s)
    return 0


def inspect_extra(tr, meta: dict, plot_path: str | None, as_json: str | None,
                  summary_dict: dict | None = None) -> None:
    """Print activated experts, cross-layer affinity, temporal locality; write a plot and
    JSON (the analysis, plus the printed summary under "summary").

    A batch of traces is summarized over all its traces; the token-level analyses (which
    follow one recording's token order) are of its first trace, and say so.
    """
    if tr.batch_shape == (1,):
        tr = tr[0]
    first = tr[0] if tr.batch_shape else tr
    if tr.batch_shape:
        print(f"\nanalysis of trace 0 of {tr.batch_shape[0]} (activated-expert curve, "
              "affinity and locality follow one trace's token order):")
    a = analysis.analyze(first, meta)
    print(analysis.format_analysis(a))
    if as_json:
        doc = dict(a)
        if tr.batch_shape:
            doc = {"analysis_of_trace": 0, **doc}
        if summary_dict is not None:
            doc["summary"] = summary_dict
        atomic_write_json(Path(as_json), doc)
        print(f"wrote {as_json}")
    if plot_path:
        title = meta.get("path", "") if isinstance(meta, dict) else ""
        if tr.batch_shape:
            title = f"{title} trace 0 of {tr.batch_shape[0]}".strip()
        from moejax.trace.figure import plot_analysis  # matplotlib: loaded only to draw

        plot_analysis(first, plot_path, meta, title=title)
        print(f"wrote {plot_path}")


def check_recording_args(args, default_type) -> None:
    """`simulate --trace FILE` takes the recording's own shape: --tokens, --traces,
    --iterations and --layers given on the command line would be ignored, so they are
    refused."""
    given = [f"--{name}" for name in ("tokens", "traces", "iterations")
             if not isinstance(getattr(args, name, None), default_type)]
    given += ["--layers"] if getattr(args, "layers", None) is not None else []
    if given:
        raise ConfigError(f"{' / '.join(given)}: --trace {args.trace} simulates the recording "
                          "as recorded (its own traces, iterations, layers and tokens per "
                          "iteration); "
                          "drop them, or re-import with --tokens-per-iteration (esft)")
