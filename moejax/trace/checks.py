"""Argument checks of the trace generators: a ConfigError naming the argument, its value
and what is allowed."""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np

from moejax.errors import ConfigError


def check_int(name: str, value, lo: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name}: expected an integer >= {lo}, got {value!r}")
    if value < lo:
        raise ConfigError(f"{name}: expected an integer >= {lo}, got {value}")
    return int(value)


def check_key(key) -> jax.Array:
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


def check_shape_args(iterations, layers, tokens, num_experts, top_k):
    iterations = check_int("iterations", iterations)
    layers = check_int("layers", layers)
    tokens = check_int("tokens", tokens)
    num_experts = check_int("num_experts", num_experts)
    top_k = check_int("top_k", top_k)
    if top_k > num_experts:
        raise ConfigError(f"top_k: {top_k} is larger than num_experts {num_experts}")
    return iterations, layers, tokens, num_experts, top_k


def check_tokens_per_iteration(tpi, batch: tuple[int, ...], iterations: int, tokens: int):
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
