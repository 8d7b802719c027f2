"""`moejax sweep`: a design-space grid of one platform / model / policy, evaluated as one
vmapped batch of design points (`moejax.runner.sweep`), written as a tidy CSV and a PNG."""

from __future__ import annotations

import time
from pathlib import Path

import jax
import numpy as np

from moejax import systems
from moejax.cli.args import (
    DEFAULT_GEN,
    DEFAULT_GENERATOR,
    add_distributed_arguments,
    add_generator_argument,
    generate_chunked,
    generator_version,
    positive_int,
)
from moejax.errors import ConfigError
from moejax.output import provenance
from moejax.output.results import atomic_write_csv, atomic_write_json, together
from moejax.output.status import live_status
from moejax.runner import budget, distributed, sweep
from moejax.trace import fit, gen
from moejax.trace import provenance as trace_provenance
from moejax.trace.requests import WORKLOADS


def add_parser(sub):
    s = sub.add_parser("sweep", help="evaluate a grid of platform / policy values in one "
                       "vmapped call (CSV + PNG)")
    s.add_argument("--hardware", default="chiplet-2x2", help="platform name or TOML path")
    s.add_argument("--model", default="qwen3-30b-a3b")
    s.add_argument("--policy", default="ep", help="policy name or TOML path")
    s.add_argument("--vary", action="append", default=[], metavar="KEY=LO:HI:N",
                   help="a swept value: KEY=LO:HI:N (linear), KEY=LO:HI:Nlog, KEY=V1,V2,...; "
                        "repeat for a grid (cartesian product)")
    s.add_argument("--tokens", type=positive_int, default=256, help="tokens per iteration")
    s.add_argument("--traces", type=positive_int, default=64)
    s.add_argument("--iterations", type=positive_int, default=1)
    s.add_argument("--layers", type=positive_int, default=1)
    s.add_argument("--trace-gen", default=DEFAULT_GEN,
                   help="generator spec, or a fit file (.json: its pooled spec)")
    add_generator_argument(s)
    s.add_argument("--metric", default="latency_s", help="per-trace metric summarized as "
                   "mean / p50 / p99 and plotted (default latency_s)")
    s.add_argument("--points-per-call", type=positive_int, default=None,
                   help="design points per compiled call (default: bounded by memory)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", required=True, help="folder for sweep.csv, sweep.png, summary.json")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    g = s.add_argument_group(f"stream-serving systems ({', '.join(systems.names('streams'))}; "
                             "002 §5)")
    g.add_argument("--rate", type=float, default=None,
                   help="Poisson requests/s (or --vary rate=LO:HI:N)")
    g.add_argument("--workload", default="medium", help="short | medium | reasonable")
    g.add_argument("--streams", type=positive_int, default=4, help="request streams a point")
    g.add_argument("--requests", type=positive_int, default=64, help="requests per stream")
    s.set_defaults(fn=command)
    add_distributed_arguments(s)
    return s


def command(args) -> int:
    varies = [sweep.parse_vary(v) for v in args.vary]
    points = sweep.grid(varies)
    setup = systems.resolve(args.hardware, args.model, args.policy)
    entry = systems.SYSTEMS[setup.policy.system]
    if entry.input_kind == "streams":  # request streams, not traces
        return _serving(args, setup, entry, points, varies)
    m = setup.model
    key = jax.random.key(args.seed)
    version = generator_version(args.generator)
    spec = fit.load_spec(args.trace_gen)  # a spec, or a fit file's pooled spec
    shape = dict(iterations=args.iterations, layers=args.layers, tokens=args.tokens,
                 num_experts=m.num_experts, top_k=m.top_k)
    lazy = generate_chunked(version, spec, key, num_traces=args.traces, **shape)  # not made yet
    systems.check_trace_fits(lazy, m, entry.needs_tokens, setup.policy.system)
    tb, scratch = budget.trace_bytes_per_trace(lazy)  # all traces held, a block of points each
    budget.check_traces_fit(held=args.traces, working=args.traces * (args.points_per_call or 1),
                            trace_bytes=tb, scratch_bytes=scratch, shape=budget.trace_shape(lazy))
    traces = (gen.generate(spec, key, num_traces=args.traces, **shape) if version == 1
              else lazy.materialize())
    sample_keys = jax.random.key_data(jax.random.split(key, 1))
    sample = jax.tree_util.tree_map(lambda x: x[:1], traces)
    plan = sweep.make_plan(setup, entry, traces.num_iterations, list(points), sample,
                           sample_keys, str(jax.random.key_impl(key)))
    t0 = time.perf_counter()
    out = sweep.run(plan, points, traces, key, points_per_call=args.points_per_call,
                    progress=not args.quiet and distributed.is_writer())
    wall = time.perf_counter() - t0
    if args.metric not in out or np.ndim(out[args.metric]) != 2:
        per_trace = sorted(k for k, v in out.items() if np.ndim(v) == 2)
        raise ConfigError(f"--metric {args.metric!r}: allowed: {', '.join(per_trace)}")
    check_finished(points, out, setup.policy.system)
    cols = sweep.summarize(points, out, args.metric)
    n_pts = len(next(iter(points.values())))
    if not distributed.is_writer():  # multi-process run: process 0 prints and writes
        return 0
    print(f"{n_pts} design points x {args.traces} traces of {setup.policy.name} on "
          f"{setup.platform.name}, {m.name}: {wall:.2f} s (params keys "
          f"{list(plan.params_keys)}, hardware keys {list(plan.hardware_keys)})")
    d = Path(args.out)
    with together():  # the three files or none (a full disk)
        _write(d, points, cols, args, setup, plan, varies, n_pts, wall, spec, version)
    print(f"wrote {d / 'sweep.csv'}, {d / 'sweep.png'} and {d / 'summary.json'}")
    return 0


def _write(d: Path, points, cols, args, setup, plan, varies, n_pts: int, wall: float,
           spec, version: int) -> None:
    m = setup.model
    atomic_write_csv(d / "sweep.csv", cols)
    plot(d / "sweep.png", points, cols, args.metric,
         f"{setup.policy.name} on {setup.platform.name}, {m.name}, {args.tokens} tokens, "
         f"{args.traces} traces")
    atomic_write_json(d / "summary.json", {
        "hardware": setup.platform.name, "model": m.name, "policy": setup.policy.name,
        "system": setup.policy.system, "tokens": args.tokens, "traces": args.traces,
        "vary": {v.key: list(v.values) for v in varies}, "points": n_pts,
        "params_keys": list(plan.params_keys), "hardware_keys": list(plan.hardware_keys),
        "metric": args.metric, "wall_s": wall,
        "best": {k: float(v[int(np.argmin(cols[f'{args.metric}_mean']))])
                 for k, v in cols.items()},
        "provenance": provenance.record(args.seed, {
            **trace_provenance.generated(gen.spec_to_str(spec), args.seed, version),
            **({"fit": args.trace_gen} if args.trace_gen.strip().endswith(".json") else {})}),
    })


def check_finished(points: dict, out: dict, system: str) -> None:
    """ConfigError naming the design points whose run leaves layers unfinished (FSE-DP: a
    micro-slice count too coarse for the weight buffer, 000 §IV-B, which `simulate` raises
    to fit from a policy but a swept value sets as given): their metrics read 0 or absurd."""
    left = np.asarray(out.get("unfinished_layers", 0.0))
    if left.ndim != 2 or not (left > 0).any():
        return
    bad = np.nonzero((left > 0).any(axis=1))[0]
    at = ", ".join(f"{k}={points[k][bad[0]]:g}" for k in points)
    raise ConfigError(f"--vary: {len(bad)} of {left.shape[0]} design points (the first at "
                      f"{at}) leave {system} layers unfinished, so their latency would read 0; "
                      "allowed: values whose run finishes (num_microslices: micro-slices "
                      "that fit the weight buffer twice)")


SERVING_METRICS = ("itl_mean_s", "itl_p99_s", "throughput_tok_s", "ttft_mean_s")


def _serving(args, setup, entry, points, varies) -> int:
    """A sweep of a stream-serving policy (`moejax.runner.sweep.run_streams`): one row per
    design point with throughput, ITL mean / p99 and TTFT over its streams."""
    if args.generator != DEFAULT_GENERATOR:
        raise ConfigError(f"--generator: policy {setup.policy.name!r} draws Poisson request "
                          "streams, not routing traces; drop it")
    if args.workload not in WORKLOADS:
        raise ConfigError(f"--workload {args.workload!r}: allowed: {', '.join(WORKLOADS)}")
    if args.rate is not None and not args.rate > 0:
        raise ConfigError(f"--rate {args.rate!r}: must be > 0 requests/s")
    metric = "itl_mean_s" if args.metric == "latency_s" else args.metric
    if metric not in SERVING_METRICS:
        raise ConfigError(f"--metric {args.metric!r}: allowed for {setup.policy.name}: "
                          f"{', '.join(SERVING_METRICS)}")
    if distributed.process_count() > 1:
        raise ConfigError(f"--policy {setup.policy.name}: a serving sweep runs in one process; "
                          "drop --num-processes / --coordinator")
    serving = sweep.Serving(args.rate, args.workload, args.streams, args.requests, args.seed)
    t0 = time.perf_counter()
    with live_status(f"sweeping {setup.policy.name}", show=not args.quiet) as say:
        out = sweep.run_streams(setup, entry, points, serving, progress=say)
    wall = time.perf_counter() - t0
    cols = sweep.summarize_streams(points, out)
    n_pts = len(next(iter(points.values())))
    m = setup.model
    print(f"{n_pts} design points x {args.streams} streams of {args.requests} requests, "
          f"{setup.policy.name} on {setup.platform.name}, {m.name}: {wall:.2f} s")
    d = Path(args.out)
    with together():  # the three files or none (a full disk)
        atomic_write_csv(d / "sweep.csv", cols)
        rate = "" if "rate" in points else f", {args.rate:g} req/s"
        plot_serving(d / "sweep.png", points, cols, metric,
                     f"{setup.policy.name} on {setup.platform.name}, {m.name}, {args.workload}"
                     f"{rate}, {args.streams} x {args.requests} requests")
        atomic_write_json(d / "summary.json", {
            "hardware": setup.platform.name, "model": m.name, "policy": setup.policy.name,
            "system": setup.policy.system, "rate_per_s": args.rate, "workload": args.workload,
            "streams": args.streams, "requests_per_stream": args.requests,
            "vary": {v.key: list(v.values) for v in varies}, "points": n_pts, "metric": metric,
            "wall_s": wall, "all_done": bool(np.all(cols["all_done"])),
            "best": {k: float(v[int(np.argmin(cols[metric]) if metric != "throughput_tok_s"
                                    else np.argmax(cols[metric]))])
                     for k, v in cols.items()},
            "provenance": provenance.record(args.seed, {
                "kind": "request streams", "workload": args.workload, "seed": args.seed}),
        })
    print(f"wrote {d / 'sweep.csv'}, {d / 'sweep.png'} and {d / 'summary.json'}")
    return 0


def plot_serving(path: Path, points: dict, cols: dict, metric: str, title: str) -> None:
    """One key: mean and p99 ITL (ms) against it, throughput on the right axis. Two or more:
    a heatmap of `metric` over the first two keys (at the first value of the others)."""
    from moejax.output import plotting  # matplotlib: loaded only to draw (CLI start-up)

    keys = list(points)
    if len(keys) > 1:
        mean_cols = {f"{metric}_mean": np.asarray(cols[metric], np.float64)}
        plot(path, points, mean_cols, metric, title)
        return
    fig, axes = plotting.figure(1, 1, width=5.6, height=3.8)
    ax = axes[0, 0]
    sx, lx = _scale(keys[0]) if keys[0] != "rate" else (1.0, "rate (requests/s)")
    x = points[keys[0]] / sx
    ax.plot(x, cols["itl_mean_s"], marker="o", ms=3, label="ITL mean")
    ax.plot(x, cols["itl_p99_s"], marker="s", ms=3, label="ITL p99")
    plotting.time_axis(ax, "y", "ms", "inter-token latency")
    ax.set_xlabel(lx)
    ax2 = ax.twinx()
    ax2.plot(x, cols["throughput_tok_s"], color="0.4", ls="--", label="throughput")
    ax2.set_ylabel("throughput (tokens/s)")
    lines = ax.get_lines() + ax2.get_lines()
    ax.legend(lines, [ln.get_label() for ln in lines], fontsize=8)
    ax.set_title(title, fontsize=8)
    plotting.save(fig, path)


def _scale(key: str) -> tuple[float, str]:
    """(divisor, label) that shows a swept key in readable units."""
    if key.endswith("_Bps"):
        return 1e9, f"{key} (GB/s)"
    if key.endswith("_bytes"):
        return 1e6, f"{key} (MB)"
    if key.endswith("_s"):
        return 1e-6, f"{key} (us)"
    if key == "peak_flops":
        return 1e12, "peak bf16 (TFLOP/s)"
    return 1.0, key


def plot(path: Path, points: dict, cols: dict, metric: str, title: str) -> None:
    """One key: mean / p50 / p99 against it. Two or more: a heatmap of the mean over the
    first two keys (at the first value of the others)."""
    from moejax.output import plotting  # matplotlib: loaded only to draw (CLI start-up)

    keys = list(points)
    mean = cols[f"{metric}_mean"]
    unit = metric.endswith("_s")
    fig, axes = plotting.figure(1, 1, width=5.6, height=3.8)
    ax = axes[0, 0]
    if len(keys) == 1:
        sx, lx = _scale(keys[0])
        x = points[keys[0]] / sx
        for stat in ("mean", "p50", "p99"):
            ax.plot(x, cols[f"{metric}_{stat}"], marker="o", ms=3, label=stat)
        ax.set_xlabel(lx)
        ax.legend(fontsize=8)
        if unit:
            plotting.time_axis(ax, "y", "ms", metric.removesuffix("_s"))
    else:
        sel = np.ones(len(mean), bool)
        for k in keys[2:]:
            sel &= points[k] == points[k][0]
        xs, ys = np.unique(points[keys[1]][sel]), np.unique(points[keys[0]][sel])
        z = np.full((len(ys), len(xs)), np.nan)
        for i in np.flatnonzero(sel):
            z[np.searchsorted(ys, points[keys[0]][i]), np.searchsorted(xs, points[keys[1]][i])] = (
                mean[i] * (1e3 if unit else 1.0))
        (sx, lx), (sy, ly) = _scale(keys[1]), _scale(keys[0])
        im = ax.pcolormesh(_edges(xs / sx), _edges(ys / sy), z, cmap="viridis", shading="flat")
        ax.set_xlabel(lx)
        ax.set_ylabel(ly)
        fig.colorbar(im, ax=ax, label=f"mean {metric.removesuffix('_s')}"
                     + (" (ms)" if unit else ""))
        if len(keys) > 2:
            title += "; " + ", ".join(f"{k} = {points[k][0]:g}" for k in keys[2:])
    ax.set_title(title, fontsize=8)
    plotting.save(fig, path)


def _edges(c: np.ndarray) -> np.ndarray:
    """Cell edges around sorted centres (midpoints; half a step past each end)."""
    if len(c) == 1:
        return np.array([c[0] * 0.9, c[0] * 1.1]) if c[0] else np.array([-0.5, 0.5])
    mid = (c[1:] + c[:-1]) / 2
    return np.concatenate([[2 * c[0] - mid[0]], mid, [2 * c[-1] - mid[-1]]])
