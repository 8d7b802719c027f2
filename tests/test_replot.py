"""`moejax reproduce STUDY --replot DIR`: every figure redrawn from a tiny
synthetic set of the study's CSV files, nothing simulated; bad input is one line, exit 2."""

from __future__ import annotations

import json

import numpy as np
import pytest

from moejax.output import plotting
from moejax.output.results import atomic_write_csv, atomic_write_rows
from moejax.reproduce import replot

PNG = b"\x89PNG\r\n\x1a\n"


def _summary(d, **extra):
    (d / "summary.json").write_text(json.dumps({"study": "x", "claims": [], **extra}))


def _amoe(d):
    rows = [{"system": s, "platform": "a100x8-nvswitch", "top_k": k, "workload": w,
             "concurrency_target": n, "start": "spread", "throughput_tok_s": t,
             "itl_mean_s": 0.1 + 1e-5 * n}
            for s, t0 in (("aep", 2e3), ("sync", 2e4)) for k, w in ((1, "short"), (2, "medium"))
            for n, t in ((256, t0), (4096, 30 * t0))]
    atomic_write_rows(d / "fig9_closed_loop.csv", rows)
    atomic_write_rows(d / "fig10_scaling.csv", [dict(r, platform=p) for r in rows[:2]
                                                for p in ("a100x16-2node", "a100x8-40g")])
    atomic_write_rows(d / "fig9b_open_loop.csv", [
        {"throughput_tok_s": t, "offered_tok_s": 1.1 * t, "itl_mean_s": 0.12, "itl_p99_s": 0.2}
        for t in (5e3, 2e4)])
    atomic_write_csv(d / "fig12_rates.csv", {"t_s": np.arange(4.0), **{
        f"{p}_{k}_per_s": np.arange(4.0) for p in ("aep-flfs", "aep-defrag", "aep-mtfs")
        for k in ("input", "done")}})
    _summary(d)
    return {"fig9_closed_loop.png", "fig10_scaling.png", "fig9b_open_loop.png",
            "fig12_rates.png"}


def _amoe_finite(d):  # the earlier finite-stream study (amoe.FINITE)
    rows = [{"platform": "a100x8-nvswitch", "policy": p, "top_k": 1, "workload": "medium",
             "rate_per_s": r, "throughput_tok_s": 100.0 * r, "itl_mean_s": 0.1}
            for p in ("aep-defrag", "ep-sync") for r in (25.0, 400.0)]
    atomic_write_rows(d / "fig9_throughput_itl.csv", rows)
    atomic_write_csv(d / "fig12_rates.csv", {"t_s": np.arange(3) * 0.5, **{
        f"{p}_{k}_per_s": np.ones(3) for p in ("aep-flfs", "aep-defrag")
        for k in ("input", "done")}})
    atomic_write_csv(d / "fig7_queue_depth.csv", {f"block_{b}": np.arange(3.0) for b in range(4)})
    _summary(d)
    return {"fig9_throughput_itl.png", "fig12_rates.png", "fig7_queue_depth.png"}


def _epsmoe(d):
    m = np.asarray([256.0, 1024.0, 8192.0])
    atomic_write_csv(d / "fig5_gemm.csv", {"rows_per_expert": m, "group_tflops": m / 20,
                                           "dense_tflops": m / 10})
    atomic_write_csv(d / "fig5_gemm_sms.csv", {"sms": np.asarray([132.0, 100.0]),
                                               "group_s_m6144": np.asarray([3e-3, 3.2e-3])})
    atomic_write_csv(d / "table3_dbrx.csv", {
        "batch": np.asarray([16, 32]), "seq": np.asarray([512, 2048]),
        "base_ttft_s": np.asarray([0.2, 0.4]),
        **{f"{n}_reduction_pct": np.asarray([-10.0, -30.0]) for n in ("TP+EP", "PN=1", "PN=2")}})
    atomic_write_csv(d / "table6_sm.csv", {"m_per_expert": np.asarray([3072, 192]),
                                           "sm132_ms": np.asarray([18.0, 2.0]),
                                           "sm100_ms": np.asarray([15.0, 1.5])})
    atomic_write_csv(d / "table7_threshold.csv", {"m": m, "delta_pct": np.asarray([9.0, 0, -2])})
    pn = np.asarray([1.0, 2, 4, 40])
    atomic_write_csv(d / "fig11_pn.csv", {"dim": np.full(4, 1536), "m": np.full(4, 256),
                                          "PN": pn, "standard_ms": np.full(4, 2.0),
                                          "serial_ms": 2 + pn / 10, "pipelined_ms": 2 + pn / 20})
    atomic_write_csv(d / "table1.csv", {"model": np.asarray(["a", "b"]),
                                        **{k: np.asarray([1.0, 2.0]) for k in (
                                            "paper_base_tok_s", "sim_base_tok_s")},
                                        **{k: np.asarray([1.2, 2.5]) for k in (
                                            "paper_eps_tok_s", "sim_eps_tok_s")}})
    _summary(d, n_star_fig11={"1536_256": {"n_star": 3.0}})
    return {"fig5_gemm.png", "table3_dbrx.png", "table6_sm.png", "fig10_regions.png",
            "fig11_pn.png", "table1.png"}


def _dysharp(d):
    k = np.asarray([1.0, 8, 32])
    atomic_write_csv(d / "fig2_redundancy.csv", {"top_k": k, "redundancy": k / 80,
                                                 "redundancy_closed_form": k / 80,
                                                 "ideal_speedup": 1 + k / 40,
                                                 "ideal_closed_form": 1 + k / 40})
    atomic_write_csv(d / "fig19_payload.csv", {"top_k": k, "ideal": k * 0 + 0.8,
                                               "dysharp": 0.8 - k / 100,
                                               "explicit": 0.8 - k / 50})
    names = ("nvls", "deepep", "fastermoe", "tutel", "ccfuser", "comet", "dysharp")
    atomic_write_csv(d / "fig15_layer.csv", {"config": np.asarray(["S-8", "L-8"]), **{
        f"{n}_training_ms": np.asarray([2.0 + i, 3.0]) for i, n in enumerate(names)}})
    atomic_write_csv(d / "fig18_traffic.csv", {"config": np.asarray(["S-8"]), **{
        f"{n}_MB": np.asarray([100.0]) for n in ("deepep", "nvls", "comet", "dysharp")}})
    atomic_write_csv(d / "fig16_ablation.csv", {"system": np.asarray(["deepep", "dysharp"]),
                                                "latency_ms": np.asarray([2.0, 1.0])})
    atomic_write_csv(d / "fig22_seq_len.csv", {"seq": np.asarray([1024.0, 16384.0]),
                                               "deepep_ms": np.asarray([1.0, 9.0]),
                                               "dysharp_ms": np.asarray([0.5, 5.0])})
    atomic_write_csv(d / "fig21_gpus.csv", {"gpus": np.asarray([4.0, 64.0]),
                                            "dysharp-s_deepep_ms": np.asarray([0.4, 3.0]),
                                            "dysharp-s_comet-rank_ms": np.asarray([0.3, 2.5])})
    _summary(d)
    return {"fig2_redundancy.png", "fig19_payload.png", "fig15_layer.png",
            "fig18_traffic.png", "fig16_ablation.png", "fig22_seq_len.png", "fig21_gpus.png"}


def _moentwine(d):
    links = [f"E r{r} c{c}" for r in range(2) for c in range(1)]
    links += [f"W r{r} c{c}" for r in range(2) for c in range(1)]
    links += [f"S r0 c{c}" for c in range(2)] + [f"N r0 c{c}" for c in range(2)]
    n = len(links)
    atomic_write_csv(d / "fig11_heatmaps.csv", {
        "mapping": np.repeat(["baseline", "er"], 2 * n),
        "phase": np.tile(np.repeat(["all-reduce", "all-to-all"], n), 2),
        "link": np.tile(links, 4), "bytes": np.arange(4.0 * n) * 1e6})
    atomic_write_csv(d / "fig17_nvl72.csv", {"system": np.asarray(["nvl72", "wsc"]),
                                             "moe_throughput": np.asarray([1.2e7, 3e6])})
    _summary(d)
    return {"fig11_heatmaps.png", "fig17_nvl72.png"}


SETS = {"amoe": _amoe, "epsmoe": _epsmoe, "dysharp": _dysharp, "moentwine": _moentwine}


@pytest.mark.parametrize("name", sorted(SETS))
def test_replot_draws_every_figure_from_csvs(tmp_path, name):
    study = name
    src, out = tmp_path / "run", tmp_path / "figs"
    src.mkdir()
    expect = SETS[name](src)
    before = sorted(p.name for p in src.iterdir())
    names = replot(study, src, out)
    assert set(names) == expect
    for name in expect:
        assert (out / name).read_bytes()[:8] == PNG, name
    assert sorted(p.name for p in src.iterdir()) == before  # the run's folder untouched
    assert not list(tmp_path.glob(".*tmp"))  # no staging sibling left


def test_fsedp_replot_draws_the_rows_the_study_draws(tmp_path, monkeypatch):
    """From the shipped quick run's CSVs: every figure, and Fig. 15 / 17 on the rows the
    study itself draws (64-token configurations; the compute-only 0.5 us reading), not the
    extra rows its claims read from the same CSV."""
    import shutil
    from pathlib import Path

    from moejax.reproduce import fsedp_figures as fs

    shipped = Path(__file__).resolve().parents[1] / "docs" / "results" / "fsedp"
    src = tmp_path / "run"
    src.mkdir()
    for p in [*shipped.glob("*.csv"), shipped / "summary.json"]:
        shutil.copy(p, src)
    drawn = {}
    bars, fig17 = fs._plot_bars, fs.plot_fig17
    monkeypatch.setattr(fs, "_plot_bars", lambda path, labels, *a: (
        drawn.setdefault("fig15", list(labels)), bars(path, labels, *a)))
    monkeypatch.setattr(fs, "plot_fig17", lambda out, rows, *a: (
        drawn.setdefault("fig17", rows), fig17(out, rows, *a)))
    names = replot("fsedp", src, tmp_path / "figs")
    assert set(names) == {f"{s}.png" for s in (
        "fig9_layer_latency", "fig12_onchip_memory", "fig15_ablation", "fig16_design_space",
        "fig17_microslices", "fig18_scaling")}
    for name in names:
        assert (tmp_path / "figs" / name).read_bytes()[:8] == PNG, name
    csv15 = list(plotting.read_csv(src / "fig15_ablation.csv")["config"])
    assert any("tok" in c for c in csv15)  # the CSV holds more than the figure shows
    assert drawn["fig15"] == [c for c in csv15 if "tok" not in c]
    over = set(plotting.read_csv(src / "fig17_microslices.csv")["overhead"])
    assert len(over) > 1 and set(drawn["fig17"]["overhead"]) == {"ctrl 0.5us"}


def test_every_study_is_data_with_its_own_plots():
    """Each registered study exports one `STUDY` whose figures are named by their CSV stem,
    uniquely, and draw their own PNGs (no second registry of plotters)."""
    import importlib

    from moejax.reproduce import STUDIES, Study

    for name, path in STUDIES.items():
        study = importlib.import_module(path).STUDY
        assert isinstance(study, Study) and study.name == name
        names = study.figure_names()
        assert len(set(names)) == len(names), name
        assert any(f.drawings() for f in study.figures), name
        assert study.grid(True).quick and not study.grid(False).quick


def test_replot_only_draws_the_named_figures(tmp_path):
    import shutil
    from pathlib import Path

    shipped = Path(__file__).resolve().parents[1] / "docs" / "results" / "moentwine"
    src = tmp_path / "run"
    src.mkdir()
    for p in [*shipped.glob("*.csv"), shipped / "summary.json"]:
        shutil.copy(p, src)
    names = replot("moentwine", src, tmp_path / "figs", only="fig13d_multiwafer,fig17_nvl72")
    assert sorted(names) == ["fig13d_multiwafer.png", "fig17_nvl72.png"]
    with pytest.raises(Exception, match="unknown moentwine figure 'fig99'"):
        replot("moentwine", src, tmp_path / "figs2", only="fig99")


def test_read_csv_round_trip(tmp_path):
    atomic_write_csv(tmp_path / "a.csv", {"x": np.asarray([1.5, np.nan]),
                                          "s": np.asarray(["a", "b"]),
                                          "ok": np.asarray([True, False])})
    cols = plotting.read_csv(tmp_path / "a.csv")
    assert cols["x"][0] == 1.5 and np.isnan(cols["x"][1])
    assert list(cols["s"]) == ["a", "b"]
    rows = plotting.read_rows(tmp_path / "a.csv", bools=("ok",))
    assert [r["ok"] for r in rows] == [True, False]


def test_cli_replot_in_place_and_bad_dir(tmp_path, capsys):
    from moejax.cli.main import main

    _amoe(tmp_path)
    assert main(["reproduce", "amoe", "--replot", str(tmp_path)]) == 0
    assert (tmp_path / "fig9_closed_loop.png").read_bytes()[:8] == PNG
    empty = tmp_path / "empty"
    empty.mkdir()
    for args in (["--replot", str(empty)], []):
        capsys.readouterr()
        assert main(["reproduce", "amoe", *args]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert list(empty.iterdir()) == []


def test_finite_amoe_study_draws_its_figures_from_csvs(tmp_path):
    """The unregistered finite-stream study (`amoe.FINITE`) redraws from its CSVs too."""
    from moejax.reproduce import amoe, replot_study

    src, out = tmp_path / "run", tmp_path / "figs"
    src.mkdir()
    out.mkdir()
    expect = _amoe_finite(src)
    names = replot_study(amoe.FINITE, src, out, {"quick": True})
    assert set(names) == expect
    for name in expect:
        assert (out / name).read_bytes()[:8] == PNG, name


TOY = '''
from moejax.reproduce import Check, Claim, Figure, Grid, Rows, Study
from moejax.output import plotting

def squares(grid):
    return Rows({"x": list(range(grid.n)), "y": [x * x for x in range(grid.n)]},
                summary={"points": grid.n})

def cubes(grid):
    return Rows([{"x": x, "y": x ** 3} for x in range(grid.n)], more={"note.json": {"k": 3}})

def draw(path, rows, grid):
    fig, ax = plotting.figure()
    ax[0, 0].plot(rows.cols["x"], rows.cols["y"])
    plotting.save(fig, path)

def grows(sq):
    return Claim("toy.grows", "y grows", sq.cols["y"][-1], sq.cols["y"][-1] > sq.cols["y"][0])

STUDY = Study("toy", (Figure("squares", squares, draw), Figure("cubes", cubes)),
              quick=Grid(True, n=3), full=Grid(False, n=5), checks=(Check(("squares",), grows),))
'''


def test_a_study_as_data_runs_through_the_one_runner(tmp_path, monkeypatch, capsys):
    """A toy study: CSV (columns and row dicts), extra files, the PNG drawn from the CSV read
    back, claims, summary entries, --only (and an unknown figure: one line, exit 2)."""
    from moejax import reproduce
    from moejax.cli.main import main

    (tmp_path / "toy_study.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(reproduce.STUDIES, "toy", "toy_study")
    out = tmp_path / "out"
    assert main(["reproduce", "toy", "--quick", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["files"] == ["squares.csv", "squares.png", "cubes.csv", "note.json"]
    assert summary["points"] == 3 and summary["quick"] is True
    prov = summary["provenance"]  # command line, version, seed, data of every summary
    assert prov["command"] == f"moejax reproduce toy --quick --out {out}"
    assert prov["moejax_version"] and prov["data"]["study"] == "toy"
    assert prov["data"]["grid"] == "quick"
    assert [(c["id"], c["holds"], c["simulated"]) for c in summary["claims"]] == [
        ("toy.grows", True, 4)]
    assert (out / "squares.png").read_bytes()[:8] == PNG
    assert plotting.read_csv(out / "cubes.csv")["y"].tolist() == [0.0, 1.0, 8.0]
    only = tmp_path / "only"
    assert main(["reproduce", "toy", "--out", str(only), "--only", "cubes"]) == 0
    summary = json.loads((only / "summary.json").read_text())
    assert summary["only"] == ["cubes"] and summary["claims"] == []  # its claim needs squares
    assert sorted(p.name for p in only.iterdir()) == ["cubes.csv", "note.json", "summary.json"]
    capsys.readouterr()
    assert main(["reproduce", "toy", "--out", str(tmp_path / "bad"), "--only", "cube"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown toy figure 'cube'" in err and "squares" in err
    assert not (tmp_path / "bad").exists()
    assert reproduce.replot("toy", out, tmp_path / "figs") == ["squares.png"]
