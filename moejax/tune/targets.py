"""What each system exposes to tuning: its parameter families and how values enter params.

A `Target` builds, from a platform, a model and a base policy, a `Setup`: the system, its
base params, the tunable families by name, how to put (relaxed or hard) values into the
params at a temperature, the paper's default values, baseline heuristics, and how hard
values become policy options (for `export`). `TARGETS` maps a policy `system` key to its
target; systems without an entry cannot be tuned yet.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from moejax import relax
from moejax.errors import ConfigError, UnknownNameError
from moejax.system import System
from moejax.tune import params as fam


@dataclasses.dataclass(frozen=True, eq=False)
class Setup:
    """One system ready to tune.

    families: name -> family (`moejax.tune.params`).
    apply(base, values, tau) -> params: `values` name -> array (relaxed, or `as_value` of
      a hard value); tau: the system's relaxation temperature (0 = hard mode).
    defaults: name -> hard value of the base policy (the paper's default).
    baselines(load_e) -> {heuristic name: {name: hard value}}; load_e [E] expected tokens.
    options(hard) -> policy [options] overrides for `export`.
    expected(values, traces, tau) -> per-trace latency_s [T], or None: the system's
      latency with placements read as distributions (expected per-device work), equal to
      the system's own latency in hard mode for one-hot placements (see `_ep_expected`).
    constraint: a joint constraint over several families, or None: `penalty(values, tau)`
      added to the loss, `project(hard) -> hard` applied when rounding, `report(hard)` in
      summaries (`moejax.tune.hardware.BudgetConstraint`, 000 Eq. (1)-(2)).
    platform_text(hard, header) -> TOML text of a derived platform, or None when the policy
      alone carries the tuned values (hardware knobs a policy has no key for).
    family_tau_field: a params field that takes the family temperature while tuning (the
      wafer Eq. 2 gate, `tau_trigger`), when the system's `tau` is the system temperature.
    """

    system: System
    base: object
    families: dict
    apply: Callable
    defaults: dict
    baselines: Callable
    options: Callable
    expected: Callable | None = None
    constraint: object | None = None
    platform_text: Callable | None = None
    family_tau_field: str | None = None
    # a structural integer knob (the wafer shadow-slot count): its name and one (System,
    # base params) per integer value lo..hi of its family, built separately
    structural: str | None = None
    variants: tuple = ()
    # baselines take per-layer loads [L, E] (placements with a layer axis) instead of [E]
    layer_loads: bool = False

    def system_for(self, hard: dict):
        """(System, base params) that evaluate hard values (the variant of a structural
        knob's value, else the setup's own)."""
        if self.structural is None or self.structural not in hard:
            return self.system, self.base
        f = self.families[self.structural]
        return self.variants[int(hard[self.structural]) - f.lo]

    def as_values(self, hard: dict) -> dict:
        """Hard values as the arrays `apply` takes."""
        out = {}
        for k, v in hard.items():
            f = self.families[k]
            out[k] = f.as_value(v) if hasattr(f, "as_value") else jnp.float32(v)
        return out

    def feasible_grid(self, grid: dict) -> dict:
        """The rows of a baseline grid that satisfy `constraint` (all without one)."""
        if self.constraint is None:
            return grid
        return {k: v for k, v in grid.items() if self.constraint.feasible(v)}


@dataclasses.dataclass(frozen=True)
class Target:
    system: str
    params: tuple[str, ...]
    build: Callable  # (platform, model, policy, num_iterations, names, capacity) -> Setup


def _ep_setup(platform, model, policy, num_iterations, names, capacity=0,
              num_layers=0) -> Setup:
    """Synchronous EP (moejax.systems.ep). `placement`: one device per expert (no replicas,
    the policy format's `placement = [device id per expert]`), at most `capacity` experts
    per device (default: ceil(E / D), the memory EP sizes each device for). `replicas`
    (`params.ReplicaPlacement`): experts replicated into `capacity` slots per device
    (default ceil(E / D) + 1: one redundant slot, DeepSeek-V3's prefill deployment) with
    learned token shares; exported as replica device lists and `replica_shares`.
    `num_layers` > 0: one placement per trace layer (as EPLB plans them). Baselines:
    contiguous, round-robin, greedy (per layer when per-layer) and, for replicas, EPLB
    (`moejax.placement.eplb`, global) at the same slot budget."""
    from moejax.placement import eplb, slots
    from moejax.systems import ep

    if {"placement", "replicas"} <= set(names):
        raise ConfigError("param: placement and replicas are alternatives; tune one")
    system, base = ep.from_policy(platform, model, policy.options_table(), num_iterations)
    e, d = model.num_experts, platform.num_devices
    cap = capacity or -(-e // d)
    rep_slots = capacity or slots.slots_per_device(e, d, 1)
    families = {"placement": fam.Placement(e, d, cap, num_layers=num_layers),
                "replicas": fam.ReplicaPlacement(e, d, rep_slots, num_layers=num_layers)}
    default_ids = np.asarray(base.placement).argmax(-1)
    if num_layers:
        default_ids = np.broadcast_to(default_ids, (num_layers, e))
    lead = (num_layers,) if num_layers else ()

    def apply(base, values, tau):
        v = values.get("replicas", values.get("placement", base.placement))
        return base.replace(placement=v["shares"] if isinstance(v, dict) else v,
                            tau=jnp.asarray(tau, jnp.float32))

    def per_layer(load):
        load = np.asarray(load, np.float64)
        return np.broadcast_to(load, (*lead, e)) if load.ndim == 1 else load

    def baselines(load_e):
        load = per_layer(load_e)
        greedy = (np.stack([fam.greedy_balanced_ids(x, d, cap) for x in load]) if num_layers
                  else fam.greedy_balanced_ids(load, d, cap))
        ids = {"contiguous": np.broadcast_to(fam.contiguous_ids(e, d), (*lead, e)),
               "round-robin": np.broadcast_to(fam.round_robin_ids(e, d), (*lead, e)),
               "greedy-balanced": greedy}
        if "replicas" not in names:
            return {k: {"placement": v} for k, v in ids.items()}
        out = {k: {"replicas": np.eye(d)[v]} for k, v in ids.items()}
        w = load.reshape(-1, e)
        phy2log, _, _ = eplb.rebalance(w, rep_slots * d, 1, 1, d, "global")
        out[f"eplb ({rep_slots} slots)"] = {"replicas": np.asarray(
            slots.layout_shares(phy2log, e, d)).reshape(*lead, e, d)}
        return out

    def options(hard):
        if "placement" in hard:
            return {"placement": np.asarray(hard["placement"]).tolist()}
        p = np.asarray(hard["replicas"])

        def lists(q):  # [E, D] -> replica device lists and their shares
            devs = [np.flatnonzero(row > 0).tolist() for row in q]
            return devs, [[float(row[x]) for x in ds] for row, ds in zip(q, devs, strict=True)]

        pairs = [lists(q) for q in p] if num_layers else [lists(p)]
        devs, shares = [x[0] for x in pairs], [x[1] for x in pairs]
        return ({"placement": devs, "replica_shares": shares} if num_layers
                else {"placement": devs[0], "replica_shares": shares[0]})

    opts = {k: v for k, v in dict(policy.options).items()
            if k in ("attention", "tp_size", "context_len")}
    cfg = ep.make_config(platform, model, **opts)
    defaults = {"placement": default_ids, "replicas": np.eye(d)[default_ids]}
    return Setup(system, base, {k: families[k] for k in names}, apply,
                 {k: defaults[k] for k in names}, baselines, options,
                 functools.partial(_ep_expected, cfg, base), layer_loads=bool(num_layers))


def _ep_expected(cfg, base, values, traces, tau):
    """Mean MoE-layer latency per trace [T] of synchronous EP, the placement [(L,) E, D] read
    as a distribution over devices (each expert on one device; rows are probabilities).

    EP's own relaxed mode reads a fractional placement as replicas that split an expert's
    tokens (each replica pays a weight load), which makes any spread cost more than a move
    and pins a tuned placement to its start. Here device d's expert time is the expectation
    sum_e P[e, d] * w_e, with w_e = EP's hard time of expert e with all its tokens
    (`ep.expert_time_s` on a diagonal), and the dispatch / combine traffic is EP's own
    (`ep.layer_demand`, linear in P); the slowest device and the all-to-all use EP's rules
    at temperature tau. For a one-hot P this equals `ep.moe_layer` in hard mode (tested).

    Replicas (`values["replicas"]`, a `ReplicaPlacement` value): device d runs
    sum_e Y[e, d] max(compute(n_e r[e, d]), positive(n_e r[e, d]) * weight load), each of
    its (relaxed) replicas with its share of the tokens and its own weight load, the
    traffic from the shares P; for a 0/1 occupancy this is `ep.moe_layer` in hard mode.
    """
    from moejax import relax as rx
    from moejax.physics import collectives
    from moejax.physics.roofline import compute_time_s, memory_time_s
    from moejax.systems import ep

    rep = values.get("replicas")
    place = rep["shares"] if rep is not None else values["placement"]
    tau = jnp.asarray(tau, jnp.float32)
    tau_s = tau * ep.time_scale_s(cfg)
    m, dev = cfg.model, cfg.platform.device

    def busy_of(counts, p, occ, per):
        if occ is None:
            w_e, _ = ep.expert_time_s(cfg, jnp.diag(counts), 0.0)  # [E] hard, all tokens
            return p.T @ w_e
        tok = counts[:, None] * per  # [E, D] tokens of one replica
        comp = compute_time_s(tok * m.expert_flops_per_token, dev.flops(cfg.dtype))
        mem = memory_time_s(rx.positive(tok, tau) * m.expert_weight_bytes, dev.memory_Bps)
        return (occ * rx.maximum(comp, mem, tau_s)).sum(0)

    def layer(ids, mask, counts, p, occ, per):
        params = base.replace(placement=p, tau=tau)
        traffic, _ = ep.layer_demand(cfg, params, ids, mask, counts)
        n_tok = counts.sum() / cfg.model.top_k
        t_sh, _ = ep.shared_time_s(cfg, ep.owned_tokens(cfg, mask, n_tok), tau_s)
        busy = busy_of(counts, p, occ, per) + t_sh
        return (collectives.all_to_all_time_s(traffic, cfg.topo, tau_s)
                + relax.max(busy, tau_s)
                + collectives.all_to_all_time_s(traffic.T, cfg.topo, tau_s))

    occ = None if rep is None else rep["occupancy"]
    per = None if rep is None else rep["per_replica"]
    by_layer = place.ndim == 3

    def one_trace(tr):
        def iteration(ids, mask, counts):  # [L, N, K], [N], [L, E]
            if by_layer:
                lat = jax.vmap(lambda i, c, p, o, r: layer(i, mask, c, p, o, r))(
                    ids, counts, place, occ, per) if occ is not None else jax.vmap(
                    lambda i, c, p: layer(i, mask, c, p, None, None))(ids, counts, place)
            else:
                lat = jax.vmap(lambda i, c: layer(i, mask, c, place, occ, per))(ids, counts)
            return lat.mean(), (counts[0].sum() > 0).astype(jnp.float32)

        lat, real = jax.vmap(iteration)(tr.expert_ids, tr.token_mask, tr.counts)
        return (lat * real).sum() / jnp.maximum(real.sum(), 1.0)

    return jax.vmap(one_trace)(traces)


MAX_MICROSLICES = 16  # 000 §VI-D: latency vs count improves then worsens, "below 10 is preferred"


# Coarse hard-mode grids of the Algorithm 2 knobs (the exhaustive baseline of the issue).
THETA_GRID = (0, 1, 2, 3, 4, 6, 8, 12, 16)  # tokens
SLACK_GRID = (0.1, 0.2, 0.3, 0.5, 1.0)  # 000 §VI-A uses 10 / 20 / 30 %
THETA_RANGE = (0, 16)
SLACK_RANGE = (0.05, 1.0)
GRID_POINTS = 12  # micro-slice counts on the grid (every integer when the range is <= 12)


def microslice_range(lo: int) -> tuple[int, int]:
    """[lo, hi] of the micro-slice knob: up to 16 (000 §VI-D), or 2 lo when the buffer
    already forces more (a big expert, e.g. phi-3.5-moe on chiplet-2x2 needs >= 38)."""
    return lo, (MAX_MICROSLICES if lo < MAX_MICROSLICES else 2 * lo)


def _fsedp_setup(platform, model, policy, num_iterations, names, capacity=0,
                 budget=None) -> Setup:
    """FSE-DP (moejax.systems.fsedp): the micro-slice count per expert (000 §IV-C, §VI-D),
    an integer in `microslice_range` read through relax.round (a fractional count at
    tau > 0); and Algorithm 2's cold-expert threshold theta_min and QoS slack (in [0.05, 1]),
    traced `FSEDPParams` fields that `buffering.plan_iteration` compares through relax.step
    (a policy with token buffering, e.g. `fsedp-buffered`). theta_min is an integer knob in
    [0, 16] tokens: token counts are integers, so a real threshold acts as its ceiling and
    nothing is lost; relaxed, it is the fractional value the soft comparisons read.

    Hardware knobs (000 §VI-D, Fig. 16): the die's weight buffer `weight_buffer_bytes`, its
    DDR bandwidth `ddr_Bps` and the D2D link bandwidth `link_Bps`, traced `FSEDPParams`
    fields, each a `LogKnob` over the box of `moejax.tune.hardware` (the buffer at least
    what the micro-slice slots need), under the area / power budget of Eq. (1)-(2)
    (`budget`, a `ChipletBudget`; its penalty joins the loss, its projection the rounding).

    Baselines: the hard-mode grid over the tuned families (GRID_POINTS micro-slice counts,
    THETA_GRID, SLACK_GRID, hardware.GRID_POINTS geometric values per hardware knob; the
    product when several are tuned; only points within the budget)."""
    import itertools

    from moejax.systems.fsedp import config as fcfg
    from moejax.systems.fsedp import system as fsys
    from moejax.tune import hardware as hwb

    system, base = fsys.from_policy(platform, model, policy.options_table(), num_iterations)
    opts, _, _ = fsys._read_options(policy.options_table())
    cfg = fcfg.make_config(platform, model, **opts)
    if ({"theta_min", "slack"} & set(names)) and not cfg.token_buffering:
        raise ConfigError(f"param theta_min / slack: policy {policy.name!r} has no token "
                          "buffering (Algorithm 2); use a policy with ablation = 'A5', e.g. "
                          "--policy fsedp-buffered")
    lo, hi = microslice_range(max(1, fcfg.min_microslices(cfg)))
    m_min = lo if "num_microslices" in names else float(base.num_microslices)
    buf_lo = max(hwb.BUFFER_RANGE_BYTES[0],  # the slots of m_min micro-slices must fit
                 2 * fcfg.SLOTS_PER_RUNNING_EXPERT * model.expert_weight_bytes / m_min)
    every = {"num_microslices": fam.IntegerKnob("num_microslices", lo, hi),
             "theta_min": fam.IntegerKnob("theta_min", *THETA_RANGE),
             "slack": fam.Threshold("slack", *SLACK_RANGE),
             "weight_buffer_bytes": fam.LogKnob("weight_buffer_bytes", float(buf_lo),
                                                hwb.BUFFER_RANGE_BYTES[1]),
             "ddr_Bps": fam.LogKnob("ddr_Bps", *hwb.DDR_RANGE_BPS),
             "link_Bps": fam.LogKnob("link_Bps", *hwb.LINK_RANGE_BPS)}
    families = {k: every[k] for k in names}
    defaults = {"num_microslices": int(round(float(base.num_microslices))),
                "theta_min": int(np.ceil(cfg.theta_min)), "slack": float(cfg.slack),
                "weight_buffer_bytes": float(cfg.weight_buffer_bytes),
                "ddr_Bps": float(cfg.ddr_Bps), "link_Bps": float(cfg.link_Bps)}
    m_axis = np.unique(np.round(np.linspace(lo, hi, min(GRID_POINTS, hi - lo + 1))))
    axes = {"num_microslices": [int(m) for m in m_axis],
            "theta_min": list(THETA_GRID), "slack": list(SLACK_GRID)}
    hw_names = [k for k in hwb.KNOBS if k in names]
    constraint = None
    if hw_names:
        for k in hw_names:
            f = families[k]
            axes[k] = [float(np.float32(v)) for v in np.geomspace(f.lo, f.hi, hwb.GRID_POINTS)]
            f.init(None, defaults[k])  # the platform's value must lie in the box
        budget = hwb.ChipletBudget() if budget is None else budget
        constraint = hwb.BudgetConstraint(budget, cfg.num_devices, cfg.topo.num_links,
                                          {k: defaults[k] for k in hwb.KNOBS})
    elif budget is not None:
        raise ConfigError("budget: applies to the hardware params only "
                          f"({', '.join(hwb.KNOBS)}); none is tuned")

    def apply(base, values, tau):
        get = lambda k: jnp.asarray(values.get(k, defaults[k]), jnp.float32)  # noqa: E731
        hw = {k: get(k) for k in hw_names}  # others: None = the platform's values
        return base.replace(num_microslices=get("num_microslices"), theta_min=get("theta_min"),
                            slack=get("slack"), tau=jnp.asarray(tau, jnp.float32), **hw)

    def grid():
        keys = list(families)
        short = {"num_microslices": "m", "theta_min": "theta", "slack": "slack",
                 "weight_buffer_bytes": "buf_MiB", "ddr_Bps": "ddr_GBps", "link_Bps": "d2d_GBps"}
        scale = {"weight_buffer_bytes": hwb.MiB, "ddr_Bps": 1e9, "link_Bps": 1e9}
        out = {}
        for combo in itertools.product(*(axes[k] for k in keys)):
            label = ",".join(f"{short[k]}={v / scale.get(k, 1):.4g}"
                             for k, v in zip(keys, combo, strict=True))
            out[f"grid {label}"] = dict(zip(keys, combo, strict=True))
        return out

    def options(hard):  # ddr_Bps / link_Bps have no policy key: `platform_text` carries them
        return {k: float(v) for k, v in hard.items() if k not in ("ddr_Bps", "link_Bps")}

    def platform_text(hard, header):
        if not {"ddr_Bps", "link_Bps"} & set(hard):
            return None
        return hwb.platform_toml(platform, hard.get("ddr_Bps"), hard.get("link_Bps"), header)

    setup = Setup(system, base, families, apply, {k: defaults[k] for k in names},
                  lambda load_e: grid(), options, constraint=constraint,
                  platform_text=platform_text)
    return dataclasses.replace(setup, baselines=lambda load_e: setup.feasible_grid(grid()))


WAFER_ALPHA_RANGE = (0.01, 64.0)  # Eq. 2 alpha (summed layer imbalance), log-space box
WAFER_SLOTS_RANGE = (0, 4)  # shadow slots per device (001 §V-B/C; the grid's {0, 1, 2, 4})


def _wafer_setup(platform, model, policy, num_iterations, names, capacity=0) -> Setup:
    """Wafer-scale EP (moejax.systems.wafer, 001): the native expert placement [E, D]
    (`WaferParams.placement`, one-hot rows), at most `capacity` experts per device (default
    ceil(E / D)); the system's own relaxation reads a soft row as a split expert. And the
    NI-Balancer trigger alpha of 001 Eq. 2 (`WaferParams.alpha`, a positive `LogKnob` in
    WAFER_ALPHA_RANGE): the step's trigger is the gate `balancer.eq2_gate` at the family
    temperature (`WaferParams.tau_trigger`) and every balancer decision blends re-plan and
    keep with it (`system.build`), so the relaxed forward time (migration stalls included:
    use loss = 'forward') is differentiable in alpha; the layer runs at the system
    temperature (`--sim-tau-scale` times the family's). Export writes the policy's
    `placement` list and `alpha`. Baselines for alpha: the hard grid
    `zeroth.WAFER_ALPHA_GRID` and 'never balance' (alpha = 1e9).

    The shadow-slot count (001 §V-B/C, `WaferConfig.shadow_slots`, an `IntegerKnob` in
    WAFER_SLOTS_RANGE) is structural (the balancer's scan length): one System per value is
    built here (`Setup.variants`) and relaxation 'lattice' interpolates their hard runs
    (`loop.lattice_metrics`); tuned alone."""
    from moejax.systems.wafer import system as wsys
    from moejax.tune import zeroth

    system, base = wsys.from_policy(platform, model, policy.options_table(), num_iterations)
    e, d = model.num_experts, platform.num_devices
    cap = capacity or -(-e // d)
    every = {"placement": fam.Placement(e, d, cap),
             "alpha": fam.LogKnob("alpha", *WAFER_ALPHA_RANGE),
             "shadow_slots": fam.IntegerKnob("shadow_slots", *WAFER_SLOTS_RANGE)}
    families = {k: every[k] for k in names}
    opts, _ = wsys._read_options(policy.options_table())
    defaults = {"placement": np.asarray(base.placement).argmax(-1),
                "alpha": float(base.alpha), "shadow_slots": int(opts["shadow_slots"])}
    variants = ()
    if "shadow_slots" in names:  # static scan length: one System per slot count
        if opts["balancer"] == "none":
            raise ConfigError(f"param shadow_slots: policy {policy.name!r} has balancer = "
                              "'none' (nothing fills the slots); use e.g. --policy er-mapping")
        if len(names) > 1:
            raise ConfigError("param shadow_slots (a lattice over separately built systems) "
                              "is tuned alone; allowed: --param shadow_slots")
        variants = tuple(wsys.from_policy(platform, model, dataclasses.replace(
            policy, options=tuple(sorted({**dict(policy.options), "shadow_slots": n}.items()))
        ).options_table(), num_iterations) for n in range(WAFER_SLOTS_RANGE[0],
                                                          WAFER_SLOTS_RANGE[1] + 1))

    def apply(base, values, tau):
        return base.replace(placement=values.get("placement", base.placement),
                            alpha=jnp.asarray(values.get("alpha", base.alpha), jnp.float32),
                            tau=jnp.asarray(tau, jnp.float32))

    def baselines(load_e):
        out = {}
        if "placement" in names:
            out.update({"contiguous": {"placement": fam.contiguous_ids(e, d)},
                        "round-robin": {"placement": fam.round_robin_ids(e, d)},
                        "greedy-balanced": {"placement": fam.greedy_balanced_ids(load_e, d,
                                                                                 cap)}})
        if "alpha" in names:
            out.update({f"grid alpha={a:g}": {"alpha": a} for a in zeroth.WAFER_ALPHA_GRID})
            out["never (alpha = 1e9)"] = {"alpha": 1e9}
        if "shadow_slots" in names:
            out.update({f"grid shadow_slots={n}": {"shadow_slots": n}
                        for n in range(WAFER_SLOTS_RANGE[0], WAFER_SLOTS_RANGE[1] + 1)})
        return out

    def options(hard):  # the wafer policy's explicit placement: one device id per expert
        out = {}
        if "placement" in hard:
            out["placement"] = [int(x) for x in hard["placement"]]
        if "alpha" in hard:
            out["alpha"] = float(hard["alpha"])
        if "shadow_slots" in hard:
            out["shadow_slots"] = int(hard["shadow_slots"])
        return out

    return Setup(system, base, families, apply, {k: defaults[k] for k in names}, baselines,
                 options, family_tau_field="tau_trigger" if "alpha" in names else None,
                 structural="shadow_slots" if variants else None, variants=variants)


def _epsmoe_setup(*args, **kw) -> Setup:
    """EPS-MoE (003): pn, switch_rows, sm_comm, assignment (`moejax.systems.epsmoe.tuning`)."""
    from moejax.systems.epsmoe import tuning

    return tuning.setup(*args, **kw)


def _dysharp_setup(platform, model, policy, num_iterations, names, capacity=0, num_layers=0):
    """DySHARP and its baselines (moejax.systems.dysharp.tuning)."""
    from moejax.systems.dysharp import tuning

    return tuning.setup(platform, model, policy, num_iterations, names, capacity, num_layers)


TARGETS: dict[str, Target] = {
    "ep": Target("ep", ("placement", "replicas"), _ep_setup),
    "fsedp": Target("fsedp", ("num_microslices", "theta_min", "slack", "weight_buffer_bytes",
                              "ddr_Bps", "link_Bps"), _fsedp_setup),
    "wafer": Target("wafer", ("placement", "alpha", "shadow_slots"), _wafer_setup),
    "epsmoe": Target("epsmoe", ("pn", "switch_rows", "sm_comm", "assignment"), _epsmoe_setup),
    "dysharp": Target("dysharp", ("placement", "comm_sms", "tile_tokens", "chunks"),
                      _dysharp_setup),
}


# the base policy of `moejax tune --system S` when no --policy is given
DEFAULT_POLICY = {"ep": "ep", "fsedp": "fsedp", "wafer": "ep-baseline-map",
                  "aep": "aep-defrag", "epsmoe": "epsmoe-tune", "dysharp": "dysharp"}


def build_setup(policy, platform, model, num_iterations: int, names, capacity: int = 0,
                budget=None, num_layers: int = 0):
    """The Setup of `policy`'s system; errors name unknown systems or parameters. `budget`:
    a `moejax.tune.hardware.ChipletBudget` for the fsedp hardware params (None: default).
    `num_layers` > 0: one placement per trace layer (ep only)."""
    if policy.system not in TARGETS:
        raise UnknownNameError("tunable system", policy.system, TARGETS)
    target = TARGETS[policy.system]
    names = tuple(names)
    if not names:
        raise ConfigError(f"param: give at least one; allowed for {target.system}: "
                          f"{', '.join(target.params)}")
    for n in names:
        if n not in target.params:
            raise UnknownNameError(f"{target.system} parameter", n, target.params)
    if num_layers:
        if target.system not in ("ep", "dysharp"):
            raise ConfigError(f"per-layer placements: ep and dysharp only, not "
                              f"{target.system}")
        return target.build(platform, model, policy, num_iterations, names, capacity,
                            num_layers=num_layers)
    if budget is None:
        return target.build(platform, model, policy, num_iterations, names, capacity)
    if target.system != "fsedp":
        raise ConfigError(f"budget: only the fsedp hardware params take one, not "
                          f"{target.system}")
    return target.build(platform, model, policy, num_iterations, names, capacity, budget)
