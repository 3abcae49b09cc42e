"""Measure which capabilities a node container needs for jobns (and munge).

For a privilege set, start a one-node rig and run every probe; then the same with
each capability removed in turn (and with docker's default seccomp profile). The
table says which probe fails without which capability, with the first error line.

    python -m containers.capprobe                     # table for privileges.MINIMUM
    python -m containers.capprobe --minimize          # greedy: drop whatever is not needed
    python -m containers.capprobe --caps SYS_ADMIN,SETUID,...   # table for another set
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from containers.dockerapi import connect
from containers.errors import RigError
from containers.privileges import MINIMUM, Privileges
from containers.rig import Rig, as_user
from containers.slurm import render_conf

# Docker 20.10's default set plus what a mount-namespace tool plausibly needs.
CANDIDATES = (
    "CHOWN",
    "DAC_OVERRIDE",
    "FSETID",
    "FOWNER",
    "MKNOD",
    "NET_RAW",
    "SETGID",
    "SETUID",
    "SETFCAP",
    "SETPCAP",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
    "KILL",
    "AUDIT_WRITE",
    "SYS_ADMIN",
    "NET_ADMIN",
    "SYS_PTRACE",
)

GONE = (
    "for p in /tmp/job-{id} /dev/shm/job-{id} /lustre/jobns/job-{id}; do "
    '[ ! -e "$p" ] || {{ echo "left behind: $p" >&2; exit 9; }}; done'
)
BODY = 'set -e; echo x > /tmp/f; echo y > /var/tmp/f; echo z > /dev/shm/f; [ "$(id -u)" = 1001 ]'
NET_BODY = '[ "$(ip -o link | wc -l)" = 1 ] && ip -o link show lo | grep -q "UP"'


def _job(job_id: int, flags: str, body: str, *, as_alice: bool, after: str = "") -> str:
    """A root shell line: run one job (as alice herself with as_alice), then check."""
    argv = ["jobns", "run", "--job-id", str(job_id), *flags.split(), "--", "sh", "-c", body]
    cmd = as_user("alice", argv) if as_alice else argv
    return f"{shlex.join(cmd)} && {after or GONE.format(id=job_id)}"


# (name, root shell script); each uses its own job id
PROBES: tuple[tuple[str, str], ...] = (
    ("su", "su alice -s /bin/sh -c 'test $(id -u) = 1001'"),
    ("root local", _job(11, "", BODY.replace("1001", "0"), as_alice=False)),
    ("--user local", _job(12, "--user alice", BODY, as_alice=False)),
    (
        "--user per-node",
        _job(13, "--user alice --use-shared-tmpdir=per-node", BODY, as_alice=False),
    ),
    (
        "--user shared --no-rm",
        _job(
            14,
            "--user alice --use-shared-tmpdir --no-rm-tmpdir",
            BODY,
            as_alice=False,
            after="test -e /lustre/jobns/job-14/tmp/f && rm -rf /lustre/jobns/job-14",
        ),
    ),
    ("unpriv local", _job(15, "", BODY, as_alice=True)),
    ("unpriv per-node", _job(16, "--use-shared-tmpdir=per-node", BODY, as_alice=True)),
    ("root --net none", _job(17, "--net none", NET_BODY, as_alice=False)),
    ("--user --net none", _job(18, "--user alice --net none", NET_BODY, as_alice=False)),
    ("unpriv --net none", _job(19, "--net none", NET_BODY, as_alice=True)),
    # root must be able to SIGKILL a task of the user that ignores SIGTERM
    (
        "kill escalation",
        "timeout -s TERM 2 jobns run --job-id 20 --user alice --kill-wait 1 -- "
        "sh -c 'trap \"\" TERM; sleep 57'; sleep 1.5; "
        "if pgrep -u alice -x sleep >/dev/null; then echo 'the task outlived jobns' >&2; "
        "exit 1; fi; " + GONE.format(id=20),
    ),
    # a later step (or the OCI hook) joins a running job's mount namespace as root
    (
        "setns into job",
        "jobns run --job-id 21 --user alice -- sh -c 'echo in > /tmp/marker; exec sleep 20' & "
        "for i in $(seq 50); do pid=$(pgrep -u alice -x sleep) && break; sleep 0.1; done; "
        "[ -n \"$pid\" ] || { echo 'the job did not start' >&2; exit 1; }; "
        'out=$(nsenter -t "$pid" -m cat /tmp/marker); kill "$pid"; wait; '
        '[ "$out" = in ] && ' + GONE.format(id=21),
    ),
    (
        "munged",
        "install -d -o munge -g munge -m 0755 /run/munge && "
        "su -s /bin/sh munge -c /usr/sbin/munged && munge -n | unmunge >/dev/null",
    ),
    # a one-node cluster (controller and compute in this node): slurmd/slurmstepd's needs
    (
        "slurm srun",
        "pgrep -x munged >/dev/null || { install -d -o munge -g munge /run/munge "
        "&& su -s /bin/sh munge -c /usr/sbin/munged; } && slurmctld && slurmd && "
        "for i in $(seq 100); do sinfo -h -o %t | grep -qx idle && break; sleep 0.2; done; "
        "out=$(su alice -c 'srun -N1 -t 1 id -u') && [ \"$out\" = 1001 ] || "
        '{ echo "srun: $out"; tail -n 3 /var/log/slurm/slurmd.log; exit 1; }',
    ),
)


def probe(client: Any, image: str, privileges: Privileges) -> dict[str, str]:
    """{probe name: "" if it passed, else its first error line}."""
    results: dict[str, str] = {}
    try:
        with Rig(image, 1, client=client, privileges=privileges, log=lambda m: None) as rig:
            node = rig.nodes[0]
            conf = render_conf(node.hostname, [node.hostname])
            node.exec(["sh", "-c", f"cat > /etc/slurm/slurm.conf <<'EOF'\n{conf}EOF"]).check(
                "write slurm.conf"
            )
            for name, script in PROBES:
                r = node.sh(script, timeout=30)
                if r.exit_code == 0:
                    results[name] = ""
                else:
                    lines = [ln for ln in (r.stderr + r.stdout).splitlines() if ln.strip()]
                    results[name] = (lines[-1] if lines else f"exit {r.exit_code}")[:110]
    except RigError as e:  # e.g. the container does not start at all
        results = {name: f"rig: {str(e).splitlines()[0]}"[:110] for name, _ in PROBES}
    return results


def variants(base: Privileges) -> list[Privileges]:
    """base; base without each capability; base with seccomp switched (on <-> off)."""
    out = [base] + [base.without(c) for c in base.cap_add]
    opts = tuple(o for o in base.security_opt if o != "seccomp=unconfined")
    if opts != base.security_opt:
        out.append(Privileges(f"{base.name} +default-seccomp", base.cap_add, base.cap_drop, opts))
    else:
        out.append(
            Privileges(
                f"{base.name} +seccomp=unconfined",
                base.cap_add,
                base.cap_drop,
                (*opts, "seccomp=unconfined"),
            )
        )
    return out


def table(client: Any, image: str, base: Privileges, jobs: int) -> list[tuple[str, dict[str, str]]]:
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [(v, pool.submit(probe, client, image, v)) for v in variants(base)]
        return [(v.name.removeprefix(base.name) or "(all)", f.result()) for v, f in futures]


def minimize(
    client: Any, image: str, caps: tuple[str, ...], security: tuple[str, ...]
) -> tuple[str, ...]:
    """Greedy: drop each capability whose absence breaks no probe (in order)."""
    keep = list(caps)
    for cap in caps:
        trial = Privileges("trial", tuple(c for c in keep if c != cap), ("ALL",), security)
        failed = {k: v for k, v in probe(client, image, trial).items() if v}
        print(
            f"  without {cap:<16} {'needed: ' + ', '.join(failed) if failed else 'not needed'}",
            file=sys.stderr,
            flush=True,
        )
        if not failed:
            keep.remove(cap)
    return tuple(keep)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m containers.capprobe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--image", help="node image (default: build or reuse the current one)")
    ap.add_argument("--caps", help="comma-separated set to tabulate (default: MINIMUM)")
    ap.add_argument(
        "--minimize",
        action="store_true",
        help="start from docker's defaults + SYS_ADMIN, NET_ADMIN, SYS_PTRACE",
    )
    ap.add_argument("-j", "--jobs", type=int, default=4, help="variants probed at once")
    args = ap.parse_args(argv)
    try:
        client = connect()
        if args.image is None:
            from containers import images

            args.image = images.build(client).node
        base = MINIMUM
        if args.caps:
            base = Privileges("set", tuple(args.caps.split(",")), ("ALL",), MINIMUM.security_opt)
        t = time.monotonic()
        if args.minimize:
            full = probe(
                client, args.image, Privileges("cand", CANDIDATES, ("ALL",), MINIMUM.security_opt)
            )
            if any(full.values()):
                print(f"candidate set fails already: {full}", file=sys.stderr)
                return 1
            kept = minimize(client, args.image, CANDIDATES, MINIMUM.security_opt)
            print("minimum:", ",".join(kept))
            base = Privileges("min", kept, ("ALL",), MINIMUM.security_opt)
        rows = table(client, args.image, base, args.jobs)
    except RigError as e:
        print(f"containers.capprobe: {e}", file=sys.stderr)
        return 1
    names = [n for n, _ in PROBES]
    print(
        f"set: cap_drop=ALL cap_add={','.join(base.cap_add)} "
        f"security_opt={','.join(base.security_opt) or 'default'}"
    )
    print("| without | fails |\n|---|---|")
    for label, res in rows:
        bad = [f"{n}: `{res[n]}`" for n in names if res.get(n)]
        print(f"| {label.strip()} | {'<br>'.join(bad) or 'nothing'} |")
    print(f"({time.monotonic() - t:.0f}s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
