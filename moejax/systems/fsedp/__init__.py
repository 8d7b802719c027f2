"""FSE-DP (paper 000, "Expert Streaming") on multi-chiplet packages, with EP / Hydra baselines.

config: FSEDPConfig / FSEDPParams, ablation switches A1-A5 (§VI-C).
layer: one MoE layer, Algorithm 1 + Rules 1-5 as an event-driven scan (A1: `naive_layer`).
buffering: Algorithm 2 token buffering across iterations.
system: the init / step / finish System over iterations; policy adapters.
hydra: EP and Hydra baselines with on-chip memory accounting.
reference: plain-Python event loop of the layer rules (tests).
"""

from moejax.systems.fsedp import buffering, config, hydra, layer, reference, system
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
    "ABLATIONS", "FSEDPConfig", "FSEDPParams", "build", "buffering", "check_options", "config",
    "default_params", "from_policy", "hydra", "layer", "make_config", "min_microslices",
    "reference", "system",
]
