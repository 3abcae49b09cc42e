"""Which Slurm release this node runs (`slurmd -V`) and which one a Slurm plugin was
built for (its `plugin_version` symbol, read from the ELF file without loading it)."""

from __future__ import annotations

import struct
import subprocess

from jobns.launcher.system import sysprog


def _slurmd_version() -> str:
    """The Slurm release of this node's slurmd ("22.05.8"), or "" if there is none."""
    try:
        r = subprocess.run(
            [sysprog.find("slurmd"), "-V"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
            env=sysprog.environment(),
        )
    except (OSError, subprocess.TimeoutExpired):  # sysprog.NotFound is an OSError
        return ""
    words = r.stdout.split()
    return words[-1] if r.returncode == 0 and words else ""


# ELF constants (elf(5)): the class and byte order in e_ident, section types
ELFCLASS64, ELFDATA2MSB, SHT_SYMTAB, SHT_DYNSYM, SHT_NOBITS = 2, 2, 2, 11, 8


def _plugin_version(path: str) -> str | None:
    """`plugin_version` of a Slurm plugin ("22.05.8"), read from the ELF file without
    loading it (loading runs its constructors, as root); None if it has no such symbol."""
    try:
        with open(path, "rb") as f:
            data = f.read(64 << 20)
        if data[:4] != b"\x7fELF":
            return None
        end = ">" if data[5] == ELFDATA2MSB else "<"
        wide = data[4] == ELFCLASS64
        # e_shoff, then e_shentsize, e_shnum (ELF64 / ELF32 offsets)
        shoff = struct.unpack_from(end + ("Q" if wide else "I"), data, 0x28 if wide else 0x20)[0]
        shentsize, shnum = struct.unpack_from(end + "HH", data, 0x3A if wide else 0x2E)
        shdr = end + ("IIQQQQIIQQ" if wide else "IIIIIIIIII")
        # (type, addr, offset, size, link, entsize) of each section
        sections = [
            tuple(
                struct.unpack_from(shdr, data, shoff + i * shentsize)[j] for j in (1, 3, 4, 5, 6, 9)
            )
            for i in range(shnum)
        ]
        sym = end + ("IBBHQQ" if wide else "IIIBBH")
        for kind, _addr, offset, size, link, entsize in sections:
            if kind not in (SHT_DYNSYM, SHT_SYMTAB) or not entsize:
                continue
            strtab = sections[link][2]
            for at in range(offset, offset + size, entsize):
                fields = struct.unpack_from(sym, data, at)
                name, shndx, value = (
                    (fields[0], fields[3], fields[4]) if wide else (fields[0], fields[5], fields[1])
                )
                end_of_name = data.index(b"\0", strtab + name)
                if data[strtab + name : end_of_name] != b"plugin_version":
                    continue
                if not 0 < shndx < len(sections) or sections[shndx][0] == SHT_NOBITS:
                    return None
                where = sections[shndx][2] + value - sections[shndx][1]
                number = struct.unpack_from(end + "I", data, where)[0]
                return f"{number >> 16 & 0xFF}.{number >> 8 & 0xFF:02d}.{number & 0xFF}"
    except (OSError, struct.error, IndexError, ValueError):
        return None
    return None
