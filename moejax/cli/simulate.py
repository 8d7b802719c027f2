"""`moejax simulate`: one platform / model / policy over many routing traces (or, for the
systems whose input is request streams, over Poisson request streams), printed as a table
and written as results.csv + summary.json; `--stream` for millions of traces in bounded
memory (`moejax.runner.stream`)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax
import numpy as np
from rich.console import Console
from rich.table import Table

from moejax import api, systems
from moejax.cli.args import (
    DEFAULT_GEN,
    DEFAULT_GENERATOR,
    DefaultInt,
    add_distributed_arguments,
    add_generator_argument,
    generate_chunked,
    generator_version,
    given,
    positive_int,
)
from moejax.cli.trace import check_recording_args
from moejax.errors import ConfigError
from moejax.output import provenance as run_provenance
from moejax.output.results import atomic_write_csv, atomic_write_json, together
from moejax.output.status import live_status
from moejax.runner import budget, distributed, engine, stream
from moejax.systems import rebalancing
from moejax.systems.amoe import serve
from moejax.systems.amoe.config import p99_from_hist
from moejax.trace import fit, gen, provenance
from moejax.trace import io as trace_io
from moejax.trace.requests import WORKLOADS


def add_parser(sub):
    serving = f"stream-serving systems ({', '.join(systems.names('streams'))})"
    s = sub.add_parser("simulate", help="simulate one platform/model/policy over many traces")
    s.add_argument("--hardware", default="chiplet-2x2", help="platform name or TOML path")
    s.add_argument("--model", default="qwen3-30b-a3b")
    s.add_argument("--policy", default="ep", help="policy name or TOML path")
    s.add_argument("--tokens", type=positive_int, default=DefaultInt(256),
                   help="tokens per iteration")
    s.add_argument("--traces", type=positive_int, default=DefaultInt(1024))
    s.add_argument("--iterations", type=positive_int, default=DefaultInt(1))
    s.add_argument("--layers", type=positive_int, default=None,
                   help="MoE layers per trace (a sample of the model's layers); default 1, "
                   "or with --trace-gen FIT.json the fit's recorded layer count")
    src = s.add_mutually_exclusive_group()
    src.add_argument("--trace-gen", default=DEFAULT_GEN, help="generator spec, e.g. "
                     "uniform, powerlaw:alpha=1.5, normal:std=0.032")
    src.add_argument("--trace", help="trace file (.npz) instead of generating")
    add_generator_argument(s)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--chunk", type=positive_int, default=None, help="traces per compiled call")
    s.add_argument("--out", help="folder for results.csv and summary.json")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--stream", action="store_true",
                   help="bounded memory for millions of traces: rows to --out/results/*.parquet "
                   "a part at a time, percentiles from a sketch (docs/scaling.md)")
    s.add_argument("--resume", action="store_true",
                   help="continue the interrupted --stream run in --out")
    s.add_argument("--rate", type=float, default=None,
                   help=f"{serving}: Poisson requests/s")
    s.add_argument("--workload", default="medium",
                   help=f"{serving}: short | medium | reasonable (002 §5)")
    s.add_argument("--streams", type=positive_int, default=DefaultInt(1),
                   help=f"{serving}: request streams")
    s.add_argument("--requests", type=positive_int, default=DefaultInt(256),
                   help=f"{serving}: requests per stream")
    s.set_defaults(fn=run)
    add_distributed_arguments(s)
    return s


def run(args) -> int:
    policy = systems.checked_policy(args.policy)
    if systems.entry(policy.system).input_kind == "streams":  # request streams, not traces
        return run_streams(args)
    if unused := given(args, "rate", "streams", "requests"):  # an option must have its effect
        raise ConfigError(f"{' / '.join(unused)}: policy {args.policy!r} simulates routing "
                          f"traces, not request streams ({', '.join(systems.names('streams'))}"
                          " policies take them); drop them")
    setup = api.resolve(args.hardware, args.model, args.policy)
    m = setup.model
    key = jax.random.key(args.seed)
    version = generator_version(args.generator)
    if args.generator != DEFAULT_GENERATOR and (args.trace or args.trace_gen.strip().endswith(
            ".json")):
        raise ConfigError("--generator: applies to traces generated from a spec "
                          "(--trace-gen FAMILY:...), not to --trace files or fit files; drop it")
    if args.trace:
        check_recording_args(args, DefaultInt)
        traces, meta = trace_io.load(args.trace)
        if not traces.batch_shape:
            traces = jax.tree_util.tree_map(lambda x: x[None], traces)
        data = provenance.describe(args.trace, meta)
        source = f"file {args.trace}: {run_provenance.one_line(data)}"
    elif args.trace_gen.strip().endswith(".json"):  # a fit from `moejax trace fit --out`
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
        data = fit_provenance(args.trace_gen, args.seed)
    else:
        spec = gen.parse_spec(args.trace_gen)
        # no system's simulation reads gate weights: version 3 leaves them undrawn (zeros)
        fast = {} if version == 1 else {"gate_weights": False}
        traces = generate_chunked(  # made a chunk at a time inside the engine's loop
            version, spec, key, num_traces=args.traces, iterations=args.iterations,
            layers=args.layers or 1, tokens=args.tokens, num_experts=m.num_experts,
            top_k=m.top_k, **fast,
        )
        source = f"generated {gen.spec_to_str(spec)}" + (
            f" (generator version {version})" if version != 1 else "")
        data = provenance.generated(gen.spec_to_str(spec), args.seed, version)
    if args.stream or args.resume:  # rows to Parquet a part at a time, streaming summaries
        return simulate_streamed(args, setup, traces, key, source,
                                 run_provenance.record(args.seed, data))
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
    summary.update(held_out_summary(setup.policy, out, int(traces.num_iterations)))
    summary["provenance"] = run_provenance.record(args.seed, data)
    if not distributed.is_writer():  # multi-process run: process 0 prints and writes
        return 0
    print_summary(summary)
    if args.out:
        out_dir = Path(args.out)
        cols = {"trace": np.arange(n)}
        for k, v in out.items():
            v = np.asarray(v)
            if v.ndim == 1:
                cols[k] = v
        with together():  # both files or neither (a full disk)
            atomic_write_csv(out_dir / "results.csv", cols)
            atomic_write_json(out_dir / "summary.json", summary)
        print(f"wrote {out_dir / 'results.csv'} and {out_dir / 'summary.json'}")
    return 0


def fit_provenance(path: str, seed: int) -> dict:
    """What a summary records of traces generated from a fit file: the fit and its data."""
    doc = fit.load_fit(path)
    return {"kind": "fit", "file": str(path), "family": doc.get("family"),
            "fitted_to": doc.get("provenance") or doc.get("source"), "seed": int(seed),
            "derived": []}


def held_out_summary(policy, out: dict, iterations: int) -> dict:
    """A re-planning policy's figures over the iterations its first plan serves
    (`rebalancing.held_out_from`: after the window the plan was made from), beside the
    whole-trace ones that include the window: {"held_out": {...}} or {} for other policies."""
    cols = held_out_columns(policy)(out)
    if not cols:
        return {}
    return held_out_block(policy, iterations, engine.percentile_summary(cols[HELD_OUT[0]]),
                          engine.percentile_summary(cols[HELD_OUT[1]]))


HELD_OUT = ("held_out_latency_s", "held_out_forward_s")  # per-trace means, seconds


def held_out_columns(policy):
    """metrics -> {HELD_OUT names: per-trace means [T] (s) over the iterations after
    `rebalancing.held_out_from`} of a re-planning policy ({} for others, or without
    per-iteration metrics): the in-memory summary's and `--stream`'s (a chunk at a time)."""
    start = rebalancing.held_out_from(policy.options) if policy.system == "rebalancing" else 0

    def derive(out) -> dict:
        if policy.system != "rebalancing" or "layer_latency_per_iter_s" not in out:
            return {}
        return {HELD_OUT[0]: np.asarray(out["layer_latency_per_iter_s"])[:, start:].mean(-1),
                HELD_OUT[1]: np.asarray(out["forward_per_iter_s"])[:, start:].mean(-1)}

    return derive


def held_out_block(policy, iterations: int, latency: dict, forward: dict) -> dict:
    """{"held_out": ...} of a summary from the held-out percentile summaries."""
    start = rebalancing.held_out_from(policy.options)
    return {"held_out": {
        "iterations": f"{start}:{iterations}",
        "what": "iterations the first plan serves (the window it was planned from excluded); "
                "the whole-trace figures above include the window",
        "latency_s": latency, "forward_s": forward}}


def run_streams(args) -> int:
    """`moejax simulate` of a policy whose system serves request streams (input_kind
    "streams", e.g. aep-*, ep-sync): Poisson request streams (002 §5) instead of routing
    traces; `--streams` streams of `--requests` requests at `--rate` requests/s of a
    `--workload`."""
    if getattr(args, "generator", DEFAULT_GENERATOR) != DEFAULT_GENERATOR:
        raise ConfigError(f"--generator: policy {args.policy!r} draws Poisson request streams, "
                          "not routing traces; drop it")
    if getattr(args, "trace", None):
        raise ConfigError(f"--trace: policy {args.policy!r} draws its routing from a Poisson "
                          "request stream (--rate, --workload), not from a recorded trace; "
                          "drop --trace")
    if unused := given(args, "tokens", "traces", "iterations", "layers", "chunk", "stream",
                       "resume"):
        raise ConfigError(f"{' / '.join(unused)}: policy {args.policy!r} serves Poisson "
                          "request streams (--rate, --workload, --streams, --requests), not "
                          "routing traces; drop them")
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
        with together():
            atomic_write_csv(d / "results.csv", cols)
            atomic_write_json(d / "summary.json", summary)
        print(f"wrote {d / 'results.csv'} and {d / 'summary.json'}")
    return 0


# memory_s is the slowest device's expert time beyond its compute time (how long it waits on
# memory after its arithmetic is done), not the memory transfer time itself
BREAKDOWN_LABELS = {"comm_s": "  comm (per layer)", "compute_s": "  compute (per layer)",
                    "memory_s": "  memory beyond compute (per layer)",
                    "attention_s": "  attention+dense"}


def print_summary(s: dict) -> None:
    """The summary of a simulate run (in memory or streamed) as a table on stdout."""
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
    if "held_out" in s:
        h = s["held_out"]
        for name, label in (("latency_s", "MoE layer, held out"), ("forward_s", "forward, "
                                                                    "held out")):
            t.add_row(f"{label} (iterations {h['iterations']})",
                      *(_ms(h[name][c]) for c in ("mean", "p50", "p99")))
    for k, v in s["breakdown_s"].items():
        t.add_row(BREAKDOWN_LABELS.get(k, f"  {k[:-2]} (per layer)"), _ms(v), "", "")
    t.add_row("utilization", f"{s['utilization_mean']:.1%}", "", "")
    t.add_row("throughput", f"{s['tokens_per_s_mean']:.4g} tok/s", "", "")
    Console().print(t)


def _ms(x: float) -> str:
    return f"{x * 1e3:.4g} ms" if x >= 1e-4 else f"{x * 1e6:.4g} us"


def simulate_streamed(args, setup, traces, key, source: str, prov: dict) -> int:
    """The CLI's `simulate --stream` / `--resume` (see the module doc); prints the summary and
    writes summary.json when the last trace is done."""
    if args.resume and not args.out:
        raise ConfigError("--resume: needs --out, the folder of the run to continue")
    out_dir = Path(args.out) if args.out else None
    entry = systems.SYSTEMS[setup.policy.system]
    m = setup.model
    systems.check_trace_fits(traces, m, entry.needs_tokens, setup.policy.system)
    system, params = entry.from_policy(setup.platform, m, setup.policy.options_table(),
                                       traces.num_iterations)
    n = engine.batch_size(traces)
    chunk = min(n, args.chunk or engine.default_chunk(traces, system))
    tb, scratch = budget.trace_bytes_per_trace(traces)
    chunk = budget.plan_chunk(n, chunk, trace_bytes=tb, scratch_bytes=scratch, metric_bytes=0,
                              metric_scalars=0, chunk_given=args.chunk is not None,
                              shape=budget.trace_shape(traces))
    meta = {"hardware": setup.platform.name, "model": m.name, "policy": setup.policy.name,
            "system": setup.policy.system, "trace_source": source, "traces": n,
            "tokens": int(traces.num_tokens), "iterations": int(traces.num_iterations),
            "layers": int(traces.num_layers), "seed": int(args.seed), "chunk": chunk,
            "chunk_given": args.chunk is not None, "alpha": stream.ALPHA,
            "part_rows": stream.PART_ROWS}
    t0 = time.perf_counter()
    sums, done_now, meta = stream.run(system, params, traces, key, chunk=chunk, meta=meta,
                               out_dir=out_dir, resume=args.resume,
                               progress=not args.quiet,
                               derive=held_out_columns(setup.policy))
    wall = time.perf_counter() - t0
    if not distributed.is_writer():  # several processes: process 0 prints and writes
        return 0
    h = sums.hists
    summary = {
        "hardware": meta["hardware"], "model": meta["model"], "policy": meta["policy"],
        "system": meta["system"],
        "tokens": int(args.tokens) if not args.trace else float(
            np.mean(np.asarray(traces.tokens_per_iteration()))),
        "traces": n, "iterations": meta["iterations"], "trace_source": source,
        "latency_s": h["latency_s"].summary(), "forward_s": h["forward_s"].summary(),
        "utilization_mean": sums.mean("utilization_mean"),
        "breakdown_s": {k: sums.mean(k) for k in
                        ("comm_s", "compute_s", "memory_s", "attention_s") if k in sums.means},
        "tokens_per_s_mean": sums.mean("tokens_per_s"),
        "wall_s": wall,
        **(held_out_block(setup.policy, meta["iterations"], h[HELD_OUT[0]].summary(),
                          h[HELD_OUT[1]].summary()) if HELD_OUT[0] in h else {}),
        "provenance": prov,
        "streamed": {
            "traces_this_call": done_now,
            "chunk": meta["chunk"],
            "processes": distributed.process_count(),
            "results": (f"{stream.PARTS}/part-*.parquet, {stream.PART_ROWS} traces a part"
                        if out_dir else None),
            "percentiles": "log-bucket histogram (moejax.runner.sketch, DDSketch mapping): p50 "
                           f"/ p99 within relative error {stream.ALPHA:g} of NumPy's; mean, min, "
                           "max exact to float64 rounding",
        },
    }
    print_summary(summary)
    if out_dir is not None:
        atomic_write_json(out_dir / "summary.json", summary)
        print(f"wrote {out_dir / stream.PARTS}/ ({n} traces) and {out_dir / 'summary.json'}")
    return 0
