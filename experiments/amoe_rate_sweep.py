"""Throughput / ITL of one policy over arrival rates (one vmapped call, a Fig. 9 curve).

    python experiments/amoe_rate_sweep.py --policy aep-defrag --workload medium \
        --top-k 1 --rates 25 100 400 --requests 256
"""

import argparse

from moejax.reproduce.amoe import ONE_NODE, Grid, sweep

ap = argparse.ArgumentParser()
ap.add_argument("--policy", default="aep-defrag")
ap.add_argument("--hardware", default=ONE_NODE)
ap.add_argument("--workload", default="medium")
ap.add_argument("--top-k", type=int, default=1)
ap.add_argument("--experts", type=int, default=8)
ap.add_argument("--rates", type=float, nargs="+", default=[25.0, 100.0, 400.0])
ap.add_argument("--requests", type=int, default=256)
a = ap.parse_args()
grid = Grid(False, requests=a.requests, rates=tuple(a.rates), top2_workloads=(),
            chunk_steps=8192)
for r in sweep(a.hardware, a.policy, a.top_k, a.workload, a.rates, grid, experts=a.experts):
    print(f"rate {r['rate_per_s']:7.1f}/s  {r['throughput_tok_s']:9.1f} tok/s  "
          f"ITL {r['itl_mean_s'] * 1e3:7.2f} ms (p99 {r['itl_p99_s'] * 1e3:7.1f})  "
          f"TTFT {r['ttft_mean_s'] * 1e3:7.1f} ms  stall {r['stall_fraction']:.2f}  "
          f"batch {r['mean_batch']:.1f}  done {r['all_done']}")
