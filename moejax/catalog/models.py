"""The model catalog: one `models/*.toml` file per model, plus Hugging Face config.json files.

Catalog files live beside `hardware/` (a checkout's `models/`, the wheel's copy, or folders in
`MOEJAX_MODELS_PATH`); each key cites the paper table or public config it comes from. A name
that ends in `.json` is read as a Hugging Face config.json (`hf_config`), one that ends in
`.toml` or contains a path separator as a catalog file. `ModelSpec` documents the fields.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from moejax.catalog import paths as catalog
from moejax.catalog.hf_config import read_hf_config
from moejax.catalog.modelspec import ATTENTION_KINDS, ModelSpec, load_model_file, validate_model

__all__ = ["ATTENTION_KINDS", "MODELS", "ModelSpec", "load_model", "model_names",
           "validate_model", "with_overrides"]


@functools.cache
def _load(path: Path) -> ModelSpec:
    return load_model_file(path)


def load_model(name: str) -> ModelSpec:
    """A model spec by catalog name, by path to a `models/*.toml` file, or by path to a
    Hugging Face config.json."""
    if name.endswith(".json"):
        return read_hf_config(name)
    return _load(catalog.resolve("models", name).resolve())


# The catalog as a mapping, read once at import (later drop-ins are found by `load_model`).
MODELS: dict[str, ModelSpec] = {
    name: _load(path.resolve()) for name, path in catalog.catalog_files("models").items()
}


def model_names() -> list[str]:
    """Every model name in the catalog."""
    return list(catalog.catalog_files("models"))


def with_overrides(m: ModelSpec, **changes) -> ModelSpec:
    """A validated copy of `m` with some fields changed (e.g. top_k for a sweep)."""
    return dataclasses.replace(m, **changes)
