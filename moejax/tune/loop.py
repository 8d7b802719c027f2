"""`tune`: an optax loop over relaxed simulations, with orbax checkpoints and hard evaluation.

Each step simulates a batch of training traces with every tuned family relaxed at the
scheduled temperature (DESIGN.md layer 5: the same step functions, `tau > 0`), takes the
gradient of the loss (mean or p99 latency, or negative throughput, plus constraint
penalties) with respect to the raw parameters, clips it by global norm and applies adam with
a warm-up + cosine learning-rate schedule. The temperature anneals geometrically from
`tau_start` to `tau_end`. Every `every` steps (and at the end) the raw parameters, the
optimizer state and the loss history go to an orbax checkpoint; `resume=True` continues
from the latest one and reaches the same result as an uninterrupted run (batches and
temperatures are functions of the step index). The end result is rounded to hard values and
evaluated in hard mode (`tau = 0`) on held-out traces that share the training popularity,
beside the policy's default and the baseline heuristics.

`moejax.tune.run.tune` chooses between this loop (`tune_gradient`), its multi-process form
(`moejax.tune.parallel`) and Gaussian smoothing (`moejax.tune.smoothed`), which build on the
pieces here.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from moejax import systems
from moejax.errors import CheckpointError, ConfigError, UnknownNameError
from moejax.output.results import atomic_write_json
from moejax.runner import budget as memory
from moejax.runner import engine
from moejax.system import TuneSetup
from moejax.systems.fsedp.budget import ChipletBudget
from moejax.trace import io as trace_io
from moejax.trace.popularity import fixed_popularity, sample_from_popularity
from moejax.tunable import IntegerKnob, Placement
from moejax.tune import checkpoint as ck
from moejax.tune import targets
from moejax.tune.records import run_provenance, run_record

LOSSES = ("mean", "p99", "throughput", "forward")
RELAXATIONS = ("expected", "system", "lattice", "smoothed")
INITS = ("default", "greedy", "random", "eplb")
SEARCHES = ("grad", "tpe", "cmaes", "random", "grid")


@dataclasses.dataclass(frozen=True)
class TuneConfig:
    """Everything that defines a tuning run (saved in each checkpoint; resuming needs the
    same values). Names refer to the catalogs; `policy` "" means the system's own name."""

    system: str = "ep"
    hardware: str = "chiplet-2x2"
    model: str = "qwen3-30b-a3b"
    policy: str = ""
    params: tuple[str, ...] = ("placement",)
    steps: int = 200
    traces: int = 64  # training traces (pool the batches are drawn from)
    batch: int = 16  # traces per step
    eval_traces: int = 256  # held-out traces
    trace_gen: str = "powerlaw:alpha=1.2"
    tokens: int = 64  # tokens per iteration
    iterations: int = 2
    layers: int = 1  # one popularity per layer; EP's placement is shared by all layers
    seed: int = 0
    lr: float = 0.1
    warmup: int = 10
    clip: float = 1.0
    tau_start: float = 1.0
    tau_end: float = 0.005
    sim_tau_scale: float = 1.0  # system temperature = sim_tau_scale * family temperature
    gumbel: float = 0.0  # Gumbel-Sinkhorn: noise scale added to placement logits while training
    loss: str = "mean"
    every: int = 50  # checkpoint interval, steps
    keep: int = 3
    init: str = "random"
    # expected: the target's expected-cost form; system: its own relaxed mode; lattice:
    # multilinear interpolation of hard runs at the integer neighbours (integer knobs only)
    relaxation: str = "expected"
    capacity: int = 0  # experts per device (0: ceil(E / D))
    # fsedp hardware params: overrides of the 000 Eq. (1)-(2) coefficients, "name=value,..."
    # (moejax.systems.fsedp.budget.ChipletBudget; "" = its defaults)
    budget: str = ""
    # aep (relaxation 'smoothed', moejax.tune.smoothed): request streams of `requests`
    # Poisson arrivals at `rate_per_s` of a 002 §5 `workload` (traces / eval_traces: number
    # of training / held-out streams), and antithetic pairs per update
    requests: int = 16
    rate_per_s: float = 200.0
    workload: str = "medium"
    samples: int = 2
    # a recording (.npz, `moejax trace import`) instead of generated traces: its first
    # `train_fraction` of iterations train (one trace per iteration), the rest are held out
    trace: str = ""
    train_fraction: float = 0.5
    per_layer: bool = False  # ep, dysharp: one placement per trace layer
    # grad: this loop; tpe, cmaes, random, grid: a black-box search of `steps` hard trials
    # on the same problem (moejax.tune.search)
    search: str = "grad"

    def __post_init__(self):
        if self.loss not in LOSSES:
            raise ConfigError(f"loss = {self.loss!r}; allowed: {', '.join(LOSSES)}")
        if self.relaxation not in RELAXATIONS:
            raise ConfigError(f"relaxation = {self.relaxation!r}; allowed: "
                              f"{', '.join(RELAXATIONS)}")
        if self.search not in SEARCHES:
            raise ConfigError(f"search = {self.search!r}; allowed: {', '.join(SEARCHES)}")
        if self.search == "cmaes" and self.relaxation == "smoothed":  # CMA-ES needs 2+ dims
            raise ConfigError("search = 'cmaes' with relaxation = 'smoothed': AEP decay is one "
                              "knob (CMA-ES needs two or more); allowed: grad, tpe, random, grid")
        if self.init not in INITS:
            raise ConfigError(f"init = {self.init!r}; allowed: {', '.join(INITS)}")
        for k in ("steps", "traces", "batch", "eval_traces", "tokens", "iterations", "layers",
                  "every", "keep", "requests", "samples"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{k} = {v!r}; allowed: an integer >= 1")
        if self.batch > self.traces:
            raise ConfigError(f"batch = {self.batch}; allowed: <= traces = {self.traces}")
        if not self.gumbel >= 0:
            raise ConfigError(f"gumbel = {self.gumbel!r}; allowed: >= 0")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ConfigError(f"warmup = {self.warmup!r}; allowed: an integer >= 0 (steps)")
        if not self.sim_tau_scale >= 0:
            raise ConfigError(f"sim_tau_scale = {self.sim_tau_scale!r}; allowed: >= 0 (the "
                              "system's temperature is this times the family's)")
        if not (self.lr > 0 and self.clip > 0 and 0 < self.tau_end <= self.tau_start):
            raise ConfigError("lr, clip > 0 and 0 < tau_end <= tau_start required; got "
                              f"lr={self.lr}, clip={self.clip}, tau_start={self.tau_start}, "
                              f"tau_end={self.tau_end}")
        smoothed = [k for k, e in systems.SYSTEMS.items() if e.tuning and e.tuning.smoothed]
        if self.relaxation == "smoothed" and self.system not in smoothed:
            raise ConfigError(f"relaxation = 'smoothed' with system = {self.system!r}: only "
                              f"{', '.join(smoothed)} (a discrete-event simulation) is tuned "
                              "by smoothing")
        if not self.rate_per_s > 0:
            raise ConfigError(f"rate_per_s = {self.rate_per_s!r}; allowed: > 0")
        if not 0 < self.train_fraction < 1:
            raise ConfigError(f"train_fraction = {self.train_fraction!r}; allowed: in (0, 1)")
        object.__setattr__(self, "params", tuple(self.params))
        if self.budget:
            ChipletBudget.parse(self.budget)  # errors name the field now, not mid-run

    def spec(self) -> dict:
        """JSON form (what a checkpoint records)."""
        d = dataclasses.asdict(self)
        d["params"] = list(self.params)
        return d

    @classmethod
    def from_spec(cls, d: dict) -> TuneConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise CheckpointError(f"run spec has unknown fields {unknown}")
        return cls(**{**d, "params": tuple(d.get("params", ()))})


@dataclasses.dataclass(eq=False)
class Problem:
    """A built run: the system setup, its train / held-out traces, the optimizer."""

    cfg: TuneConfig
    setup: TuneSetup
    train: object
    heldout: object
    load_e: np.ndarray
    optimizer: optax.GradientTransformation
    policy: object
    load_le: np.ndarray | None = None  # [L, E] mean training load per layer
    platform: object = None  # the resolved Platform (an exported tuned platform starts from it)

    def baseline_load(self) -> np.ndarray:
        """What the setup's baselines plan from: per-layer loads [L, E] or loads [E]."""
        return self.load_le if self.setup.layer_loads else self.load_e


def tau_at(cfg: TuneConfig, step):
    """Temperature of update `step` (0-based): geometric from tau_start to tau_end."""
    frac = jnp.minimum(jnp.asarray(step, jnp.float32) / max(cfg.steps - 1, 1), 1.0)
    return cfg.tau_start * (cfg.tau_end / cfg.tau_start) ** frac


@functools.lru_cache(maxsize=8)
def build_problem(cfg: TuneConfig, *, traces: bool = True) -> Problem:
    """Resolve names, build the system setup, draw the traces, make the optimizer.

    Cached per config (a frozen dataclass), so runs of one config (a resume, an export)
    share the traces and the compiled update and simulation."""
    tunable = targets.tunable()
    if cfg.system not in tunable:
        raise UnknownNameError("tunable system", cfg.system, tunable)
    s = systems.resolve(cfg.hardware, cfg.model, cfg.policy or targets.default_policy(cfg.system))
    if s.policy.system != cfg.system:
        raise ConfigError(f"policy {s.policy.name!r} is for system {s.policy.system!r}, "
                          f"not --system {cfg.system!r}")
    budget = None
    if cfg.budget:
        budget = ChipletBudget.parse(cfg.budget)
    if not cfg.trace:
        check_generated(cfg, s.model)
    recording = recording_split(cfg, s.model) if cfg.trace else None
    layers = cfg.layers if recording is None else recording[0].num_layers
    iterations = cfg.iterations if recording is None else 1
    setup = targets.build_setup(s.policy, s.platform, s.model, iterations, cfg.params,
                                cfg.capacity, budget,
                                num_layers=layers if cfg.per_layer else 0)
    train = heldout = None
    load_e = np.ones(s.model.num_experts)
    load_le = np.ones((layers, s.model.num_experts))
    if recording is not None:
        train, heldout = recording if traces else (None, None)
        load_le = np.asarray(recording[0].counts.mean(axis=(0, 1)))
        load_e = load_le.mean(0)
    elif traces:
        k_pop, k_train, k_eval = jax.random.split(jax.random.key(cfg.seed), 3)
        pop = fixed_popularity(cfg.trace_gen, k_pop, iterations=cfg.iterations,
                               layers=cfg.layers, num_experts=s.model.num_experts)
        kw = dict(tokens=cfg.tokens, top_k=s.model.top_k)
        train = sample_from_popularity(pop, k_train, num_traces=cfg.traces, **kw)
        heldout = sample_from_popularity(pop, k_eval, num_traces=cfg.eval_traces, **kw)
        load_e = np.asarray(train.counts.mean(axis=(0, 1, 2)))
        load_le = np.asarray(train.counts.mean(axis=(0, 1)))
    return Problem(cfg, setup, train, heldout, load_e, make_optimizer(cfg), s.policy, load_le,
                   s.platform)


def check_generated(cfg: TuneConfig, model) -> None:
    """The generated traces' layers are some of the model's MoE layers, and the train and
    held-out batches (made whole, through `[T, I, L, N, E]` Gumbel scores) and a training
    batch's simulation fit in memory (`moejax.runner.budget`); one line if not."""
    if cfg.layers > model.num_sparse_layers:
        raise ConfigError(f"layers = {cfg.layers}: model {model.name} has "
                          f"{model.num_sparse_layers} MoE layers; allowed: 1 .. "
                          f"{model.num_sparse_layers}")
    i, layers, n, k, e = cfg.iterations, cfg.layers, cfg.tokens, model.top_k, model.num_experts
    memory.check_traces_fit(
        held=cfg.traces + cfg.eval_traces, working=cfg.batch,
        trace_bytes=8 * i * layers * n * k + 5 * i * n + 4 * i * layers * e, scratch_bytes=0,
        extra_bytes=4 * max(cfg.traces, cfg.eval_traces) * i * layers * n * e,
        shape=(i, layers, n))


def recording_split(cfg: TuneConfig, model):
    """(train, held-out) traces of the recording `cfg.trace`: one trace per iteration, the
    first `train_fraction` of the iterations train, the rest are held out (never mixed)."""
    rec, _ = trace_io.load(cfg.trace)
    if rec.batch_shape:  # traces of a batch in turn: one iteration axis
        rec = jax.tree_util.tree_map(lambda x: x.reshape(-1, *x.shape[2:]), rec)
    systems.check_trace_fits(rec, model, False, cfg.system)
    n = rec.num_iterations
    cut = int(round(n * cfg.train_fraction))
    if not 1 <= cut < n:
        raise ConfigError(f"train_fraction = {cfg.train_fraction}: {cfg.trace} has {n} "
                          f"iterations, leaving {cut} to train on and {n - cut} held out; "
                          "allowed: a split with at least one of each")
    per_iter = jax.tree_util.tree_map(lambda x: jnp.asarray(x)[:, None], rec)  # [I, 1, ...]
    train = jax.tree_util.tree_map(lambda x: x[:cut], per_iter)
    heldout = jax.tree_util.tree_map(lambda x: x[cut:], per_iter)
    if cfg.batch > cut:
        raise ConfigError(f"batch = {cfg.batch}; allowed: <= {cut} (training iterations of "
                          f"{cfg.trace})")
    return train, heldout


def make_optimizer(cfg: TuneConfig) -> optax.GradientTransformation:
    """Global-norm clipping, then adam with a warm-up + cosine learning-rate schedule."""
    sched = optax.warmup_cosine_decay_schedule(0.0, cfg.lr, min(cfg.warmup, cfg.steps),
                                               max(cfg.steps, cfg.warmup + 1), cfg.lr * 0.05)
    return optax.chain(optax.clip_by_global_norm(cfg.clip), optax.adam(sched))


def initial_raw(prob: Problem) -> dict:
    """Raw parameters at step 0, from the policy default, the greedy heuristic or noise."""
    cfg, setup = prob.cfg, prob.setup
    keys = jax.random.split(jax.random.fold_in(jax.random.key(cfg.seed), 1), len(setup.families))
    base = setup.baselines(prob.baseline_load()) if cfg.init in ("greedy", "eplb") else {}
    greedy = base.get("greedy-balanced", {})
    eplb = next((v for k, v in base.items() if k.startswith("eplb")), {})
    if cfg.init == "eplb" and not eplb:
        raise ConfigError("init = 'eplb': only the ep replicas param has an EPLB baseline")
    raw = {}
    for key, (name, f) in zip(keys, setup.families.items(), strict=True):
        start = {"default": setup.defaults.get(name), "greedy": greedy.get(name),
                 "eplb": eplb.get(name), "random": None}[cfg.init]
        if start is not None and hasattr(f, "one_hot"):
            start = f.one_hot(start)
        raw[name] = f.init(key, start)
    return raw


def relaxed_values(setup: TuneSetup, raw: dict, tau) -> dict:
    return {k: f.relaxed(raw[k], tau) for k, f in setup.families.items()}


def hard_values(prob: Problem, raw: dict) -> dict:
    """Valid discrete values of the raw parameters (rounded at the final temperature), made
    feasible by the setup's joint constraint if it has one (`BudgetConstraint.project`)."""
    tau = float(prob.cfg.tau_end)
    hard = {k: f.hard(raw[k], tau) for k, f in prob.setup.families.items()}
    if prob.setup.constraint is not None:
        hard = prob.setup.constraint.project(hard)
    return hard


def reduce_loss(kind: str, out: dict):
    """Scalar loss from per-trace metrics: ms of latency, -k tokens/s, or ms of forward time
    per iteration ('forward': the wafer system's, migration stalls included)."""
    if kind == "mean":
        return out["latency_s"].mean() * 1e3
    if kind == "forward":
        return out["forward_s"].mean() * 1e3
    if kind == "p99":
        return jnp.quantile(out["latency_s"], 0.99) * 1e3
    return -out["tokens_per_s"].mean() / 1e3


def make_objective(prob: Problem):
    """loss(raw, traces, tau) of the relaxed system on a batch of traces, plus penalties."""
    setup, kind = prob.setup, prob.cfg.loss
    expected = prob.cfg.relaxation == "expected" and setup.expected is not None
    lattice = prob.cfg.relaxation == "lattice"
    if lattice:
        bad = [k for k, f in setup.families.items() if not isinstance(f, IntegerKnob)]
        if bad:
            raise ConfigError(f"relaxation = 'lattice' interpolates integer knobs only; "
                              f"{', '.join(bad)} is not one (use relaxation = 'system')")
    if expected and kind in ("throughput", "forward"):
        raise ConfigError(f"loss = {kind!r} needs relaxation = 'system' (the expected "
                          "form gives MoE-layer latency only)")

    def objective(raw, traces, tau, key=None):
        if key is not None and prob.cfg.gumbel > 0:  # Gumbel-Sinkhorn: perturbed logits
            keys = dict(zip(raw, jax.random.split(key, len(raw)), strict=True))
            raw = {k: v + prob.cfg.gumbel * jax.random.gumbel(keys[k], v.shape)
                   if isinstance(setup.families[k], Placement) else v for k, v in raw.items()}
        values = relaxed_values(setup, raw, tau)
        sim_tau = tau * prob.cfg.sim_tau_scale
        if expected:
            out = {"latency_s": setup.expected(values, traces, sim_tau)}
        elif lattice:
            out = lattice_metrics(setup, values, traces)
        else:
            params = setup.apply(setup.base, values, sim_tau)
            if setup.family_tau_field is not None:  # e.g. the wafer Eq. 2 gate
                params = params.replace(**{setup.family_tau_field: jnp.asarray(tau,
                                                                            jnp.float32)})
            keys = jax.random.split(jax.random.key(0), engine.batch_size(traces))
            out = jax.vmap(lambda tr, k: engine.run_one(setup.system, params, tr, k))(
                traces, keys)
        pen = sum(f.penalty(values[k]) for k, f in setup.families.items())
        if setup.constraint is not None:  # e.g. 000 Eq. (1)-(2) over the hardware knobs
            pen = pen + setup.constraint.penalty(values, tau)
        return reduce_loss(kind, out) + pen

    return objective


def lattice_metrics(setup: TuneSetup, values: dict, traces) -> dict:
    """Per-trace latency_s / tokens_per_s [T] of the integer knobs `values` (fractional) as
    the multilinear interpolation of hard-mode runs (tau = 0, the exact system) at the 2^k
    integer corners around them: `params.interpolate` in k dimensions. The runs are
    constants of the gradient (no backpropagation through the simulation): the gradient is
    the difference of the hard system between neighbouring integers, weighted by position.
    Exact at integer values; temperature-free.

    Why (docs/tuning.md): FSE-DP's layer reads an expert as present or absent (tok > 0), so
    the soft Algorithm 2 (relaxation 'system') defers fractions of requests that never
    remove an expert's weight load; its gradient misses the effect theta_min has in hard
    mode. Here the hard effect is measured, not relaxed."""
    if setup.structural is not None:
        return _structural_lattice(setup, values, traces)
    names = list(values)
    lo = {k: jax.lax.stop_gradient(jnp.floor(values[k])) for k in names}
    frac = {k: values[k] - lo[k] for k in names}
    corners = list(itertools.product((0.0, 1.0), repeat=len(names)))
    weights = jnp.stack([functools.reduce(
        lambda a, b: a * b, [frac[k] if c else 1.0 - frac[k] for k, c in zip(names, cs,
                                                                          strict=True)],
        jnp.float32(1.0)) for cs in corners])  # [C]
    ps = [setup.apply(setup.base, {k: lo[k] + c for k, c in zip(names, cs, strict=True)},
                      0.0) for cs in corners]
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *ps).replace(
        tau=jnp.float32(0.0))
    axes = jax.tree_util.tree_map(lambda _: 0, stacked).replace(tau=None)
    keys = jax.random.split(jax.random.key(0), engine.batch_size(traces))
    runs = jax.vmap(lambda p: jax.vmap(lambda tr, k: engine.run_one(setup.system, p, tr, k))(
        traces, keys), in_axes=(axes,))(stacked)
    return {m: jnp.tensordot(weights, jax.lax.stop_gradient(runs[m]), 1)
            for m in ("latency_s", "tokens_per_s")}


def _structural_lattice(setup: TuneSetup, values: dict, traces) -> dict:
    """`lattice_metrics` of a structural integer knob (one System per value,
    `Setup.variants`): every variant runs in hard mode, and the value is the linear
    interpolation between its floor and ceiling variants (constants of the gradient)."""
    f = setup.families[setup.structural]
    x = values[setup.structural]
    lo = jax.lax.stop_gradient(jnp.clip(jnp.floor(x), f.lo, f.hi - 1))
    w = x - lo
    keys = jax.random.split(jax.random.key(0), engine.batch_size(traces))
    runs = [jax.vmap(lambda tr, k, s=s, p=p: engine.run_one(s, p.replace(tau=jnp.float32(0.0)),
                                                           tr, k))(traces, keys)
            for s, p in setup.variants]
    i = (lo - f.lo).astype(jnp.int32)
    out = {}
    for m in ("latency_s", "tokens_per_s", "forward_s"):
        if m in runs[0]:
            stack = jax.lax.stop_gradient(jnp.stack([r[m] for r in runs]))  # [K, T]
            out[m] = (1.0 - w) * stack[i] + w * stack[i + 1]
    return out


@functools.lru_cache(maxsize=8)
def make_update(prob: Problem):
    objective = make_objective(prob)
    opt, cfg, train = prob.optimizer, prob.cfg, prob.train
    k_batch = jax.random.fold_in(jax.random.key(cfg.seed), 2)
    k_noise = jax.random.fold_in(jax.random.key(cfg.seed), 3)

    pool = engine.batch_size(train)  # cfg.traces, or a recording's training iterations

    @jax.jit
    def update(raw, opt_state, step):
        idx = jax.random.permutation(jax.random.fold_in(k_batch, step), pool)[:cfg.batch]
        batch = jax.tree_util.tree_map(lambda x: x[idx], train)
        tau = tau_at(cfg, step)
        loss, grads = jax.value_and_grad(objective)(raw, batch, tau,
                                                    jax.random.fold_in(k_noise, step))
        updates, opt_state = opt.update(grads, opt_state, raw)
        return optax.apply_updates(raw, updates), opt_state, loss, optax.tree.norm(grads)

    return update


@dataclasses.dataclass
class TuneResult:
    raw: dict
    hard: dict
    history: list
    evaluation: dict
    step: int
    budget: dict = dataclasses.field(default_factory=dict)  # moejax.tune.search accounting


def open_run(cfg: TuneConfig, out: str | Path, resume: bool, raw, opt_state,
             primary_only: bool = False):
    """(checkpoint manager, step, loss history, raw, opt_state) to start run `cfg` from:
    fresh, or restored from `out` under `resume`. A folder that already holds checkpoints
    without `resume`, or one saved by a different run spec, is an error. primary_only: the
    caller is process 0 of a multi-process run and alone writes (`moejax.tune.parallel`)."""
    if resume and not Path(out).is_dir():
        raise CheckpointError(f"--resume: {out}: no such checkpoint folder, so there is no "
                              "tuning run to continue; leave --resume out to start one")
    mgr = ck.Checkpoints(out, every=cfg.every, keep=cfg.keep, primary_only=primary_only)
    step, history = 0, []
    if mgr.latest_step() is not None:
        if not resume:
            raise CheckpointError(f"{out}: already holds checkpoints (step "
                                  f"{mgr.latest_step()}); pass --resume or another --out")
        saved, meta, step = mgr.restore(ck.flatten_state(raw, opt_state))
        saved_spec = TuneConfig.from_spec(meta.get("run", {})).spec()  # new fields: defaults
        ck.check_same_run({"run": saved_spec}, cfg.spec(), str(out))
        raw, opt_state = ck.unflatten_state(saved, opt_state)
        history = list(meta.get("history", []))[:step]
    return mgr, step, history, raw, opt_state


def tune_gradient(cfg: TuneConfig, out: str | Path, *, resume: bool = False,
                  progress: bool = True, callback=None,
                  evaluate_heldout: bool = True, observer=None) -> TuneResult:
    """The single-process gradient loop of `moejax.tune.tune` (see the module docstring):
    optax updates of the relaxed objective, orbax checkpoints, hard held-out evaluation.
    observer: `moejax.tune.search.GradientObserver` (budget and curve), called with (step,
    raw) after each update; it then writes summary.json with the budget."""
    prob = build_problem(cfg)
    raw = initial_raw(prob)
    mgr, step, history, raw, opt_state = open_run(cfg, out, resume, raw,
                                                  prob.optimizer.init(raw))
    update = make_update(prob)
    with progress_bar(progress, cfg.steps, step) as advance:
        while step < cfg.steps:
            raw, opt_state, loss, gnorm = update(raw, opt_state, jnp.int32(step))
            step += 1
            history.append(float(loss))
            if step % cfg.every == 0 or step == cfg.steps:
                mgr.save(step, ck.flatten_state(raw, opt_state),
                         {"run": cfg.spec(), "history": history}, force=True)
            advance(float(loss), float(tau_at(cfg, step - 1)), float(gnorm))
            if observer is not None:
                observer(step, raw)
            if callback is not None:
                callback(step, float(loss))
    mgr.close()
    hard = hard_values(prob, raw)
    evaluation = evaluate(prob, hard) if evaluate_heldout else {}
    budget = {}
    if evaluate_heldout and observer is not None:
        budget = observer.finish(step, history[-1], evaluation)
    elif evaluate_heldout:
        atomic_write_json(Path(out) / "summary.json",
                          {"run": run_record(cfg), "step": step, "final_loss": history[-1],
                           "evaluation": evaluation, "provenance": run_provenance(cfg)})
    return TuneResult(raw, hard, history, evaluation, step, budget)


# --- hard-mode evaluation ------------------------------------------------------------------


def evaluate_values(prob: Problem, hard: dict, traces=None) -> dict:
    """Hard-mode (tau = 0) metrics of hard values on held-out traces: per-trace latency
    (s) and, for placements, the max / mean device load ratio per trace."""
    setup = prob.setup
    traces = prob.heldout if traces is None else traces
    system, base = setup.system_for(hard)
    params = setup.apply(base, setup.as_values(hard), jnp.float32(0.0))
    out = engine.simulate(system, params, traces)
    res = {"latency_s": np.asarray(out["latency_s"]),
           "tokens_per_s": np.asarray(out["tokens_per_s"])}
    if "migrations" in out:  # wafer: iteration time with migration stalls, copies moved
        res["forward_s"] = np.asarray(out["forward_s"])
        res["migrations"] = np.asarray(out["migrations"])
    for name, f in setup.families.items():
        if name in hard and hasattr(f, "shares_of"):  # placements: [(L,) E, D] shares
            place = f.shares_of(hard[name])
            counts = np.asarray(traces.counts)  # [T, I, L, E]
            load = (np.einsum("tile,led->tild", counts, place) if place.ndim == 3
                    else counts @ place)  # [T, I, L, D]
            ratio = load.max(-1) / np.maximum(load.mean(-1), 1e-9)
            res["max_load_ratio"] = ratio.mean(axis=(1, 2))
    return res


def summarize(res: dict) -> dict:
    s = {"latency_ms": {k: v * 1e3 for k, v in engine.percentile_summary(res["latency_s"])
                        .items()},
         "tokens_per_s_mean": float(res["tokens_per_s"].mean())}
    if "max_load_ratio" in res:
        s["max_load_ratio_mean"] = float(res["max_load_ratio"].mean())
    if "forward_s" in res:
        s["forward_ms_mean"] = float(res["forward_s"].mean() * 1e3)
        s["migrations_mean"] = float(res["migrations"].mean())
    return s


# the fields that fix a problem's setup and traces (not how it is searched)
_PROBLEM_FIELDS = ("system", "hardware", "model", "policy", "params", "traces", "eval_traces",
                   "trace_gen", "tokens", "iterations", "layers", "seed", "capacity", "budget",
                   "trace", "train_fraction", "per_layer", "loss")
_BASELINES: dict = {}  # problem key -> {row name: summary} of rows that set every family


def evaluate(prob: Problem, hard: dict) -> dict:
    """Summaries of the tuned values, the policy default and each baseline heuristic.

    A row that sets every tuned family does not depend on `hard`: its summary is computed
    once per problem (setup and traces; not per search method or budget) and reused, which
    keeps the equal-budget study from re-simulating the same hard grid after every run."""
    rows = {"tuned": hard, "default": dict(prob.setup.defaults)}
    rows.update(prob.setup.baselines(prob.baseline_load()))
    key = tuple(getattr(prob.cfg, k) for k in _PROBLEM_FIELDS)
    if len(_BASELINES) > 16:
        _BASELINES.clear()
    cache = _BASELINES.setdefault(key, {})
    out = {}
    for name, values in rows.items():
        values = {k: v for k, v in values.items() if k in prob.setup.families}
        whole = name != "tuned" and set(values) == set(prob.setup.families)
        if whole and name in cache:
            out[name] = cache[name]
            continue
        out[name] = summarize(evaluate_values(prob, {**hard, **values}))
        if prob.setup.constraint is not None:
            out[name]["budget"] = prob.setup.constraint.report({**hard, **values})
        if whole:
            cache[name] = out[name]
    return out


class progress_bar:
    """A rich progress bar showing loss, temperature and gradient norm (or nothing)."""

    def __init__(self, show: bool, total: int, done: int):
        self.show, self.total, self.done = show, total, done

    def __enter__(self):
        if not self.show:
            return lambda *a: None
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(TextColumn("tuning"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("loss {task.fields[loss]}"),
                            TextColumn("tau {task.fields[tau]}"),
                            TextColumn("|g| {task.fields[g]}"),
                            TimeElapsedColumn(), TimeRemainingColumn())
        self.bar.__enter__()
        task = self.bar.add_task("tune", total=self.total, completed=self.done,
                                 loss="-", tau="-", g="-")
        return lambda loss, tau, g: self.bar.update(task, advance=1, loss=f"{loss:.5g}",
                                                    tau=f"{tau:.3g}", g=f"{g:.3g}")

    def __exit__(self, *exc):
        if self.show:
            self.bar.__exit__(*exc)
        return False
