"""Chiplet area / power budget of 000 §VI-D Eq. (1)-(2) for design-space descent.

000 §VI-D constrains its DSE (Fig. 16) by

  Eq. (1), per chiplet:  ceil(BW_D2D / BW_UCIe) * A_UCIe + A_Compute + A_Buffer <= A_th
  Eq. (2), per package:  P_Compute + P_D2D + P_DDR <= P_th

with A_th = 30 mm^2 and P_th = 60 W, and gives no other coefficient. Every coefficient of
`ChipletBudget` except those two limits is therefore OUR ASSUMPTION, taken from public
sources named beside it and fixed before any tuning result; override any of them with
`ChipletBudget.parse("name=value,...")` (`moejax tune --budget`). The ceil of Eq. (1) is
relaxed as a staircase of `relax.step` (exact at tau = 0). `BudgetConstraint` turns the budget
into the tuning loop's penalty, feasibility projection and report for the FSE-DP knobs
`weight_buffer_bytes`, `ddr_Bps` and `link_Bps` (`FSEDPParams`, `moejax.systems.fsedp.tuning`).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from moejax import relax
from moejax.errors import ConfigError

MiB = float(2**20)
KNOBS = ("weight_buffer_bytes", "ddr_Bps", "link_Bps")

# Search box of the knobs (per die / per directed link). 000 §VI-D Fig. 16 sweeps DDR
# bandwidth around the test chip's 25.6 GB/s, D2D up to 512 GB/s and buffers of 14-16+ MB;
# the box is wider on every side. The buffer's lower end is raised further to what the
# micro-slice slots need (moejax.systems.fsedp.config.min_microslices).
BUFFER_RANGE_BYTES = (2.0 * MiB, 128.0 * MiB)
DDR_RANGE_BPS = (6.4e9, 204.8e9)
LINK_RANGE_BPS = (32e9, 1024e9)
GRID_POINTS = 5  # per knob, geometric, for the hard-mode grid baseline

# Staircase terms of the relaxed ceil; above this many UCIe modules the ceil is exact.
_MAX_MODULES = 64


@dataclasses.dataclass(frozen=True)
class ChipletBudget:
    """Coefficients of 000 Eq. (1)-(2). Limits from 000 §VI-D; the rest are assumptions.

    Units: mm^2, W, bytes / s per die or per directed link, pJ per bit.
    """

    # 000 §VI-D: "upper limit of the die area to 30 mm^2", package power "less than 60 W".
    area_limit_mm2: float = 30.0
    power_limit_w: float = 60.0
    # Assumption. TSMC N5 high-density 6T bitcell 0.021 um^2 (TSMC, IEDM 2019), about
    # 32 Mib/mm^2 with ~30 % assist / periphery overhead (WikiChip, "TSMC 5-nanometer
    # update"): 8 Mib = 1 MiB in 0.25 mm^2. The test chip is Samsung 5 nm; no public
    # macro density for it is used here.
    sram_mm2_per_MiB: float = 0.25
    # Assumption, derived from 000 itself: §VI-D calls 512 GB/s "equivalent to 3 UCIe (x32)
    # modules", i.e. ceil(512 / BW_UCIe) = 3, BW_UCIe in [171, 256) GB/s; a x32 module at
    # Table I's top 24 Gb/s per pin moves 32 * 24 / 8 = 96 GB/s each way, 192 GB/s in all.
    ucie_module_Bps: float = 192e9
    # Assumption. UCIe 1.0 advanced package: up to 1350 GB/s/mm^2 at 32 GT/s, 45 um bump
    # pitch (UCIe 1.0 specification KPIs, as quoted by the UCIe white paper / Wikipedia);
    # x32 lanes each way at 32 GT/s = 256 GB/s -> 256 / 1350 = 0.19 mm^2 per module.
    ucie_module_mm2: float = 0.19
    # Assumption, derived: 000 Table I die 2.69 mm x 4.72 mm = 12.70 mm^2, less the 8 MiB
    # buffer the chiplet-2x2 platform assumes (2.0 mm^2 at the SRAM density above) and
    # ceil(288 / 192) = 2 UCIe modules (0.38 mm^2): the PE array, control and the rest.
    compute_mm2: float = 10.32
    # 000 Table I: 736.5-2187 mW per compute die; the peak (Eq. (2) bounds peak power).
    compute_w: float = 2.187
    # 000 §II cites 0.52 pJ/bit for 3 nm UCIe-S transceivers [67]; UCIe quotes 0.5-0.6 pJ/b
    # for standard (2D) packages (Das Sharma, Hot Interconnects 2025). Per bit per link.
    d2d_pj_per_bit: float = 0.52
    # Assumption: off-package DDR interface + DRAM energy. Published figures span ~4 pJ/bit
    # (HBM2, 3.9: O'Connor et al., MICRO 2017) to ~14 pJ/bit (GDDR5, same source) and more
    # for commodity DDR3 / DDR4 channels (Malladi et al., ISCA 2012, on DDR3's poor energy
    # per bit); 20 pJ/bit is a round middle value for the test chip's DDR3-1600.
    ddr_pj_per_bit: float = 20.0
    # Loss units (ms of latency) per unit of relative violation (area / A_th - 1, likewise
    # power). At the test chip a watt buys about 0.15 ms of layer latency through DDR
    # bandwidth (0.09 ms per 1 % of P_th), so 1 ms per 1 % keeps the optimum feasible.
    penalty_weight: float = 100.0

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                    math.isfinite(v) and v > 0):
                raise ConfigError(f"budget {f.name} = {v!r}; allowed: a finite number > 0")
            object.__setattr__(self, f.name, float(v))

    @classmethod
    def parse(cls, spec: str) -> ChipletBudget:
        """From "name=value,name=value" (empty: the defaults); errors name the field."""
        names = [f.name for f in dataclasses.fields(cls)]
        kw = {}
        for item in (s.strip() for s in spec.split(",")):
            if not item:
                continue
            key, eq, val = item.partition("=")
            key = key.strip()
            if not eq or key not in names:
                raise ConfigError(f"budget: {item!r} is not name=value with name one of "
                                  f"{', '.join(names)}")
            try:
                kw[key] = float(val)
            except ValueError:
                raise ConfigError(f"budget {key} = {val.strip()!r}; allowed: a finite "
                                  "number > 0") from None
        return cls(**kw)

    def ucie_modules(self, link_Bps, tau=0.0):
        """ceil(BW_D2D / BW_UCIe) of Eq. (1); for tau > 0 a staircase of sigmoids of width
        tau (in modules), sum_k relax.step(x - k, tau), which is the ceil at tau = 0."""
        x = jnp.asarray(link_Bps) / self.ucie_module_Bps
        k = jnp.arange(_MAX_MODULES, dtype=x.dtype)
        stairs = relax.step(x[..., None] - k, tau).sum(-1)
        return stairs + jnp.maximum(jnp.ceil(x) - _MAX_MODULES, 0.0)

    def area_mm2(self, buffer_bytes, link_Bps, tau=0.0):
        """Left side of Eq. (1): one chiplet's area, mm^2."""
        return (self.ucie_modules(link_Bps, tau) * self.ucie_module_mm2 + self.compute_mm2
                + jnp.asarray(buffer_bytes) / MiB * self.sram_mm2_per_MiB)

    def power_w(self, ddr_Bps, link_Bps, num_devices: int, num_links: int):
        """Left side of Eq. (2): package peak power, W (every die's DDR channel and every
        directed D2D link at full rate)."""
        bits = 8e-12  # bytes/s * pJ/bit -> W
        return (num_devices * self.compute_w
                + num_links * jnp.asarray(link_Bps) * self.d2d_pj_per_bit * bits
                + num_devices * jnp.asarray(ddr_Bps) * self.ddr_pj_per_bit * bits)


@dataclasses.dataclass(frozen=True, eq=False)
class BudgetConstraint:
    """Eq. (1)-(2) over the FSE-DP hardware knobs of a platform; knobs that are not tuned
    keep the platform's value (`defaults`, name -> value)."""

    budget: ChipletBudget
    num_devices: int
    num_links: int  # directed D2D links of the package
    defaults: dict

    def _knobs(self, values):
        return [values.get(k, self.defaults[k]) for k in KNOBS]

    def area_power(self, values, tau=0.0):
        """(area mm^2 per chiplet, package power W) at `values` (relaxed at tau)."""
        buf, ddr, link = self._knobs(values)
        return (self.budget.area_mm2(buf, link, tau),
                self.budget.power_w(ddr, link, self.num_devices, self.num_links))

    def penalty(self, values, tau=0.0):
        """penalty_weight * (relu(area / A_th - 1) + relu(power / P_th - 1)): 0 inside the
        budget, linear in the relative violation outside (an exact penalty)."""
        area, power = self.area_power(values, tau)
        b = self.budget
        return b.penalty_weight * (jax.nn.relu(area / b.area_limit_mm2 - 1.0)
                                   + jax.nn.relu(power / b.power_limit_w - 1.0))

    def feasible(self, hard) -> bool:
        area, power = self.area_power(hard, 0.0)
        return bool(area <= self.budget.area_limit_mm2 and power <= self.budget.power_limit_w)

    def project(self, hard: dict) -> dict:
        """Hard values made feasible: unchanged if within Eq. (1)-(2), else the farthest
        feasible point on the log-space segment from the platform's values (bisection), so
        an optimizer that ends a hair outside the budget is pulled back onto it. Unchanged
        (and reported infeasible) when the platform itself violates the budget."""
        names = [k for k in KNOBS if k in hard]
        if not names or self.feasible(hard) or not self.feasible({}):
            return hard
        a = {k: math.log(self.defaults[k]) for k in names}
        b = {k: math.log(hard[k]) for k in names}

        def at(t):
            return {**hard, **{k: float(np.float32(math.exp(a[k] + t * (b[k] - a[k]))))
                               for k in names}}

        lo, hi = 0.0, 1.0
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if self.feasible(at(mid)) else (lo, mid)
        return at(lo)

    def report(self, hard) -> dict:
        """Eq. (1)-(2) at hard values, for summaries."""
        area, power = self.area_power(hard, 0.0)
        buf, ddr, link = self._knobs(hard)
        return {"area_mm2": float(area), "area_limit_mm2": self.budget.area_limit_mm2,
                "power_w": float(power), "power_limit_w": self.budget.power_limit_w,
                "ucie_modules": int(self.budget.ucie_modules(link)),
                "feasible": self.feasible(hard), "weight_buffer_MiB": float(buf) / MiB,
                "ddr_GBps": float(ddr) / 1e9, "link_GBps": float(link) / 1e9}
