"""`jobns status --format prometheus`: node_exporter textfile-collector metrics.

    jobns status --format prometheus > /var/lib/prometheus/node-exporter/jobns.prom.$$ &&
        mv /var/lib/prometheus/node-exporter/jobns.prom.$$ .../jobns.prom

What reaches Prometheus: every job's bytes used and capacities (from `jobns status`),
jobs by state (every state, zeros included, so alerts see a series go to 0), failed
epilogs of the jobs kept on the node, and what the last `jobns gc` found. gc writes its
findings to <state_dir>/gc.json (root's, 0600; write_gc_summary), status reads them back.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

from jobns.launcher.backing import fs
from jobns.launcher.backing.sizelimit import owner
from jobns.launcher.model.plan import Tree
from jobns.launcher.model.record import TreeRecord
from jobns.launcher.mountns.dirs import is_cover
from jobns.launcher.protocol import state
from jobns.launcher.protocol.state import STATES
from jobns.launcher.system import files
from jobns.launcher.system.errors import JobnsError
from jobns.launcher.system.mountinfo import Mount

GC_FIELDS = ("dead_jobs", "unknown_to_slurm", "leftovers", "problems")
EXTRA_STATES = ("standalone", "leftover", "unreadable")  # status's states without a record


def write_gc_summary(state_dir: str, counts: dict[str, int]) -> None:
    """What this gc run found, for the metrics (root only; a failure to write is no
    failure of gc)."""
    doc: dict[str, object] = {"time": time.time(), **{k: int(counts.get(k, 0)) for k in GC_FIELDS}}
    try:
        state.ensure_state_dir(state_dir)
        state.write_atomic(
            f"{state_dir}/{state.GC_SUMMARY}",
            json.dumps(doc, sort_keys=True).encode() + b"\n",
            what="gc summary",
        )
    except (OSError, JobnsError):
        pass


def read_gc_summary(state_dir: str) -> dict[str, float] | None:
    """The last gc's summary, or None (never ran since boot, or not readable by us)."""
    try:
        with open(f"{state_dir}/{state.GC_SUMMARY}", "rb") as f:
            doc = json.loads(f.read())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    out: dict[str, float] = {}
    for k in ("time", *GC_FIELDS):
        v = doc.get(k)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            return None
        out[k] = float(v)
    return out


def _escape(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**kw: object) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in kw.items()) + "}"


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


class _Out:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help: str, samples: list[tuple[str, float]]) -> None:
        self.lines += [f"# HELP {name} {help}", f"# TYPE {name} {kind}"]
        self.lines += [f"{name}{labels} {_num(value)}" for labels, value in samples]


def _user(job: dict[str, object]) -> str:
    user = job.get("user")
    return str(user.get("name")) if isinstance(user, dict) else ""


def render(
    jobs: list[dict[str, object]], gc: dict[str, float] | None, propagation_warning: str = ""
) -> str:
    """The text exposition format (version 0.0.4), ending in a newline."""
    out = _Out()
    used, caps, failures = [], [], []
    by_state: dict[str, int] = {s: 0 for s in (*STATES, *EXTRA_STATES)}
    for j in jobs:
        job_id, user, st = str(j.get("job_id")), _user(j), str(j.get("state"))
        by_state[st] = by_state.get(st, 0) + 1
        b = j.get("bytes")
        if isinstance(b, int):
            used.append((_labels(job_id=job_id, user=user, state=st), float(b)))
        trees = j.get("trees")
        for t in trees if isinstance(trees, list) else []:
            cap = t.get("capacity") if isinstance(t, dict) else None
            if isinstance(cap, int) and not isinstance(cap, bool):
                role, target = t.get("role"), t.get("target")
                fs = str(target) if isinstance(target, str) else "shm" if role == "shm" else "tmp"
                caps.append((_labels(job_id=job_id, user=user, fs=fs), float(cap)))
        n = j.get("teardown_failures")
        if isinstance(n, int) and n > 0:
            failures.append((_labels(job_id=job_id, user=user), float(n)))
    out.family(
        "jobns_job_used_bytes",
        "gauge",
        "Bytes used by a job's directories on this node (st_blocks).",
        used,
    )
    out.family(
        "jobns_job_capacity_bytes",
        "gauge",
        "Capacity of a job's size-limited /dev/shm (fs=shm), /tmp (fs=tmp) or extra "
        "private directory (fs=its path).",
        caps,
    )
    out.family(
        "jobns_jobs",
        "gauge",
        "Jobs jobns holds on this node, by state.",
        [(_labels(state=s), float(n)) for s, n in sorted(by_state.items())],
    )
    out.family(
        "jobns_job_teardown_failures",
        "gauge",
        "Failed epilogs of a job still kept on this node (teardown-fail after 1).",
        failures,
    )
    out.family(
        "jobns_teardown_failures",
        "gauge",
        "Failed epilogs of all jobs kept on this node.",
        [("", float(sum(v for _, v in failures)))],
    )
    out.family(
        "jobns_host_root_shared",
        "gauge",
        "1 if / is a shared mount (host mounts made later reach running jobs).",
        [("", 0.0 if propagation_warning else 1.0)],
    )
    if gc is not None:
        out.family(
            "jobns_gc_last_run_timestamp_seconds",
            "gauge",
            "When jobns gc last ran on this node.",
            [("", gc["time"])],
        )
        for k, help in (
            ("dead_jobs", "Jobs the last gc found dead and removed."),
            ("unknown_to_slurm", "Jobs the last gc removed that Slurm did not know."),
            (
                "leftovers",
                "Job trees without a record the last gc removed (after a crash or reboot).",
            ),
            ("problems", "Problems the last gc could not fix."),
        ):
            out.family(f"jobns_gc_{k}", "gauge", help, [("", gc[k])])
    return "\n".join(out.lines) + "\n"


def capacity_used(tree: Tree, ours: Callable[[Mount], bool]) -> int | None:
    """Bytes used in a job's capacity (`jobns status` does not look inside a mount: a
    user's stalled FUSE server must not hang it), from statfs of jobns's own mount (ours:
    launcher.backing.sizelimit.owner), reached by an O_PATH fd, never a path; None unless the
    topmost mount on the tree root is that one (a user's mount on it is never asked)."""
    try:
        top = fs.root_top(tree, ours)
    except JobnsError:
        return None  # its base is gone
    if top is None:
        return None
    fd, kind = top
    try:
        if kind != fs.OURS:
            return None
        st = os.fstatvfs(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _measurable(rec: TreeRecord, ours: Callable[[Mount], bool]) -> Callable[[Mount], bool]:
    """What capacity_used may ask on a tree root: jobns's capacity, or the cover over it
    (launcher.mountns.dirs: root's bind of the capacity's own `data`, so the same file system)."""
    ident = rec.mount
    if rec.cover is None or ident is None:
        return ours
    tree = rec.tree
    return lambda m: ours(m) or (is_cover(m, tree) and ident.same_fs(m))


def fill_capacity_bytes(
    jobs: list[dict[str, object]], tree_bytes: Callable[[Tree], int | None]
) -> None:
    """Bytes used of recorded jobs whose trees have a capacity (status leaves them None);
    tree_bytes: how status counts a tree without a capacity."""
    for j in jobs:
        trees = j.get("trees")
        if j.get("bytes") is not None or not isinstance(trees, list):
            continue
        total: int | None = 0
        for t in trees:
            if not isinstance(t, dict):
                continue
            rec = TreeRecord.from_dict(t)
            if rec.capacity is not None:
                used = capacity_used(rec.tree, _measurable(rec, owner(rec, str(j["job_id"]))))
            else:
                used = tree_bytes(rec.tree)
            if used is not None and "target" in t:
                t["used"] = used  # an extra directory's own use (jobns status)
            total = None if used is None or total is None else total + used
        j["bytes"] = total


def status_text(
    state_dir: str,
    jobs: list[dict[str, object]],
    warning: str,
    tree_bytes: Callable[[Tree], int | None],
) -> str:
    fill_capacity_bytes(jobs, tree_bytes)
    gc = read_gc_summary(state_dir) if os.geteuid() == 0 else None
    return render(jobs, gc, warning)


def stale_disk_text(held: list[dict[str, object]]) -> str:
    """The stale disk capacities (launcher.backing.diskimage.stale) as two gauges, appended to
    render()'s text."""
    out = _Out()
    out.family(
        "jobns_stale_disk_capacities",
        "gauge",
        "Loop devices still attached to a finished job's deleted disk image (a process "
        "outside the job holds its file system); each counts in the node cap.",
        [("", float(len(held)))],
    )
    sizes = [e.get("bytes") for e in held]
    total = sum(b for b in sizes if isinstance(b, int))
    out.family(
        "jobns_stale_disk_capacity_bytes",
        "gauge",
        "Bytes of the node cap the stale disk capacities take.",
        [("", float(total))],
    )
    return "\n".join(out.lines) + "\n"


def write_textfile(path: str, text: str) -> None:
    """Replace path atomically (launcher.system.files: a temporary name in the same
    directory, no *.prom, then rename), mode 0644: node_exporter's textfile collector never
    reads half a file."""
    where, name = files.split(path)
    try:
        files.write_atomic(where, name, text.encode(), 0o644, fsync=False)
    except OSError as e:
        raise JobnsError(f"status: write {path}: {e.strerror}") from None
