"""Importers of recorded expert routing into `Trace`s: ESFT text logs, OLMoE count pickles,
a documented JSONL per-token format, and a per-layer per-expert counts CSV.

Every importer reads its input line by line (never the whole file as one string), shows a
rich progress bar over the bytes read when asked, and on bad input raises `TraceError`
naming the file, the line (1-based) and the field. Truncated records, ids out of range, a
top-k that differs between records and non-finite weights are errors, never padded over.

Formats (see `docs/traces.md` for examples):

`esft`       a folder of `expert_weights_<L>.txt`, L = 1..num_layers (ESFT,
             deepseek-ai/ESFT `results/expert_scores/<task>/`). One line per sequence:
             tab-separated ids `[T, K]` row-major, then `\\t\\t`, then the gate weights in the
             same layout. Line i of every layer file is the same sequence.
`olmoe`      one or more pickles of OLMoE's routing analysis (allenai/OLMoE
             `scripts/routing_output/`): a list of `Counter{expert -> count}` per recorded
             layer, or of `Counter{(e_a, e_b) -> count}` per layer pair. Each file becomes one
             iteration of a counts-only trace. Unpickled by `restricted_unpickle` only.
`jsonl`      one JSON object per line. Optional first line, a header:
             `{"num_experts": 64, "top_k": 2}`. Then records, either one token:
             `{"layer": 0, "experts": [5, 12], "weights": [0.6, 0.4], "step": 3,
             "request": 7}` or one step of one layer: `{"layer": 0, "experts": [[5, 12],
             [1, 2]], "weights": [[...], [...]], "step": 3, "requests": [7, 8]}`. `weights`,
             `step` (default 0), `request(s)` (default -1) and `token` (ids) are optional. Steps
             become iterations (in increasing order); within a step and layer, tokens are
             lined up by `token` id (or, without ids, keep the order of their records), and
             every layer of a step must route the same tokens (or `ragged="truncate"`).
             `fields` maps these names to a recorder's own keys;
             `ignore_unknown` drops the recorder's other fields.
`counts-csv` a header `layer,0,1,...,E-1` (or `iteration,layer,0,...`), then one row per
             (iteration, layer) of token counts per expert; every pair exactly once.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from moejax.errors import ConfigError
from moejax.trace.core import Trace
from moejax.trace.importers.counts_csv import import_counts_csv
from moejax.trace.importers.esft import import_esft
from moejax.trace.importers.jsonl import JSONL_FIELDS, RAGGED, import_jsonl, parse_field_map
from moejax.trace.importers.olmoe import import_olmoe, restricted_unpickle
from moejax.trace.importers.reading import LAST_ITERATION

__all__ = [
    "FORMATS", "JSONL_FIELDS", "LAST_ITERATION", "RAGGED", "import_counts_csv", "import_esft",
    "import_jsonl", "import_olmoe", "import_trace", "parse_field_map", "restricted_unpickle",
]

FORMATS = ("esft", "olmoe", "jsonl", "counts-csv")


def import_trace(fmt: str, srcs: Sequence, *, num_experts: int | None = None,
                 top_k: int | None = None, progress: bool = False, **options
                 ) -> tuple[Trace, dict]:
    """Import `srcs` (one path; several for `olmoe`) in format `fmt` (one of FORMATS).

    meta["report"] ({"mapped", "dropped", "assumed"}) says how the source became the trace
    and meta["warnings"] what the caller should hear about (the CLI prints both)."""
    tr, meta = _import(fmt, srcs, num_experts=num_experts, top_k=top_k, progress=progress,
                       **options)
    report = meta.setdefault("report", {"mapped": {}, "dropped": [], "assumed": []})
    meta.setdefault("warnings", [])
    if fmt == "esft":
        given = {"num_experts": num_experts, "top_k": top_k}
        defaults = [f"{k}={v}" for k, v in (("num_experts", tr.num_experts),
                                              ("top_k", tr.top_k)) if not given[k]]
        if defaults:
            report["assumed"].insert(0, f"{', '.join(defaults)} (DeepSeek-V2-Lite, ESFT's "
                                     "model; --experts / --top-k for another)")
    if fmt == "olmoe":
        report["mapped"] = {"iterations": f"one per file ({tr.num_iterations})",
                            "layers": f"recorded layers {meta.get('layers')}"}
        report["assumed"].append("counts only: no per-token choices, so no token order")
    if fmt == "counts-csv":
        report["mapped"] = {"rows": "one per (iteration, layer)", "columns": "experts 0..E-1"}
        report["assumed"].append("counts only: no per-token choices, so no token order")
    return tr, meta


def _import(fmt: str, srcs: Sequence, *, num_experts, top_k, progress, **options):
    if fmt not in FORMATS:
        raise ConfigError(f"format: unknown {fmt!r}; allowed: {', '.join(FORMATS)}")
    srcs = [srcs] if isinstance(srcs, (str, os.PathLike)) else list(srcs)
    if fmt != "olmoe" and len(srcs) != 1:
        raise ConfigError(f"src: format {fmt} takes one source, got {len(srcs)}")
    if fmt == "esft":
        kw = {k: v for k, v in (("num_experts", num_experts), ("top_k", top_k)) if v}
        return import_esft(srcs[0], progress=progress, **kw, **options)
    if fmt == "olmoe":
        if num_experts is None or top_k is None:
            raise ConfigError("num_experts / top_k: required for olmoe pickles (OLMoE-1B-7B: "
                              "--experts 64 --top-k 8; Mixtral-8x7B: --experts 8 --top-k 2)")
        return import_olmoe(srcs, num_experts=num_experts, top_k=top_k, progress=progress,
                            **options)
    if fmt == "jsonl":
        return import_jsonl(srcs[0], num_experts=num_experts, top_k=top_k, progress=progress,
                            **options)
    return import_counts_csv(srcs[0], top_k=top_k, num_experts=num_experts, progress=progress)
