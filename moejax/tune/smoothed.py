"""Gaussian smoothing: a relaxed path for knobs whose hard effect is piecewise constant.

AEP's defragging decay delta (002 §3.4 Algorithm 1, `AEPParams.decay`) enters the AMoE
discrete-event simulation only through the argmax that picks a mu-queue
(`schedulers.select`), and the run is driven to completion by a host loop
(`engine.simulate`): every metric f(delta) is piecewise constant (zero gradient almost
everywhere) and has no autodiff path. Its relaxation here is the Gaussian-smoothed
objective

    F_sigma(delta) = E_{eps ~ N(0, 1)} f(clip(delta + sigma * eps, lo, hi)),

smooth in delta for sigma > 0 and equal to f(delta) at sigma = 0 (at every delta where f is
continuous; sigma plays the role of tau, annealed by `loop.tau_at`). Its gradient is
estimated by the antithetic score-function (evolution-strategies) estimator

    dF/ddelta ~= 1 / (2 sigma P) sum_i [f(delta + sigma eps_i) - f(delta - sigma eps_i)] eps_i,

unbiased for any measurable f (Stein's identity, d/dmu E h(mu + sigma eps) =
E[h(mu + sigma eps) eps] / sigma, applied to h = f o clip), with common random numbers:
the eps of step s are drawn from a key fixed by (seed, s), and every evaluation runs the
same training request streams with the same simulation key, so f(delta + sigma eps) -
f(delta - sigma eps) carries no stream-to-stream noise. Each f is one hard-mode run.
The raw parameter is unconstrained (`params.SmoothedKnob`: delta = lo + (hi - lo)
sigmoid(raw)); the chain rule through the sigmoid gives the raw gradient, which goes to
the same optax chain (global-norm clipping, adam with warm-up + cosine schedule), orbax
checkpoints and resume as `loop.tune_gradient`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from moejax import tunable as fam
from moejax.catalog.policies import load_policy
from moejax.errors import ConfigError, MoejaxError
from moejax.output.results import atomic_write_json, atomic_write_text
from moejax.runner import engine
from moejax.systems.amoe import serve
from moejax.tune import checkpoint as ck
from moejax.tune import export, records, targets
from moejax.tune.loop import TuneResult, make_optimizer, open_run, progress_bar, tau_at

AEP_METRICS = ("throughput_tok_s", "itl_mean_s", "ttft_mean_s")
AEP_DECAY_RANGE = (0.0, 1.0)  # the aep policy's allowed delta (002 Algorithm 1 weights)


def antithetic_gradient(f_many, x: float, sigma: float, eps) -> tuple[float, float, float]:
    """(estimate of F_sigma(x), of dF_sigma/dx, and the standard error of the latter) from
    the pairs x +- sigma eps_i.

    f_many: host function, values [n] -> objective [n] (hard simulations, batched);
    eps [P] standard normals."""
    eps = np.asarray(eps, np.float64)
    if not sigma > 0:
        raise ConfigError(f"sigma = {sigma}; allowed: > 0")
    f = np.asarray(f_many(np.concatenate([x + sigma * eps, x - sigma * eps])), np.float64)
    fp, fm = f[:eps.shape[0]], f[eps.shape[0]:]
    terms = (fp - fm) * eps / (2 * sigma)  # one unbiased estimate per pair
    se = float(terms.std(ddof=1) / np.sqrt(len(terms))) if len(terms) > 1 else float("nan")
    return float(np.mean(fp + fm) / 2), float(terms.mean()), se


def step_eps(seed: int, step: int, samples: int) -> np.ndarray:
    """Standard normals [samples] of update `step` (common random numbers: fixed per step)."""
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), 4), step)
    return np.asarray(jax.random.normal(key, (samples,)), np.float64)


# --- AEP (002): many decays in one vectorized run -----------------------------------------


def run_decays(system, base, decays, streams, key, *, group: int = 8, **kw) -> dict:
    """AEP metrics [P, S] of every decay [P] on every stream [S]: vmapped runs of `group`
    decays at a time (the last group padded), so every call reuses one compiled loop.

    Stream s uses `jax.random.split(key, S)[s]` whatever the decay, as
    `engine.simulate(system, base.replace(decay=d), streams, key)` does for one decay."""
    decays = np.asarray(decays, np.float32).reshape(-1)
    n = decays.shape[0]
    padded = np.concatenate([decays, np.full(-n % group, decays[-1], np.float32)])
    outs = [_run_group(system, base, padded[i:i + group], streams, key, **kw)
            for i in range(0, padded.shape[0], group)]
    return {k: np.concatenate([o[k] for o in outs])[:n] for k in AEP_METRICS}


def _run_group(system, base, decays, streams, key, *, max_steps: int = 50_000_000) -> dict:
    n_p = decays.shape[0]
    n_s = int(np.shape(streams.arrival_s)[0])
    tile = lambda x: jnp.concatenate([x] * n_p)  # noqa: E731  [P * S, ...]
    params = base.replace(decay=jnp.asarray(np.repeat(decays, n_s)))
    try:
        # decay per (decay, stream) row; the configuration's arrays shared by every row
        out = engine.simulate(system, params, jax.tree_util.tree_map(tile, streams),
                              keys=tile(jax.random.split(key, n_s)), max_steps=max_steps,
                              params_batched=base.replace(decay=0, consts=None))
    except MoejaxError as err:
        raise ConfigError(f"aep: {err}") from None
    return {k: np.asarray(out[k]).reshape(n_p, n_s) for k in AEP_METRICS}


# --- AEP (002): the problem ----------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class AEPProblem:
    """Built AEP run: the system, its base params, training / held-out request streams
    (the same draws as `zeroth.tune_aep_decay` for the same seed and sizes), the family."""

    cfg: object  # loop.TuneConfig
    system: object
    base: object
    policy: object
    train: object
    heldout: object
    sim_key: object
    family: fam.SmoothedKnob
    optimizer: optax.GradientTransformation

    def metrics(self, decays, streams=None) -> dict:
        """Hard-mode metrics [P] (mean over streams; train by default) of decays [P]."""
        streams = self.train if streams is None else streams
        group = min(8, np.size(decays))  # one compiled loop per count up to 8, no padding
        out = run_decays(self.system, self.base, decays, streams, self.sim_key, group=group)
        return {k: v.mean(1) for k, v in out.items()}

    def loss(self, decays, streams=None) -> np.ndarray:
        """Training loss [P] at decays [P] (clipped to the allowed range): -k tok/s
        ('throughput') or ms of mean ITL ('mean'); the hard objective the smoothing relaxes."""
        m = self.metrics(np.clip(np.asarray(decays, np.float64), *self.family.bounds), streams)
        if self.cfg.loss == "throughput":
            return -m["throughput_tok_s"] / 1e3
        return m["itl_mean_s"] * 1e3


def aep_problem(cfg) -> AEPProblem:
    """Resolve the AEP policy and draw the streams of a TuneConfig (system = 'aep')."""
    if tuple(cfg.params) != ("decay",):
        raise ConfigError(f"param = {','.join(cfg.params)}; allowed for aep: decay")
    if cfg.loss not in ("throughput", "mean"):
        raise ConfigError(f"loss = {cfg.loss!r}; allowed for aep: throughput (tokens/s), "
                          "mean (mean inter-token latency)")
    policy = cfg.policy or targets.default_policy("aep")
    system, base, pol = serve.build(cfg.hardware, cfg.model, policy, cfg.requests)
    if pol.system != "aep" or dict(pol.options).get("scheduler", "defrag") != "defrag":
        raise ConfigError(f"policy {pol.name!r}: decay tuning needs an 'aep' policy with "
                          "scheduler = 'defrag' (Algorithm 1)")
    k_train, k_eval, k_sim = jax.random.split(jax.random.key(cfg.seed), 3)
    kw = dict(num_requests=cfg.requests, rate_per_s=cfg.rate_per_s, workload=cfg.workload)
    train = serve.streams(k_train, num_streams=cfg.traces, **kw)
    heldout = serve.streams(k_eval, num_streams=cfg.eval_traces, **kw)
    family = fam.SmoothedKnob("decay", *AEP_DECAY_RANGE)
    return AEPProblem(cfg, system, base, pol, train, heldout, k_sim, family,
                      make_optimizer(cfg))


# --- the loop ------------------------------------------------------------------------------


def tune_smoothed(cfg, out: str | Path, *, resume: bool = False, progress: bool = True,
                  callback=None, evaluate_heldout: bool = True, observer=None):
    """`run.tune` for relaxation = 'smoothed' (AEP decay): each update draws `samples`
    antithetic pairs at sigma = tau_at(step), estimates dF/ddelta, maps it to raw, and
    applies the optax chain; checkpoints and resume as in `loop.tune_gradient`.
    observer: `search_aep.SmoothedObserver` (budget and curve), called with (step, decay)
    after each update; after the held-out evaluation it adds both to summary.json."""
    prob = aep_problem(cfg)
    if observer is not None:
        observer.start(prob)
    f = prob.family
    default = float(prob.base.decay)
    start = default if cfg.init == "default" else None
    if cfg.init == "greedy":
        raise ConfigError("init = 'greedy' has no meaning for decay; allowed: default, random")
    raw = {"decay": f.init(None, start)}
    mgr, step, history, raw, opt_state = open_run(cfg, out, resume, raw,
                                                  prob.optimizer.init(raw))
    dvalue = jax.jit(jax.grad(lambda r: f.relaxed(r, 0.0)))
    apply = jax.jit(lambda g, s, r: _apply(prob.optimizer, g, s, r))
    with progress_bar(progress, cfg.steps, step) as advance:
        while step < cfg.steps:
            sigma = float(tau_at(cfg, step))
            delta = float(f.relaxed(raw["decay"], sigma))
            value, g_delta, _ = antithetic_gradient(prob.loss, delta, sigma,
                                                    step_eps(cfg.seed, step, cfg.samples))
            grads = {"decay": jnp.float32(g_delta) * dvalue(raw["decay"])}
            raw, opt_state = apply(grads, opt_state, raw)
            step += 1
            history.append(value)
            if step % cfg.every == 0 or step == cfg.steps:
                mgr.save(step, ck.flatten_state(raw, opt_state),
                         {"run": cfg.spec(), "history": history}, force=True)
            advance(value, sigma, abs(float(grads["decay"])))
            if observer is not None:
                observer(step, f.hard(raw["decay"]))
            if callback is not None:
                callback(step, value)
    mgr.close()
    hard = {"decay": f.hard(raw["decay"])}
    budget = {}
    evaluation = {}
    if evaluate_heldout:
        evaluation = evaluate_aep(prob, hard["decay"], default)
        atomic_write_json(Path(out) / "summary.json",
                          {"run": records.run_record(cfg),
                           "provenance": records.run_provenance(cfg),
                           "step": step, "final_loss": history[-1],
                           "tuned": hard["decay"], "default": default,
                           "train_loss_hard": dict(zip(("start", "tuned"), prob.loss(
                               [f.hard(f.init(None, start)), hard["decay"]]).tolist(),
                               strict=True)),
                           "evaluation": evaluation})
        if observer is not None:
            budget = observer.finish(step)
    return TuneResult(raw, hard, history, evaluation, step, budget)


def _apply(opt, grads, opt_state, raw):
    updates, opt_state = opt.update(grads, opt_state, raw)
    return optax.apply_updates(raw, updates), opt_state


def evaluate_aep(prob: AEPProblem, tuned: float, default: float) -> dict:
    """Hard-mode held-out metrics of the tuned and the default decay."""
    m = prob.metrics([tuned, default], prob.heldout)
    return {name: {k: float(v[i]) for k, v in m.items()}
            for i, name in enumerate(("tuned", "default"))}


def write_policy(path: str | Path, cfg, hard: dict, step: int) -> Path:
    """The base aep policy with the tuned `decay`, as a policy TOML (atomic)."""
    path = export.check_toml_path(path)
    base = load_policy(cfg.policy or targets.default_policy("aep"))
    head = (f"# Tuned by `moejax tune` (relaxation 'smoothed': Gaussian smoothing, antithetic "
            f"score-function gradient): decay of policy {base.name!r},\n# {cfg.steps} steps "
            f"on {cfg.traces} streams x {cfg.requests} requests, Poisson {cfg.rate_per_s}/s, "
            f"{cfg.workload} workload, seed {cfg.seed}, loss {cfg.loss}; checkpoint step "
            f"{step}.\n")
    decay = fam.SmoothedKnob("decay", *AEP_DECAY_RANGE).check(hard["decay"])
    atomic_write_text(path, export.policy_text(base, {"decay": decay}, cfg.spec(), step,
                                               header=head))
    return path
