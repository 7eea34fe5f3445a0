"""The on-disk caches (runtime/diskcache.py): private directories, nothing loaded that another user could have
planted, corrupt entries compiled again instead of run or crashed on, an unwritable cache falling back, and BEAM's
choices validated. Whatever could crash or run planted code runs in a child process with its own cache directory.

Run as root, "owned by another user" is made with os.chown and "writable by others" with chmod."""

from __future__ import annotations

import errno
import glob
import json
import os
import shutil
import stat
import struct
import subprocess
import sys

import numpy as np
import pytest

from zeptograd import Context, Tensor
from zeptograd.engine import kernels, realize, search
from zeptograd.runtime import diskcache, elf
from zeptograd.runtime.ops_cpu import CCompiler

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WANT = [4.5, 8.0, 11.5]  # (x * 3.5 + 1) for x = 1, 2, 3
OTHER_UID = 4242
linux_x86 = pytest.mark.skipif(
    os.uname().machine != "x86_64" or not sys.platform.startswith("linux"), reason="x86-64 Linux (ELF, /proc)"
)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def _compute(device: str) -> str:
    return f"from zeptograd import Tensor; print((Tensor([1.0, 2.0, 3.0], device={device!r}) * 3.5 + 1).tolist())"


def _child(cache, code: str, tmpdir=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), PYTHONPATH=ROOT, PYTHONWARNINGS="default")
    env.pop("DEV", None)
    env.pop("CPU_LLVM", None)
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _run_ok(cache, device: str, tmpdir=None, prefix: str = "") -> subprocess.CompletedProcess:
    """A child computing WANT on device: it must exit 0 with the right values."""
    proc = _child(cache, prefix + _compute(device), tmpdir)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(WANT), (proc.stdout, proc.stderr)
    return proc


def _entry(cache, subdir: str, suffix: str) -> str:
    (path,) = glob.glob(os.path.join(str(cache), "zeptograd", subdir, f"*{suffix}"))
    return path


def _llvm_key(cache) -> str:
    (memo,) = glob.glob(os.path.join(str(cache), "zeptograd", "hosts", "llvm-*.txt"))
    with open(memo) as f:
        return f.read()


def _c_key(cache, monkeypatch) -> str:
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return CCompiler().key


def _plant(path: str, data: bytes, key: str | None):
    """Replace an entry's bytes; with a key, write the matching hash too (as someone able to write the cache could)."""
    os.unlink(path)
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)
    if key is not None:
        with open(path + diskcache.HASH_SUFFIX, "w") as f:
            f.write(diskcache.entry_digest(key, data))


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# ***** item 1: directories 0700, no planted code is loaded *****


@pytest.mark.slow
@pytest.mark.parametrize("device", ["CPU", "CPU:C"])
def test_cache_directories_and_entries_are_private(device, tmp_path):
    cache = tmp_path / "new" / "cache"  # made by zeptograd, under umask 0 (0777 before)
    _run_ok(cache, device, prefix="import os; os.umask(0); ")
    subdir, suffix = ("llvm", ".o") if device == "CPU" else ("cpu", ".so")
    for d in (cache, cache / "zeptograd", cache / "zeptograd" / subdir, cache / "zeptograd" / "hosts"):
        assert stat.S_IMODE(os.lstat(d).st_mode) == 0o700, d
    entry = _entry(cache, subdir, suffix)
    for f in [entry, entry + diskcache.HASH_SUFFIX, *glob.glob(str(cache / "zeptograd" / "hosts" / "*"))]:
        assert stat.S_IMODE(os.lstat(f).st_mode) == 0o600, f
    with open(entry + diskcache.HASH_SUFFIX) as f:
        assert len(f.read()) == 64
    assert not [f for f in os.listdir(cache / "zeptograd" / subdir) if f.endswith(".tmp")]


EVIL_C = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) { close(open("%s", O_CREAT | O_WRONLY, 0600)); }
"""


@pytest.mark.slow
@linux_x86
@needs_root
@pytest.mark.parametrize("how", ["entry_owner", "root_owner", "dir_writable", "entry_writable", "symlink", "control"])
def test_planted_library_is_never_opened(how, tmp_path, monkeypatch):
    """A CPU:C library whose constructor would create a marker file, planted with a matching hash: every ownership,
    mode or symlink check keeps it from being opened (the control shows it runs when planted by this user)."""
    cache, marker = tmp_path / "cache", tmp_path / "marker"
    _run_ok(cache, "CPU:C")
    key, entry = _c_key(cache, monkeypatch), _entry(cache, "cpu", ".so")
    good = _read(entry)
    (tmp_path / "evil.c").write_text(EVIL_C % marker)
    evil_so = str(tmp_path / "evil.so")
    subprocess.run(["cc", "-shared", "-fPIC", str(tmp_path / "evil.c"), "-o", evil_so], check=True)
    _plant(entry, _read(evil_so), key)
    cpu_dir = os.path.dirname(entry)
    if how == "entry_owner":
        os.chown(entry, OTHER_UID, OTHER_UID)
    elif how == "root_owner":
        os.chown(cache / "zeptograd", OTHER_UID, OTHER_UID)
    elif how == "dir_writable":
        os.chmod(cpu_dir, 0o777)
    elif how == "entry_writable":
        os.chmod(entry, 0o666)
    elif how == "symlink":
        os.chmod(evil_so, 0o600)
        os.unlink(entry)
        os.symlink(evil_so, entry)
    if how == "control":  # planted by this user into its own cache: the hash matches, so it is opened
        _child(cache, _compute("CPU:C"))
        assert marker.exists()
        return
    proc = _run_ok(cache, "CPU:C", tmpdir=tmp_path)
    assert not marker.exists(), f"the planted library was opened ({how})"
    assert "zeptograd cache" in proc.stderr  # a warning names what was refused
    if how in ("entry_owner", "entry_writable", "symlink"):  # the entry was replaced by a fresh compile
        assert not os.path.islink(entry) and _read(entry) == good and os.stat(entry).st_uid == os.geteuid()


@pytest.mark.slow
@linux_x86
@needs_root
def test_unsafe_directory_above_the_cache_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # anyone could rename the cache away and put theirs in its place
    (tmp_path / "tmp").mkdir()
    proc = _run_ok(shared, "CPU:C", tmpdir=tmp_path / "tmp")
    assert "writable by others" in proc.stderr and not (shared / "zeptograd").exists()
    assert os.listdir(tmp_path / "tmp") == []  # the private directory was removed at exit
    os.chmod(shared, 0o1777)  # sticky, like /tmp: nobody can rename what another user put there
    proc = _run_ok(shared, "CPU:C")
    assert "zeptograd cache" not in proc.stderr and (shared / "zeptograd" / "cpu").is_dir()


# ***** item 2: a tampered entry is compiled again (the hash), a planted one refused (the owner) *****


@pytest.mark.slow
@linux_x86
@needs_root
def test_tampered_constant_is_compiled_again(tmp_path):
    cache = tmp_path / "cache"
    _run_ok(cache, "CPU")
    entry, key = _entry(cache, "llvm", ".o"), _llvm_key(cache)
    good = _read(entry)
    assert good.count(struct.pack("<f", 3.5)) == 1
    tampered = good.replace(struct.pack("<f", 3.5), struct.pack("<f", 5.5))

    _plant(entry, tampered, None)  # the old hash: the change is caught
    proc = _run_ok(cache, "CPU")
    assert "does not match its content hash" in proc.stderr and entry in proc.stderr
    assert _read(entry) == good

    _plant(entry, tampered, key)  # the hash rewritten too: only the owner and mode checks can stop this
    proc = _child(cache, _compute("CPU"))
    assert proc.stdout.strip() == str([6.5, 12.0, 17.5])  # it ran: whoever can write the cache controls it
    os.chown(entry, OTHER_UID, OTHER_UID)
    _run_ok(cache, "CPU")
    assert _read(entry) == good


# ***** item 3: corrupt entries never crash *****

CORRUPTIONS = {
    "empty": lambda b: b"",
    "random": lambda b: np.random.default_rng(0).integers(0, 256, len(b), dtype=np.uint8).tobytes(),
    "zeroed": lambda b: bytes(len(b)),
    "truncated": lambda b: b[: len(b) // 2],
    "header_only": lambda b: b[:64],
}


@pytest.mark.slow
@linux_x86
@pytest.mark.parametrize("hashed", [False, True], ids=["stale_hash", "matching_hash"])
@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_corrupt_llvm_entry_is_compiled_again(corruption, hashed, tmp_path):
    cache = tmp_path / "cache"
    _run_ok(cache, "CPU")
    entry, key = _entry(cache, "llvm", ".o"), _llvm_key(cache)
    good = _read(entry)
    _plant(entry, CORRUPTIONS[corruption](good), key if hashed else None)
    proc = _run_ok(cache, "CPU")  # no crash, no struct.error, the right values
    assert os.path.basename(entry) in proc.stderr  # a warning names the entry
    assert _read(entry) == good
    _run_ok(cache, "CPU")  # and later runs are not affected


@pytest.mark.slow
@linux_x86
@pytest.mark.parametrize("hashed", [False, True], ids=["stale_hash", "matching_hash"])
@pytest.mark.parametrize("corruption", ["truncated", "random", "zeroed"])
def test_corrupt_c_library_is_compiled_again(corruption, hashed, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    _run_ok(cache, "CPU:C")
    entry = _entry(cache, "cpu", ".so")
    good = _read(entry)
    _plant(entry, CORRUPTIONS[corruption](good), _c_key(cache, monkeypatch) if hashed else None)
    _run_ok(cache, "CPU:C")  # a half-written library was a bus error in ctypes.CDLL
    assert _read(entry) == good


@pytest.mark.slow
@linux_x86
def test_c_library_dlopen_refuses_is_compiled_again(tmp_path, monkeypatch):
    """An entry that passes the checks (this user's, its hash matching, its ELF layout whole) but that dlopen refuses
    (here a library for another machine) is removed and compiled again; a relocatable object is refused before."""
    cache = tmp_path / "cache"
    _run_ok(cache, "CPU:C")
    entry = _entry(cache, "cpu", ".so")
    good = _read(entry)
    key = _c_key(cache, monkeypatch)
    _plant(entry, good[:18] + struct.pack("<H", 183) + good[20:], key)  # e_machine: AArch64
    proc = _run_ok(cache, "CPU:C")
    assert "did not load" in proc.stderr and _read(entry) == good
    subprocess.run(["cc", "-c", "-x", "c", "-", "-o", str(tmp_path / "x.o")], input=b"int x;\n", check=True)
    _plant(entry, _read(str(tmp_path / "x.o")), key)
    proc = _run_ok(cache, "CPU:C")
    assert "not a shared library" in proc.stderr and _read(entry) == good


def _real_object(tmp_path, monkeypatch) -> bytes:
    from zeptograd.runtime.ops_llvm import LLVMCompiler

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    src = (
        "define void @probe(ptr noalias %out, ptr noalias %in) {\nentry:\n"
        "  %x = load double, ptr %in\n  %e = call double @llvm.exp2.f64(double %x)\n"
        "  %s = fadd double %e, 0x400921FB54442D18\n  store double %s, ptr %out\n  ret void\n}\n"
        "declare double @llvm.exp2.f64(double)\n"
    )
    return LLVMCompiler().compile(src)


@linux_x86
def test_elf_loader_rejects_malformed_objects(tmp_path, monkeypatch):
    """Every truncation and every single-byte change of a real object's headers, symbols and relocations either
    loads (into memory; nothing is run) or is a MalformedObject/UnsupportedObject: never struct.error or a crash."""
    obj = _real_object(tmp_path, monkeypatch)
    elf.LoadedObject(obj)
    for n in range(0, len(obj), 7):
        with pytest.raises((elf.MalformedObject, elf.UnsupportedObject)):
            elf.LoadedObject(obj[:n])
    for bad in (b"", bytes(len(obj)), b"\x7fELF" + bytes(60), b"\x7fELF\x02\x01" + bytes(200)):
        with pytest.raises(elf.MalformedObject):
            elf.LoadedObject(bad)
    (shoff,) = struct.unpack_from("<Q", obj, 0x28)
    (shnum,) = struct.unpack_from("<H", obj, 0x3C)
    table = list(range(0x28, 0x40))
    for i in range(shnum):  # the offset, size, link and info of each section header
        table += [shoff + i * 64 + f for f in (24, 25, 31, 32, 33, 39, 40, 44)]
    for i in range(shnum):  # the body of each symbol table and relocation section
        sh_type, _, _, off, size = struct.unpack_from("<IQQQQ", obj, shoff + i * 64 + 4)
        if sh_type in (2, 4):
            table += range(off, off + size)
    outcomes = set()
    for where in table:
        for value in (0xFF, 0x00, 0x7F):
            mutated = bytearray(obj)
            mutated[where] = value
            try:
                elf.LoadedObject(bytes(mutated))
                outcomes.add("loaded")
            except elf.MalformedObject:
                outcomes.add("malformed")
            except elf.UnsupportedObject:
                outcomes.add("unsupported")
    assert "malformed" in outcomes


# ***** item 4: a cache that cannot be written *****


@pytest.mark.slow
@pytest.mark.parametrize("device", ["CPU", "CPU:C"])
def test_cache_path_through_a_file_falls_back(device, tmp_path):
    (tmp_path / "file").write_text("not a directory")
    (tmp_path / "tmp").mkdir()
    code = _compute(device) + f"; print((Tensor([1.0, 2.0], device={device!r}) - 0.5).tolist())"  # two kernels
    proc = _child(tmp_path / "file", code, tmpdir=tmp_path / "tmp")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == [str(WANT), "[0.5, 1.5]"]
    assert proc.stderr.count("RuntimeWarning") == 1 and "cannot write" in proc.stderr  # warned once
    assert os.listdir(tmp_path / "tmp") == []  # CPU:C's private directory was removed at exit


@pytest.mark.slow
@linux_x86
@pytest.mark.parametrize("device", ["CPU", "CPU:C"])
def test_full_disk_falls_back(device, tmp_path):
    (tmp_path / "tmp").mkdir()
    full = (  # the cache's file system is full (not the one TMPDIR is on)
        "import os, zeptograd.runtime.diskcache as dc\n"
        "write_all = dc._write_all\n"
        "def full(fd, data):\n"
        f"    if os.readlink(f'/proc/self/fd/{{fd}}').startswith({str(tmp_path / 'cache')!r}):\n"
        f"        raise OSError({errno.ENOSPC}, 'No space left on device')\n"
        "    write_all(fd, data)\n"
        "dc._write_all = full\n"
    )
    proc = _run_ok(tmp_path / "cache", device, tmpdir=tmp_path / "tmp", prefix=full)
    assert proc.stderr.count("RuntimeWarning") == 1 and "No space left on device" in proc.stderr
    leftovers = [f for _, _, files in os.walk(tmp_path / "cache") for f in files if f.endswith(".tmp")]
    assert leftovers == [] and os.listdir(tmp_path / "tmp") == []
    _run_ok(tmp_path / "cache", device)  # a later run with room writes the cache


# ***** item 5: BEAM's choices *****


@pytest.mark.slow
def test_bad_beam_choice_is_ignored_and_rewritten(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    seen = []
    real = search.beam_search

    def recording(device, ast, bufs, width):
        seen.append((device, ast, width))
        return real(device, ast, bufs, width)

    monkeypatch.setattr(search, "beam_search", recording)
    an = np.arange(64 * 48, dtype=np.float32).reshape(64, 48) / 100
    a = Tensor(an).realize()

    def run():
        cache: dict = {}
        monkeypatch.setattr(kernels, "_kernel_cache", cache)  # (get_kernel's, and _run_plan's in realize)
        monkeypatch.setattr(realize, "_kernel_cache", cache)
        with Context(BEAM=1, BEAM_BUDGET=1):
            np.testing.assert_allclose(a.sum(axis=1).numpy(), an.sum(axis=1), rtol=1e-5)

    run()
    device, ast, width = seen[0]
    path = search.cache_path(device, ast, width)
    assert search._cached_choice(device, ast, width) is not None
    for bad in (b"{not json", b'{"a": 1}', b'[["NOPE", 0, 2]]', b'[["UPCAST", 99, 4]]', b'[["UPCAST", 0]]', b"\xff"):
        with open(path, "wb") as f:
            f.write(bad)
        with pytest.warns(RuntimeWarning, match=os.path.basename(path)):
            assert search._cached_choice(device, ast, width) is None
        assert not os.path.exists(path)  # removed: searched and written again
    with open(path, "w") as f:
        f.write("{not json")
    os.mkdir(path + ".tmp")  # a fixed temporary name would collide with this (and with another process)
    run()
    rewritten = search._cached_choice(device, ast, width)  # searched again (timings differ: maybe another choice)
    assert rewritten is not None and json.loads(open(path).read()) == [[o.op.name, o.axis, o.arg] for o in rewritten]


@needs_root
def test_beam_choice_of_another_user_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    beam = tmp_path / "zeptograd" / "beam"
    beam.mkdir(parents=True, mode=0o700)
    os.chmod(tmp_path / "zeptograd", 0o700)
    (beam / "x.json").write_text('[["UPCAST", 0, 4]]')
    os.chmod(beam / "x.json", 0o600)
    assert diskcache.read_text("beam", "x.json") == '[["UPCAST", 0, 4]]'
    os.chown(beam / "x.json", OTHER_UID, OTHER_UID)
    with pytest.warns(RuntimeWarning, match="owned by uid 4242"):
        assert diskcache.read_text("beam", "x.json") is None
    shutil.rmtree(tmp_path / "zeptograd")


@pytest.mark.slow
def test_beam_on_c_without_a_cache_leaves_no_temporary_files(tmp_path):
    """BEAM's forked workers compile CPU:C candidates with no usable cache: into private directories, all removed."""
    (tmp_path / "file").write_text("not a directory")
    (tmp_path / "tmp").mkdir()
    code = (
        "import numpy as np; from zeptograd import Context, Tensor\n"
        "an = np.arange(64 * 48, dtype=np.float32).reshape(64, 48) / 100\n"
        "with Context(BEAM=1, BEAM_BUDGET=1):\n"
        "    print(np.allclose(Tensor(an, device='CPU:C').sum(axis=1).numpy(), an.sum(axis=1), rtol=1e-5))\n"
    )
    proc = _child(tmp_path / "file", code, tmpdir=tmp_path / "tmp")
    assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stderr
    assert os.listdir(tmp_path / "tmp") == []


def test_c_cache_key_names_compiler_version_and_cpu(tmp_path, monkeypatch):
    """CPU:C compiles with -march=native: an entry is keyed by the compiler's version and the host CPU too."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    names = []
    for version in ("13.1", "13.2"):
        wrapper = tmp_path / f"cc-{version}"
        log = tmp_path / "versions.log"
        wrapper.write_text(
            f'#!/bin/sh\nif [ "$1" = --version ]; then echo asked >> {log}; echo "cc (test) {version}"; exit 0; fi\n'
            'exec cc "$@"\n'
        )
        wrapper.chmod(0o755)
        monkeypatch.setenv("CC", str(wrapper))
        c = CCompiler()
        assert f"cc (test) {version}" in c.key and (diskcache.host_cpu() or os.uname().machine) in c.key
        names.append(c.entry_name("void f(void) {}\n"))
        assert CCompiler().key == c.key  # the version is remembered: no compiler run on a warm start
        assert log.read_text().count("asked") == len(names)
    assert names[0] != names[1]
    monkeypatch.setattr(diskcache, "host_cpu", lambda: "another CPU")
    assert CCompiler().entry_name("void f(void) {}\n") != names[1]


def test_kernel_writes_are_not_fsynced(tmp_path, monkeypatch):
    """A miss writes its kernel without an fsync (5-10 ms each on a VM's disk, 46 in a ResNet-50's first call): a
    crash that tears the entry leaves one that fails its hash and is compiled again (the corruption tests above)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    def no_fsync(fd):
        raise AssertionError("fsync on a cache write")

    monkeypatch.setattr(os, "fsync", no_fsync)
    path = diskcache.store_entry("llvm", "0" * 32 + ".o", "key", b"\x7fELF" + bytes(60), private=False)
    assert path is not None and diskcache.load_entry("llvm", "0" * 32 + ".o", "key") == (b"\x7fELF" + bytes(60), path)
