"""The epilog's release process: what takes time to free is freed after the epilog returns.

The epilog (launcher.lifecycle.lifecycle) is on every batch job's critical path: Slurm reports
the job done, and the node takes the next one, only when it returns. What it must
finish first, and does:
  - no task can join any more (run.env closed, the pins unmounted) and every process of
    the job has ended (SIGCONT+SIGTERM, kill_wait, SIGKILL, waited for);
  - stage-out and scratch back to the session directory: the user's results are safe
    before the job is reported done (this stays synchronous, whatever it costs);
  - each tree is sealed (root's, 0700: nobody enters it by path any more), whatever the
    user mounted on or in it is detached through the fd examined (never entered), its
    capacity is released (a tmpfs emptied, made read-only and detached, whatever its
    size: a namespace reference someone still holds keeps an empty file system nobody
    can refill, SECURITY.md rule 6; a disk image shut down, detached and unlinked), and
    the tree, a plain directory of root's now, is renamed out of the job's way,
    <name>~removing-<hex>, in the same directory: the job's own names are free at
    once, so a requeued job of the same id gets fresh directories and never meets the
    old ones (anything else at the tree's place, a link she put there say, is dealt
    with at once as before: unlinked, never followed);
  - this release's record names each renamed tree before the rename (Handover.retire);
  - the job's record is removed (its state "complete").
What it hands over, to one detached process per epilog (its own session, only the fds
given to it, started when the epilog has exited so it never competes with it):
  - the last references to the job's mount and user namespaces: the kernel frees a
    namespace's mounts when they close (a wait of 1-9 ms measured here);
  - the renamed trees, removed by fd walks that never follow a link and never enter
    another file system (launcher.system.removal: openat2 RESOLVE_NO_XDEV|RESOLVE_NO_SYMLINKS;
    a mount met on a parent or in a tree is detached through the fd examined), O(files);
  - then it unlinks its record. A tree it cannot remove keeps the record, so every
    `jobns recover` and `jobns gc` tries again and reports it (exit 125), where an
    epilog used to fail (and drain the node) on it.

Crash safety. The record, <state_dir>/releases/<job id>~<hex>, is made under a
temporary name, locked (flock, exclusive) and renamed into place before anything is
written to it, then one line is appended per renamed tree, before its rename; the
release process inherits the lock and holds it to the end. A record nobody holds is
an interrupted release: `jobns recover` and `jobns gc` finish it (finish_dead), and gc
never sweeps a tree a live release still owns. SIGKILL at any step leaves only what
that finishes: renamed trees (named in the record), namespaces (freed with their last
fd). No capacity is ever handed over: none is left mounted, or forgotten, by a release
that dies. After a reboot (the
default state_dir is on tmpfs: no records), gc removes the root-owned
job-*~removing-* entries in the bases by name, as it always has; so release records
are never fsynced, on any state_dir.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

from jobns.launcher.backing import fs
from jobns.launcher.model.plan import Tree, tree_from_record, tree_record
from jobns.launcher.protocol import state
from jobns.launcher.system import files, libc
from jobns.launcher.system.errors import JobnsError
from jobns.launcher.system.fork import spawn
from jobns.launcher.system.log import log
from jobns.launcher.system.mountinfo import Mount, under
from jobns.launcher.system.removal import stat_here

_waiting: list[int] = []  # write ends of the release processes' start pipes (see start)


def directory(state_dir: str) -> str:
    return f"{state_dir}/{state.RELEASES}"


class Handover:
    """What one epilog hands to its release process: trees renamed out of the job's way
    and namespace references to drop."""

    def __init__(self, state_dir: str, job_id: str, user: str) -> None:
        self.state_dir = state_dir
        self.job_id = job_id
        self.user = user
        self.trees: list[Tree] = []
        self.fds: list[int] = []  # closed by the release process (namespaces)
        self.record = ""
        self.lock = -1  # the record's fd, holding its flock
        self.adopted: list[tuple[str, int, list[Tree]]] = []  # (record, its fd, its trees)

    def keep(self, fd: int) -> None:
        """The release process closes fd (a namespace reference: freeing it is the
        kernel's work, not the epilog's)."""
        self.fds.append(fd)

    def retire(self, tree: Tree, ours: Callable[[Mount], bool]) -> list[str]:
        """Rename a sealed tree to <name>~removing-<hex> for the release process. Its
        parents are walked without following a link or entering a mount (one on a parent
        is detached), and the root is looked at without entering anything mounted on it;
        if it is not a plain, sealed directory of root's, or cannot be renamed (a link she
        put in its place, a mount on it, an immutable tree), fs.remove_recorded(tree, ours)
        deals with it now, as the epilog always has (detaching what is hers, never
        detaching a capacity of ours: that stays an error). So does a tree with anything
        still mounted in it (her FUSE mount from the host): the epilog detaches it, through
        the fd its removal walk examined, before the node takes the next job."""
        if under(tree.path):
            return fs.remove_recorded(tree, ours)
        parent = fs.open_parent(tree, detach=True)
        if parent is None:
            return fs.remove_recorded(tree, ours)  # gone, or it says why not reachable
        new = f"{tree.name}{fs.RETIRED}{os.urandom(4).hex()}"
        retired = Tree(tree.role, tree.base, tree.parents, new, tree.children, True)
        try:
            st = stat_here(parent, tree.name)  # EXDEV: something is mounted on it
            if st.st_uid != 0 or not stat.S_ISDIR(st.st_mode):
                return fs.remove_recorded(tree, ours)
            self._note(retired)
            libc.rename_noreplace(parent, tree.name, new)
        except FileNotFoundError:
            return []  # already gone
        except (OSError, JobnsError):
            return fs.remove_recorded(tree, ours)
        finally:
            os.close(parent)
        self.trees.append(retired)
        return []

    def _note(self, tree: Tree) -> None:
        """Append the tree to this release's record (made and locked on first use)."""
        if self.lock < 0:
            self.record, self.lock = _new_record(self.state_dir, self.job_id, self.user)
        line = json.dumps(tree_record(tree), sort_keys=True).encode() + b"\n"
        try:
            files.write_all(self.lock, line)
        except OSError as e:
            raise state.state_error("write release record", self.record, e) from None

    def start(self) -> None:
        """Start the release process (when there is anything to release); the epilog's
        own copies of what it handed over are closed here. It also finishes what an
        earlier epilog of the job, killed before its release process started, renamed
        (so `jobns teardown` again after a crash leaves nothing either)."""
        self._adopt()
        given = list(self.fds)
        records = [self.lock] if self.lock >= 0 else []
        records += [fd for _, fd, _ in self.adopted]
        try:
            if self.trees or given or self.adopted:
                _spawn(self, given + records)
        finally:
            for fd in given + records:
                os.close(fd)
            self.fds, self.lock, self.adopted = [], -1, []

    def _adopt(self) -> None:
        """Lock every record of this job whose release process is gone (or never came)."""
        for name in _records(self.state_dir):
            path = f"{directory(self.state_dir)}/{name}"
            if (
                not name.startswith(f"{self.job_id}~")
                or files.is_temporary(name)
                or path == self.record
            ):
                continue
            try:
                fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.adopted.append((path, fd, read(path, fd)[2]))
            except (BlockingIOError, JobnsError):
                os.close(fd)  # at work; or damaged: recover and gc report it


def _new_record(state_dir: str, job_id: str, user: str) -> tuple[str, int]:
    """Create a release record, locked before it has its name (no gc ever sees it
    unlocked while its epilog lives); its first line says whose it is."""
    where = directory(state_dir)
    state.private_dir(where, None)
    name = f"{job_id}~{os.urandom(6).hex()}"
    path = f"{where}/{name}"
    try:
        temp = files.Temporary(where, name, 0o600, os.O_RDWR | os.O_APPEND)
    except OSError as e:
        raise state.state_error("create release record", path, e) from None
    try:
        fcntl.flock(temp.fd, fcntl.LOCK_EX)
        files.write_all(
            temp.fd, json.dumps({"job_id": job_id, "user": user}, sort_keys=True).encode() + b"\n"
        )
        temp.commit()
    except BaseException as e:
        temp.close()
        temp.discard()
        if isinstance(e, OSError):
            raise state.state_error("create release record", path, e) from None
        raise
    return path, temp.fd


def _spawn(h: Handover, fds: list[int]) -> None:
    r, w = os.pipe2(os.O_CLOEXEC)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)

    def work() -> None:
        state.pause_point("release-fork")
        os.setsid()  # out of the epilog's session and process group
        os.close(out_w)  # the epilog may go on (and exit) now
        os.read(r, 1)  # EOF: the epilog has exited (or died)
        os.nice(10)  # the next job comes first
        release(h)

    child = spawn(work, keep=[r, out_w, *fds])
    os.close(child.report_fd)
    os.close(r)
    os.close(out_w)
    # slurmd kills the epilog's process group once the epilog exits (seen on 26.05 in
    # the rig): wait until the child has left it. On a loaded node the child may not
    # run at all before the epilog's end, and was killed there with the trees named
    # in its record, left until a gc (the rig's tests caught it under CI's load).
    os.read(out_r, 1)  # EOF: the child has its own session (or died)
    os.close(out_r)
    _waiting.append(w)  # closed when this process exits


def release(h: Handover) -> None:
    """The release process's work, step by step (each a pause point for tests)."""
    state.pause_point("release")
    for fd in h.fds:
        os.close(fd)  # the job's namespaces: the kernel frees them and their mounts
    state.pause_point("release-namespaces")
    records = [(h.record, h.trees)] if h.record else []
    for n, (path, trees) in enumerate(records + [(p, t) for p, _, t in h.adopted]):
        errors: list[str] = []
        for i, tree in enumerate(trees):
            errors += remove_retired(h.state_dir, h.job_id, tree)
            if n == i == 0:
                state.pause_point("release-tree")
        if errors:
            for err in errors:
                log(f"release: {err} (jobns gc tries again)", h.job_id, h.user, level="error")
            continue  # the record stays: recover and gc try again, and say so
        if n == 0:
            state.pause_point("release-done")
        _unlink(path)


def remove_retired(state_dir: str, job_id: str, tree: Tree) -> list[str]:
    """Remove a renamed tree, reached from its base without following a link or entering
    a mount (fs.remove_recorded: what she mounted on a parent or in the tree is detached
    through the fd examined). The per-node layout's job-ID/ above it is pruned only under
    the job's lock: a requeued job's setup may be making its tree in it right now."""
    errors = fs.remove_recorded(tree, prune=False)
    if errors or not tree.parents:
        return errors
    try:
        with state.JobLock(state_dir, job_id, blocking=False) as lock:
            _prune(tree)
            if not state.is_set_up(state_dir, job_id):
                lock.release_and_remove()
    except (JobnsError, OSError):
        pass  # a setup of the same job holds it (it uses job-ID/), or no state: kept
    return []


def _prune(tree: Tree) -> None:
    """Remove the directories between the base and the tree, deepest first, while empty."""
    for depth in range(len(tree.parents), 0, -1):
        above = Tree(
            tree.role, tree.base, tree.parents[: depth - 1], tree.parents[depth - 1], (), True
        )
        parent = fs.open_parent(above)
        if parent is None:
            return
        try:
            os.rmdir(above.name, dir_fd=parent)
        except OSError:
            return  # not empty (another node's, or the requeued job's), or gone
        finally:
            os.close(parent)


# ------------------------------------------------------------------- recover and gc


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _records(state_dir: str) -> list[str]:
    try:
        return sorted(os.listdir(directory(state_dir)))
    except FileNotFoundError:
        return []


def read(path: str, fd: int) -> tuple[str, str, list[Tree]]:
    """(job id, user, renamed trees) of a record; a line cut short by a crash (the last)
    is left out. JobnsError for a record that is not one."""
    data = b""
    while chunk := os.pread(fd, 1 << 16, len(data)):
        data += chunk
    lines = data.split(b"\n")
    try:
        head = json.loads(lines[0])
        if not isinstance(head, dict):
            raise ValueError("no header")
        trees = []
        for line in lines[1:]:
            try:
                doc = json.loads(line)
            except ValueError:
                continue  # the last line, cut short by a crash (or the empty tail)
            if not isinstance(doc, dict):
                raise ValueError("a line is not a tree")
            tree = tree_from_record(doc)
            if fs.RETIRED not in tree.name or not tree.base.startswith("/"):
                raise ValueError(f"{tree.path} is not a renamed tree")
            trees.append(tree)
        return str(head["job_id"]), str(head["user"]), trees
    except (ValueError, KeyError, TypeError, AssertionError, JobnsError) as e:
        raise JobnsError(f"read release record {path}: {e}") from None


@dataclass(slots=True)
class Finished:
    """What finish_dead did (or, dry, would do) about one record."""

    job_id: str
    user: str
    text: str
    problems: list[str]


def finish_dead(state_dir: str, dry: bool = False) -> list[Finished]:
    """Finish every release whose process is gone: remove the trees its record names,
    then the record (kept, with problems, if a tree would not go)."""
    out: list[Finished] = []
    for name, path, fd in _open_records(state_dir):
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its release process (or epilog) is at work
            if files.is_temporary(name):
                if not dry:
                    _unlink(path)  # an epilog died before naming it: it never held a tree
                continue
            out.append(_finish(state_dir, path, fd, dry))
        finally:
            os.close(fd)
    return out


def named(state_dir: str) -> set[str]:
    """The paths of every renamed tree a release record names: a release owns them (gc's
    sweep of job-*~removing-* entries leaves them to it)."""
    out: set[str] = set()
    for _, path, fd in _open_records(state_dir):
        try:
            out |= {t.path for t in read(path, fd)[2]}
        except JobnsError:
            pass  # finish_dead reports it
        finally:
            os.close(fd)
    return out


def _open_records(state_dir: str) -> list[tuple[str, str, int]]:
    """(name, path, fd) of each release record (root's files in root's directory)."""
    where = directory(state_dir)
    out = []
    for name in _records(state_dir):
        path = f"{where}/{name}"
        try:
            out.append((name, path, os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)))
        except OSError:
            continue  # finished meanwhile
    return out


def _finish(state_dir: str, path: str, fd: int, dry: bool) -> Finished:
    try:
        job_id, user, trees = read(path, fd)
    except JobnsError as e:
        if not dry:
            _unlink(path)  # it named renamed trees only: gc's sweep knows them by name
        return Finished("", "", f"removed {path}", [str(e)])
    what = f"the interrupted release of job {job_id} ({len(trees)} renamed tree(s))"
    if dry:
        return Finished(job_id, user, f"would finish {what}", [])
    errors = [e for t in trees for e in remove_retired(state_dir, job_id, t)]
    if not errors:
        _unlink(path)
    return Finished(job_id, user, f"finished {what}", errors)


def finish_all(state_dir: str, dry: bool, emit: Callable[[str, str, str, str], None]) -> int:
    """finish_dead for recover and gc: each outcome to emit(text, job id, user, level)
    (info, or error for what would not go); returns the number of problems."""
    problems = 0
    for f in finish_dead(state_dir, dry):
        emit(f"job {f.job_id}: {f.text}" if f.job_id else f.text, f.job_id, f.user, "info")
        for p in f.problems:
            emit(f"release of job {f.job_id}: {p}", f.job_id, f.user, "error")
            problems += 1
    return problems
