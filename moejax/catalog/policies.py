"""Named policies (`policies/*.toml`): a mechanism (system) plus parameter values.

A policy file has `system`, `description`, `source` and an `[options]` table. This layer
reads the file; the registry checks that `system` names a registered system and that the
system accepts the options (`moejax.systems.checked_policy`, which `moejax.api.resolve`
calls), since the catalogs sit below the systems.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

from moejax.catalog import paths as catalog
from moejax.catalog.schema import Table, read_toml


@dataclasses.dataclass(frozen=True)
class Policy:
    name: str
    system: str
    description: str
    source: str
    options: tuple[tuple[str, Any], ...]
    path: str

    def options_table(self) -> Table:
        """The options as a Table, for the system to consume key by key."""
        return Table(dict(self.options), f"{self.path} [options]")


@functools.cache
def _load_file(path: Path) -> Policy:
    t = Table(read_toml(path), str(path))
    system = t.str("system")
    desc = t.str("description")
    source = t.str("source")
    opts = t.table("options", required=False)
    t.close()
    options = tuple(sorted((opts.data if opts else {}).items()))
    return Policy(path.stem, system, desc, source, options, str(path))


def load_policy(name: str) -> Policy:
    """A policy by catalog name (`ep`) or by path to a TOML file (its options unchecked:
    `moejax.systems.checked_policy` checks them against the system)."""
    return _load_file(catalog.resolve("policies", name).resolve())


def policy_names() -> list[str]:
    return list(catalog.catalog_files("policies"))
