"""zeptograd.nn.state: state dicts, load_state_dict's errors, safetensors both ways against the `safetensors`
package (every dtype, bfloat16 included), torch_load of torch.save files."""

import json
import struct

import numpy as np
import pytest
import torch

from zeptograd import Tensor, dtypes, nn
from zeptograd.nn.state import (
    get_parameters,
    get_state_dict,
    load_state_dict,
    safe_load,
    safe_load_metadata,
    safe_save,
    torch_load,
)

safetensors = pytest.importorskip("safetensors")
from safetensors.numpy import load_file as st_load_np  # noqa: E402
from safetensors.numpy import save_file as st_save_np  # noqa: E402
from safetensors.torch import load_file as st_load_torch  # noqa: E402
from safetensors.torch import save_file as st_save_torch  # noqa: E402

NP_DTYPES = {
    "bool": np.bool_,
    "uint8": np.uint8,
    "int8": np.int8,
    "uint16": np.uint16,
    "int16": np.int16,
    "uint32": np.uint32,
    "int32": np.int32,
    "uint64": np.uint64,
    "int64": np.int64,
    "float16": np.float16,
    "float32": np.float32,
    "float64": np.float64,
}


def sample(name: str, shape=(3, 4), seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = NP_DTYPES[name]
    if dt is np.bool_:
        return rng.random(shape) > 0.5
    if np.issubdtype(dt, np.integer):
        info = np.iinfo(dt)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), shape, endpoint=True).astype(dt)
    return rng.standard_normal(shape).astype(dt)


class Net:
    def __init__(self):
        self.conv = nn.Conv2d(1, 2, 3)
        self.bn = nn.BatchNorm2d(2)
        self.layers = [nn.Linear(4, 3), nn.Linear(3, 2, bias=False)]
        self.extra = {"emb": nn.Embedding(5, 2)}


def test_state_dict_names_and_parameters():
    net = Net()
    sd = get_state_dict(net)
    assert set(sd) == {
        "conv.weight",
        "conv.bias",
        "bn.weight",
        "bn.bias",
        "bn.running_mean",
        "bn.running_var",
        "bn.num_batches_tracked",
        "layers.0.weight",
        "layers.0.bias",
        "layers.1.weight",
        "extra.emb.weight",
    }
    net.tied = net.layers[0].weight  # a tied tensor appears twice by name, once as a parameter
    assert len(get_parameters(net)) == len(sd)


@pytest.mark.slow
def test_load_state_dict_roundtrip_and_errors():
    a, b = Net(), Net()
    load_state_dict(b, {k: v.numpy() for k, v in get_state_dict(a).items()})
    for k, v in get_state_dict(b).items():
        np.testing.assert_array_equal(v.numpy(), get_state_dict(a)[k].numpy(), err_msg=k)
    sd = {k: v.numpy() for k, v in get_state_dict(a).items()}
    missing = {k: v for k, v in sd.items() if k != "conv.bias"}
    with pytest.raises(KeyError, match="missing key.*conv.bias"):
        load_state_dict(b, missing)
    with pytest.raises(KeyError, match="unexpected key.*head.weight"):
        load_state_dict(b, {**sd, "head.weight": np.zeros(2, np.float32)})
    with pytest.raises(
        ValueError,
        match=r"shape mismatch for layers.0.weight: the model has \(3, 4\), the state_dict "
        r"\(4, 3\)",
    ):
        load_state_dict(b, {**sd, "layers.0.weight": np.zeros((4, 3), np.float32)})
    partial = {"conv.bias": np.array([5.0, 6.0], np.float32), "junk": np.zeros(1)}
    load_state_dict(b, partial, strict=False, consume=True)
    np.testing.assert_array_equal(b.conv.bias.numpy(), [5.0, 6.0])
    assert list(partial) == ["junk"]


def test_load_state_dict_updates_what_an_optimizer_holds():
    lin = nn.Linear(2, 1)
    opt = nn.optim.SGD(get_parameters(lin), lr=1.0)
    load_state_dict(lin, {"weight": np.array([[1.0, 2.0]], np.float32), "bias": np.array([0.5], np.float32)})
    with Tensor.train():
        opt.zero_grad()
        lin(Tensor([[1.0, 1.0]])).sum().backward()
        opt.step()
    np.testing.assert_allclose(lin.weight.numpy(), [[0.0, 1.0]])
    np.testing.assert_allclose(lin.bias.numpy(), [-0.5])


@pytest.mark.parametrize("name", list(NP_DTYPES))
def test_safetensors_both_ways(name, tmp_path):
    arr = sample(name)
    mine, theirs = tmp_path / "mine.safetensors", tmp_path / "theirs.safetensors"
    safe_save({"x": Tensor(arr), "scalar": Tensor(np.array(arr[0, 0]))}, mine)
    loaded = st_load_np(str(mine))
    np.testing.assert_array_equal(loaded["x"], arr)
    assert loaded["x"].dtype == arr.dtype and loaded["scalar"].shape == ()
    st_save_np({"y": np.ascontiguousarray(arr.T)}, str(theirs))
    t = safe_load(theirs)["y"]
    assert t.dtype == getattr(dtypes, name) and t.shape == (4, 3)
    np.testing.assert_array_equal(t.numpy(), arr.T)


def test_safetensors_bfloat16_both_ways(tmp_path):
    x = torch.randn(5, 3).to(torch.bfloat16)
    st_save_torch({"w": x}, str(tmp_path / "t.safetensors"))
    t = safe_load(tmp_path / "t.safetensors")["w"]
    assert t.dtype == dtypes.bfloat16
    np.testing.assert_array_equal(t.numpy(), x.float().numpy())
    safe_save({"w": t, "w32": t.float()}, tmp_path / "z.safetensors")
    back = st_load_torch(str(tmp_path / "z.safetensors"))
    assert back["w"].dtype == torch.bfloat16 and torch.equal(back["w"], x)
    assert torch.equal(back["w32"], x.float())


def test_safetensors_metadata_layout_and_errors(tmp_path):
    fn = tmp_path / "m.safetensors"
    safe_save({"b": Tensor([1, 2, 3], dtype=dtypes.int16), "a": Tensor([1.5])}, fn, metadata={"format": "np"})
    raw = fn.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    assert n % 8 == 0
    header = json.loads(raw[8 : 8 + n])
    assert header["__metadata__"] == {"format": "np"}
    assert header["a"] == {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
    assert header["b"]["data_offsets"] == [4, 10]
    assert safe_load_metadata(fn) == {"format": "np"}
    with safetensors.safe_open(str(fn), "np") as f:
        assert f.metadata() == {"format": "np"}
    assert safe_load(raw)["b"].tolist() == [1, 2, 3]  # the file's bytes work too
    with pytest.raises(ValueError, match="not a safetensors file"):
        safe_load(b"\x10\x00\x00\x00\x00\x00\x00\x00{bad")
    bad = json.dumps({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()
    with pytest.raises(ValueError, match="needs 16 bytes"):
        safe_load(struct.pack("<Q", len(bad)) + bad + bytes(8))


@pytest.mark.slow
def test_model_roundtrip_through_safetensors(tmp_path):
    a, b = Net(), Net()
    safe_save(get_state_dict(a), tmp_path / "net.safetensors")
    load_state_dict(b, safe_load(tmp_path / "net.safetensors"))
    x = Tensor(np.random.default_rng(0).standard_normal((2, 1, 4, 4)).astype(np.float32))
    np.testing.assert_array_equal(a.bn(a.conv(x)).numpy(), b.bn(b.conv(x)).numpy())


def test_torch_load_state_dict(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2), torch.nn.Linear(3, 4))
    sd = model.state_dict()
    sd["half"] = torch.randn(2, 3).half()
    sd["bf16"] = torch.randn(3).to(torch.bfloat16)
    big = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    sd["view_t"], sd["view_row"] = big.t(), big[1]  # views sharing one storage, one non-contiguous
    sd["flag"] = torch.tensor([True, False])
    torch.save(sd, tmp_path / "m.pt")
    loaded = torch_load(tmp_path / "m.pt")
    assert set(loaded) == set(sd)
    for k, v in sd.items():
        ref = v.float().numpy() if v.dtype == torch.bfloat16 else v.numpy()
        assert loaded[k].shape == tuple(v.shape), k
        np.testing.assert_array_equal(loaded[k].numpy(), ref, err_msg=k)
    assert loaded["bf16"].dtype == dtypes.bfloat16 and loaded["1.num_batches_tracked"].dtype == dtypes.int64


def test_torch_load_into_zeptograd_model(tmp_path):
    t = torch.nn.Linear(3, 2)
    torch.save(t.state_dict(), tmp_path / "lin.pt")
    z = nn.Linear(3, 2)
    load_state_dict(z, torch_load(tmp_path / "lin.pt"))
    x = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_allclose(z(Tensor(x)).numpy(), t(torch.tensor(x)).detach().numpy(), rtol=1e-6)


def test_torch_load_rejects_arbitrary_pickles(tmp_path):
    torch.save({"w": torch.zeros(2), "obj": torch.nn.Linear(1, 1)}, tmp_path / "bad.pt")
    with pytest.raises(Exception, match="not part of a plain state_dict"):
        torch_load(tmp_path / "bad.pt")


def test_models_loaded_from_one_state_dict_do_not_share_memory():
    sd = {"weight": np.ones(3, np.float32), "bias": np.zeros(3, np.float32)}
    tensors = {k: Tensor(v) for k, v in sd.items()}
    a, b = nn.LayerNorm(3), nn.LayerNorm(3)  # weights still lazy constants
    load_state_dict(a, tensors)
    load_state_dict(b, tensors)
    a.weight.assign(a.weight * 5).realize()
    np.testing.assert_array_equal(b.weight.numpy(), [1, 1, 1])
    np.testing.assert_array_equal(tensors["weight"].numpy(), [1, 1, 1])


def test_torch_load_legacy_format(tmp_path):
    sd = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "n": torch.tensor(7)}
    torch.save(sd, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    loaded = torch_load(tmp_path / "old.pt")
    np.testing.assert_array_equal(loaded["w"].numpy(), sd["w"].numpy())
    assert loaded["n"].item() == 7 and loaded["n"].shape == ()
