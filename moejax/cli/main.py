"""The `moejax` command line: simulate, catalog, reproduce, trace, tune, export.

Errors from bad input are one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from moejax.errors import MoejaxError

DEFAULT_GEN = "powerlaw:alpha=1.2"


def _simulate(args) -> int:
    import jax

    from moejax import api
    from moejax.catalog.policies import load_policy
    from moejax.output.results import atomic_write_csv, atomic_write_json
    from moejax.runner import distributed, engine
    from moejax.systems import SYSTEMS
    from moejax.trace import gen
    from moejax.trace import io as trace_io

    if SYSTEMS[load_policy(args.policy).system].input_kind == "streams":
        return _simulate_streams(args)  # request streams (002 AMoE), not traces
    setup = api.resolve(args.hardware, args.model, args.policy)
    m = setup.model
    key = jax.random.key(args.seed)
    if args.trace:
        from moejax.cli.trace import check_recording_args

        check_recording_args(args, _DefaultInt)
        traces, meta = trace_io.load(args.trace)
        if not traces.batch_shape:
            traces = jax.tree_util.tree_map(lambda x: x[None], traces)
        source = f"file {args.trace}"
    elif args.trace_gen.strip().endswith(".json"):  # a fit from `moejax trace fit --out`
        from moejax.trace import fit

        traces = fit.generate_fitted(
            args.trace_gen, key, num_traces=args.traces, iterations=args.iterations,
            layers=args.layers, tokens=args.tokens, num_experts=m.num_experts, top_k=m.top_k,
            chunked=True,
        )
        recorded = len(fit.load_fit(args.trace_gen)["layers"])
        if traces.num_layers < recorded:
            print(f"moejax: note: --layers {traces.num_layers} simulates recorded layers "
                  f"0-{traces.num_layers - 1} of the fit's {recorded}; leave --layers out "
                  f"for all of them", file=sys.stderr)
        source = f"fitted {args.trace_gen} ({traces.num_layers} of {recorded} recorded layers)"
    else:
        spec = gen.parse_spec(args.trace_gen)
        traces = gen.generate_chunked(  # made a chunk at a time inside the engine's loop
            spec, key, num_traces=args.traces, iterations=args.iterations,
            layers=args.layers or 1, tokens=args.tokens, num_experts=m.num_experts,
            top_k=m.top_k,
        )
        source = f"generated {gen.spec_to_str(spec)}"
    if args.stream or args.resume:  # rows to Parquet a part at a time, streaming summaries
        from moejax.runner.stream import simulate_streamed

        return simulate_streamed(args, setup, traces, key, source)
    t0 = time.perf_counter()
    out = api.simulate(setup.platform, m, setup.policy, traces, key=key,
                       chunk_size=args.chunk,
                       progress=not args.quiet and distributed.is_writer())
    wall = time.perf_counter() - t0
    n = int(np.asarray(out["latency_s"]).shape[0])
    summary = {
        "hardware": setup.platform.name,
        "model": m.name,
        "policy": setup.policy.name,
        "system": setup.policy.system,
        "tokens": int(args.tokens) if not args.trace else float(
            np.mean(np.asarray(traces.tokens_per_iteration()))),
        "traces": n,
        "iterations": int(traces.num_iterations),
        "trace_source": source,
        "latency_s": engine.percentile_summary(out["latency_s"]),
        "forward_s": engine.percentile_summary(out["forward_s"]),
        "utilization_mean": float(np.mean(out["utilization_mean"])),
        "breakdown_s": {k: float(np.mean(out[k])) for k in
                        ("comm_s", "compute_s", "memory_s", "attention_s") if k in out},
        "tokens_per_s_mean": float(np.mean(out["tokens_per_s"])),
        "wall_s": wall,
    }
    if not distributed.is_writer():  # multi-process run: process 0 prints and writes
        return 0
    _print_summary(summary)
    if args.out:
        out_dir = Path(args.out)
        cols = {"trace": np.arange(n)}
        for k, v in out.items():
            v = np.asarray(v)
            if v.ndim == 1:
                cols[k] = v
        atomic_write_csv(out_dir / "results.csv", cols)
        atomic_write_json(out_dir / "summary.json", summary)
        print(f"wrote {out_dir / 'results.csv'} and {out_dir / 'summary.json'}")
    return 0


def _simulate_streams(args) -> int:
    """`moejax simulate` of a stream-serving policy (aep-*, ep-sync): Poisson request
    streams (002 §5) instead of routing traces; `--streams` streams of `--requests`
    requests at `--rate` requests/s of a `--workload`."""
    from moejax.errors import ConfigError
    from moejax.output.results import atomic_write_csv, atomic_write_json
    from moejax.output.status import live_status
    from moejax.runner import engine
    from moejax.systems.amoe import serve
    from moejax.systems.amoe.config import p99_from_hist
    from moejax.trace.requests import WORKLOADS

    if getattr(args, "trace", None):
        raise ConfigError(f"--trace: policy {args.policy!r} draws its routing from a Poisson "
                          "request stream (--rate, --workload), not from a recorded trace; "
                          "drop --trace")
    if args.rate is None or args.rate <= 0:
        raise ConfigError(f"--rate = {args.rate!r}; stream-serving policies need a Poisson "
                          "arrival rate > 0 (requests/s)")
    if args.workload not in WORKLOADS:
        raise ConfigError(f"--workload = {args.workload!r}; allowed: {', '.join(WORKLOADS)}")
    t0 = time.perf_counter()
    with live_status(f"simulating {args.policy}", show=not args.quiet) as say:
        system, params, _ = serve.build(args.hardware, args.model, args.policy, args.requests)
        k_stream, k_sim = serve.stream_keys(args.seed)
        st = serve.streams(k_stream, num_streams=args.streams, num_requests=args.requests,
                           rate_per_s=args.rate, workload=args.workload)
        out = engine.simulate(system, params, st, k_sim, progress=say)
        out = {k: np.asarray(v) for k, v in out.items()}
    wall = time.perf_counter() - t0
    summary = {
        "hardware": args.hardware, "model": args.model, "policy": args.policy,
        "rate_per_s": args.rate, "workload": args.workload, "streams": args.streams,
        "requests_per_stream": args.requests,
        "throughput_tok_s": engine.percentile_summary(out["throughput_tok_s"]),
        "itl_mean_s": engine.percentile_summary(out["itl_mean_s"]),
        "itl_p99_s": p99_from_hist(out["itl_hist"].sum(0)),
        "ttft_mean_s": engine.percentile_summary(out["ttft_mean_s"]),
        "all_done": bool(np.all(out["all_done"])),
        "wall_s": wall,
    }
    for k in ("expert_stall_fraction", "stall_fraction", "mean_expert_batch", "mean_batch"):
        if k in out:
            summary[k] = float(np.mean(out[k]))
    for k, v in summary.items():
        if isinstance(v, dict):
            print(f"{k:>24}: mean {v['mean']:.4g}  p50 {v['p50']:.4g}  p99 {v['p99']:.4g}")
        else:
            print(f"{k:>24}: {v}")
    if args.out:
        d = Path(args.out)
        cols = {"stream": np.arange(args.streams)}
        cols.update({k: v for k, v in out.items() if np.ndim(v) == 1})
        atomic_write_csv(d / "results.csv", cols)
        atomic_write_json(d / "summary.json", summary)
        print(f"wrote {d / 'results.csv'} and {d / 'summary.json'}")
    return 0


def _print_summary(s: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    shape = f"{s['traces']} trace{'s' if s['traces'] != 1 else ''}"
    if s.get("iterations", 1) > 1:
        shape += f" x {s['iterations']} iterations"
    t = Table(title=f"{s['policy']} on {s['hardware']}, {s['model']}, {shape}")
    t.add_column("metric")
    for c in ("mean", "p50", "p99"):
        t.add_column(c, justify="right")
    for name in ("latency_s", "forward_s"):
        d = s[name]
        label = "MoE layer latency" if name == "latency_s" else "forward pass"
        t.add_row(label, *(_ms(d[c]) for c in ("mean", "p50", "p99")))
    for k, v in s["breakdown_s"].items():
        t.add_row(f"  {k[:-2]} (per layer)" if k != "attention_s" else "  attention+dense",
                  _ms(v), "", "")
    t.add_row("utilization", f"{s['utilization_mean']:.1%}", "", "")
    t.add_row("throughput", f"{s['tokens_per_s_mean']:.4g} tok/s", "", "")
    Console().print(t)


def _ms(x: float) -> str:
    return f"{x * 1e3:.4g} ms" if x >= 1e-4 else f"{x * 1e6:.4g} us"


def _catalog(args) -> int:
    from rich.console import Console
    from rich.table import Table

    if args.what == "models":
        from moejax.catalog.models import MODELS

        t = Table(title="models")
        for c in ("name", "d_model", "d_ffn", "E", "top-k", "shared", "MoE/all layers",
                  "attention", "source"):
            t.add_column(c)
        for m in MODELS.values():
            t.add_row(m.name, str(m.hidden_size), str(m.expert_ffn_size), str(m.num_experts),
                      str(m.top_k), str(m.num_shared_experts),
                      f"{m.num_sparse_layers}/{m.num_layers}", m.attention_kind, m.source)
    elif args.what == "hardware":
        from moejax.catalog.hardware import load_platform, platform_names

        t = Table(title="hardware")
        for c in ("name", "family", "devices", "topology", "link GB/s/dir", "TFLOP/s bf16",
                  "mem GB/s", "source"):
            t.add_column(c)
        for name in platform_names():
            p = load_platform(name)
            topo = p.topology
            shape = {"mesh2d": f"mesh {topo.rows}x{topo.cols}",
                     "multi_wafer_mesh": f"{topo.wafer_rows}x{topo.wafer_cols} wafers of "
                                         f"{topo.rows}x{topo.cols}",
                     "hierarchical": f"{topo.nodes} nodes x {topo.devices_per_node}"}.get(
                         topo.kind, topo.kind)
            t.add_row(name, p.family, str(p.num_devices), shape, f"{topo.link_Bps / 1e9:g}",
                      f"{p.device.flops('bf16') / 1e12:.4g}", f"{p.device.memory_Bps / 1e9:g}",
                      p.source)
    else:
        from moejax.catalog.policies import load_policy, policy_names

        t = Table(title="policies")
        for c in ("name", "system", "description", "source"):
            t.add_column(c)
        for name in policy_names():
            p = load_policy(name)
            t.add_row(name, p.system, p.description, p.source)
    Console(width=max(Console().width, 200)).print(t)
    return 0


def _trace(args) -> int:
    import jax

    from moejax.trace import gen
    from moejax.trace import io as trace_io

    if args.trace_cmd == "gen":
        from moejax.runner import budget

        spec = gen.parse_spec(args.spec)
        lazy = gen.generate_chunked(spec, jax.random.key(args.seed), num_traces=args.traces,
                                    iterations=args.iterations, layers=args.layers,
                                    tokens=args.tokens, num_experts=args.experts,
                                    top_k=args.top_k)
        budget.check_whole_batch(lazy)  # the file is written whole: fits, or one line
        tr = lazy.materialize()
        trace_io.save(args.out, tr, {"generator": gen.spec_to_str(spec), "seed": args.seed})
        print(f"wrote {args.out}: {args.traces} traces x {args.iterations} iterations x "
              f"{args.layers} layers x {args.tokens} tokens, E={args.experts}, k={args.top_k}")
        return 0
    if args.trace_cmd in ("import", "fit", "compare"):
        return args.trace_fn(args)
    from moejax.cli.trace import run_inspect

    return run_inspect(args)


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


def _reproduce(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from moejax import reproduce
    from moejax.runner import distributed

    if args.replot:  # issue 13: figures from a run's CSVs, no simulation
        from moejax.reproduce.replot import replot

        names = replot(args.study, args.replot, args.out)
        print(f"drew {len(names)} figures into {args.out or args.replot}")
        return 0
    if not args.out:
        from moejax.errors import ConfigError

        raise ConfigError("reproduce: --out DIR is required (or --replot DIR to redraw figures)")
    if not distributed.is_writer():  # multi-process run: the others write to a scratch folder
        import tempfile

        with tempfile.TemporaryDirectory(prefix="moejax-rank-") as scratch:
            reproduce.run(args.study, Path(scratch), args.quick)
        return 0
    report = reproduce.run(args.study, Path(args.out), args.quick)
    t = Table(title=f"{args.study}: claims ({'quick' if args.quick else 'full'} run)")
    for c in ("id", "paper", "simulated", "holds"):
        t.add_column(c)
    for c in report.claims:
        t.add_row(c.id, c.paper, _brief(c.simulated), "yes" if c.holds else "NO")
    Console().print(t)
    print("(simulated values abridged; summary.json holds them in full, with notes)")
    print(f"wrote {len(report.files)} files and summary.json to {args.out}")
    return 0


def _tune(args) -> int:
    from moejax.cli.tune import config_from_args, finish
    from moejax.tune import TuneConfig, tune

    cfg = config_from_args(TuneConfig, args)
    res = tune(cfg, args.out, resume=args.resume, progress=not args.quiet)
    from moejax.runner import distributed

    return finish(args, cfg, res) if distributed.is_writer() else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="moejax", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("simulate", help="simulate one platform/model/policy over many traces")
    s.add_argument("--hardware", default="chiplet-2x2", help="platform name or TOML path")
    s.add_argument("--model", default="qwen3-30b-a3b")
    s.add_argument("--policy", default="ep", help="policy name or TOML path")
    s.add_argument("--tokens", type=_positive_int, default=_DefaultInt(256),
                   help="tokens per iteration")
    s.add_argument("--traces", type=_positive_int, default=_DefaultInt(1024))
    s.add_argument("--iterations", type=_positive_int, default=_DefaultInt(1))
    s.add_argument("--layers", type=_positive_int, default=None,
                   help="MoE layers per trace (a sample of the model's layers); default 1, "
                   "or with --trace-gen FIT.json the fit's recorded layer count")
    src = s.add_mutually_exclusive_group()
    src.add_argument("--trace-gen", default=DEFAULT_GEN, help="generator spec, e.g. "
                     "uniform, powerlaw:alpha=1.5, normal:std=0.032")
    src.add_argument("--trace", help="trace file (.npz) instead of generating")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--chunk", type=_positive_int, default=None, help="traces per compiled call")
    s.add_argument("--out", help="folder for results.csv and summary.json")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--stream", action="store_true",
                   help="bounded memory for millions of traces: rows to --out/results/*.parquet "
                   "a part at a time, percentiles from a sketch (docs/scaling.md)")
    s.add_argument("--resume", action="store_true",
                   help="continue the interrupted --stream run in --out")
    s.add_argument("--rate", type=float, default=None,
                   help="stream-serving policies (aep-*, ep-sync): Poisson requests/s")
    s.add_argument("--workload", default="medium",
                   help="stream-serving policies: short | medium | reasonable (002 §5)")
    s.add_argument("--streams", type=_positive_int, default=1,
                   help="stream-serving policies: request streams")
    s.add_argument("--requests", type=_positive_int, default=256,
                   help="stream-serving policies: requests per stream")
    s.set_defaults(fn=_simulate)
    from moejax.runner.distributed import add_arguments as add_distributed_arguments

    add_distributed_arguments(s)

    c = sub.add_parser("catalog", help="list hardware, models or policies")
    c.add_argument("what", choices=["hardware", "models", "policies"])
    c.set_defaults(fn=_catalog)

    r = sub.add_parser("reproduce", help="regenerate a paper's headline results")
    r.add_argument("study", help="study name (see moejax.reproduce.STUDIES)")
    r.add_argument("--quick", action="store_true", help="small grid, a few minutes on 2 cores")
    r.add_argument("--out", help="folder for CSV, PNG and summary.json (required unless "
                   "--replot; with --replot, where the PNGs go, default DIR itself)")
    r.add_argument("--replot", metavar="DIR", help="redraw the PNGs from the CSVs a run wrote "
                   "into DIR (e.g. docs/results/STUDY); simulates nothing")
    r.set_defaults(fn=_reproduce)
    add_distributed_arguments(r)

    t = sub.add_parser("trace", help="generate or inspect routing traces")
    tsub = t.add_subparsers(dest="trace_cmd", required=True)
    g = tsub.add_parser("gen", help="generate traces to an .npz file")
    g.add_argument("spec", help="generator spec, e.g. powerlaw:alpha=1.5")
    g.add_argument("--out", required=True)
    g.add_argument("--experts", type=_positive_int, required=True)
    g.add_argument("--top-k", type=_positive_int, required=True)
    g.add_argument("--tokens", type=_positive_int, default=256)
    g.add_argument("--traces", type=_positive_int, default=16)
    g.add_argument("--iterations", type=_positive_int, default=1)
    g.add_argument("--layers", type=_positive_int, default=1)
    g.add_argument("--seed", type=int, default=0)
    i = tsub.add_parser("inspect", help="summarize a trace file")
    i.add_argument("file")
    i.add_argument("--plot", help="write a PNG of load skew, activated experts, affinity")
    i.add_argument("--json", help="write activated experts / affinity / locality as JSON")
    from moejax.cli.trace import add_compare_parser, add_fit_parser, add_import_parser

    add_import_parser(tsub, _positive_int)
    add_fit_parser(tsub)
    add_compare_parser(tsub)
    t.set_defaults(fn=_trace)

    from moejax.cli.tune import add_tune_parser

    tune_parser = add_tune_parser(sub, _positive_int)
    tune_parser.set_defaults(fn=_tune)
    add_distributed_arguments(tune_parser)
    from moejax.cli.sweep import add_parser as add_sweep_parser

    add_distributed_arguments(add_sweep_parser(sub, _positive_int))
    from moejax.latency_table import add_export_parser

    add_export_parser(sub, _positive_int)
    from moejax.cli.help import polish

    return polish(p)  # command and study lists, every option's default


class _DefaultInt(int):
    """An option's default value, told apart from the same value given on the command line
    (`simulate --trace` refuses --tokens / --traces / --iterations given explicitly)."""


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{s!r} must be >= 1")
    return v


def main(argv: list[str] | None = None) -> int:
    try:  # the parser imports the subcommands' modules (jax): seconds that Ctrl-C may hit
        args = build_parser().parse_args(argv)
        from moejax.output.outpaths import check_outputs

        check_outputs(args)  # before any work: a bad --out is one line, nothing written
        from moejax.runner import distributed

        distributed.initialize(distributed.launch_from_args(args))
        return args.fn(args)
    except MoejaxError as e:
        print(f"moejax: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("moejax: interrupted", file=sys.stderr)
        if argv is None:  # the console command: leave without interpreter teardown, which
            # could race XLA's threads ("pure virtual method called", rc 134, issue 13)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)
        return 130


if __name__ == "__main__":
    sys.exit(main())
