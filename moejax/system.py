"""What a system is and what it offers: `System` (pure `init` / `step` / `finish` functions,
STYLE.md rule 1), `SystemEntry` (its line in the registry `moejax.systems.SYSTEMS`), and
`Tuning` / `TuneSetup` (what `moejax tune` may change in it).

Systems build a `System` from their static config; the runner (`moejax.runner.engine`)
applies `jit`, `vmap` and `lax.scan` to it. This module imports nothing of moejax, so every
system can import it without reaching the runner or the tuner.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any

# The name of the batch axis (traces or request streams) when the runner vmaps `init` / `step`
# over a batch it runs until done: a step may reduce over it (`jax.lax.pmax(x, BATCH_AXIS)`)
# so that a loop predicate is the same for every member of the batch (the loop then runs as
# one loop under vmap instead of selecting every carried array per iteration).
BATCH_AXIS = "batch"


@dataclasses.dataclass(frozen=True)
class System:
    """A simulated system as pure functions of (params, state, trace).

    init(params, trace, key) -> state
    step(params, state, x) -> (state, out)           x: this step's input (see `inputs`)
    finish(params, state, outs) -> metrics           outs: `out` stacked over steps
    is_done(state) -> bool scalar, or None           steps after done leave the state as is
    num_steps: static scan length (an upper bound on the events or iterations to simulate);
      with `is_done`, the steps of one segment: the runner runs segments until every member
      of the batch is done (the count need not be known up front) and `finish` gets
      `outs = None`
    inputs(trace) -> xs, or None: a pytree whose leaves have a leading `[num_steps]` axis;
      the runner's scan hands step `t` the slice `xs[t]` (a trace system gets its step's
      routing this way instead of keeping the whole trace in its State). None: `x` is the
      int32 step index `t`.
    """

    name: str
    init: Callable[[PyTree, PyTree, jax.Array], PyTree]
    step: Callable[[PyTree, PyTree, jax.Array], tuple[PyTree, PyTree]]
    finish: Callable[[PyTree, PyTree, PyTree], PyTree]
    num_steps: int
    is_done: Callable[[PyTree], jax.Array] | None = None
    # Traces per compiled call on an accelerator where `DEFAULT_CHUNK_ACCELERATOR` does not
    # suit the system (None: the default); the user's `chunk_size` still wins.
    accelerator_chunk: int | None = None
    inputs: Callable[[PyTree], PyTree] | None = None


INPUT_KINDS = ("traces", "streams")


@dataclasses.dataclass(frozen=True)
class Tuning:
    """What `moejax tune --system NAME` may tune in a system (`moejax.tune`).

    params: the tunable families by name (`--param`); help: how `moejax tune --help` lists
    them (default: the names). setup(platform, model, policy, num_iterations, names,
    capacity, **extra) -> `TuneSetup`, or None for a system tuned by Gaussian smoothing of
    a discrete-event run (`smoothed`, `moejax.tune.smoothed`). extra holds `num_layers` when
    `per_layer` (one placement per trace layer, `--per-layer`), `budget` when `budget` (the
    000 Eq. (1)-(2) hardware budget, `--budget`), and `simulate` (the runner's
    `engine.simulate`) when `simulates`: baselines that need a hard run get the runner from
    the tuner, since a system never imports it.
    """

    params: tuple[str, ...]
    setup: Callable | None
    help: str = ""
    per_layer: bool = False
    budget: bool = False
    simulates: bool = False
    smoothed: bool = False


@dataclasses.dataclass(frozen=True)
class SystemEntry:
    """A system's one line in the registry (`moejax.systems.SYSTEMS`): everything the CLI,
    the API, sweeps, tuning and the help text need to reach it.

    name: the policy `system` key. description: one line for the help text.
    from_policy(platform, model, options, num_steps) -> (System, params): options is the
      policy's [options] Table; num_steps: iterations of a trace (input_kind "traces") or
      requests per stream ("streams").
    check_options(options) -> None: validate a policy's [options] (raise ConfigError).
    platforms: the platform families it runs on (`Platform.family`).
    input_kind: "traces" (routing traces, `moejax.trace`) or "streams" (Poisson request
      streams, `moejax.trace.requests.request_stream`). needs_tokens: False if it runs on
      counts-only traces (per-expert counts, no per-token choices).
    tuning: what `moejax tune` may change (None: not tunable).
    study: the `moejax reproduce` study that reproduces its paper (None: none).
    default_policy: the catalog policy `moejax tune --system NAME` starts from.
    """

    name: str
    description: str
    from_policy: Callable
    check_options: Callable
    platforms: tuple[str, ...]
    input_kind: str = "traces"
    needs_tokens: bool = False
    tuning: Tuning | None = None
    study: str | None = None
    default_policy: str = ""

    def __post_init__(self):
        if self.input_kind not in INPUT_KINDS:
            raise ValueError(f"SystemEntry {self.name!r}: input_kind = {self.input_kind!r}; "
                             f"allowed: {', '.join(INPUT_KINDS)}")


@dataclasses.dataclass(frozen=True, eq=False)
class TuneSetup:
    """One system ready to tune.

    families: name -> family (`moejax.tunable`).
    apply(base, values, tau) -> params: `values` name -> array (relaxed, or `as_value` of
      a hard value); tau: the system's relaxation temperature (0 = hard mode).
    defaults: name -> hard value of the base policy (the paper's default).
    baselines(load_e) -> {heuristic name: {name: hard value}}; load_e [E] expected tokens.
    options(hard) -> policy [options] overrides for `export`.
    expected(values, traces, tau) -> per-trace latency_s [T], or None: the system's
      latency with placements read as distributions (expected per-device work), equal to
      the system's own latency in hard mode for one-hot placements (see `_ep_expected`).
    constraint: a joint constraint over several families, or None: `penalty(values, tau)`
      added to the loss, `project(hard) -> hard` applied when rounding, `report(hard)` in
      summaries (`moejax.systems.fsedp.budget.BudgetConstraint`, 000 Eq. (1)-(2)).
    platform_values(hard) -> {"ddr_Bps": .., "link_Bps": ..} (None: kept) of a derived
      platform, or None when the policy alone carries the tuned values (hardware knobs a
      policy has no key for; `moejax.tune.export` writes the platform TOML).
    family_tau_field: a params field that takes the family temperature while tuning (the
      wafer Eq. 2 gate, `tau_trigger`), when the system's `tau` is the system temperature.
    """

    system: System
    base: object
    families: dict
    apply: Callable
    defaults: dict
    baselines: Callable
    options: Callable
    expected: Callable | None = None
    constraint: object | None = None
    platform_values: Callable | None = None
    family_tau_field: str | None = None
    # a structural integer knob (the wafer shadow-slot count): its name and one (System,
    # base params) per integer value lo..hi of its family, built separately
    structural: str | None = None
    variants: tuple = ()
    # baselines take per-layer loads [L, E] (placements with a layer axis) instead of [E]
    layer_loads: bool = False

    def system_for(self, hard: dict):
        """(System, base params) that evaluate hard values (the variant of a structural
        knob's value, else the setup's own)."""
        if self.structural is None or self.structural not in hard:
            return self.system, self.base
        f = self.families[self.structural]
        return self.variants[int(hard[self.structural]) - f.lo]

    def as_values(self, hard: dict) -> dict:
        """Hard values as the arrays `apply` takes."""
        out = {}
        for k, v in hard.items():
            f = self.families[k]
            out[k] = f.as_value(v) if hasattr(f, "as_value") else jnp.float32(v)
        return out

    def feasible_grid(self, grid: dict) -> dict:
        """The rows of a baseline grid that satisfy `constraint` (all without one)."""
        if self.constraint is None:
            return grid
        return {k: v for k, v in grid.items() if self.constraint.feasible(v)}
