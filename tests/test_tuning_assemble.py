"""`moejax reproduce tuning`: the equal-wall-time table, and one result folder assembled
from runs of some families each (`moejax.reproduce.tuning_assemble`), nothing simulated."""

import json
import shutil
from pathlib import Path

import pytest

from moejax.cli.main import main
from moejax.reproduce import tuning
from moejax.reproduce import tuning_claims as tc

QUICK = Path(__file__).resolve().parents[1] / "docs" / "results" / "tuning"


def test_equal_wall_compares_at_the_shortest_whole_run():
    curve, final = [], []
    for m, pts in {"grad": [(4.0, 9.8), (8.0, 9.5)],  # (wall s, held-out ms)
                   "tpe": [(0.5, 10.4), (1.0, 10.0), (2.0, 9.9)],
                   "random": [(0.5, 10.2), (3.0, 9.6)]}.items():
        for i, (w, v) in enumerate(pts):
            curve.append({"family": "f", "seed": 0, "method": m, "evals": i + 1,
                          "layer_traces": 16 * (i + 1), "wall_s": w, "heldout_ms": v})
        final.append({"family": "f", "seed": 0, "method": m, "heldout_ms": pts[-1][1],
                      "wall_s": pts[-1][0]})
    final.append({"family": "f", "seed": 0, "method": "default", "heldout_ms": 11.0,
                  "wall_s": 0.0})
    by = {r["method"]: r for r in tc.equal_wall(curve, final)}
    assert set(by) == {"grad", "tpe", "random"}  # no row for a method without a search
    assert by["tpe"]["equal_wall_s"] == 2.0  # TPE's whole run is the shortest
    assert by["tpe"]["heldout_ms"] == 9.9 and by["random"]["heldout_ms"] == 10.2
    assert by["grad"]["seeds_with_a_point"] == "0/1" and by["grad"]["heldout_ms"] == ""
    assert by["random"]["over_best_pct"] == pytest.approx((10.2 / 9.5 - 1) * 100)


def test_assembling_the_committed_quick_run_gives_its_headline_and_claims(tmp_path):
    out = tmp_path / "all"
    assert main(["reproduce", "tuning", "--assemble", str(QUICK), "--out", str(out)]) == 0
    got = json.loads((out / "summary.json").read_text())
    want = json.loads((QUICK / "summary.json").read_text())
    keys = ("id", "paper", "simulated", "holds", "note", "verdict")
    assert [{k: c[k] for k in keys} for c in got["claims"]] == \
        [{k: c[k] for k in keys} for c in want["claims"]]
    assert got["tally"] == want["tally"] and got["quick"] is True
    for name in ("headline.csv", "headline_equal_wall.csv", *(
            f"{n}{s}" for n in tuning.FAMILIES for s in (".csv", "_final.csv", "_budget.csv",
                                                          ".png"))):
        assert (out / name).read_bytes() == (QUICK / name).read_bytes(), name
    assert got["assembled_from"][0]["families"] == [n for n, *_ in tuning.QUICK.families]


def _one_family(src: Path, dst: Path, name: str, **change) -> Path:
    """A copy of `src`'s files of family `name` and its summary.json (entries changed)."""
    dst.mkdir()
    for f in src.glob(f"{name}*"):
        if f.name.removeprefix(name).split(".")[0] in ("", "_final", "_budget"):
            shutil.copyfile(f, dst / f.name)
    summary = json.loads((src / "summary.json").read_text())
    summary.update(change)
    (dst / "summary.json").write_text(json.dumps(summary))
    return dst


def test_later_source_wins_and_bad_sources_exit_2(tmp_path, capsys):
    one = _one_family(QUICK, tmp_path / "one", "epsmoe", wall_s=1.5)
    out = tmp_path / "out"
    assert main(["reproduce", "tuning", "--assemble", str(QUICK), str(one),
                 "--out", str(out)]) == 0
    got = json.loads((out / "summary.json").read_text())
    assert [s["families"] for s in got["assembled_from"]] == [
        [n for n, *_ in tuning.QUICK.families if n != "epsmoe"], ["epsmoe"]]
    assert got["wall_s"] == pytest.approx(
        json.loads((QUICK / "summary.json").read_text())["wall_s"] + 1.5)
    capsys.readouterr()
    bad_budget = _one_family(QUICK, tmp_path / "b", "epsmoe",
                             budget_layer_traces={"epsmoe": 1})
    full = _one_family(QUICK, tmp_path / "full", "epsmoe", quick=False)
    other = _one_family(QUICK, tmp_path / "other", "epsmoe", study="fsedp")
    for srcs, words in (([one], "family ep_placement: in none of the sources"),
                        ([QUICK, bad_budget], "budget 1"),
                        ([QUICK, full], "quick and full runs mixed"),
                        ([QUICK, other], "allowed: tuning"),
                        ([tmp_path / "nothing"], "no summary.json")):
        dst = tmp_path / "refused"
        assert main(["reproduce", "tuning", "--assemble", *map(str, srcs), "--out", str(dst)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
        assert not dst.exists()


@pytest.mark.parametrize("argv,needle", [
    (["reproduce", "epsmoe", "--assemble"], "allowed: tuning"),
    (["reproduce", "tuning", "--quick", "--assemble"], "--only and --quick do not apply"),
])
def test_assemble_refuses_what_it_cannot_honour(argv, needle, tmp_path, capsys):
    dst = tmp_path / "out"
    assert main([*argv, str(QUICK), "--out", str(dst)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not dst.exists()
