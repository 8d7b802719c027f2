"""The registry (`moejax.systems.SYSTEMS`): a system is one entry, and every list of systems
is derived from it. A toy system registered from this file runs through the public paths
(`moejax simulate`, `sweep`, `tune`, `--help`, `moejax.api.simulate`) with no other change;
every list the CLI, the help text, tuning, sweeps and the studies show equals the registry's;
and the system packages import neither the tuner, the studies, the API nor the CLI."""

from __future__ import annotations

import ast
import csv
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from moejax import api, reproduce, systems
from moejax import tunable as fam
from moejax.catalog.policies import load_policy, policy_names
from moejax.cli.help import _parsers
from moejax.cli.main import build_parser, main
from moejax.errors import ConfigError
from moejax.system import System, SystemEntry, TuneSetup, Tuning
from moejax.systems.amoe import serve
from moejax.trace import gen
from moejax.tune import targets

# --- a toy system: one MoE layer whose time is us_per_token per token on the busiest device --


@struct.dataclass
class ToyParams:
    us_per_token: jax.Array  # microseconds per routed token a device handles
    tau: jax.Array = struct.field(default_factory=lambda: jnp.float32(0.0))


def _read(t) -> float:
    us = t.float("us_per_token", 1.0)
    t.close()
    return us


def toy_check_options(t) -> None:
    _read(t)


def toy_from_policy(platform, model, t, num_iterations):
    """(System, params): each iteration's MoE layers take the busiest device's routed
    tokens (experts dealt round-robin) times us_per_token."""
    us, d = _read(t), platform.num_devices
    owner = jnp.arange(model.num_experts) % d

    def init(params, trace, key):
        return jnp.float32(0.0)  # routed tokens so far

    def step(params, state, counts):  # counts [L, E]: this iteration's routing
        per_dev = jax.vmap(lambda c: jnp.zeros(d).at[owner].add(c))(counts)  # [L, D]
        lat = per_dev.max(-1) * params.us_per_token * 1e-6  # [L]
        return state + counts.sum(), (lat.mean(), lat.sum())

    def finish(params, state, outs):
        lat, fwd = outs  # [I]
        return {"latency_s": lat.mean(), "forward_s": fwd.mean(),
                "utilization_mean": jnp.float32(1.0),
                "tokens_per_s": state / jnp.maximum(fwd.sum(), 1e-12)}

    system = System("toy", init, step, finish, num_iterations,
                    inputs=lambda trace: trace.counts)
    return system, ToyParams(jnp.float32(us))


def toy_setup(platform, model, policy, num_iterations, names, capacity=0) -> TuneSetup:
    system, base = toy_from_policy(platform, model, policy.options_table(), num_iterations)
    families = {"us_per_token": fam.LogKnob("us_per_token", 0.1, 10.0)}

    def apply(base, values, tau):
        return base.replace(us_per_token=jnp.asarray(values["us_per_token"], jnp.float32),
                            tau=jnp.asarray(tau, jnp.float32))

    return TuneSetup(system, base, families, apply,
                     {"us_per_token": float(base.us_per_token)},
                     lambda load_e: {"grid us=2": {"us_per_token": 2.0}},
                     lambda hard: {"us_per_token": float(hard["us_per_token"])})


TOY = SystemEntry("toy", "a toy system registered by tests/test_registry.py",
                  toy_from_policy, toy_check_options, ("chiplet", "gpu"),
                  tuning=Tuning(("us_per_token",), toy_setup), default_policy="toy")

SMALL = ["--hardware", "chiplet-2x2", "--model", "qwen3-30b-a3b", "--tokens", "16",
         "--quiet"]


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy system registered (one dictionary entry), and a policy file for it."""
    monkeypatch.setitem(systems.SYSTEMS, "toy", TOY)
    path = tmp_path / "toy.toml"
    path.write_text('system = "toy"\ndescription = "toy"\nsource = "test"\n\n'
                    "[options]\nus_per_token = 2.0\n")
    return str(path)


def _help(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def _rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_toy_system_simulates_through_the_cli_and_the_api(toy, tmp_path):
    out = tmp_path / "sim"
    assert main(["simulate", "--policy", toy, "--traces", "4", *SMALL, "--out",
                 str(out)]) == 0
    rows = _rows(out / "results.csv")
    summary = json.loads((out / "summary.json").read_text())
    assert len(rows) == 4 and summary["system"] == "toy"
    # the API, on the same traces: the same numbers
    m = load_policy(toy)
    model = api.resolve("chiplet-2x2", "qwen3-30b-a3b", m).model
    traces = gen.generate_chunked(gen.parse_spec("powerlaw:alpha=1.2"), jax.random.key(0),
                                  num_traces=4, iterations=1, layers=1, tokens=16,
                                  num_experts=model.num_experts, top_k=model.top_k)
    res = api.simulate("chiplet-2x2", "qwen3-30b-a3b", toy, traces, progress=False)
    np.testing.assert_allclose([float(r["latency_s"]) for r in rows], res["latency_s"],
                               rtol=1e-6)
    assert (res["latency_s"] > 0).all()


def test_toy_system_sweeps(toy, tmp_path):
    out = tmp_path / "sweep"
    assert main(["sweep", "--policy", toy, "--vary", "us_per_token=1,2", "--traces", "2",
                 *SMALL, "--out", str(out)]) == 0
    rows = _rows(out / "sweep.csv")
    lat = [float(r["latency_s_mean"]) for r in rows]
    assert len(rows) == 2 and lat[1] == pytest.approx(2 * lat[0], rel=1e-6)  # linear in us


def test_toy_system_tunes_and_exports(toy, tmp_path):
    out, exported = tmp_path / "tune", tmp_path / "tuned.toml"
    assert main(["tune", "--system", "toy", "--policy", toy, "--param", "us_per_token",
                 "--steps", "4", "--traces", "4", "--batch", "2", "--eval-traces", "4",
                 "--iterations", "1", "--relaxation", "system", "--lr", "0.5",
                 "--hardware", "chiplet-2x2", "--model", "qwen3-30b-a3b", "--tokens", "16",
                 "--quiet", "--out", str(out), "--export", str(exported)]) == 0
    ev = json.loads((out / "summary.json").read_text())["evaluation"]
    # latency grows with us_per_token: descent lowers it below the policy's 2.0
    assert ev["tuned"]["latency_ms"]["mean"] < ev["default"]["latency_ms"]["mean"]
    tuned = systems.checked_policy(str(exported))  # a valid toy policy
    assert tuned.system == "toy" and dict(tuned.options)["us_per_token"] < 2.0


def test_toy_system_in_every_list(toy, capsys):
    top = _help(["--help"], capsys)
    assert f"systems (a policy's `system`): {', '.join(systems.SYSTEMS)}" in top
    assert "toy" in top
    tune = _help(["tune", "--help"], capsys)
    assert "tunable: ep, fsedp, wafer, aep, dysharp, epsmoe, toy)" in tune
    assert "toy: us_per_token" in tune and "toy for toy" not in tune
    assert "toy" in targets.tunable()
    assert main(["catalog", "systems"]) == 0
    table = capsys.readouterr().out
    assert all(k in table for k in systems.SYSTEMS) and "a toy system" in table
    # a policy naming an unregistered system lists the registered ones, toy among them
    bad = Path(toy).with_name("bad.toml")
    bad.write_text('system = "nope"\ndescription = "x"\nsource = "y"\n')
    with pytest.raises(ConfigError, match=f"allowed: {', '.join(sorted(systems.SYSTEMS))}"):
        systems.checked_policy(str(bad))


def test_every_list_equals_the_registry(capsys):
    entries = systems.SYSTEMS
    assert list(entries) == [e.name for e in systems.ENTRIES]
    # help text
    top = _help(["--help"], capsys)
    assert f"systems (a policy's `system`): {', '.join(entries)}" in top
    assert f"studies (moejax reproduce NAME [--quick] --out DIR): " \
           f"{', '.join(systems.studies())}" in top
    tune = _help(["tune", "--help"], capsys)
    tunable = [k for k, e in entries.items() if e.tuning is not None]
    assert f"(tunable: {', '.join(tunable)})" in tune
    for k in tunable:
        assert f"{k}: " in tune and entries[k].default_policy in tune
    per_layer = [k for k in tunable if entries[k].tuning.per_layer]
    assert f"{', '.join(per_layer)}: one placement per trace layer" in tune
    streams = ", ".join(systems.names("streams"))
    assert f"stream-serving systems ({streams})" in _help(["simulate", "--help"], capsys)
    assert f"stream-serving systems ({streams}" in _help(["sweep", "--help"], capsys)
    assert ", ".join(systems.studies()) in _help(["reproduce", "--help"], capsys)
    # tuning, serving, studies
    assert list(targets.tunable()) == [k for k in tunable if entries[k].tuning.setup]
    assert serve.stream_systems() == tuple(systems.names("streams"))
    assert set(systems.studies()) == set(reproduce.STUDIES)
    # every catalog policy names a registered system that takes its options; every system's
    # default policy is one of them and is for that system
    assert {systems.checked_policy(n).system for n in policy_names()} <= set(entries)
    for k, e in entries.items():
        assert load_policy(e.default_policy).system == k
    # the parser dispatches every (sub)command to a module of moejax.cli
    fns = {p.get_default("fn") for p in _parsers(build_parser())} - {None}
    assert len(fns) == 8 and all(f.__module__.startswith("moejax.cli.") for f in fns)


# --- the layers this registry keeps apart ------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1] / "moejax"


def _imports(path: Path) -> set[str]:
    """Every moejax module a file imports (module level or function-local)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m.startswith("moejax")}


def _under(names: set[str], *prefixes: str) -> list[str]:
    return sorted(m for m in names if any(m == p or m.startswith(p + ".") for p in prefixes))


@pytest.mark.parametrize("folder, banned", [
    ("systems", ("moejax.runner", "moejax.tune", "moejax.reproduce", "moejax.api",
                 "moejax.cli")),
    ("catalog", ("moejax.systems", "moejax.runner", "moejax.tune", "moejax.cli")),
    ("runner", ("moejax.tune", "moejax.reproduce", "moejax.api")),
    ("tune", ("moejax.reproduce", "moejax.api", "moejax.cli")),
])
def test_no_upward_imports(folder, banned):
    bad = {str(p.relative_to(ROOT)): _under(_imports(p), *banned)
           for p in (ROOT / folder).rglob("*.py")}
    assert not {k: v for k, v in bad.items() if v}


def test_tune_modules_import_without_cycles():
    graph = {p.stem: {m.split(".")[2] for m in _under(_imports(p), "moejax.tune")
                      if m.count(".") >= 2}
             for p in (ROOT / "tune").glob("*.py") if p.stem != "__init__"}
    graph = {k: {m for m in v if m in graph and m != k} for k, v in graph.items()}
    done = set()

    def visit(n, path):
        assert n not in path, f"cycle: {' -> '.join([*path, n])}"
        if n in done:
            return
        for m in graph[n]:
            visit(m, (*path, n))
        done.add(n)

    for n in graph:
        visit(n, ())


def test_argparse_only_in_the_cli():
    users = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
             if "argparse" in {a.name for n in ast.walk(ast.parse(p.read_text()))
                               if isinstance(n, ast.Import) for a in n.names}]
    assert users and all(u.startswith("cli/") for u in users), users
