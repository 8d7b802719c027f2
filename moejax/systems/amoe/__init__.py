"""AMoE (002): asynchronous expert parallelism for MoE serving, and its synchronous baseline.

Modules: `config` (execution-time model, transfer tables, ticks), `routing` (exponential
expert routing, §5), `schedulers` (MTFS, FLFS, Algorithm 1), `aep` (the μ-queue event
simulation, §3), `rounds` (the same events in rounds of parallel launches, exact, the
accelerator path `runner` uses for AEP), `sync` (synchronous EP serving, §5 baseline),
`runner` (chunked jit+vmap+scan until every stream is done), `reference` (plain-Python event loop),
`policy` (policy options), `serve` (platform / model / stream helpers for the CLI and
studies).
"""

from moejax.systems.amoe import aep, config, policy, routing, runner, schedulers, sync

__all__ = ["aep", "config", "policy", "routing", "runner", "schedulers", "sync"]
