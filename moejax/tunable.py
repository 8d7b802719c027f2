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
import functools

import jax
import jax.numpy as jnp
import numpy as np

from moejax import relax
from moejax.errors import ConfigError
from moejax.placement.slots import check_capacity

# --- expert placement --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Placement:
    """Expert -> device placement with at most `capacity` experts per device.

    Relaxed: a Sinkhorn plan (relax.sinkhorn) whose rows (experts) sum to 1 and whose
    columns (devices) sum to `capacity`; when capacity * D > E a slack row absorbs the free
    slots, so capacity is an upper bound rather than an exact count. Hard: the assignment
    that maximizes the sum of log plan entries under the same capacities (a Hungarian
    assignment over capacity-replicated device slots), i.e. the MAP rounding of the plan.
    `num_layers` > 0: one placement per trace layer (raw [L, E, D], hard ids [L, E]).
    """

    num_experts: int
    num_devices: int
    capacity: int
    sinkhorn_iters: int = 40
    init_scale: float = 3.0  # logit margin of a starting placement
    name: str = "placement"
    num_layers: int = 0

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

    @property
    def lead(self) -> tuple[int, ...]:
        """The leading layer axis of raw and hard values, if any."""
        return (self.num_layers,) if self.num_layers else ()

    def init(self, key, start=None) -> jax.Array:
        """Raw logits [(L,) E, D]: `init_scale` * one-hot(start) (or 0) + small noise."""
        shape = (*self.lead, self.num_experts, self.num_devices)
        noise = 0.01 * jax.random.normal(key, shape, jnp.float32)
        if start is None:
            return noise
        return self.init_scale * jnp.broadcast_to(jnp.asarray(start, jnp.float32), shape) + noise

    def _plan(self, raw, tau) -> jax.Array:
        e, d = self.num_experts, self.num_devices
        logits, rows = raw, jnp.ones(e)
        if self.slack > 0:
            logits = jnp.concatenate([raw, jnp.zeros((1, d), raw.dtype)])
            rows = jnp.concatenate([rows, jnp.full(1, float(self.slack))])
        cols = jnp.full(d, float(self.capacity))
        return relax.sinkhorn(logits, tau, rows, cols, self.sinkhorn_iters)[:e]

    def relaxed(self, raw, tau) -> jax.Array:
        """Soft placement [(L,) E, D] (rows sum to 1, columns <= capacity) at tau > 0."""
        return _relaxed_jit(self, raw, jnp.asarray(tau, jnp.float32))

    def _relaxed(self, raw, tau) -> jax.Array:
        tau = jnp.maximum(tau, 1e-4)
        if self.num_layers:
            return jax.vmap(lambda r: self._plan(r, tau))(raw)
        return self._plan(raw, tau)

    def hard(self, raw, tau) -> np.ndarray:
        """Device id of each expert, int [(L,) E]: MAP assignment of the plan at tau."""
        from scipy.optimize import linear_sum_assignment

        plan = np.asarray(self.relaxed(jnp.asarray(raw), tau), np.float64)
        slots = np.repeat(np.arange(self.num_devices), self.capacity)  # [D * capacity]

        def one(p):
            rows, cols = linear_sum_assignment(-np.log(np.maximum(p, 1e-30))[:, slots])
            ids = np.empty(self.num_experts, np.int64)
            ids[rows] = slots[cols]
            return ids

        return np.stack([one(p) for p in plan]) if self.num_layers else one(plan)

    def one_hot(self, ids) -> jax.Array:
        """[(L,) E, D] float32 placement from device ids [(L,) E]."""
        return jax.nn.one_hot(jnp.asarray(ids), self.num_devices, dtype=jnp.float32)

    def as_value(self, ids) -> jax.Array:
        """The array `Setup.apply` takes for hard ids (the one-hot placement)."""
        return self.one_hot(ids)

    def shares_of(self, ids) -> np.ndarray:
        """Token shares [(L,) E, D] of hard ids (one-hot)."""
        return np.eye(self.num_devices)[np.asarray(ids)]

    def penalty(self, value) -> jax.Array:
        """Experts over capacity (0 for a converged plan): sum of relu(column - capacity)."""
        return jax.nn.relu(value.sum(-2) - self.capacity).sum()

    def check(self, ids) -> None:
        """ConfigError unless ids [(L,) E] are device ids within capacity."""
        ids = np.asarray(ids)
        shape = (*self.lead, self.num_experts)
        if ids.shape != shape or ((ids < 0) | (ids >= self.num_devices)).any():
            raise ConfigError(f"placement: expected {shape} device ids in "
                              f"[0, {self.num_devices}), got shape {ids.shape}")
        for row in ids.reshape(-1, self.num_experts):
            load = np.bincount(row, minlength=self.num_devices)
            if load.max() > self.capacity:
                raise ConfigError(f"placement: device {int(load.argmax())} holds {load.max()} "
                                  f"experts; allowed: at most capacity = {self.capacity}")


def capped_sinkhorn(logits, tau, row_sums, col_sums, cap_log, iters: int = 50):
    """Entropic transport plan [R, C] with the given row and column sums and entries at most
    exp(cap_log) [R, C] (0: one unit; inf: no cap): Bregman (KL) projections onto the rows,
    the columns and the box in turn, with Dykstra's correction for the box (it is not
    affine), in log space. Without a cap, an expert row that sums to r > 1 may pile several
    replicas onto one device."""
    log_a = jnp.log(jnp.maximum(row_sums, 1e-12))[:, None]
    log_b = jnp.log(col_sums)[None, :]

    def body(carry, _):
        z, q = carry
        z = z - jax.nn.logsumexp(z, axis=-1, keepdims=True) + log_a
        z = z - jax.nn.logsumexp(z, axis=-2, keepdims=True) + log_b
        shifted = z + q
        z = jnp.minimum(shifted, cap_log)
        return (z, shifted - z), None

    (z, _), _ = jax.lax.scan(body, (logits / tau, jnp.zeros_like(logits)), None, length=iters)
    return jnp.exp(z)


@dataclasses.dataclass(frozen=True)
class ReplicaPlacement:
    """Expert replicas in `slots` slots per device, and the share of tokens each serves.

    Each expert has one replica; the R = D * slots - E redundant slots each hold one more
    replica of some expert or stay empty (an empty slot costs nothing; EPLB fills every slot,
    but two of its replicas on one device serve like one). At most one replica per (expert,
    device), at most D per expert. Raw [(L,) E + 1, 2 D + R]: slot logits [E + 1, D] (row E:
    the empty slots'), share logits [E, D], redundant-slot logits v [E + 1, R] (row E:
    empty). Relaxed at temperature tau: slot j holds expert e with probability
    softmax_e(v[:, j] / tau) (one-hot as tau -> 0), so an expert has n_e = 1 + sum_j of
    them and m = sum_j softmax_E slots stay empty; the occupancy Y [E, D] is the capped
    Sinkhorn plan (`capped_sinkhorn`) of the slot logits / tau with rows n and m, columns
    `slots`, expert entries <= 1 (the capacity-as-slots transport); one replica of e on d
    serves r[e, d] = exp(s[e, d]) / sum_d' Y[e, d'] exp(s[e, d']) of e's tokens, so the
    shares P = Y r sum to 1 (s = 0: the even split of `moejax.placement.slots`). Hard: n from
    each slot's argmax (an expert already on D devices passes the slot to the next choice);
    Y the 0/1 matrix with rows n and columns <= `slots` maximizing sum Y log Y_relaxed (a
    transportation LP, integral at its optimum: HiGHS); P = Y r. A value is {"shares": P,
    "occupancy": Y, "per_replica": r}; the hard value is the share matrix P. (Dykstra's
    iterations converge slowly at small tau from a random start; `penalty`, slots over
    capacity, joins the loss for what is left.)
    """

    num_experts: int
    num_devices: int
    slots: int
    num_layers: int = 0
    sinkhorn_iters: int = 40
    init_scale: float = 3.0
    name: str = "replicas"

    def __post_init__(self):
        e, d, s = self.num_experts, self.num_devices, self.slots
        if min(e, d, s) < 1 or s * d < e or s > e:
            raise ConfigError(f"replicas: slots = {s} per device for {e} experts on {d} "
                              f"devices; allowed: {-(-e // d)} .. {e}")

    @property
    def lead(self) -> tuple[int, ...]:
        return (self.num_layers,) if self.num_layers else ()

    @property
    def extra(self) -> int:
        """Redundant slots: D * slots - E."""
        return self.slots * self.num_devices - self.num_experts

    def init(self, key, start=None) -> jax.Array:
        """Raw [(L,) E + 1, 2 D + R] from a start share matrix [(L,) E, D] (its hosts, the
        other redundant slots empty, its shares), or None (random)."""
        e, d, r = self.num_experts, self.num_devices, self.extra
        k1, k2 = jax.random.split(key)
        logits = 0.01 * jax.random.normal(k1, (*self.lead, e + 1, d), jnp.float32)
        rep = 0.01 * jax.random.normal(k2, (*self.lead, e + 1, r), jnp.float32)
        shares = jnp.zeros((*self.lead, e, d))
        if start is not None:
            p = np.broadcast_to(np.asarray(start, np.float64), (*self.lead, e, d))
            hosts = (p > 0).astype(np.float32)
            copies = hosts.sum(-1).astype(np.int64) - 1  # [(L,) E]
            pick = np.zeros((*self.lead, e + 1, r), np.float32)
            for idx in np.ndindex(*self.lead):  # once, host side: what slot j holds
                owners = np.repeat(np.arange(e), copies[idx])
                owners = np.concatenate([owners, np.full(r - owners.size, e)])  # empty
                pick[idx][owners, np.arange(r)] = self.init_scale
            pad = np.zeros((*self.lead, 1, d), np.float32)
            logits = logits + self.init_scale * jnp.asarray(np.concatenate([hosts, pad], -2))
            rep = rep + jnp.asarray(pick)
            shares = jnp.asarray(np.log(np.where(p > 0, p, 1.0)), jnp.float32)
        share_rows = jnp.concatenate([shares, jnp.zeros((*self.lead, 1, d))], -2)
        return jnp.concatenate([logits, share_rows, rep], -1)

    def _split(self, raw):
        d, e = self.num_devices, self.num_experts
        return raw[..., :d], raw[..., :e, d:2 * d], raw[..., 2 * d:]

    def slot_counts(self, rep_logits, tau) -> jax.Array:
        """Relaxed replicas per expert and empty slots [(L,) E + 1] (sum: D * slots)."""
        p = jax.nn.softmax(rep_logits / tau, axis=-2).sum(-1)
        return p + jnp.concatenate([jnp.ones(self.num_experts), jnp.zeros(1)])

    def _value(self, occ, share_logits):
        e_s = jnp.exp(share_logits - share_logits.max(-1, keepdims=True))
        per = e_s / jnp.maximum((occ * e_s).sum(-1, keepdims=True), 1e-30)
        return {"shares": occ * per, "occupancy": occ, "per_replica": per}

    def relaxed(self, raw, tau) -> dict:
        return _relaxed_jit(self, raw, jnp.asarray(tau, jnp.float32))

    def _relaxed(self, raw, tau) -> dict:
        tau = jnp.maximum(tau, 1e-4)
        logits, share_logits, rep = self._split(raw)
        cols = jnp.full(self.num_devices, float(self.slots))
        cap = jnp.concatenate([jnp.zeros((self.num_experts, self.num_devices)),
                               jnp.full((1, self.num_devices), jnp.inf)])

        def plan(lg, n):
            return capped_sinkhorn(lg, tau, n, cols, cap, self.sinkhorn_iters)[:-1]

        n = self.slot_counts(rep, tau)
        occ = jax.vmap(plan)(logits, n) if self.num_layers else plan(logits, n)
        return self._value(occ, share_logits)

    def hard_counts(self, rep_logits) -> np.ndarray:
        """Integer replicas per expert [E]: 1 + the redundant slots whose best choice it is
        (an expert already on D devices passes the slot to the next choice)."""
        v = np.asarray(rep_logits, np.float64)  # [E + 1, R]
        e = self.num_experts
        out = np.ones(e, np.int64)
        for j in range(v.shape[1]):  # once per layer, host side
            for x in np.argsort(-v[:, j], kind="stable"):
                if x == e:
                    break  # the slot stays empty
                if out[x] < self.num_devices:
                    out[x] += 1
                    break
        return out

    def hard_occupancy(self, occ_relaxed, counts) -> np.ndarray:
        """0/1 slots [E, D] with rows `counts`, columns <= `slots`, maximizing
        sum Y log Y_relaxed."""
        from scipy.optimize import linprog

        e, d = self.num_experts, self.num_devices
        score = np.log(np.maximum(np.asarray(occ_relaxed, np.float64), 1e-30)).ravel()
        res = linprog(-score, A_ub=np.kron(np.ones((1, e)), np.eye(d)),
                      b_ub=np.full(d, self.slots), A_eq=np.kron(np.eye(e), np.ones((1, d))),
                      b_eq=counts, bounds=(0, 1), method="highs")
        if res.status != 0:
            raise ConfigError(f"replicas: no 0/1 slot assignment for counts {counts.tolist()}")
        return np.round(res.x).reshape(e, d)

    def hard(self, raw, tau) -> np.ndarray:
        """Token shares [(L,) E, D] of the rounded placement (rows sum to 1)."""
        raw = jnp.asarray(raw)
        value = self.relaxed(raw, tau)
        _, share_logits, rep = self._split(raw)
        e, d = self.num_experts, self.num_devices
        occ_r = np.asarray(value["occupancy"]).reshape(-1, e, d)
        reps = np.asarray(rep).reshape(-1, e + 1, self.extra)
        occ = np.stack([self.hard_occupancy(o, self.hard_counts(v)) for o, v in zip(
            occ_r, reps, strict=True)]).reshape(*self.lead, e, d)
        return np.asarray(self._value(jnp.asarray(occ, jnp.float32), share_logits)["shares"],
                          np.float64)

    def as_value(self, shares) -> dict:
        """The value `Setup.apply` takes for a hard share matrix."""
        p = jnp.asarray(shares, jnp.float32)
        occ = (p > 0).astype(jnp.float32)
        return {"shares": p, "occupancy": occ,
                "per_replica": jnp.where(occ > 0, p, 0.0)}

    def shares_of(self, shares) -> np.ndarray:
        return np.asarray(shares, np.float64)

    def penalty(self, value) -> jax.Array:
        """Slots over capacity (0 for a converged plan)."""
        return jax.nn.relu(value["occupancy"].sum(-2) - self.slots).sum()

    def check(self, shares) -> None:
        """ConfigError unless shares [(L,) E, D] conserve tokens and fit the slots."""
        p = np.asarray(shares)
        if p.shape != (*self.lead, self.num_experts, self.num_devices):
            raise ConfigError(f"replicas: expected shares of shape "
                              f"{(*self.lead, self.num_experts, self.num_devices)}, got {p.shape}")
        check_capacity(p, self.slots)


@functools.partial(jax.jit, static_argnums=0)
def _relaxed_jit(family, raw, tau):
    """A placement family's relaxed value, compiled once per family (inlined in a jitted
    loss; compiled, not op by op, when rounding on the host)."""
    return family._relaxed(raw, tau)


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
