"""Benchmark: simulated request streams per second, AEP (aep-defrag) vs the plain reference.

Medium workload (002 §5), Mixtral 8x7B top-1 on a100x8-nvswitch, Poisson arrivals. The
vectorized simulation runs `--streams` streams per call (jit + vmap + chunked scan, compile
excluded by a warm-up call on the same shapes); the plain-Python event loop runs one stream
of the same requests when `--requests <= --ref-max`. Prints streams/s and events/s.

    python benchmarks/bench_amoe.py --requests 2000 --streams 1 16 256

With `--core`, the exact CPU event core (`systems/amoe/core.py`, numba) runs the same
stream (one warm-up call compiles it), then the JAX path over `--events` events of the same
stream (default 4,096), and both events/s and their ratio are printed from the one run:

    python benchmarks/bench_amoe.py --core --requests 2000 --events 4096

With `--rounds`, one run times the exact CPU core (whole stream), the JAX simulation in
rounds (`systems/amoe/rounds.py`, the accelerator path) on 1 stream (its one-stream
compilation, no vmap) and `--batch` streams over
`--chunk-rounds` rounds, and the old one-event-per-step scan path over `--events` events,
all on stream 0 of the same batch, and prints each one's ratio to the old path;
`--repeats N` times N consecutive windows of each (the core: N whole streams) and compares
median rates (one short window moves ~1.5x on a shared machine):

    python benchmarks/bench_amoe.py --rounds --requests 2000 --batch 64 --device cpu

With `--events N` each run is timed over N events per stream only (after a warm-up chunk
of N that compiles and advances the state), the reference over N events of one stream, and
streams/s is *projected* as events/s divided by `--events-per-stream` (an estimate the
caller supplies, e.g. measured on a smaller full run); the output says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import _device  # benchmarks/_device.py: --device, environment line
import jax
import numpy as np

from moejax.catalog.models import load_model
from moejax.runner import engine
from moejax.systems.amoe import aep, reference, rounds, rounds_io, serve


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 16, 256])
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--policy", default="aep-defrag")
    ap.add_argument("--top-k", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=8192)
    ap.add_argument("--ref-max", type=int, default=200, help="largest R for the reference")
    ap.add_argument("--events", type=int, default=0,
                    help="time only this many events per stream (projected streams/s)")
    ap.add_argument("--events-per-stream", type=float, default=0.0,
                    help="estimated events of one full stream, for the projection")
    ap.add_argument("--ref-events", type=int, default=0,
                    help="with --events: reference events to time (default --events)")
    ap.add_argument("--core", action="store_true",
                    help="exact CPU core vs the JAX path on the same stream (events/s)")
    ap.add_argument("--rounds", action="store_true",
                    help="CPU core, rounds path (1 and --batch streams), old scan path")
    ap.add_argument("--batch", type=int, default=64, help="streams of the batched rounds run")
    ap.add_argument("--chunk-rounds", type=int, default=2000,
                    help="rounds timed per rounds run (after a warm-up chunk as long)")
    ap.add_argument("--whole", action="store_true",
                    help="--rounds: also run the old path and the rounds path on one stream "
                         "over the WHOLE stream (no windows; the old path takes ~40 s at 200 "
                         "requests)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="--rounds: time this many windows per path (the core: whole "
                         "streams) and compare median rates")
    _device.add_argument(ap)
    args = ap.parse_args()
    _device.select(args.device)
    if args.core:
        return core_vs_jax(args)
    if args.rounds:
        return rounds_vs_all(args)
    if args.events:
        return partial(args)
    print(f"backend: {jax.default_backend()}, devices: {jax.devices()}")
    model = load_model("mixtral-8x7b")
    system, params, pol = serve.build("a100x8-nvswitch", model, args.policy, args.requests,
                                      top_k=args.top_k)
    for n in args.streams:
        st = serve.streams(jax.random.key(0), num_streams=n, num_requests=args.requests,
                           rate_per_s=args.rate, workload="medium")
        jax.block_until_ready(engine.simulate(system, params, st, jax.random.key(1)))  # compile
        t0 = time.perf_counter()
        out = engine.simulate(system, params, st, jax.random.key(1))
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


def partial(args) -> None:
    """Events/s over `--events` events per stream; streams/s projected (labelled)."""
    model = load_model("mixtral-8x7b")
    system, params, pol = serve.build("a100x8-nvswitch", model, args.policy, args.requests,
                                      top_k=args.top_k)
    per_stream = float(args.events_per_stream)
    print(f"backend: {jax.default_backend()}; timing {args.events} events per stream; "
          f"streams/s PROJECTED with {per_stream:.3g} events per {args.requests}-request stream")
    for n in args.streams:
        st = serve.streams(jax.random.key(0), num_streams=n, num_requests=args.requests,
                           rate_per_s=args.rate, workload="medium")
        init, step_chunk, _ = scan_chunks(system_cfg(model, args), int(args.events))
        keys = jax.random.split(jax.random.key(1), n)
        state, done = step_chunk(params, init(params, st, keys))  # compile + first chunk
        jax.block_until_ready(state)
        ev0 = np.asarray(state.events).sum()
        t0 = time.perf_counter()
        state, done = step_chunk(params, state)
        jax.block_until_ready(state)
        dt = time.perf_counter() - t0
        ev = float(np.asarray(state.events).sum() - ev0)
        proj = f"{ev / dt / per_stream:10.5f}" if per_stream else "       n/a"
        print(f"vectorized  streams={n:4d} requests={args.requests}: {ev:9.0f} events in "
              f"{dt:7.2f} s  {ev / dt:10.0f} events/s  projected {proj} streams/s")
    if pol.system == "aep":
        cfg = system_cfg(model, args)
        st = serve.streams(jax.random.key(0), num_streams=1, num_requests=args.requests,
                           rate_per_s=args.rate, workload="medium")
        seed = int(aep.stream_seed(jax.random.split(jax.random.key(1), 1)[0]))
        m = int(args.ref_events or args.events)
        t0 = time.perf_counter()
        try:
            reference.simulate(cfg, np.asarray(st.arrival_s[0]), np.asarray(st.input_len[0]),
                               np.asarray(st.output_len[0]), np.asarray(st.mask[0]), seed,
                               decay=float(params.decay), max_events=m)
        except RuntimeError:  # stopped after m events, as asked
            pass
        dt = time.perf_counter() - t0
        proj = f"{m / dt / per_stream:10.7f}" if per_stream else "       n/a"
        print(f"reference   streams=   1 requests={args.requests}: {m:9d} events in "
              f"{dt:7.2f} s  {m / dt:10.0f} events/s  projected {proj} streams/s")


def core_vs_jax(args) -> None:
    """Events/s of the CPU core (whole stream) and the JAX path (`--events` events)."""
    from moejax.systems.amoe import steady

    model = load_model("mixtral-8x7b")
    cfg = system_cfg(model, args)
    system, params, _ = serve.build("a100x8-nvswitch", model, args.policy, args.requests,
                                    top_k=args.top_k)
    st = serve.streams(jax.random.key(0), num_streams=1, num_requests=args.requests,
                       rate_per_s=args.rate, workload="medium")
    seed = int(aep.stream_seed(jax.random.split(jax.random.key(1), 1)[0]))
    arr = [np.asarray(x[0]) for x in (st.arrival_s, st.input_len, st.output_len)]
    steady.run_open(cfg, *[a[:20] for a in arr], seed)  # compile (or load the cache)
    t0, c0 = time.perf_counter(), time.process_time()
    res = steady.run_open(cfg, *arr, seed, float(params.decay))
    dt, ct = time.perf_counter() - t0, time.process_time() - c0
    ev = int(res["events"])
    print(f"cpu core    streams=   1 requests={args.requests}: {ev} events in {dt:.2f} s wall "
          f"({ct:.2f} CPU-s): {ev / dt:12.0f} events/s wall, {ev / ct:12.0f} per CPU-s")
    n = int(args.events or 4096)
    init, step_chunk, _ = scan_chunks(cfg, n)
    keys = jax.random.split(jax.random.key(1), 1)
    state, _ = step_chunk(params, init(params, st, keys))  # compile + first chunk
    jax.block_until_ready(state)
    e0 = int(np.asarray(state.events).sum())
    t0, c0 = time.perf_counter(), time.process_time()
    state, _ = step_chunk(params, state)
    jax.block_until_ready(state)
    jdt, jct = time.perf_counter() - t0, time.process_time() - c0
    jev = int(np.asarray(state.events).sum()) - e0
    print(f"JAX path    streams=   1 requests={args.requests}: {jev} events in {jdt:.2f} s wall "
          f"({jct:.2f} CPU-s): {jev / jdt:12.0f} events/s wall, {jev / jct:12.0f} per CPU-s")
    print(f"core / JAX: {ev / dt / (jev / jdt):.0f}x (wall), {ev / ct / (jev / jct):.0f}x "
          f"(CPU time); the JAX path's events/s is over events {e0}-{e0 + jev} of the stream")


def rounds_vs_all(args) -> None:
    """Events/s of the CPU core (whole stream), the rounds path (1 and `--batch` streams,
    `--chunk-rounds` rounds after as many to warm up) and the old scan path (`--events`
    events), on stream 0 of the same batch; wall and CPU time (CPU time is the fair
    measure on a loaded machine)."""
    from moejax.systems.amoe import steady

    model = load_model("mixtral-8x7b")
    cfg = system_cfg(model, args)
    system, params, _ = serve.build("a100x8-nvswitch", model, args.policy, args.requests,
                                    top_k=args.top_k)
    t_ = max(int(args.batch), 1)
    st = serve.streams(jax.random.key(0), num_streams=t_, num_requests=args.requests,
                       rate_per_s=args.rate, workload="medium")
    keys = jax.random.split(jax.random.key(1), t_)
    decay = float(params.decay)
    print(f"backend: {jax.default_backend()}; {args.requests}-request medium streams at "
          f"{args.rate}/s, {args.policy}, top-{args.top_k}, a100x8-nvswitch")
    rates = {}
    reps = max(int(args.repeats), 1)

    def show(name, runs, note=""):
        """runs: [(events, wall s, CPU-s)] of `reps` windows; the median rate of each."""
        w = np.median([ev / dt for ev, dt, _ in runs])
        c = np.median([ev / ct for ev, _, ct in runs])
        rates[name] = (w, c)
        ev, dt, ct = (sum(x) for x in zip(*runs, strict=True))
        spread = ""
        if len(runs) > 1:
            lo, hi = min(e / t for e, _, t in runs), max(e / t for e, _, t in runs)
            spread = f" (median of {len(runs)}; per CPU-s {lo:.0f}-{hi:.0f})"
        print(f"{name:16s} {ev:9d} events {dt:8.2f} s wall {ct:8.2f} CPU-s: "
              f"{w:10.0f} events/s wall {c:10.0f} per CPU-s {note}{spread}")

    one = jax.tree_util.tree_map(lambda x: x[:1], st)
    arr = [np.asarray(x[0]) for x in (st.arrival_s, st.input_len, st.output_len)]
    seed = int(aep.stream_seed(keys[0]))
    steady.run_open(cfg, *[a[:20] for a in arr], seed)  # compile (or load the cache)
    runs = []
    for _ in range(reps):
        res, dt, ct = _timed(steady.run_open, cfg, *arr, seed, decay)
        runs.append((int(res["events"]), dt, ct))
    show("cpu core", runs, "(whole stream)")
    for n in (1, t_) if t_ > 1 else (1,):
        spec, cs, rst = rounds_io.from_aep(cfg, one if n == 1 else st, keys[:n], decay)
        ini, adv = rounds.compiled(spec, batched=n > 1)  # one stream: its own compilation
        if n == 1:
            rst = jax.tree_util.tree_map(lambda x: x[0], rst)
        s = adv(cs, rst, ini(rst), args.chunk_rounds)  # compile + warm-up chunk
        jax.block_until_ready(s)
        runs, r = [], 0
        for _ in range(reps):  # consecutive windows of the same streams
            e0, r0 = int(np.asarray(s.events).sum()), int(np.asarray(s.rounds).max())
            s, dt, ct = _timed(adv, cs, rst, s, r0 + args.chunk_rounds)
            runs.append((int(np.asarray(s.events).sum()) - e0, dt, ct))
            r += int(np.asarray(s.rounds).max()) - r0
        ev = sum(x[0] for x in runs)
        show(f"rounds x{n}", runs, f"({r} rounds, {ev / max(r, 1) / n:.1f} events per "
             f"round per stream, C = {spec.slots})")
    m = int(args.events or 4096)
    init, step_chunk, _ = scan_chunks(cfg, m)
    state, _ = step_chunk(params, init(params, one, keys[:1]))  # compile + first chunk
    jax.block_until_ready(state)
    e0 = e_start = int(np.asarray(state.events).sum())
    runs = []
    for _ in range(reps):  # consecutive chunks of the same stream
        (state, _), dt, ct = _timed(step_chunk, params, state)
        e1 = int(np.asarray(state.events).sum())
        runs.append((e1 - e0, dt, ct))
        e0 = e1
    show("old scan path", runs, f"(events {e_start}-{e0})")
    old = rates["old scan path"]
    for name, (w, c) in rates.items():
        if name != "old scan path":
            print(f"{name:16s} / old scan path: {w / old[0]:8.1f}x wall {c / old[1]:8.1f}x CPU")
    if args.whole:
        whole(args, rates, system, params, cfg, one, keys, decay)


def whole(args, rates, system, params, cfg, one, keys, decay) -> None:
    """Stream 0 start to end on the old scan path and on the rounds path (one-stream
    compilation), compile excluded: no window, so no choice of where in the stream to time."""
    spec, cs, rst = rounds_io.from_aep(cfg, one, keys[:1], decay)
    rst = jax.tree_util.tree_map(lambda x: x[0], rst)
    ini, adv = rounds.compiled(spec)
    jax.block_until_ready(adv(cs, rst, ini(rst), 10))  # compile
    s, dt, ct = _timed(lambda: adv(cs, rst, ini(rst), 2**30))  # init timed, as in the old path
    ev_r = int(s.events)
    print(f"rounds x1 whole  {ev_r:9d} events {dt:8.2f} s wall {ct:8.2f} CPU-s: "
          f"{ev_r / dt:10.0f} events/s wall {ev_r / ct:10.0f} per CPU-s "
          f"({int(s.rounds)} rounds)")
    scan = aep.build(cfg, num_steps=args.chunk)  # the old path: one event per engine step
    engine.simulate(scan, params, one, keys=keys[:1])  # compile
    out, odt, oct_ = _timed(lambda: engine.simulate(scan, params, one, keys=keys[:1]))
    ev_o = int(np.sum(out["events"]))
    print(f"old path whole   {ev_o:9d} events {odt:8.2f} s wall {oct_:8.2f} CPU-s: "
          f"{ev_o / odt:10.0f} events/s wall {ev_o / oct_:10.0f} per CPU-s")
    core = rates["cpu core"]
    print(f"whole stream, rounds x1 / old: {ev_r / dt / (ev_o / odt):6.1f}x wall "
          f"{ev_r / ct / (ev_o / oct_):6.1f}x CPU; cpu core / old: {core[0] / (ev_o / odt):6.1f}x "
          f"wall {core[1] / (ev_o / oct_):6.1f}x CPU (same events: {ev_r == ev_o})")


def _timed(fn, *args):
    """(fn(*args) once ready, wall s, CPU-s of the process)."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - t0, time.process_time() - c0


def scan_chunks(cfg, events: int):
    """(init(params, streams, keys), chunk(params, state) -> (state, done), finish) of the
    one-event-per-step path (`aep.build`), `events` events per chunk (an engine segment)."""
    init, chunk, finish = engine.until_done_program(aep.build(cfg, num_steps=int(events)))
    return (lambda p, st, keys: init(p, st, jax.random.key_data(keys))), chunk, finish


def system_cfg(model, args):
    """The AEPConfig `serve.build` used (rebuilt from the same policy options)."""
    from moejax.catalog.policies import load_policy
    from moejax.systems.amoe import policy as amoe_policy

    pol = load_policy(args.policy)
    opts = dict(pol.options)
    opts["top_k"] = args.top_k
    t = dataclasses.replace(pol, options=tuple(sorted(opts.items()))).options_table()
    o, _, use_mqa, top_k = amoe_policy._aep_options(t)
    return aep.make_config(serve.platform("a100x8-nvswitch"),
                           amoe_policy._model(model, use_mqa, top_k),
                           num_requests=args.requests, **o)


if __name__ == "__main__":
    main()
