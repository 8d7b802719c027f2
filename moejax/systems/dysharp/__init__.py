"""004 DySHARP: in-switch multicast / reduction and token-centric fusion on NVLink switches,
with its baselines (DeepEP, NVLS, FasterMoE, Tutel, CCFuser, COMET, DualPipe) beside it."""

from moejax.system import SystemEntry, Tuning
from moejax.systems.dysharp import system, tuning

# per-token routing, switch platforms
ENTRY = SystemEntry(
    "dysharp", "004 DySHARP and its NVLink-switch baselines (DeepEP, NVLS, COMET, ...)",
    system.from_policy, system.check_options, ("gpu",), needs_tokens=True,
    tuning=Tuning(tuning.PARAMS, tuning.setup, per_layer=True),
    study="dysharp", default_policy="dysharp")
