"""Baseline knobs tuned as hard as DySHARP's: FasterMoE's pipeline degree, COMET's and
DySHARP's comm SMs, each by `moejax tune --system dysharp` (20 steps, relaxation 'system'),
dysharp-s top-8 on gh200-nvl32, training, loads scaled to 2048 tokens per GPU,
`normal:std=0.032`; held-out hard evaluation beside the hard grid of each knob.
Writes /tmp/dysharp/runs/knobs.json (copied to docs/results/dysharp/tuned_knobs.json).
"""

import json
import re
import tempfile
from pathlib import Path

from moejax.catalog.paths import resolve
from moejax.tune import TuneConfig, tune

tmp = Path(tempfile.mkdtemp())
out = {}
for name, param in (("fastermoe", "chunks"), ("comet", "comm_sms"), ("dysharp", "comm_sms")):
    text = re.sub(
        r"(?m)^tokens_per_gpu = \d+", "tokens_per_gpu = 2048", resolve("policies", name).read_text()
    )
    text = re.sub(r"(?m)^phase = \"forward\"", 'phase = "training"', text)
    p = tmp / f"{name}-2048.toml"
    p.write_text(text)
    cfg = TuneConfig(
        system="dysharp",
        hardware="gh200-nvl32",
        model="dysharp-s",
        policy=str(p),
        params=(param,),
        steps=20,
        traces=4,
        batch=2,
        eval_traces=8,
        tokens=512,
        iterations=1,
        layers=1,
        relaxation="system",
        init="default",
        every=20,
        trace_gen="normal:std=0.032",
    )
    r = tune(cfg, tmp / name, progress=False)
    out[f"{name}:{param}"] = {
        "hard": r.hard,
        "eval": {k: v["latency_ms"]["mean"] for k, v in r.evaluation.items()},
    }
    print(name, param, json.dumps(out[f"{name}:{param}"]), flush=True)
Path("/tmp/dysharp/runs").mkdir(parents=True, exist_ok=True)
json.dump(out, open("/tmp/dysharp/runs/knobs.json", "w"), indent=1)
