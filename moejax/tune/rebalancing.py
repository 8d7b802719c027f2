"""Tuning the re-plan interval R and the load window W of `moejax.systems.rebalancing`:
a hard-mode grid, and gradient descent on the Gaussian-smoothed objective.

Both knobs act through integer comparisons (the system floors R and rounds W), so the
iteration time with migration stalls, f(R, W), is piecewise constant: its relaxation is
Gaussian smoothing, as for AEP's decay (`moejax.tune.smoothed`, which this follows):
F_sigma(x) = E f(x + sigma * range * eps), x = (R, W) inside their boxes (`tunable
.SmoothedKnob`), estimated by antithetic pairs with common random numbers (every
evaluation runs the same traces), sigma annealed like `tune.loop.tau_at`, the raw knobs
updated by the same optax chain (`loop.make_optimizer`). Every evaluation batch is one
vmapped sweep of the system (R and W are traced params): a grid of G points and 2 P
perturbed points share one compiled call when G = 2 P.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from moejax.errors import ConfigError
from moejax.runner import engine
from moejax.tunable import SmoothedKnob


def objective_ms(system, base, traces, values) -> np.ndarray:
    """Mean iteration time (ms, migration stalls included) over traces of each (R, W) row
    of values [G, 2], one vmapped sweep."""
    params = engine.stack_params([base.replace(interval=jnp.float32(r), window=jnp.float32(w))
                                  for r, w in np.asarray(values)])
    out = engine.simulate(system, params, traces, sweep=True, progress=False)
    return np.asarray(out["forward_s"], np.float64).mean(-1) * 1e3


def grid(system, base, traces, intervals, windows) -> dict:
    """Hard-mode grid: {"intervals", "windows", "forward_ms" [len(R), len(W)], "best"}."""
    pts = np.array([(r, w) for r in intervals for w in windows], np.float64)
    f = objective_ms(system, base, traces, pts).reshape(len(intervals), len(windows))
    i, j = np.unravel_index(int(np.argmin(f)), f.shape)
    return {"intervals": list(intervals), "windows": list(windows), "forward_ms": f,
            "best": {"interval": intervals[i], "window": windows[j],
                     "forward_ms": float(f[i, j])}}


@dataclasses.dataclass(frozen=True)
class SmoothedRun:
    """Settings of the smoothed-gradient run (sigma in units of each knob's range)."""

    interval_range: tuple[float, float]
    window_range: tuple[float, float]
    steps: int = 20
    pairs: int = 8
    lr: float = 0.3
    sigma_start: float = 0.25
    sigma_end: float = 0.05
    seed: int = 0

    def __post_init__(self):
        if self.steps < 1 or self.pairs < 1:
            raise ConfigError(f"steps = {self.steps}, pairs = {self.pairs}; allowed: >= 1")
        if not 0 < self.sigma_end <= self.sigma_start:
            raise ConfigError("sigma: need 0 < sigma_end <= sigma_start")


def tune_smoothed(system, base, traces, run: SmoothedRun, start=None) -> dict:
    """Smoothed-gradient descent on (R, W) from `start` (default: the middle of the boxes):
    {"history": [{interval, window, smoothed_ms, sigma}], "final": {...}, "final_ms"}."""
    knobs = (SmoothedKnob("interval", *run.interval_range),
             SmoothedKnob("window", *run.window_range))
    start = start or [None, None]
    raw = jnp.stack([k.init(None, s) for k, s in zip(knobs, start, strict=True)])
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(run.lr))
    state = opt.init(raw)
    span = np.array([k.hi - k.lo for k in knobs])
    lo = np.array([k.lo for k in knobs])
    hi = np.array([k.hi for k in knobs])
    dvalue = jax.jit(jax.vmap(jax.grad(lambda r, k: k.lo + (k.hi - k.lo) * jax.nn.sigmoid(r)),
                              in_axes=(0, None)), static_argnums=1)
    history = []
    for step in range(run.steps):
        frac = step / max(run.steps - 1, 1)
        sigma = run.sigma_start * (run.sigma_end / run.sigma_start) ** frac
        x = np.array([float(k.relaxed(r, 0.0)) for k, r in zip(knobs, raw, strict=True)])
        key = jax.random.fold_in(jax.random.key(run.seed), step)
        eps = np.asarray(jax.random.normal(key, (run.pairs, 2)), np.float64)
        plus = np.clip(x + sigma * span * eps, lo, hi)
        minus = np.clip(x - sigma * span * eps, lo, hi)
        f = objective_ms(system, base, traces, np.concatenate([plus, minus]))
        fp, fm = f[:run.pairs], f[run.pairs:]
        g_x = ((fp - fm)[:, None] * eps / (2 * sigma * span)).mean(0)  # per unit of value
        g_raw = jnp.asarray([g * float(dvalue(r[None], k)[0]) for g, r, k in zip(
            g_x, raw, knobs, strict=True)], jnp.float32)
        updates, state = opt.update(g_raw, state, raw)
        raw = optax.apply_updates(raw, updates)
        history.append({"interval": float(x[0]), "window": float(x[1]),
                        "smoothed_ms": float((fp + fm).mean() / 2), "sigma": sigma})
    final = [float(k.relaxed(r, 0.0)) for k, r in zip(knobs, raw, strict=True)]
    final = {"interval": float(np.floor(final[0])), "window": float(np.round(final[1]))}
    same = np.array([[final["interval"], final["window"]]] * (2 * run.pairs))  # one compile
    final_ms = float(objective_ms(system, base, traces, same)[0])
    return {"history": history, "final": final, "final_ms": final_ms}
