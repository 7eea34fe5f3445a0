"""An op of tensors on different devices raises at the call, naming both devices, as torch does ("Expected all
tensors to be on the same device"): a kernel reads one device's memory. PYTHON and CPU both keep their memory on the
host, so a missing check there would read across devices without a visible failure."""

import pytest
import torch

from zeptograd import Tensor, nn


def other(t, device="PYTHON"):
    return t.to(device)


def _setitem(t, key, value):
    t[key] = value
    return t


CASES = {
    "add": lambda a, i, m: a + other(a),
    "radd": lambda a, i, m: other(a) + a,
    "mul_inplace": lambda a, i, m: a.__imul__(other(a)),
    "maximum": lambda a, i, m: a.maximum(other(a)),
    "compare": lambda a, i, m: a < other(a),
    "pow": lambda a, i, m: a.pow(other(a)),
    "where_condition": lambda a, i, m: other(m).where(a, a),
    "where_x": lambda a, i, m: m.where(other(a), a),
    "where_y": lambda a, i, m: m.where(a, other(a)),
    "where_x_scalar": lambda a, i, m: m.where(1.0, other(a)),
    "where_both_scalars": lambda a, i, m: other(m).where(1.0, 2.0) + a,
    "masked_fill": lambda a, i, m: a.masked_fill(other(m), 0.0),
    "lerp": lambda a, i, m: a.lerp(other(a), 0.5),
    "clip_tensor_bound": lambda a, i, m: a.clip(other(a), 2.0),
    "matmul": lambda a, i, m: a.reshape(2, 2) @ other(a.reshape(2, 2)),
    "dot": lambda a, i, m: a.dot(other(a)),
    "cat": lambda a, i, m: a.cat(other(a)),
    "stack": lambda a, i, m: Tensor.stack(a, other(a)),
    "assign": lambda a, i, m: a.contiguous().realize().assign(other(a)),
    "setitem_value": lambda a, i, m: _setitem(a.contiguous().realize(), 1, other(a)[0]),
    "setitem_index": lambda a, i, m: _setitem(a.contiguous().realize(), other(i), 5.0),
    "getitem_index": lambda a, i, m: a[other(i)],
    "gather": lambda a, i, m: a.gather(0, other(i)),
    "scatter_src": lambda a, i, m: a.scatter(0, i, other(a)),
    "scatter_index": lambda a, i, m: a.scatter(0, other(i), a),
    "conv2d_weight": lambda a, i, m: a.reshape(1, 1, 2, 2).conv2d(other(Tensor.ones(1, 1, 1, 1))),
    "cross_entropy": lambda a, i, m: a.reshape(1, 4).cross_entropy(other(Tensor([1]))),
    "embedding": lambda a, i, m: nn.Embedding(4, 2)(other(i)),
}


@pytest.mark.parametrize("name", CASES)
def test_ops_of_tensors_on_two_devices_raise(name):
    a, idx, mask = Tensor([1.0, 2.0, 3.0, 4.0]), Tensor([1, 0, 3, 2]), Tensor([True, False, True, False])
    with pytest.raises(RuntimeError, match=r"different devices: (CPU and PYTHON|PYTHON and CPU)"):
        CASES[name](a, idx, mask).realize()


@pytest.mark.parametrize("device", ["CL", "CPU:C"])
def test_the_error_comes_before_any_kernel(device):
    from tests.backend.conftest import unavailable

    if (why := unavailable(device)) is not None:
        pytest.skip(why)
    a, mask = Tensor([1.0, 2.0]), Tensor([True, False])
    with pytest.raises(RuntimeError, match=f"different devices: {device} and CPU"):
        other(mask, device).where(a, 0.0)


@pytest.mark.slow  # a first op on torch's meta device imports torch._dynamo: seconds, for a check of torch itself
def test_torch_raises_runtime_error_too():
    a, m = torch.ones(2), torch.ones(2, device="meta")
    for op in (lambda: a + m, lambda: torch.where(m > 0, a, a), lambda: torch.cat([a, m])):
        with pytest.raises(RuntimeError, match="device"):
            op()
