"""`moejax tune`: arguments (the tunable systems, their parameters and base policies read
from the registry), the run, and the summary table printed at the end."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from moejax import systems
from moejax.cli.args import DefaultInt, add_distributed_arguments, given, positive_int
from moejax.errors import ConfigError
from moejax.runner import distributed


def add_parser(sub) -> argparse.ArgumentParser:
    tunable = {k: e for k, e in systems.SYSTEMS.items() if e.tuning is not None}
    policies = ", ".join(k if e.default_policy == k else f"{e.default_policy} for {k}"
                         for k, e in tunable.items())
    params = "; ".join(f"{k}: {e.tuning.help or ', '.join(e.tuning.params)}"
                       for k, e in tunable.items())
    per_layer = ", ".join(k for k, e in tunable.items() if e.tuning.per_layer)
    u = sub.add_parser("tune", help="tune a system's parameters by gradient descent (optax), "
                       "with orbax checkpoints")
    u.add_argument("--system", default="ep",
                   help=f"system key (tunable: {', '.join(tunable)})")
    u.add_argument("--hardware", default="chiplet-2x2")
    u.add_argument("--model", default="qwen3-30b-a3b")
    u.add_argument("--policy", default="", help=f"base policy (default: {policies})")
    u.add_argument("--param", default="placement",
                   help=f"comma-separated parameter names ({params})")
    u.add_argument("--search", default="grad",
                   help="grad (relaxed-gradient loop) | tpe | cmaes (Optuna samplers) | "
                   "random | grid (scalar knobs): black-box methods run --steps hard trials "
                   "on every training trace (docs/tuning.md)")
    u.add_argument("--steps", type=positive_int, default=200,
                   help="gradient steps, or trials of a black-box --search")
    u.add_argument("--traces", type=positive_int, default=DefaultInt(64), help="training traces")
    u.add_argument("--batch", type=positive_int, default=16, help="traces per step")
    u.add_argument("--eval-traces", type=positive_int, default=DefaultInt(256),
                   help="held-out traces")
    u.add_argument("--trace-gen", default="powerlaw:alpha=1.2",
                   help="generator spec of the (fixed) popularity")
    u.add_argument("--tokens", type=positive_int, default=DefaultInt(64),
                   help="tokens per iteration")
    u.add_argument("--iterations", type=positive_int, default=DefaultInt(2))
    u.add_argument("--layers", type=positive_int, default=DefaultInt(1))
    u.add_argument("--seed", type=int, default=0)
    u.add_argument("--lr", type=float, default=0.1)
    u.add_argument("--warmup", type=int, default=10)
    u.add_argument("--clip", type=float, default=1.0, help="global gradient-norm clip")
    u.add_argument("--tau-start", type=float, default=1.0)
    u.add_argument("--tau-end", type=float, default=0.005)
    u.add_argument("--sim-tau-scale", type=float, default=1.0)
    u.add_argument("--gumbel", type=float, default=0.0,
                   help="Gumbel-Sinkhorn noise on placement logits while training (0: off)")
    u.add_argument("--loss", default="mean",
                   help="mean | p99 | throughput | forward (wafer: iteration time with "
                   "migration stalls)")
    u.add_argument("--init", default="random",
                   help="random | default | greedy | eplb (ep replicas: start from EPLB)")
    u.add_argument("--trace", default="",
                   help="train on a recording (.npz, `moejax trace import`) instead of "
                   "--trace-gen: its first --train-fraction of iterations train, the rest are "
                   "the held-out evaluation (--traces / --eval-traces / --tokens / --iterations / "
                   "--layers are refused: the recording has its own shape)")
    u.add_argument("--train-fraction", type=float, default=0.5,
                   help="with --trace: share of the recording's iterations to train on")
    u.add_argument("--per-layer", action="store_true",
                   help=f"{per_layer}: one placement per trace layer (as EPLB plans them)")
    u.add_argument("--relaxation", default="expected",
                   help="expected | system | lattice (integer knobs: hard runs at the "
                   "integer neighbours) | smoothed (aep decay: Gaussian smoothing, "
                   "antithetic score-function gradient)")
    u.add_argument("--capacity", type=int, default=0,
                   help="experts (placement) or slots (replicas) per device (0: E/D, E/D + 1)")
    u.add_argument("--budget", default="",
                   help="fsedp hardware params: 000 Eq. (1)-(2) coefficients, name=value,... "
                   "(area_limit_mm2, power_limit_w, sram_mm2_per_MiB, ucie_module_Bps, "
                   "ucie_module_mm2, compute_mm2, compute_w, d2d_pj_per_bit, ddr_pj_per_bit, "
                   "penalty_weight; defaults: moejax/systems/fsedp/budget.py)")
    u.add_argument("--requests", type=positive_int, default=16,
                   help="aep: requests per stream (--traces / --eval-traces: streams)")
    u.add_argument("--rate-per-s", type=float, default=200.0, help="aep: Poisson arrival rate")
    u.add_argument("--workload", default="medium", help="aep: 002 §5 workload")
    u.add_argument("--samples", type=positive_int, default=2,
                   help="aep (relaxation smoothed): antithetic pairs per update")
    u.add_argument("--every", type=positive_int, default=50, help="checkpoint every N steps")
    u.add_argument("--keep", type=positive_int, default=3, help="checkpoints kept")
    u.add_argument("--out", required=True, help="checkpoint folder, e.g. checkpoints/NAME")
    u.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    u.add_argument("--export", help="write the tuned policy TOML here (policies/NAME.toml)")
    u.add_argument("--export-hardware",
                   help="with ddr_Bps / link_Bps tuned: write the tuned platform TOML here "
                   "(a policy has no key for them); use it as moejax simulate --hardware")
    u.add_argument("--quiet", action="store_true", help="no progress bar")
    u.set_defaults(fn=run)
    add_distributed_arguments(u)
    return u


def run(args) -> int:
    # the tuner (optax, orbax) is imported by the command that runs it: `moejax simulate`
    # builds this parser too and should not pay for it
    from moejax.tune import TuneConfig, tune

    cfg = config_from_args(TuneConfig, args)
    res = tune(cfg, args.out, resume=args.resume, progress=not args.quiet)
    return finish(args, cfg, res) if distributed.is_writer() else 0


def config_from_args(cls, args):
    params = tuple(p.strip() for p in args.param.split(",") if p.strip())
    if not params:
        raise ConfigError("--param: give at least one parameter name")
    if args.trace and (unused := given(args, "traces", "eval_traces", "tokens", "iterations",
                                       "layers")):  # an option must have its effect
        raise ConfigError(f"{' / '.join(unused)}: --trace {args.trace} trains and evaluates on "
                          "the recording's own iterations, layers and tokens; drop them")
    return cls(system=args.system, hardware=args.hardware, model=args.model,
               policy=args.policy, params=params, steps=args.steps, traces=args.traces,
               batch=args.batch, eval_traces=args.eval_traces, trace_gen=args.trace_gen,
               tokens=args.tokens, iterations=args.iterations, layers=args.layers,
               seed=args.seed, lr=args.lr, warmup=args.warmup, clip=args.clip,
               tau_start=args.tau_start, tau_end=args.tau_end,
               sim_tau_scale=args.sim_tau_scale, gumbel=args.gumbel, loss=args.loss,
               every=args.every,
               keep=args.keep, init=args.init, relaxation=args.relaxation,
               capacity=args.capacity, budget=args.budget, requests=args.requests,
               rate_per_s=args.rate_per_s, workload=args.workload, samples=args.samples,
               trace=args.trace, train_fraction=args.train_fraction, per_layer=args.per_layer,
               search=args.search)


def finish(args, cfg, res) -> int:
    """Print the hard-mode held-out table; export the policy if asked."""
    if cfg.relaxation == "smoothed":
        return _finish_smoothed(args, cfg, res)
    held = (f"the iterations of {cfg.trace} after its first {cfg.train_fraction:g}"
            if cfg.trace else f"{cfg.eval_traces} traces of {cfg.trace_gen}")
    t = Table(title=f"{cfg.system} {', '.join(cfg.params)} on {cfg.hardware}, {cfg.model}: "
                    f"held-out, hard mode ({held})")
    budget = any("budget" in s for s in res.evaluation.values())
    fwd = any("forward_ms_mean" in s for s in res.evaluation.values())
    cols = ("values", "latency mean ms", "p99 ms", "max/mean device load")
    cols += ("forward ms / iteration", "migrations") if fwd else ()
    for c in cols + (("mm^2 / die, W, within 000 Eq. (1)-(2)",) if budget else ()):
        t.add_column(c, justify="right")
    for name, s in res.evaluation.items():
        ratio = s.get("max_load_ratio_mean")
        row = [name, f"{s['latency_ms']['mean']:.5g}", f"{s['latency_ms']['p99']:.5g}",
               "" if ratio is None else f"{ratio:.3f}"]
        if fwd:
            row += [f"{s['forward_ms_mean']:.5g}", f"{s['migrations_mean']:.5g}"]
        if budget:
            b = s["budget"]
            row.append(f"{b['area_mm2']:.4g}, {b['power_w']:.4g}, "
                       f"{'yes' if b['feasible'] else 'NO'}")
        t.add_row(*row)
    Console().print(t)
    b = res.budget
    if b:
        print(f"budget ({b['search']}): {b['layer_traces']} simulated layer-traces, "
              f"{b['hard_evaluations']} hard + {b['relaxed_evaluations']} relaxed evaluations, "
              f"wall {b['wall_s']:.1f} s, CPU {b['cpu_s']:.1f} s")
    print(f"checkpoints in {args.out} (step {res.step}); summary in {args.out}/summary.json")
    if args.export:
        from moejax.tune import export
        from moejax.tune.loop import build_problem

        path = export.write_policy(args.export, build_problem(cfg, traces=False), res.hard,
                                   res.step, hardware_path=args.export_hardware)
        print(f"wrote policy {path}")
        if args.export_hardware:
            print(f"wrote platform {args.export_hardware}")
    return 0


def _finish_smoothed(args, cfg, res) -> int:
    """aep decay: held-out throughput / ITL / TTFT table; export the tuned policy."""
    t = Table(title=f"aep decay on {cfg.hardware}, {cfg.model}: held-out, hard mode "
                    f"({cfg.eval_traces} streams x {cfg.requests} requests)")
    for c in ("decay", "tok/s", "mean ITL ms", "mean TTFT ms"):
        t.add_column(c, justify="right")
    for name, m in res.evaluation.items():
        t.add_row(name, f"{m['throughput_tok_s']:.5g}", f"{m['itl_mean_s'] * 1e3:.4g}",
                  f"{m['ttft_mean_s'] * 1e3:.4g}")
    Console().print(t)
    print(f"tuned decay {res.hard['decay']:.4f}; checkpoints in {args.out} (step {res.step})")
    if args.export:
        from moejax.tune import smoothed

        path = smoothed.write_policy(args.export, cfg, res.hard, res.step)
        print(f"wrote policy {path}")
    return 0
