"""The on-disk caches under `helpers.cache_dir()`: compiled kernels (LLVM objects, CPU:C shared libraries), the
per-host memos of their keys, and BEAM's choices.

A cached kernel is code this process will run, so nothing is read that someone else could have written:

- directories are made 0700 and a cache directory is used only if it is a real directory (not a symbolic link)
  owned by this user and writable by no one else, and every directory above it is owned by this user or root and
  writable by no one else (a sticky directory like /tmp excepted: nobody can rename what another user put there);
- an entry is opened without following symbolic links and used only if it is a regular file owned by this user
  and writable by no one else;
- beside each kernel entry lies the sha256 of (its compiler key, its bytes), checked before the entry is loaded, so
  a corrupt entry (a truncated write, a flipped constant) is compiled again instead of run. The hash is no defense
  against someone who can write the directory (they can write the hash too): the ownership and mode checks are.

An entry that fails a check is removed and compiled again. A cache directory that fails a check, or that cannot be
written (read-only, not a directory, a full disk), is not used: LLVM keeps its objects in memory, CPU:C (which
needs a file to load) compiles into a private temporary directory (0700) removed at exit; either warns once.
Entries are written to a unique temporary file and renamed into place (atomic: a parallel process never reads a
half-written entry).
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import warnings

from zeptograd.helpers import cache_dir

HASH_SUFFIX = ".sha256"
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

_warned: set[tuple[str, str]] = set()  # the (path, message) pairs this process has warned about
_unwritable: set[str] = set()  # cache roots a write failed in: this process stops writing there
_ancestors: dict[str, str | None] = {}  # cache root -> why a directory above it is unsafe (None: safe)
_private: list[tuple[str, int]] = []  # (this process's private directory, the pid that made it)


class UnsafeEntry(Exception):
    """A cache file or directory that someone other than this user could have written, or that is not a file."""


class CorruptEntry(Exception):
    """An entry whose bytes cannot be loaded safely (elf.MalformedObject is one): it is removed and compiled again."""


def warn_once(path: str, message: str):
    if (path, message) not in _warned:  # once per problem: the same one is not repeated, another one is told
        _warned.add((path, message))
        warnings.warn(f"zeptograd cache: {message}", RuntimeWarning, stacklevel=3)


def entry_digest(key: str, data: bytes) -> str:
    """What is stored beside a kernel entry: the sha256 of its compiler key and its bytes."""
    return hashlib.sha256(key.encode() + b"\0" + data).hexdigest()


# ***** which directories may be trusted *****


def _unsafe_own_dir(path: str, st: os.stat_result) -> str | None:
    """Why a directory of the cache itself may not be used (None: it may)."""
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != os.geteuid():
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _unsafe_ancestor(root: str) -> str | None:
    """Why a directory above the cache root lets someone else swap the cache (None: none does). Remembered per
    process: each directory from / down to the root's parent (symbolic links resolved) must be owned by this user or
    root and writable by no one else, or be sticky (/tmp); group-writable is allowed in a directory of this user's
    own group (the user-private-group convention)."""
    if root in _ancestors:
        return _ancestors[root]
    why, complete = None, True
    path = "/"
    for part in [p for p in os.path.realpath(os.path.dirname(root)).split(os.sep) if p]:
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except OSError:
            complete = False  # does not exist yet: checked again once made (someone else may make it first)
            break
        if st.st_uid not in (0, os.geteuid()):
            why = f"{path} (above the cache) is owned by uid {st.st_uid}"
        elif st.st_mode & stat.S_ISVTX:
            continue
        elif st.st_mode & 0o002:
            why = f"{path} (above the cache) is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
        elif st.st_mode & 0o020 and not (st.st_uid == os.geteuid() and st.st_gid == os.getegid()):
            why = f"{path} (above the cache) is writable by its group (mode {stat.S_IMODE(st.st_mode):o})"
        if why:
            break
    if complete or why is not None:
        _ancestors[root] = why
    return why


def _makedirs(path: str):
    """mkdir -p with 0700 for every directory made (os.makedirs gives the ones above the leaf the umask's mode)."""
    missing = []
    while not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass


def _trusted_dir(root: str, subdir: str, create: bool) -> str | None:
    """root/subdir if this process may use it (made when `create`); None if it is missing or may not be used."""
    why = _unsafe_ancestor(root)
    if why is not None:
        warn_once(root, f"not using {root}: {why}")
        return None
    path = os.path.join(root, subdir)
    for d in (root, path):
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            if not create:
                return None
            try:
                _makedirs(d)
                st = os.lstat(d)
            except OSError as e:
                _write_failed(root, d, e)
                return None
            why = _unsafe_ancestor(root)  # the directories above, as they are now that they exist
            if why is not None:
                warn_once(root, f"not using {root}: {why}")
                return None
        except OSError as e:  # e.g. a path through a file (ENOTDIR)
            if create:
                _write_failed(root, d, e)
            return None
        why = _unsafe_own_dir(d, st)
        if why is not None:
            warn_once(d, f"not using {d}: {why}; compiling without it (remove it to let zeptograd make it again)")
            return None
    return path


def _write_failed(root: str, path: str, err: OSError):
    _unwritable.add(root)
    warn_once(root, f"cannot write {path} ({err.strerror or err}): kernels are compiled without the on-disk cache")


def private_root() -> str:
    """This process's private cache (0700, removed at exit): for a kernel that must be a file when the cache cannot
    be used. Shared with forked workers (BEAM), which write their compiles there for the parent to find."""
    if not _private:
        import atexit
        import shutil
        import tempfile

        path, pid = tempfile.mkdtemp(prefix="zeptograd-"), os.getpid()
        _private.append((path, pid))

        def remove_in_owner():  # a forked child inherits the handler: only the process that made it removes it
            if os.getpid() == pid:
                shutil.rmtree(path, ignore_errors=True)

        atexit.register(remove_in_owner)
        mp = sys.modules.get("multiprocessing")
        if mp is not None and mp.parent_process() is not None:  # a pool worker ends without running atexit
            import multiprocessing.util

            multiprocessing.util.Finalize(None, shutil.rmtree, (path, True), exitpriority=0)
    return _private[0][0]


def _roots(private: bool) -> list[str]:
    roots = [cache_dir()]
    if _private or private:
        roots.append(private_root())
    return roots


# ***** reading and writing entries *****


def _read_file(path: str) -> bytes | None:
    """A file's bytes if it is there (None if not); UnsafeEntry if it is not a regular file of this user's that
    no one else can write. Symbolic links are not followed."""
    try:
        fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:  # ELOOP: a symbolic link
        raise UnsafeEntry(f"{path} cannot be opened without following links ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeEntry(f"{path} is not a regular file")
        if st.st_uid != os.geteuid():
            raise UnsafeEntry(f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})")
        if st.st_mode & 0o022:
            raise UnsafeEntry(f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):o})")
        chunks = []
        while chunk := os.read(fd, max(st.st_size, 1 << 16)):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _remove(path: str):
    for p in (path, path + HASH_SUFFIX):
        try:
            os.unlink(p)
        except OSError:
            pass


def _write_all(fd: int, data: bytes):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _write(directory: str, name: str, data: bytes, digest: str | None):
    """Write directory/name (and, for a kernel, its hash beside it) through unique temporary files renamed in place.

    Nothing is fsync'ed: a crash may leave an entry torn, empty or missing, or its hash missing, and an entry that
    does not match its hash is compiled again (load_entry), as any corrupt one is; an fsync per kernel would cost
    5-10 ms of each miss (0.2-0.4 s of a ResNet-50's first call) for no safety the hash does not give. A small text
    entry is validated by its reader."""
    import tempfile

    path = os.path.join(directory, name)
    files = [(path + HASH_SUFFIX, digest.encode()), (path, data)] if digest is not None else [(path, data)]
    temps: list[str] = []
    try:
        for final, content in files:
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")  # mode 0600
            temps.append(tmp)
            try:
                _write_all(fd, content)
            finally:
                os.close(fd)
        for (final, _), tmp in zip(files, temps):  # the hash first: an entry is never newer than its hash
            os.replace(tmp, final)
        temps = []
    finally:
        for tmp in temps:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def load_entry(subdir: str, name: str, key: str) -> tuple[bytes, str] | None:
    """A kernel entry's bytes and path, from the cache or this process's private cache, if there is one that passes
    the checks and whose hash matches; an entry that fails is removed (with a warning if it was not plain missing)."""
    for root in _roots(private=False):
        directory = _trusted_dir(root, subdir, create=False)
        if directory is None:
            continue
        path = os.path.join(directory, name)
        try:
            data = _read_file(path)
            if data is None:
                continue
            stored = _read_file(path + HASH_SUFFIX)
        except UnsafeEntry as e:
            warn_once(path, f"not loading {path}: {e}; compiling it again")
            _remove(path)
            continue
        if stored is None or stored.strip() != entry_digest(key, data).encode():
            if stored is not None:
                warn_once(path, f"{path} does not match its content hash (corrupt or changed): compiling it again")
            _remove(path)
            continue
        return data, path
    return None


def store_entry(subdir: str, name: str, key: str, data: bytes, private: bool) -> str | None:
    """Write a kernel entry; its path, or None if the cache cannot be written (then, with `private`, the entry goes
    to this process's private cache, whose path is returned)."""
    for root in _roots(private):
        if root in _unwritable:
            continue
        directory = _trusted_dir(root, subdir, create=True)
        if directory is None:
            continue
        try:
            _write(directory, name, data, entry_digest(key, data))
        except OSError as e:
            _write_failed(root, directory, e)
            continue
        return os.path.join(directory, name)
    return None


def remove_entry(subdir: str, name: str):
    """Remove an entry that failed to load (everywhere it may be), so that it is compiled again."""
    for root in _roots(private=False):
        directory = _trusted_dir(root, subdir, create=False)
        if directory is not None:
            _remove(os.path.join(directory, name))


def read_text(subdir: str, name: str) -> str | None:
    """A small text entry (a memo, a BEAM choice) if it is there and passes the checks; else None (an unsafe or
    undecodable one is removed). The caller validates the content and calls remove_text on what it rejects."""
    directory = _trusted_dir(cache_dir(), subdir, create=False)
    if directory is None:
        return None
    path = os.path.join(directory, name)
    try:
        data = _read_file(path)
        return None if data is None else data.decode()
    except (UnsafeEntry, UnicodeDecodeError) as e:
        warn_once(path, f"ignoring {path}: {e}")
        _remove(path)
        return None


def remove_text(subdir: str, name: str, why: str):
    path = os.path.join(cache_dir(), subdir, name)
    warn_once(path, f"ignoring {path}: {why}")
    remove_entry(subdir, name)


def write_text(subdir: str, name: str, text: str) -> bool:
    """Write a small text entry atomically; False if the cache cannot be written (warned once)."""
    root = cache_dir()
    if root in _unwritable:
        return False
    directory = _trusted_dir(root, subdir, create=True)
    if directory is None:
        return False
    try:
        _write(directory, name, text.encode(), None)
        return True
    except OSError as e:
        _write_failed(root, directory, e)
        return False


# ***** what a kernel compiled for this host depends on *****


def host_cpu() -> str | None:
    """This host's CPU as /proc/cpuinfo names it (the first CPU's identity and feature lines, not its clock) and the
    machine; None where there is no /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as f:
            first = f.read().split("\n\n", 1)[0]
    except OSError:
        return None
    keys = (
        "vendor_id",
        "cpu family",
        "model",
        "model name",
        "stepping",
        "flags",
        "Features",
        "CPU implementer",
        "CPU architecture",
        "CPU variant",
        "CPU part",
        "CPU revision",
    )
    lines = [line for line in first.splitlines() if line.split(":")[0].strip() in keys]
    return "\n".join([os.uname().machine, *lines]) if lines else None
