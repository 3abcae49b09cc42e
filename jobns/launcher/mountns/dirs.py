"""Extra private directories ([[dirs]]): what a standalone `jobns run` (no prolog) makes
of them, and how setup keeps an entry's `ro` and `noexec` on every path (the cover,
below).

Without setup nothing would unmount a file system after the job's last task, so a
standalone run never applies a backing: every entry is a plain directory
<base>/job-ID, like the job's /tmp (launcher.model.plan builds it so). An ordinary user can
make one only in a base she may write: a site's base is normally root's (jobns doctor
asks for that), and then the entry is left out of her namespace with one warning
line: the task sees the node's own directory there, as it would without jobns (so is an
entry whose path names the job or its user, %j or %u, when that directory does not
exist: nobody made a mount point for a job without a prolog). Nor does
a standalone run (or a container the OCI hook sets up without a prolog) get a cover:
there `ro` and `noexec` hold at the directory's path in the task's own namespace only.
"""

from __future__ import annotations

import os
import sys

from jobns.launcher.backing import fs
from jobns.launcher.backing.fs import TreeHandle
from jobns.launcher.model.plan import Bind, Extra, Plan, Tree
from jobns.launcher.mountns import binds
from jobns.launcher.protocol import state
from jobns.launcher.system import libc, mountinfo
from jobns.launcher.system.errors import JobnsError, UserError
from jobns.launcher.system.mountinfo import Mount


def for_standalone(plan: Plan) -> Plan:
    """plan with every extra directory a plain one, without those whose base an
    unprivileged caller cannot write; each one left out is said once on stderr."""
    root = os.geteuid() == 0
    drop: dict[int, str] = {}
    for i, t in enumerate(plan.trees):
        if t.extra is None:
            continue
        t.extra = Extra(t.extra.target, "directory", None, t.extra.options, t.extra.templated)
        if not root and not os.access(t.base, os.W_OK | os.X_OK):
            drop[i] = (
                f"its base {t.base} is not yours to write (jobns setup, as a prolog, makes it)"
            )
        elif t.extra.templated and not os.path.isdir(t.extra.target):
            # /data/jobs/%j of a job nobody set up: no mount point, so nothing to cover.
            drop[i] = "it does not exist (its [[dirs]] path names the job or its user)"
    for i, why in sorted(drop.items()):
        t = plan.trees[i]
        assert t.extra is not None
        sys.stderr.write(f"jobns: warning: {t.extra.target} is not private in this task: {why}\n")
    return without(plan, set(drop))


def without(plan: Plan, drop: set[int]) -> Plan:
    """PURE: plan without the trees numbered in drop, and without their binds."""
    if not drop:
        return plan
    new_index: dict[int, int] = {}
    trees: list[Tree] = []
    for i, t in enumerate(plan.trees):
        if i not in drop:
            new_index[i] = len(trees)
            trees.append(t)
    kept = [
        Bind(new_index[b.tree], b.child, b.target, b.options)
        for b in plan.binds
        if b.tree in new_index
    ]
    return Plan(trees, kept, plan.env, plan.task_dirs, plan.owner)


# ---------------------------------------------------------------- ro and noexec, host side
#
# An extra directory with options (ro, noexec) keeps them on every path to it, from the
# host as from the job, in either mode. Its tree root (or the root of its capacity's file
# system) stays root's, 0700, for good; the job's content is a directory `data` inside
# it. Setup binds `data` onto a root-only point (launcher.mountns.binds), makes that mount
# nosuid,nodev plus the options, and only then moves it onto the tree root: the *cover*.
# So the one way in, from anywhere, is the cover, flagged from its first moment:
# - every namespace made later copies it flagged (a user's own namespace locks the
#   flags: she cannot remount them away), the job's too, so `ro` and `noexec` hold in
#   the voluntary mode as well, at the job's path and at <base>/job-ID;
# - copies propagated into existing namespaces (a shared /) are made from the flagged
#   mount; a namespace that gets no copy (a private /) sees root's 0700 directory there;
# - nobody could open `data` before (it lay in root's 0700 directory), so nobody holds
#   a reference to it that the flags do not govern.
# Who fills an `ro` directory: the site's pre-run program (root), through a writable
# view of it that exists only while the program runs: $JOBNS_FILL<path> (fill()).
# Teardown detaches the cover by the mount id recorded at setup, before anything else
# is done to the tree (uncover()); gc, with no record, looks through what it knows for a
# cover by what it mounts (is_cover()), and detaches it with the tree's other mounts.

CONTENT = "data"
COVERED = ("ro", "noexec")


def covered(tree: Tree) -> bool:
    """Does the tree get a cover (an extra directory with options)?"""
    return tree.extra is not None and any(o in COVERED for o in tree.extra.options)


def cover(handle: TreeHandle, uid: int, gid: int, state_dir: str, job_id: str) -> str:
    """Make the cover of a tree just made (root-owned, its capacity mounted root-owned);
    its mount id, for the record."""
    tree = handle.tree
    assert tree.extra is not None
    parent = handle.parent_fds[-1]
    top = fs.open_dir(parent, tree.name, tree.path)  # the tree root, or its capacity's
    area = -1
    try:
        st = os.fstat(top)
        if st.st_uid != 0 or st.st_mode & 0o077:
            raise JobnsError(f"cover {tree.path}: it is not root's and private (a bug)")
        os.mkdir(CONTENT, 0o700, dir_fd=top)
        data = os.open(CONTENT, binds.O_DIR, dir_fd=top)
        try:
            os.fchown(data, uid, gid)  # unreachable for her until the cover is in place
            area = binds.open_area(state_dir, job_id)
            what = f"{tree.path}/{CONTENT} (the cover of {tree.extra.target})"
            mount_id = binds.bind(data, area, "stage", what, binds.keeping(tree.extra.options))
        finally:
            os.close(data)
        stage = os.open("stage", binds.O_PATH_DIR, dir_fd=area)
        try:
            libc.mount(f"/proc/self/fd/{stage}", f"/proc/self/fd/{top}", None, libc.MS_MOVE)
        except OSError as e:
            raise JobnsError(f"move the cover of {tree.path} onto it: {e.strerror}") from None
        finally:
            os.close(stage)
        os.rmdir("stage", dir_fd=area)
        # Killed here, the record does not have the id yet: uncover finds the cover by
        # what it mounts (is_cover).
        state.pause_point("covered")
        return mount_id
    finally:
        os.close(top)
        if area >= 0:
            os.close(area)


def is_cover(m: Mount, tree: Tree) -> bool:
    """Is the mount a cover on the tree? Told by what it mounts: a `data` directory, not
    a whole file system. No user can make such a mount on the host: hers are FUSE
    mounts, of their file system's root."""
    return (
        m.point == tree.path and m.root.endswith(f"/{CONTENT}") and not m.fstype.startswith("fuse")
    )


def _writable(_fd: int) -> int:
    """The fill view's flags: writable (a bind of an `ro` cover copies its ro), and
    nosuid,nodev,noexec: it is for copying files in, nothing else."""
    return libc.MS_REMOUNT | libc.MS_BIND | libc.MS_NOSUID | libc.MS_NODEV | libc.MS_NOEXEC


def uncover(tree: Tree, mount_id: str | None) -> list[str]:
    """Teardown: detach the tree's cover (the mount with the recorded id on its root;
    without one, a setup that stopped before recording it: any cover there, is_cover),
    and whatever was mounted on top of it (the job user's FUSE mount on a writable
    one), through O_PATH fds that ask no file system anything. Gone: nothing to do."""
    base = fs.open_base(tree.base, f"{tree.role} base")
    try:
        for _ in range(16):
            if not any(
                m.mount_id == mount_id if mount_id else is_cover(m, tree)
                for m in mountinfo.mounts()
                if m.point == tree.path
            ):
                return []
            # The top of the stack is ours or lies above ours: hers, on her tree.
            fd = os.open(tree.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=base)
            try:
                libc.umount2(f"/proc/self/fd/{fd}", libc.MNT_DETACH)
            finally:
                os.close(fd)
        return [f"detach the cover of {tree.path}: still mounted after 16 attempts"]
    except OSError as e:
        return [f"detach the cover of {tree.path}: {e.strerror}"]
    finally:
        os.close(base)


def fill(state_dir: str, job_id: str, trees: list[tuple[Tree, str | None]]) -> str:
    """Before the pre-run program: a writable view (nosuid,nodev,noexec) of each covered
    extra directory at <area>/fill<path>, made from the cover found on its tree by its
    recorded mount id; returns <area>/fill, or "" if there is none. trees: (tree, the
    cover's mount id). Removed right after the program (launcher.mountns.binds.release)."""
    made = False
    for tree, mount_id in trees:
        if tree.extra is None or mount_id is None:
            continue
        base = fs.open_base(tree.base, f"{tree.role} base")
        try:
            src = os.open(tree.name, binds.O_PATH_DIR, dir_fd=base)
        finally:
            os.close(base)
        try:
            if mountinfo.mount_id(src) != mount_id:
                # Her FUSE mount on a writable cover: the pre-run program never writes there.
                raise UserError(f"fill {tree.extra.target}: something is mounted on {tree.path}")
            *dirs, name = tree.extra.target.strip("/").split("/")
            parent = binds.open_area(state_dir, job_id, "fill", *dirs)
            try:
                what = f"{tree.path} (to fill {tree.extra.target})"
                binds.bind(src, parent, name, what, _writable)
            finally:
                os.close(parent)
            made = True
        finally:
            os.close(src)
    return f"{binds.area(state_dir, job_id)}/fill" if made else ""
