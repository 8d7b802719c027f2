"""Design-space sweeps as one vmapped batch of design points (`moejax sweep`).

A sweep varies platform values (bandwidths, latencies, buffer sizes, device peak) and policy
params over a grid (`--vary KEY=LO:HI:N`, the cartesian product of every `--vary`), and
evaluates every design point on the same traces in one compiled call: `vmap` over points of
`vmap` over traces.

How a value reaches the simulation, per key:
- a **params key** is a scalar field of the system's params pytree (e.g. FSE-DP's
  `num_microslices`, `ddr_Bps`, `link_Bps`, `weight_buffer_bytes`): the batch of params is
  vmapped, as in `engine.simulate(sweep=True)`;
- a **hardware key** (`HARDWARE_KEYS`) is a platform value the system takes as static config:
  the system is built *inside* the vmapped function from a platform whose swept values are
  traced scalars, so a value that only enters arithmetic becomes a batched param with no
  change to the system. A value the system uses for shapes or checks on the host (e.g.
  FSE-DP derives its micro-slice minimum from the buffer size) cannot be traced: the key is
  rejected in one line naming the keys that can be swept for that system.

Systems whose registry entry takes request streams (`input_kind = "streams"`, 002 AMoE:
aep, ep_serving) sweep over Poisson streams instead (`run_streams`, 002 §5: `--rate`,
`--workload`, `--streams`, `--requests`): a design point is (platform values, policy params,
arrival rate) and its metrics are per stream: throughput, mean ITL, ITL p99 (from the
streams' pooled ITL histogram, 002 Fig. 9's metric), mean TTFT. Every point runs the same
streams (common random numbers: the same arrivals per rate, the same routing keys), so
points differ only by the swept values. Such a system is built on the host once per
distinct platform point; the points whose systems are the same compiled program (the AEP
rounds path: one program per Spec and placement, its platform values in `params.consts`)
run as the rows of one engine call, each (point, stream) row with its own params and
stream; others (the sync baseline, whose costs are constants of its program) one call per
platform point.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from moejax.errors import ConfigError
from moejax.runner import distributed, engine, programs
from moejax.systems.amoe import serve
from moejax.systems.amoe.config import p99_from_hist

# Platform values a sweep may trace: key -> (spec, field). `peak_flops` sets the bf16 peak and
# scales every other dtype's entry by the same factor (the ratios of the vendor sheet).
HARDWARE_KEYS = {
    "memory_Bps": ("device", "memory_Bps"),
    "onchip_buffer_bytes": ("device", "onchip_buffer_bytes"),
    "memory_capacity_bytes": ("device", "memory_capacity_bytes"),
    "peak_flops": ("device", "peak_flops"),
    "link_Bps": ("topology", "link_Bps"),
    "hop_latency_s": ("topology", "hop_latency_s"),
    "border_Bps": ("topology", "border_Bps"),
    "inter_Bps": ("topology", "inter_Bps"),
    "inter_latency_s": ("topology", "inter_latency_s"),
}
# latencies may be 0; everything else must be > 0
_ZERO_OK = ("hop_latency_s", "inter_latency_s")


@dataclasses.dataclass(frozen=True)
class Vary:
    """One swept key and its values."""

    key: str
    values: tuple[float, ...]


def parse_vary(text: str) -> Vary:
    """`KEY=LO:HI:N` (N values from LO to HI, linear), `KEY=LO:HI:Nlog` (geometric) or
    `KEY=V1,V2,...`; ConfigError naming the field otherwise."""
    key, sep, spec = text.partition("=")
    key = key.strip()
    if not sep or not key or not spec.strip():
        raise ConfigError(f"--vary {text!r}: expected KEY=LO:HI:N, KEY=LO:HI:Nlog or "
                          "KEY=V1,V2,...")
    try:
        if ":" in spec:
            parts = spec.split(":")
            if len(parts) != 3:
                raise ValueError
            lo, hi, n = parts
            geometric = n.strip().endswith("log")
            n = int(n.strip().removesuffix("log"))
            lo, hi = float(lo), float(hi)
            if n < 1:
                raise ConfigError(f"--vary {text!r}: N = {n} is an empty range; N must be >= 1")
            if geometric and (lo <= 0 or hi <= 0):
                raise ConfigError(f"--vary {text!r}: a log range needs LO, HI > 0")
            vals = np.geomspace(lo, hi, n) if geometric else np.linspace(lo, hi, n)
        else:
            vals = np.array([float(v) for v in spec.split(",") if v.strip()])
            if vals.size == 0:
                raise ConfigError(f"--vary {text!r}: empty list of values")
    except ConfigError:
        raise
    except ValueError:
        raise ConfigError(f"--vary {text!r}: expected KEY=LO:HI:N, KEY=LO:HI:Nlog or "
                          "KEY=V1,V2,... with numbers") from None
    if not np.all(np.isfinite(vals)):
        raise ConfigError(f"--vary {text!r}: values must be finite")
    if key in HARDWARE_KEYS and key not in _ZERO_OK and np.any(vals <= 0):
        raise ConfigError(f"--vary {text!r}: {key} must be > 0")
    if key in _ZERO_OK and np.any(vals < 0):
        raise ConfigError(f"--vary {text!r}: {key} must be >= 0")
    return Vary(key, tuple(float(v) for v in vals))


def grid(varies: list[Vary]) -> dict[str, np.ndarray]:
    """The cartesian product of the varies: key -> float64 [P] (first key slowest)."""
    if not varies:
        raise ConfigError("sweep: give at least one --vary KEY=LO:HI:N")
    keys = [v.key for v in varies]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"--vary: each key once; got {keys}")
    pts = list(itertools.product(*(v.values for v in varies)))
    return {k: np.array([p[i] for p in pts], np.float64) for i, k in enumerate(keys)}


def params_keys(params) -> list[str]:
    """Scalar (or None) fields of a params dataclass, which a sweep can batch; `tau` is the
    relaxation temperature, not a design value, and is left out, as are the fields a params
    class names in `TUNING_ONLY` and nested dataclasses (e.g. AEP's `consts`, arrays derived
    from the platform)."""
    out = []
    skip = ("tau", *getattr(type(params), "TUNING_ONLY", ()))
    for f in dataclasses.fields(params):
        v = getattr(params, f.name)
        if (f.name not in skip and not dataclasses.is_dataclass(v)
                and (v is None or np.ndim(v) == 0)):
            out.append(f.name)
    return out


def with_platform_values(platform, values: dict):
    """`platform` with swept values (floats or traced scalars) set, without host checks."""
    dev, top = {}, {}
    for k, v in values.items():
        spec, field = HARDWARE_KEYS[k]
        if field == "peak_flops":
            table = dict(platform.device.peak_flops)
            ref = table.get("bf16", next(iter(table.values())))
            dev["peak_flops"] = tuple((d, f / ref * v) for d, f in table.items())
        elif spec == "device":
            dev[field] = v
        else:
            top[field] = v
    return dataclasses.replace(platform, device=dataclasses.replace(platform.device, **dev),
                               topology=dataclasses.replace(platform.topology, **top))


@dataclasses.dataclass(frozen=True, eq=False)  # compiled once per value: `_compiled`
class Plan:
    """How a sweep runs: the system entry, which keys go to params and which to the platform."""

    setup: object  # api.Setup
    entry: object  # systems.SystemEntry
    num_iterations: int
    params_keys: tuple[str, ...]
    hardware_keys: tuple[str, ...]


def _build(plan: Plan, hw: dict):
    """(System, params) with hardware values `hw` (floats or tracers) on the platform."""
    s = plan.setup
    platform = with_platform_values(s.platform, hw) if hw else s.platform
    return plan.entry.from_policy(platform, s.model, s.policy.options_table(),
                                  plan.num_iterations)


def _one_point(plan: Plan, values: dict, traces, key_data, key_impl: str):
    """Metrics [T] of one design point: params keys replace params fields, hardware keys
    rebuild the system on a platform carrying the (traced) values."""
    system, params = _build(plan, {k: values[k] for k in plan.hardware_keys})
    params = params.replace(**{k: jnp.asarray(values[k], jnp.float32)
                               for k in plan.params_keys})
    keys = jax.random.wrap_key_data(key_data, impl=key_impl)
    return jax.vmap(lambda tr, k: engine.run_one(system, params, tr, k))(traces, keys)


def _traceable(plan: Plan, key: str, sample, key_data, key_impl: str) -> bool:
    """Whether hardware `key` can be a traced value for this system (an abstract trace of
    one design point on `sample` traces; nothing is compiled)."""
    one = dataclasses.replace(plan, params_keys=(), hardware_keys=(key,))
    try:
        jax.eval_shape(lambda v: _one_point(one, {key: v}, sample, key_data, key_impl),
                       jnp.float32(1.0))
        return True
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError,
            jax.errors.TracerIntegerConversionError, jax.errors.TracerArrayConversionError,
            TypeError, ValueError, ConfigError):
        return False


def make_plan(setup, entry, num_iterations: int, keys: list[str], sample, key_data,
              key_impl: str) -> Plan:
    """Sort `keys` into params and hardware keys; ConfigError naming the allowed keys."""
    _, params = entry.from_policy(setup.platform, setup.model, setup.policy.options_table(),
                                  num_iterations)
    pkeys = params_keys(params)
    check = getattr(type(params), "check_sweep", None)  # a system's own refusals
    if check is not None:
        check(dict(setup.policy.options), keys)
    hw = tuple(k for k in keys if k not in pkeys)
    plan = Plan(setup, entry, num_iterations, tuple(k for k in keys if k in pkeys), hw)
    ok = {k: k in HARDWARE_KEYS and _traceable(plan, k, sample, key_data, key_impl)
          for k in hw}
    bad = [k for k in hw if not ok[k]]
    if bad:
        def sweepable(k):
            return ok[k] if k in ok else _traceable(plan, k, sample, key_data, key_impl)

        allowed = sorted(pkeys) + [k for k in HARDWARE_KEYS if sweepable(k)]
        raise ConfigError(
            f"--vary {bad[0]}: not a value system {setup.policy.system!r} can sweep "
            f"(unknown, or static: it fixes shapes or is checked on the host); allowed keys: "
            f"{', '.join(allowed)}")
    return plan


def _compiled(plan: Plan, key_impl: str):
    """The compiled sweep call, cached by value (`programs.fingerprint` of the plan)."""
    quick = programs.quick_compiling()
    return programs.PROGRAMS.get("sweep", (plan, key_impl, quick), lambda: jax.jit(jax.vmap(
        lambda values, traces, key_data: _one_point(plan, values, traces, key_data, key_impl),
        in_axes=(0, None, None)), compiler_options=programs.compiler_options(quick)))


def run(plan: Plan, points: dict[str, np.ndarray], traces, key, *,
        points_per_call: int | None = None, progress: bool = False) -> dict[str, np.ndarray]:
    """Metrics [P, T] of every design point on every trace: one compiled call per block of
    `points_per_call` points (default: all of them, or as many as keep a call's
    (point, trace) pairs near `engine.default_chunk`).

    In a multi-process run (`moejax.runner.distributed`) each process evaluates its share of the
    points, whole blocks of the single-process run (the same call shapes, so the same values
    bit for bit), and the metrics are all-gathered back to [P, T] on every process."""
    n = engine.batch_size(traces)
    key_data = jax.random.key_data(jax.random.split(key, n))
    fn = _compiled(plan, str(jax.random.key_impl(key)))
    total = len(next(iter(points.values())))
    per = points_per_call or max(1, engine.default_chunk(traces) * 8 // max(n, 1))
    per = min(per, total)
    part = distributed.partition(total, per)  # several processes: this one's blocks
    if part is not None:
        points, total = part.take(points), part.rows
    blocks = range(0, total, per)
    outs = []
    with engine.progress_bar(progress and len(blocks) > 1, len(blocks), "sweep") as advance:
        for s in blocks:
            vals = {k: jnp.asarray(v[s:s + per], jnp.float32) for k, v in points.items()}
            outs.append(jax.tree_util.tree_map(np.asarray, fn(vals, traces, key_data)))
            advance()
    out = jax.tree_util.tree_map(lambda *xs: np.concatenate(xs), *outs)
    return out if part is None else part.gather(out, 0)


def summarize(points: dict[str, np.ndarray], out: dict[str, np.ndarray],
              metric: str = "latency_s") -> dict[str, np.ndarray]:
    """Tidy columns, one row per design point: the swept values, then mean / p50 / p99 of
    `metric` over traces and the trace means of the other per-trace metrics."""
    cols = {k: np.asarray(v) for k, v in points.items()}
    x = np.asarray(out[metric], np.float64)
    cols[f"{metric}_mean"] = x.mean(1)
    cols[f"{metric}_p50"] = np.percentile(x, 50, axis=1)
    cols[f"{metric}_p99"] = np.percentile(x, 99, axis=1)
    for k, v in out.items():
        if k != metric and np.ndim(v) == 2:
            cols[f"{k}_mean"] = np.asarray(v, np.float64).mean(1)
    return cols


# --- request-stream systems (input_kind "streams") ------------------------------------------

# Stream values a stream sweep may vary besides HARDWARE_KEYS and params keys.
STREAM_KEYS = ("rate",)
# per-stream metrics averaged over a point's streams
MEAN_METRICS = ("throughput_tok_s", "itl_mean_s", "ttft_mean_s")


@dataclasses.dataclass(frozen=True)
class Serving:
    """The request streams of a stream sweep (002 §5)."""

    rate: float | None
    workload: str
    streams: int
    requests: int
    seed: int


def check_stream_keys(setup, entry, keys: list[str],
                      serving: Serving) -> tuple[list[str], list[str]]:
    """(params keys, hardware keys) of a stream sweep; ConfigError naming the allowed keys."""
    _, params = entry.from_policy(setup.platform, setup.model, setup.policy.options_table(),
                                  serving.requests)
    pkeys = params_keys(params)
    allowed = [*STREAM_KEYS, *pkeys, *HARDWARE_KEYS]
    for k in keys:
        if k not in allowed:
            raise ConfigError(f"--vary {k}: not a value system {setup.policy.system!r} can "
                              f"sweep; allowed keys: {', '.join(allowed)}")
    if "rate" not in keys and serving.rate is None:
        raise ConfigError(f"--rate: policy {setup.policy.name!r} serves Poisson request "
                          "streams; give --rate R (requests/s) or --vary rate=LO:HI:N")
    return [k for k in keys if k in pkeys], [k for k in keys if k in HARDWARE_KEYS]


def _platform_groups(points, hw_keys, n):
    """(index of each point's platform group [P], one value dict per group)."""
    if not hw_keys:
        return np.zeros(n, np.int64), [{}]
    table = np.stack([points[k] for k in hw_keys], 1)
    uniq, group = np.unique(table, axis=0, return_inverse=True)
    return group.reshape(-1), [dict(zip(hw_keys, (float(v) for v in row), strict=True))
                               for row in uniq]


def run_streams(setup, entry, points: dict[str, np.ndarray], serving: Serving, *,
                progress=None) -> dict[str, np.ndarray]:
    """Per-stream metrics [P, S] of every design point (1-D metrics and `itl_hist`
    [P, S, H]); `progress(text)` hears how far each engine call is."""
    pkeys, hw_keys = check_stream_keys(setup, entry, list(points), serving)
    n, s_ = len(next(iter(points.values()))), serving.streams
    rates = points["rate"] if "rate" in points else np.full(n, serving.rate)
    if not np.all(rates > 0):
        raise ConfigError("--vary rate: every rate must be > 0 requests/s")
    k_stream, k_sim = serve.stream_keys(serving.seed)
    by_rate = {float(r): serve.streams(k_stream, num_streams=s_, num_requests=serving.requests,
                                       rate_per_s=float(r), workload=serving.workload)
               for r in np.unique(rates)}
    keys = jax.random.key_data(jax.random.split(k_sim, s_))
    group, hws = _platform_groups(points, hw_keys, n)
    built = [entry.from_policy(with_platform_values(setup.platform, hw) if hw else
                               setup.platform, setup.model, setup.policy.options_table(),
                               serving.requests) for hw in hws]
    programs: dict = {}  # System -> the points it runs (one engine call each)
    for p in range(n):
        programs.setdefault(built[int(group[p])][0], []).append(p)
    rows: list = [None] * n
    cat = functools.partial(jax.tree_util.tree_map, lambda *xs: np.concatenate(xs))
    for system, idx in programs.items():
        params = []
        for p in idx:  # each point's params, the swept values set, one row per stream
            pp = built[int(group[p])][1].replace(
                **{k: np.float32(points[k][p]) for k in pkeys})
            params.append(jax.tree_util.tree_map(
                lambda x: np.broadcast_to(np.asarray(x), (s_, *np.shape(x))), pp))
        out = engine.simulate(
            system, cat(*params), cat(*[by_rate[float(rates[p])] for p in idx]),
            keys=jax.random.wrap_key_data(np.tile(np.asarray(keys), (len(idx), 1))),
            params_batched=True, progress=progress)
        out = jax.tree_util.tree_map(np.asarray, out)
        for j, p in enumerate(idx):
            rows[p] = jax.tree_util.tree_map(lambda x, j=j: x[j * s_:(j + 1) * s_], out)
    return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *rows)


def summarize_streams(points: dict[str, np.ndarray], out: dict[str, np.ndarray]) -> dict:
    """Tidy columns, one row per design point: the swept values; the stream means of
    throughput, mean ITL and mean TTFT; ITL p99 of the point's streams pooled (the upper
    edge of the histogram bin holding it, as `moejax simulate` reports it)."""
    cols = {k: np.asarray(v) for k, v in points.items()}
    for k in MEAN_METRICS:
        cols[k] = np.asarray(out[k], np.float64).mean(1)
    cols["itl_p99_s"] = np.array([p99_from_hist(h.sum(0)) for h in np.asarray(out["itl_hist"])])
    cols["all_done"] = np.asarray(out["all_done"]).all(1)
    return cols
