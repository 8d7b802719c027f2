"""Layer 3: one module per system; `SYSTEMS` maps a policy's `system` key to its adapter."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from moejax.systems import ep


@dataclasses.dataclass(frozen=True)
class SystemEntry:
    """How the policy catalog and the CLI reach a system module.

    check_options(table): validate a policy's [options] (raise ConfigError).
    from_policy(platform, model, table, num_iterations) -> (System, params).
    families: platform families it runs on. needs_tokens: False if it runs on counts-only
    traces (per-expert counts, no per-token choices).
    """

    check_options: Callable
    from_policy: Callable
    families: tuple[str, ...]
    needs_tokens: bool


SYSTEMS: dict[str, SystemEntry] = {
    "ep": SystemEntry(ep.check_options, ep.from_policy, ("chiplet", "wafer", "gpu"), False),
}
