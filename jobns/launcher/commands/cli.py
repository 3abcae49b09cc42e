"""Command-line front: `jobns SUBCOMMAND [OPTIONS] [-- COMMAND...]`.

argparse costs ~8-20 ms to import and jobns runs once per task, so this is a
small table-driven parser: each subcommand lists its options (which also make
its --help), and its implementation module is imported only when it runs.
"""

from __future__ import annotations

import sys

from jobns.launcher.system.errors import EXIT_JOBNS_FAILED, EXIT_OK, JobnsError

VERSION = "0.1.0"

FLAG, VALUE, OPTIONAL = "flag", "value", "optional"


class Opt:
    __slots__ = ("help", "kind", "metavar", "name")

    def __init__(self, name: str, kind: str, help: str, metavar: str = "") -> None:
        self.name = name
        self.kind = kind
        self.help = help
        self.metavar = metavar


class Command:
    __slots__ = ("args", "handler", "help", "name", "opts", "summary")

    def __init__(
        self, name: str, handler: str, summary: str, opts: list[Opt], args: str = "", help: str = ""
    ) -> None:
        self.name = name
        self.handler = handler  # "module:function", imported on use
        self.summary = summary
        self.opts = {o.name: o for o in opts}
        self.args = args  # "COMMAND" when the subcommand takes a trailing command
        self.help = help


JOB_ID = Opt("--job-id", VALUE, "job id (default: $SLURM_JOB_ID)", "ID")
RUN_JOB_ID = Opt(
    "--job-id",
    VALUE,
    "job id (default: $SLURM_JOB_ID, else a new job of this command only, "
    "id run-PID-HEX, in $JOBNS_JOB_ID)",
    "ID",
)
USER = Opt(
    "--user",
    VALUE,
    "job user, name or uid (default: $SLURM_JOB_USER, "
    "$SLURM_JOB_UID, else you); only root may name another user",
    "USER",
)
SHARED = Opt(
    "--use-shared-tmpdir",
    OPTIONAL,
    "put /tmp and /var/tmp under shared_base (=per-node: one directory per node)",
    "per-node",
)
NO_RM = Opt("--no-rm-tmpdir", FLAG, "keep the shared directories after the job")
CONFIG = Opt(
    "--config",
    VALUE,
    "config file (default: $JOBNS_CONFIG, else /etc/jobns/jobns.toml, else built-in defaults)",
    "PATH",
)
KILL_WAIT = Opt(
    "--kill-wait",
    VALUE,
    "seconds between SIGTERM and SIGKILL (default: kill_wait from the config, 30)",
    "SECONDS",
)
NET = Opt("--net", VALUE, "host (default) or none: a private network with only lo", "host|none")
DRY_RUN = Opt("--dry-run", FLAG, "print the plan (directories, mounts, environment); touch nothing")

SCRIPT = Opt("--script", VALUE, "read #JOBNS directives from this batch script", "FILE")
DIRECTIVES = Opt(
    "--directives",
    VALUE,
    "directives like sbatch --bb, ';'-separated, e.g. 'shared_tmpdir=per-node; no_rm_tmpdir'",
    "TEXT",
)
BACKGROUND = Opt(
    "--background",
    FLAG,
    "started by a prolog or epilog that did not wait (nobody reads the exit status): a "
    "failure of the node's drains it through scontrol, and a failed setup fails the "
    "job's tasks at once",
)
FORCE = Opt("--force", FLAG, "after repeated failures, forget the job's record anyway")
HURRY = Opt(
    "--hurry",
    FLAG,
    "skip the post-run program and stage-out, and remove scratch "
    "without moving its content back (like scancel --hurry): what was not staged "
    "out is lost",
)
SESSION_DIR = Opt(
    "--session-dir",
    VALUE,
    "the job's ARC session directory, "
    "<session root>/<arc-job-id>: moved into scratch before the job, back "
    "after it (default: [staging] session_dir)",
    "PATH",
)
RECOVER_JOB = Opt("--job-id", VALUE, "only this job (default: every job on this node)", "ID")
FORMAT = Opt(
    "--format",
    VALUE,
    "sh (quoted export lines for eval), slurm (a Slurm "
    "TaskProlog: verbatim export lines; makes the PMIx directories) or json",
    "sh|slurm|json",
)
JSON = Opt("--json", FLAG, "machine-readable output")
GC_DRY = Opt("--dry-run", FLAG, "say what would be removed; remove nothing")
NO_SLURM = Opt("--no-slurm", FLAG, "do not ask Slurm which jobs are alive; use recorded state")
STATUS_FORMAT = Opt(
    "--format",
    VALUE,
    "table (default), json (as --json) or prometheus "
    "(node_exporter textfile format: bytes used, capacities, jobs by state, "
    "teardown failures, what the last gc found)",
    "table|json|prometheus",
)
STATUS_OUTPUT = Opt(
    "--output",
    VALUE,
    "with --format prometheus: replace FILE atomically "
    "(mode 0644) instead of printing, e.g. for node_exporter's textfile "
    "directory",
    "FILE",
)
SLURM_CONF = Opt(
    "--slurm-conf",
    VALUE,
    "Slurm's configuration to check (default: $SLURM_CONF, else /etc/slurm/slurm.conf)",
    "PATH",
)
DOCTOR_NO_SLURM = Opt(
    "--no-slurm",
    FLAG,
    "a node that runs jobns without Slurm (jobns run, containers): skip Slurm's checks",
)
COMMENT = Opt(
    "--comment",
    VALUE,
    "the job's comment, as given to sbatch --comment (default: the script's #SBATCH --comment)",
    "TEXT",
)
CDI_DIR = Opt(
    "--cdi-dir", VALUE, "the CDI spec directory to check (default: [cdi] dir, else /etc/cdi)", "DIR"
)

COMMANDS: dict[str, Command] = {
    c.name: c
    for c in [
        Command(
            "run",
            "jobns.launcher.commands.run:main",
            "run COMMAND with the job's private /tmp, /var/tmp and /dev/shm",
            [RUN_JOB_ID, USER, SHARED, NO_RM, KILL_WAIT, CONFIG, NET, DRY_RUN],
            args="COMMAND",
            help="Runs COMMAND in a mount namespace where /tmp, /var/tmp and /dev/shm are the "
            "job's own directories, supervises it like slurmstepd supervises a task, and "
            "removes the directories when the job's last task on this node ends.\n"
            "Exit status: COMMAND's; 128+N if it died of signal N; 125 if jobns failed "
            "before COMMAND ran; 126 not executable; 127 not found.\n"
            "If `jobns setup` prepared the job on this node, COMMAND joins the job's "
            "namespace and the options given to setup apply.\n"
            "Outside Slurm, with no --job-id, COMMAND is a job of its own: a new id "
            "(run-PID-HEX, never a Slurm job id) and directories removed when it ends.",
        ),
        Command(
            "setup",
            "jobns.launcher.commands.setup:main",
            "prolog (root): make the job's directories and one namespace for all its tasks",
            [
                JOB_ID,
                USER,
                SHARED,
                NO_RM,
                KILL_WAIT,
                CONFIG,
                SCRIPT,
                DIRECTIVES,
                SESSION_DIR,
                DRY_RUN,
                BACKGROUND,
            ],
            help="Creates the job's directories and a mount namespace (inside a user namespace "
            "owned by the job user) that every later `jobns run` of the job joins, pinned "
            "under state_dir. Idempotent. Run as root, e.g. as Slurm's Prolog. Options "
            "may also come from #JOBNS directives (--script, --directives) and, under "
            "Slurm, from the job's comment: "
            "sbatch --comment 'jobns: shared_tmpdir=per-node'. Directives also set "
            "capacities (#JOBNS shm|tmp capacity=SIZE: a size-limited /dev/shm or "
            "/tmp) and staging (#JOBNS stage_in|stage_out source=... destination=...); "
            "only setup applies them, a standalone `jobns run` never does.\n"
            "States: pending, staging-in (directories, capacities, stage-in), staged-in, "
            "pre-run ([lifecycle] pre_run), running. A failing stage-in or pre-run tears "
            "the job down (inputs back in the session directory) and exits 125.",
        ),
        Command(
            "teardown",
            "jobns.launcher.commands.teardown:main",
            "epilog (root): end the job's processes, stage out, remove its directories",
            [JOB_ID, CONFIG, FORCE, HURRY, BACKGROUND],
            help="States: post-run (no task may join; terminates what still runs in the job: "
            "SIGCONT+SIGTERM, kill_wait, SIGKILL; [lifecycle] post_run), staging-out "
            "(stage_out copies; scratch back to the session directory), teardown "
            "(unpins, ends what joined late, detaches capacities, renames the directories "
            "out of the job's way, keeping shared ones under --no-rm-tmpdir, and removes "
            "the state), complete; a process of its own then removes the renamed "
            "directories (jobns recover or gc finish it after a crash), so a requeued job "
            "of the same id gets fresh ones at once. A failing stage-out keeps "
            "the job in staging-out with every output whole in scratch or the session "
            "directory (exit 125): run teardown again to resume. Safe to run twice. "
            "The teardown state is tried 3 times; then the job is kept as teardown-fail "
            "and the exit status is 125.",
        ),
        Command(
            "bb",
            "jobns.launcher.commands.bb:main",
            "burst buffer (root, on the controller): the steps burst_buffer.lua runs",
            [
                Opt("--job-id", VALUE, "the Slurm job (a number)", "ID"),
                CONFIG,
                Opt("--uid", VALUE, "setup: the job's user id", "UID"),
                Opt("--gid", VALUE, "setup: the job's group id", "GID"),
                Opt("--script", VALUE, "setup: the batch script slurmctld saved", "PATH"),
                Opt("--size", VALUE, "setup: bytes Slurm reserved in the pool", "BYTES"),
                Opt("--comment", VALUE, "setup: the job's comment", "TEXT"),
                Opt("--work-dir", VALUE, "setup: the job's working directory (%d)", "DIR"),
                Opt("--job-name", VALUE, "setup: the job's name (%x)", "NAME"),
                Opt("--tmp-mib", VALUE, "setup: the job's --tmp, MiB", "N"),
                Opt("--array-job-id", VALUE, "setup: its array job (%A)", "ID"),
                Opt("--array-task-id", VALUE, "setup: its array task (%a)", "ID"),
                Opt(
                    "--ask-slurm",
                    FLAG,
                    "setup: take comment, work dir, name, --tmp and array ids from squeue "
                    "(Slurm 22.05 gives the burst buffer no job_info)",
                ),
                Opt("--hurry", FLAG, "teardown: Slurm hurries (discard kept outputs too)"),
            ],
            args="STEP",
            help="STEP: setup (read and check the job's directives, make its shared "
            "tmpdir, record what the prolog needs), data-in (its stage_in copies into the "
            "shared tmpdir, as the job's user), data-out (its stage_out copies out of it), "
            "teardown (remove the shared tmpdir and the record; after a failed stage-out "
            "they are kept unless --hurry), pools (measure shared_base and write the pool "
            "slurm_bb_pools reads), status (the pool and every job's buffer: `scontrol "
            "show bbstat`). Options go before STEP. Every step is idempotent; exit 125 "
            'with one line on failure. See docs/admin.md "The burst buffer".',
        ),
        Command(
            "helper",
            "jobns.launcher.commands.helper:main",
            "the resident helper (root): runs the prolog's setups and the epilog's teardowns",
            [CONFIG],
            help="Runs until SIGTERM (a systemd service: jobns-helper.service). The packaged "
            "Slurm prolog and epilog hand it each job through <state_dir>/helper while it "
            "runs, and start jobns themselves when it does not: it saves each job the "
            "interpreter's start and jobns's imports (~25 ms for a setup, as much for a "
            "teardown). Each job runs in a child of its own, as `jobns setup|teardown "
            "--background` would.",
        ),
        Command(
            "recover",
            "jobns.launcher.commands.recover:main",
            "after a crash or restart: finish what was interrupted, by state (root)",
            [RECOVER_JOB, CONFIG],
            help="For every job on this node whose lock nobody holds (or --job-id), acts by "
            "its recorded state as Slurm does after a slurmctld restart: "
            "pending/staging-in/staged-in: teardown (inputs back), then set up again; "
            "pre-run: pre-run again; running: nothing; post-run/staging-out: post-run "
            "again, then stage-out and teardown; teardown/teardown-fail: teardown again; "
            "complete: forget. Exit 125 if any job could not be recovered.",
        ),
        Command(
            "env",
            "jobns.launcher.commands.report:env_main",
            "print the job environment (TMPDIR, PMIx, ARC)",
            [JOB_ID, USER, SHARED, CONFIG, FORMAT],
        ),
        Command(
            "status",
            "jobns.launcher.commands.report:status_main",
            "every job jobns holds on this node, with bytes used and per-user totals",
            [CONFIG, JSON, STATUS_FORMAT, STATUS_OUTPUT],
        ),
        Command(
            "gc",
            "jobns.launcher.commands.gc:main",
            "remove what is left of jobs that no longer exist (root)",
            [CONFIG, GC_DRY, NO_SLURM],
        ),
        Command(
            "doctor",
            "jobns.launcher.commands.doctor:main",
            "check this node's readiness for jobns and say what to fix (root)",
            [CONFIG, SLURM_CONF, CDI_DIR, DOCTOR_NO_SLURM],
            help="Checks the kernel's user-namespace settings (user.max_user_namespaces, "
            "kernel.unprivileged_userns_clone), loop devices (/dev/loop-control), the "
            "state directory (root's, not writable by others, POSIX ACLs), the bases "
            "(root's, sticky if world-writable, their file systems), the propagation "
            "of / (shared, so host mounts made later reach running jobs), slurm.conf's "
            "Prolog, Epilog and PlugStackConfig (and a jobns SPANK plugin named in "
            "plugstack.conf), and the CDI directory. Prints one line per check: 'ok:', "
            "'note:' (worth knowing, not a problem) or 'problem:' with what to fix; a "
            "check is a problem only where this node's configuration uses what it checks. "
            "The last line is the verdict, and names what could not be checked yet (no "
            "slurm.conf: Slurm is not configured yet; an enforced node whose slurmd has "
            "not loaded the plugin): run it again after that, and after every change.\n"
            "Exit status: 0 when the node is ready, 125 when a problem was found or a part "
            "of the deployment could not be checked yet.",
        ),
        Command(
            "check",
            "jobns.launcher.commands.check:main",
            "check a job's #JOBNS directives before submitting it (any user)",
            [SCRIPT, COMMENT, DIRECTIVES, CONFIG],
            help="Reads the directives as the prolog's `jobns setup` would (a batch "
            "script's #JOBNS lines, the job comment, --directives) and plans the job's "
            "capacities and staging against this node's configuration, without root and "
            "without touching anything. Prints one line saying what the job would get, "
            "or the reason setup would refuse it (the line each of its tasks would print). "
            "Sizes the prolog takes from Slurm (tmp_from_slurm, shm_memory_fraction) and "
            "the stage-in sources themselves are checked only when the job runs.\n"
            "Exit status: 0 when setup would take the job, 125 when it would refuse it "
            "(or the check itself failed).",
        ),
        Command(
            "hook",
            "jobns.hook.hook:main",
            "OCI hook (root): the job's /tmp, /var/tmp and /dev/shm for a container",
            [
                CONFIG,
                Opt(
                    "--job-id",
                    VALUE,
                    "a job jobns setup prepared on this node (the "
                    "hook in a job's CDI spec passes it); without it, as below",
                    "ID",
                ),
            ],
            args="STAGE",
            help="Run by runc, crun or Podman with the container's state on stdin. "
            "createRuntime (or prestart): makes the job's directories (or uses the ones "
            "jobns setup made) and binds them over the container's /tmp, /var/tmp and "
            "/dev/shm; for a job no prolog set up, a holder process keeps the "
            "directories while the container runs and the job's last user removes them. "
            "poststop (accepted, not needed): releases a hold whose holder was killed. "
            "Without STAGE, the state's status decides "
            "(creating/created: createRuntime, stopped: poststop).\n"
            "The job comes from annotations org.jobns.job-id, org.jobns.user, "
            "org.jobns.shared-tmpdir, org.jobns.no-rm-tmpdir, else SLURM_JOB_ID/"
            "SLURM_JOB_USER in the container's environment, else the container id and "
            "its process user. Exit status 125 (aborting the container) on failure.",
        ),
        Command(
            "oci-config",
            "jobns.hook.oci_config:main",
            "add the job's mounts, environment and hooks to an OCI bundle's config.json",
            [
                JOB_ID,
                USER,
                SHARED,
                NO_RM,
                CONFIG,
                Opt("--dry-run", FLAG, "print the new config.json; change nothing"),
            ],
            args="BUNDLE",
            help="Rewrites BUNDLE/config.json atomically: bind mounts of the job's directories "
            "at /tmp, /var/tmp and /dev/shm (rbind,nosuid,nodev), the job environment "
            "(TMPDIR, PMIx, RUNTIME_*) in process.env, the job's annotations, and, unless "
            "jobns setup prepared the job on this node, a jobns hook createRuntime hook "
            "whose holder keeps and finally removes the directories. Makes the "
            "directories. The job: the flags, else as for jobns hook.",
        ),
    ]
}


def usage() -> str:
    lines = [
        "usage: jobns SUBCOMMAND [OPTIONS] [-- COMMAND [ARG...]]",
        "",
        "Private /tmp, /var/tmp and /dev/shm for every batch job.",
        "",
        "subcommands:",
    ]
    lines += [f"  {c.name:<12} {c.summary}" for c in COMMANDS.values()]
    lines += ["", "`jobns SUBCOMMAND --help` for its options. Exit 125: jobns itself failed."]
    return "\n".join(lines)


def command_help(cmd: Command) -> str:
    head = f"usage: jobns {cmd.name} [OPTIONS]" + (f" [--] {cmd.args} [ARG...]" if cmd.args else "")
    lines = [head, "", cmd.help or cmd.summary, "", "options:"]
    for o in cmd.opts.values():
        spec = o.name + (
            f" {o.metavar}" if o.kind == VALUE else f"[={o.metavar}]" if o.kind == OPTIONAL else ""
        )
        lines.append(f"  {spec:<28} {o.help}")
    lines.append(f"  {'-h, --help':<28} show this help")
    return "\n".join(lines)


def parse(cmd: Command, argv: list[str]) -> tuple[dict[str, str | bool | None], list[str]]:
    """Options as {name without dashes, '-' -> '_': value}; and the trailing command."""
    opts: dict[str, str | bool | None] = {
        o.name[2:].replace("-", "_"): None for o in cmd.opts.values()
    }
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return opts, argv[i + 1 :]
        if arg in ("-h", "--help"):
            opts["help"] = True
            i += 1
            continue
        if not arg.startswith("-") or arg == "-":
            if cmd.args and "--" in argv[i + 1 :]:
                # `run --use-shared-tmpdir per-node -- cmd`: the word before `--` is not the
                # command (it would run `per-node`), and not the option's value either.
                prev = cmd.opts.get(argv[i - 1]) if i else None
                hint = (
                    f"; did you mean {prev.name}={arg}?"
                    if prev is not None and prev.kind == OPTIONAL
                    else ""
                )
                raise JobnsError(
                    f"{cmd.name}: unexpected argument {arg!r} before '--'"
                    f"{hint} (see jobns {cmd.name} --help)"
                )
            if cmd.args:
                return opts, argv[i:]
            raise JobnsError(
                f"{cmd.name}: unexpected argument {arg!r} (see jobns {cmd.name} --help)"
            )
        name, eq, value = arg.partition("=")
        opt = cmd.opts.get(name)
        if opt is None:
            raise JobnsError(f"{cmd.name}: unknown option {name!r} (see jobns {cmd.name} --help)")
        key = name[2:].replace("-", "_")
        if opt.kind == FLAG:
            if eq:
                raise JobnsError(f"{cmd.name}: {name} takes no value")
            opts[key] = True
        elif opt.kind == OPTIONAL:
            opts[key] = value if eq else ""
        else:
            if not eq:
                i += 1
                if i >= len(argv):
                    raise JobnsError(f"{cmd.name}: {name} needs a value ({opt.metavar})")
                value = argv[i]
            opts[key] = value
        i += 1
    return opts, []


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        # The console script: skip interpreter finalisation (~2 ms per task); there is
        # nothing to clean up that the kernel does not, once our output is flushed.
        code = dispatch(sys.argv[1:])
        import os

        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (BrokenPipeError, ValueError):
                code = code or EXIT_JOBNS_FAILED  # the reader left before our last line
        os._exit(code)
    return dispatch(argv)


# they log to syslog too (launcher.system.log)
LOGGED = ("setup", "teardown", "gc", "recover", "bb")


def dispatch(argv: list[str]) -> int:
    cmd = None
    opts: dict[str, str | bool | None] = {}
    try:
        if not argv or argv[0] in ("-h", "--help", "help"):
            print(usage())
            return EXIT_OK if argv else EXIT_JOBNS_FAILED
        if argv[0] == "--version":
            print(f"jobns {VERSION}")
            return EXIT_OK
        cmd = COMMANDS.get(argv[0])
        if cmd is None:
            raise JobnsError(f"unknown subcommand {argv[0]!r} (see jobns --help)")
        opts, command = parse(cmd, argv[1:])
        if opts.get("help"):
            print(command_help(cmd))
            return EXIT_OK
        module, _, func = cmd.handler.partition(":")
        handler = getattr(__import__(module, fromlist=[func]), func)
        _log(cmd, opts, None, None)
        code = int(handler(opts, command))
        _log(cmd, opts, code, None)
        return code
    except JobnsError as e:
        sys.stderr.write(f"jobns: {e}\n")
        _log(cmd, opts, e.code, str(e))
        return e.code
    except KeyboardInterrupt:
        return EXIT_JOBNS_FAILED
    except BrokenPipeError:
        # `jobns status | head`: the reader left; nothing more to say, and say it quietly.
        _silence_stdout()
        return EXIT_JOBNS_FAILED
    except Exception as e:  # the boundary: a bug must not look like the command's exit 1
        import os

        if os.environ.get("JOBNS_DEBUG") == "1":
            import traceback

            traceback.print_exc()
        where = f"jobns {argv[0]}" if cmd is not None else "jobns"
        sys.stderr.write(
            f"jobns: internal error in {where}: {type(e).__name__}: {e} "
            "(a bug in jobns; JOBNS_DEBUG=1 shows the traceback)\n"
        )
        _log(cmd, opts, EXIT_JOBNS_FAILED, f"internal error: {type(e).__name__}: {e}")
        return EXIT_JOBNS_FAILED


def _log(
    cmd: Command | None, opts: dict[str, str | bool | None], code: int | None, error: str | None
) -> None:
    """setup, teardown, gc and recover log their start context and outcome to syslog."""
    if cmd is None or cmd.name not in LOGGED or opts.get("dry_run") or opts.get("help"):
        return
    from jobns.launcher.system import log

    log.command_line(cmd.name, opts, code, error)


def _silence_stdout() -> None:
    import os

    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
