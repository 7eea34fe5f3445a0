"""torch_load on hostile files: every pickle of both formats goes through the restricted unpickler (a pickle that
would run code is refused, naming the global, before it runs), and every tensor view is checked against its
storage for every stride sign (crashing cases run in a child process)."""

import io
import os
import pickle
import pickletools
import struct
import subprocess
import sys
import textwrap
import zipfile
from collections import OrderedDict

import numpy as np
import pytest
import torch
import torch._utils

from zeptograd.helpers import ArgumentError
from zeptograd.nn.state import CheckpointError, torch_load


class _RunsShell:
    """Pickles as os.system(cmd): what a malicious checkpoint holds."""

    def __init__(self, cmd: str):
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


def evil_pickle(marker) -> bytes:
    return pickle.dumps(_RunsShell(f"touch {marker}"), protocol=2)


def split_pickles(data: bytes, count: int) -> tuple[list[bytes], bytes]:
    """The first `count` pickles of a stream, and the bytes after them."""
    bio, parts = io.BytesIO(data), []
    for _ in range(count):
        start = bio.tell()
        for _op in pickletools.genops(bio):
            pass
        parts.append(data[start : bio.tell()])
    return parts, data[bio.tell() :]


LEGACY_POSITIONS = ["magic number", "protocol version", "sys_info", "state_dict", "storage keys"]


@pytest.mark.parametrize("position", range(len(LEGACY_POSITIONS)))
def test_legacy_format_every_pickle_is_restricted(tmp_path, position):
    torch.save({"w": torch.arange(4.0)}, tmp_path / "ok.pt", _use_new_zipfile_serialization=False)
    parts, rest = split_pickles((tmp_path / "ok.pt").read_bytes(), 5)
    marker = tmp_path / "pwned"
    parts[position] = evil_pickle(marker)
    (tmp_path / "bad.pt").write_bytes(b"".join(parts) + rest)
    with pytest.raises(CheckpointError, match=r"posix\.system") as e:
        torch_load(tmp_path / "bad.pt")
    assert not marker.exists()
    assert LEGACY_POSITIONS[position] in str(e.value)
    assert isinstance(e.value, (ArgumentError, pickle.UnpicklingError))
    # the unmodified file loads
    np.testing.assert_array_equal(torch_load(tmp_path / "ok.pt")["w"].numpy(), [0, 1, 2, 3])


def test_zip_format_data_pickle_is_restricted(tmp_path):
    torch.save({"w": torch.arange(4.0)}, tmp_path / "ok.pt")
    marker = tmp_path / "pwned"
    with zipfile.ZipFile(tmp_path / "ok.pt") as src, zipfile.ZipFile(tmp_path / "bad.pt", "w") as dst:
        for n in src.namelist():
            dst.writestr(n, evil_pickle(marker) if n.endswith("data.pkl") else src.read(n))
    with pytest.raises(CheckpointError, match=r"posix\.system"):
        torch_load(tmp_path / "bad.pt")
    assert not marker.exists()


def test_other_globals_are_named(tmp_path):
    for obj, name in [(torch.nn.Linear(1, 1), "torch.nn.modules.linear.Linear"), (np.zeros(2), "numpy")]:
        torch.save({"w": torch.zeros(2), "obj": obj}, tmp_path / "bad.pt")
        with pytest.raises(CheckpointError, match=name):
            torch_load(tmp_path / "bad.pt")


def test_truncated_and_garbled_files(tmp_path):
    torch.save({"w": torch.arange(4.0)}, tmp_path / "ok.pt", _use_new_zipfile_serialization=False)
    data = (tmp_path / "ok.pt").read_bytes()
    for cut in (len(data) - 3, len(data) - 20, 200, 30):
        (tmp_path / "cut.pt").write_bytes(data[:cut])
        with pytest.raises(CheckpointError):
            torch_load(tmp_path / "cut.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="neither a zip nor"):
        torch_load(tmp_path / "junk.pt")


# ***** tensor views outside their storage *****


class _StorageRef:
    def __init__(self, numel: int):
        self.numel = numel


class _View:
    """Pickles as torch's _rebuild_tensor_v2(storage, offset, size, stride, ...) with any size and stride."""

    def __init__(self, numel, offset, size, stride):
        self.args = (_StorageRef(numel), offset, tuple(size), tuple(stride), False, OrderedDict())

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2, self.args)


class _CheckpointPickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, _StorageRef):
            return ("storage", torch.FloatStorage, "0", "cpu", obj.numel)
        return None


def write_view_checkpoint(path, numel, offset, size, stride):
    """A zip torch.save file whose one tensor is the given view of a float32 storage of numel elements."""
    bio = io.BytesIO()
    _CheckpointPickler(bio, protocol=2).dump({"w": _View(numel, offset, size, stride)})
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", bio.getvalue())
        z.writestr("archive/data/0", np.arange(numel, dtype=np.float32).tobytes())
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")


def test_handmade_view_checkpoints_load_like_torch(tmp_path):
    # sanity of the helper: in-bounds views (also ones torch.load builds) give torch's values
    for numel, offset, size, stride in [(12, 0, (3, 4), (4, 1)), (12, 1, (2, 3), (1, 4)), (12, 11, (1,), (5,))]:
        write_view_checkpoint(tmp_path / "v.pt", numel, offset, size, stride)
        ref = torch.load(tmp_path / "v.pt", weights_only=True)["w"].numpy()
        np.testing.assert_array_equal(torch_load(tmp_path / "v.pt")["w"].numpy(), ref)


def test_view_in_bounds_with_negative_stride(tmp_path):
    # offset 5, stride -1 over 6 elements: 5, 4, ..., 0 (torch cannot save it; the bounds are the same)
    write_view_checkpoint(tmp_path / "v.pt", 6, 5, (6,), (-1,))
    np.testing.assert_array_equal(torch_load(tmp_path / "v.pt")["w"].numpy(), [5, 4, 3, 2, 1, 0])
    write_view_checkpoint(tmp_path / "v.pt", 12, 8, (3, 4), (-4, 1))
    np.testing.assert_array_equal(torch_load(tmp_path / "v.pt")["w"].numpy(), np.arange(12).reshape(3, 4)[::-1])


OUT_OF_BOUNDS = [
    (16, 0, (2,), (-100000000,)),  # far before the storage: a segfault without the check
    (16, 0, (4,), (-1,)),  # neighbouring heap bytes before the storage
    (16, 2, (2, 4), (8, -1)),  # mixed signs: 2 - 3 < 0
    (16, 0, (2, 3), (100, -1)),  # mixed signs: past the end
    (16, 0, (3,), (2**62,)),  # (3-1)*2**62 overflows int64 byte strides
    (16, 20, (1,), (1,)),  # offset past the end
    (16, 0, (17,), (1,)),  # one element past the end
    (16, 0, (2**50,), (0,)),  # in bounds (stride 0), but 4 PiB to copy
]


@pytest.mark.slow
@pytest.mark.parametrize("numel,offset,size,stride", OUT_OF_BOUNDS)
def test_views_outside_the_storage_are_refused_in_a_child(tmp_path, numel, offset, size, stride):
    write_view_checkpoint(tmp_path / "v.pt", numel, offset, size, stride)
    code = textwrap.dedent(f"""
        from zeptograd.nn.state import CheckpointError, torch_load
        try:
            torch_load({str(tmp_path / "v.pt")!r})["w"].numpy()
        except CheckpointError as e:
            print("REFUSED", e)
        else:
            print("LOADED")
    """)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.startswith("REFUSED") and ("storage '0'" in r.stdout or "memory" in r.stdout), r.stdout


@pytest.mark.parametrize(
    "offset,size,stride,what",
    [(-1, (2,), (1,), "offset"), (0, (-2, -2), (1, 1), "size"), (0, (2.0,), (1,), "size"), (0, (2,), (1, 1), "stride")],
)
def test_bad_view_fields(tmp_path, offset, size, stride, what):
    write_view_checkpoint(tmp_path / "v.pt", 16, offset, size, stride)
    with pytest.raises(CheckpointError, match=what):
        torch_load(tmp_path / "v.pt")


def test_storage_shorter_than_its_elements(tmp_path):
    write_view_checkpoint(tmp_path / "v.pt", 4, 0, (4,), (1,))
    with zipfile.ZipFile(tmp_path / "v.pt") as src, zipfile.ZipFile(tmp_path / "odd.pt", "w") as dst:
        for n in src.namelist():
            dst.writestr(n, src.read(n)[:-1] if n.endswith("data/0") else src.read(n))
    with pytest.raises(CheckpointError, match="not a whole number"):
        torch_load(tmp_path / "odd.pt")


def test_corrupt_zip_entry(tmp_path):
    torch.save({"w": torch.arange(64.0)}, tmp_path / "ok.pt")
    data = bytearray((tmp_path / "ok.pt").read_bytes())
    with zipfile.ZipFile(tmp_path / "ok.pt") as z:
        info = z.getinfo(next(n for n in z.namelist() if n.endswith("data/0")))
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26 : info.header_offset + 30])
    data[info.header_offset + 30 + name_len + extra_len + 5] ^= 0xFF  # a byte of the storage: its CRC fails
    (tmp_path / "bad.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="data/0 cannot be read"):
        torch_load(tmp_path / "bad.pt")


def _zip_with_pickle(tmp_path, pkl: bytes, name="bad.pt"):
    torch.save({"w": torch.arange(4.0)}, tmp_path / "ok.pt")
    with zipfile.ZipFile(tmp_path / "ok.pt") as src, zipfile.ZipFile(tmp_path / name, "w") as dst:
        for n in src.namelist():
            dst.writestr(n, pkl if n.endswith("data.pkl") else src.read(n))
    return tmp_path / name


def test_build_on_the_loaders_own_objects_is_refused(tmp_path):
    # GLOBAL torch.FloatStorage, {"name": "LongStorage"}, BUILD: would rename the shared storage-type marker
    pkl = b"\x80\x02ctorch\nFloatStorage\n}X\x04\x00\x00\x00nameX\x0b\x00\x00\x00LongStoragesb."
    with pytest.raises(CheckpointError, match="sets the state of a StorageType"):
        torch_load(_zip_with_pickle(tmp_path, pkl))
    torch.save({"w": torch.arange(4.0)}, tmp_path / "ok.pt")
    assert torch_load(tmp_path / "ok.pt")["w"].dtype.name == "float"  # the marker is unchanged


def test_cyclic_and_deep_containers(tmp_path):
    cyclic: list = [1]
    cyclic.append(cyclic)
    with pytest.raises(CheckpointError, match="appears twice"):
        torch_load(_zip_with_pickle(tmp_path, pickle.dumps({"a": cyclic}, protocol=2)))
    # {"a": [[[...]]]} 5000 lists deep (deeper than the recursion limit): EMPTY_LIST x 5001, APPEND x 5000
    deep = b"\x80\x02}X\x01\x00\x00\x00a" + b"]" * 5001 + b"a" * 5000 + b"s."
    assert torch_load(_zip_with_pickle(tmp_path, deep, "deep.pt")) == {}


def test_bool_bytes_other_than_0_1_are_normalized(tmp_path):
    torch.save({"b": torch.tensor([True, False, True, True])}, tmp_path / "b.pt")
    with zipfile.ZipFile(tmp_path / "b.pt") as src, zipfile.ZipFile(tmp_path / "b2.pt", "w") as dst:
        for n in src.namelist():
            dst.writestr(n, bytes([2, 0, 255, 1]) if n.endswith("data/0") else src.read(n))
    t = torch_load(tmp_path / "b2.pt")["b"]
    want = np.array([True, False, True, True])
    np.testing.assert_array_equal(t.numpy(), want)
    np.testing.assert_array_equal(t.logical_not().numpy(), ~want)
    assert t.sum().item() == 3
