"""Loading an object file that LLVM emitted for this CPU into executable memory, without LLVM.

The LLVM backend caches each kernel as an ELF relocatable object (`runtime/ops_llvm.py`). Linking such an object
needs no linker: its allocated sections are laid out in one fresh mapping (each at its alignment), its relocations
are applied, and the mapping is made read+execute. The objects are emitted with the large code model (`jit=True`),
so every reference (constant pools, libm's `exp2f`, `memcpy`) is an absolute 64-bit relocation; PC-relative ones
are handled too when they fit in 32 bits. External symbols are looked up in the process (libc, libm).

This is what lets a process whose kernels are all in the on-disk cache run them without importing llvmlite (~25 ms
of startup). Anything this loader does not handle — another machine than x86-64, another object format, a
relocation type or symbol it does not know — is an `UnsupportedObject`, and the caller links the object with
LLVM's MCJIT instead, as before.
"""

from __future__ import annotations

import ctypes
import mmap
import struct
from typing import Callable

from zeptograd.runtime.diskcache import CorruptEntry

_EM_X86_64 = 62
_ET_REL = 1
_SHT_RELA, _SHT_NOBITS = 4, 8
_SHF_ALLOC = 0x2
_SHN_UNDEF, _SHN_ABS = 0, 0xFFF1
_R_NONE, _R_64, _R_PC32, _R_PLT32, _R_PC64 = 0, 1, 2, 4, 24
_PAGE = mmap.PAGESIZE


class UnsupportedObject(Exception):
    """The object uses something this loader does not implement: link it with LLVM instead."""


class MalformedObject(CorruptEntry):
    """The bytes are not a well-formed object file (empty, truncated, zeroed, an offset or index out of range): never
    link them (MCJIT would crash); the cache entry is removed and the kernel compiled again."""


_SHT_SYMTAB, _SHT_STRTAB = 2, 3
_MAX_IMAGE = 1 << 28  # bytes: a kernel's sections are a few KiB; a larger claim is a corrupt size field
_OTHER_FORMATS = (b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe", b"\xfe\xed\xfa\xcf", b"\xfe\xed\xfa\xce", b"\x64\x86")


class _Section:
    __slots__ = ("name", "type", "flags", "offset", "size", "link", "info", "align")

    def __init__(self, raw: tuple):
        self.name, self.type, self.flags, _, self.offset, self.size, self.link, self.info, self.align, _ = raw


def _sections(obj: bytes) -> list[_Section]:
    """The section headers of an x86-64 relocatable ELF64 object, each checked to lie inside the file: an object of
    another kind is an UnsupportedObject, bytes that are no well-formed object a MalformedObject."""
    if obj[:4] != b"\x7fELF":
        if obj[:4] in _OTHER_FORMATS or obj[:2] in _OTHER_FORMATS:
            raise UnsupportedObject("not an ELF64 object (Mach-O or COFF)")
        raise MalformedObject(f"not an object file ({len(obj)} bytes starting {obj[:8].hex() or 'with nothing'})")
    if len(obj) < 64:
        raise MalformedObject(f"truncated ELF header ({len(obj)} bytes)")
    e_type, e_machine = struct.unpack_from("<HH" if obj[5] == 1 else ">HH", obj, 16)
    if obj[4] not in (1, 2) or obj[5] not in (1, 2) or e_machine == 0 or e_type not in (1, 2, 3, 4):
        raise MalformedObject(f"invalid ELF identification (class {obj[4]}, data {obj[5]}, type {e_type})")
    if obj[4] != 2 or obj[5] != 1:
        raise UnsupportedObject("not a little-endian ELF64 object")
    if e_type != _ET_REL or e_machine != _EM_X86_64:
        raise UnsupportedObject(f"ELF type {e_type}, machine {e_machine}: only x86-64 relocatable objects")
    (shoff,) = struct.unpack_from("<Q", obj, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", obj, 0x3A)
    if shentsize != 64 or shnum == 0 or shoff + shnum * 64 > len(obj):
        where = f"{shnum} x {shentsize} bytes at {shoff}"
        raise MalformedObject(f"section headers ({where}) outside the {len(obj)}-byte file")
    secs = [_Section(struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * 64)) for i in range(shnum)]
    image = 0
    for i, s in enumerate(secs):
        if s.type != _SHT_NOBITS and s.offset + s.size > len(obj):
            raise MalformedObject(f"section {i} ({s.size} bytes at {s.offset}) outside the {len(obj)}-byte file")
        if s.flags & _SHF_ALLOC:
            image += s.size + max(s.align, 1)
        if image > _MAX_IMAGE:
            raise MalformedObject(f"sections claim more than {_MAX_IMAGE} bytes")
        if s.align & (s.align - 1):
            raise MalformedObject(f"section {i} alignment {s.align} is not a power of two")
        if s.type in (_SHT_SYMTAB, _SHT_RELA) and s.size % 24:
            raise MalformedObject(f"section {i}: a size of {s.size} bytes is not whole 24-byte entries")
        if s.type == _SHT_SYMTAB and (s.link >= shnum or secs[s.link].type != _SHT_STRTAB):
            raise MalformedObject(f"symbol table {i} names string table {s.link}, not a string table")
        if s.type == _SHT_RELA and (s.link >= shnum or secs[s.link].type != _SHT_SYMTAB or s.info >= shnum):
            raise MalformedObject(f"relocation section {i}: symbol table {s.link} or target {s.info} invalid")
    return secs


def check_library(data: bytes):
    """That an ELF64 shared library's header tables and segments lie inside its bytes (dlopen maps them: a truncated
    library is a SIGBUS there); a MalformedObject if not. Libraries of other formats are left to the loader."""
    if data[:4] != b"\x7fELF":
        if data[:4] in _OTHER_FORMATS:
            return
        raise MalformedObject(f"not a library ({len(data)} bytes starting {data[:8].hex() or 'with nothing'})")
    if len(data) < 64:
        raise MalformedObject(f"truncated ELF header ({len(data)} bytes)")
    if data[4] != 2 or data[5] != 1:
        return
    (e_type,) = struct.unpack_from("<H", data, 16)
    if e_type != 3:
        raise MalformedObject(f"not a shared library (ELF type {e_type})")
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
    if phentsize != 56 or phoff + phnum * 56 > len(data) or shoff + shnum * shentsize > len(data):
        raise MalformedObject(f"ELF header tables outside the {len(data)}-byte file")
    for i in range(phnum):
        _, _, offset, _, _, filesz, _, _ = struct.unpack_from("<IIQQQQQQ", data, phoff + i * 56)
        if offset + filesz > len(data):
            raise MalformedObject(f"segment {i} ({filesz} bytes at {offset}) outside the {len(data)}-byte file")


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


_LIBS: list[ctypes.CDLL] = []


def process_symbol(name: str) -> int | None:
    """The address of a function the process (or libm) exports, None if none does."""
    if not _LIBS:
        _LIBS.append(ctypes.CDLL(None))
        try:
            _LIBS.append(ctypes.CDLL("libm.so.6"))
        except OSError:
            pass
    for lib in _LIBS:
        try:
            return ctypes.cast(lib[name], ctypes.c_void_p).value
        except AttributeError:
            continue
    return None


class LoadedObject:
    """An object's sections in one executable mapping; `symbols` maps each defined symbol name to its address.

    The mapping lives as long as this object (a kernel's code is never unloaded while its program exists)."""

    def __init__(self, obj: bytes, resolve: Callable[[str], int | None] = process_symbol):
        secs = _sections(obj)

        # layout: every allocated section at its alignment, in one image
        place: dict[int, int] = {}
        size = 0
        for i, s in enumerate(secs):
            if s.flags & _SHF_ALLOC and s.size:
                align = max(s.align, 1)
                if align > _PAGE:
                    raise UnsupportedObject(f"section alignment {align} exceeds a page")
                size = -(-size // align) * align
                place[i] = size
                size += s.size
        self.size = max(-(-size // _PAGE) * _PAGE, _PAGE)
        libc = _libc()
        prot_rw, flags = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        base = libc.mmap(None, self.size, prot_rw, flags, -1, 0)
        if base is None or base == ctypes.c_void_p(-1).value:
            raise UnsupportedObject(f"mmap of {self.size} bytes failed (errno {ctypes.get_errno()})")
        self.base, self._libc = base, libc
        try:
            image = bytearray(self.size)
            for i, off in place.items():
                s = secs[i]
                if s.type != _SHT_NOBITS:
                    image[off : off + s.size] = obj[s.offset : s.offset + s.size]
            self.symbols = self._relocate(obj, secs, place, image, resolve)
            ctypes.memmove(base, bytes(image), self.size)
            if libc.mprotect(base, self.size, mmap.PROT_READ | mmap.PROT_EXEC) != 0:
                raise UnsupportedObject(f"mprotect to read+execute failed (errno {ctypes.get_errno()})")
        except BaseException:
            libc.munmap(base, self.size)
            self.base = None
            raise

    def _relocate(
        self,
        obj: bytes,
        secs: list[_Section],
        place: dict[int, int],
        image: bytearray,
        resolve: Callable[[str], int | None],
    ) -> dict[str, int]:
        def name_at(strtab: _Section, off: int) -> str:
            end = obj.find(b"\0", strtab.offset + off, strtab.offset + strtab.size)
            if off >= strtab.size or end < 0:
                raise MalformedObject(f"a symbol name at {off} runs past its {strtab.size}-byte string table")
            try:
                return obj[strtab.offset + off : end].decode()
            except UnicodeDecodeError:
                raise MalformedObject(f"a symbol name at {off} is not UTF-8") from None

        defined: dict[str, int] = {}
        symtabs: dict[int, list[int | None]] = {}  # symtab section -> each symbol's address (None: unresolved)
        names: dict[int, list[str]] = {}
        for si, st in enumerate(secs):
            if st.type != 2:  # SHT_SYMTAB
                continue
            addrs, syms = [], []
            for k in range(st.size // 24):
                st_name, _info, _other, shndx, value, _size = struct.unpack_from("<IBBHQQ", obj, st.offset + 24 * k)
                name = name_at(secs[st.link], st_name) if st_name else ""
                if shndx in place:
                    if value > secs[shndx].size:
                        raise MalformedObject(f"symbol {name!r} at {value}, past its {secs[shndx].size}-byte section")
                    placed = self.base + place[shndx] + value
                    addr: int | None = placed
                    if name:
                        defined[name] = placed
                elif shndx == _SHN_ABS:
                    addr = value
                elif shndx == _SHN_UNDEF:
                    addr = None if k else 0  # symbol 0 is the null symbol
                else:
                    addr = None
                addrs.append(addr)
                syms.append(name)
            symtabs[si], names[si] = addrs, syms

        for rs in secs:
            if rs.type != _SHT_RELA or rs.info not in place:
                continue  # relocations of a section that is not loaded (debug info)
            target = place[rs.info]
            addrs, syms = symtabs[rs.link], names[rs.link]
            for k in range(rs.size // 24):
                r_offset, r_info, addend = struct.unpack_from("<QQq", obj, rs.offset + 24 * k)
                kind, sym = r_info & 0xFFFFFFFF, r_info >> 32
                if kind == _R_NONE:
                    continue
                width = 8 if kind in (_R_64, _R_PC64) else 4
                if sym >= len(addrs) or r_offset + width > secs[rs.info].size:
                    what = f"relocation {k} of section {rs.info} (symbol {sym}, offset {r_offset})"
                    raise MalformedObject(f"{what} out of range")
                s = addrs[sym]
                if s is None:
                    s = resolve(syms[sym]) if syms[sym] else None
                    if s is None:
                        raise UnsupportedObject(f"undefined symbol {syms[sym]!r}")
                    addrs[sym] = s
                where = target + r_offset
                if kind == _R_64:
                    struct.pack_into("<Q", image, where, (s + addend) & 0xFFFFFFFFFFFFFFFF)
                elif kind in (_R_PC32, _R_PLT32):
                    v = s + addend - (self.base + where)
                    if not -(2**31) <= v < 2**31:
                        raise UnsupportedObject(f"32-bit PC-relative relocation to {syms[sym]!r} out of range")
                    struct.pack_into("<i", image, where, v)
                elif kind == _R_PC64:
                    struct.pack_into("<q", image, where, s + addend - (self.base + where))
                else:
                    raise UnsupportedObject(f"relocation type {kind}")
        return defined
