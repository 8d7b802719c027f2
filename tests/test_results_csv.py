"""results.csv as `moejax.output.results.atomic_write_csv` writes it: numeric columns (the
fast path, a column at a time) and mixed ones (the row writer) in one format."""

from __future__ import annotations

import csv

import numpy as np

from moejax.output import results


def test_numeric_columns_hand_computed(tmp_path):
    cols = {"x": np.array([1.5, np.nan, -0.0, 1e-45], np.float32),
            "ok": np.array([True, False, True, False]),
            "n": np.array([3, -4, 2**40, 0], np.int64),
            "u": np.array([255, 0, 7, 1], np.uint8)}
    results.atomic_write_csv(tmp_path / "r.csv", cols)
    assert (tmp_path / "r.csv").read_bytes() == (
        b"x,ok,n,u\r\n1.5,True,3,255\r\nnan,False,-4,0\r\n-0,True,1099511627776,7\r\n"
        b"1.40129846e-45,False,0,1\r\n")


def test_numeric_fast_path_round_trips_float32_and_matches_the_row_writer(tmp_path):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(2000) * 10.0 ** rng.integers(-30, 30, 2000)).astype(np.float32)
    cols = {"trace": np.arange(2000), "x": x, "y": rng.standard_normal(2000)}
    results.atomic_write_csv(tmp_path / "fast.csv", cols)
    rows = list(csv.reader(open(tmp_path / "fast.csv", newline="")))
    assert rows[0] == ["trace", "x", "y"]
    assert np.array_equal(np.array([float(r[1]) for r in rows[1:]], np.float32), x)
    # the same numbers beside a text column go through the row writer: the same fields
    results.atomic_write_csv(tmp_path / "rows.csv", {**cols, "name": np.array(["a,b"] * 2000)})
    mixed = list(csv.reader(open(tmp_path / "rows.csv", newline="")))
    assert [r[:3] for r in mixed] == rows and mixed[1][3] == "a,b"
