"""Named policies (`policies/*.toml`): a mechanism (system) plus parameter values.

A policy file has `system`, `description`, `source` and an `[options]` table whose keys
the named system validates (unknown keys are errors naming the file).
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
    from moejax.systems import SYSTEMS

    t = Table(read_toml(path), str(path))
    system = t.str("system", choices=sorted(SYSTEMS))
    desc = t.str("description")
    source = t.str("source")
    opts = t.table("options", required=False)
    t.close()
    options = tuple(sorted((opts.data if opts else {}).items()))
    policy = Policy(path.stem, system, desc, source, options, str(path))
    SYSTEMS[system].check_options(policy.options_table())  # fail at load, not at run
    return policy


def load_policy(name: str) -> Policy:
    """A policy by catalog name (`ep`) or by path to a TOML file."""
    return _load_file(catalog.resolve("policies", name).resolve())


def policy_names() -> list[str]:
    return list(catalog.catalog_files("policies"))
