"""Benchmark: simulated request streams per second, AEP (aep-defrag) vs the plain reference.

Medium workload (002 §5), Mixtral 8x7B top-1 on a100x8-nvswitch, Poisson arrivals. The
vectorized simulation runs `--streams` streams per call (jit + vmap + chunked scan, compile
excluded by a warm-up call on the same shapes); the plain-Python event loop runs one stream
of the same requests when `--requests <= --ref-max`. Prints streams/s and events/s.

    python benchmarks/bench_amoe.py --requests 2000 --streams 1 16 256
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from moejax.models import load_model
from moejax.systems.amoe import aep, reference, runner, serve


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 16, 256])
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--policy", default="aep-defrag")
    ap.add_argument("--top-k", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=8192)
    ap.add_argument("--ref-max", type=int, default=200, help="largest R for the reference")
    args = ap.parse_args()
    print(f"backend: {jax.default_backend()}, devices: {jax.devices()}")
    model = load_model("mixtral-8x7b")
    system, params, pol = serve.build("a100x8-nvswitch", model, args.policy, args.requests,
                                      top_k=args.top_k)
    for n in args.streams:
        st = serve.streams(jax.random.key(0), num_streams=n, num_requests=args.requests,
                           rate_per_s=args.rate, workload="medium")
        runner.run_streams(system, params, st, jax.random.key(1), chunk_steps=args.chunk)
        t0 = time.perf_counter()
        out = runner.run_streams(system, params, st, jax.random.key(1), chunk_steps=args.chunk)
        jax.block_until_ready(out)
        dt = time.perf_counter() - t0
        ev = float(np.sum(out["events"]))
        print(f"vectorized  streams={n:4d} requests={args.requests}: {dt:9.2f} s  "
              f"{n / dt:10.4f} streams/s  {ev / dt:12.0f} events/s  "
              f"tok/s(sim) {float(np.mean(out['throughput_tok_s'])):.0f}")
    if args.requests <= args.ref_max and pol.system == "aep":
        cfg = system_cfg(model, args)
        st = serve.streams(jax.random.key(0), num_streams=1, num_requests=args.requests,
                           rate_per_s=args.rate, workload="medium")
        seed = int(aep.stream_seed(jax.random.split(jax.random.key(1), 1)[0]))
        t0 = time.perf_counter()
        ref = reference.simulate(cfg, np.asarray(st.arrival_s[0]), np.asarray(st.input_len[0]),
                                 np.asarray(st.output_len[0]), np.asarray(st.mask[0]), seed,
                                 decay=float(params.decay))
        dt = time.perf_counter() - t0
        print(f"reference   streams=   1 requests={args.requests}: {dt:9.2f} s  "
              f"{1 / dt:10.4f} streams/s  {ref['events'] / dt:12.0f} events/s")


def system_cfg(model, args):
    """The AEPConfig `serve.build` used (rebuilt from the same policy options)."""
    from moejax.policies import load_policy
    from moejax.systems.amoe import policy as amoe_policy

    pol = load_policy(args.policy)
    opts = dict(pol.options)
    opts["top_k"] = args.top_k
    import dataclasses

    t = dataclasses.replace(pol, options=tuple(sorted(opts.items()))).options_table()
    o, _, use_mqa, top_k = amoe_policy._aep_options(t)
    return aep.make_config(serve.platform("a100x8-nvswitch"),
                           amoe_policy._model(model, use_mqa, top_k),
                           num_requests=args.requests, **o)


if __name__ == "__main__":
    main()
