"""Condense the shared routing recordings into the per-expert counts the balancing study
ships with (`moejax/reproduce/data/balancing_recordings.npz`, ~100 KB), so that
`moejax reproduce balancing` runs from a clean checkout or a wheel.

    .venv/bin/python experiments/balancing_recordings.py [--traces ../shared/traces]

Per recording: counts [I, L, E] (int32) of tokens routed to each expert, one iteration per
ESFT sequence (last token dropped, docs/traces.md) or per OLMoE / Mixtral domain file, the
tokens of each iteration, top-k, and where it came from. Placements need per-expert loads
only; the token-level choices are not kept.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import numpy as np

from moejax.output.results import atomic_write_bytes
from moejax.trace import importers

DOMAINS = ("arxiv", "book", "c4", "github", "wikipedia")
OUT = Path(__file__).resolve().parents[1] / "moejax" / "reproduce" / "data"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=str(Path(__file__).resolve().parents[2] / "shared"
                                            / "traces"))
    ap.add_argument("--out", default=str(OUT / "balancing_recordings.npz"))
    args = ap.parse_args(argv)
    root = Path(args.traces)
    arrays = {}
    for task in ("intent", "law"):
        tr, meta = importers.import_esft(root / "ESFT" / "results" / "expert_scores" / task)
        arrays[f"esft_{task}/counts"] = np.asarray(tr.counts).round().astype(np.int32)
        arrays[f"esft_{task}/tokens"] = np.asarray(tr.token_mask.sum(-1), np.int32)
        arrays[f"esft_{task}/top_k"] = np.int32(tr.top_k)
        arrays[f"esft_{task}/source"] = np.str_(
            f"deepseek-ai/ESFT results/expert_scores/{task} (commit 579a771), one iteration "
            "per sequence, last token dropped; DeepSeek-V2-Lite layout, 26 MoE layers")
    olmoe = root / "OLMoE" / "scripts" / "routing_output"
    for name, folder, e, k in (("olmoe", "olmoe", 64, 8), ("mixtral", "mistral", 8, 2)):
        files = [olmoe / folder / "expert_counts" / f"{d}.pkl" for d in DOMAINS]
        tr, meta = importers.import_olmoe(files, num_experts=e, top_k=k)
        arrays[f"{name}/counts"] = np.asarray(tr.counts).round().astype(np.int32)
        arrays[f"{name}/tokens"] = (np.asarray(tr.counts)[:, 0].sum(-1) / k).round().astype(
            np.int32)
        arrays[f"{name}/top_k"] = np.int32(k)
        arrays[f"{name}/domains"] = np.array(DOMAINS)
        arrays[f"{name}/source"] = np.str_(
            f"allenai/OLMoE scripts/routing_output/{folder}/expert_counts/{{domain}}.pkl, one "
            "iteration per domain (arxiv, book, c4, github, wikipedia), decoder layers 0, 7, 15")
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    atomic_write_bytes(args.out, buf.getvalue())
    for key, v in arrays.items():
        if key.endswith("/counts"):
            print(f"{key}: {v.shape}, {int(v.sum())} (token, expert) pairs")
    print(f"wrote {args.out} ({len(buf.getvalue()) / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
