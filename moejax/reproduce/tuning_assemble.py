"""One result folder of `moejax reproduce tuning` from runs that each computed some of its
families, simulating nothing: e.g. a full run of the first nine families plus a run of a
later family alone (`--only epsmoe_chunks`), assembled into `docs/results/tuning/full/`.

    moejax reproduce tuning --assemble SRC [SRC ...] --out OUT

Each family of the grid (quick or full, as the sources' summary.json say; they must agree)
is taken from the last source that holds its CSVs (`FAMILY.csv`, `FAMILY_final.csv`): the
family's CSV files and PNG are copied unchanged (the PNG drawn from the CSVs when the
source has none), and its rows are read back (`read_family`) for the headline
(`tuning.headline_of`: the budget table of every family, the equal-wall-time table) and the
claims, which are the study's own checks on those rows. A source whose summary.json gives
that family another budget or other seeds than the grid does is refused (one line, exit 2,
nothing written). summary.json: the claims and tally, the study's `about` entries, each
family's compute time from its source, `assembled_from` (per source: folder, families
taken, its run's wall_s and provenance) and `wall_s`, the sum of the sources' run times.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from moejax.errors import ConfigError
from moejax.output.staging import staged_dir
from moejax.reproduce import tuning
from moejax.reproduce.study import (
    Report,
    Rows,
    check_claims,
    read_back,
    read_table,
    write_summary,
    write_table,
)


def _records(path: Path) -> list[dict]:
    """A study CSV as row dicts: numbers as float (seeds as int), an empty cell as ""."""
    cols = read_table(path)
    out = []
    for vals in zip(*cols.values(), strict=True):
        row = {}
        for k, x in zip(cols, vals, strict=True):
            if isinstance(x, float) and math.isnan(x):
                x = ""
            elif k == "seed":
                x = int(x)
            row[k] = x
        out.append(row)
    return out


def read_family(folder: Path, name: str, summary: dict) -> Rows:
    """The Rows `tuning.family_rows` computed, read back from a run's folder (its CSVs and
    summary.json). The budget table is the run's own `FAMILY_budget.csv` (as written, to
    its 9 significant digits; recomputed from the curve and final rows when absent)."""
    folder = Path(folder)
    key = f"{name}_compute_s"
    rows = tuning.family_result(name, _records(folder / f"{name}.csv"),
                                _records(folder / f"{name}_final.csv"),
                                {key: summary[key]} if key in summary else {})
    table = folder / f"{name}_budget.csv"
    if table.is_file():
        rows.extra["table"] = rows.more[table.name] = _records(table)
    return rows


def _sources(sources) -> list[tuple[Path, dict]]:
    out = []
    for s in sources:
        path = Path(s) / "summary.json"
        if not path.is_file():
            raise ConfigError(f"source {s}: no summary.json; expected a folder written by "
                              "`moejax reproduce tuning --out DIR`")
        summary = json.loads(path.read_text(encoding="utf-8"))
        if summary.get("study") != "tuning":
            raise ConfigError(f"source {s}: summary.json of study {summary.get('study')!r}; "
                              "allowed: tuning")
        out.append((Path(s), summary))
    if not out:
        raise ConfigError("sources: none given; allowed: one or more result folders of "
                          "`moejax reproduce tuning`")
    grids = {bool(sm["quick"]) for _, sm in out}
    if len(grids) > 1:
        raise ConfigError("sources: quick and full runs mixed; allowed: all quick or all full")
    return out


def _holder(sources, name: str, grid) -> tuple[Path, dict]:
    """The last source holding family `name`, checked against the grid's entry."""
    have = [(p, sm) for p, sm in sources
            if (p / f"{name}.csv").is_file() and (p / f"{name}_final.csv").is_file()]
    if not have:
        raise ConfigError(f"family {name}: in none of the sources "
                          f"({', '.join(str(p) for p, _ in sources)}); run it with "
                          f"`moejax reproduce tuning --only {name}`")
    path, sm = have[-1]
    budget, seeds, _ = next(x[1:] for x in grid.families if x[0] == name)
    got = (sm.get("budget_layer_traces", {}).get(name), sm.get("seeds", {}).get(name))
    if got != (budget, list(seeds)):
        raise ConfigError(f"family {name} in {path}: budget {got[0]}, seeds {got[1]}; allowed: "
                          f"the grid's budget {budget}, seeds {list(seeds)}")
    return path, sm


def assemble(sources, out: Path | str) -> Report:
    """Write the assembled result folder `out` (module docstring) and return its Report."""
    study = tuning.STUDY
    srcs = _sources(sources)
    quick = bool(srcs[0][1]["quick"])
    grid = study.grid(quick)
    names = [n for n, *_ in grid.families]
    taken = {name: _holder(srcs, name, grid) for name in names}
    results, files = {}, []
    extra = dict(study.about(grid))
    figures = {f.name: f for f in study.figures}
    with staged_dir(Path(out)) as tmp:
        for name in names:
            src, sm = taken[name]
            results[name] = rows = read_family(src, name, sm)
            extra.update(rows.summary)
            for f in (f"{name}.csv", *rows.more):
                if (src / f).is_file():
                    shutil.copyfile(src / f, tmp / f)
                else:
                    write_table(tmp / f, rows.more[f])
                files.append(f)
            if (src / f"{name}.png").is_file():
                shutil.copyfile(src / f"{name}.png", tmp / f"{name}.png")
            else:
                figures[name].plot(tmp / f"{name}.png", read_back(tmp, figures[name], {}),
                                   grid)
            files.append(f"{name}.png")
        head = tuning.headline_of([results[n] for n in names])
        write_table(tmp / "headline.csv", head.cols)
        for f, table in head.more.items():
            write_table(tmp / f, table)
        figures["headline"].plot(tmp / "headline.png",
                                 read_back(tmp, figures["headline"], {}), grid)
        files = ["headline.csv", *head.more, "headline.png", *files]
        claims = check_claims(study, results, grid)
        used = [(p, sm, [n for n in names if taken[n][0] == p]) for p, sm in srcs]
        extra["assembled_from"] = [
            {"folder": str(p), "families": fams, "wall_s": sm.get("wall_s"),
             "provenance": sm.get("provenance")} for p, sm, fams in used if fams]
        extra["wall_s"] = sum(float(sm.get("wall_s") or 0.0) for _, sm, fams in used if fams)
        report = Report(study.name, claims, files, extra)
        write_summary(tmp, report, quick)
    return report
