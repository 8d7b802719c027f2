"""Streaming summaries of per-trace metrics with a stated error: mean, percentiles, min, max
of millions of values without holding them (`moejax simulate --stream`).

Percentiles come from a fixed-bin logarithmic histogram, the mapping of DDSketch (Masson, Rim
and Lee, "DDSketch: a fast and fully-mergeable quantile sketch with relative-error
guarantees", VLDB 2019, §2.1): with gamma = (1 + a) / (1 - a), a positive value x falls in
bin i = ceil(log_gamma(x)), i.e. (gamma^(i-1), gamma^i], and the bin's representative
2 gamma^i / (gamma + 1) is within relative error a of every value in the bin (Lemma 2).
Here the bins are fixed over [`LOW`, `HIGH`] (no collapsing), so the guarantee holds for every
value in that range; values below `LOW` (zero included) are counted as 0 and values above
`HIGH` in the last bin (their estimate is then `HIGH`-ish, not within a).

Stated error, for finite values in [LOW, HIGH]:
- percentile q: the estimate is the linear interpolation (NumPy's default "linear" method)
  between the estimates of the order statistics x_(k) and x_(k+1), k = floor(q/100 (n-1));
  each is within relative error `alpha` of its order statistic, so the interpolation is within
  relative error `alpha` of `np.percentile(x, q)` (a convex combination of the two bounds).
- mean: a float64 running sum of float64 per-chunk sums, divided by n: rounding only
  (relative error below n * 2^-53, under 1e-9 for n <= 10^7).
- min, max: exact.

The library DDSketch (`ddsketch` on PyPI) adds one value per Python call; this module bins a
whole chunk with one `np.log` and one `np.bincount` (no Python loop over values), and its
state is a few NumPy arrays that `state()` / `from_state()` save with a streamed run for
`--resume`.
"""

from __future__ import annotations

import numpy as np

# Relative error of a percentile estimate (0.1 %): far below the spread of any latency
# distribution the simulator reports, and 2.1e4 bins (165 kB) over [LOW, HIGH].
ALPHA = 1e-3
# The value range of the bins: seconds (latencies from a picosecond to 11 days) or any
# positive metric of that range.
LOW, HIGH = 1e-12, 1e6


class LogHistogram:
    """Mergeable fixed-bin log histogram of positive float values (see the module doc)."""

    def __init__(self, alpha: float = ALPHA, low: float = LOW, high: float = HIGH):
        if not 0 < alpha < 1 or not 0 < low < high:
            raise ValueError(f"LogHistogram: need 0 < alpha < 1 and 0 < low < high; got "
                             f"alpha={alpha}, low={low}, high={high}")
        self.alpha, self.low, self.high = float(alpha), float(low), float(high)
        self.gamma = (1 + self.alpha) / (1 - self.alpha)
        self._lg = np.log(self.gamma)
        self.offset = int(np.ceil(np.log(self.low) / self._lg))  # bin index of LOW
        nbins = int(np.ceil(np.log(self.high) / self._lg)) - self.offset + 1
        self.counts = np.zeros(nbins, np.int64)
        self.zeros = 0  # values below LOW (0 included)
        self.nans = 0
        self.n = 0
        self.total = 0.0
        self.min = np.inf
        self.max = -np.inf

    def add(self, x) -> None:
        """Add a chunk of values (any shape; flattened)."""
        x = np.asarray(x, np.float64).ravel()
        finite = np.isfinite(x)
        self.nans += int(x.size - finite.sum())
        x = x[finite]
        if x.size == 0:
            return
        self.n += int(x.size)
        self.total += float(x.sum())
        self.min = min(self.min, float(x.min()))
        self.max = max(self.max, float(x.max()))
        pos = x >= self.low
        self.zeros += int(x.size - pos.sum())
        idx = np.ceil(np.log(x[pos]) / self._lg).astype(np.int64) - self.offset
        self.counts += np.bincount(np.clip(idx, 0, self.counts.size - 1),
                                   minlength=self.counts.size)

    def merge(self, other: LogHistogram) -> None:
        """Add another histogram's values (same alpha and range): a sketch per process."""
        if (other.alpha, other.low, other.high) != (self.alpha, self.low, self.high):
            raise ValueError("LogHistogram.merge: histograms differ in alpha or range")
        self.counts += other.counts
        self.zeros += other.zeros
        self.nans += other.nans
        self.n += other.n
        self.total += other.total
        self.min, self.max = min(self.min, other.min), max(self.max, other.max)

    def _order_statistics(self, ranks: np.ndarray) -> np.ndarray:
        """Estimates of the 0-based order statistics `ranks` of the values added."""
        cum = self.zeros + np.cumsum(self.counts)
        b = np.searchsorted(cum, ranks, side="right")  # first bin with more than rank values
        est = 2 * self.gamma ** (b + self.offset) / (self.gamma + 1)
        est = np.where(ranks < self.zeros, 0.0, est)
        return np.clip(est, self.min, self.max)  # never outside the exact extremes

    def percentile(self, q: float) -> float:
        """The q-th percentile (0-100), NumPy's linear method, within relative error alpha."""
        if self.nans or self.n == 0:
            return float("nan")
        pos = q / 100 * (self.n - 1)
        k = int(np.floor(pos))
        lo, hi = self._order_statistics(np.array([k, min(k + 1, self.n - 1)]))
        return float(lo + (pos - k) * (hi - lo))

    def mean(self) -> float:
        return float("nan") if self.nans or self.n == 0 else self.total / self.n

    def summary(self) -> dict[str, float]:
        """`engine.percentile_summary`'s keys: mean / p50 / p99 / min / max."""
        bad = self.nans or self.n == 0
        return {"mean": self.mean(), "p50": self.percentile(50), "p99": self.percentile(99),
                "min": float("nan") if bad else self.min,
                "max": float("nan") if bad else self.max}

    def state(self) -> dict[str, np.ndarray]:
        """The whole state as arrays (for `np.savez`; `from_state` reads it back)."""
        return {"params": np.array([self.alpha, self.low, self.high]), "counts": self.counts,
                "scalars_i": np.array([self.zeros, self.nans, self.n], np.int64),
                "scalars_f": np.array([self.total, self.min, self.max])}

    @classmethod
    def from_state(cls, st: dict[str, np.ndarray]) -> LogHistogram:
        h = cls(*(float(v) for v in st["params"]))
        h.counts = np.array(st["counts"], np.int64)
        h.zeros, h.nans, h.n = (int(v) for v in st["scalars_i"])
        h.total, h.min, h.max = (float(v) for v in st["scalars_f"])
        return h


class RunningMean:
    """Sum and count of a metric whose percentiles are not reported (float64 sums)."""

    def __init__(self):
        self.total, self.n = 0.0, 0

    def add(self, x) -> None:
        x = np.asarray(x, np.float64).ravel()
        self.total += float(x.sum())
        self.n += int(x.size)

    def mean(self) -> float:
        return self.total / self.n if self.n else float("nan")
