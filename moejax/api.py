"""The Python API in one call: platform + model + policy + traces -> per-trace metrics."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from moejax.catalog.hardware import Platform, load_platform
from moejax.catalog.models import ModelSpec, load_model
from moejax.catalog.policies import Policy, load_policy
from moejax.errors import ConfigError, TraceError
from moejax.runner import budget, engine
from moejax.systems import SYSTEMS
from moejax.trace import Trace


@dataclasses.dataclass(frozen=True)
class Setup:
    platform: Platform
    model: ModelSpec
    policy: Policy


def resolve(hardware: str | Platform, model: str | ModelSpec, policy: str | Policy) -> Setup:
    """Look names up in the catalogs (objects pass through) and check they fit together."""
    p = load_platform(hardware) if isinstance(hardware, str) else hardware
    m = load_model(model) if isinstance(model, str) else model
    pol = load_policy(policy) if isinstance(policy, str) else policy
    entry = SYSTEMS[pol.system]
    if p.family not in entry.families:
        raise ConfigError(
            f"policy {pol.name!r} (system {pol.system}) runs on {', '.join(entry.families)} "
            f"platforms; {p.name} is a {p.family} platform"
        )
    return Setup(p, m, pol)


def check_trace_fits(trace: Trace, model: ModelSpec, needs_tokens: bool, system: str) -> None:
    """The trace's expert count and top-k must be the model's."""
    if trace.num_experts != model.num_experts or trace.top_k != model.top_k:
        raise TraceError(
            f"trace has num_experts={trace.num_experts}, top_k={trace.top_k} but model "
            f"{model.name} has num_experts={model.num_experts}, top_k={model.top_k}"
        )
    if needs_tokens and not trace.has_tokens:
        raise TraceError(
            f"system {system!r} needs per-token routing; this trace is counts-only"
        )


def simulate(hardware, model, policy, traces: Trace, *, key=None, chunk_size=None,
             progress=None) -> dict[str, np.ndarray]:
    """Simulate a batch of traces ([T] leading axis) and return per-trace metrics as NumPy."""
    s = resolve(hardware, model, policy)
    entry = SYSTEMS[s.policy.system]
    check_trace_fits(traces, s.model, entry.needs_tokens, s.policy.system)
    system, params = entry.from_policy(
        s.platform, s.model, s.policy.options_table(), traces.num_iterations
    )
    chunk_size = budget.check(system, params, traces, chunk_size)  # fits, or one line
    out = engine.simulate(system, params, traces, key, chunk_size=chunk_size, progress=progress)
    return jax.tree_util.tree_map(np.asarray, out)
