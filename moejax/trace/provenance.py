"""Where a trace's routing came from, kept in its `.npz` meta under "provenance" so that
every later output (simulate's summary.json, tune's summary and exported policy, the latency
table) names its data.

A recording imported by `moejax trace import` records {"kind": "recording", "source": the
source file(s), "format": the importer, "options": the importer options}; `trace slice`,
`concat` and `split` append a step to "derived" (and `concat` keeps its parts' provenance
under "parts"); `trace gen` records {"kind": "generated", "generator", "seed"} and, for a
generator version other than 1, "generator_version". The key is
optional: files written before it load as before, and `describe` says what it can.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

KEY = "provenance"


def imported(fmt: str, srcs, options: dict, version: str) -> dict:
    """Provenance of a fresh import of `srcs` (paths) with importer `fmt` and `options`."""
    srcs = [srcs] if isinstance(srcs, (str, os.PathLike)) else list(srcs)
    return {"kind": "recording", "source": [str(Path(s)) for s in srcs], "format": fmt,
            "options": {k: v for k, v in sorted(options.items())}, "imported_by":
            f"moejax {version}", "derived": []}


def generated(spec: str, seed: int, version: int = 1) -> dict:
    """Provenance of generated traces; `generator_version` recorded when not version 1 (the
    default, whose records stay as they were)."""
    out = {"kind": "generated", "generator": spec, "seed": int(seed), "derived": []}
    if version != 1:
        out["generator_version"] = int(version)
    return out


def of(meta: dict | None) -> dict:
    """The provenance in a trace's meta (a copy), or what the older keys say of it."""
    meta = meta if isinstance(meta, dict) else {}
    if isinstance(meta.get(KEY), dict):
        return copy.deepcopy(meta[KEY])
    if "generator" in meta:
        return generated(str(meta["generator"]), int(meta.get("seed", 0)))
    if "source" in meta or "path" in meta:  # imported before provenance was recorded
        return {"kind": "recording", "source": [str(meta.get("path", ""))],
                "format": meta.get("source"), "options": {}, "derived": []}
    return {"kind": "unknown", "derived": []}


def derive(meta: dict | None, step: str, **extra) -> dict:
    """The meta of a trace made from one with `meta` by `step` (e.g. "slice iterations
    0:8"): the same keys, provenance with `step` appended to "derived"."""
    out = dict(meta or {})
    prov = of(meta)
    prov["derived"] = [*prov.get("derived", []), step]
    prov.update(extra)
    out[KEY] = prov
    return out


def describe(path, meta: dict | None) -> dict:
    """What a summary records of a trace file: its path and its provenance."""
    return {"file": str(path), **of(meta)}
