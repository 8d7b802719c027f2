"""Versioned on-disk format of routing traces: one `.npz` per trace or batch of traces.

Arrays: the five `Trace` leaves under their field names, plus `schema_version`,
`num_experts`, `top_k` (int64 scalars) and `meta` (a JSON string: generator spec, model
name, anything the caller wants to keep with the trace). Files are written to a temporary
file in the target folder and renamed, so a reader never sees a half-written trace.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from moejax.errors import ConfigError, TraceError
from moejax.output.results import atomic_file
from moejax.trace.core import SCHEMA_VERSION, Trace, counts_from_ids, validate

LEAVES = ("expert_ids", "gate_weights", "token_mask", "token_request", "counts")
_SCALARS = ("schema_version", "num_experts", "top_k")
_KINDS = {  # dtype kind each leaf must have on disk, and the dtype it is loaded as
    "expert_ids": ("iu", jnp.int32, "integer"),
    "gate_weights": ("f", jnp.float32, "floating"),
    "token_mask": ("b", bool, "bool"),
    "token_request": ("iu", jnp.int32, "integer"),
    "counts": ("f", jnp.float32, "floating"),
}


def save(path: str | os.PathLike, trace: Trace, meta: dict | None = None) -> Path:
    """Validate `trace` and write it with `meta` to `path` (exactly that name), atomically."""
    path = Path(path)
    validate(trace)
    _check_counts(trace)
    try:
        meta_json = json.dumps({} if meta is None else meta, sort_keys=True)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"meta: must be JSON-serializable ({err})") from None
    if not isinstance(json.loads(meta_json), dict):
        raise ConfigError(f"meta: must be a dict, got {type(meta).__name__}")
    arrays = {name: np.asarray(getattr(trace, name)) for name in LEAVES}
    arrays.update(
        schema_version=np.int64(SCHEMA_VERSION),
        num_experts=np.int64(trace.num_experts),
        top_k=np.int64(trace.top_k),
        meta=np.array(meta_json),
    )
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise TraceError(f"path: folder {str(folder)!r} does not exist")
    with atomic_file(path, fsync=True) as f:  # umask permissions; a full disk is one line
        np.savez_compressed(f, **arrays)
    return path


def _read(npz, name: str, path: Path) -> np.ndarray:
    if name not in npz.files:
        raise TraceError(f"{name}: missing array in {str(path)!r} (has: {', '.join(npz.files)})")
    try:
        return npz[name]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as err:
        raise TraceError(f"{name}: unreadable array in {str(path)!r} ({err})") from None


def _scalar_int(arr: np.ndarray, name: str, path: Path) -> int:
    if arr.shape != () or not np.issubdtype(arr.dtype, np.integer):
        raise TraceError(
            f"{name}: expected an integer scalar in {str(path)!r}, "
            f"got shape {arr.shape} dtype {arr.dtype}"
        )
    return int(arr)


def load(path: str | os.PathLike) -> tuple[Trace, dict]:
    """Read and validate a trace written by `save`; returns (trace, meta).

    Raises TraceError naming the field on a missing or non-npz file, a schema version other
    than `SCHEMA_VERSION`, a missing array, a wrong shape or dtype, ids out of range,
    non-finite weights, or counts that disagree with the per-token ids.
    """
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"path: no such file {str(path)!r}")
    try:
        npz = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise TraceError(f"path: {str(path)!r} is not a readable .npz trace ({err})") from None
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise TraceError(f"path: {str(path)!r} is a single .npy array, not a .npz trace")
    with npz:
        version = _scalar_int(_read(npz, "schema_version", path), "schema_version", path)
        if version != SCHEMA_VERSION:
            raise TraceError(
                f"schema_version: found {version} in {str(path)!r}, supported: {SCHEMA_VERSION}"
            )
        num_experts = _scalar_int(_read(npz, "num_experts", path), "num_experts", path)
        top_k = _scalar_int(_read(npz, "top_k", path), "top_k", path)
        raw = {name: _read(npz, name, path) for name in LEAVES}
        meta_arr = _read(npz, "meta", path)
    if meta_arr.shape != () or meta_arr.dtype.kind != "U":
        raise TraceError(f"meta: expected a JSON string, got dtype {meta_arr.dtype}")
    try:
        meta = json.loads(str(meta_arr))
    except json.JSONDecodeError as err:
        raise TraceError(f"meta: not valid JSON ({err})") from None
    for name, (kinds, _, what) in _KINDS.items():
        if raw[name].dtype.kind not in kinds:
            raise TraceError(f"{name}: dtype must be {what}, got {raw[name].dtype}")
    for name in ("expert_ids", "token_request"):
        a = raw[name]
        if a.size and (a.min() < np.iinfo(np.int32).min or a.max() > np.iinfo(np.int32).max):
            raise TraceError(f"{name}: values outside the int32 range")
    trace = Trace(
        **{name: jnp.asarray(raw[name], _KINDS[name][1]) for name in LEAVES},
        num_experts=num_experts,
        top_k=top_k,
    )
    validate(trace)
    _check_counts(trace)
    return trace, meta


def load_meta(path: str | os.PathLike) -> dict:
    """The meta of a trace file without loading its arrays (what a summary records of it)."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"path: no such file {str(path)!r}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arr = _read(npz, "meta", path)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise TraceError(f"path: {str(path)!r} is not a readable .npz trace ({err})") from None
    try:
        meta = json.loads(str(arr))
    except json.JSONDecodeError as err:
        raise TraceError(f"meta: not valid JSON ({err})") from None
    return meta if isinstance(meta, dict) else {}


def _check_counts(trace: Trace) -> None:
    """Counts of a token-level trace must equal the counts of its real tokens' ids."""
    if not trace.has_tokens:
        return
    mask = np.asarray(trace.token_mask)[..., None, :, None]
    ids = np.where(mask, np.asarray(trace.expert_ids), -1)
    expected = np.asarray(counts_from_ids(jnp.asarray(ids), trace.num_experts))
    if not np.array_equal(expected, np.asarray(trace.counts)):
        raise TraceError("counts: do not match the expert_ids of the real (masked-in) tokens")
