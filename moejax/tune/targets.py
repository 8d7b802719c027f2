"""What each system exposes to tuning, read from the registry (`moejax.systems.SYSTEMS`).

A system's `SystemEntry.tuning` (`moejax.system.Tuning`) names its tunable families and
builds, from a platform, a model and a base policy, a `moejax.system.TuneSetup`: the
system, its base params, the families by name, how values enter the params at a
temperature, the paper's defaults, baseline heuristics and the export options. The setups
live beside their systems (`moejax.systems.ep_tuning`, `fsedp.tuning`, `wafer.tuning`,
`epsmoe.tuning`, `dysharp.tuning`); systems without a `tuning` cannot be tuned yet.
"""

from __future__ import annotations

from moejax import systems
from moejax.errors import ConfigError, UnknownNameError
from moejax.runner import engine
from moejax.system import TuneSetup, Tuning


def tunable() -> dict[str, Tuning]:
    """name -> Tuning of every system tuned by gradient (a `TuneSetup`), registry order."""
    return {name: e.tuning for name, e in systems.SYSTEMS.items()
            if e.tuning is not None and e.tuning.setup is not None}


def tuning_of(system: str) -> Tuning:
    """The Tuning of a tunable system (gradient or smoothing); errors list the known ones."""
    entry = systems.SYSTEMS.get(system)
    if entry is None or entry.tuning is None:
        raise UnknownNameError("tunable system", system, tunable())
    return entry.tuning


def default_policy(system: str) -> str:
    """The base policy of `moejax tune --system SYSTEM` when no --policy is given."""
    return systems.entry(system).default_policy


def build_setup(policy, platform, model, num_iterations: int, names, capacity: int = 0,
                budget=None, num_layers: int = 0) -> TuneSetup:
    """The TuneSetup of `policy`'s system; errors name unknown systems or parameters.
    `budget`: a `moejax.systems.fsedp.budget.ChipletBudget` for the systems whose Tuning
    takes one (fsedp's hardware params; None: default). `num_layers` > 0: one placement per
    trace layer (systems whose Tuning is `per_layer`)."""
    targets = tunable()
    if policy.system not in targets:
        raise UnknownNameError("tunable system", policy.system, targets)
    system, target = policy.system, targets[policy.system]
    names = tuple(names)
    if not names:
        raise ConfigError(f"param: give at least one; allowed for {system}: "
                          f"{', '.join(target.params)}")
    for n in names:
        if n not in target.params:
            raise UnknownNameError(f"{system} parameter", n, target.params)
    extra = {"simulate": engine.simulate} if target.simulates else {}
    if num_layers:
        if not target.per_layer:
            takes = [k for k, t in targets.items() if t.per_layer]
            raise ConfigError(f"per-layer placements: {' and '.join(takes)} only, not "
                              f"{system}")
        extra["num_layers"] = num_layers
    elif budget is not None:
        if not target.budget:
            takes = [k for k, t in targets.items() if t.budget]
            raise ConfigError(f"budget: only the {', '.join(takes)} hardware params take one, "
                              f"not {system}")
        extra["budget"] = budget
    return target.setup(platform, model, policy, num_iterations, names, capacity, **extra)
