"""Tunable-parameter families: an unconstrained raw array, its relaxation, its hard value.

A family turns raw values (what optax updates, unconstrained float32) into what a system
reads: `relaxed(raw, tau)` is smooth for `tau > 0` (used while tuning), `hard(raw, tau)` is
a valid discrete value (used for evaluation and export, in hard mode). Families are frozen
dataclasses (hashable, so a jitted loss can close over them):

- `Placement`: raw logits [E, D]; relaxed = a Sinkhorn plan (rows sum to 1, devices hold
  at most `capacity` experts via a slack row); hard = the capacity-respecting MAP assignment
  of the plan (Hungarian).
- `IntegerKnob`: raw scalar; relaxed = lo + (hi - lo) sigmoid(raw), fractional; hard = the
  nearest integer.
- `Threshold`: raw scalar; value lo + (hi - lo) sigmoid(raw) in both modes; the system's
  comparisons against it go through `gate` (a sigmoid for tau > 0, exact at 0).
- `LogKnob`: raw scalar; a positive quantity lo (hi / lo)^sigmoid(raw) (a bandwidth, a
  buffer size, the wafer Eq. 2 alpha) in both modes; hard = that value in float32.
- `SmoothedKnob`: raw scalar; a value in [lo, hi] whose effect is piecewise constant (AEP's
  decay); relaxed by Gaussian smoothing of the objective (`moejax.tune.smoothed`).

Integer knobs are read by a system through `interpolate` (relax.round: a fractional count
is the linear interpolation between its floor and ceiling); thresholds through `gate`
(relax.step). Both are exact at `tau = 0`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from moejax import relax
from moejax.errors import ConfigError

# --- expert placement --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Placement:
    """Expert -> device placement with at most `capacity` experts per device.

    Relaxed: a Sinkhorn plan (relax.sinkhorn) whose rows (experts) sum to 1 and whose
    columns (devices) sum to `capacity`; when capacity * D > E a slack row absorbs the free
    slots, so capacity is an upper bound rather than an exact count. Hard: the assignment
    that maximizes the sum of log plan entries under the same capacities (a Hungarian
    assignment over capacity-replicated device slots), i.e. the MAP rounding of the plan.
    """

    num_experts: int
    num_devices: int
    capacity: int
    sinkhorn_iters: int = 40
    init_scale: float = 3.0  # logit margin of a starting placement
    name: str = "placement"

    def __post_init__(self):
        e, d, c = self.num_experts, self.num_devices, self.capacity
        if min(e, d, c) < 1:
            raise ConfigError(f"placement: num_experts, num_devices, capacity must be >= 1, "
                              f"got {e}, {d}, {c}")
        if c * d < e:
            raise ConfigError(f"placement: capacity = {c} experts per device is too small for "
                              f"{e} experts on {d} devices; allowed: capacity >= {-(-e // d)}")

    @property
    def slack(self) -> int:
        return self.capacity * self.num_devices - self.num_experts

    def init(self, key, start=None) -> jax.Array:
        """Raw logits [E, D]: `init_scale` * one-hot(start) (or 0) + small noise."""
        shape = (self.num_experts, self.num_devices)
        noise = 0.01 * jax.random.normal(key, shape, jnp.float32)
        if start is None:
            return noise
        return self.init_scale * jnp.asarray(start, jnp.float32) + noise

    def relaxed(self, raw, tau) -> jax.Array:
        """Soft placement [E, D] (rows sum to 1, columns <= capacity) at temperature tau > 0."""
        e, d = self.num_experts, self.num_devices
        logits, rows = raw, jnp.ones(e)
        if self.slack > 0:
            logits = jnp.concatenate([raw, jnp.zeros((1, d), raw.dtype)])
            rows = jnp.concatenate([rows, jnp.full(1, float(self.slack))])
        cols = jnp.full(d, float(self.capacity))
        tau = jnp.maximum(jnp.asarray(tau, jnp.float32), 1e-4)
        return relax.sinkhorn(logits, tau, rows, cols, self.sinkhorn_iters)[:e]

    def hard(self, raw, tau) -> np.ndarray:
        """Device id of each expert, int [E]: MAP assignment of the plan at temperature tau."""
        from scipy.optimize import linear_sum_assignment

        plan = np.asarray(self.relaxed(jnp.asarray(raw), tau), np.float64)
        score = np.log(np.maximum(plan, 1e-30))
        slots = np.repeat(np.arange(self.num_devices), self.capacity)  # [D * capacity]
        rows, cols = linear_sum_assignment(-score[:, slots])
        ids = np.empty(self.num_experts, np.int64)
        ids[rows] = slots[cols]
        return ids

    def one_hot(self, ids) -> jax.Array:
        """[E, D] float32 placement from device ids [E]."""
        return jax.nn.one_hot(jnp.asarray(ids), self.num_devices, dtype=jnp.float32)

    def penalty(self, value) -> jax.Array:
        """Experts over capacity (0 for a converged plan): sum of relu(column - capacity)."""
        return jax.nn.relu(value.sum(0) - self.capacity).sum()

    def check(self, ids) -> None:
        """ConfigError unless ids [E] are device ids within capacity."""
        ids = np.asarray(ids)
        if ids.shape != (self.num_experts,) or ((ids < 0) | (ids >= self.num_devices)).any():
            raise ConfigError(f"placement: expected {self.num_experts} device ids in "
                              f"[0, {self.num_devices}), got shape {ids.shape}")
        load = np.bincount(ids, minlength=self.num_devices)
        if load.max() > self.capacity:
            raise ConfigError(f"placement: device {int(load.argmax())} holds {load.max()} "
                              f"experts; allowed: at most capacity = {self.capacity}")


def contiguous_ids(num_experts: int, num_devices: int) -> np.ndarray:
    """Expert e on device e * D // E (the EP policy default, DeepSpeed / SGLang)."""
    return np.arange(num_experts) * num_devices // num_experts


def round_robin_ids(num_experts: int, num_devices: int) -> np.ndarray:
    """Expert e on device e mod D."""
    return np.arange(num_experts) % num_devices


def greedy_balanced_ids(load_e, num_devices: int, capacity: int) -> np.ndarray:
    """Greedy load balancing (EPLB-like): hottest expert first, onto the least-loaded device
    that still has room; ties to the lowest device id. load_e [E]: expected tokens."""
    load_e = np.asarray(load_e, np.float64)
    ids = np.empty(load_e.shape[0], np.int64)
    dev_load = np.zeros(num_devices)
    dev_count = np.zeros(num_devices, np.int64)
    for e in np.argsort(-load_e, kind="stable"):  # once, host side: not a hot path
        room = dev_count < capacity
        d = int(np.argmin(np.where(room, dev_load, np.inf)))
        ids[e] = d
        dev_load[d] += load_e[e]
        dev_count[d] += 1
    return ids


# --- integer knobs and thresholds -----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class IntegerKnob:
    """An integer in [lo, hi] (micro-slice count, pipeline number, shadow slots).

    Relaxed: the fractional value lo + (hi - lo) sigmoid(raw); a system reads it through
    `interpolate` (relax.round). Hard: rounded to the nearest integer.
    """

    name: str
    lo: int
    hi: int

    def __post_init__(self):
        if not self.lo < self.hi:
            raise ConfigError(f"{self.name}: need lo < hi, got lo = {self.lo}, hi = {self.hi}")

    def init(self, key, start=None) -> jax.Array:
        """Raw scalar; `start` (an integer in [lo, hi]) maps to its sigmoid preimage."""
        del key
        v = (self.lo + self.hi) / 2 if start is None else float(start)
        u = np.clip((v - self.lo) / (self.hi - self.lo), 1e-3, 1 - 1e-3)
        return jnp.float32(np.log(u / (1 - u)))

    def relaxed(self, raw, tau) -> jax.Array:
        return self.lo + (self.hi - self.lo) * jax.nn.sigmoid(raw)

    def hard(self, raw, tau=0.0) -> int:
        return int(np.clip(np.round(float(self.relaxed(raw, tau))), self.lo, self.hi))

    def penalty(self, value) -> jax.Array:
        return jnp.float32(0.0)  # the sigmoid keeps it in range


def interpolate(fn, x, tau):
    """fn at an integer count x (float scalar): fn(round(x)) at tau = 0, else the linear
    interpolation between fn(floor x) and fn(ceil x) (relax.round), piecewise linear in x."""
    xr = relax.round(x, tau)
    lo = jnp.floor(xr)
    w = xr - lo
    return jax.tree_util.tree_map(lambda a, b: (1.0 - w) * a + w * b, fn(lo), fn(lo + 1.0))


@dataclasses.dataclass(frozen=True)
class Threshold:
    """A real threshold in [lo, hi] (theta_min, balancer trigger alpha, QoS slack).

    The value itself is continuous; the discrete part is the system's comparison against
    it, which goes through `gate` (relax.step: sigmoid((x - theta) / tau), exact at 0).
    """

    name: str
    lo: float
    hi: float

    def __post_init__(self):
        if not self.lo < self.hi:
            raise ConfigError(f"{self.name}: need lo < hi, got lo = {self.lo}, hi = {self.hi}")

    def init(self, key, start=None) -> jax.Array:
        return IntegerKnob.init(self, key, start)  # same sigmoid preimage

    def relaxed(self, raw, tau) -> jax.Array:
        return self.lo + (self.hi - self.lo) * jax.nn.sigmoid(raw)

    def hard(self, raw, tau=0.0) -> float:
        return float(self.relaxed(raw, tau))

    def penalty(self, value) -> jax.Array:
        return jnp.float32(0.0)


@dataclasses.dataclass(frozen=True)
class SmoothedKnob(Threshold):
    """A real knob in [lo, hi] whose effect on the metrics is piecewise constant (it acts
    only through a discrete-event simulation's argmax: AEP's decay delta, 002 §3.4).

    Raw scalar, value lo + (hi - lo) sigmoid(raw) in both modes (always inside the range),
    as `Threshold`. Nothing in the simulation is relaxed: the relaxation is Gaussian
    smoothing of the objective over the value (`moejax.tune.smoothed`, sigma in the role of
    tau). A start or a hard value outside [lo, hi] is a ConfigError.
    """

    @property
    def bounds(self) -> tuple[float, float]:
        return float(self.lo), float(self.hi)

    def check(self, v) -> float:
        v = float(v)
        if not self.lo <= v <= self.hi:
            raise ConfigError(f"{self.name} = {v:.6g} lies outside its allowed range "
                              f"[{self.lo:.6g}, {self.hi:.6g}]")
        return v

    def init(self, key, start=None) -> jax.Array:
        """Raw scalar; `start` (in [lo, hi]) maps to its preimage, None to the middle."""
        return super().init(key, None if start is None else self.check(start))

    def hard(self, raw, tau=0.0) -> float:
        return self.check(np.float32(self.relaxed(raw, tau)))


def gate(x, theta, tau):
    """1[x > theta] at tau = 0, sigmoid((x - theta) / tau) otherwise."""
    return relax.step(x - theta, tau)


@dataclasses.dataclass(frozen=True)
class LogKnob:
    """A positive continuous quantity in [lo, hi] (hardware knobs: buffer bytes, DDR / D2D
    bandwidth, 000 §VI-D), tuned in log space: value = lo (hi / lo)^sigmoid(raw), so a step
    in raw is a relative change whatever the scale. Nothing discrete: hard = the value."""

    name: str
    lo: float
    hi: float

    def __post_init__(self):
        if not 0 < self.lo < self.hi:
            raise ConfigError(f"{self.name}: need 0 < lo < hi, got lo = {self.lo}, "
                              f"hi = {self.hi}")

    def init(self, key, start=None) -> jax.Array:
        """Raw scalar; `start` (in [lo, hi]) maps to its preimage, None to the geometric mean."""
        del key
        if start is None:
            return jnp.float32(0.0)
        v = float(start)
        if not self.lo <= v <= self.hi:
            raise ConfigError(f"{self.name} = {v:.6g} lies outside the tuning box; allowed: "
                              f"[{self.lo:.6g}, {self.hi:.6g}]")
        u = np.clip(np.log(v / self.lo) / np.log(self.hi / self.lo), 1e-3, 1 - 1e-3)
        return jnp.float32(np.log(u / (1 - u)))

    def relaxed(self, raw, tau) -> jax.Array:
        span = np.log(self.hi / self.lo)
        return self.lo * jnp.exp(span * jax.nn.sigmoid(raw))

    def hard(self, raw, tau=0.0) -> float:
        return float(np.float32(self.relaxed(raw, tau)))

    def penalty(self, value) -> jax.Array:
        return jnp.float32(0.0)  # the box is kept by the sigmoid; the budget by the Setup
