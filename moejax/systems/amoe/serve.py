"""Serving runs by name: platform + model + AEP / sync-EP policy + Poisson request streams.

Used by the CLI (`moejax simulate --policy aep-defrag --rate 100 --workload medium`), the
sweep, the reproduce studies, tuning and the experiments; the engine runs what `build`
returns (`moejax.runner.engine.simulate`).
"""

from __future__ import annotations

import dataclasses

import jax

from moejax.catalog.hardware import Platform, load_platform
from moejax.catalog.models import load_model
from moejax.catalog.policies import load_policy
from moejax.errors import UnknownNameError
from moejax.systems import SYSTEMS
from moejax.trace import requests


def platform(name: str | Platform) -> Platform:
    """A platform from the catalog (`hardware/`; 002's are a100x8-nvswitch, a100x8-40g and
    a100x16-2node)."""
    return name if isinstance(name, Platform) else load_platform(name)


def stream_systems() -> tuple[str, ...]:
    """The registry's systems that serve request streams (`SystemEntry.input_kind`)."""
    return tuple(k for k, e in SYSTEMS.items() if e.input_kind == "streams")


def streams(key, *, num_streams: int, num_requests: int, rate_per_s: float,
            workload: str = "medium"):
    """Poisson request streams of a 002 §5 workload (`trace.requests.request_stream`)."""
    return requests.request_stream(key, num_streams=num_streams, num_requests=num_requests,
                              rate_per_s=rate_per_s, workload=workload)


def stream_keys(seed: int):
    """(key of the arrivals, key of the routing) of a stream run with `seed`: the same for
    `moejax simulate` and every point of `moejax sweep`."""
    return jax.random.split(jax.random.key(seed))


def build(hardware, model, policy, num_requests: int, *, top_k: int | None = None,
          overrides: dict | None = None):
    """(System, params, Policy) of a stream-serving policy; `overrides` replace options."""
    p = platform(hardware)
    m = load_model(model) if isinstance(model, str) else model
    pol = load_policy(policy) if isinstance(policy, str) else policy
    if pol.system not in stream_systems():
        raise UnknownNameError("stream-serving policy system", pol.system, stream_systems())
    opts = dict(pol.options)
    if top_k:
        opts["top_k"] = int(top_k)
    opts.update(overrides or {})
    pol = dataclasses.replace(pol, options=tuple(sorted(opts.items())))
    system, params = SYSTEMS[pol.system].from_policy(p, m, pol.options_table(), num_requests)
    return system, params, pol
