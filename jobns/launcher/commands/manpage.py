"""jobns(1), made from the same text as `--help` (launcher.commands.cli's COMMANDS and usage).

    python -m jobns.launcher.commands.manpage > jobns.1      (ci/install-python installs it)

Nothing here is written by hand twice: a subcommand or option added to launcher.commands.cli
appears in the man page the next time it is made (tests/unit/test_manpage.py checks).
"""

from __future__ import annotations

import sys

from jobns.launcher.commands.cli import COMMANDS, OPTIONAL, VALUE, VERSION, Command

NAME = "private /tmp, /var/tmp and /dev/shm for every batch job"


def esc(text: str) -> str:
    """Plain text as troff: backslashes and dashes escaped, no line read as a request."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + ln if ln[:1] in (".", "'") else ln for ln in text.split("\n"))


def synopsis(cmd: Command) -> str:
    tail = f" [\\fB\\-\\-\\fR] \\fI{esc(cmd.args)}\\fR [\\fIARG\\fR...]" if cmd.args else ""
    return f"\\fBjobns {esc(cmd.name)}\\fR [\\fIOPTIONS\\fR]{tail}"


def option_tag(name: str, kind: str, metavar: str) -> str:
    tag = f"\\fB{esc(name)}\\fR"
    if kind == VALUE:
        tag += f" \\fI{esc(metavar)}\\fR"
    elif kind == OPTIONAL:
        tag += f"[=\\fI{esc(metavar)}\\fR]"
    return tag


def paragraphs(text: str) -> list[str]:
    return [p for p in text.split("\n") if p.strip()]


def render() -> str:
    out = [
        f'.TH JOBNS 1 "" "jobns {VERSION}" "User Commands"',
        ".nh",
        ".ad l",
        ".SH NAME",
        f"jobns \\- {esc(NAME)}",
        ".SH SYNOPSIS",
        "\\fBjobns\\fR \\fISUBCOMMAND\\fR [\\fIOPTIONS\\fR] "
        "[\\fB\\-\\-\\fR \\fICOMMAND\\fR [\\fIARG\\fR...]]",
        ".br",
        "\\fBjobns \\-\\-version\\fR | \\fB\\-\\-help\\fR",
        ".SH DESCRIPTION",
        esc(
            "jobns gives every batch job, and every container of a job, its own /tmp, "
            "/var/tmp and /dev/shm: per-job directories bound over those paths inside a "
            "Linux mount namespace, removed when the job ends. `jobns SUBCOMMAND --help` "
            "prints a subcommand's section of this page."
        ),
        ".SH SUBCOMMANDS",
    ]
    for cmd in COMMANDS.values():
        out += [f".SS {esc(cmd.name)}", synopsis(cmd), ".PP", esc(cmd.summary) + "."]
        if cmd.help:
            for p in paragraphs(cmd.help):
                out += [".PP", esc(p)]
        for o in cmd.opts.values():
            out += [".TP", option_tag(o.name, o.kind, o.metavar), esc(o.help)]
        out += [".TP", "\\fB\\-h\\fR, \\fB\\-\\-help\\fR", "show this help"]
    out += [
        ".SH EXIT STATUS",
        ".TP",
        "\\fB0\\fR",
        esc("success (run: the command's own status is passed on)"),
        ".TP",
        "\\fB125\\fR",
        esc(
            "jobns itself failed; one line on stderr starting `jobns: ` says what and how to fix it"
        ),
        ".TP",
        "\\fB126\\fR, \\fB127\\fR",
        esc("run: the command could not be executed, or was not found"),
        ".TP",
        "\\fB128+N\\fR",
        esc("run: the command died of signal N"),
        ".SH ENVIRONMENT",
        ".TP",
        "\\fBJOBNS_CONFIG\\fR",
        esc("the config file when --config is not given (else /etc/jobns/jobns.toml)"),
        ".TP",
        "\\fBSLURM_JOB_ID\\fR, \\fBSLURM_JOB_USER\\fR, \\fBSLURM_JOB_UID\\fR",
        esc("the job and its user when --job-id and --user are not given"),
        ".TP",
        "\\fBJOBNS_DEBUG\\fR",
        esc("1: an internal error shows its traceback"),
        ".SH FILES",
        ".TP",
        "\\fB/etc/jobns/jobns.toml\\fR",
        esc("the configuration (TOML)"),
        ".TP",
        "\\fB/run/jobns\\fR",
        esc("state_dir: job records, locks, namespace pins, the last gc's summary"),
        ".SH LOGS",
        esc(
            "setup, teardown, gc and recover log one line per action and every failure "
            "to syslog (facility daemon, tag jobns), with the job id and user: "
            "journalctl -t jobns."
        ),
        ".SH SEE ALSO",
        "\\fBslurm.conf\\fR(5), \\fBsrun\\fR(1), \\fBunshare\\fR(1), "
        "\\fBsystemd.timer\\fR(5); README.md and docs/ of jobns",
    ]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
