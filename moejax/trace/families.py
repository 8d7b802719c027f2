"""The generator families: each one's parameters (`FAMILIES`, names, defaults, allowed
ranges) and its expert popularity log p[I, L, E] (`log_p`), citing the paper it follows.

| family        | params (default)                                        | popularity            |
|---------------|---------------------------------------------------------|-----------------------|
| `uniform`     | none                                                    | 1/E                   |
| `powerlaw`    | alpha (1.5)                                             | rank^-alpha           |
| `exponential` | scale (0.5)                                             | exp(-rank/(scale E))  |
| `normal`      | std (0.032), floor (1e-4), ref_experts (0)              | 1/E + N(0, std)       |
| `lognormal`   | sigma (1.0)                                             | exp(sigma z_rank)     |
| `drift`       | rho (0.8), scale (1.0), noise (0.05), shared (0.5),     | softmax of AR(1)      |
|               | scenarios (4), period (64), switches (none)             | logits                |
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """One parameter of a family: its kind ("float" | "int" | "ints"), default, check and
    the allowed range as the error message states it."""

    kind: str  # "float" | "int" | "ints"
    default: Any
    check: Callable[[Any], bool]
    allowed: str
    # False: the spec's string form omits the parameter at its default (a parameter added
    # later, so the strings of existing specs stay as they were)
    shown_at_default: bool = True


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


FAMILIES: dict[str, dict[str, ParamSpec]] = {
    "uniform": {},
    "powerlaw": {"alpha": ParamSpec("float", 1.5, _gt0, "> 0")},
    "exponential": {"scale": ParamSpec("float", 0.5, _gt0, "> 0 (fraction of E)")},
    "normal": {
        "std": ParamSpec("float", 0.032, _ge0, ">= 0"),
        "floor": ParamSpec("float", 1e-4, _gt0, "> 0"),
        "ref_experts": ParamSpec("int", 0, _ge0, "integer >= 0 (0: std absolute)", False),
    },
    "lognormal": {"sigma": ParamSpec("float", 1.0, _ge0, ">= 0")},
    "drift": {
        "rho": ParamSpec("float", 0.8, _unit_open, "in [0, 1)"),
        "scale": ParamSpec("float", 1.0, _ge0, ">= 0"),
        "noise": ParamSpec("float", 0.05, _ge0, ">= 0"),
        "shared": ParamSpec("float", 0.5, _unit_closed, "in [0, 1]"),
        "scenarios": ParamSpec("int", 4, _ge1, "integer >= 1"),
        "period": ParamSpec("int", 64, _ge1, "integer >= 1"),
        "switches": ParamSpec("ints", (), _increasing_ge1,
                              "increasing integers >= 1, '/'-separated"),
        "quantile": ParamSpec("int", 0, lambda x: x in (0, 1), "0 or 1"),
    },
}



def _popularity_uniform(st, fl, key, iterations, layers, num_experts):
    """Uniform routing, p = 1/E: the balanced baseline (001 §VI-B, gating equalized)."""
    return jnp.full((iterations, layers, num_experts), -math.log(num_experts), jnp.float32)


def draw(sample, key, shape):
    """`sample(key, shape)` drawn flat and reshaped: the same distribution, but with the
    default partitionable threefry a multi-axis draw takes seconds to compile on CPU."""
    return sample(key, (math.prod(shape),), jnp.float32).reshape(shape)


def _ranked(key, layers, log_w):
    """log_w [E] of experts by rank, shuffled independently per layer -> [L, E]."""
    order = jnp.argsort(draw(jax.random.uniform, key, (layers, log_w.shape[0])), axis=-1)
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

    ref_experts = E0 > 0 reads `std` as the spread at E0 experts and keeps the coefficient of
    variation std * E0 at every E (the std applied is std * E0 / E); 0 (default) applies
    `std` absolutely, so the same std is a larger relative skew at larger E (004 §V-B gives
    one std for models of 64 to 256 experts).
    """
    e = num_experts
    z = draw(jax.random.normal, key, (layers, e))
    z = (z - z.mean(-1, keepdims=True)) * (math.sqrt(e / (e - 1)) if e > 1 else 0.0)
    ref = st["ref_experts"]
    std = fl["std"] * (ref / e if ref else 1.0)
    p = jnp.maximum(1.0 / e + std * z, fl["floor"])
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



def scenario_index(st: dict, iterations: int) -> np.ndarray:
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
        z0 = draw(jax.random.normal, k_shared, (layers, e))
        zs = draw(jax.random.normal, k_scen, (s, layers, e))
    shared = fl["shared"]
    targets = fl["scale"] * (jnp.sqrt(shared) * z0 + jnp.sqrt(1.0 - shared) * zs)
    target_i = targets[jnp.asarray(scenario_index(st, iterations))]  # [I, L, E]
    eps = fl["noise"] * draw(jax.random.normal, k_eps, (iterations, layers, e))
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


def log_popularity(static, floats, key, iterations, layers, num_experts):
    """log p [I, L, E] of the family in `static` = (family, its non-float params as pairs);
    `floats` its float params (traced)."""
    family, st = static
    return _POPULARITY[family](dict(st), floats, key, iterations, layers, num_experts)
