"""Knobs (environment variables and `Context`), and small utilities shared by every stage."""

from __future__ import annotations

import contextlib
import functools
import gc
import os
from typing import Any, Callable, Iterable, TypeVar


class ArgumentError(ValueError, RuntimeError):
    """A bad value at a public call (a shape, axis, size, mode or device name), with the offending values in its
    message. It is a ValueError and also a RuntimeError, the type torch raises for most of these, so code written
    for torch (`except RuntimeError`) and code written for zeptograd (`except ValueError`) both catch it."""


class ArgumentTypeError(TypeError, RuntimeError):
    """A bad argument type at a public call (a dtype, an index, an unsupported Python object): a TypeError and a
    RuntimeError, for the same reason as ArgumentError."""


T = TypeVar("T")


@functools.cache
def getenv(key: str, default: Any = 0) -> Any:
    """An environment variable converted to the type of `default`."""
    return type(default)(os.getenv(key, default))


class ContextVar:
    """A knob read from the environment once, changeable for a block with `Context(NAME=value)`."""

    _cache: dict[str, ContextVar] = {}
    version = 0  # advanced by every change of a knob: caches keyed by the values of all knobs look at this first

    def __init__(self, key: str, default: int | str):
        self.key, self.value = key, getenv(key, default)
        ContextVar._cache[key] = self

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        ContextVar.version += 1

    def __bool__(self) -> bool:
        return bool(self.value)

    def __ge__(self, x: int) -> bool:
        return self.value >= x

    def __gt__(self, x: int) -> bool:
        return self.value > x

    def __lt__(self, x: int) -> bool:
        return self.value < x

    def __le__(self, x: int) -> bool:
        return self.value <= x

    def __eq__(self, x: object) -> bool:
        return self.value == x

    __hash__ = object.__hash__


class Context(contextlib.ContextDecorator):
    """`with Context(DEBUG=2, NOOPT=1): ...` sets knobs for a block and restores them after it."""

    def __init__(self, **kwargs: Any):
        unknown = [k for k in kwargs if k not in ContextVar._cache]
        if unknown:
            raise KeyError(f"unknown Context variable(s) {unknown}; known: {sorted(ContextVar._cache)}")
        self.kwargs = kwargs

    def __enter__(self):
        self.old = {k: ContextVar._cache[k].value for k in self.kwargs}
        for k, v in self.kwargs.items():
            ContextVar._cache[k].value = v

    def __exit__(self, *exc):
        for k, v in self.old.items():
            ContextVar._cache[k].value = v


DEBUG = ContextVar("DEBUG", 0)
NOOPT = ContextVar("NOOPT", 0)
SPLIT_REDUCEOP = ContextVar("SPLIT_REDUCEOP", 1)
TRACK_MATCH_STATS = ContextVar("TRACK_MATCH_STATS", 0)
SPEC = ContextVar("SPEC", 0)
VIZ = ContextVar("VIZ", 0)  # record schedules, rewrites and kernels; a web page shows them (zeptograd/viz/)
DEVECTORIZE = ContextVar("DEVECTORIZE", 1)  # 2: split every vector ALU op into lanes (codegen/devectorizer.py)
BEAM = ContextVar("BEAM", 0)  # search the optimizer actions with a beam this wide (engine/search.py)
BEAM_BUDGET = ContextVar("BEAM_BUDGET", 60)  # seconds of search per kernel
FUSE = ContextVar("FUSE", 1)  # 0: every elementwise op and reduce its own kernel (schedule/nofuse.py)
THREADS = ContextVar(
    "THREADS", len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
)


def gc_paused(fn: Callable[..., T]) -> Callable[..., T]:
    """fn with Python's cycle collector off while it runs (left as it was where it was already off). Scheduling a
    graph builds and drops many objects; each collection they trigger promotes the ones alive at that moment (the
    graph being scheduled), and once enough are promoted Python scans every object of the process: a DenseNet-121
    call from the schedule cache spent 0.7 s of its 1.4 s there (load 9), more the more the process holds. Off,
    they die by reference count and are never promoted; nothing here makes reference cycles that must be freed
    before the call returns."""

    @functools.wraps(fn)
    def paused(*args: Any, **kwargs: Any) -> T:
        if not gc.isenabled():  # off already (by the user, or a thread inside a paused call)
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.enable()

    return paused


def prod(xs: Iterable[Any], start: Any = 1) -> Any:
    return functools.reduce(lambda a, b: a * b, xs, start)


def argsort(xs: list) -> list[int]:
    return sorted(range(len(xs)), key=xs.__getitem__)


def flatten(xss: Iterable[Iterable[T]]) -> list[T]:
    return [x for xs in xss for x in xs]


def strides_for_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major (C-contiguous) strides of `shape`, in elements."""
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


def ceildiv(a: int, b: int) -> int:
    return -(-a // b)


def cache_dir() -> str:
    """$XDG_CACHE_HOME/zeptograd; an unset or empty XDG_CACHE_HOME means ~/.cache (never the working directory)."""
    return os.path.join(os.getenv("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "zeptograd")
