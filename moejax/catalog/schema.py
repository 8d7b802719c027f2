"""Strict reading of TOML tables: unknown, missing, mistyped and out-of-range keys."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

from moejax.errors import ConfigError


def read_toml(path: Path) -> dict[str, Any]:
    """Parse one TOML file, naming the file on a syntax error."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(_not_utf8(path, data, e)) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None


def _not_utf8(path: Path, data: bytes, e: UnicodeDecodeError) -> str:
    """One line naming the file, line and key of the first byte that is not UTF-8."""
    line = data.count(b"\n", 0, e.start) + 1
    start = data.rfind(b"\n", 0, e.start) + 1
    text = data[start:data.find(b"\n", e.start) if b"\n" in data[e.start:] else None]
    key = text.decode("utf-8", "replace").partition("=")[0].strip() if b"=" in text else ""
    field = f"{key}: " if key and not key.startswith(("[", "#")) else ""
    return (f"{path}:{line}: {field}byte 0x{data[e.start]:02x} at column {e.start - start + 1} "
            "is not UTF-8 (TOML files are UTF-8)")


class Table:
    """One TOML table being consumed: every key must be taken exactly once, or `close` complains."""

    def __init__(self, data: dict[str, Any], where: str):
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a table, got {type(data).__name__}")
        self.data, self.where, self.taken = data, where, set()

    def _get(self, key: str, default: Any, required: bool) -> Any:
        self.taken.add(key)
        if key not in self.data:
            if required:
                raise ConfigError(f"{self.where}: missing key {key!r}")
            return default
        return self.data[key]

    def str(self, key: str, default: str | None = None, *, choices=None, required=True) -> str:
        v = self._get(key, default, required and default is None)
        if v is None:
            return v
        if not isinstance(v, str):
            raise ConfigError(f"{self.where}: key {key!r} must be a string, got {v!r}")
        if choices is not None and v not in choices:
            raise ConfigError(
                f"{self.where}: key {key!r} = {v!r} is not allowed; allowed: {', '.join(choices)}"
            )
        return v

    def bool(self, key: str, default: bool | None = None) -> bool:
        v = self._get(key, default, default is None)
        if not isinstance(v, bool):
            raise ConfigError(f"{self.where}: key {key!r} must be true or false, got {v!r}")
        return v

    def int(self, key: str, default: int | None = None, *, lo: int = 1, hi: int | None = None,
            required: bool = True) -> int:
        v = self._get(key, default, required and default is None)
        if v is None:
            return v
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"{self.where}: key {key!r} must be an integer, got {v!r}")
        _check_range(self.where, key, v, lo, hi, "integer")
        return v

    def float(self, key: str, default: float | None = None, *, lo: float = 0.0,
              hi: float | None = None, positive: bool = True, required: bool = True) -> float:
        v = self._get(key, default, required and default is None)
        if v is None:
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ConfigError(f"{self.where}: key {key!r} must be a finite number, got {v!r}")
        if positive and v <= 0:
            raise ConfigError(f"{self.where}: key {key!r} = {v!r} must be > 0")
        _check_range(self.where, key, v, lo, hi, "number")
        return float(v)

    def table(self, key: str, *, required: bool = True) -> Table | None:
        v = self._get(key, None, required)
        if v is None:
            return None
        return Table(v, f"{self.where} [{key}]")

    def close(self) -> None:
        unknown = sorted(set(self.data) - self.taken)
        if unknown:
            raise ConfigError(
                f"{self.where}: unknown key(s) {', '.join(map(repr, unknown))}; "
                f"allowed: {', '.join(sorted(self.taken))}"
            )


def _check_range(where, key, v, lo, hi, what) -> None:
    if v < lo or (hi is not None and v > hi):
        upper = f" and <= {hi}" if hi is not None else ""
        raise ConfigError(f"{where}: key {key!r} = {v!r} out of range; must be >= {lo}{upper}")
