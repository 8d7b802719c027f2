"""Layer 3: one module per system; `SYSTEMS` maps a policy's `system` key to its adapter."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from moejax.systems import ep, rebalancing
from moejax.systems.amoe import policy as amoe_policy
from moejax.systems.dysharp import system as dysharp
from moejax.systems.epsmoe import system as epsmoe_system
from moejax.systems.fsedp import hydra as fsedp_hydra
from moejax.systems.fsedp import system as fsedp_system
from moejax.systems.wafer import system as wafer


@dataclasses.dataclass(frozen=True)
class SystemEntry:
    """How the policy catalog and the CLI reach a system module.

    check_options(table): validate a policy's [options] (raise ConfigError).
    from_policy(platform, model, table, num_iterations) -> (System, params).
    families: platform families it runs on. needs_tokens: False if it runs on counts-only
    traces (per-expert counts, no per-token choices). input_kind: what it simulates,
    "traces" (routing traces; from_policy's 4th argument is iterations per trace) or
    "streams" (Poisson request streams, `moejax.systems.amoe.serve`; the 4th argument is
    requests per stream); the CLI, sweep and tune choose their inputs by it.
    """

    check_options: Callable
    from_policy: Callable
    families: tuple[str, ...]
    needs_tokens: bool
    input_kind: str = "traces"


SYSTEMS: dict[str, SystemEntry] = {
    "ep": SystemEntry(ep.check_options, ep.from_policy, ("chiplet", "wafer", "gpu"), False),
    # synchronous EP that re-plans with EPLB every R iterations (moejax.systems.rebalancing)
    "rebalancing": SystemEntry(rebalancing.check_options, rebalancing.from_policy,
                               ("gpu", "chiplet", "wafer"), False),
    "wafer": SystemEntry(wafer.check_options, wafer.from_policy, ("wafer", "gpu"), False),
    # 002 AMoE: run on request streams (4th from_policy argument = requests per stream)
    "aep": SystemEntry(amoe_policy.check_aep_options, amoe_policy.aep_from_policy,
                       ("gpu", "chiplet", "wafer"), False, "streams"),
    "ep_serving": SystemEntry(amoe_policy.check_sync_options, amoe_policy.sync_from_policy,
                              ("gpu", "chiplet", "wafer"), False, "streams"),
    # 000 FSE-DP and its Hydra baseline (chiplet packages)
    "fsedp": SystemEntry(fsedp_system.check_options, fsedp_system.from_policy, ("chiplet",),
                         False),
    "hydra": SystemEntry(fsedp_hydra.check_options, fsedp_hydra.from_policy, ("chiplet",),
                         False),
    # 004 DySHARP and its NVLink-switch baselines (DeepEP, NVLS, FasterMoE, Tutel, CCFuser,
    # COMET, DualPipe): per-token routing, switch platforms
    "dysharp": SystemEntry(dysharp.check_options, dysharp.from_policy, ("gpu",), True),
    # 003 EPS-MoE and its TP+TP / DP+EP / TP+EP baselines (one prefill forward, GPU nodes)
    "epsmoe": SystemEntry(epsmoe_system.check_options, epsmoe_system.from_policy, ("gpu",),
                          True),
}
