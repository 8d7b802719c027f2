"""Diagnostic: AEP vs synchronous EP as the tokens per μ-queue grow (why Fig. 9 does not hold).

Not a paper figure. A saturated AEP expert GPU drains one (block, expert) queue per step;
with tokens spread over all blocks its batch is about concurrency / (blocks x experts), so
the memory-bound expert cost (Fig. 3) is paid on a few tokens. The paper's saturated
points run at KV-cache-bound concurrency (§5.2), thousands of requests; this sweep cannot
afford that with 32 blocks on a CPU, so it shrinks the number of blocks (fewer queues, the
same per-block rules and costs) and raises the number of requests, all arriving at once
(rate 1e5/s), and prints AEP / sync throughput and the mean expert batch. Rows with more
requests per queue are the closer analogue of the paper's regime.

    python experiments/amoe_concurrency.py --blocks 4 --requests 64 256 1024
"""

import argparse
import dataclasses
import time

import jax
import numpy as np

from moejax.catalog.models import load_model
from moejax.runner import engine
from moejax.systems.amoe import serve

ap = argparse.ArgumentParser()
ap.add_argument("--blocks", type=int, default=4)
ap.add_argument("--requests", type=int, nargs="+", default=[64, 256, 1024])
ap.add_argument("--workload", default="short")
ap.add_argument("--top-k", type=int, default=1)
ap.add_argument("--rate", type=float, default=1e5)
ap.add_argument("--policies", nargs="+", default=["aep-defrag", "ep-sync"])
a = ap.parse_args()
m = load_model("mixtral-8x7b")
m = dataclasses.replace(m, num_layers=a.blocks, num_sparse_layers=a.blocks, top_k=a.top_k)
print(f"{a.blocks} blocks x {m.num_experts} experts, top-{a.top_k}, {a.workload}, "
      f"rate {a.rate:g}/s")
for r in a.requests:
    res = {}
    for pol in a.policies:
        system, params, _ = serve.build("a100x8-nvswitch", m, pol, r)
        st = serve.streams(jax.random.key(0), num_streams=1, num_requests=r,
                           rate_per_s=a.rate, workload=a.workload)
        t0 = time.perf_counter()
        out = engine.simulate(system, params, st, jax.random.key(1))
        out = jax.tree_util.tree_map(np.asarray, out)
        batch = out.get("mean_expert_batch", out.get("mean_batch"))[0]
        res[pol] = float(out["throughput_tok_s"][0])
        stall = out.get("expert_stall_fraction", out.get("stall_fraction"))[0]
        print(f"requests {r:5d} ({r / (a.blocks * m.num_experts):6.1f} per block x expert)  "
              f"{pol:11s} {res[pol]:9.0f} tok/s  ITL {out['itl_mean_s'][0] * 1e3:7.2f} ms  "
              f"batch {batch:7.1f}  stall {stall:.2f}  ({time.perf_counter() - t0:.0f} s)",
              flush=True)
    if len(res) == 2:
        v = list(res.values())
        print(f"requests {r:5d}  ratio {a.policies[0]} / {a.policies[1]} = {v[0] / v[1]:.2f}")
