"""slurm.conf's Prolog= and Epilog=: that they run jobns setup and teardown, name jobns by
a path slurmd finds without PATH, and set the STATE_DIR that jobns.toml and the SPANK
plugin name too; whether the prolog returns at once (the plugin's marker) and the
resident helper runs. slurm() is the first check of slurm.conf: it also asks
spank_plugin about plugstack.conf."""

from __future__ import annotations

import os
import re
import sys

from jobns.launcher.commands.doctor.common import NOTE, OK, PROBLEM, Finding, _regular_text, _shown
from jobns.launcher.commands.doctor.slurmconf import (
    _is_jobns_plugin,
    _slurm_values_or_none,
    plugstack_lines,
    plugstack_of,
    slurm_conf_values,
)
from jobns.launcher.commands.doctor.spank_plugin import SPANK_PLUGIN, spank, spank_build
from jobns.launcher.model import config as config_mod
from jobns.launcher.protocol.state import HELPER, HELPER_PID, TASKS_WAIT
from jobns.launcher.system import sysprog


def installed_jobns() -> str:
    """The jobns command of this installation, next to its interpreter: /usr/bin/jobns
    from the Debian package, /opt/jobns/venv/bin/jobns from ci/install-python. The
    hints name it, so they hold for either."""
    return os.path.join(os.path.dirname(sys.executable), "jobns")


def scripts_by_name(conf: str) -> list[Finding]:
    """slurmd runs the Prolog and Epilog with no PATH: a script that runs jobns by a name
    the shell's default search does not find fails every job (the node drains)."""
    try:
        values = slurm_conf_values(conf)
    except OSError:
        return []  # slurm() says so
    out: list[Finding] = []
    for key in ("prolog", "epilog"):
        for script in (p.strip() for p in values.get(key, "").split(",") if p.strip()):
            word = _jobns_word(script)
            if word is None or word.startswith("/"):
                continue
            try:
                sysprog.find(word)
            except sysprog.NotFound:
                out.append(
                    (
                        PROBLEM,
                        f"{key.capitalize()}={script} runs {word!r} by name, but slurmd gives "
                        "it no PATH; fix: name it by its absolute path (exec "
                        "/opt/jobns/venv/bin/jobns ...)",
                    )
                )
    return out


def _jobns_word(script: str) -> str | None:
    """The command word that runs jobns in a script (None if none is found)."""
    try:
        with open(script, encoding="utf-8", errors="replace") as f:
            text = f.read(65536)
    except OSError:
        return None
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        for i, w in enumerate(words):
            if (
                os.path.basename(w) == "jobns"
                and i + 1 < len(words)
                and words[i + 1] in ("setup", "teardown")
            ):
                return w
    return None


PLUGIN_DEFAULT_STATE_DIR = "/run/jobns"  # DEFAULT_STATE_DIR in jobns_spank.c


# A value doctor can compare without running the script: an absolute path of ordinary
# characters (no expansion, quoting or word splitting left for bash to do).
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9._/+@%:,=-]*")


def script_state_dir(text: str) -> str | None:
    """STATE_DIR in a packaged prolog or epilog (its unindented `STATE_DIR=/run/jobns #
    state_dir in jobns.toml` line), quotes around it dropped; None when the script has
    no such line (a site's own script)."""
    for raw in text.splitlines():
        if raw.startswith("STATE_DIR="):
            word = raw[len("STATE_DIR=") :].split(None, 1)
            value = word[0] if word else ""
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
                value = value[1:-1]
            return value
    return None


def plugin_state_dir(args: list[str]) -> str:
    """The state_dir a plugstack.conf line's arguments give jobns_spank.so: its last
    `state_dir=` (parse_args), else the plugin's default."""
    value = PLUGIN_DEFAULT_STATE_DIR
    for arg in args:
        if arg.startswith("state_dir="):
            value = arg[len("state_dir=") :]
    return value


def _same_dir(a: str, b: str) -> bool:
    return os.path.normpath(a) == os.path.normpath(b)


def state_dir_names(config: config_mod.Config, conf: str) -> list[Finding]:
    """jobns.toml's state_dir, the SPANK plugin's `state_dir=` (on the plugstack.conf line
    that loads it) and STATE_DIR in the packaged prolog and epilog (the files slurm.conf's
    Prolog= and Epilog= name) must be one directory: setup writes each job there, the
    plugin waits there for its run.env, the scripts look there for the plugin's marker
    and the helper. A mismatch passed every other check, then every task waited
    start_wait (60 s) and failed. Files are read, never run; a script that is not root's
    and writable by root only is not read (slurm() calls it a problem). No plugin line
    and a site's own scripts (no STATE_DIR line): nothing to compare."""
    values = _slurm_values_or_none(conf)
    if values is None:
        return []  # slurm() says why
    want = config.state_dir
    toml = config.source or config_mod.DEFAULT_PATH
    # (value, file, what names it there)
    named: list[tuple[str, str, str]] = [
        (want, toml, "state_dir" if config.source else "state_dir, unset: the default")
    ]
    for path, words in plugstack_lines(plugstack_of(conf, values)):
        if _is_jobns_plugin(words[1]):
            given = any(a.startswith("state_dir=") for a in words[2:])
            what = "the SPANK plugin's state_dir=" + ("" if given else ", unset: its default")
            named.append((plugin_state_dir(words[2:]), path, what))
    notes: list[Finding] = []
    for key in ("prolog", "epilog"):
        for script in (p.strip() for p in values.get(key, "").split(",") if p.strip()):
            value = _packaged_state_dir(script)
            if value is None:
                continue  # a site's own script: it runs jobns, which reads the config
            if not _PLAIN_PATH.fullmatch(value):
                notes.append(
                    (
                        NOTE,
                        f"{_shown(script)} sets STATE_DIR={_shown(value)}, which doctor "
                        f"does not expand: check that it is {_shown(want)} (state_dir in "
                        f"{_shown(toml)})",
                    )
                )
            else:
                named.append((value, script, "STATE_DIR"))
    if len(named) == 1:
        return notes
    wrong = [(v, f, w) for v, f, w in named[1:] if not _same_dir(v, want)]
    if not wrong:
        where = ", ".join(f"{_shown(f)} ({w})" for _, f, w in named)
        return [*notes, (OK, f"state_dir {_shown(want)} is the same in {where}")]
    listed = "; ".join(f"{_shown(v)} in {_shown(f)} ({w})" for v, f, w in named)
    harm = []
    if any(w != "STATE_DIR" for _, _, w in wrong):
        harm.append(
            "every task waits start_wait seconds (default 60) for a setup that writes "
            "elsewhere, then fails"
        )
    if any(w == "STATE_DIR" for _, _, w in wrong):
        harm.append(
            "the prolog and epilog look for the plugin's marker and the resident helper in "
            "another directory"
        )
    edits = []
    scripts = [_shown(f) for _, f, w in wrong if w == "STATE_DIR"]
    if scripts:
        edits.append(f"STATE_DIR={_shown(want)} in {' and '.join(scripts)}")
    edits += [
        f"state_dir={_shown(want)} on the {SPANK_PLUGIN} line of {_shown(f)}, then restart slurmd"
        for _, f, w in wrong
        if w != "STATE_DIR"
    ]
    fix = "; ".join(edits)
    theirs = {os.path.normpath(v) for v, _, _ in named[1:]}
    if len(theirs) == 1 and _PLAIN_PATH.fullmatch(other := theirs.pop()):
        # The others agree with each other: the config may be the one that moved.
        fix += f'; or state_dir = "{other}" in {_shown(toml)}, then restart jobns-helper'
    return [
        *notes,
        (
            PROBLEM,
            f"state_dir differs between the files that name it: {listed}: "
            f"{'; '.join(harm)}; fix: {fix}",
        ),
    ]


def _packaged_state_dir(script: str) -> str | None:
    """STATE_DIR of a Prolog= or Epilog= script if it is jobns's packaged one (root's,
    writable by root only, with the STATE_DIR line); None otherwise."""
    if not script.startswith("/"):
        return None  # relative to nothing doctor should guess (Slurm wants absolute)
    try:
        st = os.stat(script)
    except (OSError, ValueError):
        return None  # slurm() says so
    # doctor runs as root (require_root): the effective uid, so tests need none
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return None
    text = _regular_text(script)
    return script_state_dir(text) if text is not None else None


def slurm(conf: str, enforce: bool = False) -> list[Finding]:
    """Prolog=jobns setup, Epilog=jobns teardown, and the SPANK plugin if one is named
    (loaded exactly where the config says [slurm] enforce = true)."""
    try:
        values = slurm_conf_values(conf)
    except FileNotFoundError:
        return [
            (
                NOTE,
                f"no {conf}: Slurm is not configured yet, so its checks were skipped "
                "(--slurm-conf names another file; --no-slurm on a node without Slurm)",
            )
        ]
    except OSError as e:
        return [(PROBLEM, f"read {conf}: {e.strerror}")]
    out: list[Finding] = []
    for key, sub in (("prolog", "setup"), ("epilog", "teardown")):
        script = values.get(key, "")
        name = key.capitalize()
        want = f"jobns {sub}"
        if not script:
            out.append(
                (
                    PROBLEM,
                    f"{conf} has no {name}=; fix: {name}=/etc/jobns/slurm/{key} "
                    f"(a script that execs {want}; "
                    'docs/admin.md "Deploying on a Slurm cluster")',
                )
            )
            continue
        found = [p for p in script.split(",") if _runs(p.strip(), sub)]
        if found:
            out.append((OK, f"{name}={script} runs {want}"))
        else:
            out.append(
                (
                    PROBLEM,
                    f"{name}={script} does not run {want} (or is not a root-owned "
                    f"executable); fix: make it exec {installed_jobns()} {sub} "
                    f'--job-id "$SLURM_JOB_ID"',
                )
            )
    if values.get("jobcontainertype", "").endswith("tmpfs"):
        out.append(
            (
                NOTE,
                "JobContainerType=job_container/tmpfs is set too: Slurm's own "
                "private /tmp then sits under jobns's",
            )
        )
    plugstack = plugstack_of(conf, values)
    out += spank(plugstack, enforce)
    out += spank_build(plugstack, enforce)
    return out


def prolog_waits(state_dir: str, plugin_loaded: bool) -> list[Finding]:
    """Whether the packaged prolog returns at once (slurmd loaded the SPANK plugin, which
    made <state_dir>/tasks-wait) or waits for setup, and whether the resident helper
    runs (docs/admin.md "What the prolog and epilog wait for", "The resident helper").
    plugin_loaded: plugstack.conf loads a jobns SPANK plugin."""
    marker = f"{state_dir}/{TASKS_WAIT}"
    out: list[Finding] = []
    if os.path.exists(marker) and not plugin_loaded:
        out.append(
            (
                PROBLEM,
                f"{marker} is left by a slurmd that had the jobns SPANK plugin, which "
                "plugstack.conf no longer loads: the prolog would return before setup and no "
                f"task would wait for it; fix: rm {marker}",
            )
        )
    elif os.path.exists(marker):
        out.append((OK, "the prolog returns at once: slurmd loaded the SPANK plugin"))
    elif plugin_loaded:
        out.append(
            (
                NOTE,
                f"no {marker}: slurmd has not loaded the jobns SPANK plugin since it started, "
                "so the prolog waits for setup (~40 ms a job); restart slurmd",
            )
        )
    helper = _live_pid(f"{state_dir}/{HELPER}/{HELPER_PID}")
    if helper:
        out.append((OK, f"the resident helper runs (pid {helper})"))
    else:
        out.append(
            (
                NOTE,
                "the resident helper does not run: each setup and teardown starts Python "
                "(~25 ms more a job); systemctl enable --now jobns-helper.service",
            )
        )
    return out


def _live_pid(path: str) -> int:
    """The pid in the file at path if that process is alive, else 0."""
    try:
        with open(path) as f:
            pid = int(f.read().strip() or "0")
        if pid > 0:
            os.kill(pid, 0)
            return pid
    except (OSError, ValueError):
        pass
    return 0


def _runs(path: str, sub: str) -> bool:
    """A root-owned executable that runs `jobns <sub>` (or is jobns itself)."""
    try:
        st = os.stat(path)
        if st.st_uid != 0 or st.st_mode & 0o022 or not st.st_mode & 0o100:
            return False
        with open(path, "rb") as f:
            head = f.read(65536)
    except OSError:
        return False
    if head.startswith(b"\x7fELF"):
        return False
    text = head.decode(errors="replace")
    return "jobns" in text and (f" {sub}" in text or "launcher.commands.cli" in text)
