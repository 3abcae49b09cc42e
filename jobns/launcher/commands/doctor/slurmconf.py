"""Reading Slurm's files as Slurm reads them: slurm.conf's Key=Value lines (Include
followed) and plugstack.conf's plugin lines (include followed), with the jobns SPANK
plugins they name. No finding is made here."""

from __future__ import annotations

import glob
import os

from jobns.launcher.commands.doctor.common import _regular_text


def slurm_conf_values(path: str) -> dict[str, str]:
    """slurm.conf's Key=Value lines (keys lower-cased; the last one wins; Include files
    followed one level)."""
    values: dict[str, str] = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.lower().startswith("include "):
            inc = line.split(None, 1)[1].strip()
            inc = inc if inc.startswith("/") else f"{os.path.dirname(path)}/{inc}"
            try:
                values.update(slurm_conf_values(inc))
            except OSError:
                pass
            continue
        key, eq, value = line.partition("=")
        if eq and " " not in key.strip():
            values[key.strip().lower()] = value.strip()
    return values


def _slurm_values_or_none(conf: str) -> dict[str, str] | None:
    """slurm.conf's values, or None where slurm() already said it cannot read it."""
    try:
        return slurm_conf_values(conf)
    except OSError:
        return None


def plugstack_lines(plugstack: str) -> list[tuple[str, list[str]]]:
    """(file, words) of each `required|optional PLUGIN ARGS...` line of plugstack.conf and
    the files it includes, as Slurm reads them (spank's _spank_conf_include): everything
    from `#` on is a comment, a relative `include` pattern is relative to the directory
    of the file that names it (never the cwd), its matches are read in sorted order."""
    out: list[tuple[str, list[str]]] = []

    def read(path: str, chain: tuple[str, ...]) -> None:
        text = _regular_text(path)
        if text is None:
            return
        for raw in text.splitlines():
            words = raw.split("#", 1)[0].split()
            if len(words) >= 2 and words[0] == "include":
                pattern = os.path.join(os.path.dirname(path), words[1])  # absolute stays
                for inc in sorted(glob.glob(pattern)):
                    if inc not in chain and len(chain) < 8:  # Slurm would loop; we stop
                        read(inc, (*chain, inc))
            elif len(words) >= 2 and words[0] in ("required", "optional"):
                out.append((path, words))

    read(plugstack, (plugstack,))
    return out


def _is_jobns_plugin(so: str) -> bool:
    return os.path.basename(so).startswith("jobns")


def spank_plugins(plugstack: str) -> list[tuple[str, str]]:
    """The jobns SPANK plugins (`required|optional /path/jobns*.so`) that plugstack.conf,
    or a file it includes, names: (required or optional, path)."""
    return [(w[0], w[1]) for _, w in plugstack_lines(plugstack) if _is_jobns_plugin(w[1])]


def plugstack_of(conf: str, values: dict[str, str]) -> str:
    """The plugstack.conf slurm.conf names (PlugStackConfig=), else the one beside it."""
    return values.get("plugstackconfig") or f"{os.path.dirname(conf)}/plugstack.conf"
