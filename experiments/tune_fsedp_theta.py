"""Tune FSE-DP's micro-slice count and token-buffering threshold theta_min together, and
compare with the exhaustive coarse hard-mode grid.

    python experiments/tune_fsedp_theta.py \
        --out checkpoints/fsedp-microslices-theta-phi35-chiplet-2x2 \
        --export policies/fsedp-buffered-tuned-phi-3.5-moe-chiplet-2x2.toml

000 §V-A Algorithm 2: at a layer boundary a request whose activated experts include one
with fewer than theta_min tokens is deferred, if its QoS timer (one grant every
1 / slack passes, slack 20 %, §VI-A) allows. Base policy `fsedp-buffered` (A5). phi-3.5-moe
(16 experts, top-2) keeps the 16-iteration traces cheap, and at 64 tokens per iteration
its expert loads spread over a range where theta_min matters (qwen3-30b-a3b: every request
meets a 1-token expert, so any theta_min >= 2 defers the same). Relaxation `lattice`
(hard runs at the integer neighbours, see docs/tuning.md); `--relaxation system` runs the
soft Algorithm 2 instead, for the comparison in the docs. Under --plots: loss.png
(training loss per step), latency.png (held-out per-trace MoE-layer latency: default,
tuned, grid optimum), grid.png (the hard grid, tuned point marked). --resume on the
finished folder re-evaluates, re-exports (bit-identical) and re-plots without training.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import _tune_script  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from moejax.tune import TuneConfig  # noqa: E402
from moejax.tune import loop as tl  # noqa: E402

SHIPPED = TuneConfig(system="fsedp", hardware="chiplet-2x2", model="phi-3.5-moe",
                     policy="fsedp-buffered", params=("num_microslices", "theta_min"),
                     steps=100, traces=32, batch=8, eval_traces=32,
                     trace_gen="powerlaw:alpha=1.2", tokens=64, iterations=16, layers=1,
                     seed=0, lr=0.2, warmup=5, tau_start=1.0, tau_end=0.05, init="default",
                     relaxation="lattice", every=25)


def table_row(cfg, res, prob) -> str:
    ev = res.evaluation
    grid = {k: v["latency_ms"]["mean"] for k, v in ev.items() if k.startswith("grid")}
    best = min(grid, key=grid.get)
    t, d = ev["tuned"]["latency_ms"]["mean"], ev["default"]["latency_ms"]["mean"]
    tp = {k: ev[k]["tokens_per_s_mean"] for k in ("tuned", "default", best)}
    hard = ", ".join(f"{k} = {v}" for k, v in res.hard.items())
    dflt = ", ".join(f"{k} = {v}" for k, v in prob.setup.defaults.items())
    return (f"| {', '.join(cfg.params)} ({cfg.relaxation}) | {cfg.model} / {cfg.hardware} | "
            f"{hard}: {t:.4f} ms ({tp['tuned']:.1f} tok/s) | {dflt}: {d:.4f} ms "
            f"({(t / d - 1) * 100:+.1f}%; {tp['default']:.1f} tok/s) | grid optimum "
            f"{best[5:]}: {grid[best]:.4f} ms ({(t / grid[best] - 1) * 100:+.1f}%; "
            f"{tp[best]:.1f} tok/s) |")


def main(argv=None) -> int:
    ap = _tune_script.parser(
        __doc__, out="checkpoints/fsedp-microslices-theta-phi35-chiplet-2x2",
        export_to="policies/fsedp-buffered-tuned-phi-3.5-moe-chiplet-2x2.toml",
        plots="results/tune_fsedp_theta")
    ap.add_argument("--relaxation", default=SHIPPED.relaxation)
    ap.add_argument("--steps", type=int, default=SHIPPED.steps)
    a = ap.parse_args(argv)
    cfg = dataclasses.replace(SHIPPED, relaxation=a.relaxation, steps=a.steps)
    res, prob = _tune_script.train(cfg, a)
    print("loss", [round(x, 4) for x in res.history])
    print(table_row(cfg, res, prob))
    if a.plots:
        plot(Path(a.plots), cfg, res, prob)
        print(f"plots in {a.plots}")
    return 0


def plot(out: Path, cfg, res, prob) -> None:
    out.mkdir(parents=True, exist_ok=True)
    ev = res.evaluation
    grid = {k: v["latency_ms"]["mean"] for k, v in ev.items() if k.startswith("grid")}
    best = min(grid, key=grid.get)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(np.arange(1, len(res.history) + 1), res.history)
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss ({cfg.relaxation}; mean layer ms)")
    ax.set_title(f"FSE-DP micro-slices + theta_min: {cfg.model} on {cfg.hardware}")
    fig.tight_layout()
    fig.savefig(out / "loss.png", dpi=120)
    plt.close(fig)

    rows = {"default": prob.setup.defaults, "tuned": res.hard,
            f"grid optimum ({best[5:]})": prob.setup.baselines(None)[best]}
    lat = {k: tl.evaluate_values(prob, v)["latency_s"] * 1e3 for k, v in rows.items()}
    fig, ax = plt.subplots(figsize=(6, 3.5))
    bins = np.linspace(min(v.min() for v in lat.values()), max(v.max() for v in lat.values()),
                       30)
    for k, v in lat.items():
        ax.hist(v, bins=bins, histtype="step", linewidth=1.5, label=f"{k}: mean {v.mean():.3f}")
    ax.set_xlabel("held-out MoE-layer latency per trace (ms, hard mode)")
    ax.set_ylabel("traces")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "latency.png", dpi=120)
    plt.close(fig)

    pts = [(int(k.split(",")[0].split("=")[1]), int(k.split("=")[-1]), v)
           for k, v in grid.items()]
    ms, ths = sorted({p[0] for p in pts}), sorted({p[1] for p in pts})
    z = np.full((len(ths), len(ms)), np.nan)
    for m, th, v in pts:
        z[ths.index(th), ms.index(m)] = v
    fig, ax = plt.subplots(figsize=(6, 3.5))
    im = ax.imshow(z, origin="lower", aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(ms)), [str(m) for m in ms], fontsize=7)
    ax.set_yticks(range(len(ths)), [str(t) for t in ths], fontsize=7)
    ax.set_xlabel("micro-slices per expert")
    ax.set_ylabel("theta_min (tokens)")
    tm, tt = res.hard["num_microslices"], res.hard["theta_min"]
    ax.plot(np.interp(tm, ms, range(len(ms))), np.interp(tt, ths, range(len(ths))), "r*",
            markersize=12, label=f"tuned m={tm}, theta={tt}")
    ax.legend(fontsize=8, loc="upper left")
    fig.colorbar(im, label="held-out mean layer ms (hard)")
    fig.tight_layout()
    fig.savefig(out / "grid.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
