"""What `moejax tune --system dysharp` tunes (moejax extension; 004 tunes nothing, spec §6).

Families (`moejax.tunable`), each read by `system._layer` as a traced `DyParams` field:

placement    expert -> GPU share matrix [E, G], at most E / G experts per GPU (a Sinkhorn
             plan while relaxed). Co-locating co-activated experts lowers R_n, the distinct
             remote GPUs of a token, which every primitive's bytes depend on (spec §2);
             the hit probability 1 - prod_j (1 - P[e_nj, d]) is smooth in P (`traffic`).
comm_sms     SMs of the comm kernels (coarse, fine and fused schedules: FasterMoE, Tutel,
             COMET, CCFuser, DySHARP-COMET, DySHARP, fusion-only): below COMM_SMS the ports
             drain slower (`config.comm_rate_of`), above it the GEMMs get fewer SMs
             (`gemm_share_of`; compute-bound GEMMs only).
tile_tokens  GEMM / pipeline tile height: padding to whole tiles and pipeline fill grow with
             it, tiles below WGMMA_M rows waste tensor-core rows (004 §VII-C, Fig. 30).
chunks       pipeline degree of the coarse schedule (FasterMoE, Tutel): the baselines' knob,
             tuned as hard as DySHARP's.

Integer knobs are fractional while relaxed (each enters the layer time continuously) and
rounded to the nearest integer for the hard evaluation. Baselines: contiguous, round-robin
and greedy-balanced placements; hard grids over each integer knob.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from moejax import tunable as fam
from moejax.errors import ConfigError
from moejax.system import TuneSetup
from moejax.systems.dysharp import system

PARAMS = ("placement", "comm_sms", "tile_tokens", "chunks")
# knob ranges: SMs up to half of an H100's 132 (COMET / DeepEP use 20-24); tiles 16..256
# rows (004 Fig. 30 sweeps 32..256); pipeline degree 1..16 (Tutel's adaptive set {1,2,4,8}
# and twice its largest)
COMM_SMS_RANGE = (1, 64)
TILE_RANGE = (16, 256)
CHUNKS_RANGE = (1, 16)
COMM_SMS_GRID = (4, 8, 12, 16, 20, 24, 32, 48)
TILE_GRID = (32, 64, 128, 256)
CHUNKS_GRID = (1, 2, 4, 8, 16)


def setup(platform, model, policy, num_iterations, names, capacity=0, num_layers=0):
    """The `moejax.system.TuneSetup` of a DySHARP-family policy (any of its 12).
    `num_layers` > 0: one placement per trace layer (`--per-layer`; the switch's
    OutPort = ID / epg rule then needs a relabelling of expert ids per layer)."""
    sys_, base = system.from_policy(platform, model, policy.options_table(), num_iterations)
    opts, _, _ = system._read_options(policy.options_table())
    cfg = system.make_config(platform, model, **opts)
    if "comm_sms" in names and not cfg.overlapped:
        raise ConfigError(f"param comm_sms: policy {policy.name!r} has schedule = "
                          f"{cfg.schedule!r}, whose comm kernels do not share SMs with GEMMs; "
                          "allowed: a coarse, fine or fused policy (tutel, comet, dysharp, ...)")
    if "chunks" in names and cfg.schedule != "coarse":
        raise ConfigError(f"param chunks: policy {policy.name!r} has schedule = "
                          f"{cfg.schedule!r}; allowed: a coarse policy (fastermoe, tutel)")
    e, g = model.num_experts, platform.num_devices
    cap = capacity or -(-e // g)
    lead = (num_layers,) if num_layers else ()
    every = {"placement": fam.Placement(e, g, cap, num_layers=num_layers),
             "comm_sms": fam.IntegerKnob("comm_sms", *COMM_SMS_RANGE),
             "tile_tokens": fam.IntegerKnob("tile_tokens", *TILE_RANGE),
             "chunks": fam.IntegerKnob("chunks", *CHUNKS_RANGE)}
    families = {k: every[k] for k in names}
    defaults = {"placement": np.broadcast_to(np.asarray(base.placement).argmax(-1),
                                             (*lead, e)),
                "comm_sms": int(cfg.comm_sms), "tile_tokens": int(cfg.tile_tokens),
                "chunks": int(cfg.chunks[0])}

    def apply(base, values, tau):
        def knob(k):
            return None if k not in values else jnp.asarray(values[k], jnp.float32)

        return base.replace(placement=values.get("placement", base.placement),
                            comm_sms=knob("comm_sms"), tile_tokens=knob("tile_tokens"),
                            chunks=knob("chunks"), tau=jnp.asarray(tau, jnp.float32))

    def baselines(load_e):
        out = {}
        if "placement" in names:
            load = np.asarray(load_e, np.float64)
            load = np.broadcast_to(load, (*lead, e)) if load.ndim == 1 and lead else load
            greedy = (np.stack([fam.greedy_balanced_ids(x, g, cap) for x in load]) if lead
                      else fam.greedy_balanced_ids(load, g, cap))
            out.update({"contiguous": {"placement": np.broadcast_to(
                            fam.contiguous_ids(e, g), (*lead, e))},
                        "round-robin": {"placement": np.broadcast_to(
                            fam.round_robin_ids(e, g), (*lead, e))},
                        "greedy-balanced": {"placement": greedy}})
        grids = {"comm_sms": COMM_SMS_GRID, "tile_tokens": TILE_GRID, "chunks": CHUNKS_GRID}
        for k, grid in grids.items():
            if k in names:
                out.update({f"grid {k}={v}": {k: v} for v in grid})
        return out

    def options(hard):
        out = {}
        if "placement" in hard:
            out["placement"] = np.asarray(hard["placement"]).astype(int).tolist()
        for k in ("comm_sms", "tile_tokens"):
            if k in hard:
                out[k] = int(hard[k])
        if "chunks" in hard:
            out["chunks"] = [int(hard["chunks"])]
        return out

    return TuneSetup(sys_, base, families, apply, {k: defaults[k] for k in names}, baselines,
                 options, layer_loads=bool(num_layers))
