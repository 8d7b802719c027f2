"""Import the shared real recordings, inspect them, fit every generator family, compare
with the papers' choices, and write the plots and numbers behind docs/traces.md.

    .venv/bin/python experiments/real_traces.py [--traces ../shared/traces] [--out docs]

Writes <out>/img/traces_<name>.png and <out>/img/real_traces.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import numpy as np

from moejax.output.results import atomic_write_json
from moejax.trace import analysis, figure, fit, importers, summary

DOMAINS = ("arxiv", "book", "c4", "github", "wikipedia")


def recordings(root: Path) -> dict:
    esft = root / "ESFT" / "results" / "expert_scores"
    olmoe = root / "OLMoE" / "scripts" / "routing_output"
    out = {}
    for task in ("intent", "law"):
        if (esft / task).is_dir():
            out[f"esft_{task}"] = lambda t=task: importers.import_esft(esft / t)
    for name, model, e, k in (("olmoe", "olmoe", 64, 8), ("mixtral", "mistral", 8, 2)):
        files = [olmoe / model / "expert_counts" / f"{d}.pkl" for d in DOMAINS]
        pairs = [olmoe / model / "expert_counts_crosslayer_top1" / f"{d}.pkl" for d in DOMAINS]
        if all(f.is_file() for f in files):
            out[name] = lambda f=files, e=e, k=k: importers.import_olmoe(f, num_experts=e,
                                                                         top_k=k)
            out[f"{name}_top1_pairs"] = lambda p=pairs, e=e: importers.import_olmoe(
                p, num_experts=e, top_k=1)
    return out


def fitted_profiles(res: dict, trace, key) -> dict:
    """Sorted load profile [E] (mean over layers) of each fitted family at the recording's
    token count, for the plot overlay."""
    out = {}
    for fam, r in res["families"].items():
        if "error" in r:
            continue
        lay = fit._layout(trace)
        if not trace.has_tokens:
            lay = fit._pooled_layout(lay, token_level=False)
        tr = fit._generate_layers([r["pooled"]] * 4, key, lay, trace.num_experts, trace.top_k)
        sh = analysis.layer_shares(tr)
        out[fam] = (-np.sort(-sh, axis=-1)).mean(0).tolist()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=str(Path(__file__).resolve().parents[2] / "shared"
                                            / "traces"))
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs"))
    ap.add_argument("--replot", action="store_true", help="redraw the plots from the fits "
                    "in <out>/img/real_traces.json (no refitting)")
    args = ap.parse_args(argv)
    img = Path(args.out) / "img"
    img.mkdir(parents=True, exist_ok=True)
    key = jax.random.key(0)
    if args.replot:  # figures redrawn without the minutes of fitting
        done = json.loads((img / "real_traces.json").read_text(encoding="utf-8"))
        recs = recordings(Path(args.traces))
        for name, entry in done.items():
            if "fit" in entry and name in recs:
                tr, meta = recs[name]()
                figure.plot_analysis(tr, img / f"traces_{name}.png", meta, title=name,
                                     fitted=fitted_profiles(entry["fit"], tr, key))
                print(f"redrew {img / f'traces_{name}.png'}")
        return 0
    results = {}
    recs = recordings(Path(args.traces))
    for name, load in recs.items():
        t0 = time.perf_counter()
        tr, meta = load()
        t_import = time.perf_counter() - t0
        s = summary.summarize(tr)
        a = analysis.analyze(tr, meta)
        entry = {"import_s": t_import, "meta": {k: v for k, v in meta.items()
                                                if k != "cross_layer_pairs"},
                 "summary": {k: s[k] for k in ("num_iterations", "num_layers", "num_experts",
                                               "top_k", "tokens_per_iteration_mean", "skew",
                                               "skew_per_layer", "gini_per_layer",
                                               "entropy_per_layer", "skew_iteration_mean")},
                 "analysis": a}
        print(f"== {name}: imported in {t_import:.2f} s")
        print(summary.format_summary(s))
        print(analysis.format_analysis(a))
        if name.endswith("_top1_pairs"):
            results[name] = entry
            continue
        fams = fit.FIT_FAMILIES if tr.has_tokens else ("powerlaw", "exponential", "normal",
                                                         "lognormal")
        t0 = time.perf_counter()
        res = fit.fit(tr, fams, key=key)
        entry["fit_s"] = time.perf_counter() - t0
        entry["fit"] = res
        print(fit.format_fit(res))
        prof = fitted_profiles(res, tr, key)
        figure.plot_analysis(tr, img / f"traces_{name}.png", meta, title=name,
                             fitted=prof)
        results[name] = entry
    atomic_write_json(img / "real_traces.json", results)
    print(f"wrote {img / 'real_traces.json'} and {len(recs)} plots")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
