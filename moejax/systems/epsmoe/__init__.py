"""EPS-MoE (paper 003): parallel modes, GEMM kernel switch, expert pipeline, SM split."""

from moejax.system import SystemEntry, Tuning
from moejax.systems.epsmoe import system, tuning

# one prefill forward on GPU nodes, with its TP+TP / DP+EP / TP+EP baselines
ENTRY = SystemEntry(
    "epsmoe", "003 EPS-MoE and its TP+TP / DP+EP / TP+EP baselines (prefill on GPU nodes)",
    system.from_policy, system.check_options, ("gpu",), needs_tokens=True,
    tuning=Tuning(("pn", "switch_rows", "sm_comm", "assignment"), tuning.setup,
                  simulates=True),
    study="epsmoe", default_policy="epsmoe-tune")
