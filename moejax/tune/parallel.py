"""`moejax tune` data-parallel over processes (`moejax.runner.distributed`).

Each process runs the same update loop on the same parameters. A step's batch (the same
`cfg.batch` training-trace indices as a single-process run: a permutation keyed by the step)
is cut into `jax.process_count()` equal blocks; process r takes the gradient of the loss on
block r, and the gradients (and losses) are averaged across processes by a collective
(`moejax.runner.distributed.mean_across_processes`: an all-gather over jax's cross-process
collectives, gloo on CPU) before the optimizer step, which every process then applies
identically. For losses that are means over traces (mean / throughput / forward), the mean of
equal blocks' means is the batch mean, so a run equals the single-process run up to float
rounding of the sum. p99 is not a mean over traces (a block's p99 is not the batch's): it
runs in one process.

Checkpoints (orbax) are written by process 0 alone (`Checkpoints(primary_only=True)`); on
`--resume` process 0 restores and broadcasts the state to the others. Held-out evaluation
splits its traces over the processes (`engine.simulate`); process 0 writes summary.json.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from moejax.errors import ConfigError, MoejaxError
from moejax.output.results import atomic_write_json
from moejax.runner import distributed, engine
from moejax.tune import checkpoint as ck
from moejax.tune import loop, records

# Losses that are means over the traces of a batch (split evenly, the mean of the blocks'
# means is the batch's mean).
MEAN_LOSSES = ("mean", "throughput", "forward")


def check(cfg) -> None:
    """One line (ConfigError) for a run that cannot be split over the processes."""
    p = distributed.process_count()
    if cfg.relaxation == "smoothed":
        raise ConfigError("relaxation = 'smoothed' (aep) runs in one process; drop "
                          "--num-processes / --coordinator")
    if cfg.loss not in MEAN_LOSSES:
        raise ConfigError(f"loss = {cfg.loss!r} over {p} processes: a block's p99 is not the "
                          f"batch's; allowed: {', '.join(MEAN_LOSSES)} (or one process)")
    if cfg.batch % p:
        raise ConfigError(f"batch = {cfg.batch}: must be a multiple of the {p} processes "
                          "(each takes the gradient on an equal block of the batch)")


def make_update(prob):
    """update(raw, opt_state, step) -> (raw, opt_state, loss, |grad|), the gradient averaged
    over processes; same batches and noise as `loop.make_update`."""
    objective = loop.make_objective(prob)
    opt, cfg, train = prob.optimizer, prob.cfg, prob.train
    k_batch = jax.random.fold_in(jax.random.key(cfg.seed), 2)
    k_noise = jax.random.fold_in(jax.random.key(cfg.seed), 3)
    pool = engine.batch_size(train)
    count, rank = distributed.process_count(), jax.process_index()
    per = cfg.batch // count

    @jax.jit
    def local_grad(raw, step):
        idx = jax.random.permutation(jax.random.fold_in(k_batch, step), pool)[:cfg.batch]
        idx = idx[rank * per:(rank + 1) * per]  # this process's block of the batch
        batch = jax.tree_util.tree_map(lambda x: x[idx], train)
        return jax.value_and_grad(objective)(raw, batch, loop.tau_at(cfg, step),
                                             jax.random.fold_in(k_noise, step))

    @jax.jit
    def apply(raw, opt_state, grads):
        updates, opt_state = opt.update(grads, opt_state, raw)
        return optax.apply_updates(raw, updates), opt_state, optax.tree.norm(grads)

    def update(raw, opt_state, step):
        loss, grads = distributed.mean_across_processes(local_grad(raw, step))
        grads = jax.tree_util.tree_map(jnp.asarray, grads)
        raw, opt_state, gnorm = apply(raw, opt_state, grads)
        return raw, opt_state, loss, gnorm

    return update


def _broadcast(tree):
    from jax.experimental import multihost_utils

    return multihost_utils.broadcast_one_to_all(tree)


def open_run(cfg, out, resume: bool, raw, opt_state):
    """`loop.open_run` on process 0 (the only one that touches the checkpoint folder); the
    others receive the step, history and state. A failure on process 0 reaches every
    process (a status broadcast first, so none waits on a collective that never comes)."""
    mgr, err, step, history = None, None, 0, []
    if distributed.is_writer():
        try:
            mgr, step, history, raw, opt_state = loop.open_run(cfg, out, resume, raw,
                                                               opt_state, primary_only=True)
        except MoejaxError as e:
            err = e
    failed = int(_broadcast(np.int32(err is not None)))
    if failed:
        if err is not None:
            raise err
        raise ConfigError(f"{out}: process 0 could not open the run (its message says why)")
    step = int(_broadcast(np.int64(step)))
    hist = _broadcast(np.asarray(history + [0.0] * (step - len(history)), np.float64)
                      if step else np.zeros(0))
    flat = _broadcast(ck.flatten_state(raw, opt_state))
    raw, opt_state = ck.unflatten_state(flat, opt_state)
    return mgr, step, [float(x) for x in np.asarray(hist)][:step], raw, opt_state


def tune(cfg, out: str | Path, *, resume: bool, progress: bool, callback,
         evaluate_heldout: bool):
    """`loop.tune_gradient` over `jax.process_count()` processes (see the module doc)."""
    check(cfg)
    prob = loop.build_problem(cfg)
    raw = loop.initial_raw(prob)
    mgr, step, history, raw, opt_state = open_run(cfg, out, resume, raw,
                                                  prob.optimizer.init(raw))
    update = make_update(prob)
    writer = distributed.is_writer()
    with loop.progress_bar(progress and writer, cfg.steps, step) as advance:
        while step < cfg.steps:
            raw, opt_state, loss, gnorm = update(raw, opt_state, jnp.int32(step))
            step += 1
            history.append(float(loss))
            if writer and (step % cfg.every == 0 or step == cfg.steps):
                mgr.save(step, ck.flatten_state(raw, opt_state),
                         {"run": cfg.spec(), "history": history}, force=True)
            advance(float(loss), float(loop.tau_at(cfg, step - 1)), float(gnorm))
            if callback is not None:
                callback(step, float(loss))
    if writer:
        mgr.close()
    distributed.sync("moejax-tune-saved")
    hard = loop.hard_values(prob, raw)
    evaluation = loop.evaluate(prob, hard) if evaluate_heldout else {}
    if evaluate_heldout and writer:
        atomic_write_json(Path(out) / "summary.json",
                          {"run": records.run_record(cfg),
                           "provenance": records.run_provenance(cfg),
                           "step": step, "final_loss": history[-1],
                           "processes": distributed.process_count(),
                           "evaluation": evaluation})
    return loop.TuneResult(raw, hard, history, evaluation, step)
