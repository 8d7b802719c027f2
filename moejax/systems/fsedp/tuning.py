"""What `moejax tune --system fsedp` tunes in FSE-DP (000): the micro-slice count, Algorithm
2's theta_min and slack, and the hardware knobs of 000 §VI-D under its Eq. (1)-(2) budget
(`budget`).
"""

from __future__ import annotations

import dataclasses
import itertools

import jax.numpy as jnp
import numpy as np

from moejax import tunable as fam
from moejax.errors import ConfigError
from moejax.system import TuneSetup
from moejax.systems.fsedp import budget as hwb
from moejax.systems.fsedp import config as fcfg
from moejax.systems.fsedp import system as fsys

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


def setup(platform, model, policy, num_iterations, names, capacity=0,
          budget=None) -> TuneSetup:
    """FSE-DP (moejax.systems.fsedp): the micro-slice count per expert (000 §IV-C, §VI-D),
    an integer in `microslice_range` read through relax.round (a fractional count at
    tau > 0); and Algorithm 2's cold-expert threshold theta_min and QoS slack (in [0.05, 1]),
    traced `FSEDPParams` fields that `buffering.plan_iteration` compares through relax.step
    (a policy with token buffering, e.g. `fsedp-buffered`). theta_min is an integer knob in
    [0, 16] tokens: token counts are integers, so a real threshold acts as its ceiling and
    nothing is lost; relaxed, it is the fractional value the soft comparisons read.

    Hardware knobs (000 §VI-D, Fig. 16): the die's weight buffer `weight_buffer_bytes`, its
    DDR bandwidth `ddr_Bps` and the D2D link bandwidth `link_Bps`, traced `FSEDPParams`
    fields, each a `LogKnob` over the box of `moejax.systems.fsedp.budget` (the buffer at least
    what the micro-slice slots need), under the area / power budget of Eq. (1)-(2)
    (`budget`, a `ChipletBudget`; its penalty joins the loss, its projection the rounding).

    Baselines: the hard-mode grid over the tuned families (GRID_POINTS micro-slice counts,
    THETA_GRID, SLACK_GRID, hardware.GRID_POINTS geometric values per hardware knob; the
    product when several are tuned; only points within the budget)."""
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

    def options(hard):  # ddr_Bps / link_Bps have no policy key: `platform_values` carry them
        return {k: float(v) for k, v in hard.items() if k not in ("ddr_Bps", "link_Bps")}

    def platform_values(hard):
        if not {"ddr_Bps", "link_Bps"} & set(hard):
            return None
        return {"ddr_Bps": hard.get("ddr_Bps"), "link_Bps": hard.get("link_Bps")}

    made = TuneSetup(system, base, families, apply, {k: defaults[k] for k in names},
                   lambda load_e: grid(), options, constraint=constraint,
                   platform_values=platform_values)
    return dataclasses.replace(made, baselines=lambda load_e: made.feasible_grid(grid()))
