"""What torch rejects, zeptograd rejects too, with the same catchable type: a typo must not become a wrong answer.

Every case runs the torch call first and checks that torch raises (the table states the type torch raises), then the
zeptograd call: it must raise an exception of that type (zeptograd's ArgumentError / ArgumentTypeError are
RuntimeErrors as well as ValueError / TypeError), raised at the Tensor layer: no frame of the traceback is in the
scheduler, codegen, the renderers or the runtimes, so the error is about the user's call, not a later stage."""

import traceback

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from zeptograd import Tensor, dtypes

DEEP = ("/zeptograd/schedule/", "/zeptograd/codegen/", "/zeptograd/renderer/", "/zeptograd/runtime/")


def Z(*shape, dtype=np.float32):
    return Tensor(np.arange(int(np.prod(shape))).reshape(shape).astype(dtype))


def T(*shape, dtype=np.float32):
    return torch.tensor(np.arange(int(np.prod(shape))).reshape(shape).astype(dtype))


def _run(fn):
    """Call fn; realize a Tensor result, so a check that only the kernel would make still counts."""
    out = fn()
    for t in out if isinstance(out, (tuple, list)) else (out,):
        if isinstance(t, Tensor):
            t.realize()


def assert_raised_at_the_tensor_layer(err: BaseException):
    deep = [
        f"{f.filename}:{f.lineno}"
        for f in traceback.extract_tb(err.__traceback__)
        if any(d in f.filename for d in DEEP)
    ]
    assert not deep, f"{type(err).__name__}({err}) raised below the Tensor layer, from {deep}"


I64 = np.int64
# name: (zeptograd call, torch call, the type torch raises)
CASES = {
    # shapes that don't fit
    "matmul": (lambda: Z(2, 3) @ Z(2, 3), lambda: T(2, 3) @ T(2, 3), RuntimeError),
    "matmul_1d": (lambda: Z(3) @ Z(4), lambda: T(3) @ T(4), RuntimeError),
    "dot": (lambda: Z(3).dot(Z(4)), lambda: T(3).dot(T(4)), RuntimeError),
    "linear": (lambda: Z(2, 3).linear(Z(4, 5)), lambda: F.linear(T(2, 3), T(5, 4)), RuntimeError),
    "cat": (lambda: Z(2, 3).cat(Z(2, 4)), lambda: torch.cat([T(2, 3), T(2, 4)]), RuntimeError),
    "cat_ndim": (lambda: Z(2, 3).cat(Z(3)), lambda: torch.cat([T(2, 3), T(3)]), RuntimeError),
    "stack": (lambda: Z(2, 3).stack(Z(2, 4)), lambda: torch.stack([T(2, 3), T(2, 4)]), RuntimeError),
    "permute_short": (lambda: Z(2, 3).permute(0), lambda: T(2, 3).permute(0), RuntimeError),
    "permute_repeat": (lambda: Z(2, 3).permute(0, 0), lambda: T(2, 3).permute(0, 0), RuntimeError),
    "reshape": (lambda: Z(2, 3).reshape(4, 2), lambda: T(2, 3).reshape(4, 2), RuntimeError),
    "reshape_two_minus_one": (lambda: Z(2, 3).reshape(-1, -1), lambda: T(2, 3).reshape(-1, -1), RuntimeError),
    "reshape_minus_one": (lambda: Z(2, 3).reshape(-1, 4), lambda: T(2, 3).reshape(-1, 4), RuntimeError),
    "view": (lambda: Z(2, 3).view(5), lambda: T(2, 3).view(5), RuntimeError),
    "expand": (lambda: Z(2, 3).expand(4, 3), lambda: T(2, 3).expand(4, 3), RuntimeError),
    "expand_fewer_dims": (lambda: Z(2, 3).expand(3), lambda: T(2, 3).expand(3), RuntimeError),
    "broadcast": (lambda: Z(2, 3) + Z(2, 4), lambda: T(2, 3) + T(2, 4), RuntimeError),
    "where": (
        lambda: (Z(2, 3) > 1).where(Z(2, 3), Z(4)),
        lambda: torch.where(T(2, 3) > 1, T(2, 3), T(4)),
        RuntimeError,
    ),
    "masked_fill": (lambda: Z(3).masked_fill(Z(4) > 1, 0), lambda: T(3).masked_fill(T(4) > 1, 0), RuntimeError),
    "lerp": (lambda: Z(3).lerp(Z(4), 0.5), lambda: T(3).lerp(T(4), 0.5), RuntimeError),
    "pad_odd_length": (lambda: Z(2, 3).pad((1,)), lambda: F.pad(T(2, 3), (1,)), RuntimeError),
    "pad_reflect_too_large": (
        lambda: Z(1, 2, 3).pad((3, 3), mode="reflect"),
        lambda: F.pad(T(1, 2, 3), (3, 3), mode="reflect"),
        RuntimeError,
    ),
    "conv_channels": (
        lambda: Z(1, 3, 5, 5).conv2d(Z(2, 4, 3, 3)),
        lambda: F.conv2d(T(1, 3, 5, 5), T(2, 4, 3, 3)),
        RuntimeError,
    ),
    "split_sizes": (lambda: Z(5).split([2, 2]), lambda: T(5).split([2, 2]), RuntimeError),
    "unfold_too_large": (lambda: Z(3).unfold(0, 4, 1), lambda: T(3).unfold(0, 4, 1), RuntimeError),
    "unfold_step_0": (lambda: Z(3).unfold(0, 1, 0), lambda: T(3).unfold(0, 1, 0), RuntimeError),
    "diagonal_same_dims": (lambda: Z(3, 3).diagonal(0, 1, 1), lambda: T(3, 3).diagonal(0, 1, 1), RuntimeError),
    "tril_1d": (lambda: Z(3).tril(), lambda: T(3).tril(), RuntimeError),
    "repeat_too_few": (lambda: Z(2, 3).repeat(2), lambda: T(2, 3).repeat(2), RuntimeError),
    "gather_ndim": (
        lambda: Z(2, 3).gather(1, Z(3, dtype=I64)),
        lambda: T(2, 3).gather(1, T(3, dtype=I64)),
        RuntimeError,
    ),
    "einsum_sizes": (
        lambda: Tensor.einsum("ij,jk->ik", Z(2, 3), Z(4, 5)),
        lambda: torch.einsum("ij,jk->ik", T(2, 3), T(4, 5)),
        RuntimeError,
    ),
    "item_of_many": (lambda: Z(3).item(), lambda: T(3).item(), RuntimeError),
    "bool_of_many": (lambda: bool(Z(3)), lambda: bool(T(3)), RuntimeError),
    "assign_shape": (lambda: Z(3).contiguous().realize().assign(Z(4)), lambda: T(3).copy_(T(4)), RuntimeError),
    "setitem_shape": (
        lambda: Z(3).contiguous().realize().__setitem__(slice(0, 2), Z(3)),
        lambda: T(3).__setitem__(slice(0, 2), T(3)),
        RuntimeError,
    ),
    "max_of_empty": (lambda: Z(0).max(), lambda: T(0).max(), RuntimeError),
    "min_of_empty": (lambda: Z(0, 3).min(), lambda: T(0, 3).min(), RuntimeError),
    # invalid mode strings and option combinations
    "pad_mode": (
        lambda: Z(1, 2, 3).pad((1, 1), mode="bogus"),
        lambda: F.pad(T(1, 2, 3), (1, 1), mode="bogus"),
        RuntimeError,
    ),
    "interpolate_mode": (
        lambda: Z(1, 1, 2, 2).interpolate((4, 4), mode="bogus"),
        lambda: F.interpolate(T(1, 1, 2, 2), (4, 4), mode="bogus"),
        RuntimeError,
    ),
    "scatter_reduce_mode": (
        lambda: Z(3).scatter_reduce(0, Z(2, dtype=I64), Z(2), "bogus"),
        lambda: T(3).scatter_reduce(0, T(2, dtype=I64), T(2), "bogus"),
        RuntimeError,
    ),
    "clip_none_none": (lambda: Z(3).clip(None, None), lambda: T(3).clip(None, None), RuntimeError),
    "clamp_no_bounds": (lambda: Z(3).clamp(), lambda: T(3).clamp(), RuntimeError),
    "attn_mask_and_is_causal": (
        lambda: Z(1, 2, 4).scaled_dot_product_attention(Z(1, 2, 4), Z(1, 2, 4), attn_mask=Z(2, 2) > 1, is_causal=True),
        lambda: F.scaled_dot_product_attention(
            T(1, 2, 4), T(1, 2, 4), T(1, 2, 4), attn_mask=T(2, 2) > 1, is_causal=True
        ),
        RuntimeError,
    ),
    "chunk_0": (lambda: Z(4).chunk(0), lambda: T(4).chunk(0), RuntimeError),
    "multinomial_too_many": (
        lambda: Z(3).multinomial(5, replacement=False),
        lambda: T(3).multinomial(5, replacement=False),
        RuntimeError,
    ),
    "arange_step_0": (lambda: Tensor.arange(0, 5, 0), lambda: torch.arange(0, 5, 0), RuntimeError),
    "full_negative_size": (lambda: Tensor.full((-1, 2), 1.0), lambda: torch.full((-1, 2), 1.0), RuntimeError),
    "randn_negative_size": (lambda: Tensor.randn(-1), lambda: torch.randn(-1), RuntimeError),
    # bitwise ops on floats (torch: NotImplementedError, a RuntimeError; ~float: a TypeError)
    "and_float": (lambda: Z(3) & Z(3), lambda: T(3) & T(3), RuntimeError),
    "or_float": (lambda: Z(3) | Z(3), lambda: T(3) | T(3), RuntimeError),
    "xor_float": (lambda: Z(3) ^ Z(3), lambda: T(3) ^ T(3), RuntimeError),
    "lshift_float": (lambda: Z(3) << 1, lambda: T(3) << 1, RuntimeError),
    "rshift_float": (lambda: Z(3) >> 1, lambda: T(3) >> 1, RuntimeError),
    "invert_float": (lambda: ~Z(3), lambda: ~T(3), TypeError),
    # the validation gaps: each was silently accepted (a typo became a wrong answer)
    "cumsum_0d_axis_1": (lambda: Tensor(3.0).cumsum(1), lambda: torch.tensor(3.0).cumsum(1), IndexError),
    "cumprod_0d_axis_1": (lambda: Tensor(3.0).cumprod(1), lambda: torch.tensor(3.0).cumprod(1), IndexError),
    "flip_repeated_dim": (lambda: Z(2, 2).flip((0, 0)), lambda: T(2, 2).flip((0, 0)), RuntimeError),
    "flip_same_dim_twice": (lambda: Z(2, 2).flip((1, -1)), lambda: T(2, 2).flip((1, -1)), RuntimeError),
    "roll_more_shifts": (lambda: Z(2, 2).roll((1, 2), (0,)), lambda: T(2, 2).roll((1, 2), (0,)), RuntimeError),
    "roll_more_dims": (lambda: Z(2, 2).roll((1,), (0, 1)), lambda: T(2, 2).roll((1,), (0, 1)), RuntimeError),
    "roll_shifts_without_dims": (lambda: Z(2, 2).roll((1, 1)), lambda: T(2, 2).roll((1, 1)), RuntimeError),
    "stack_third_positional": (
        lambda: Tensor.stack((Z(2), Z(2)), Z(2)),
        lambda: torch.stack((T(2), T(2)), T(2)),
        TypeError,
    ),
    "cat_empty_list": (lambda: Tensor.cat([]), lambda: torch.cat([]), ValueError),
    "cat_int_among_tensors": (lambda: Tensor.stack([Z(2), 3]), lambda: torch.stack([T(2), 3]), TypeError),
    "cat_third_positional": (lambda: Tensor.cat([Z(2), Z(2)], Z(2)), lambda: torch.cat([T(2), T(2)], T(2)), TypeError),
    "linspace_bool": (
        lambda: Tensor.linspace(0, 1, 5, dtype="bool"),
        lambda: torch.linspace(0, 1, 5, dtype=torch.bool),
        RuntimeError,
    ),
    "cross_entropy_float_target_32x1": (
        lambda: Tensor.randn(32, 10).cross_entropy(Tensor.rand(32, 1)),
        lambda: F.cross_entropy(torch.randn(32, 10), torch.rand(32, 1)),
        RuntimeError,
    ),
    "cross_entropy_index_shape": (
        lambda: Tensor.randn(4, 10).cross_entropy(Tensor([1, 2, 3])),
        lambda: F.cross_entropy(torch.randn(4, 10), torch.tensor([1, 2, 3])),
        (ValueError, RuntimeError),
    ),
    "mask_shorter_than_dim": (
        lambda: Z(10)[Tensor([True, False])],
        lambda: T(10)[torch.tensor([True, False])],
        IndexError,
    ),
    "mask_of_another_dim": (
        lambda: Z(2, 3)[Tensor([True, False, True])],
        lambda: T(2, 3)[torch.tensor([True, False, True])],
        IndexError,
    ),
    "mask_after_ellipsis": (
        lambda: Z(2, 3, 4)[..., Tensor([True, False, True])],
        lambda: T(2, 3, 4)[..., torch.tensor([True, False, True])],
        IndexError,
    ),
    "scatter_float_into_half": (
        lambda: Z(3).cast(dtypes.half).scatter(0, Z(2, dtype=I64), Z(2)),
        lambda: T(3).half().scatter(0, T(2, dtype=I64), T(2)),
        RuntimeError,
    ),
    "scatter_reduce_float_into_half": (
        lambda: Z(3).cast(dtypes.half).scatter_reduce(0, Z(2, dtype=I64), Z(2), "sum"),
        lambda: T(3).half().scatter_reduce(0, T(2, dtype=I64), T(2), "sum"),
        RuntimeError,
    ),
    "scatter_int_into_float": (
        lambda: Z(3).scatter(0, Z(2, dtype=I64), Z(2, dtype=I64)),
        lambda: T(3).scatter(0, T(2, dtype=I64), T(2, dtype=I64)),
        RuntimeError,
    ),
    # argument types and values the internals used to trip over (a TypeError from `tuple(1.5)`, a CompileError)
    "expand_negative": (lambda: Z(1).expand(-2), lambda: T(1).expand(-2), RuntimeError),
    "repeat_negative": (lambda: Z(2, 3).repeat(-1, 1), lambda: T(2, 3).repeat(-1, 1), RuntimeError),
    "repeat_interleave_negative": (
        lambda: Z(3).repeat_interleave(-1),
        lambda: T(3).repeat_interleave(-1),
        RuntimeError,
    ),
    "flatten_start_after_end": (lambda: Z(2, 3).flatten(1, 0), lambda: T(2, 3).flatten(1, 0), RuntimeError),
    "split_negative_size": (lambda: Z(3).split([4, -1]), lambda: T(3).split([4, -1]), RuntimeError),
    "linspace_float_steps": (lambda: Tensor.linspace(0, 1, 2.5), lambda: torch.linspace(0, 1, 2.5), TypeError),
    "pad_str": (lambda: Z(3).pad("x"), lambda: F.pad(T(3), "x"), TypeError),
    "slice_step_0": (lambda: Z(2, 3)[::0], lambda: T(2, 3)[::0], ValueError),
    "slice_float": (lambda: Z(2, 3)[0.5:2], lambda: T(2, 3)[0.5:2], TypeError),
    "split_float": (lambda: Z(2, 3).split(1.5), lambda: T(2, 3).split(1.5), TypeError),
    "chunk_float": (lambda: Z(2, 3).chunk(1.5), lambda: T(2, 3).chunk(1.5), TypeError),
    "roll_float": (lambda: Z(2, 3).roll(1.5, 0), lambda: T(2, 3).roll(1.5, 0), TypeError),
    "sum_float_axis": (lambda: Z(2, 3).sum(0.5), lambda: T(2, 3).sum(0.5), TypeError),
    "transpose_str_dim": (lambda: Z(2, 3).transpose(0, "1"), lambda: T(2, 3).transpose(0, "1"), TypeError),
    "unfold_float_size": (lambda: Z(2, 3).unfold(0, 1.5, 1), lambda: T(2, 3).unfold(0, 1.5, 1), TypeError),
}


@pytest.mark.parametrize("name", list(CASES))
def test_rejects_what_torch_rejects(name):
    zg_call, torch_call, error = CASES[name]
    with pytest.raises(error):
        torch_call()
    with pytest.raises(error) as info:
        _run(zg_call)
    assert_raised_at_the_tensor_layer(info.value)
    assert str(info.value), "the message must say what was wrong"


def test_every_torch_runtime_error_case_is_a_runtime_error_here():
    """The table's point for torch-written code: `except RuntimeError` catches each case torch raises it for."""
    runtime = [n for n, (_, _, e) in CASES.items() if e is RuntimeError]
    assert len(runtime) >= 40
    for name in runtime:
        try:
            _run(CASES[name][0])
        except RuntimeError:
            continue
        pytest.fail(f"{name}: no RuntimeError")


@pytest.mark.parametrize(
    "call, value",
    [
        (lambda: Z(2, 2).flip((1, -1)), r"dim 1 appears multiple times"),
        (lambda: Z(2, 2).roll((1, 2), (0,)), r"shifts \(1, 2\) and dims \(0,\)"),
        (lambda: Tensor.stack((Z(2), Z(2)), Z(2)), r"got Tensor"),
        (lambda: Tensor.randn(32, 10).cross_entropy(Tensor.rand(32, 1)), r"\(32, 10\).*\(32, 1\)"),
        (lambda: Z(10)[Tensor([True, False])], r"mask \[2\] at index 0 .* tensor \[10\] at index 0"),
        (lambda: Z(3).cast(dtypes.half).scatter(0, Z(2, dtype=I64), Z(2)), r"dtypes.half .* dtypes.float"),
        (lambda: Tensor.linspace(0, 1, 5, dtype="bool"), r"bool"),
        (lambda: Z(3).scatter_reduce(0, Z(2, dtype=I64), Z(2), "bogus"), r"'bogus'"),
    ],
)
def test_messages_name_the_offending_value(call, value):
    with pytest.raises((RuntimeError, IndexError), match=value):  # the types are the table's business
        _run(call)


def test_positional_dim_after_a_sequence_works_as_torch():
    a, b = np.arange(6.0).reshape(2, 3), -np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(
        Tensor.stack([Tensor(a), Tensor(b)], 1).numpy(), torch.stack([torch.tensor(a), torch.tensor(b)], 1).numpy()
    )
    np.testing.assert_array_equal(Tensor.cat((Tensor(a), Tensor(b)), 1).numpy(), np.concatenate([a, b], 1))


def test_matching_dtypes_and_scalar_sources_still_scatter():
    idx = np.array([2, 0])
    got = Tensor.zeros(3, dtype=dtypes.half).scatter(0, Tensor(idx), Tensor([1.0, 2.0], dtype=dtypes.half)).numpy()
    want = torch.zeros(3, dtype=torch.half).scatter(0, torch.tensor(idx), torch.tensor([1.0, 2.0], dtype=torch.half))
    np.testing.assert_array_equal(got, want.numpy())
    got = Tensor.zeros(3, dtype=dtypes.half).scatter(0, Tensor(idx), 2.5).numpy()  # a Python scalar takes self's dtype
    np.testing.assert_array_equal(got, torch.zeros(3, dtype=torch.half).scatter(0, torch.tensor(idx), 2.5).numpy())


def test_cross_entropy_targets_torch_accepts_still_work():
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    probs = np.random.default_rng(1).random((4, 5)).astype(np.float32)
    labels = np.array([0, 4, 2, 1])
    for y, ty in [(Tensor(probs), torch.tensor(probs)), (Tensor(labels), torch.tensor(labels))]:
        want = F.cross_entropy(torch.tensor(x), ty).item()
        assert Tensor(x).cross_entropy(y).item() == pytest.approx(want, rel=1e-5)
    want = F.cross_entropy(torch.tensor(x[0]), torch.tensor(labels[0])).item()  # one unbatched sample
    assert Tensor(x[0]).cross_entropy(Tensor(labels[0])).item() == pytest.approx(want, rel=1e-5)
