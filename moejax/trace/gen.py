"""Keyed, vectorized generators of synthetic routing traces and request streams.

A generator is a `GenSpec` (a family name and its parameters, parsed from strings such as
`powerlaw:alpha=1.5`) plus a `jax.random` key. Each family defines an expert popularity
`p[I, L, E]` (probability that one token's router prefers each expert); `generate` then
samples every token's top-k experts from it, without replacement, by the Gumbel-top-k trick.

Families (see each `_popularity_*` docstring for the paper section):

| family        | params (default)                                        | popularity            |
|---------------|---------------------------------------------------------|-----------------------|
| `uniform`     | none                                                    | 1/E                   |
| `powerlaw`    | alpha (1.5)                                             | rank^-alpha           |
| `exponential` | scale (0.5)                                             | exp(-rank/(scale E))  |
| `normal`      | std (0.032), floor (1e-4)                               | 1/E + N(0, std)       |
| `drift`       | rho (0.8), scale (1.0), noise (0.05), shared (0.5),     | softmax of AR(1)      |
|               | scenarios (4), period (64), switches (none)             | logits                |

String form: `family` or `family:name=value,name=value`; list values (`switches`) are
separated by `/`, e.g. `drift:rho=0.9,switches=40/80`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from moejax.errors import ConfigError, UnknownNameError
from moejax.trace.chunked import ChunkedTraces, key_data_of
from moejax.trace.core import RequestStream, Trace, counts_from_ids

# 002 §5: input / output length ranges (inclusive, tokens) of the three decoding workloads.
WORKLOADS: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "short": ((30, 70), (70, 130)),
    "medium": ((50, 150), (50, 250)),
    "reasonable": ((100, 300), (100, 500)),
}


# ----------------------------------------------------------------------------- specs


@dataclasses.dataclass(frozen=True)
class _Param:
    kind: str  # "float" | "int" | "ints"
    default: Any
    check: Callable[[Any], bool]
    allowed: str


def _gt0(x):
    return x > 0


def _ge0(x):
    return x >= 0


def _unit_open(x):
    return 0 <= x < 1


def _unit_closed(x):
    return 0 <= x <= 1


def _ge1(x):
    return x >= 1


def _increasing_ge1(xs):
    return all(x >= 1 for x in xs) and all(b > a for a, b in zip(xs, xs[1:], strict=False))


FAMILIES: dict[str, dict[str, _Param]] = {
    "uniform": {},
    "powerlaw": {"alpha": _Param("float", 1.5, _gt0, "> 0")},
    "exponential": {"scale": _Param("float", 0.5, _gt0, "> 0 (fraction of E)")},
    "normal": {
        "std": _Param("float", 0.032, _ge0, ">= 0"),
        "floor": _Param("float", 1e-4, _gt0, "> 0"),
    },
    "lognormal": {"sigma": _Param("float", 1.0, _ge0, ">= 0")},
    "drift": {
        "rho": _Param("float", 0.8, _unit_open, "in [0, 1)"),
        "scale": _Param("float", 1.0, _ge0, ">= 0"),
        "noise": _Param("float", 0.05, _ge0, ">= 0"),
        "shared": _Param("float", 0.5, _unit_closed, "in [0, 1]"),
        "scenarios": _Param("int", 4, _ge1, "integer >= 1"),
        "period": _Param("int", 64, _ge1, "integer >= 1"),
        "switches": _Param("ints", (), _increasing_ge1, "increasing integers >= 1, '/'-separated"),
        "quantile": _Param("int", 0, lambda x: x in (0, 1), "0 or 1"),
    },
}


def _coerce(family: str, name: str, p: _Param, value) -> Any:
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

    body = ",".join(f"{k}={fmt(v)}" for k, v in spec.params if v != ())
    return f"{spec.family}:{body}" if body else spec.family


# ------------------------------------------------------------------------ popularity


def _popularity_uniform(st, fl, key, iterations, layers, num_experts):
    """Uniform routing, p = 1/E: the balanced baseline (001 §VI-B, gating equalized)."""
    return jnp.full((iterations, layers, num_experts), -math.log(num_experts), jnp.float32)


def _draw(sample, key, shape):
    """`sample(key, shape)` drawn flat and reshaped: the same distribution, but with the
    default partitionable threefry a multi-axis draw takes seconds to compile on CPU."""
    return sample(key, (math.prod(shape),), jnp.float32).reshape(shape)


def _ranked(key, layers, log_w):
    """log_w [E] of experts by rank, shuffled independently per layer -> [L, E]."""
    order = jnp.argsort(_draw(jax.random.uniform, key, (layers, log_w.shape[0])), axis=-1)
    return log_w[order]


def _popularity_powerlaw(st, fl, key, iterations, layers, num_experts):
    """Power-law (Zipf) popularity, p(rank r) ∝ (r + 1)^-alpha, r = 0..E-1.

    004 §VI-C: inference token distribution modeled as a power law with alpha 0.5-2.5
    (alpha ≈ 1.5 typical). Ranks are a random permutation of the experts per layer, fixed
    over iterations.
    """
    ranks = jnp.arange(num_experts, dtype=jnp.float32)
    log_w = jax.nn.log_softmax(-fl["alpha"] * jnp.log1p(ranks))
    return jnp.broadcast_to(_ranked(key, layers, log_w), (iterations, layers, num_experts))


def _popularity_exponential(st, fl, key, iterations, layers, num_experts):
    """Exponential skew, p(rank r) ∝ exp(-r / (scale * E)), r = 0..E-1.

    002 §5: expert load profiled on Dolly and fitted to an exponential distribution, then
    routing samples experts from it. `scale` is the e-folding length as a fraction of E, so
    one spec gives the same shape of skew for 8 and 16 experts (002 §5.2 scales 8 -> 16);
    the default 0.5 gives max/mean ≈ 2.0 at E = 8. Ranks are shuffled per layer.
    """
    ranks = jnp.arange(num_experts, dtype=jnp.float32)
    log_w = jax.nn.log_softmax(-ranks / (fl["scale"] * num_experts))
    return jnp.broadcast_to(_ranked(key, layers, log_w), (iterations, layers, num_experts))


def _popularity_normal(st, fl, key, iterations, layers, num_experts):
    """Normal token distribution, p_e = 1/E + std * z_e, clipped at `floor`, renormalized.

    004 §V-B (std = 0.032 typical, §VI-C sweeps 0.01-0.05, after COMET). z is standard
    normal, centred over the experts and rescaled by sqrt(E / (E - 1)), so every p_e has
    std `std` and sum(p) = 1 before clipping; renormalization only undoes the clipping.
    Drawn once per layer, fixed over iterations.
    """
    e = num_experts
    z = _draw(jax.random.normal, key, (layers, e))
    z = (z - z.mean(-1, keepdims=True)) * (math.sqrt(e / (e - 1)) if e > 1 else 0.0)
    p = jnp.maximum(1.0 / e + fl["std"] * z, fl["floor"])
    p = p / p.sum(-1, keepdims=True)
    return jnp.broadcast_to(jnp.log(p), (iterations, layers, e))


def _normal_quantiles(num_experts: int):
    """[E] z_r = Φ^-1(1 - (r + 1/2) / E), descending: expected standard normal order
    statistics (the midpoint plotting positions)."""
    r = jnp.arange(num_experts, dtype=jnp.float32)
    return jax.scipy.special.ndtri(1.0 - (r + 0.5) / num_experts)


def _popularity_lognormal(st, fl, key, iterations, layers, num_experts):
    """Lognormal popularity at expected quantiles, p(rank r) ∝ exp(sigma * z_r).

    z_r = Φ^-1(1 - (r + 1/2) / E): the rank-r quantile of a standard normal, so the load of
    the experts is a lognormal sample "of expected shape" (the softmax of normal logits,
    as `drift` draws them, without drawing them): flat at the head, steep at the tail,
    which the recorded ESFT layers show and rank^-alpha / exp(-r) do not (docs/traces.md).
    Deterministic in sigma, so a layer's skew is too. Ranks are shuffled per layer.
    """
    log_w = jax.nn.log_softmax(fl["sigma"] * _normal_quantiles(num_experts))
    return jnp.broadcast_to(_ranked(key, layers, log_w), (iterations, layers, num_experts))


def scenario_of_iteration(spec: GenSpec, iterations: int) -> np.ndarray:
    """Active scenario of each iteration of a `drift` spec, int [I].

    With `switches`, the scenario advances at each listed iteration; otherwise every
    `period` iterations. Scenarios cycle (001 §V-B: cyclically evolving scenario mixtures).
    """
    spec = parse_spec(spec)
    if spec.family != "drift":
        raise ConfigError(f"spec: scenarios exist only for the drift family, got {spec.family!r}")
    return _scenario_index(dict(spec.params), _check_int("iterations", iterations))


def _scenario_index(st: dict, iterations: int) -> np.ndarray:
    i = np.arange(iterations)
    if st["switches"]:
        n = np.searchsorted(np.asarray(st["switches"]), i, side="right")
    else:
        n = i // st["period"]
    return (n % st["scenarios"]).astype(np.int32)


def _popularity_drift(st, fl, key, iterations, layers, num_experts):
    """Temporally correlated popularity: AR(1) logits pulled toward a scenario target.

    001 §V-B, Fig. 12 / 15: per-layer expert load ratios stabilize within a fixed scenario
    after a short warm-up (intrinsically popular experts plus scenario-specific ones), and
    shift when the request mix moves to another scenario. Target logits of scenario s are
    `scale * (sqrt(shared) * z0 + sqrt(1 - shared) * z_s)` (z0: popularity bias common to
    all scenarios, z_s: scenario-specific; standard normal per layer and expert). Logits
    start at 0 (uniform) and follow x_i = rho x_{i-1} + (1 - rho) target_{s(i)} + noise eps_i,
    so warm-up and the transition after a switch take about 1 / (1 - rho) iterations.
    With `quantile=1`, z0 and z_s are the expected normal quantiles in a random order per
    layer (as `lognormal`) instead of normal draws, so a layer's target shape, and with it
    its skew, is the same in every draw; only the noise varies between iterations.
    """
    s, e = st["scenarios"], num_experts
    k_shared, k_scen, k_eps = jax.random.split(key, 3)
    if st["quantile"]:
        q = _normal_quantiles(e)
        z0 = _ranked(k_shared, layers, q)
        zs = _ranked(k_scen, s * layers, q).reshape(s, layers, e)
    else:
        z0 = _draw(jax.random.normal, k_shared, (layers, e))
        zs = _draw(jax.random.normal, k_scen, (s, layers, e))
    shared = fl["shared"]
    targets = fl["scale"] * (jnp.sqrt(shared) * z0 + jnp.sqrt(1.0 - shared) * zs)
    target_i = targets[jnp.asarray(_scenario_index(st, iterations))]  # [I, L, E]
    eps = fl["noise"] * _draw(jax.random.normal, k_eps, (iterations, layers, e))
    rho = fl["rho"]

    def step(x, inp):
        target, noise = inp
        x = rho * x + (1.0 - rho) * target + noise
        return x, x

    _, logits = jax.lax.scan(step, jnp.zeros((layers, e)), (target_i, eps))
    return jax.nn.log_softmax(logits, axis=-1)


_POPULARITY = {
    "uniform": _popularity_uniform,
    "powerlaw": _popularity_powerlaw,
    "exponential": _popularity_exponential,
    "normal": _popularity_normal,
    "lognormal": _popularity_lognormal,
    "drift": _popularity_drift,
}


# ------------------------------------------------------------------------ validation


def _check_int(name: str, value, lo: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name}: expected an integer >= {lo}, got {value!r}")
    if value < lo:
        raise ConfigError(f"{name}: expected an integer >= {lo}, got {value}")
    return int(value)


def _check_key(key) -> jax.Array:
    ok = isinstance(key, jax.Array) and (
        (jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) and key.ndim == 0)
        or (key.dtype == jnp.uint32 and key.shape == (2,))
    )
    if not ok:
        raise ConfigError(
            "key: expected a single jax.random key (jax.random.key(seed)), got "
            f"{type(key).__name__} of shape {getattr(key, 'shape', ())}, "
            f"dtype {getattr(key, 'dtype', None)}"
        )
    return key


def _check_shape_args(iterations, layers, tokens, num_experts, top_k):
    iterations = _check_int("iterations", iterations)
    layers = _check_int("layers", layers)
    tokens = _check_int("tokens", tokens)
    num_experts = _check_int("num_experts", num_experts)
    top_k = _check_int("top_k", top_k)
    if top_k > num_experts:
        raise ConfigError(f"top_k: {top_k} is larger than num_experts {num_experts}")
    return iterations, layers, tokens, num_experts, top_k


def _check_tokens_per_iteration(tpi, batch: tuple[int, ...], iterations: int, tokens: int):
    """int32 [*batch, I] real tokens per iteration, each in [0, tokens]."""
    if tpi is None:
        return np.full((*batch, iterations), tokens, np.int32)
    arr = np.asarray(tpi)
    if arr.dtype == bool or not (
        np.issubdtype(arr.dtype, np.integer)
        or (np.issubdtype(arr.dtype, np.floating) and np.all(np.mod(arr, 1) == 0))
    ):
        raise ConfigError(f"tokens_per_iteration: must be integers, got dtype {arr.dtype}")
    shapes = [(iterations,), (*batch, iterations)]
    if arr.shape not in shapes:
        raise ConfigError(
            f"tokens_per_iteration: expected shape {' or '.join(map(str, set(shapes)))}, "
            f"got {arr.shape}"
        )
    if (arr < 0).any() or (arr > tokens).any():
        raise ConfigError(
            f"tokens_per_iteration: values must be in [0, tokens={tokens}], "
            f"got min {arr.min()} max {arr.max()}"
        )
    return np.broadcast_to(arr.astype(np.int32), (*batch, iterations))


# ------------------------------------------------------------------------ generation


def popularity(
    spec: GenSpec | str, key, *, iterations: int, layers: int, num_experts: int
) -> jax.Array:
    """Expert popularity of one trace, float32 [I, L, E], each row summing to 1."""
    spec = parse_spec(spec)
    key = _check_key(key)
    iterations = _check_int("iterations", iterations)
    layers = _check_int("layers", layers)
    num_experts = _check_int("num_experts", num_experts)
    static, floats = _split(spec)
    return jnp.exp(_log_popularity(static, floats, key, iterations, layers, num_experts))


def _split(spec: GenSpec):
    """(static part: family and integer params, hashable; float params as float32 arrays).

    Float parameters are traced, so sweeping alpha or std does not recompile.
    """
    kinds = FAMILIES[spec.family]
    static = (spec.family, tuple((k, v) for k, v in spec.params if kinds[k].kind != "float"))
    floats = {k: jnp.float32(v) for k, v in spec.params if kinds[k].kind == "float"}
    return static, floats


def _log_p(static, floats, key, iterations, layers, num_experts):
    family, st = static
    return _POPULARITY[family](dict(st), floats, key, iterations, layers, num_experts)


@functools.partial(jax.jit, static_argnums=(0, 3, 4, 5))
def _log_popularity(static, floats, key, iterations, layers, num_experts):
    return _log_p(static, floats, key, iterations, layers, num_experts)


def _sample_one(static, floats, key, tpi, iterations, layers, tokens, num_experts, top_k):
    """Leaves of one trace; tpi int32 [I]."""
    k_pop, k_tok = jax.random.split(key)
    log_p = _log_p(static, floats, k_pop, iterations, layers, num_experts)
    gumbel = _draw(jax.random.gumbel, k_tok, (iterations, layers, tokens, num_experts))
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
    key = _check_key(key)
    num_traces = _check_int("num_traces", num_traces)
    shape = _check_shape_args(iterations, layers, tokens, num_experts, top_k)
    tpi = _check_tokens_per_iteration(tokens_per_iteration, (num_traces,), shape[0], shape[2])
    step = max(1, GENERATE_SCRATCH_BYTES // _scratch_bytes(shape))
    if num_traces > step:  # a chunk at a time: the Gumbel scores of all traces never coexist
        lazy = generate_chunked(spec, key, num_traces=num_traces, iterations=iterations,
                                layers=layers, tokens=tokens, num_experts=num_experts,
                                top_k=top_k, tokens_per_iteration=tpi)
        parts = [lazy.chunk(s, min(s + step, num_traces)) for s in range(0, num_traces, step)]
        return jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs), *parts)
    keys = jax.random.split(key, num_traces)
    leaves = _sample_batch(*_split(spec), keys, jnp.asarray(tpi), *shape)
    return Trace(*leaves, num_experts=shape[3], top_k=shape[4])


# Most scratch (Gumbel scores) one `generate` call makes at once; larger batches are made in
# chunks of traces. The full `reproduce fsedp` grid generated 16 traces of 100 iterations x 4
# layers x 1024 tokens x 128 experts in one call: 6.7 GB of scores, a 14.8 GB peak (issue 13).
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
    spec = parse_spec(spec)
    key = _check_key(key)
    num_traces = _check_int("num_traces", num_traces)
    shape = _check_shape_args(iterations, layers, tokens, num_experts, top_k)
    if tokens_per_iteration is None:  # a view: nothing per trace until a chunk is made
        tokens_per_iteration = np.broadcast_to(np.int32(shape[2]), (shape[0],))
    tpi = _check_tokens_per_iteration(tokens_per_iteration, (num_traces,), shape[0], shape[2])
    split = functools.cache(lambda: key_data_of(key, num_traces))  # at the first chunk
    static, floats = _split(spec)

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
    key = _check_key(key)
    shape = _check_shape_args(iterations, layers, tokens, num_experts, top_k)
    tpi = _check_tokens_per_iteration(tokens_per_iteration, (), shape[0], shape[2])
    leaves = _sample_batch(*_split(spec), key[None], jnp.asarray(tpi)[None], *shape)
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


# -------------------------------------------------------------------- request streams


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
    lo, hi = _check_int(f"{name}[0]", lo), _check_int(f"{name}[1]", hi)
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
    key = _check_key(key)
    num_streams = _check_int("num_streams", num_streams)
    num_requests = _check_int("num_requests", num_requests)
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
