"""Write tuned hard values as a named policy TOML that `moejax simulate --policy` reads.

The file is the base policy (system, [options]) with the tuned options replaced, and a
header saying where the values come from, and two provenance comment lines (the command
line and the moejax version that wrote it, `PROVENANCE_COMMENTS`). Apart from those it is a
pure function of the base policy, the run spec and the hard values (no time stamps), so
exporting a restored checkpoint gives the same bytes as exporting at the end of the run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from moejax.catalog.schema import read_toml
from moejax.errors import ConfigError
from moejax.output import provenance
from moejax.output.results import atomic_write_text
from moejax.trace import io as trace_io
from moejax.trace import provenance as trace_provenance

# the comment lines that name the process writing the file (its command line, version)
PROVENANCE_COMMENTS = ("# command: ", "# moejax version: ")


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ConfigError(f"export: cannot write non-finite value {v!r}")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise ConfigError(f"export: cannot write {type(v).__name__} value {v!r} to TOML")


def check_toml_path(path) -> Path:
    """`path` as a Path; a ConfigError unless it ends in .toml."""
    path = Path(path)
    if path.suffix != ".toml":
        raise ConfigError(f"export: {path} must end in .toml")
    return path


def policy_text(base, overrides: dict, run: dict, step: int, description: str = "",
                header: str = "") -> str:
    """TOML text of the tuned policy: `base` (a moejax.catalog.policies.Policy) with `overrides`.

    header: the comment lines saying how the values were tuned (default: a gradient run on
    traces, from `run`)."""
    options = dict(base.options)
    options.update(overrides)
    params = ", ".join(run.get("params", []))
    desc = description or (f"{base.system} tuned ({params}) for {run.get('model')} on "
                           f"{run.get('hardware')}")
    header = header or (
        f"# Tuned by `moejax tune` (moejax.tune): {params} of policy {base.name!r},\n"
        + (f"# {run.get('steps')} steps on recording {run.get('trace')} (the first "
           f"{run.get('train_fraction'):g} of its iterations; the rest held out),\n"
           f"# data: {data_line(run['trace'])},\n# seed {run.get('seed')}, "
           if run.get("trace") else
           f"# {run.get('steps')} steps on {run.get('traces')} traces of {run.get('trace_gen')}, "
           f"{run.get('tokens')} tokens x {run.get('iterations')} iterations x "
           f"{run.get('layers')} layers, seed {run.get('seed')}, ")
        + f"loss {run.get('loss')}; checkpoint step {step}.")
    lines = [
        *header.rstrip("\n").split("\n"),
        f"{PROVENANCE_COMMENTS[0]}{provenance.command()}".replace("\n", " "),
        f"{PROVENANCE_COMMENTS[1]}{provenance.version()}",
        f"system = {_toml_value(base.system)}",
        f"description = {_toml_value(desc)}",
        f"source = {_toml_value('moejax tune; base: ' + base.source)}",
        "",
        "[options]",
    ]
    lines += [f"{k} = {_toml_value(options[k])}" for k in sorted(options)]
    return "\n".join(lines) + "\n"


def data_line(trace_path: str) -> str:
    """One line naming a recording's data (source, importer, derivation steps)."""
    meta = trace_io.load_meta(trace_path)
    return provenance.one_line(trace_provenance.describe(trace_path, meta)).replace("\n", " ")


def write_policy(path: str | Path, prob, hard: dict, step: int, description: str = "",
                 hardware_path: str | Path | None = None) -> Path:
    """Export hard values of a tuning `Problem` to `path` (atomic); returns the path.

    Tuned values that a policy has no key for (the fsedp DDR / D2D bandwidths) go to a
    platform TOML at `hardware_path` (`TuneSetup.platform_values`), required then."""
    path = check_toml_path(path)
    if hardware_path is not None:
        check_toml_path(hardware_path)
    hw_text = None
    values = (None if prob.setup.platform_values is None
              else prob.setup.platform_values(hard))
    if values is not None:
        run = prob.cfg.spec()
        header = (f"Tuned by `moejax tune` ({', '.join(run['params'])}) for {run['model']} "
                  f"on {run['hardware']}, checkpoint step {step};\nuse with the policy "
                  f"{path.name} (moejax simulate --hardware THIS --policy {path.name}).")
        hw_text = platform_toml(prob.platform, values.get("ddr_Bps"), values.get("link_Bps"),
                                header)
    if hw_text is not None and hardware_path is None:
        raise ConfigError("export: ddr_Bps / link_Bps are platform values that a policy has no "
                          "key for; give a hardware path too (--export-hardware NAME.toml)")
    text = policy_text(prob.policy, prob.setup.options(hard), prob.cfg.spec(), step,
                       description)
    if hw_text is not None:
        atomic_write_text(Path(hardware_path), hw_text)
    atomic_write_text(path, text)
    return path


def platform_toml(platform, ddr_Bps: float | None, link_Bps: float | None, header: str) -> str:
    """TOML text of `platform` (its catalog file) with the die's DDR bandwidth and the D2D
    link bandwidth replaced (None: kept): the tuned hardware, for `moejax simulate
    --hardware`. The text is a function of its arguments only."""
    data = read_toml(Path(platform.path))
    if ddr_Bps is not None:
        data["device"]["memory_Bps"] = float(ddr_Bps)
    if link_Bps is not None:
        data["topology"]["link_Bps"] = float(link_Bps)
    data["source"] = f"moejax tune (000 §VI-D Eq. (1)-(2)); base: {data.get('source', '')}"

    def table(d, prefix):
        lines = [f"{k} = {_toml_value(v)}" for k, v in d.items() if not isinstance(v, dict)]
        for k, v in d.items():
            if isinstance(v, dict):
                name = f"{prefix}.{k}" if prefix else k
                lines += ["", f"[{name}]"] + table(v, name)
        return lines

    return "\n".join([f"# {line}" for line in header.splitlines()] + table(data, "")) + "\n"
