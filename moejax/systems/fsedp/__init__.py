"""FSE-DP (paper 000, "Expert Streaming") on multi-chiplet packages, with EP / Hydra baselines.

config: FSEDPConfig / FSEDPParams, ablation switches A1-A5 (§VI-C).
layer: one MoE layer, Algorithm 1 + Rules 1-5 as an event-driven scan (A1: `naive_layer`).
buffering: Algorithm 2 token buffering across iterations.
system: the init / step / finish System over iterations; policy adapters.
hydra: EP and Hydra baselines with on-chip memory accounting.
tuning: what `moejax tune` changes (micro-slices, Algorithm 2 knobs, hardware under the
budget of 000 Eq. (1)-(2), `budget`).
reference: plain-Python event loop of the layer rules (tests).
"""

from moejax.system import SystemEntry, Tuning
from moejax.systems.fsedp import buffering, config, hydra, layer, reference, system, tuning
from moejax.systems.fsedp.config import (
    ABLATIONS,
    FSEDPConfig,
    FSEDPParams,
    default_params,
    make_config,
    min_microslices,
)
from moejax.systems.fsedp.system import build, check_options, from_policy

__all__ = [
    "ABLATIONS", "ENTRY", "FSEDPConfig", "FSEDPParams", "HYDRA_ENTRY", "build", "buffering",
    "check_options", "config",
    "default_params", "from_policy", "hydra", "layer", "make_config", "min_microslices",
    "reference", "system", "tuning",
]

ENTRY = SystemEntry(
    "fsedp", "000 FSE-DP: expert streaming over the chiplets of a package",
    system.from_policy, system.check_options, ("chiplet",),
    tuning=Tuning(("num_microslices", "theta_min", "slack", "weight_buffer_bytes", "ddr_Bps",
                   "link_Bps"), tuning.setup, budget=True,
                  help="num_microslices, theta_min, slack, and the hardware knobs "
                  "weight_buffer_bytes, ddr_Bps, link_Bps"),
    study="fsedp", default_policy="fsedp")
HYDRA_ENTRY = SystemEntry(
    "hydra", "000 §VI-A baseline: Hydra on the same chiplet package",
    hydra.from_policy, hydra.check_options, ("chiplet",), study="fsedp",
    default_policy="hydra")
