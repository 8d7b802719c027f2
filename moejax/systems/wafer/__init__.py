"""001 MoEntwine: wafer-scale expert parallelism (ER / HER-Mapping, the NI-Balancer).

system: the init / step / finish System and policy adapters. tuning: what `moejax tune`
changes (placement, Eq. 2 alpha, shadow slots). placement, mapping, balancer: the mapping
and balancing rules; reference: plain-Python reference of the rules (tests).
"""

from moejax.system import SystemEntry, Tuning
from moejax.systems.wafer import system, tuning

ENTRY = SystemEntry(
    "wafer", "001 MoEntwine: wafer-scale EP with ER / HER-Mapping and the NI-Balancer",
    system.from_policy, system.check_options, ("wafer", "gpu"),
    tuning=Tuning(("placement", "alpha", "shadow_slots"), tuning.setup,
                  help="placement, alpha, shadow_slots (alone, --relaxation lattice)"),
    study="moentwine", default_policy="ep-baseline-map")
