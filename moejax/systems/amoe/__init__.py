"""AMoE (002): asynchronous expert parallelism for MoE serving, and its synchronous baseline.

Modules: `config` (execution-time model, transfer tables, ticks), `routing` (exponential
expert routing, §5), `schedulers` (MTFS, FLFS, Algorithm 1), `aep` (the μ-queue event
simulation, §3, one event per step), `rounds` / `rounds_ops` / `rounds_io` (the same events
in rounds of parallel launches, exact, the accelerator path), `core` (the exact event core
in numba, the CPU path), `paths` (the engine System of each path, chosen by the policy
option `path`), `sync` (synchronous EP serving, §5 baseline), `reference` (plain-Python
event loop), `policy` (policy options), `serve` (platform / model / stream helpers for the
CLI and studies), `steady` / `sync_closed` (steady-state operating points).
"""

from moejax.system import SystemEntry, Tuning
from moejax.systems.amoe import aep, config, paths, policy, routing, schedulers, sync

__all__ = ["ENTRY", "SYNC_ENTRY", "aep", "config", "paths", "policy", "routing",
           "schedulers", "sync"]

_GPUS = ("gpu", "chiplet", "wafer")
# the 4th from_policy argument is the requests per stream
ENTRY = SystemEntry(
    "aep", "002 AMoE: asynchronous expert parallelism serving Poisson request streams",
    policy.aep_from_policy, policy.check_aep_options, _GPUS, input_kind="streams",
    tuning=Tuning(("decay",), None, help="decay", smoothed=True), study="amoe",
    default_policy="aep-defrag")
SYNC_ENTRY = SystemEntry(
    "ep_serving", "002 §5 baseline: synchronous EP serving Poisson request streams",
    policy.sync_from_policy, policy.check_sync_options, _GPUS, input_kind="streams",
    study="amoe", default_policy="ep-sync")
