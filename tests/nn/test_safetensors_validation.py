"""safe_load on malformed safetensors files: each file is accepted or rejected as the `safetensors` package (the
reference implementation) decides, equal values where both accept it, and a SafetensorError naming the tensor and
the field where rejected; BOOL bytes other than 0/1 are normalized; safe_save refuses reserved and non-str names."""

import json
import struct

import numpy as np
import pytest

from zeptograd import Tensor, dtypes
from zeptograd.helpers import ArgumentError
from zeptograd.nn.state import SafetensorError, safe_load, safe_load_metadata, safe_save

safetensors = pytest.importorskip("safetensors")
from safetensors.numpy import load as st_load_bytes  # noqa: E402


def st_file(header=None, data=b"", raw_header: bytes | None = None) -> bytes:
    h = raw_header if raw_header is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def f32(shape, offsets):
    return {"dtype": "F32", "shape": shape, "data_offsets": offsets}


Z8 = b"\0" * 8
# name: (file bytes, the tensor and the field our error names, or None where the file is valid)
CASES = {
    "valid": (st_file({"a": f32([2], [0, 8])}, Z8), None),
    "valid_two_and_empty": (
        st_file({"a": f32([2], [0, 8]), "b": f32([0], [8, 8]), "c": f32([1, 1], [8, 12])}, Z8 + b"\0" * 4),
        None,
    ),
    "valid_extra_field": (st_file({"a": {**f32([2], [0, 8]), "x": 1}}, Z8), None),
    "valid_null_metadata": (st_file({"__metadata__": None, "a": f32([2], [0, 8])}, Z8), None),
    "valid_spaces": (st_file(raw_header=b' {"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}  ', data=b"\7"), None),
    "valid_empty": (st_file({}), None),
    "negative_shape": (st_file({"a": f32([-1], [0, 0])}), ("'a'", "shape")),
    "negative_shape_pair": (st_file({"a": f32([-2, -2], [0, 16])}, Z8 * 2), ("'a'", "shape")),
    "float_shape": (st_file({"a": f32([2.0], [0, 8])}, Z8), ("'a'", "shape")),
    "bool_shape": (st_file({"a": {"dtype": "U8", "shape": [True], "data_offsets": [0, 1]}}, b"\0"), ("'a'", "shape")),
    "string_shape": (st_file({"a": f32("2", [0, 8])}, Z8), ("'a'", "shape")),
    "huge_shape": (st_file({"a": f32([2**70], [0, 0])}), ("'a'", "shape")),
    "overflowing_shape": (st_file({"a": f32([2**32, 2**32], [0, 0])}), ("'a'", "shape")),
    "overflowing_bytes": (st_file({"a": f32([2**62], [0, 0])}), ("'a'", "shape")),
    "overlap": (st_file({"a": f32([2], [0, 8]), "b": f32([1], [4, 8])}, Z8), ("'b'", "data_offsets")),
    "overlap_empty": (st_file({"a": f32([2], [0, 8]), "b": f32([0], [4, 4])}, Z8), ("'b'", "data_offsets")),
    "same_offsets": (st_file({"a": f32([2], [0, 8]), "b": f32([2], [0, 8])}, Z8), ("data_offsets",)),
    "duplicate_name": (
        st_file(
            raw_header=b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
            b'"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}',
            data=b"\0\1",
        ),
        ("'a'", "data_offsets"),
    ),
    "gap": (st_file({"a": f32([1], [4, 8])}, Z8), ("'a'", "data_offsets")),
    "reversed_offsets": (st_file({"a": f32([0], [8, 0])}, Z8), ("'a'", "data_offsets")),
    "trailing_bytes": (st_file({"a": f32([1], [0, 4])}, Z8), ("data section",)),
    "truncated": (st_file({"a": f32([4], [0, 16])}, Z8), ("data section",)),
    "size_mismatch": (st_file({"a": f32([3], [0, 8])}, Z8), ("'a'", "data_offsets")),
    "missing_shape": (st_file({"a": {"dtype": "F32", "data_offsets": [0, 8]}}, Z8), ("'a'", "shape")),
    "missing_dtype": (st_file({"a": {"shape": [2], "data_offsets": [0, 8]}}, Z8), ("'a'", "dtype")),
    "missing_offsets": (st_file({"a": {"dtype": "F32", "shape": [2]}}, Z8), ("'a'", "data_offsets")),
    "list_entry": (st_file({"a": [1, 2]}), ("'a'",)),
    "string_entry": (st_file({"a": "x"}), ("'a'",)),
    "three_offsets": (st_file({"a": f32([2], [0, 8, 8])}, Z8), ("'a'", "data_offsets")),
    "float_offsets": (st_file({"a": f32([2], [0, 8.0])}, Z8), ("'a'", "data_offsets")),
    "string_offsets": (st_file({"a": f32([2], "0,8")}, Z8), ("'a'", "data_offsets")),
    "negative_offsets": (st_file({"a": f32([0], [-1, -1])}), ("'a'", "data_offsets")),
    "unknown_dtype": (st_file({"a": {"dtype": "X9", "shape": [1], "data_offsets": [0, 1]}}, b"\0"), ("'a'", "dtype")),
    "int_dtype": (st_file({"a": {"dtype": 3, "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4), ("'a'", "dtype")),
    "metadata_int_value": (st_file({"__metadata__": {"k": 1}}), ("__metadata__",)),
    "metadata_list": (st_file({"__metadata__": [1]}), ("__metadata__",)),
    "header_not_object": (st_file(raw_header=b"[1]"), ("JSON object",)),
    "header_not_json": (st_file(raw_header=b"{nope"), ("not JSON",)),
    "header_past_end": (struct.pack("<Q", 1000) + b"{}", ("header length",)),
    "header_too_large": (struct.pack("<Q", 100_000_001) + b"{}", ("header length",)),
    "too_short": (b"\0\0", ("8-byte",)),
}


@pytest.mark.parametrize("name", CASES)
def test_accepts_and_rejects_as_the_reference(name):
    data, names = CASES[name]
    try:
        ref = st_load_bytes(data)
    except Exception:
        ref = None
    assert (ref is not None) == (names is None), f"the case's expectation disagrees with safetensors: {ref}"
    if ref is None:
        with pytest.raises(SafetensorError) as e:
            safe_load(data)
        for part in names:
            assert part in str(e.value), str(e.value)
        assert isinstance(e.value, ArgumentError) and isinstance(e.value, RuntimeError)
    else:
        ours = safe_load(data)
        assert ours.keys() == ref.keys()
        for k, v in ref.items():
            assert ours[k].shape == v.shape
            np.testing.assert_array_equal(ours[k].numpy(), v)


def test_errors_name_the_file(tmp_path):
    (tmp_path / "bad.safetensors").write_bytes(CASES["negative_shape"][0])
    with pytest.raises(SafetensorError, match="bad.safetensors"):
        safe_load(tmp_path / "bad.safetensors")
    (tmp_path / "meta.safetensors").write_bytes(CASES["metadata_list"][0])
    with pytest.raises(SafetensorError, match="__metadata__"):
        safe_load_metadata(tmp_path / "meta.safetensors")


def test_bool_bytes_other_than_0_1_are_normalized():
    data = st_file({"a": {"dtype": "BOOL", "shape": [4], "data_offsets": [0, 4]}}, b"\x02\x01\x00\xff")
    t = safe_load(data)["a"]
    assert t.dtype == dtypes.bool
    want = np.array([True, True, False, True])
    np.testing.assert_array_equal(t.numpy(), want)
    np.testing.assert_array_equal(t.logical_not().numpy(), ~want)
    np.testing.assert_array_equal((t == Tensor(want)).numpy(), [True] * 4)
    np.testing.assert_array_equal(t.cast(dtypes.int32).numpy(), want.astype(np.int32))
    assert t.sum().item() == 3
    np.testing.assert_array_equal(st_load_bytes(data)["a"], want)


def test_safe_save_refuses_reserved_and_non_str_names(tmp_path):
    t = Tensor([1.0, 2.0])
    with pytest.raises(SafetensorError, match="__metadata__"):
        safe_save({"__metadata__": t, "w": t}, tmp_path / "x.safetensors")
    assert not (tmp_path / "x.safetensors").exists()
    with pytest.raises(TypeError, match="strings"):
        safe_save({1: t}, tmp_path / "x.safetensors")  # type: ignore[dict-item]
    safe_save({"w": t}, tmp_path / "x.safetensors", metadata={"format": "pt"})
    np.testing.assert_array_equal(safe_load(tmp_path / "x.safetensors")["w"].numpy(), [1.0, 2.0])
