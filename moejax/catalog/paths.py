"""Where the TOML catalogs live: a checkout, an installed wheel, and user folders.

Search order for a catalog `kind` ("hardware", "models" or "policies"): folders in the
environment variable `MOEJAX_HARDWARE_PATH` / `MOEJAX_MODELS_PATH` / `MOEJAX_POLICIES_PATH`
(os.pathsep separated), then the checkout's top-level folder, then the copy packed into the
wheel (`moejax/_catalog/`). A name that ends in `.toml` or contains a path separator is read
as a file path.
"""

from __future__ import annotations

import os
from pathlib import Path

from moejax.errors import UnknownNameError

_PACKAGE = Path(__file__).resolve().parent.parent  # the `moejax` package folder
KINDS = ("hardware", "models", "policies")


def catalog_dirs(kind: str) -> list[Path]:
    """Folders searched for `kind`, first match wins."""
    env = os.environ.get(f"MOEJAX_{kind.upper()}_PATH", "")
    dirs = [Path(p) for p in env.split(os.pathsep) if p]
    dirs += [_PACKAGE.parent / kind, _PACKAGE / "_catalog" / kind]
    return [d for d in dirs if d.is_dir()]


def catalog_files(kind: str) -> dict[str, Path]:
    """Every `name -> file` of a catalog, earlier folders shadowing later ones."""
    found: dict[str, Path] = {}
    for d in reversed(catalog_dirs(kind)):
        for f in sorted(d.glob("*.toml")):
            found[f.stem] = f
    return dict(sorted(found.items()))


def resolve(kind: str, name: str) -> Path:
    """The file for a catalog name (or a path given directly)."""
    what = {"policies": "policy", "models": "model"}.get(kind, kind)  # "unknown policy 'x'"
    if name.endswith(".toml") or os.sep in name:
        p = Path(name)
        if not p.is_file():
            raise UnknownNameError(f"{what} file", name, catalog_files(kind))
        return p
    files = catalog_files(kind)
    if name not in files:
        raise UnknownNameError(what, name, files)
    return files[name]
