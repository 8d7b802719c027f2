"""`moejax simulate --policy aep-defrag|aep-mtfs|aep-flfs|ep-sync --rate R --workload W`.

Stream-serving policies run on Poisson request streams (002 §5) instead of routing traces:
`--streams` is the number of streams, `--requests` the requests per stream.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from moejax.errors import ConfigError
from moejax.runner import engine
from moejax.systems.amoe import serve
from moejax.systems.amoe.config import itl_bin_edges_s
from moejax.trace.requests import WORKLOADS


def is_stream_policy(policy: str) -> bool:
    from moejax.catalog.policies import load_policy

    return load_policy(policy).system in serve.STREAM_SYSTEMS


def p99_from_hist(hist) -> float:
    """99th percentile ITL (s) from a log-binned histogram (upper edge of its bin)."""
    h = np.asarray(hist, np.float64)
    if h.sum() == 0:
        return float("nan")
    c = np.cumsum(h) / h.sum()
    edges = np.concatenate([itl_bin_edges_s().astype(np.float64), [np.inf]])
    return float(edges[int(np.searchsorted(c, 0.99))])


def simulate(args) -> int:
    from moejax.output.results import atomic_write_csv, atomic_write_json

    if getattr(args, "trace", None):
        raise ConfigError(f"--trace: policy {args.policy!r} draws its routing from a Poisson "
                          "request stream (--rate, --workload), not from a recorded trace; "
                          "drop --trace")
    if args.rate is None or args.rate <= 0:
        raise ConfigError(f"--rate = {args.rate!r}; stream-serving policies need a Poisson "
                          "arrival rate > 0 (requests/s)")
    if args.workload not in WORKLOADS:
        raise ConfigError(f"--workload = {args.workload!r}; allowed: {', '.join(WORKLOADS)}")
    from moejax.output.status import live_status

    t0 = time.perf_counter()
    with live_status(f"simulating {args.policy}", show=not args.quiet) as say:
        out = serve.simulate(args.hardware, args.model, args.policy, rate_per_s=args.rate,
                             workload=args.workload, num_streams=args.streams,
                             num_requests=args.requests, seed=args.seed, progress=say)
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
        cols.update({k: np.asarray(v) for k, v in out.items() if np.ndim(v) == 1})
        atomic_write_csv(d / "results.csv", cols)
        atomic_write_json(d / "summary.json", summary)
        print(f"wrote {d / 'results.csv'} and {d / 'summary.json'}")
    return 0
