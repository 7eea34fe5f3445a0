"""GPU backends: OpenCL run on whatever platform is here (PoCL on a CPU), CUDA source compiled by nvcc / NVRTC.

CL values are checked against numpy and against the PYTHON device; the generated kernels are checked for their
GPU form (thread ids, global/local sizes, `__local` memory and barriers for GROUP reduces). CUDA needs a GPU to
run; where there is none, its source for a representative set of kernels is compiled only.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

# PoCL caches compiled kernels on disk: keep that cache out of the home directory (set before PoCL loads)
os.environ.setdefault("POCL_CACHE_DIR", os.path.join(tempfile.gettempdir(), "zeptograd-pocl-cache"))

from tests.slow import fast_first
from zeptograd import Device, Tensor, dtypes  # noqa: E402
from zeptograd.codegen import full_rewrite, kernel_name  # noqa: E402
from zeptograd.codegen.gpudims import assign_dims  # noqa: E402
from zeptograd.codegen.opt import Opt, OptError, OptOps, apply_opt  # noqa: E402
from zeptograd.device import Buffer  # noqa: E402
from zeptograd.engine import kernels, realize  # noqa: E402
from zeptograd.engine.realize import schedule_tensors  # noqa: E402
from zeptograd.renderer import ProgramSpec  # noqa: E402
from zeptograd.renderer.gpu import CUDARenderer, OpenCLRenderer  # noqa: E402
from zeptograd.runtime import ops_cl, ops_cuda  # noqa: E402
from zeptograd.uop.ops import Ops, UOp  # noqa: E402


def _cl_unavailable() -> str | None:
    try:
        Device["CL"]
    except Exception as e:
        return f"no OpenCL here: {e}"
    return None


@pytest.fixture
def cl():
    """Skips where CL does not open; asked when a test runs, not at import (opening PoCL costs every process)."""
    if (why := _cl_unavailable()) is not None:
        pytest.skip(why)


# the tests that run kernels on CL are slow (PoCL compiles each: see tests/conftest.py); those that only render
# OpenCL run in the inner loop on a CPU tensor with OpenCLRenderer() (the CL device's renderer has the same fields:
# the same source) and in the full run on the CL device too
needs_cl = pytest.mark.usefixtures("cl")
RENDER_ON = ["CPU", "CL"]


def render_specs(t: Tensor) -> list[ProgramSpec]:
    """specs of t with the CL device's renderer where t is on CL, else with OpenCLRenderer()"""
    return specs(t, None if t.device == "CL" else OpenCLRenderer())


@pytest.fixture(params=["CL", "CUDA"])
def gpu(request) -> str:
    """The value tests run on each GPU backend that opens here (PoCL's CL on CI; CUDA where there is an NVIDIA GPU)."""
    try:
        Device[request.param]
    except Exception as e:
        pytest.skip(f"{request.param} is not available: {e}")
    return request.param


rng = np.random.default_rng(0)


def specs(t: Tensor, renderer=None, opts: list[Opt] | None = None) -> list[ProgramSpec]:
    """The ProgramSpecs of the kernels that would realize t (rendered, not run)."""
    renderer = renderer or Device["CL"].renderer
    out = []
    for item in schedule_tensors([t]):
        uops, _ = full_rewrite(item.ast, renderer, opts)
        out.append(renderer.render(kernel_name(item.ast), uops))
    return out


def run_with_opts(t: Tensor, opts: list[Opt]) -> tuple[np.ndarray, ProgramSpec]:
    """Run the single kernel of t on CL with the given actions instead of the heuristic's."""
    (item,) = schedule_tensors([t])
    dev = Device[item.device]
    uops, _ = full_rewrite(item.ast, dev.renderer, opts)
    spec = dev.renderer.render(kernel_name(item.ast), uops)
    program = dev.build(spec)
    program(*[b.ptr for b in item.bufs])
    return item.bufs[0].numpy(), spec


def both(fn, *arrays: np.ndarray, gpu: str = "CL") -> tuple[np.ndarray, np.ndarray]:
    """fn on a GPU backend and on the PYTHON reference."""
    return tuple(fn(*[Tensor(a, device=d) for a in arrays]).numpy() for d in (gpu, "PYTHON"))  # type: ignore


def softmax(t: Tensor) -> Tensor:
    e = (t - t.max(axis=-1, keepdim=True)).exp()
    return e / e.sum(axis=-1, keepdim=True)


# ***** OpenCL: values *****


@pytest.mark.slow
def test_elementwise_and_broadcast(gpu):
    a, b = rng.uniform(-2, 2, (24, 40)).astype(np.float32), rng.uniform(0.5, 2, (40,)).astype(np.float32)
    got, ref = both(lambda x, y: (x * y + 1).exp() / y - x.maximum(y), a, b, gpu=gpu)
    want = np.exp(a * b + 1) / b - np.maximum(a, b)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)


def test_int_half_and_bool(gpu):
    i = rng.integers(-100, 100, (8, 16)).astype(np.int32)
    h = rng.uniform(-2, 2, (8, 16)).astype(np.float16)
    got, ref = both(lambda x, y: ((x * 3 // 7) + (x > 0).int()).float() + (y * y).float(), i, h, gpu=gpu)
    want = (i * 3 // 7 + (i > 0)).astype(np.float32) + (h * h).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-3)
    np.testing.assert_array_equal(got, ref)  # half math rounded after each op, as PYTHON does


@pytest.mark.parametrize(
    "shape,axis", fast_first([((4096,), None), ((3, 1000), 1), ((64, 100), 0), ((2, 3, 4), (0, 2))], unpack=True)
)
def test_reductions(shape, axis, gpu):
    a = rng.uniform(-1, 1, shape).astype(np.float32)
    got, ref = both(lambda x: x.sum(axis=axis), a, gpu=gpu)
    np.testing.assert_allclose(got, a.sum(axis=axis), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    got, ref = both(lambda x: x.max(axis=axis), a, gpu=gpu)
    np.testing.assert_array_equal(got, a.max(axis=axis))
    np.testing.assert_array_equal(got, ref)


@pytest.mark.slow
def test_softmax_and_matmul(gpu):
    x = rng.uniform(-3, 3, (8, 50)).astype(np.float32)
    got, ref = both(softmax, x, gpu=gpu)
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)
    a, b = rng.uniform(-1, 1, (16, 48)).astype(np.float32), rng.uniform(-1, 1, (48, 24)).astype(np.float32)
    got, ref = both(lambda p, q: (p.reshape(16, 48, 1) * q.reshape(1, 48, 24)).sum(1), a, b, gpu=gpu)
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


# ***** OpenCL: the kernels' GPU form *****


@pytest.mark.parametrize("device", RENDER_ON)
def test_elementwise_uses_global_and_local_dims(device, request):
    if device == "CL":
        request.getfixturevalue("cl")
    # a transposed read keeps the two output loops apart (contiguous ones are merged into one range)
    (spec,) = render_specs(Tensor(np.zeros((96, 64), np.float32), device=device).T + 1)
    assert spec.local_size == (32, 8, 1) and spec.global_size == (3, 8, 1)  # columns are the innermost id
    assert "get_group_id(0)" in spec.src and "get_local_id(1)" in spec.src and "__kernel void" in spec.src


def test_one_output_axis_takes_up_to_256_threads():
    """An elementwise kernel with one output loop: the whole work-group goes on it (32-thread groups leave half a GPU
    idle)."""
    (spec,) = specs(Tensor(np.zeros(4096, np.float32), device="CPU") + 1, OpenCLRenderer())
    assert spec.local_size == (256, 1, 1) and spec.global_size == (16, 1, 1)
    (spec,) = specs(Tensor(np.zeros(100, np.float32), device="CPU") + 1, OpenCLRenderer())
    assert spec.local_size == (4, 1, 1)  # the largest divisor: no tail threads
    # not a reduce: 4096 row sums in groups of 256 would run on 16 multiprocessors of a 132-multiprocessor GPU
    (spec,) = specs(Tensor(np.zeros((4096, 4096), np.float32), device="CPU").sum(1), OpenCLRenderer())
    assert spec.local_size == (32, 1, 1) and spec.global_size == (128, 1, 1)


@pytest.mark.parametrize("device", RENDER_ON)
@pytest.mark.parametrize("shape,axis", [((4096,), None), ((3, 1024), 1)])
def test_group_reduce_through_local_memory(shape, axis, device, request):
    if device == "CL":
        request.getfixturevalue("cl")
    (spec,) = render_specs(Tensor(np.zeros(shape, np.float32), device=device).sum(axis=axis))
    assert "__local" in spec.src and "barrier(CLK_LOCAL_MEM_FENCE)" in spec.src
    assert spec.local_size[0] > 1 and spec.global_size == ((3, 1, 1) if axis else (1, 1, 1))
    assert "if (" in spec.src  # one thread of the group stores


@pytest.mark.slow
@needs_cl
def test_explicit_local_group_upcast_unroll():
    a = rng.standard_normal((16, 64)).astype(np.float32)
    t = Tensor(a, device="CL")
    got, spec = run_with_opts(t.sum(axis=1), [Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.GROUP, 1, 16)])
    np.testing.assert_allclose(got, a.sum(1), rtol=1e-5, atol=1e-5)
    assert spec.local_size == (16, 4, 1) and spec.global_size == (4, 1, 1)
    got, spec = run_with_opts(t.sum(axis=1), [Opt(OptOps.UNROLL, 1, 4), Opt(OptOps.GROUP, 1, 16)])
    np.testing.assert_allclose(got, a.sum(1), rtol=1e-5, atol=1e-5)
    assert "__local float4" in spec.src and "vload4" in spec.src  # vector partials through local memory
    got, spec = run_with_opts(t * 2 + 1, [Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.LOCAL, 0, 4)])  # one 1024 loop
    np.testing.assert_array_equal(got.reshape(16, 64), a * 2 + 1)
    assert "vload8" in spec.src and "vstore8" in spec.src
    assert spec.local_size == (4, 1, 1) and spec.global_size == (32, 1, 1)


@pytest.mark.slow
@needs_cl
def test_more_than_three_output_dims_are_merged():
    x = rng.standard_normal((2, 3, 4, 5, 6)).astype(np.float32)
    order = (4, 2, 0, 3, 1)  # no two neighbouring output axes are neighbours in memory: 5 output loops
    got, spec = run_with_opts(Tensor(x, device="CL").permute(*order).exp(), [])
    np.testing.assert_allclose(got.reshape(6, 4, 2, 5, 3), np.exp(x.transpose(order)), rtol=1e-6)
    assert spec.global_size == (3, 5, 48) and "gidx2" in spec.src and "gidx3" not in spec.src


def test_dims_over_the_limits():
    rs = [UOp.range(100000, 0), UOp.range(4, 1)]
    mapping, sizes = assign_dims(rs, (2**31 - 1, 65535, 65535), "gidx")  # CUDA's y is too small: one x id
    assert sizes == [400000] and len(mapping) == 2
    rs = [UOp.range(n, i) for i, n in enumerate([2, 3, 4, 5, 6])]
    assert assign_dims(rs, (2**31 - 1, 65535, 65535), "gidx")[1] == [6, 5, 24]
    mapping, sizes = assign_dims(rs, (8, 8, 8), "lidx")  # 2*3*4 fits no id: those stay loops
    assert sizes == [6, 5] and len(mapping) == 2


def test_group_reduce_inside_a_loop_is_refused():
    """Outputs over the id limits stay loops; a GROUP reduce in such a loop would reuse its shared memory."""
    (item,) = schedule_tensors([Tensor(np.zeros((3, 1024), np.float32), device="CPU").sum(axis=1)])
    small = OpenCLRenderer(global_max=(2, 2, 2))
    uops, _ = full_rewrite(item.ast, small, [])  # plain loops are fine
    assert any(u.op.name == "RANGE" for u in uops)
    with pytest.raises(OptError, match="inside a loop"):
        full_rewrite(item.ast, small, [Opt(OptOps.GROUP, 1, 16)])


def test_a_reduce_inside_another_reduces_loop_is_not_grouped(gpu):
    """A reduce fused into the sum over its outputs (SqueezeNet's last 1x1 conv, relu and global average pool was
    one such kernel): the heuristic gave the inner reduce GROUP, inside the pooling sum's loop, and the GPU dims pass
    refused it with an OptError at the user's call. Only the outer sum could share a work-group; it is too short to.
    A matmul there is now stored first (the cost model's tiled contraction), so the inner reduce here is a max."""
    x, w, b = rng.standard_normal((256, 5, 5)), rng.standard_normal((20, 256)), rng.standard_normal(20)
    x, w, b = (a.astype(np.float32) for a in (x, w, b))

    def fn(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
        return ((w.reshape(20, 256, 1) * x.reshape(1, 256, 25)).max(1) + b.reshape(20, 1)).relu().sum(1)

    got = fn(*[Tensor(a, device=gpu) for a in (x, w, b)])
    (item,) = schedule_tensors([got])
    assert sum(u.op is Ops.REDUCE for u in item.ast.toposort()) == 2  # one kernel, the max inside the sum
    ref = np.maximum((w[:, :, None] * x.reshape(1, 256, 25)).max(1) + b[:, None], 0).sum(1)
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-4)


def test_zero_size_and_transfers(gpu):
    got, _ = both(lambda x: x.sum(axis=1) + 1, np.zeros((3, 0), np.float32), gpu=gpu)
    np.testing.assert_array_equal(got, np.ones(3, np.float32))
    a = rng.standard_normal((5, 7)).astype(np.float32)
    np.testing.assert_array_equal(Tensor(a, device=gpu).to("CPU").numpy(), a)
    np.testing.assert_array_equal(Tensor(a).to(gpu).numpy(), a)


def test_local_and_group_need_the_right_axis_kind():
    (item,) = schedule_tensors([Tensor(np.zeros((4, 32), np.float32), device="CPU").sum(axis=1)])
    with pytest.raises(OptError):
        apply_opt(item.ast, Opt(OptOps.GROUP, 0, 2))  # axis 0 is an output
    with pytest.raises(OptError):
        apply_opt(item.ast, Opt(OptOps.LOCAL, 1, 2))  # axis 1 is a reduce


def test_cl_renderer_without_a_device():
    """The OpenCL C of a GROUP reduce renders anywhere (no platform needed)."""
    (spec,) = specs(Tensor(np.zeros((2, 4096), np.float32), device="CPU").sum(axis=1), OpenCLRenderer())
    assert "__local float temp0[256];" in spec.src and spec.local_size == (256, 1, 1) and spec.global_size[0] == 2


# ***** CUDA: compile only (no GPU here), and runs where there is one *****


def cuda_kernels() -> dict[str, ProgramSpec]:
    a = Tensor(np.zeros((64, 256), np.float32), device="CPU")
    b = Tensor(np.zeros((256, 32), np.float32), device="CPU")
    h = Tensor(np.zeros((8, 16), np.float16), device="CPU")
    r = CUDARenderer("sm_90")
    (ew,) = specs(a * 2 + 1, r)
    (red,) = specs(a.sum(axis=1), r)
    (mm,) = specs((a.reshape(64, 256, 1) * b.reshape(1, 256, 32)).sum(1), r)
    (half,) = specs((h * h).exp().bfloat16(), r)
    (vec,) = specs(a.sum(axis=1), r, [Opt(OptOps.UNROLL, 1, 4), Opt(OptOps.GROUP, 1, 16)])
    return {"elementwise": ew, "group_reduce": red, "matmul": mm, "half_bf16": half, "vector": vec}


def test_cuda_source_form():
    ks = cuda_kernels()
    assert "__shared__" in ks["group_reduce"].src and "__syncthreads();" in ks["group_reduce"].src
    assert 'extern "C" __global__' in ks["elementwise"].src and "threadIdx.x" in ks["elementwise"].src
    assert ks["group_reduce"].local_size == (256, 1, 1) and ks["group_reduce"].global_size == (64, 1, 1)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_cuda_compiles_with_nvcc(tmp_path):
    ks = cuda_kernels()
    for name, spec in ks.items():
        path = tmp_path / f"{name}.cu"
        path.write_text(spec.src)
        proc = subprocess.run(
            ["nvcc", "-cubin", "-arch=sm_90", "-o", str(tmp_path / f"{name}.cubin"), str(path)],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, f"{name}:\n{proc.stderr}\n{spec.src}"


@pytest.mark.slow
def test_cuda_compiles_with_nvrtc():
    try:
        ops_cuda.nvrtc()
    except ops_cuda.DeviceUnavailable as e:
        pytest.skip(str(e))
    for name, spec in cuda_kernels().items():
        assert ops_cuda.nvrtc_compile(spec.src, "sm_90")[:4] == b"\x7fELF", name
    assert b".entry" in ops_cuda.nvrtc_compile(cuda_kernels()["matmul"].src, "compute_90")


@pytest.mark.slow
def test_nvrtc_builtins_come_from_beside_libnvrtc():
    """NVRTC dlopens libnvrtc-builtins by soname at its first compile; a pip wheel's folder is not on the loader's
    path, so zeptograd preloads the builtins beside the libnvrtc it opened. In a fresh process with no library path
    set, the builtins mapped after a compile are the ones from libnvrtc's own folder."""
    try:
        ops_cuda.nvrtc()
    except ops_cuda.DeviceUnavailable as e:
        pytest.skip(str(e))
    code = (
        "from zeptograd.runtime import ops_cuda\n"
        "ops_cuda.nvrtc_compile('extern \"C\" __global__ void k(float *a) { a[0] = sinf(a[0]); }', 'sm_90')\n"
        "maps = open('/proc/self/maps').read().split()\n"
        "libs = {p for p in maps if '/libnvrtc' in p}\n"
        "import json; print(json.dumps(sorted(libs)))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    libs = json.loads(proc.stdout)
    main = [p for p in libs if "builtins" not in p]
    builtins = [p for p in libs if "builtins" in p]
    assert main and builtins, libs
    assert {os.path.dirname(p) for p in builtins} == {os.path.dirname(main[0])}, libs


def test_cuda_runs_where_there_is_a_gpu():
    try:
        Device["CUDA"]
    except Exception as e:
        pytest.skip(f"no CUDA GPU: {e}")
    a = rng.uniform(-1, 1, (3, 1000)).astype(np.float32)
    np.testing.assert_allclose(Tensor(a, device="CUDA").sum(axis=1).numpy(), a.sum(1), rtol=1e-4)


class FakeDriver:
    """libcuda's calls used by ops_cuda, on host memory: checks the runtime's marshalling without a GPU."""

    def __init__(self):
        self.mem: dict[int, np.ndarray] = {}
        self.launches: list[tuple] = []

    def _ok(self, *_):
        return 0

    cuInit = cuCtxSetCurrent = cuCtxSynchronize = cuModuleGetFunction = _ok

    def cuDeviceGetCount(self, n):
        n._obj.value = 1
        return 0

    def cuDeviceGet(self, d, ordinal):
        d._obj.value = ordinal
        return 0

    def cuDeviceGetAttribute(self, v, attr, dev):
        v._obj.value = {1: 1024, 2: 1024, 3: 1024, 4: 64, 75: 9, 76: 0}.get(attr, 65535)
        return 0

    def cuDevicePrimaryCtxRetain(self, ctx, dev):
        ctx._obj.value = 1
        return 0

    def cuMemAlloc_v2(self, ptr, size):
        a = np.zeros(size.value, np.uint8)
        self.mem[a.ctypes.data] = a
        ptr._obj.value = a.ctypes.data
        return 0

    def cuMemcpyHtoD_v2(self, dst, src, n):
        ctypes.memmove(dst.value, src.value, n.value)
        return 0

    def cuMemcpyDtoH_v2(self, dst, src, n):
        ctypes.memmove(dst.value, src.value, n.value)
        return 0

    def cuModuleLoadData(self, module, image):
        assert image.value[:4] == b"\x7fELF"  # a cubin from NVRTC
        return 0

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        ptrs = [ctypes.c_uint64.from_address(params[i]).value for i in range(2)]
        self.launches.append(((gx.value, gy.value, gz.value), (bx.value, by.value, bz.value), ptrs))
        return 0


def test_cuda_runtime_with_a_fake_driver(monkeypatch):
    try:
        ops_cuda.nvrtc()
    except ops_cuda.DeviceUnavailable as e:
        pytest.skip(str(e))
    fake = FakeDriver()
    monkeypatch.setattr(ops_cuda, "_driver", lambda: fake)
    dev = ops_cuda.open_device("CUDA")
    assert dev.renderer.arch == "sm_90" and dev.renderer.local_max == (1024, 1024, 64)
    a = np.arange(3 * 1024, dtype=np.float32)
    buf = Buffer("CPU", a.size, dtypes.float32)  # a Buffer whose allocator is the fake CUDA one
    buf._allocator = dev.allocator
    buf._mem = dev.allocator.alloc(a.nbytes)
    buf.copyin(a)
    np.testing.assert_array_equal(buf.numpy(), a)
    (item,) = schedule_tensors([Tensor(a.reshape(3, 1024), device="CPU").sum(axis=1)])
    uops, _ = full_rewrite(item.ast, dev.renderer)
    program = dev.build(dev.renderer.render("r_3_1024", uops))
    out = dev.allocator.alloc(12)
    program(out.ptr, buf.ptr)
    assert fake.launches == [((3, 1, 1), (256, 1, 1), [out.ptr, buf._mem.ptr])]


class TwoGPUFakeDriver(FakeDriver):
    """Two GPUs, each context its own number, each loaded module counted by the context that was current."""

    def __init__(self):
        super().__init__()
        self.current, self.modules = 0, []

    def cuDeviceGetCount(self, n):
        n._obj.value = 2
        return 0

    def cuDevicePrimaryCtxRetain(self, ctx, dev):
        ctx._obj.value = dev.value + 1
        return 0

    def cuCtxSetCurrent(self, ctx):
        self.current = ctx.value
        return 0

    def cuModuleLoadData(self, module, image):
        assert image.value[:4] == b"\x7fELF"  # a cubin from NVRTC
        self.modules.append(self.current)
        return 0


def test_sharded_graph_compiles_for_two_cuda_devices(monkeypatch):
    """CUDA:0 and CUDA:1 without a GPU: a matmul over a sharded contraction axis (per-device partial products, the
    all-reduce's copies and adds) is scheduled, every kernel compiled by NVRTC and loaded on its own GPU's context.
    The fake driver runs no kernel, so only the structure is checked; the values are checked on a real GPU
    (bench/gpu_check.sh)."""
    try:
        ops_cuda.nvrtc()
    except ops_cuda.DeviceUnavailable as e:
        pytest.skip(str(e))
    fake = TwoGPUFakeDriver()
    monkeypatch.setattr(ops_cuda, "_driver", lambda: fake)
    # the fake devices leave with the test; a real GPU's CUDA device, opened by an earlier test, steps aside for it
    monkeypatch.setattr(Device, "_opened", {k: v for k, v in Device._opened.items() if not k.startswith("CUDA")})
    cache: dict = {}  # kernels built for that real device are not the fake's
    monkeypatch.setattr(kernels, "_kernel_cache", cache)  # (get_kernel's, and _run_plan's in realize)
    monkeypatch.setattr(realize, "_kernel_cache", cache)
    monkeypatch.setattr(kernels, "_program_keys", {})
    devices = ("CUDA", "CUDA:1")
    x = Tensor(np.ones((4, 6), np.float32), device="CPU").shard(devices, axis=1)
    w = Tensor(np.ones((6, 5), np.float32), device="CPU").shard(devices, axis=0)
    (x @ w).realize()
    # on each GPU's context: its partial product and the all-reduce's sum of the two partials
    assert sorted(fake.modules) == [1, 1, 2, 2] and len(fake.launches) == 4
    assert {Device[d].renderer.arch for d in devices} == {"sm_90"}


# ***** clear errors *****


def test_missing_pyopencl_is_one_sentence(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyopencl", None)  # import pyopencl -> ImportError
    with pytest.raises(ops_cl.DeviceUnavailable, match=r"pip install pyopencl") as e:
        ops_cl.open_device("CL")
    assert e.value.__cause__ is None and e.value.__suppress_context__ and "\n" not in str(e.value)


def test_missing_opencl_platform_is_one_sentence(monkeypatch):
    pytest.importorskip("pyopencl")
    monkeypatch.setattr(ops_cl, "cl_devices", lambda: [])
    with pytest.raises(ops_cl.DeviceUnavailable, match=r"apt-get install pocl-opencl-icd"):
        ops_cl.open_device("CL")
    with pytest.raises(ValueError, match="unknown OpenCL device"):
        ops_cl.open_device("CL:x")


def test_missing_cuda_driver_or_nvrtc_is_one_sentence(monkeypatch):
    monkeypatch.setattr(
        ops_cuda,
        "_driver",
        lambda: (_ for _ in ()).throw(
            ops_cuda.DeviceUnavailable("CUDA needs the NVIDIA driver (libcuda.so.1), which is not installed here")
        ),
    )
    with pytest.raises(ops_cuda.DeviceUnavailable, match="NVIDIA driver"):
        ops_cuda.open_device("CUDA")
    monkeypatch.setattr(ops_cuda, "_nvrtc_candidates", lambda: [])
    ops_cuda.nvrtc.cache_clear()
    try:
        with pytest.raises(ops_cuda.DeviceUnavailable, match=r"pip install nvidia-cuda-nvrtc"):
            ops_cuda.nvrtc()
    finally:
        ops_cuda.nvrtc.cache_clear()


def test_cuda_without_a_driver_here():
    try:
        ops_cuda._driver()
    except ops_cuda.DeviceUnavailable as e:
        assert "NVIDIA driver" in str(e) and "\n" not in str(e)
        with pytest.raises(ops_cuda.DeviceUnavailable):
            Device["CUDA"]
    else:
        pytest.skip("an NVIDIA driver is installed here")
