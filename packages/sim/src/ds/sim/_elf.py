"""Find a symbol's address in a loaded ELF shared library, local (``.symtab``) symbols included.

``dlsym`` only sees exported symbols; the simulated CUDA device (:mod:`ds.sim._fake_cuda`) needs
the addresses of a few inline virtual functions of libtorch that are emitted as local symbols, to
recognise their slots in a vtable. Linux x86-64/aarch64 (ELF64, little endian) only.
"""

from __future__ import annotations

import mmap
import struct

import numpy as np

_SHT_SYMTAB = 2
_SHT_DYNSYM = 11
_SYM = np.dtype(
    [
        ("name", "<u4"),
        ("info", "u1"),
        ("other", "u1"),
        ("shndx", "<u2"),
        ("value", "<u8"),
        ("size", "<u8"),
    ]
)


def symbols(path: str, names: list[str]) -> dict[str, tuple[int, int]]:
    """``{name: (value, size)}`` for each of ``names`` found in ``path`` (file offsets from the
    library's load base). Names not found are absent."""
    with open(path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            return {}
        (shoff,) = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
        sections = []
        for i in range(shnum):
            fields = struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
            # (type, offset, size, link, entsize)
            sections.append((fields[1], fields[4], fields[5], fields[6], fields[9]))
        found: dict[str, tuple[int, int]] = {}
        for kind, off, size, link, entsize in sections:
            if kind not in (_SHT_SYMTAB, _SHT_DYNSYM) or entsize != _SYM.itemsize:
                continue
            _, str_off, str_size, _, _ = sections[link]
            strtab = data[str_off : str_off + str_size]
            table = np.frombuffer(data, dtype=_SYM, count=size // entsize, offset=off)
            for name in names:
                if name in found:
                    continue
                pos = strtab.find(b"\0" + name.encode() + b"\0")
                if pos < 0:
                    continue
                hit = np.nonzero(table["name"] == pos + 1)[0]
                if len(hit):
                    index = int(hit[0])
                    found[name] = (int(table["value"][index]), int(table["size"][index]))
            del table
        return found
    finally:
        data.close()
