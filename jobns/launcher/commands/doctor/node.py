"""Where jobns keeps things on this node: state_dir (root's, with POSIX ACLs), the bases
job trees are made in (local_base, shm_base, shared_base, each [[dirs]] base), each
[[dirs]] path, and whether the job user can reach a base without [slurm] enforce."""

from __future__ import annotations

import errno
import os
import stat

from jobns.launcher.commands.doctor.capacity import image_fs
from jobns.launcher.commands.doctor.common import (
    NETWORK_FS,
    NOTE,
    OK,
    PROBLEM,
    Finding,
    fs_type,
    path_guarded,
)
from jobns.launcher.model import config as config_mod
from jobns.launcher.model.dirpath import fixed_part
from jobns.launcher.protocol import state
from jobns.launcher.system import files, libc
from jobns.launcher.system.errors import JobnsError


def state_dir(path: str) -> list[Finding]:
    """Root's, not writable by others, and on a file system with POSIX ACLs (jobns gives
    the job user read access to her record through one: launcher.protocol.state.grant)."""
    where = path
    while not os.path.lexists(where):
        parent = os.path.dirname(where)
        if parent == where:
            break
        where = parent
    out: list[Finding] = []
    if where == path:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            return [
                (
                    PROBLEM,
                    f"state_dir {path} is not a directory (a symlink?); fix: remove "
                    "it, jobns setup makes it",
                )
            ]
        if st.st_uid != 0 or st.st_mode & 0o022:
            return [
                (
                    PROBLEM,
                    f"state_dir {path} is owned by uid {st.st_uid} with mode "
                    f"{stat.S_IMODE(st.st_mode):04o}; fix: chown root {path} && chmod 0711 "
                    f"{path} (root's, writable only by root)",
                )
            ]
        out.append((OK, f"state_dir {path}: root's, mode {stat.S_IMODE(st.st_mode):04o}"))
    else:
        out.append((OK, f"state_dir {path}: made by the first jobns setup (in {where})"))
    problem = _acl_problem(where)
    if problem:
        out.append(
            (
                PROBLEM,
                f"state_dir {path}: {problem}; fix: put state_dir on a file "
                "system with POSIX ACLs (tmpfs such as /run, ext4, xfs; mount with acl)",
            )
        )
    else:
        out.append((OK, f"state_dir {path}: POSIX ACLs work"))
    return out


def _acl_problem(directory: str) -> str:
    """Try the ACL jobns sets (launcher.protocol.state.grant) on a scratch file in directory."""
    name = f"{directory.rstrip('/')}/.jobns-doctor-{os.getpid()}"
    try:
        fd = os.open(name, os.O_WRONLY | files.CREATE, 0o600)
    except OSError as e:
        return f"cannot try ACLs in {directory}: {e.strerror}"
    try:
        state.grant(fd, name, 6, 65534, 4)
    except JobnsError:
        return f"the file system of {directory} refuses POSIX ACLs"
    finally:
        os.close(fd)
        os.unlink(name)
    return ""


def base(role: str, path: str) -> list[Finding]:
    """A base jobns makes job trees in: root's; if others may write it, sticky (else
    anyone could rename a job's tree away); on a suitable file system."""
    if not path:
        return []
    try:
        st = os.lstat(path)
    except OSError as e:
        return [
            (
                PROBLEM,
                f"{role} {path}: {e.strerror}; fix: create it (root's, mode 1777 "
                "for standalone jobns run, or 0755 if only the prolog makes job trees)",
            )
        ]
    if not stat.S_ISDIR(st.st_mode):
        return [(PROBLEM, f"{role} {path} is not a directory; fix: make it one")]
    mode = stat.S_IMODE(st.st_mode)
    kind = fs_type(path)
    out: list[Finding] = []
    if st.st_uid != 0:
        out.append((PROBLEM, f"{role} {path} belongs to uid {st.st_uid}; fix: chown root {path}"))
    if mode & 0o002 and not mode & stat.S_ISVTX:
        out.append(
            (
                PROBLEM,
                f"{role} {path} is world-writable without the sticky bit "
                f"(mode {mode:04o}): any user can rename a job's tree away; fix: chmod "
                f"1777 {path}",
            )
        )
    elif mode & 0o020 and not mode & stat.S_ISVTX:
        out.append(
            (
                PROBLEM,
                f"{role} {path} is group-writable (mode {mode:04o}); fix: chmod "
                f"g-w {path}, or 1777",
            )
        )
    if role == "shm_base" and kind != "tmpfs":
        out.append(
            (
                PROBLEM,
                f"shm_base {path} is on {kind}, not tmpfs: the job's /dev/shm "
                "would be on disk; fix: use a tmpfs such as /dev/shm",
            )
        )
    if role == "local_base" and kind in NETWORK_FS:
        out.append(
            (
                PROBLEM,
                f"local_base {path} is on {kind}, a network file system; fix: "
                "a local file system (or use shared_base for shared layouts)",
            )
        )
    if role == "shared_base" and kind not in NETWORK_FS:
        out.append(
            (
                NOTE,
                f"shared_base {path} is on {kind}: --use-shared-tmpdir is shared "
                "only with nodes that see this file system",
            )
        )
    if any(k == PROBLEM for k, _ in out):
        return out
    if mode & 0o002:
        # Works (sticky, and jobns never uses a tree it did not make), but docs/config.md
        # recommends a root-owned base: here anyone can take a future job's name.
        out.append(
            (
                NOTE,
                f"{role} {path}: root's, mode {mode:04o}, {kind}, but world-writable: "
                "another user can make job-ID there ahead of a job, and jobns then refuses "
                "that job; a root-owned base is safer (docs/config.md, local_base): "
                + _safer_base(role),
            )
        )
    else:
        out.append((OK, f"{role} {path}: root's, mode {mode:04o}, {kind}"))
    return out


def _safer_base(role: str) -> str:
    if role == "local_base":
        return (
            'install -d -m 0755 /var/lib/jobns; local_base = "/var/lib/jobns" in jobns.toml '
            "(only root makes job trees there: the prolog does)"
        )
    if role == "shm_base":
        # a tmpfs of its own: a directory made in /dev/shm at boot could be taken first
        return (
            "a tmpfs of root's, e.g. 'tmpfs /var/lib/jobns-shm tmpfs mode=0755,nosuid,nodev "
            '0 0\' in /etc/fstab and shm_base = "/var/lib/jobns-shm"'
        )
    return f"a directory of root's, mode 0755, as {role}"


def extra_dir(d: config_mod.DirConfig) -> list[Finding]:
    """A [[dirs]] entry: its path must be a directory on the host reached without a
    symbolic link (the job's bind needs a mount point there); its base is checked like
    the others, and must be writable by root only for a disk backing (its images)."""
    what = f"[[dirs]] path {d.path}"
    point = fixed_part(d.path)  # a path with %j or %u: the part every job shares
    per_job: list[Finding] = []
    if point != d.path:
        what = f"[[dirs]] path {d.path} (under {point})"
        per_job.append(
            (
                NOTE,
                f"[[dirs]] path {d.path} names the job or its user: each job's own "
                "directory there must exist (root's, no link on the way) before the job "
                "starts, or that job is refused",
            )
        )
    try:
        fd = libc.openat2(
            -100, point, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, libc.RESOLVE_NO_SYMLINKS
        )
        os.close(fd)
        out: list[Finding] = [(OK, f"{what}: a directory (the job's mount point)"), *per_job]
    except OSError as e:
        why = (
            "a symbolic link is on the way"
            if e.errno == errno.ELOOP
            else os.strerror(e.errno)
            if e.errno
            else str(e)
        )
        out = [
            (
                PROBLEM,
                f"{what}: {why}; fix: mkdir -p {point} on every node (a real directory, "
                "no link on the way): jobs are bound over it",
            ),
            *per_job,
        ]
    out += path_guarded(point, what)
    found = base(f"[[dirs]] base of {d.path}:", d.base)
    if d.backing == "disk" and found and not any(k == PROBLEM for k, _ in found):
        mode = stat.S_IMODE(os.lstat(d.base).st_mode)
        if mode & 0o022:
            found = [
                (
                    PROBLEM,
                    f"[[dirs]] base {d.base} of {d.path} (disk) is writable by others (mode "
                    f"{mode:04o}) and holds the disk images; fix: chmod go-w {d.base}",
                )
            ]
    if d.backing == "disk":
        found += image_fs(f"[[dirs]] base {d.base} of {d.path}", d.base)
    elif fs_type(d.base) in NETWORK_FS:
        found.append(
            (
                PROBLEM,
                f"[[dirs]] base {d.base} of {d.path} is on a network file system; "
                "fix: a node-local one",
            )
        )
    return out + found


def reachable(what: str, path: str, enforce: bool, covered: bool = False) -> list[Finding]:
    """In the voluntary mode the namespace holder (launcher.mountns.pins), already the job user,
    opens each base by its path again (launcher.backing.fs.reopen: open(base, O_RDONLY) needs
    search on every directory above the base and read on it, then the job's tree is
    looked up in it: search on the base). A base only root may enter fails every job's
    prolog ("open ... base: Permission denied", exit 125) and the node drains. Checked
    for a user in none of the directories' groups (their "other" bits). A covered base
    (launcher.mountns.namespace.cover_bases: root hides it under a 0755 tmpfs holding the job's
    own trees before the holder becomes the user) may itself be root's 0700: only the
    directories above it are looked up. With [slurm] enforce root makes the namespace,
    and nothing is needed."""
    if enforce or not path or not os.path.isdir(path):
        return []  # base() already says what is wrong with a missing one
    real = os.path.realpath(path)
    # The directories a lookup of path passes: above it as written, and above the real one.
    walked = [*reversed(_parents(path)), *reversed(_parents(real))]
    above = dict.fromkeys(os.path.realpath(d) for d in walked)
    needs = [(d, 0o001, "search") for d in above]
    if not covered:
        needs.append((real, 0o005, "read and search"))
    for d, bits, how in needs:
        st = os.stat(d)
        if st.st_mode & bits != bits:
            fix = f"chmod o+rx {d}" if d == real else f"chmod o+x {d}"
            return [
                (
                    PROBLEM,
                    f"{what} {path}: an ordinary user may not {how} {d} (uid {st.st_uid}, "
                    f"mode {stat.S_IMODE(st.st_mode):04o}); without [slurm] enforce the job "
                    "user opens the base when her namespace is made, so every job's "
                    f"prolog fails and the node drains; fix: {fix} (or enforce, with the "
                    "SPANK plugin)",
                )
            ]
    return []


def _parents(path: str) -> list[str]:
    """Every directory above path, nearest first."""
    out = []
    while path != "/":
        path = os.path.dirname(path)
        out.append(path)
    return out
