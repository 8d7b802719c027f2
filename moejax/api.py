"""The Python API in one call: platform + model + policy + traces -> per-trace metrics.

`resolve` (names -> a checked `Setup`) and `check_trace_fits` come from the registry
(`moejax.systems`), where policies meet systems.
"""

from __future__ import annotations

import jax
import numpy as np

from moejax.runner import budget, engine, programs
from moejax.runner.programs import quick_compile, report_compiles
from moejax.systems import SYSTEMS, Setup, check_trace_fits, resolve
from moejax.trace import Trace

__all__ = ["Setup", "check_trace_fits", "quick_compile", "report_compiles", "resolve",
           "simulate", "use_compilation_cache"]


def use_compilation_cache(path: str | None = None) -> str | None:
    """Keep compiled programs on disk between Python sessions (JAX's persistent compilation
    cache), as the CLI does: in `path`, else $MOEJAX_COMPILATION_CACHE, else
    ~/.cache/moejax/jax ("off": not at all). Call it before the first simulation. Returns
    the folder in use, or None."""
    return programs.enable_persistent_cache(programs.cache_setting(path))


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
