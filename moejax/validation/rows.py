"""The published measurements `moejax validate` checks: `measurements.toml`, read strictly."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from moejax.catalog.schema import Table, read_toml
from moejax.errors import ConfigError
from moejax.validation.predict import PREDICTORS, UNITS

FILE = Path(__file__).resolve().parent / "measurements.toml"
ROLES = ("calibration", "held-out")
STATUSES = ("in", "outside")


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One published measurement and the band moejax must reach on it."""

    id: str
    kind: str  # a key of `predict.PREDICTORS`
    platform: str  # a hardware catalog name
    params: tuple[tuple[str, object], ...]  # the predictor's inputs
    measured: float  # in `unit`
    unit: str  # us, GB/s or TFLOP/s
    band: float  # |moejax / measured - 1| <= band
    role: str  # calibration or held-out
    status: str  # in (inside the band today) or outside
    reason: str  # why a row is outside its band ("" when in)
    source: str  # URL of the measurement
    config: str  # what was measured, in words


def parse(data: dict, where: str) -> list[Measurement]:
    """Validate the `[[row]]` tables of a measurements file."""
    t = Table(data, where)
    raw = t._get("row", None, True)
    t.close()
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: 'row' must be a non-empty array of tables")
    out, seen = [], set()
    for i, r in enumerate(raw):
        rt = Table(r, f"{where} row {i + 1}")
        kind = rt.str("kind", choices=sorted(PREDICTORS))
        params = rt._get("params", None, True)
        if not isinstance(params, dict):
            raise ConfigError(f"{rt.where}: key 'params' must be a table, got {params!r}")
        m = Measurement(
            id=rt.str("id"), kind=kind, platform=rt.str("platform"),
            params=tuple(sorted(params.items())), measured=rt.float("measured"),
            unit=rt.str("unit", choices=[UNITS[kind]]),
            band=rt.float("band", hi=1.0), role=rt.str("role", choices=ROLES),
            status=rt.str("status", choices=STATUSES), reason=rt.str("reason", ""),
            source=rt.str("source"), config=rt.str("config"),
        )
        rt.close()
        if m.id in seen:
            raise ConfigError(f"{rt.where}: id {m.id!r} appears twice")
        if m.status == "outside" and not m.reason:
            raise ConfigError(f"{rt.where}: status 'outside' needs a 'reason'")
        seen.add(m.id)
        out.append(m)
    return out


@functools.cache
def _load(path: Path) -> tuple[Measurement, ...]:
    return tuple(parse(read_toml(path), str(path)))


def load(path: Path | str | None = None) -> list[Measurement]:
    """The measurements of `path` (default: the file shipped with moejax)."""
    return list(_load(Path(path or FILE).resolve()))
