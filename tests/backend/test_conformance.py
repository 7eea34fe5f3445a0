"""Every backend implements the declared interface: the device class (zeptograd/device.py's CompiledDevice), its
Renderer (zeptograd/renderer/__init__.py), Compiler, Program and Allocator. A new backend runs this first: each
failure lists what its classes lack.

Classes are checked in every `zeptograd/runtime/ops_*.py` module (without opening a device: CUDA's are checked on a
machine without a GPU too), and the opened devices' instances (field types, GPU limits) where a device opens here."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import typing

import numpy as np
import pytest

import zeptograd.renderer
import zeptograd.runtime
from zeptograd import Tensor
from zeptograd.codegen import full_rewrite
from zeptograd.codegen.opt import Opt, OptOps
from zeptograd.device import _BACKENDS, Allocator, CompiledDevice, Compiler, Device, HostAllocator, Program
from zeptograd.engine.realize import schedule_tensors
from zeptograd.helpers import ArgumentError
from zeptograd.renderer import ProgramSpec, Renderer

# what a subclass must define itself (the base raises NotImplementedError); a Compiler needs one of its three
REQUIRED = {
    CompiledDevice: ("build",),
    Renderer: ("render",),
    Program: ("__call__",),
    Allocator: ("alloc", "free", "capacity", "handle", "copyin", "copyout"),
}
COMPILER_ANY_OF = ("build", "build_file", "compile")


def _defines(cls: type, base: type, name: str) -> bool:
    return getattr(cls, name) is not getattr(base, name)


def class_gaps(cls: type) -> list[str]:
    """What cls (a subclass of one of the interface's bases) lacks, one line each; [] when it is complete."""
    gaps = []
    for base, names in REQUIRED.items():
        if issubclass(cls, base) and cls is not base:
            gaps += [f"{cls.__name__} must implement {base.__name__}.{n}" for n in names if not _defines(cls, base, n)]
    if issubclass(cls, Compiler) and cls is not Compiler:
        if not any(_defines(cls, Compiler, n) for n in COMPILER_ANY_OF):
            gaps.append(f"{cls.__name__} must implement Compiler.build, build_file or compile")
        elif not any(_defines(cls, Compiler, n) for n in ("build", "build_file")) and cls.disk_cached:
            gaps.append(f"{cls.__name__} implements only compile: set disk_cached = False (compile_to_file builds)")
    if issubclass(cls, CompiledDevice) and cls is not CompiledDevice and _defines(cls, CompiledDevice, "build"):
        returned = typing.get_type_hints(cls.build, vars(inspect.getmodule(cls))).get("return")
        if not (inspect.isclass(returned) and issubclass(returned, Program)):
            gaps.append(f"{cls.__name__}.build must be annotated to return its Program subclass, not {returned!r}")
    return gaps


def _is(value, hint) -> bool:
    """value matches a field's declared type (str, int, bool, tuple[int, ...], frozenset[Ops])."""
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if typing.get_origin(hint) is tuple:
        return isinstance(value, tuple) and all(isinstance(x, int) and not isinstance(x, bool) for x in value)
    if typing.get_origin(hint) is frozenset:  # frozenset[Ops]
        return isinstance(value, frozenset) and all(isinstance(x, typing.get_args(hint)[0]) for x in value)
    return isinstance(value, hint)


def field_gaps(r: Renderer | type[Renderer], name: str) -> list[str]:
    """Renderer fields (on the class, or an opened device's instance) whose values don't have their declared types."""
    hints = typing.get_type_hints(Renderer)
    return [
        f"{name}.{f} = {getattr(r, f)!r} is not a {hint}" for f, hint in hints.items() if not _is(getattr(r, f), hint)
    ]


def device_gaps(dev: CompiledDevice) -> list[str]:
    """What an opened device lacks: its classes' gaps, fields whose values don't have their declared types, and
    consistent GPU limits."""
    parts = [("device", dev, CompiledDevice), ("renderer", dev.renderer, Renderer)]
    parts += [("compiler", dev.compiler, Compiler), ("allocator", dev.allocator, Allocator)]
    gaps = []
    for role, obj, base in parts:
        if not isinstance(obj, base) or type(obj) is base:
            gaps.append(f"{dev.name}'s {role} ({type(obj).__name__}) must be a subclass of {base.__name__}")
            continue
        gaps += class_gaps(type(obj))
    if gaps:
        return gaps
    r = dev.renderer
    gaps += field_gaps(r, type(r).__name__)
    if not (isinstance(dev.compiler.key, str) and dev.compiler.key):
        gaps.append(f"{type(dev.compiler).__name__}.key must be a non-empty str")
    if not isinstance(dev.beam_timing, bool):
        gaps.append(f"{type(dev).__name__}.beam_timing must be a bool")
    if r.has_local:  # codegen maps loops onto work-group ids within these limits
        if r.has_threads:
            gaps.append(f"{type(r).__name__}: has_local kernels run on work-group threads: has_threads must be False")
        for name in ("global_max", "local_max"):
            if not 1 <= len(getattr(r, name)) <= 3 or min(getattr(r, name)) < 1:
                gaps.append(f"{type(r).__name__}.{name} = {getattr(r, name)} must be 1 to 3 positive sizes (x, y, z)")
        if r.local_threads_max < 1:
            gaps.append(f"{type(r).__name__}.local_threads_max must be positive")
    return gaps


RUNTIME_MODULES = sorted(
    f"zeptograd.runtime.{m.name}" for m in pkgutil.iter_modules(zeptograd.runtime.__path__) if m.name.startswith("ops_")
)
RENDERER_MODULES = sorted(f"zeptograd.renderer.{m.name}" for m in pkgutil.iter_modules(zeptograd.renderer.__path__))


def test_every_registered_backend_is_a_runtime_module():
    assert set(_BACKENDS.values()) <= set(RUNTIME_MODULES)


@pytest.mark.parametrize("module", RUNTIME_MODULES + RENDERER_MODULES)
def test_backend_classes_implement_the_interface(module):
    mod = importlib.import_module(module)
    classes = [c for _, c in inspect.getmembers(mod, inspect.isclass) if c.__module__ == module]
    interface = [c for c in classes if issubclass(c, (CompiledDevice, Renderer, Compiler, Program, Allocator))]
    assert interface, f"{module} defines none of the interface's classes"
    gaps = [g for c in interface for g in class_gaps(c)]
    gaps += [g for c in interface if issubclass(c, Renderer) for g in field_gaps(c, c.__name__)]
    assert not gaps, f"{module}:\n" + "\n".join(gaps)


@pytest.mark.parametrize("name", sorted({*_BACKENDS, "CPU:C", "CPU:LLVM"}))
def test_opened_device_conforms(name):
    try:
        dev = Device[name]
    except Exception as e:  # no driver, GPU or compiler here: its classes are checked above
        pytest.skip(f"{name} does not open here: {type(e).__name__}: {e}")
    gaps = device_gaps(dev)
    assert not gaps, f"{name}:\n" + "\n".join(gaps)


def test_gaps_are_named():
    """A backend that only subclasses the bases is told each part it lacks."""

    class HalfRenderer(Renderer):
        has_local = True  # GPU limits left at the base's empty defaults
        local_threads_max = 256

    class HalfCompiler(Compiler):
        def compile(self, src: str) -> bytes:  # but disk_cached is still True
            return src.encode()

    class HalfProgram(Program):
        pass

    class HalfAllocator(Allocator[bytearray]):
        def alloc(self, nbytes: int) -> bytearray:
            return bytearray(nbytes)

    class HalfDevice(CompiledDevice):
        pass

    dev = HalfDevice("HALF", HalfRenderer(), HalfCompiler(), HalfAllocator())
    gaps = device_gaps(dev)
    assert gaps == [
        "HalfDevice must implement CompiledDevice.build",
        "HalfRenderer must implement Renderer.render",
        "HalfCompiler implements only compile: set disk_cached = False (compile_to_file builds)",
        "HalfAllocator must implement Allocator.free",
        "HalfAllocator must implement Allocator.capacity",
        "HalfAllocator must implement Allocator.handle",
        "HalfAllocator must implement Allocator.copyin",
        "HalfAllocator must implement Allocator.copyout",
    ]
    assert class_gaps(HalfProgram) == ["HalfProgram must implement Program.__call__"]

    class FullRenderer(HalfRenderer):
        has_threads = False
        simd_bytes = 16.0  # the wrong type on purpose: the check names it

        def render(self, name, uops) -> ProgramSpec:
            return ProgramSpec(name, "", 0)

    class CachelessCompiler(HalfCompiler):
        disk_cached = False

    class FullDevice(CompiledDevice):
        def build(self, spec: ProgramSpec) -> Program:
            return Program(spec)

    assert device_gaps(FullDevice("FULL", FullRenderer(), Compiler(), HostAllocator())) == [
        "FULL's compiler (Compiler) must be a subclass of Compiler"
    ]
    assert device_gaps(FullDevice("FULL", FullRenderer(), CachelessCompiler(), HostAllocator())) == [
        "FullRenderer.simd_bytes = 16.0 is not a <class 'int'>",
        "FullRenderer.global_max = () must be 1 to 3 positive sizes (x, y, z)",
        "FullRenderer.local_max = () must be 1 to 3 positive sizes (x, y, z)",
    ]


@pytest.mark.parametrize("name", ["CPU", "CPU:C", "PYTHON"])
@pytest.mark.parametrize("cores", [1, 2])
def test_cores_is_the_threaded_call_count(name, cores):
    """ProgramSpec.cores: a CPU kernel THREADed over n cores says n (and takes a core_id); unthreaded, 1."""
    dev = Device[name]
    x = np.arange(64, dtype=np.float32)
    (item,) = schedule_tensors([Tensor(x, device=name) + 1])
    uops, _ = full_rewrite(item.ast, dev.renderer, [Opt(OptOps.THREAD, 0, cores)] if cores > 1 else [])
    spec = dev.renderer.render("conformance_cores", uops)
    assert spec.cores == cores
    for b in item.bufs:
        b.ensure_allocated()
    item.bufs[1].copyin(x)
    dev.build(spec)(*[b.ptr for b in item.bufs])
    np.testing.assert_array_equal(item.bufs[0].numpy(), x + 1)


@pytest.mark.parametrize("name", ["PYTHON", "NULL"])
def test_beam_refuses_devices_whose_times_mean_nothing(name):
    from zeptograd.engine.search import beam_search

    (item,) = schedule_tensors([Tensor([1.0, 2.0], device=name) + 1])
    with pytest.raises(ArgumentError, match="beam_timing"):
        beam_search(name, item.ast, item.bufs, 2)
