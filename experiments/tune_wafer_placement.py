"""Tune a wafer-scale EP expert placement (001 MoEntwine system) by gradient descent.

    python experiments/tune_wafer_placement.py --out checkpoints/wafer-placement-qwen3-wsc-4x4 \
        --export policies/wafer-tuned-qwen3-30b-a3b-wsc-4x4.toml

qwen3-30b-a3b (128 experts) on the wsc-4x4 wafer (16 dies, 8 experts per die), baseline
mapping policy `ep-baseline-map-link-load` (`ep-baseline-map` pinned to the cut-through
network it was tuned under), through the wafer system's own relaxation (a soft row
is a split expert). The evaluation is hard mode on held-out traces; the export writes the
wafer policy's explicit `placement` list.
"""

from __future__ import annotations

import _tune_script

from moejax.tune import TuneConfig

SHIPPED = TuneConfig(system="wafer", policy="ep-baseline-map-link-load", hardware="wsc-4x4",
                     model="qwen3-30b-a3b", params=("placement",), steps=60, traces=32,
                     batch=8, eval_traces=64, trace_gen="powerlaw:alpha=1.2", tokens=256,
                     iterations=2, layers=1, seed=0, lr=0.1, tau_start=1.0, tau_end=0.005,
                     init="random", relaxation="system", every=20)


def main(argv=None) -> int:
    a = _tune_script.parser(
        __doc__, out="checkpoints/wafer-placement-qwen3-wsc-4x4",
        export_to="policies/wafer-tuned-qwen3-30b-a3b-wsc-4x4.toml").parse_args(argv)
    res, _ = _tune_script.train(SHIPPED, a)
    for name, s in res.evaluation.items():
        print(f"{name:16s} mean {s['latency_ms']['mean']:.5f} ms  p99 "
              f"{s['latency_ms']['p99']:.5f} ms  max/mean die load {s['max_load_ratio_mean']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
