"""Keyed, vectorized generators of synthetic routing traces.

A generator is a `GenSpec` (a family name and its parameters, parsed from strings such as
`powerlaw:alpha=1.5`) plus a `jax.random` key. Each family defines an expert popularity
`p[I, L, E]` (probability that one token's router prefers each expert); `generate` then
samples every token's top-k experts from it, without replacement, by the Gumbel-top-k trick.

The families, their parameters and the paper each follows are in `moejax.trace.families`;
request streams (002 §5) in `moejax.trace.requests`.

String form: `family` or `family:name=value,name=value`; list values (`switches`) are
separated by `/`, e.g. `drift:rho=0.9,switches=40/80`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from moejax.errors import ConfigError, UnknownNameError
from moejax.trace.checks import (
    check_int,
    check_key,
    check_shape_args,
    check_tokens_per_iteration,
)
from moejax.trace.chunked import ChunkedTraces, key_data_of
from moejax.trace.core import Trace, counts_from_ids
from moejax.trace.families import FAMILIES, ParamSpec, draw, log_popularity, scenario_index

# ----------------------------------------------------------------------------- specs


def _coerce(family: str, name: str, p: ParamSpec, value) -> Any:
    """Convert a parameter value (string or number) to its kind; ConfigError if impossible."""
    where = f"{family}:{name}"
    try:
        if p.kind == "float":
            if isinstance(value, bool):
                raise ValueError
            v = float(value)
            if not math.isfinite(v):
                raise ValueError
        elif p.kind == "int":
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, str):
                v = int(value.strip())
            elif isinstance(value, numbers.Integral):
                v = int(value)
            elif isinstance(value, numbers.Real) and float(value).is_integer():
                v = int(value)
            else:
                raise ValueError
        else:
            if isinstance(value, str):
                items = [s for s in value.strip().split("/") if s.strip()]
                v = tuple(int(s.strip()) for s in items)
            else:
                v = tuple(int(x) for x in value)
                if any(int(x) != x for x in value):
                    raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(
            f"{where}: cannot read {value!r} as {p.kind}; allowed: {p.allowed}"
        ) from None
    if not p.check(v):
        raise ConfigError(f"{where}: got {value!r}; allowed: {p.allowed}")
    return v


@dataclasses.dataclass(frozen=True)
class GenSpec:
    """A trace generator: `family` plus its parameters (defaults filled in, validated).

    `params` may be given as a mapping or as (name, value) pairs; it is stored as a tuple of
    pairs in the family's parameter order, so a GenSpec is hashable (usable as a static jit
    argument) and `parse_spec(spec_to_str(s)) == s`.
    """

    family: str
    params: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise UnknownNameError("generator family", str(self.family), FAMILIES)
        schema = FAMILIES[self.family]
        try:
            given = dict(self.params)
        except (TypeError, ValueError):
            raise ConfigError(
                f"{self.family}: params must be a mapping or (name, value) pairs, "
                f"got {self.params!r}"
            ) from None
        unknown = sorted(set(given) - set(schema))
        if unknown:
            allowed = ", ".join(schema) or "none"
            raise ConfigError(
                f"{self.family}: unknown parameter {unknown[0]!r}; allowed: {allowed}"
            )
        params = tuple(
            (name, _coerce(self.family, name, p, given[name]) if name in given else p.default)
            for name, p in schema.items()
        )
        object.__setattr__(self, "params", params)

    def __getitem__(self, name: str):
        return dict(self.params)[name]


def parse_spec(s: str | GenSpec) -> GenSpec:
    """Parse `family` or `family:name=value,...` into a GenSpec (ConfigError on bad input)."""
    if isinstance(s, GenSpec):
        return s
    if not isinstance(s, str) or not s.strip():
        raise ConfigError(
            f"generator spec: expected a string like 'powerlaw:alpha=1.5', got {s!r}; "
            f"families: {', '.join(FAMILIES)}"
        )
    family, _, rest = s.strip().partition(":")
    family = family.strip().lower()
    if family not in FAMILIES:
        raise UnknownNameError("generator family", family, FAMILIES)
    params: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq or not name or not value.strip():
            allowed = ", ".join(FAMILIES[family]) or "none"
            raise ConfigError(
                f"{family}: malformed parameter {item!r} in {s!r}; expected name=value "
                f"with name in: {allowed}"
            )
        if name in params:
            raise ConfigError(f"{family}:{name}: given twice in {s!r}")
        params[name] = value.strip()
    return GenSpec(family, params)


def spec_to_str(spec: GenSpec) -> str:
    """The string form of a spec, every parameter explicit (inverse of `parse_spec`)."""

    def fmt(v):
        if isinstance(v, tuple):
            return "/".join(str(x) for x in v)
        return repr(v) if isinstance(v, float) else str(v)

    schema = FAMILIES[spec.family]
    body = ",".join(f"{k}={fmt(v)}" for k, v in spec.params if v != () and (
        schema[k].shown_at_default or v != schema[k].default))
    return f"{spec.family}:{body}" if body else spec.family


def scenario_of_iteration(spec: GenSpec, iterations: int) -> np.ndarray:
    """Active scenario of each iteration of a `drift` spec, int [I].

    With `switches`, the scenario advances at each listed iteration; otherwise every
    `period` iterations. Scenarios cycle (001 §V-B: cyclically evolving scenario mixtures).
    """
    spec = parse_spec(spec)
    if spec.family != "drift":
        raise ConfigError(f"spec: scenarios exist only for the drift family, got {spec.family!r}")
    return scenario_index(dict(spec.params), check_int("iterations", iterations))


# ------------------------------------------------------------------------ generation


def popularity(
    spec: GenSpec | str, key, *, iterations: int, layers: int, num_experts: int
) -> jax.Array:
    """Expert popularity of one trace, float32 [I, L, E], each row summing to 1."""
    spec = parse_spec(spec)
    key = check_key(key)
    iterations = check_int("iterations", iterations)
    layers = check_int("layers", layers)
    num_experts = check_int("num_experts", num_experts)
    static, floats = split_spec(spec)
    return jnp.exp(_log_popularity_jit(static, floats, key, iterations, layers, num_experts))


def split_spec(spec: GenSpec):
    """(static part: family and integer params, hashable; float params as float32 arrays).

    Float parameters are traced, so sweeping alpha or std does not recompile.
    """
    kinds = FAMILIES[spec.family]
    static = (spec.family, tuple((k, v) for k, v in spec.params if kinds[k].kind != "float"))
    floats = {k: jnp.float32(v) for k, v in spec.params if kinds[k].kind == "float"}
    return static, floats


@functools.partial(jax.jit, static_argnums=(0, 3, 4, 5))
def _log_popularity_jit(static, floats, key, iterations, layers, num_experts):
    return log_popularity(static, floats, key, iterations, layers, num_experts)


def _sample_one(static, floats, key, tpi, iterations, layers, tokens, num_experts, top_k):
    """Leaves of one trace; tpi int32 [I]."""
    k_pop, k_tok = jax.random.split(key)
    log_p = log_popularity(static, floats, k_pop, iterations, layers, num_experts)
    gumbel = draw(jax.random.gumbel, k_tok, (iterations, layers, tokens, num_experts))
    scores, ids = jax.lax.top_k(log_p[:, :, None, :] + gumbel, top_k)  # [I, L, N, K]
    mask = jnp.arange(tokens)[None, :] < tpi[:, None]  # [I, N]
    m4 = mask[:, None, :, None]
    ids = jnp.where(m4, ids, -1).astype(jnp.int32)
    weights = jnp.where(m4, jax.nn.softmax(scores, axis=-1), 0.0)
    return (
        ids,
        weights,
        mask,
        jnp.full(mask.shape, -1, jnp.int32),
        counts_from_ids(ids, num_experts),
    )


@functools.partial(jax.jit, static_argnums=(0, 4, 5, 6, 7, 8))
def _sample_batch(static, floats, keys, tpi, iterations, layers, tokens, num_experts, top_k):
    one = functools.partial(
        _sample_one,
        static,
        floats,
        iterations=iterations,
        layers=layers,
        tokens=tokens,
        num_experts=num_experts,
        top_k=top_k,
    )
    return jax.vmap(one)(keys, tpi)


def generate(
    spec: GenSpec | str,
    key,
    *,
    num_traces: int,
    iterations: int,
    layers: int,
    tokens: int,
    num_experts: int,
    top_k: int,
    tokens_per_iteration=None,
) -> Trace:
    """A batch of `num_traces` token-level traces, leaves with a leading `[T]` axis.

    Each token's top-k experts are drawn without replacement from the popularity
    p[i, l, :] by the Gumbel-top-k trick (argtop-k of log p + Gumbel noise); its gate
    weights are the softmax of those perturbed scores over the k chosen experts (sum 1).
    `tokens` is the padded slot count N; `tokens_per_iteration` (int [I] or [T, I], each in
    [0, N]) marks only the first slots of each iteration real (`token_mask`); the others
    hold id -1 and weight 0. Trace t uses `jax.random.split(key, num_traces)[t]`, so it
    equals `generate_one` on that key.
    """
    spec = parse_spec(spec)
    key = check_key(key)
    num_traces = check_int("num_traces", num_traces)
    shape = check_shape_args(iterations, layers, tokens, num_experts, top_k)
    tpi = check_tokens_per_iteration(tokens_per_iteration, (num_traces,), shape[0], shape[2])
    step = max(1, GENERATE_SCRATCH_BYTES // _scratch_bytes(shape))
    if num_traces > step:  # a chunk at a time: the Gumbel scores of all traces never coexist
        lazy = generate_chunked(spec, key, num_traces=num_traces, iterations=iterations,
                                layers=layers, tokens=tokens, num_experts=num_experts,
                                top_k=top_k, tokens_per_iteration=tpi)
        parts = [lazy.chunk(s, min(s + step, num_traces)) for s in range(0, num_traces, step)]
        return jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs), *parts)
    keys = jax.random.split(key, num_traces)
    leaves = _sample_batch(*split_spec(spec), keys, jnp.asarray(tpi), *shape)
    return Trace(*leaves, num_experts=shape[3], top_k=shape[4])


# Most scratch (Gumbel scores) one `generate` call makes at once; larger batches are made in
# chunks of traces. The full `reproduce fsedp` grid generated 16 traces of 100 iterations x 4
# layers x 1024 tokens x 128 experts in one call: 6.7 GB of scores, a 14.8 GB peak.
GENERATE_SCRATCH_BYTES = 256 * 2**20


def _scratch_bytes(shape) -> int:
    """Bytes one trace's sampling holds at once: Gumbel scores [I, L, N, E] and their sum
    with log p (float32)."""
    i, l, n, e, _ = shape
    return 2 * 4 * i * l * n * e


@functools.partial(jax.jit, static_argnums=(0, 4, 5, 6, 7, 8, 9))
def _sample_keyed(static, floats, key_data, tpi, iterations, layers, tokens, num_experts,
                  top_k, impl):
    """`_sample_batch` on raw key data (one compiled call per chunk shape, any offset)."""
    keys = jax.random.wrap_key_data(key_data, impl=impl)
    return _sample_batch(static, floats, keys, tpi, iterations, layers, tokens, num_experts,
                         top_k)


def chunked_args(spec, key, num_traces, iterations, layers, tokens, num_experts, top_k,
                 tokens_per_iteration):
    """A chunked generator's arguments checked (one line naming the field on bad input):
    (spec, key, num_traces, shape (I, L, N, E, k), tokens per iteration); the tokens per
    iteration default to a view, so nothing is held per trace until a chunk is made."""
    spec = parse_spec(spec)
    key = check_key(key)
    num_traces = check_int("num_traces", num_traces)
    shape = check_shape_args(iterations, layers, tokens, num_experts, top_k)
    if tokens_per_iteration is None:
        tokens_per_iteration = np.broadcast_to(np.int32(shape[2]), (shape[0],))
    tpi = check_tokens_per_iteration(tokens_per_iteration, (num_traces,), shape[0], shape[2])
    return spec, key, num_traces, shape, tpi


def generate_chunked(
    spec: GenSpec | str,
    key,
    *,
    num_traces: int,
    iterations: int,
    layers: int,
    tokens: int,
    num_experts: int,
    top_k: int,
    tokens_per_iteration=None,
) -> ChunkedTraces:
    """`generate`'s batch, made a chunk at a time on demand (`ChunkedTraces.chunk`).

    Trace t still uses `jax.random.split(key, num_traces)[t]`, so the chunks, joined, equal
    `generate` with the same arguments; only the split keys (8 bytes a trace) are held.
    """
    spec, key, num_traces, shape, tpi = chunked_args(
        spec, key, num_traces, iterations, layers, tokens, num_experts, top_k,
        tokens_per_iteration)
    split = functools.cache(lambda: key_data_of(key, num_traces))  # at the first chunk
    static, floats = split_spec(spec)

    def make(start: int, stop: int) -> Trace:
        key_data, impl = split()
        leaves = _sample_keyed(static, floats, key_data[start:stop],
                               np.ascontiguousarray(tpi[start:stop]), *shape, impl)
        return Trace(*leaves, num_experts=shape[3], top_k=shape[4])

    i, l, n, e, k = shape
    return ChunkedTraces(num_traces, make, e, k, i, l, n,
                         scratch_bytes_per_trace=_scratch_bytes(shape))


def generate_one(
    spec: GenSpec | str,
    key,
    *,
    iterations: int,
    layers: int,
    tokens: int,
    num_experts: int,
    top_k: int,
    tokens_per_iteration=None,
) -> Trace:
    """One token-level trace (no `[T]` axis); see `generate`."""
    spec = parse_spec(spec)
    key = check_key(key)
    shape = check_shape_args(iterations, layers, tokens, num_experts, top_k)
    tpi = check_tokens_per_iteration(tokens_per_iteration, (), shape[0], shape[2])
    leaves = _sample_batch(*split_spec(spec), key[None], jnp.asarray(tpi)[None], *shape)
    return Trace(*(x[0] for x in leaves), num_experts=shape[3], top_k=shape[4])


def counts_only(trace: Trace) -> Trace:
    """The same trace with per-token data dropped (N axis of length 0), counts kept."""
    batch_il = trace.counts.shape[:-1]  # [..., I, L]
    batch_i = batch_il[:-1]
    return Trace(
        expert_ids=jnp.zeros((*batch_il, 0, trace.top_k), jnp.int32),
        gate_weights=jnp.zeros((*batch_il, 0, trace.top_k), jnp.float32),
        token_mask=jnp.zeros((*batch_i, 0), bool),
        token_request=jnp.zeros((*batch_i, 0), jnp.int32),
        counts=trace.counts,
        num_experts=trace.num_experts,
        top_k=trace.top_k,
    )
