"""The installed `jobns` command: pyproject's [project.scripts] names main().

So the script pip writes into a venv, and Debian's installer into /usr/bin, is the
program that runs: nothing rewrites it after installation. jobns runs once per task, so
its start-up is launch time; main() keeps what was measured to pay on `jobns run`
(ci/bench-entry: `jobns run -- /bin/true` joining a set-up job, as its user, medians of
interleaved runs, against the venv's `python -I -c pass`):

* the byte-code loader (bytecode.py, beside it): the launch path's modules straight from
  their pyc, the collector paused while they load: 1.30x the bare interpreter, 1.38x
  without it (~1.5 ms a task);
* a root jobns whose environment holds a PYTHON* variable (other than the HARMLESS
  ones below) starts again isolated (`python -I`), so that a stray PYTHONPATH,
  PYTHONPYCACHEPREFIX or PYTHONWARNINGS in root's environment decides nothing after
  this module's own import. It costs nothing
  when there is none, which is always on a node: root's callers (slurmd's prolog and
  epilog, the runtime's OCI hook from hooks.d, systemd units) set root's environment,
  never a job user's. A user's own `jobns run` keeps her environment: it runs with her
  rights, so her PYTHON* variables only change what she could run anyway, and conda
  users, who set PYTHONPATH, would pay a second interpreter start per task.

What a console script cannot have: options on its #! line (pip writes the bare
interpreter there), so Python starts with `site` and reads PYTHON* variables before any
of jobns runs. `-IS` would save ~2 ms more (1.20x: the script ci/install-python used to
write over pip's); the byte-code loader keeps pip's script within the 1.5x goal without
it. The script Debian 12's pip 23.0.1 and installer 0.6 (the .deb's) write imports `re`
first (~0.5x the bare interpreter: 1.84x), which nothing in the package can undo.

The hot set (bytecode.HOT: the modules `jobns run` and the OCI hook import, measured by
tests/integration/test_hot_set.py) runs per task or per container, so it imports only
jobns's own modules and the C-backed standard modules `os` and `sys` already load, and
only it uses the speed tricks docs/speed.md lists ("The hot set"). Setup, teardown, the
helper, gc and doctor are plain Python: the resident helper pays their imports once.
"""

from __future__ import annotations

import sys

from jobns.launcher.commands import bytecode


def main() -> None:
    if not sys.flags.isolated:
        isolate_root()
    bytecode.start(sys.argv)
    from jobns.launcher.commands.cli import main as cli_main

    bytecode.loaded()
    cli_main()


# PYTHON* variables that decide no code, no path and no input of root's: CI machines and
# containers set the first two everywhere, and re-executing for them doubled the start of
# every root `jobns run` there (2.5x the bare interpreter instead of 1.5x, measured).
HARMLESS = frozenset(
    ("PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONNOUSERSITE", "PYTHONSAFEPATH")
)


def isolate_root() -> None:
    """Re-execute root's jobns as `python -I` if a PYTHON* variable other than the
    HARMLESS ones is set."""
    import os  # already loaded by site

    if os.geteuid() == 0 and any(
        name.startswith("PYTHON") and name not in HARMLESS for name in os.environ
    ):
        argv = [sys.executable, "-I", *sys.orig_argv[1:]]
        os.execv(sys.executable, argv)  # noqa: S606 -- the same interpreter, script, arguments
