"""What `moejax tune --system wafer` tunes in wafer-scale EP (001): the expert placement, the
NI-Balancer trigger alpha of Eq. 2, and the shadow-slot count (a structural knob)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from moejax import tunable as fam
from moejax.errors import ConfigError
from moejax.system import TuneSetup
from moejax.systems.wafer import system as wsys

WAFER_ALPHA_RANGE = (0.01, 64.0)  # Eq. 2 alpha (summed layer imbalance), log-space box
WAFER_SLOTS_RANGE = (0, 4)  # shadow slots per device (001 §V-B/C; the grid's {0, 1, 2, 4})
# hard-mode grid of alpha (a baseline here; `moejax.tune.zeroth.tune_wafer_alpha`'s grid)
WAFER_ALPHA_GRID = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)


def setup(platform, model, policy, num_iterations, names, capacity=0) -> TuneSetup:
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
    `WAFER_ALPHA_GRID` and 'never balance' (alpha = 1e9).

    The shadow-slot count (001 §V-B/C, `WaferConfig.shadow_slots`, an `IntegerKnob` in
    WAFER_SLOTS_RANGE) is structural (the balancer's scan length): one System per value is
    built here (`Setup.variants`) and relaxation 'lattice' interpolates their hard runs
    (`loop.lattice_metrics`); tuned alone."""
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
            out.update({f"grid alpha={a:g}": {"alpha": a} for a in WAFER_ALPHA_GRID})
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

    return TuneSetup(system, base, families, apply, {k: defaults[k] for k in names}, baselines,
                 options, family_tau_field="tau_trigger" if "alpha" in names else None,
                 structural="shadow_slots" if variants else None, variants=variants)
