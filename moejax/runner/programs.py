"""Compile once per distinct program: value fingerprints, the compiled-program cache, batch
buckets, compile reports, and JAX's persistent compilation cache.

A `System` is pure functions closed over a static config (STYLE.md rule 1), and configs
compare by identity, so two systems built from the same policy are different Python objects
that trace to the same program. `fingerprint` reads a value's structure instead: a
function's code and the values its closure cells hold, a dataclass's fields, an array's
dtype, shape and bytes; the engine keys its compiled programs by it, so `api.simulate`,
sweeps, tuning, studies and notebooks that rebuild an equal system reuse the compiled call.
Objects it cannot read by value (anything not listed in `_walk`) enter by identity: they
never share a program with another object, so a fingerprint can miss a reuse but never
merge two different programs. Module-level names a function calls are not read (the code
is the code that was imported): a function patched into a module after a program was
compiled is not seen by an equal system until `PROGRAMS.clear()`.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import hashlib
import importlib.util
import os
import struct
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

from moejax.errors import ConfigError

# Compiled programs kept (each holds its XLA executables, one per input shape).
MAX_PROGRAMS = 128
# The persistent cache's size limit in bytes. A limit makes JAX's file cache take a file
# lock around every read and write (jax._src.lru_cache.LRUCache); without one it writes
# entries in place unlocked, and a second process can read a half-written entry (JAX then
# warns and recompiles). The least recently used entries go past the limit.
PERSISTENT_CACHE_BYTES = 2 * 2**30
# Programs that compile faster than this are not written to the persistent cache. Every
# program is: the many small ones a system compiles while it is traced (jnp on constants)
# cost 0.03-0.2 s each to compile and a few ms to read back.
PERSISTENT_MIN_COMPILE_S = 0.0
ENV_CACHE = "MOEJAX_COMPILATION_CACHE"
ENV_QUICK = "MOEJAX_QUICK_COMPILE"


class Unfingerprintable(Exception):
    """A value that has no fingerprint by value (a tracer: a system built inside a trace)."""


def fingerprint(obj) -> str:
    """A hex digest of `obj` by value (see the module docstring); equal for two systems or
    configs built the same way from equal inputs. Raises `Unfingerprintable` for a tracer."""
    h = hashlib.blake2b(digest_size=20)
    _walk(obj, h, {})
    return h.hexdigest()


def _put(h, tag: str, data: bytes = b"") -> None:
    h.update(tag.encode())
    h.update(struct.pack("<Q", len(data)))
    h.update(data)


def _walk(obj, h, seen: dict) -> None:  # noqa: C901  (one case per kind)
    if obj is None or isinstance(obj, bool | int | float | complex | str | bytes):
        _put(h, type(obj).__name__, repr(obj).encode())
        return
    if isinstance(obj, np.dtype):
        _put(h, "dtype", obj.str.encode())
        return
    if isinstance(obj, type):
        _put(h, "type", f"{obj.__module__}.{obj.__qualname__}".encode())
        return
    if isinstance(obj, types.ModuleType):
        _put(h, "module", obj.__name__.encode())
        return
    if isinstance(obj, jax.core.Tracer):
        raise Unfingerprintable(f"a tracer ({type(obj).__name__})")
    oid = id(obj)
    if oid in seen:  # shared or cyclic structure: a back reference
        _put(h, "ref", str(seen[oid]).encode())
        return
    seen[oid] = len(seen)
    if isinstance(obj, jax.Array):
        if jax.dtypes.issubdtype(obj.dtype, jax.dtypes.prng_key):
            _put(h, "key", str(jax.random.key_impl(obj)).encode())
            obj = jax.random.key_data(obj)
        obj = np.asarray(obj)
        _put(h, "jax")
    if isinstance(obj, np.ndarray | np.generic):
        a = np.ascontiguousarray(obj)
        _put(h, "array", f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes() if a.dtype != object else repr(a.tolist()).encode())
        return
    if isinstance(obj, tuple | list):
        _put(h, type(obj).__name__, str(len(obj)).encode())
        for x in obj:
            _walk(x, h, seen)
        return
    if isinstance(obj, dict):
        _put(h, type(obj).__name__, str(len(obj)).encode())
        for k, v in obj.items():
            _walk(k, h, seen)
            _walk(v, h, seen)
        return
    if isinstance(obj, set | frozenset):
        parts = sorted(fingerprint(x) for x in obj)
        _put(h, "set", "".join(parts).encode())
        return
    if isinstance(obj, types.FunctionType):
        _put(h, "fn", f"{obj.__module__}.{obj.__qualname__}".encode())
        _code(obj.__code__, h)
        _walk(obj.__defaults__, h, seen)
        _walk(obj.__kwdefaults__, h, seen)
        cells = obj.__closure__ or ()
        _put(h, "cells", str(len(cells)).encode())
        for c in cells:
            try:
                v = c.cell_contents
            except ValueError:  # an empty cell (a name bound later)
                _put(h, "empty")
                continue
            _walk(v, h, seen)
        return
    if isinstance(obj, functools.partial):
        _put(h, "partial")
        _walk((obj.func, obj.args, obj.keywords), h, seen)
        return
    if isinstance(obj, types.MethodType):
        _put(h, "method")
        _walk((obj.__func__, obj.__self__), h, seen)
        return
    if isinstance(obj, enum.Enum):
        _put(h, "enum", f"{type(obj).__qualname__}.{obj.name}".encode())
        return
    if dataclasses.is_dataclass(obj):
        fields = dataclasses.fields(obj)
        _put(h, "dc", f"{type(obj).__module__}.{type(obj).__qualname__}".encode())
        for f in fields:
            _put(h, "field", f.name.encode())
            _walk(getattr(obj, f.name, None), h, seen)
        return
    if callable(obj) and hasattr(obj, "__wrapped__"):  # jax.jit, functools.cache, ...
        _put(h, "wrapped", f"{type(obj).__module__}.{type(obj).__qualname__}".encode())
        _walk(obj.__wrapped__, h, seen)
        return
    # Anything else (module-level singletons, objects with state): by identity. The object
    # is alive while anything that holds it is, and the program cache holds what it was
    # keyed by, so no other object takes its id while a program keyed by it is cached.
    _put(h, "id", f"{type(obj).__module__}.{type(obj).__qualname__}:{oid}".encode())


def _code(code: types.CodeType, h) -> None:
    _put(h, "code", code.co_code)
    _put(h, "names", repr((code.co_names, code.co_varnames, code.co_freevars)).encode())
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _code(c, h)
        else:
            _put(h, "const", repr(c).encode())


# Fingerprints of objects already read, by identity (a system built once and passed to
# `engine.simulate` many times is read once).
_MEMO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def key_of(obj) -> object:
    """`fingerprint(obj)`, memoized per object; the object itself (by identity) when it has
    no fingerprint by value."""
    try:
        return _MEMO[obj]
    except (KeyError, TypeError):
        pass
    try:
        fp = fingerprint(obj)
    except Unfingerprintable:
        return ("id", obj)
    try:
        _MEMO[obj] = fp
    except TypeError:  # not weak-referenceable
        pass
    return fp


class ProgramCache:
    """Compiled programs by value: `get(kind, parts, build)` returns the program built by
    `build()` for the first of equal (kind, fingerprint of parts), least recently used
    ones dropped past `MAX_PROGRAMS`."""

    def __init__(self, size: int = MAX_PROGRAMS):
        self.size = size
        self.items: collections.OrderedDict = collections.OrderedDict()
        self.lock = threading.Lock()

    def get(self, kind: str, parts: tuple, build: Callable[[], object]):
        key = (kind, tuple(p if _plain(p) else key_of(p) for p in parts))
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key][0]
        prog = build()
        with self.lock:  # the entry keeps `parts` alive (see `_walk`'s identity case)
            prog = self.items.setdefault(key, (prog, parts))[0]
            while len(self.items) > self.size:
                self.items.popitem(last=False)
        return prog

    def clear(self) -> None:
        with self.lock:
            self.items.clear()


def _plain(x) -> bool:
    return x is None or isinstance(x, bool | int | float | str)


PROGRAMS = ProgramCache()


def bucket(n: int, chunk: int) -> int:
    """Traces per compiled call for a batch of `n` traces and at most `chunk` per call: the
    power of two at or above n, at most `chunk`. Batches of 100, 120 and 128 traces share
    the 128-trace program; a batch larger than a chunk runs whole chunks, its last one padded
    to a whole chunk."""
    if n >= chunk:
        return chunk
    return min(chunk, 1 << max(0, int(n - 1).bit_length()))


# ---- telling the user when a call compiles -------------------------------------------

_REPORT: list[Callable[[str], None] | None] = [None]


def report_compiles(sink: Callable[[str], None] | bool | None = True) -> None:
    """Say when a program compiles: True prints to stderr, a callable gets each line, None
    or False is quiet (the default: the API says nothing unless asked; the CLI turns it
    on)."""
    if sink is True:
        def sink(text: str) -> None:
            print(text, file=sys.stderr, flush=True)
    _REPORT[0] = sink or None


class Signatures:
    """The input shapes a program has been called with (its compiled executables): the
    first call with a new one compiles."""

    def __init__(self):
        self.seen: set = set()
        self.lock = threading.Lock()

    def new(self, args) -> bool:
        leaves, tree = jax.tree_util.tree_flatten(args)
        sig = (tree, tuple((np.shape(x), str(getattr(x, "dtype", type(x).__name__)),
                            str(getattr(x, "sharding", ""))) for x in leaves))
        with self.lock:
            if sig in self.seen:
                return False
            self.seen.add(sig)
            return True


def call_reporting(fn, signatures: Signatures, what: Callable[[], str], *args):
    """fn(*args), told to the compile sink with its wall time when it compiles (the first
    call with these input shapes)."""
    sink = _REPORT[0]
    new = signatures.new(args)  # recorded when quiet too: a sink turned on later is not told
    if sink is None or not new:  # of a compile that happened before it
        return fn(*args)
    label = what()
    sink(f"compiling {label} ...")
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    sink(f"compiled {label} in {time.perf_counter() - t0:.1f} s")
    return out


# ---- quick compiles (CPU) ----------------------------------------------------------------
#
# A cold first call is mostly LLVM compiling one kernel per XLA fusion (docs/performance.md,
# "A cold first call"). XLA's older CPU emitters at LLVM -O0 compile the same programs
# with 3.7-5.6x less XLA time (docs/performance.md, "Quick compiles"), but they are not bit
# for bit the default: XLA marks a reduction's adds `reassoc`, and LLVM's loop vectorizer
# (-O2 only) may sum them in another order, so float32 sums can differ in the last bit (2 of
# 30 catalog policies, by up to 8.8e-8 relative), and the -O0 code runs slower (FSE-DP's 16
# traces: 153 ms against 25 ms). So it is the user's choice, off by default: for exploring
# in a notebook, not for numbers to compare with committed results.
QUICK_OPTIONS = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}
_QUICK: list[bool | None] = [None]  # None: not decided yet ($MOEJAX_QUICK_COMPILE)


def quick_compile(on: bool = True) -> None:
    """Compile the engine's and sweeps' programs built from now on quickly (`QUICK_OPTIONS`:
    3.7-5.6x less XLA time, float32 sums that may differ from the default compile's in the
    last bit, slower code), or (False) as by default. CPU only: on an accelerator it is
    refused."""
    if on:
        _check_quick()
    _QUICK[0] = bool(on)


def quick_compiling() -> bool:
    """Whether programs built now compile quickly: `quick_compile`'s setting, else
    $MOEJAX_QUICK_COMPILE (1/true/yes/on; 0/false/no/off or unset: no)."""
    if _QUICK[0] is None:
        value = os.environ.get(ENV_QUICK, "").strip().lower()
        if value not in ("", "0", "false", "no", "off", "1", "true", "yes", "on"):
            raise ConfigError(f"${ENV_QUICK}: {value!r} is not one of 1, true, yes, on, "
                              "0, false, no, off")
        quick_compile(value in ("1", "true", "yes", "on"))
    return bool(_QUICK[0])


def compiler_options(quick: bool | None = None) -> dict | None:
    """XLA options for a program: `QUICK_OPTIONS` when compiling quickly (`quick`; None:
    `quick_compiling()`). A caller that keys a program by `quick` passes the same value, so
    the key and the options cannot disagree."""
    if quick is None:
        quick = quick_compiling()
    return dict(QUICK_OPTIONS) if quick else None


def _check_quick() -> None:
    """Refuse quick compiles where they would be wrong or have no effect: off the CPU, and
    where LLVM selects -O0 instructions with FastISel, which does not fuse a multiply and
    an add into one FMA as -O2 does (a quick program would then round every a*b+c
    differently). moejax asks for SelectionDAG (`-fast-isel=false`) in XLA_FLAGS when it is
    imported before JAX starts its backend; this checks that it took."""
    backend = jax.default_backend()
    if backend != "cpu":
        raise ConfigError(f"quick compile: a CPU option (this process computes on {backend}); "
                          f"unset ${ENV_QUICK}")
    a, c = np.float32(1 + 2.0**-13), np.float32(-(1 + 2.0**-12))  # a*a+c: FMA 2^-26, else 0
    def fma(x, y):
        return x * x + y
    default = jax.jit(fma)(a, c)
    if float(jax.jit(fma, compiler_options=QUICK_OPTIONS)(a, c)) != float(default):
        raise ConfigError("quick compile: LLVM uses FastISel at -O0 in this process, which "
                          "would round a*b+c unlike the default compile; start JAX with "
                          "XLA_FLAGS=--xla_backend_extra_options=-fast-isel=false (moejax "
                          "sets it when imported before JAX's first computation)")


# ---- JAX's persistent compilation cache ------------------------------------------------

def default_cache_dir() -> Path:
    """The user cache folder for compiled programs: $XDG_CACHE_HOME/moejax/jax (default
    ~/.cache/moejax/jax; ~/Library/Caches/moejax/jax on macOS; %LOCALAPPDATA% on
    Windows)."""
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif os.name == "nt":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "moejax" / "jax"


def cache_setting(flag: str | None = None) -> str | None:
    """Where the persistent cache lives: `flag` (the CLI's --compilation-cache), else
    $MOEJAX_COMPILATION_CACHE, else the default folder; "off" (or "0", "none") -> None."""
    value = flag if flag is not None else os.environ.get(ENV_CACHE)
    if value is None or value == "":
        return str(default_cache_dir())
    if value.strip().lower() in ("off", "0", "none", "false", "no"):
        return None
    return os.path.expanduser(value)


def enable_persistent_cache(path: str | os.PathLike | None) -> str | None:
    """Turn JAX's persistent compilation cache on in folder `path` (None: leave it off),
    with a size limit so that several processes may share the folder: JAX then locks the
    folder around each entry's read and write (see `PERSISTENT_CACHE_BYTES`). Returns the
    folder, or None when it is off or cannot be created (a read-only home: the run goes on
    without it)."""
    if path is None or importlib.util.find_spec("filelock") is None:  # no lock: no sharing
        return None
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    jax.config.update("jax_compilation_cache_max_size", PERSISTENT_CACHE_BYTES)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", PERSISTENT_MIN_COMPILE_S)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_compilation_cache_dir", str(path))
    return str(path)
