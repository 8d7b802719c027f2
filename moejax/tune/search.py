"""Black-box search of the same tuning problem, and the budget accounting of every method.

`moejax tune --search grad|tpe|cmaes|random|grid`: one problem (`loop.build_problem`: the
system, its families, the training and held-out traces, the loss), searched either by the
relaxed-gradient loop (`grad`, `loop.tune_gradient`) or by a black-box method that only
runs the hard simulator (`tau = 0`) on the training traces: Optuna's TPE
(`optuna.samplers.TPESampler`) and CMA-ES (`CmaEsSampler`, the `cmaes` package), random
search, and a grid over the scalar knobs. Every method ends the same way: its chosen hard
values are evaluated on the held-out traces beside the default and the heuristics
(`loop.evaluate`), an orbax checkpoint holds raw parameters whose rounding gives exactly
those values (so `restore` and `--export` work for every method), and `summary.json` holds
the evaluation, the budget spent and the best-so-far curve.

Encodings of the decisions (what a black-box method sees):

- `Placement` (expert -> device, at most `capacity` experts per device), `tpe`: one
  categorical device per expert, then a capacity repair: a device over capacity keeps its
  lowest-numbered experts and moves the rest, in expert order, to the device with the most
  free slots (lowest id on ties). `cmaes`, `random`: random keys, one float in [0, 1) per
  expert; experts sorted by key fill the devices in order, `capacity` each (the random-key
  encoding of permutation problems; uniform keys give a uniformly random balanced
  placement). `grid`: not searchable (D^E points).
- `IntegerKnob`: an integer in [lo, hi]. `Threshold`, `LogKnob`: u in [0.001, 0.999],
  the family's own sigmoid position (a `LogKnob` is log-uniform in u). The grid takes every
  integer and `n` evenly spaced u per continuous knob, n as large as the trial budget allows.
- `ReplicaPlacement` (slots per device, R = D * slots - E redundant slots), every search
  but the grid: E + 2R floats in [0, 1) (`replica_shares`): random keys for the primary
  placement, and per redundant slot an expert (or empty) and a device; replicas split
  their expert's tokens evenly. A knob over an index of allowed values (EPS-MoE's
  pipeline degree, a `divs` tuple) is searched by its index. Per-layer replicas: no
  black-box encoding (`check` refuses them, one line, before anything is written). AEP's
  smoothed decay: `moejax.tune.search_aep`.
- EPS-MoE's `ChunkAssignment` (D devices x E_loc local experts, each in one of E_loc
  slots; slot s is chunk s // (E_loc / N) at pipeline degree N), every search but the
  grid: one integer slot in [0, E_loc) per (device, local expert), the family's own hard
  value (no repair: chunks may be unequal or empty). Uniform slots put each expert in each
  chunk with probability 1 / N at every N. `grid`: not searchable (E_loc^(D E_loc) points).

A trial is evaluated on every training trace (the exact training objective; a gradient
step sees `--batch` of them). The incumbent after n trials is the trial with the lowest
training objective among the first n. Resuming continues the Optuna study in
`trials.jsonl` (one JSON line per finished trial) up to `--steps` trials; the samplers are reseeded
with the trial count, so a resumed run continues validly but not bit-identically.

Budget (every method, `summary.json` "budget"): simulated layer-traces (traces x layers,
x corners for the lattice relaxation), hard and relaxed evaluations, wall and CPU time of
the search (held-out measurements excluded). "curve": at log-spaced budget points, the
incumbent's hard training and held-out objective, for the equal-budget comparisons of
`moejax reproduce tuning`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from moejax.errors import CheckpointError, ConfigError
from moejax.output.results import atomic_write_json
from moejax.systems.epsmoe.tuning import ChunkAssignment
from moejax.tunable import IntegerKnob, LogKnob, Placement, ReplicaPlacement, Threshold
from moejax.tune import checkpoint as ck
from moejax.tune import loop, records

SEARCHES = loop.SEARCHES
BLACK_BOX = SEARCHES[1:]
U_LO, U_HI = 1e-3, 1.0 - 1e-3  # the sigmoid position of a continuous knob
STORE = "trials.jsonl"


def check(prob: loop.Problem, search: str) -> None:
    """ConfigError (one line) unless `search` can handle every family of the problem."""
    if search not in SEARCHES:
        raise ConfigError(f"search = {search!r}; allowed: {', '.join(SEARCHES)}")
    if search == "grad":
        return
    for name, f in prob.setup.families.items():
        if isinstance(f, (Placement, ReplicaPlacement)):
            if search == "grid":
                raise ConfigError(f"search = 'grid' cannot enumerate {name} ({f.num_devices}^"
                                  f"{f.num_experts} placements); allowed for placements: "
                                  "grad, tpe, cmaes, random")
            if isinstance(f, ReplicaPlacement) and f.num_layers:
                raise ConfigError(f"search = {search!r} has no encoding of per-layer {name}; "
                                  "allowed for it: grad")
        elif isinstance(f, ChunkAssignment):
            if search == "grid":
                raise ConfigError(f"search = 'grid' cannot enumerate {name} ({f.local_experts}"
                                  f"^{f.num_devices * f.local_experts} assignments); allowed "
                                  "for it: grad, tpe, cmaes, random")
        elif not isinstance(f, (IntegerKnob, Threshold, LogKnob)):
            raise ConfigError(f"search = {search!r} has no encoding of {name} "
                              f"({type(f).__name__}); allowed for it: grad")


def layers_of(traces) -> int:
    return int(np.shape(traces.counts)[-2])


def grad_cost_per_step(prob: loop.Problem) -> int:
    """Simulated layer-traces of one gradient step: the batch, x the hard corner runs of
    the lattice relaxation."""
    cost = prob.cfg.batch * layers_of(prob.train)
    if prob.cfg.relaxation == "lattice":
        setup = prob.setup
        cost *= len(setup.variants) if setup.structural else 2 ** len(setup.families)
    return cost


def cumulative_times(trials) -> tuple[np.ndarray, np.ndarray]:
    """Wall and CPU seconds spent up to each trial (cumulative sums, seconds)."""
    return (np.cumsum([t.user_attrs.get("wall_s", 0.0) for t in trials]),
            np.cumsum([t.user_attrs.get("cpu_s", 0.0) for t in trials]))


def save_best(out, cfg, prob, raw, trials, best_so_far, cost, **about) -> dict:
    """Save the best trial's raw parameters as the run's checkpoint (unless a finished search
    was resumed: already saved) and return the search's budget: simulated layer-traces (or
    `about`'s unit) at `cost` per trial, hard evaluations, wall and CPU seconds."""
    mgr = ck.Checkpoints(out, every=1, keep=cfg.keep)
    if mgr.latest_step() != len(trials):
        mgr.save(len(trials), ck.flatten_state(raw, prob.optimizer.init(raw)),
                 {"run": cfg.spec(), "history": best_so_far.tolist()}, force=True)
    mgr.close()
    walls, cpus = cumulative_times(trials)
    return {"search": cfg.search, **about, "layer_traces": int(cost * len(trials)),
            "hard_evaluations": len(trials), "relaxed_evaluations": 0,
            "wall_s": float(walls[-1]), "cpu_s": float(cpus[-1])}


def curve_points(n: int, count: int = 12) -> list[int]:
    """About `count` log-spaced budget points in 1..n (n included)."""
    pts = np.unique(np.round(np.geomspace(1, n, count)).astype(int))
    return [int(p) for p in pts if p >= 1]


class Clock:
    """Wall and CPU seconds, with pauses (held-out measurements are not search time)."""

    def __init__(self, wall: float = 0.0, cpu: float = 0.0):
        self.wall0, self.cpu0 = time.perf_counter() - wall, time.process_time() - cpu
        self.paused = None

    def now(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall0, time.process_time() - self.cpu0

    def pause(self):
        self.paused = (time.perf_counter(), time.process_time())

    def resume(self):
        w, c = self.paused
        self.wall0 += time.perf_counter() - w
        self.cpu0 += time.process_time() - c


# --- encodings -------------------------------------------------------------------------------


def repair(ids: np.ndarray, num_devices: int, capacity: int) -> np.ndarray:
    """Device ids [E] made to respect `capacity`: see the module docstring (tpe)."""
    ids = np.array(ids, np.int64)
    count = np.bincount(ids, minlength=num_devices)
    seen = np.zeros(num_devices, np.int64)
    over = []
    for e, d in enumerate(ids):  # once per trial, host side: E is small (<= a few hundred)
        seen[d] += 1
        if seen[d] > capacity:
            over.append(e)
    count = np.minimum(count, capacity)
    for e in over:
        d = int(np.argmax(capacity - count))
        ids[e] = d
        count[d] += 1
    return ids


def keys_to_ids(keys: np.ndarray, capacity: int) -> np.ndarray:
    """Random keys [E] -> device ids: experts sorted by key fill devices `capacity` each."""
    ids = np.empty(keys.shape[0], np.int64)
    ids[np.argsort(keys, kind="stable")] = np.arange(keys.shape[0]) // capacity
    return ids


def replica_shares(primary: np.ndarray, owner_u: np.ndarray, device_u: np.ndarray,
                   f: ReplicaPlacement) -> np.ndarray:
    """Token shares [E, D] of a replica placement from three vectors in [0, 1): the
    primary keys [E] (experts sorted by key fill the devices ceil(E / D) each, as a
    `Placement`), and per redundant slot j [R] its expert floor(owner_u * (E + 1)) (E: the
    slot stays empty) and its device floor(device_u * D), moved on cyclically to the first
    device with a free slot that does not hold the expert yet (none: the slot stays empty).
    Replicas split their expert's tokens evenly (the `ReplicaPlacement` share logits 0)."""
    e, d = f.num_experts, f.num_devices
    occ = np.zeros((e, d))
    occ[np.arange(e), keys_to_ids(primary, -(-e // d))] = 1.0
    for u, v in zip(owner_u, device_u, strict=True):  # R slots, host side, once per trial
        x = min(int(u * (e + 1)), e)
        if x == e:
            continue
        for k in range(d):
            dev = (min(int(v * d), d - 1) + k) % d
            if occ[:, dev].sum() < f.slots and occ[x, dev] == 0:
                occ[x, dev] = 1.0
                break
    return occ / occ.sum(1, keepdims=True)


def suggest(trial, prob: loop.Problem, search: str) -> dict:
    """Hard values of the problem's families from an Optuna trial (module docstring)."""
    values = {}
    for name, f in prob.setup.families.items():
        if isinstance(f, Placement):
            rows = []
            for layer in range(max(f.num_layers, 1)):
                p = f"{name}.{layer}." if f.num_layers else f"{name}."
                if search == "tpe":
                    ids = [trial.suggest_int(f"{p}{e}", 0, f.num_devices - 1)
                           for e in range(f.num_experts)]
                    rows.append(repair(np.asarray(ids), f.num_devices, f.capacity))
                else:
                    keys = [trial.suggest_float(f"{p}{e}", 0.0, 1.0)
                            for e in range(f.num_experts)]
                    rows.append(keys_to_ids(np.asarray(keys), f.capacity))
            values[name] = np.stack(rows) if f.num_layers else rows[0]
        elif isinstance(f, ReplicaPlacement):
            def floats(tag, n, name=name):
                return np.asarray([trial.suggest_float(f"{name}.{tag}{i}", 0.0, 1.0)
                                   for i in range(n)])
            values[name] = replica_shares(floats("k", f.num_experts), floats("r", f.extra),
                                          floats("d", f.extra), f)
        elif isinstance(f, ChunkAssignment):
            values[name] = np.asarray(
                [[trial.suggest_int(f"{name}.{d}.{j}", 0, f.local_experts - 1)
                  for j in range(f.local_experts)] for d in range(f.num_devices)], np.int64)
        elif isinstance(f, IntegerKnob):
            idx = trial.suggest_int(name, int(f.lo), int(f.hi))
            divs = getattr(f, "divs", ())  # a knob over an index of allowed values
            values[name] = divs[idx] if divs else idx
        else:
            values[name] = trial.suggest_float(name, U_LO, U_HI)
    return values


def to_raw(prob: loop.Problem, values: dict) -> dict:
    """Raw parameters whose rounding (`loop.hard_values`) gives `decode(values)`: searched
    values (`suggest`) to a placement as init_scale x one-hot logits, an integer through the
    family's preimage, a continuous knob's u as logit(u)."""
    raw = {}
    for name, f in prob.setup.families.items():
        v = values[name]
        if isinstance(f, (Placement, ChunkAssignment)):
            raw[name] = f.init_scale * f.one_hot(v)
        elif isinstance(f, ReplicaPlacement):
            raw[name] = f.init(jax.random.key(0), v)
        elif isinstance(f, IntegerKnob):
            raw[name] = f.init(None, v)
        else:
            raw[name] = jnp.float32(np.log(v / (1.0 - v)))
    return raw


def grid_points(prob: loop.Problem, budget: int) -> list[dict]:
    """The grid's trials in order: every integer of each integer knob, n u-values per
    continuous knob (n as large as `budget` allows, at least 2); when the product exceeds
    `budget`, `budget` points evenly spaced along it."""
    import itertools

    fams = prob.setup.families
    axes = {k: list(range(int(f.lo), int(f.hi) + 1)) for k, f in fams.items()
            if isinstance(f, IntegerKnob)}
    cont = [k for k in fams if k not in axes]
    n_int = int(np.prod([len(v) for v in axes.values()])) if axes else 1
    n = max(2, int((budget / n_int) ** (1.0 / len(cont)))) if cont else 0
    axes.update({k: [float(u) for u in np.linspace(U_LO, U_HI, n)] for k in cont})
    names = list(axes)
    pts = [dict(zip(names, p, strict=True)) for p in itertools.product(*axes.values())]
    if len(pts) > budget:
        pts = [pts[i] for i in np.unique(np.linspace(0, len(pts) - 1, budget).round()
                                         .astype(int))]
    return pts


# --- the black-box run -------------------------------------------------------------------------


def _sampler(search: str, prob: loop.Problem, seed: int):
    import optuna

    if search == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if search == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    return optuna.samplers.RandomSampler(seed=seed)  # random; grid: enqueued points


def _study(out: Path, search: str, prob: loop.Problem, resume: bool):
    """(Optuna study in memory, trial log path): the log's trials are added back on resume."""
    try:
        import optuna
    except ImportError as e:
        raise ConfigError(f"search = {search!r} needs optuna and cmaes: pip install "
                          "'moejax[search]'") from e
    from optuna.distributions import json_to_distribution

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    path = out / STORE
    if path.exists() and not resume:
        raise CheckpointError(f"{out}: already holds a search ({STORE}); pass --resume or "
                              "another --out")
    if out.is_dir() and not path.exists() and any(p.name.isdigit() for p in out.iterdir()):
        raise CheckpointError(f"{out}: already holds checkpoints of another run; use "
                              "another --out")
    study = optuna.create_study(direction="minimize")
    if path.exists():
        lines = path.read_text().splitlines()
        try:
            head = json.loads(lines[0]) if lines else {}
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{path}: unreadable first line ({e})") from e
        ck.check_same_run({"run": head.get("run", {})}, prob.cfg.spec(), str(out))
        for line in lines[1:]:
            try:
                t = json.loads(line)
            except json.JSONDecodeError:
                break  # a trial cut short by an interruption: run it again
            study.add_trial(optuna.trial.create_trial(
                params=t["params"], value=t["value"], user_attrs=t["attrs"],
                system_attrs=t["system"], distributions={
                    k: json_to_distribution(v) for k, v in t["dists"].items()}))
    done = len(study.trials)
    study.sampler = _sampler(search, prob, prob.cfg.seed + done)
    return study, path


def _log(path: Path, frozen, value: float, spec: dict) -> None:
    """Append one finished trial (a FrozenTrial) to the log (a JSON line; the run spec
    heads the file)."""
    from optuna.distributions import distribution_to_json

    with path.open("a") as f:
        if f.tell() == 0:
            f.write(json.dumps({"run": spec}) + "\n")
        f.write(json.dumps({"params": frozen.params, "value": value,
                            "attrs": frozen.user_attrs, "system": _jsonable(
                                frozen.system_attrs),
                            "dists": {k: distribution_to_json(d) for k, d in
                                      frozen.distributions.items()}}) + "\n")


def _jsonable(d: dict) -> dict:
    out = {}
    for k, v in d.items():
        try:
            json.dumps(v)
            out[k] = v
        except TypeError:
            continue
    return out


def _values_of(prob: loop.Problem, search: str, params: dict) -> dict:
    """Hard values of a finished trial's parameters (replayed through `suggest`)."""
    import optuna

    return suggest(optuna.trial.FixedTrial(params), prob, search)


def hard_objective(prob: loop.Problem, hard: dict, traces) -> float:
    """The run's loss of hard values on `traces` (hard mode, every trace)."""
    res = loop.evaluate_values(prob, hard, traces)
    return float(loop.reduce_loss(prob.cfg.loss, {k: jnp.asarray(v) for k, v in res.items()}))


def tune_black_box(cfg: loop.TuneConfig, out: str | Path, *, resume: bool = False,
                   progress: bool = True, callback=None,
                   evaluate_heldout: bool = True) -> loop.TuneResult:
    """A black-box search (`cfg.search`) of `cfg.steps` hard trials (module docstring)."""
    prob = loop.build_problem(cfg)
    check(prob, cfg.search)
    out = Path(out)
    study, log = _study(out, cfg.search, prob, resume)
    out.mkdir(parents=True, exist_ok=True)
    cost = engine_traces(prob.train)
    done = list(study.trials)
    grid = grid_points(prob, cfg.steps) if cfg.search == "grid" else None
    total = cfg.steps if grid is None else len(grid)
    with loop.progress_bar(progress, total, len(done)) as advance:
        while len(done) < total:
            w0, c0 = time.perf_counter(), time.process_time()
            if grid is not None:
                study.enqueue_trial(grid[len(done)])
            trial = study.ask()
            hard = decode(prob, suggest(trial, prob, cfg.search))
            value = hard_objective(prob, hard, prob.train)
            trial.set_user_attr("wall_s", time.perf_counter() - w0)
            trial.set_user_attr("cpu_s", time.process_time() - c0)
            study.tell(trial, value)
            _log(log, study.get_trials(deepcopy=False)[-1], value, cfg.spec())
            done.append(trial)
            advance(value, 0.0, 0.0)
            if callback is not None:
                callback(len(done), value)
    trials = [t for t in study.trials if t.state.name == "COMPLETE"][:total]
    vals = np.array([t.value for t in trials])
    best_so_far = np.minimum.accumulate(vals)
    best = trials[int(np.argmin(vals))]
    searched = _values_of(prob, cfg.search, best.params)
    hard = decode(prob, searched)
    raw = to_raw(prob, searched)
    got = loop.hard_values(prob, raw)
    for k in hard:  # replica shares come back through float32 logits: equal to 1e-6
        a, b = np.asarray(got[k]), np.asarray(hard[k])
        if not (np.array_equal(a, b) or (a.dtype.kind == "f" and a.shape == b.shape
                                          and np.allclose(a, b, rtol=0, atol=1e-6))):
            raise CheckpointError(f"{k}: raw parameters do not round back to the searched "
                                  "values (a moejax bug)")
    hard = got  # what `restore` and `--export` give
    budget = save_best(out, cfg, prob, raw, trials, best_so_far, cost)
    walls, cpus = cumulative_times(trials)
    evaluation = {}
    if evaluate_heldout:
        curve = []
        for n in curve_points(len(trials)):
            i = int(np.argmin(vals[:n]))
            h = decode(prob, _values_of(prob, cfg.search, trials[i].params))
            curve.append({"evals": n, "layer_traces": int(cost * n), "wall_s": float(walls[n - 1]),
                          "cpu_s": float(cpus[n - 1]), "train": float(best_so_far[n - 1]),
                          "heldout": hard_objective(prob, h, prob.heldout)})
        evaluation = loop.evaluate(prob, hard)
        write_summary(out, cfg, len(trials), float(best_so_far[-1]), evaluation, budget, curve)
    return loop.TuneResult(raw, hard, best_so_far.tolist(), evaluation, len(trials), budget)


def decode(prob: loop.Problem, searched: dict) -> dict:
    """Hard values of searched values: a continuous knob's u read as its family value, then
    the joint constraint's projection (as `loop.hard_values` does for the gradient)."""
    out = {}
    for name, f in prob.setup.families.items():
        v = searched[name]
        if isinstance(f, (Threshold, LogKnob)):
            v = f.hard(jnp.float32(np.log(v / (1.0 - v))))
        out[name] = v
    if prob.setup.constraint is not None:
        out = prob.setup.constraint.project(out)
    return out


def engine_traces(traces) -> int:
    """Layer-traces of one hard evaluation on `traces`."""
    return int(np.shape(traces.counts)[0]) * layers_of(traces)


def write_summary(out: Path, cfg, step: int, final_loss: float, evaluation: dict,
                  budget: dict, curve: list) -> None:
    """summary.json: the run, the held-out evaluation, the budget and the curve."""
    atomic_write_json(out / "summary.json",
                      {"run": records.run_record(cfg), "step": step, "final_loss": final_loss,
                       "evaluation": evaluation, "budget": budget, "curve": curve,
                       "provenance": records.run_provenance(cfg)})


# --- the gradient run's accounting ---------------------------------------------------------------


class GradientObserver:
    """Budget and curve of a gradient run: `observe(step, raw)` after each update records
    the rounded values at the curve points (their hard evaluation happens afterwards and is
    not search time). The points survive a resume through `curve.json`."""

    def __init__(self, prob: loop.Problem, out: Path, resume: bool):
        self.prob, self.out = prob, Path(out)
        self.points = set(curve_points(prob.cfg.steps))
        self.path = self.out / "curve.json"
        self.rows = []
        wall = cpu = 0.0
        if resume and self.path.exists():
            saved = json.loads(self.path.read_text())
            self.rows, wall, cpu = saved["rows"], saved["wall_s"], saved["cpu_s"]
        self.clock = Clock(wall, cpu)

    def __call__(self, step: int, raw: dict) -> None:
        if step not in self.points and step != self.prob.cfg.steps:
            return
        self.clock.pause()
        wall, cpu = self.clock.now()
        hard = loop.hard_values(self.prob, jax.device_get(raw))
        self.rows = [r for r in self.rows if r["evals"] < step]
        self.rows.append({"evals": step, "wall_s": wall, "cpu_s": cpu,
                          "hard": {k: np.asarray(v).tolist() for k, v in hard.items()}})
        # a resume restarts from a saved step and drops the rows after it, so the rows are
        # kept once a step is saved (before that a failed run must leave nothing behind)
        if any(p.name.isdigit() for p in self.out.glob("*")):
            atomic_write_json(self.path, {"rows": self.rows, "wall_s": wall, "cpu_s": cpu})
        self.clock.resume()

    def finish(self, step: int, final_loss: float, evaluation: dict) -> dict:
        """Budget of the run and its curve (hard train / held-out objectives); writes
        summary.json."""
        cost = grad_cost_per_step(self.prob)
        wall, cpu = self.clock.now()
        budget = {"search": "grad", "layer_traces": int(cost * step), "hard_evaluations": 0,
                  "relaxed_evaluations": step, "wall_s": wall, "cpu_s": cpu}
        curve = []
        for r in self.rows:
            hard = {k: (np.asarray(v) if isinstance(v, list) else v)
                    for k, v in r["hard"].items()}
            curve.append({"evals": r["evals"], "layer_traces": int(cost * r["evals"]),
                          "wall_s": r["wall_s"], "cpu_s": r["cpu_s"],
                          "train": hard_objective(self.prob, hard, self.prob.train),
                          "heldout": hard_objective(self.prob, hard, self.prob.heldout)})
        write_summary(self.out, self.prob.cfg, step, final_loss, evaluation, budget, curve)
        return budget
