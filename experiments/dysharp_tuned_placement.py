"""Tuned vs contiguous expert placement on held-out RECORDED routing, DeepEP and DySHARP.

    .venv/bin/python experiments/dysharp_tuned_placement.py intent.npz law.npz \
        --out docs/results/dysharp/tuned_placement.json [--steps 60]

The recordings come from `moejax trace import --format esft ... --tokens-per-iteration 512`
(deepseek-ai/ESFT routing logs, DeepSeek-V2-Lite layout: 64 experts, top-6, 26 MoE layers;
`deepseek-moe-16b` in the catalog has the same MoE shapes). For each recording and each of
the `deepep` and `dysharp` catalog policies (scaled to 004's 4096 tokens per GPU, the M
configs' sequence length), `moejax tune --system dysharp --param placement --per-layer`
trains one placement per layer on the first half of the recording's iterations and
evaluates it in hard mode on the second half (never seen while training), beside the
contiguous placement (004 §III-D2's OutPort = ID / epg), round-robin and greedy-balanced.
Per placement: held-out layer time, bytes per layer, and the mean distinct remote GPUs per
token R (what co-location lowers). Writes one JSON file.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from moejax.catalog.paths import resolve
from moejax.runner import engine
from moejax.systems.dysharp import traffic
from moejax.tune import TuneConfig, tune
from moejax.tune.loop import build_problem

HARDWARE = "gh200-nvl8"  # 64 experts on 8 GPUs: 8 per GPU
MODEL = "deepseek-moe-16b"  # the DeepSeek-V2-Lite MoE shapes of the recording
TOKENS_PER_GPU = 4096  # 004 Table I (M) sequence length per GPU


def _policy(name: str, folder: Path) -> str:
    text = resolve("policies", name).read_text()
    text = re.sub(r"(?m)^tokens_per_gpu = \d+", f"tokens_per_gpu = {TOKENS_PER_GPU}", text)
    path = folder / f"{name}-{TOKENS_PER_GPU}.toml"
    path.write_text(text)
    return str(path)


def _distinct_remote(traces, place_ids, num_devices):
    """Mean distinct remote GPUs per token over the held-out traces [(L,) E] placement."""
    ids = jnp.asarray(traces.expert_ids)  # [T, I, L, N, K]
    mask = jnp.asarray(traces.token_mask)  # [T, I, N]
    p = jax.nn.one_hot(jnp.asarray(place_ids), num_devices)  # [L, E, G]
    per_layer = jax.vmap(traffic.distinct_remote_gpus, in_axes=(0, None, 0))

    def one(i, m):
        r = per_layer(i, m, p)  # [L, N]
        return (r * m).sum() / jnp.maximum(m.sum() * r.shape[0], 1)

    return float(jax.jit(jax.vmap(jax.vmap(one)))(ids, mask).mean())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+", help="recordings (.npz from `moejax trace import`)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    results = {"hardware": HARDWARE, "model": MODEL, "tokens_per_gpu": TOKENS_PER_GPU,
               "steps": args.steps, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for trace in args.traces:
            for name in ("deepep", "dysharp"):
                cfg = TuneConfig(system="dysharp", hardware=HARDWARE, model=MODEL,
                                 policy=_policy(name, tmp), params=("placement",),
                                 steps=args.steps, batch=4, trace=trace, train_fraction=0.5,
                                 per_layer=True, relaxation="system", init="default",
                                 lr=0.1, every=args.steps)
                res = tune(cfg, tmp / f"{Path(trace).stem}-{name}", progress=False)
                prob = build_problem(cfg)
                setup = prob.setup
                rows = {"tuned": res.hard["placement"],
                        **{k: v["placement"] for k, v in
                           setup.baselines(prob.baseline_load()).items()}}
                g = prob.setup.families["placement"].num_devices
                out = {}
                for label, ids in rows.items():
                    params = setup.apply(setup.base, {"placement": setup.families[
                        "placement"].one_hot(ids)}, 0.0)
                    sim = engine.simulate(setup.system, params, prob.heldout)
                    out[label] = {
                        "layer_ms": float(np.mean(sim["latency_s"])) * 1e3,
                        "traffic_MB": float(np.mean(sim["traffic_bytes"])) / 1e6,
                        "distinct_remote_gpus": _distinct_remote(prob.heldout, ids, g)}
                base = out["contiguous"]
                for v in out.values():
                    v["speedup_vs_contiguous"] = base["layer_ms"] / v["layer_ms"]
                    v["traffic_vs_contiguous"] = v["traffic_MB"] / base["traffic_MB"]
                results["runs"].append({"trace": Path(trace).name, "policy": name,
                                        "train_iterations": int(engine.batch_size(prob.train)),
                                        "heldout_iterations": int(engine.batch_size(
                                            prob.heldout)),
                                        "final_loss": res.history[-1], "placements": out})
                t = out["tuned"]
                print(f"{Path(trace).name} {name}: tuned {t['layer_ms']:.4f} ms vs contiguous "
                      f"{base['layer_ms']:.4f} ms ({t['speedup_vs_contiguous']:.3f}x), R "
                      f"{t['distinct_remote_gpus']:.3f} vs {base['distinct_remote_gpus']:.3f}",
                      flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
