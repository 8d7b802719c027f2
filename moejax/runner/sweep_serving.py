"""`moejax sweep` for the stream-serving systems (002 AMoE: `aep`, `ep_serving`).

These run Poisson request streams (002 §5: `--rate`, `--workload`, `--streams`,
`--requests`) instead of routing traces, so a design point is (platform values, policy
params, arrival rate) and its metrics are per stream: throughput, mean ITL, ITL p99 (from
the streams' pooled ITL histogram, 002 Fig. 9's metric), mean TTFT. Every design point
runs the same streams (common random numbers: the same arrivals per rate, the same routing
keys), so points differ only by the swept values.

How a point runs:
- `aep` (AEP, 002 §3): the exact simulation in rounds (`systems.amoe.rounds`, equal to the
  numba event core). A point's platform values and `decay` (Algorithm 1's delta) enter the
  rounds simulation only as per-configuration arrays (`rounds.Consts`: layer-cost
  coefficients, link latencies and per-token times, KV capacity) and per-stream values, so
  every (point, stream) pair is one row of ONE vmapped call: Consts are built on the host per
  distinct platform point (`make_config`, NumPy) and batched with the streams. A value that
  changes the compiled shapes (`rounds.Spec`: e.g. the attention / expert split) is refused.
- `ep_serving` (synchronous EP serving, 002's baseline): its costs are NumPy float32
  constants inside the built System (`sync.make_config`), so one call per distinct
  platform point (one compile each), with every rate and stream of that point batched in it.
  Rate-only sweeps are one call.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np

from moejax.errors import ConfigError

# Stream values a serving sweep may vary besides HARDWARE_KEYS and params keys.
STREAM_KEYS = ("rate",)
# per-stream metrics averaged over a point's streams
MEAN_METRICS = ("throughput_tok_s", "itl_mean_s", "ttft_mean_s")


@dataclasses.dataclass(frozen=True)
class Serving:
    """The request streams of a serving sweep (002 §5)."""

    rate: float | None
    workload: str
    streams: int
    requests: int
    seed: int


def check_keys(setup, keys: list[str], serving: Serving) -> tuple[list[str], list[str]]:
    """(params keys, hardware keys) of a serving sweep; ConfigError naming the allowed keys."""
    from moejax.runner.sweep import HARDWARE_KEYS, params_keys
    from moejax.systems import SYSTEMS

    _, params = SYSTEMS[setup.policy.system].from_policy(
        setup.platform, setup.model, setup.policy.options_table(), serving.requests)
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


def _streams(serving: Serving, rates: np.ndarray):
    """Per distinct rate, the streams (the same key for each rate) and the routing keys."""
    from moejax.systems.amoe import serve

    k_stream, k_sim = jax.random.split(jax.random.key(serving.seed))
    by_rate = {float(r): serve.streams(k_stream, num_streams=serving.streams,
                                       num_requests=serving.requests, rate_per_s=float(r),
                                       workload=serving.workload) for r in np.unique(rates)}
    return by_rate, jax.random.split(k_sim, serving.streams)


def _platform_points(setup, points, hw_keys, n):
    """(index of each point's platform group [P], one value dict per group)."""
    if not hw_keys:
        return np.zeros(n, np.int64), [{}]
    table = np.stack([points[k] for k in hw_keys], 1)
    uniq, group = np.unique(table, axis=0, return_inverse=True)
    return group.reshape(-1), [dict(zip(hw_keys, (float(v) for v in row), strict=True))
                               for row in uniq]


def _build(setup, hw: dict, requests: int):
    from moejax.runner.sweep import with_platform_values
    from moejax.systems import SYSTEMS

    platform = with_platform_values(setup.platform, hw) if hw else setup.platform
    return SYSTEMS[setup.policy.system].from_policy(platform, setup.model,
                                                    setup.policy.options_table(), requests)


def run(setup, points: dict[str, np.ndarray], serving: Serving, *,
        progress=None) -> dict[str, np.ndarray]:
    """Per-stream metrics [P, S] of every design point (1-D metrics and `itl_hist`
    [P, S, H])."""
    pkeys, hw_keys = check_keys(setup, list(points), serving)
    n = len(next(iter(points.values())))
    rates = points["rate"] if "rate" in points else np.full(n, serving.rate)
    if not np.all(rates > 0):
        raise ConfigError("--vary rate: every rate must be > 0 requests/s")
    by_rate, keys = _streams(serving, rates)
    group, hws = _platform_points(setup, points, hw_keys, n)
    built = [_build(setup, hw, serving.requests) for hw in hws]
    if setup.policy.system == "aep":
        return _run_aep(built, group, points, pkeys, rates, by_rate, keys, hw_keys, progress)
    return _run_scan(built, group, points, pkeys, rates, by_rate, keys, progress)


def _rows(tree, n_pts: int, s: int):
    return jax.tree_util.tree_map(lambda x: np.asarray(x).reshape(n_pts, s, *np.shape(x)[1:]),
                                  tree)


def _run_aep(built, group, points, pkeys, rates, by_rate, keys, hw_keys, progress):
    """Every (point, stream) as one row of one vmapped rounds call (Consts batched)."""
    from moejax.errors import MoejaxError
    from moejax.systems.amoe import aep, rounds

    n, s_ = len(rates), len(keys)
    cfgs = [aep.CONFIGS[system] for system, _ in built]
    rows_cs, rows_st, spec0, made = [], [], None, {}
    for p in range(n):  # host set-up: one from_aep per (platform point, rate)
        g, r = int(group[p]), float(rates[p])
        if (g, r) not in made:
            made[g, r] = rounds.from_aep(cfgs[g], by_rate[r], keys, float(built[g][1].decay))
        spec, cs, st = made[g, r]
        if spec0 is None:
            spec0 = spec
        elif spec != spec0:
            raise ConfigError(f"--vary {', '.join(hw_keys)}: these values change the simulated "
                              "layout (attention / expert GPUs, slots), which an AEP sweep "
                              "holds fixed; sweep a narrower range")
        if "decay" in pkeys:
            st = st.replace(decay=np.full(s_, points["decay"][p], np.float32))
        rows_cs.append(jax.tree_util.tree_map(lambda x: np.broadcast_to(x, (s_, *np.shape(x))),
                                              cs))
        rows_st.append(st)
    cat = functools.partial(jax.tree_util.tree_map, lambda *xs: np.concatenate(xs))
    cs, st = cat(*rows_cs), cat(*rows_st)
    mask = np.concatenate([np.asarray(by_rate[float(r)].mask, bool) for r in rates])
    ini, adv = _aep_compiled(spec0)
    say = progress or (lambda text: None)
    say("compiling")
    state = ini(st)
    limit = 0
    while True:
        limit += 1 << 16
        state = adv(cs, st, state, limit)
        stop = np.asarray(state.stop)
        say(f"{int(np.asarray(state.events).sum())} events simulated, {int(stop.sum())} of "
            f"{stop.size} streams done")
        if stop.all():
            break
        if int(np.asarray(state.events).max()) >= 50_000_000:
            raise MoejaxError("aep sweep: streams not done after 50,000,000 events; lower "
                              "the load")
    if np.asarray(state.overflow).any():
        raise MoejaxError(f"slots = {spec0.slots}: more requests held KV at once")
    _, out = rounds._finisher(spec0, cfgs[0])(state, st, mask)
    return _rows(out, n, s_)


@functools.lru_cache(maxsize=8)
def _aep_compiled(spec):
    """(init, advance) of the rounds simulation vmapped over rows, Consts batched with them
    (`rounds.compiled(batched=True)` shares one Consts)."""
    from moejax.systems.amoe import rounds

    ini = jax.vmap(functools.partial(rounds.init, spec))
    # named axis: the round loops run on one predicate for every row (`rounds.advance`)
    adv = jax.vmap(functools.partial(rounds.advance, spec, axis="streams"),
                   in_axes=(0, 0, 0, None), axis_name="streams")
    return jax.jit(ini), jax.jit(adv, donate_argnums=2)


def _run_scan(built, group, points, pkeys, rates, by_rate, keys, progress):
    """ep_serving: one `runner.run_streams` call per platform point, its (rate, stream)
    rows batched (params batched with them)."""
    from moejax.systems.amoe import runner

    n, s_ = len(rates), len(keys)
    parts: dict[int, dict] = {}
    for g, (system, params) in enumerate(built):
        idx = np.flatnonzero(group == g)
        streams = jax.tree_util.tree_map(
            lambda *xs: np.concatenate(xs), *[by_rate[float(rates[p])] for p in idx])
        ks = jax.random.wrap_key_data(np.tile(np.asarray(jax.random.key_data(keys)),
                                              (len(idx), 1)))
        m = len(idx) * s_
        pb = jax.tree_util.tree_map(lambda x, m=m: np.broadcast_to(np.asarray(x), (m,)), params)
        pb = pb.replace(**{k: np.repeat(points[k][idx], s_).astype(np.float32) for k in pkeys})
        out = runner.run_streams(system, pb, streams, keys=ks, params_batched=True,
                                 progress=progress, backend="scan")
        out = _rows(out, len(idx), s_)
        for j, p in enumerate(idx):
            parts[int(p)] = jax.tree_util.tree_map(lambda x, j=j: x[j], out)
    return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *[parts[p] for p in range(n)])


def summarize(points: dict[str, np.ndarray], out: dict[str, np.ndarray]) -> dict:
    """Tidy columns, one row per design point: the swept values; the stream means of
    throughput, mean ITL and mean TTFT; ITL p99 of the point's streams pooled (the upper
    edge of the histogram bin holding it, as `moejax simulate` reports it)."""
    from moejax.cli.amoe import p99_from_hist

    cols = {k: np.asarray(v) for k, v in points.items()}
    for k in MEAN_METRICS:
        cols[k] = np.asarray(out[k], np.float64).mean(1)
    cols["itl_p99_s"] = np.array([p99_from_hist(h.sum(0)) for h in np.asarray(out["itl_hist"])])
    cols["all_done"] = np.asarray(out["all_done"]).all(1)
    return cols
