"""Tune FSE-DP's micro-slice count by gradient descent, and compare with the hard-mode grid.

    python experiments/tune_fsedp_microslices.py \
        --out checkpoints/fsedp-microslices-qwen3-chiplet-2x2 \
        --export policies/fsedp-tuned-qwen3-30b-a3b-chiplet-2x2.toml

000 §VI-D: latency vs micro-slice count first improves, then worsens. The count is an
integer knob (`moejax.tunable.IntegerKnob`) that FSE-DP reads through relax.round; the
held-out evaluation covers every integer in the knob's range (the exhaustive grid), so the
tuned value can be checked against the grid optimum (within 5% is the issue's bar).
"""

from __future__ import annotations

import _tune_script

from moejax.tune import TuneConfig

SHIPPED = TuneConfig(system="fsedp", hardware="chiplet-2x2", model="qwen3-30b-a3b",
                     params=("num_microslices",), steps=40, traces=32, batch=8,
                     eval_traces=32, trace_gen="powerlaw:alpha=1.2", tokens=64, iterations=1,
                     layers=1, seed=0, lr=0.1, warmup=5, tau_start=1.0, tau_end=0.05,
                     init="random", every=20)


def main(argv=None) -> int:
    a = _tune_script.parser(
        __doc__, out="checkpoints/fsedp-microslices-qwen3-chiplet-2x2",
        export_to="policies/fsedp-tuned-qwen3-30b-a3b-chiplet-2x2.toml").parse_args(argv)
    res, prob = _tune_script.train(SHIPPED, a)
    ev = res.evaluation
    grid = {k: v["latency_ms"]["mean"] for k, v in ev.items() if k.startswith("grid")}
    best = min(grid, key=grid.get)
    t, d = ev["tuned"]["latency_ms"]["mean"], ev["default"]["latency_ms"]["mean"]
    print("grid (hard, held-out, mean ms):", {k[7:]: round(v, 4) for k, v in grid.items()})
    print(f"| FSE-DP num_microslices | {SHIPPED.model} / {SHIPPED.hardware} | "
          f"{SHIPPED.trace_gen}, {SHIPPED.tokens} tok/iter | m = {res.hard['num_microslices']}: "
          f"{t:.4f} ms | m = {prob.setup.defaults['num_microslices']}: "
          f"{d:.4f} ms ({(t / d - 1) * 100:+.1f}%) | grid optimum {best[5:]}: "
          f"{grid[best]:.4f} ms ({(t / grid[best] - 1) * 100:+.1f}%) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
