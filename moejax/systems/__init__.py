"""Layer 3: the systems, and the registry `SYSTEMS` (a policy's `system` key -> its entry).

Each system package (or module) exports one `moejax.system.SystemEntry`; `ENTRIES` below is
the one list of them. Every other list of systems (the CLI's choices and help text, the
tunable systems, the serving systems, the studies) is derived from it, so a new system is
its package plus one line here (docs/architecture.md, "Add a system in 5 steps").
"""

from __future__ import annotations

import dataclasses

from moejax.catalog.hardware import Platform, load_platform
from moejax.catalog.models import ModelSpec, load_model
from moejax.catalog.policies import Policy, load_policy
from moejax.errors import ConfigError, TraceError, UnknownNameError
from moejax.system import SystemEntry
from moejax.systems import amoe, dysharp, ep_tuning, epsmoe, fsedp, rebalancing, wafer
from moejax.trace import Trace

ENTRIES: tuple[SystemEntry, ...] = (
    ep_tuning.ENTRY,
    fsedp.ENTRY,
    fsedp.HYDRA_ENTRY,
    wafer.ENTRY,
    amoe.ENTRY,
    amoe.SYNC_ENTRY,
    rebalancing.ENTRY,
    dysharp.ENTRY,
    epsmoe.ENTRY,
)

SYSTEMS: dict[str, SystemEntry] = {e.name: e for e in ENTRIES}


def entry(name: str) -> SystemEntry:
    """The entry of system `name`; an error lists the known ones."""
    if name not in SYSTEMS:
        raise UnknownNameError("system", name, SYSTEMS)
    return SYSTEMS[name]


def names(input_kind: str | None = None) -> list[str]:
    """System names in registry order, those taking `input_kind` ("traces" | "streams") if
    given."""
    return [k for k, e in SYSTEMS.items() if input_kind in (None, e.input_kind)]


# studies that compare methods across several systems rather than reproduce one paper
CROSS_STUDIES = ("tuning",)


def studies() -> list[str]:
    """The `moejax reproduce` studies of the registered systems, in registry order, then
    the cross-system ones (`CROSS_STUDIES`)."""
    return list(dict.fromkeys([*(e.study for e in SYSTEMS.values() if e.study),
                               *CROSS_STUDIES]))


def checked_policy(policy: str | Policy) -> Policy:
    """A policy (catalog name, TOML path, or a loaded `Policy`) whose `system` is registered
    and whose [options] that system accepts; errors name the file and key."""
    pol = load_policy(policy) if isinstance(policy, str) else policy
    if pol.system not in SYSTEMS:
        raise ConfigError(f"{pol.path}: key 'system' = {pol.system!r} is not allowed; "
                          f"allowed: {', '.join(sorted(SYSTEMS))}")
    SYSTEMS[pol.system].check_options(pol.options_table())
    return pol


@dataclasses.dataclass(frozen=True)
class Setup:
    platform: Platform
    model: ModelSpec
    policy: Policy


def resolve(hardware: str | Platform, model: str | ModelSpec, policy: str | Policy) -> Setup:
    """Look names up in the catalogs (objects pass through) and check they fit together:
    the policy's system is registered, takes its options and runs on the platform."""
    p = load_platform(hardware) if isinstance(hardware, str) else hardware
    m = load_model(model) if isinstance(model, str) else model
    pol = checked_policy(policy)
    e = SYSTEMS[pol.system]
    if p.family not in e.platforms:
        raise ConfigError(
            f"policy {pol.name!r} (system {pol.system}) runs on {', '.join(e.platforms)} "
            f"platforms; {p.name} is a {p.family} platform"
        )
    return Setup(p, m, pol)


def check_trace_fits(trace: Trace, model: ModelSpec, needs_tokens: bool, system: str) -> None:
    """The trace's expert count and top-k must be the model's, and its layers (a sample of
    the model's MoE layers) at most the model's MoE layers."""
    if trace.num_experts != model.num_experts or trace.top_k != model.top_k:
        raise TraceError(
            f"trace has num_experts={trace.num_experts}, top_k={trace.top_k} but model "
            f"{model.name} has num_experts={model.num_experts}, top_k={model.top_k}"
        )
    if trace.num_layers > model.num_sparse_layers:
        raise TraceError(
            f"layers: the trace has {trace.num_layers} MoE layers but model {model.name} has "
            f"{model.num_sparse_layers}; allowed: 1 .. {model.num_sparse_layers} (--layers)"
        )
    if needs_tokens and not trace.has_tokens:
        raise TraceError(
            f"system {system!r} needs per-token routing; this trace is counts-only"
        )
