"""Synthetic request streams (002 §5): Poisson arrivals and uniform input / output lengths,
given directly or by a named decoding workload (`WORKLOADS`)."""

from __future__ import annotations

import functools
import math
import numbers

import jax
import jax.numpy as jnp

from moejax.errors import ConfigError, UnknownNameError
from moejax.trace.checks import check_int, check_key
from moejax.trace.core import RequestStream

# 002 §5: input / output length ranges (inclusive, tokens) of the three decoding workloads.
WORKLOADS: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "short": ((30, 70), (70, 130)),
    "medium": ((50, 150), (50, 250)),
    "reasonable": ((100, 300), (100, 500)),
}


def workload_ranges(name: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """(input_range, output_range) of a named 002 §5 workload."""
    if name not in WORKLOADS:
        raise UnknownNameError("workload", name, WORKLOADS)
    return WORKLOADS[name]


def _check_range(name: str, r) -> tuple[int, int]:
    try:
        lo, hi = r
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: expected (min, max) tokens, got {r!r}") from None
    lo, hi = check_int(f"{name}[0]", lo), check_int(f"{name}[1]", hi)
    if hi < lo:
        raise ConfigError(f"{name}: max {hi} is smaller than min {lo}")
    return lo, hi


@functools.partial(jax.jit, static_argnums=(1, 3, 4))
def _streams(keys, num_requests, rate_per_s, input_range, output_range):
    def one(key):
        k_gap, k_in, k_out = jax.random.split(key, 3)
        gaps = jax.random.exponential(k_gap, (num_requests,), jnp.float32) / rate_per_s
        lo_i, hi_i = input_range
        lo_o, hi_o = output_range
        return RequestStream(
            arrival_s=jnp.cumsum(gaps),
            input_len=jax.random.randint(k_in, (num_requests,), lo_i, hi_i + 1, jnp.int32),
            output_len=jax.random.randint(k_out, (num_requests,), lo_o, hi_o + 1, jnp.int32),
            mask=jnp.ones((num_requests,), bool),
        )

    return jax.vmap(one)(keys)


def request_stream(
    key,
    *,
    num_streams: int,
    num_requests: int,
    rate_per_s: float,
    input_range=None,
    output_range=None,
    workload: str | None = None,
) -> RequestStream:
    """`num_streams` request streams of `num_requests` each, leaves with a leading `[T]` axis.

    002 §5: Poisson arrivals at `rate_per_s` (exponential inter-arrival times, first request
    one gap after t = 0) and input / output lengths uniform over the inclusive integer
    ranges, given directly or by `workload` name (`WORKLOADS`: short, medium, reasonable).
    """
    key = check_key(key)
    num_streams = check_int("num_streams", num_streams)
    num_requests = check_int("num_requests", num_requests)
    if (
        isinstance(rate_per_s, bool)
        or not isinstance(rate_per_s, numbers.Real)
        or not (math.isfinite(rate_per_s) and rate_per_s > 0)
    ):
        raise ConfigError(f"rate_per_s: expected a finite number > 0, got {rate_per_s!r}")
    if workload is not None:
        if input_range is not None or output_range is not None:
            raise ConfigError("workload: give either a workload name or the two ranges")
        input_range, output_range = workload_ranges(workload)
    if input_range is None or output_range is None:
        raise ConfigError(
            "input_range / output_range: both required unless workload is given "
            f"(workloads: {', '.join(WORKLOADS)})"
        )
    input_range = _check_range("input_range", input_range)
    output_range = _check_range("output_range", output_range)
    keys = jax.random.split(key, num_streams)
    return _streams(keys, num_requests, jnp.float32(rate_per_s), input_range, output_range)
