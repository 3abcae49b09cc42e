"""`jobns doctor`: is this node ready for jobns, and what is there to fix?

One line per check on stdout: `ok: ...`, `note: ...` (worth knowing, not a problem) or
`problem: ...; fix: ...`. Exit 0 when there is no problem, 125 otherwise. It changes
nothing, except a file it makes and removes at once to try POSIX ACLs where the state
directory lives.
"""

from __future__ import annotations

import errno
import glob
import os
import re
import stat
import sys

from jobns.launcher.model import config as config_mod
from jobns.launcher.model.inputs import Options
from jobns.launcher.system.errors import EXIT_JOBNS_FAILED, JobnsError

OK, NOTE, PROBLEM = "ok", "note", "problem"
NETWORK_FS = {
    "nfs",
    "nfs4",
    "lustre",
    "gpfs",
    "cifs",
    "smb3",
    "beegfs",
    "fuse.glusterfs",
    "ceph",
    "fuse.ceph",
    "pvfs2",
    "orangefs",
    "fuse.sshfs",
    "9p",
}
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"
DEFAULT_CDI_DIR = "/etc/cdi"
DEFAULT_SSHD_PAM = "/etc/pam.d/sshd"
SPANK_PLUGIN = "jobns_spank.so"
PAM_MODULE = "pam_jobns.so"

Finding = tuple[str, str]


def installed_jobns() -> str:
    """The jobns command of this installation, next to its interpreter: /usr/bin/jobns
    from the Debian package, /opt/jobns/venv/bin/jobns from ci/install-python. The
    hints name it, so they hold for either."""
    return os.path.join(os.path.dirname(sys.executable), "jobns")


def installed_spank_plugin() -> str:
    """The SPANK plugin of this installation: the jobns-slurm package puts it in the
    multiarch slurm-wlm directory (with jobns under /usr), ci/build-spank in
    /opt/jobns/lib."""
    if not sys.executable.startswith("/usr/"):
        return f"/opt/jobns/lib/{SPANK_PLUGIN}"
    found = sorted(glob.glob(f"/usr/lib/*/slurm-wlm/{SPANK_PLUGIN}"))
    return found[0] if found else f"/usr/lib/<multiarch>/slurm-wlm/{SPANK_PLUGIN}"


def kernel(proc_sys: str = "/proc/sys") -> list[Finding]:
    """Unprivileged user namespaces: every Slurm task joins (or makes) one."""
    out: list[Finding] = []
    value = _read_int(f"{proc_sys}/user/max_user_namespaces")
    if value is None:
        out.append(
            (
                PROBLEM,
                "the kernel has no user namespaces (no "
                "/proc/sys/user/max_user_namespaces); fix: a kernel with "
                "CONFIG_USER_NS=y",
            )
        )
    elif value <= 0:
        out.append(
            (
                PROBLEM,
                f"user.max_user_namespaces = {value}: no task can make or join "
                "a user namespace; fix: sysctl -w user.max_user_namespaces=15000 (and "
                "the same in /etc/sysctl.d/)",
            )
        )
    else:
        out.append((OK, f"user.max_user_namespaces = {value}"))
    for name, bad, why in (
        ("kernel/unprivileged_userns_clone", 0, "Debian's switch"),
        ("kernel/apparmor_restrict_unprivileged_userns", 1, "Ubuntu's AppArmor switch"),
    ):
        value = _read_int(f"{proc_sys}/{name}")
        key = name.replace("/", ".")
        if value is None:
            continue
        if value == bad:
            want = 1 - bad
            out.append(
                (
                    PROBLEM,
                    f"{key} = {value} ({why}): ordinary users cannot make user "
                    f"namespaces; fix: sysctl -w {key}={want} (and the same in "
                    "/etc/sysctl.d/)",
                )
            )
        else:
            out.append((OK, f"{key} = {value}"))
    return out


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def in_container(root: str = "/") -> str:
    """Why this node looks like a container ("" if it does not): docker's /.dockerenv,
    podman's /run/.containerenv, or a container manager in /proc/1/cgroup (cgroup v1).
    A module cannot be loaded from inside one: the host must, and give it the device."""
    for marker in (".dockerenv", "run/.containerenv"):
        if os.path.exists(os.path.join(root, marker)):
            return f"/{marker} exists"
    try:
        with open(os.path.join(root, "proc/1/cgroup")) as f:
            cgroup = f.read(65536)
    except OSError:
        return ""
    for hint in ("docker", "containerd", "kubepods", "libpod", "lxc"):
        if hint in cgroup:
            return f"/proc/1/cgroup names {hint}"
    return ""


def disk_users(config: config_mod.Config) -> list[str]:
    """What in the config makes disk images (each needs loop devices and mkfs)."""
    from jobns.launcher.model.capacity import tmp_backing

    users = ['[capacity] tmp_backing = "disk"'] if tmp_backing(config) == "disk" else []
    return users + [f"[[dirs]] {d.path}" for d in config.dirs if d.backing == "disk"]


def loop_devices(
    dev: str = "/dev", users: list[str] | None = None, container: str = ""
) -> list[Finding]:
    """Loop devices hold disk images: a problem only where the config has a disk backing
    (users: what asks for one), else a note. container: in_container()'s reason, where
    `modprobe loop` cannot help."""
    if container:
        load = (
            f"this node is a container ({container}): load the loop module on the host "
            "(modprobe loop) and give the container /dev/loop-control and /dev/loopN "
            "(docker run --device /dev/loop-control --device /dev/loop0 ...)"
        )
    else:
        load = "modprobe loop (and list it in /etc/modules)"
    try:
        st = os.stat(f"{dev}/loop-control")
        what = "" if stat.S_ISCHR(st.st_mode) else f"{dev}/loop-control is not a character device"
        load = load if container else f"remove it and {load}"
    except OSError:
        what = f"no {dev}/loop-control"
    if not what:
        return [(OK, f"loop devices ({dev}/loop-control)")]
    if users:
        return [
            (
                PROBLEM,
                f"{what}: {', '.join(users)} makes disk images, which need loop "
                f"devices; fix: {load}",
            )
        ]
    return [
        (
            NOTE,
            f"{what}: nothing configured here needs loop devices (only a disk backing "
            f'does: [capacity] tmp_backing or a [[dirs]] backing = "disk"); before '
            f"configuring one: {load}",
        )
    ]


def state_dir(path: str) -> list[Finding]:
    """Root's, not writable by others, and on a file system with POSIX ACLs (jobns gives
    the job user read access to her record through one: launcher.system.state.grant)."""
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
    """Try the ACL jobns sets (launcher.system.state.grant) on a scratch file in directory."""
    from jobns.launcher.system import state

    name = f"{directory.rstrip('/')}/.jobns-doctor-{os.getpid()}"
    try:
        fd = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
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


def fs_type(path: str) -> str:
    """The type of the file system path is on (the deepest mount above it)."""
    from jobns.launcher.system.mountinfo import mounts

    real = os.path.realpath(path)
    best, kind = "", "?"
    for m in mounts():
        point = m.point.rstrip("/") or "/"
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, m.fstype
    return kind


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
    from jobns.launcher.model.dirpath import fixed_part
    from jobns.launcher.system import libc

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


def image_fs(what: str, path: str) -> list[Finding]:
    """Disk images belong on a local disk: not a network file system (every job's I/O
    would cross the network, and the node cap would count another node's space), not
    tmpfs (the image would be memory: tmp_backing = "tmpfs" does that directly)."""
    kind = fs_type(path)
    if kind in NETWORK_FS:
        return [(PROBLEM, f"{what} is on {kind}, a network file system; fix: a local disk")]
    if kind in ("tmpfs", "ramfs"):
        return [
            (
                PROBLEM,
                f"{what} is on {kind}: its disk images would take memory; fix: a "
                'local disk (or tmp_backing = "tmpfs")',
            )
        ]
    return []


def scratch_base(config: config_mod.Config) -> list[Finding]:
    """[capacity] scratch_base, where disk capacities' images live: root's, writable by
    root only (then no user can name, squat or swap an image), on a local disk. Others
    may read it: nothing of jobns's waits for a lock there (launcher.backing.diskimage keeps its
    lock in state_dir), and the images themselves are root's 0600."""
    if config.capacity.get("tmp_backing") != "disk":
        return []
    from jobns.launcher.backing.diskimage import base_of

    path = base_of(config)
    what = f"[capacity] scratch_base {path}"
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        parent = os.path.dirname(path.rstrip("/")) or "/"
        return image_fs(what, parent) or [
            (OK, f"{what}: made (root's, 0700) by the first disk capacity")
        ]
    except OSError as e:
        return [(PROBLEM, f"{what}: {e.strerror}; fix: mkdir -m 0700 {path}")]
    if not stat.S_ISDIR(st.st_mode):
        return [(PROBLEM, f"{what} is not a directory (a symlink?); fix: mkdir -m 0700 {path}")]
    mode = stat.S_IMODE(st.st_mode)
    out: list[Finding] = []
    if st.st_uid != 0:
        out.append((PROBLEM, f"{what} belongs to uid {st.st_uid}; fix: chown root {path}"))
    if mode & 0o022:
        out.append(
            (
                PROBLEM,
                f"{what} is writable by others (mode {mode:04o}): anyone could plant or "
                f"swap an image; fix: chmod go-w {path}",
            )
        )
    out += image_fs(what, path) + path_guarded(path, what)
    return out or [(OK, f"{what}: root's, mode {mode:04o}, {fs_type(path)}")]


def path_guarded(path: str, what: str) -> list[Finding]:
    """A problem for each directory above path that lets a user other than root replace
    what lies below it (owned by a user, or writable by others without the sticky bit
    on a root-owned entry): she could put a symbolic link at the mount point, and setup
    then refuses every job on the node (it never binds through a link)."""
    out: list[Finding] = []
    parts = path.strip("/").split("/")
    parent = "/"
    for part in parts:
        child = f"{parent.rstrip('/')}/{part}"
        try:
            pst, cst = os.lstat(parent), os.lstat(child)
        except OSError:
            return out
        shared = pst.st_mode & 0o022 and not (pst.st_mode & stat.S_ISVTX and cst.st_uid == 0)
        if pst.st_uid != 0 or shared:
            out.append(
                (
                    PROBLEM,
                    f"{what}: {parent} (uid {pst.st_uid}, mode "
                    f"{stat.S_IMODE(pst.st_mode):04o}) lets another user replace {child}; "
                    f"fix: chown root {parent}; chmod go-w {parent} (or keep the path "
                    "under root's directories only)",
                )
            )
        parent = child
    return out


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


def _inside_any(path: str, points: list[str]) -> bool:
    """Whether path is one of points or below one (as written: the job's binds are)."""
    path = os.path.normpath(path)
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in points)


def _parents(path: str) -> list[str]:
    """Every directory above path, nearest first."""
    out = []
    while path != "/":
        path = os.path.dirname(path)
        out.append(path)
    return out


def disk_programs(config: config_mod.Config) -> list[Finding]:
    """mkfs.<fs_type> where a disk backing is configured: without it every job with a
    disk capacity fails its prolog (the node drains)."""
    from jobns.launcher.backing import diskimage
    from jobns.launcher.system import sysprog

    users = disk_users(config)
    if not users:
        return []
    name = f"mkfs.{diskimage.fs_type(config)}"
    try:
        return [(OK, f"{name} is {sysprog.find(name)} (for {', '.join(users)})")]
    except sysprog.NotFound as e:
        return [(PROBLEM, f"{name} (for {', '.join(users)}): {e.strerror}")]


def pid_namespace(config: config_mod.Config) -> list[Finding]:
    """[namespace] pid: honoured only with [slurm] enforce (launcher.mountns.pins), and its init is
    /usr/bin/sleep, found as root finds every program (a prolog fails without it)."""
    if not config.pid_ns:
        return []
    if not config.enforce:
        return [(PROBLEM, config_mod.PID_NS_IGNORED)]
    from jobns.launcher.system import sysprog

    try:
        sleep = sysprog.find("sleep")
    except sysprog.NotFound as e:
        return [(PROBLEM, f"[namespace] pid: the job's init: {e}; fix: install coreutils")]
    return [(OK, f"[namespace] pid: each job gets a PID namespace (its init: {sleep})")]


def programs(config: config_mod.Config) -> list[Finding]:
    """The site's programs: [lifecycle] pre_run/post_run (root runs them: only root may
    replace them; one that cannot run fails every prolog, and the node drains) and
    [arc] movetool (the job user runs it; staging fails without it)."""
    import shlex

    from jobns.launcher.system import sysprog

    named = [
        ("[lifecycle] pre_run", config.lifecycle.pre_run, True),
        ("[lifecycle] post_run", config.lifecycle.post_run, True),
        ("[arc] movetool", config.arc.movetool if config.arc else "", False),
    ]
    out: list[Finding] = []
    for key, command, as_root in named:
        if not command:
            continue
        try:
            path = sysprog.find(shlex.split(command)[0])
        except (ValueError, IndexError):
            continue  # config.load refused it already
        except sysprog.NotFound as e:
            out.append((PROBLEM, f"{key} = {command!r}: {e}; fix: install it, or change {key}"))
            continue
        why = sysprog.untrusted(path)
        if why and (as_root or why in ("missing", "not an executable file")):
            why = f"{path}: {'no such file' if why == 'missing' else why}"
            out.append((PROBLEM, f"{key} = {command!r}: {why}; fix: a program of root's"))
        else:
            out.append((OK, f"{key}: {path}"))
    return out


def slurm_commands(config: config_mod.Config, conf: str) -> list[Finding]:
    """Slurm's commands jobns runs, where root finds them (launcher.system.sysprog, then
    [slurm] bin_dir first): squeue for tmp_from_slurm (without it every job gets the
    site default) and for gc on a Slurm node (without it gc judges by records)."""
    from jobns.launcher.system import sysprog

    wanted = []
    if config.capacity.get("tmp_from_slurm") == "scontrol":
        wanted.append(("squeue", '[capacity] tmp_from_slurm = "scontrol"', PROBLEM))
    elif os.path.exists(conf):
        wanted.append(("squeue", "jobns gc", NOTE))
    out: list[Finding] = []
    for name, user, kind in wanted:
        try:
            out.append((OK, f"{name} is {sysprog.find(name, config.slurm_bin)} (for {user})"))
        except sysprog.NotFound as e:
            out.append((kind, f"{user} needs {e}"))
    return out


def scripts_by_name(conf: str) -> list[Finding]:
    """slurmd runs the Prolog and Epilog with no PATH: a script that runs jobns by a name
    the shell's default search does not find fails every job (the node drains)."""
    from jobns.launcher.system import sysprog

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


def _regular_text(path: str, limit: int = 1 << 20) -> str | None:
    """The text of the regular file at path (its first `limit` bytes), or None. Opened
    without blocking and checked before reading: a FIFO or a device named in a config
    must not hang doctor."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


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


def _shown(text: str) -> str:
    # Values come from files: no line break or terminal escape reaches the output raw.
    return text if text.isprintable() else repr(text)


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


def propagation() -> list[Finding]:
    from jobns.launcher.system.mountinfo import propagation_warning

    warning = propagation_warning()
    if warning:
        return [(PROBLEM, warning.replace("; make it shared", "; fix: make it shared", 1))]
    return [(OK, "/ is a shared mount: host mounts made later reach running jobs")]


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
    marker = f"{state_dir}/tasks-wait"
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
    helper = _live_pid(f"{state_dir}/helper/pid")
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


def _slurm_values_or_none(conf: str) -> dict[str, str] | None:
    """slurm.conf's values, or None where slurm() already said it cannot read it."""
    try:
        return slurm_conf_values(conf)
    except OSError:
        return None


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


PACKAGED_PLUGSTACK = "/etc/slurm/plugstack.conf.d/jobns.conf"  # shipped by jobns-slurm


def enable_plugin_hint(plugstack: str, packaged: str = PACKAGED_PLUGSTACK) -> str:
    """How to make plugstack load the plugin on this node: the package's way (uncomment
    the line jobns-slurm ships, which Debian's plugstack.conf includes) where that file
    is installed, else the from-source line."""
    import fnmatch

    so = installed_spank_plugin()
    lines = [ln.strip() for ln in (_regular_text(packaged) or "").splitlines()]
    active = any(ln.split()[:1] == ["required"] for ln in lines)
    commented = any(
        ln.startswith("#") and ln.lstrip("#").split()[:1] == ["required"] for ln in lines
    )
    if not (active or commented):
        if sys.executable.startswith("/usr/") and not os.path.isfile(so):
            return f"apt-get install jobns-slurm, then uncomment the line it ships in {packaged}"
        return f"add 'required {so}' to {plugstack}"
    steps = [] if active else [f"uncomment the 'required' line in {packaged} (package jobns-slurm)"]
    includes = []
    for raw in (_regular_text(plugstack) or "").splitlines():
        words = raw.split("#", 1)[0].split()
        if len(words) >= 2 and words[0] == "include":
            includes.append(os.path.join(os.path.dirname(plugstack), words[1]))
    if not any(fnmatch.fnmatch(packaged, pattern) for pattern in includes):
        steps.append(f"add 'include {os.path.dirname(packaged)}/*.conf' to {plugstack}")
    return " and ".join(steps)


def spank(plugstack: str, enforce: bool = False) -> list[Finding]:
    """A `required|optional /path/jobns*.so` line in plugstack.conf (or a file it
    includes): the plugin must exist, and the config must say [slurm] enforce = true
    (and only then). None is a note (the prolog pair suffices)."""
    plugins = [so for _, so in spank_plugins(plugstack)]
    if not plugins:
        if enforce:
            return [
                (
                    PROBLEM,
                    f"[slurm] enforce = true, but {plugstack} loads no jobns SPANK "
                    "plugin: jobs get root's namespaces that no task enters; fix: "
                    f"{enable_plugin_hint(plugstack)}, then restart slurmd "
                    '(docs/admin.md "Enforced by Slurm"); or unset enforce',
                )
            ]
        return [
            (
                NOTE,
                f"no jobns SPANK plugin in {plugstack} (optional: the Prolog/Epilog "
                "pair and jobns run are the whole deployment)",
            )
        ]
    out: list[Finding] = []
    if not enforce:
        out.append(
            (
                PROBLEM,
                f"{plugstack} loads the jobns SPANK plugin, but the config does "
                "not say [slurm] enforce = true: every task fails; fix: set it in "
                "jobns.toml on this node",
            )
        )
    for so in plugins:
        if os.path.isfile(so):
            out.append((OK, f"SPANK plugin {so} (named in {plugstack})"))
        else:
            out.append(
                (
                    PROBLEM,
                    f"{plugstack} names the SPANK plugin {so}, which does not "
                    "exist (slurmd will fail for 'required' lines); fix: install it, or "
                    "remove the line",
                )
            )
    return out


def spank_build(plugstack: str, enforce: bool, slurm_version: str | None = None) -> list[Finding]:
    """Each jobns SPANK plugin was built for the Slurm this node runs, and is `required`
    where jobs are enforced. Slurm loads a plugin only into the major.minor release whose
    headers built it (its `plugin_version` symbol, SLURM_VERSION_NUMBER) and refuses
    another ("Incompatible Slurm plugin version"): a `required` line then keeps slurmd
    from starting and fails every step, while an `optional` one lets every job run
    outside its namespace without a word (measured on 26.05 with a 22.05 build: tests/
    e2e/test_rig_slurm_upgrade.py). slurm_version: `slurmd -V`'s (asked when None)."""
    plugins = [(kind, so) for kind, so in spank_plugins(plugstack) if os.path.isfile(so)]
    if not plugins:
        return []  # spank() says whether that is a problem
    version = slurm_version if slurm_version is not None else _slurmd_version()
    out: list[Finding] = []
    for kind, so in plugins:
        if kind == "optional" and enforce:
            out.append(
                (
                    PROBLEM,
                    f"{plugstack} loads {so} as 'optional' while [slurm] enforce = true: if "
                    "it cannot be loaded (built for another Slurm, removed), jobs run outside "
                    "their namespaces and nothing says so; fix: make the line 'required' "
                    "(then such a node runs no job at all), restart slurmd",
                )
            )
        built = _plugin_version(so)
        rebuild = (
            f"fix: rebuild it against this node's Slurm headers (apt-get install gcc "
            f"libslurm-dev; ci/build-spank --output {so}; or the jobns-slurm package "
            "built for this Slurm: ci/build-deb), then restart slurmd"
        )
        if built is None:
            out.append(
                (
                    PROBLEM,
                    f"SPANK plugin {so} has no plugin_version symbol: not a SPANK plugin "
                    f"Slurm can load; {rebuild}",
                )
            )
        elif not version:
            out.append(
                (
                    NOTE,
                    f"SPANK plugin {so} was built for Slurm {built}; this node's Slurm is "
                    f"unknown (no slurmd -V): it loads only into Slurm {built}",
                )
            )
        elif built.split(".")[:2] != version.split(".")[:2]:
            out.append(
                (
                    PROBLEM,
                    f"SPANK plugin {so} was built for Slurm {built}, but this node runs "
                    f"Slurm {version}: Slurm refuses it (a 'required' line keeps slurmd "
                    "from starting, an 'optional' one runs jobs outside their namespaces); "
                    f"{rebuild}",
                )
            )
        else:
            out.append((OK, f"SPANK plugin {so} was built for Slurm {built} (node: {version})"))
    return out


def plugstack_of(conf: str, values: dict[str, str]) -> str:
    """The plugstack.conf slurm.conf names (PlugStackConfig=), else the one beside it."""
    return values.get("plugstackconfig") or f"{os.path.dirname(conf)}/plugstack.conf"


def enforcement_problems(conf: str) -> list[str]:
    """For `jobns status` on a node whose config says [slurm] enforce = true: what keeps
    its jobs from being enforced (the plugin not named, missing, `optional`, or built
    for another Slurm), as doctor's problem texts; [] when all is well or there is no
    slurm.conf to read."""
    try:
        values = slurm_conf_values(conf)
    except OSError:
        return []
    plugstack = plugstack_of(conf, values)
    found = spank(plugstack, True) + spank_build(plugstack, True)
    return [text for kind, text in found if kind == PROBLEM]


def _slurmd_version() -> str:
    """The Slurm release of this node's slurmd ("22.05.8"), or "" if there is none."""
    import subprocess

    from jobns.launcher.system import sysprog

    try:
        r = subprocess.run(
            [sysprog.find("slurmd"), "-V"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
            env=sysprog.environment(),
        )
    except (OSError, subprocess.TimeoutExpired):  # sysprog.NotFound is an OSError
        return ""
    words = r.stdout.split()
    return words[-1] if r.returncode == 0 and words else ""


# ELF constants (elf(5)): the class and byte order in e_ident, section types
ELFCLASS64, ELFDATA2MSB, SHT_SYMTAB, SHT_DYNSYM, SHT_NOBITS = 2, 2, 2, 11, 8


def _plugin_version(path: str) -> str | None:
    """`plugin_version` of a Slurm plugin ("22.05.8"), read from the ELF file without
    loading it (loading runs its constructors, as root); None if it has no such symbol."""
    import struct

    try:
        with open(path, "rb") as f:
            data = f.read(64 << 20)
        if data[:4] != b"\x7fELF":
            return None
        end = ">" if data[5] == ELFDATA2MSB else "<"
        wide = data[4] == ELFCLASS64
        # e_shoff, then e_shentsize, e_shnum (ELF64 / ELF32 offsets)
        shoff = struct.unpack_from(end + ("Q" if wide else "I"), data, 0x28 if wide else 0x20)[0]
        shentsize, shnum = struct.unpack_from(end + "HH", data, 0x3A if wide else 0x2E)
        shdr = end + ("IIQQQQIIQQ" if wide else "IIIIIIIIII")
        # (type, addr, offset, size, link, entsize) of each section
        sections = [
            tuple(
                struct.unpack_from(shdr, data, shoff + i * shentsize)[j] for j in (1, 3, 4, 5, 6, 9)
            )
            for i in range(shnum)
        ]
        sym = end + ("IBBHQQ" if wide else "IIIBBH")
        for kind, _addr, offset, size, link, entsize in sections:
            if kind not in (SHT_DYNSYM, SHT_SYMTAB) or not entsize:
                continue
            strtab = sections[link][2]
            for at in range(offset, offset + size, entsize):
                fields = struct.unpack_from(sym, data, at)
                name, shndx, value = (
                    (fields[0], fields[3], fields[4]) if wide else (fields[0], fields[5], fields[1])
                )
                end_of_name = data.index(b"\0", strtab + name)
                if data[strtab + name : end_of_name] != b"plugin_version":
                    continue
                if not 0 < shndx < len(sections) or sections[shndx][0] == SHT_NOBITS:
                    return None
                where = sections[shndx][2] + value - sections[shndx][1]
                number = struct.unpack_from(end + "I", data, where)[0]
                return f"{number >> 16 & 0xFF}.{number >> 8 & 0xFF:02d}.{number & 0xFF}"
    except (OSError, struct.error, IndexError, ValueError):
        return None
    return None


def pam_stack(path: str, depth: int = 0) -> list[tuple[str, str]]:
    """(type, module file name) of each line of a PAM service file, in order, with
    `@include`d files (relative to its directory) spliced in; a leading `-` (use the
    module if it exists) dropped."""
    out: list[tuple[str, str]] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    for raw in lines:
        words = raw.split("#", 1)[0].split()
        if len(words) >= 2 and words[0] == "@include":
            inc = words[1] if words[1].startswith("/") else f"{os.path.dirname(path)}/{words[1]}"
            if depth < 8:  # includes nest rarely; never loop
                try:
                    out += pam_stack(inc, depth + 1)
                except OSError:
                    pass
            continue
        module = 2
        if len(words) > 1 and words[1].startswith("["):  # [value=action ...] spans words
            module = next((i + 1 for i, w in enumerate(words) if w.endswith("]")), len(words))
        if len(words) > module:
            out.append((words[0].lstrip("-"), os.path.basename(words[module])))
    return out


def sshd_pam(path: str, slurm_values: dict[str, str]) -> list[Finding]:
    """With [slurm] enforce = true: an ssh session that pam_slurm_adopt adopts into a job
    reaches the job's namespace only through pam_jobns, stacked after pam_slurm_adopt in
    sshd's account stack (which sets SLURM_JOB_ID there) and in its session stack (where
    it joins); pam_slurm_adopt adopts only into jobs with an extern step (Contain)."""
    try:
        stack = pam_stack(path)
    except FileNotFoundError:
        return [(NOTE, f"no {path}: ssh logins to this node not checked")]
    except OSError as e:
        return [(PROBLEM, f"read {path}: {e.strerror}")]
    account = [m for t, m in stack if t == "account"]
    session = [m for t, m in stack if t == "session"]
    adopt = "pam_slurm_adopt.so"
    if adopt not in account:
        return [
            (
                NOTE,
                f"{path} has no pam_slurm_adopt: ssh logins to this node run outside "
                'every job\'s namespace (docs/admin.md "Enforced by Slurm", ssh)',
            )
        ]
    fix = (
        f"fix: 'account required {PAM_MODULE}' right after pam_slurm_adopt and 'session "
        f"required {PAM_MODULE}' in {path} (man pam_jobns)"
    )
    out: list[Finding] = []
    if PAM_MODULE not in account[account.index(adopt) :] or PAM_MODULE not in session:
        out.append(
            (
                PROBLEM,
                f"{path}: pam_slurm_adopt adopts ssh sessions into jobs, but pam_jobns "
                "does not follow it in the account stack and join in the session stack: "
                f"adopted sessions run in the node's own /tmp and /dev/shm; {fix}",
            )
        )
    else:
        out.append((OK, f"{path}: pam_jobns follows pam_slurm_adopt (account, session)"))
    if (
        not any(glob.glob(f"{d}/{PAM_MODULE}") for d in ("/usr/lib/*/security", "/lib/*/security"))
        and PAM_MODULE in account + session
    ):
        out.append(
            (
                PROBLEM,
                f"{path} names {PAM_MODULE}, which is not installed (every ssh login "
                "fails); fix: apt-get install jobns-slurm",
            )
        )
    flags = slurm_values.get("prologflags", "").lower().split(",")
    if "contain" not in flags:
        out.append(
            (
                PROBLEM,
                "pam_slurm_adopt adopts only into a job with an extern step, and "
                "slurm.conf has no PrologFlags=Contain: every ssh login of a job's user is "
                "refused; fix: PrologFlags=Contain in slurm.conf",
            )
        )
    return out


JOBNS_CONTAINER = ("job_container/jobns", "namespace/jobns")
PRIVATE = ("/tmp", "/var/tmp", "/dev/shm")  # what every job's namespace covers


def slurm_namespace_plugins(
    slurm_values: dict[str, str], slurm_version: str | None = None, conf_dir: str = "/etc/slurm"
) -> list[Finding]:
    """With [slurm] enforce = true: no Slurm namespace plugin besides jobns's own
    (job_container/tmpfs, namespace/tmpfs, namespace/linux would put every task in a
    namespace of their own too, and a task can be in only one); jobns's own
    (job_container/jobns, namespace/jobns: docs/admin.md "Inside Slurm: the job_container
    and namespace plugin") built for exactly this Slurm, with what its release needs
    around it; and SlurmdSpoolDir outside the job's private directories.
    slurm_version: `slurmd -V`'s (asked when None)."""
    out: list[Finding] = []
    ours = ""
    for key, shown, none in (
        ("jobcontainertype", "JobContainerType", "job_container/none"),
        ("namespacetype", "NamespaceType", "namespace/none"),
    ):
        value = slurm_values.get(key, "")
        if value.lower() in JOBNS_CONTAINER:
            ours = value.lower()
        elif value and value.lower() != none:
            out.append(
                (
                    PROBLEM,
                    f"{shown}={value} is configured while jobns enforces every job's "
                    "namespace ([slurm] enforce = true): each task would be put in two "
                    f"namespaces and ends up in whichever came last; fix: {shown}="
                    f"{'namespace' if key == 'namespacetype' else 'job_container'}/jobns "
                    "(jobns's own plugin of that type) instead, or remove the line",
                )
            )
    spool = slurm_values.get("slurmdspooldir", "/var/spool/slurmd")
    if _inside_any(spool, list(PRIVATE)):
        out.append(
            (
                PROBLEM,
                f"SlurmdSpoolDir={spool} lies in a directory every job gets its own of: "
                "what Slurm does for a job inside its namespace (sbcast, the step's daemon) "
                "would not find it; fix: SlurmdSpoolDir=/var/spool/slurmd",
            )
        )
    if not ours:
        missing = (
            "no JobContainerType=/NamespaceType= of jobns's: what Slurm itself does for a "
            "job (sbcast to /tmp, srun -o /tmp/..., mpi/pmix's directory, TaskEpilog) "
            "happens in the node's namespace, not the job's; fix: JobContainerType="
            "job_container/jobns (22.05, 24.11), or NamespaceType=namespace/jobns and "
            "PrologFlags=Contain (25.11 and later)"
        )
        return [*out, (NOTE, missing)]
    return out + _jobns_container(ours, slurm_values, slurm_version, conf_dir)


def _jobns_container(
    ours: str, values: dict[str, str], slurm_version: str | None, conf_dir: str
) -> list[Finding]:
    """jobns's job_container/namespace plugin, configured: installed, built for exactly
    this Slurm, and what its release needs besides."""
    import platform

    multiarch = f"{platform.machine()}-linux-gnu"
    dirs = (values.get("plugindir") or f"/usr/lib/{multiarch}/slurm-wlm").split(":")
    name = ours.replace("/", "_") + ".so"
    found = [f"{d}/{name}" for d in dirs if os.path.isfile(f"{d}/{name}")]
    fix = (
        "fix: install jobns-slurm built for this node's Slurm (ci/build-deb on a machine "
        "of this release), then restart slurmd"
    )
    if not found:
        return [
            (
                PROBLEM,
                f"{ours} is configured but {name} is in no PluginDir ({':'.join(dirs)}): "
                f"slurmd does not start; {fix}",
            )
        ]
    so = found[0]
    version = slurm_version if slurm_version is not None else _slurmd_version()
    built = _plugin_version(so)
    out: list[Finding] = []
    if built is None or (version and built != version):
        out.append(
            (
                PROBLEM,
                f"{so} was built for Slurm {built or 'nothing Slurm knows'}, but this node "
                f"runs Slurm {version}: a plugin of this type loads only into the exact "
                f"release it was built for, so slurmd does not start; {fix}",
            )
        )
    flags = values.get("prologflags", "").lower().split(",")
    if ours == "namespace/jobns" and "contain" not in flags:
        out.append(
            (
                PROBLEM,
                "NamespaceType=namespace/jobns needs PrologFlags=Contain (Slurm 25.11 and "
                "later run no namespace plugin without it: slurmd does not start); fix: "
                "add Contain to PrologFlags=",
            )
        )
    if not {"alloc", "contain"} & set(flags):
        out.append(
            (
                NOTE,
                f"{ours} without PrologFlags=Alloc: a node's prolog runs at its first step, "
                "so an sbcast to it before then fails (no namespace to land in); fix: "
                "PrologFlags=Alloc (Contain includes it)",
            )
        )
    release = _release_of(version)
    # From 24.11 slurmd asks the plugin to join the child that execs each step's daemon;
    # 22.05 has no such hook (docs/admin.md "Inside Slurm: the job_container and
    # namespace plugin"), so its slurmstepd makes PMIx's client directory in the node's.
    base = _mpi_conf_value(f"{conf_dir}/mpi.conf", "pmixclitmpdirbase")
    if (release is None or release < (24, 11)) and (
        base is None or _inside_any(base, list(PRIVATE)) or base in PRIVATE
    ):
        out.append(
            (
                NOTE,
                f"Slurm {version or '(version unknown)'} cannot put a step's daemon in the "
                "job's namespace: mpi/pmix makes its client directory (spmix_appdir_*) in "
                f"{base or 'TmpFS (/tmp)'} of the node, where the job's tasks cannot see "
                f"it; fix: PMIxCliTmpDirBase=/var/spool/slurmd/pmix in {conf_dir}/mpi.conf "
                "(a directory of root's outside /tmp, /var/tmp and /dev/shm)",
            )
        )
    if (
        (release is None or release < (25, 11))
        and "x11" in flags
        and "home_xauthority" not in values.get("x11parameters", "")
    ):
        out.append(
            (
                NOTE,
                "X11 forwarding: the xauth file is written outside the job's namespace "
                "(before 25.11 Slurm joins there only for a plugin named tmpfs); fix: "
                "X11Parameters=home_xauthority",
            )
        )
    return out or [(OK, f"{ours} ({so}) built for Slurm {built} (node: {version or '?'})")]


def _release_of(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a Slurm version such as 24.11.5, or None."""
    parts = (version or "").split(".")
    if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return int(parts[0]), int(parts[1])


def _mpi_conf_value(path: str, key: str) -> str | None:
    """A Key=Value of mpi.conf (keys compared lower-cased), or None."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    value = None
    for raw in text.splitlines():
        k, eq, v = raw.split("#", 1)[0].strip().partition("=")
        if eq and k.strip().lower() == key:
            value = v.strip()
    return value


def cdi(directory: str, configured: bool = False) -> list[Finding]:
    """Container Device Interface specs are root's to write: a spec can add any mount and
    hook to a container. configured: it is [cdi] dir, where jobns setup writes each job's
    spec (launcher.mountns.cdi)."""
    off = (
        []
        if configured
        else [
            (
                NOTE,
                "CDI is off ([cdi] dir unset): set it (e.g. "
                "/var/run/cdi) to give containers a job's directories "
                "through --device jobns.dev/job=JOB-ID",
            )
        ]
    )
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        if configured:
            parent = os.path.dirname(directory.rstrip("/")) or "/"
            if os.path.isdir(parent):
                return [(OK, f"CDI directory {directory}: made by the first jobns setup")]
            return [
                (
                    PROBLEM,
                    f"CDI directory {directory} ([cdi] dir) cannot be made: "
                    f"{parent} does not exist; fix: create it, or change [cdi] dir",
                )
            ]
        return [*off, (NOTE, f"no CDI directory {directory}")]
    except OSError as e:
        return [(PROBLEM, f"CDI directory {directory}: {e.strerror}")]
    if not stat.S_ISDIR(st.st_mode):
        return [(PROBLEM, f"CDI directory {directory} is not a directory; fix: remove it")]
    if st.st_uid != 0 or st.st_mode & 0o022:
        return [
            (
                PROBLEM,
                f"CDI directory {directory} is writable by others than root (uid "
                f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}): a user could add mounts "
                f"and hooks to containers; fix: chown root {directory} && chmod 0755 "
                f"{directory}",
            )
        ]
    specs = sum(1 for n in os.listdir(directory) if n.startswith("jobns-"))
    where = " ([cdi] dir: jobns setup writes each job's spec here)" if configured else ""
    return [*off, (OK, f"CDI directory {directory}: root's{where}; {specs} jobns spec(s)")]


def check(
    config: config_mod.Config,
    slurm_conf: str,
    cdi_dir: str,
    cdi_configured: bool = False,
    sshd_pam_file: str = DEFAULT_SSHD_PAM,
    *,
    use_slurm: bool = True,
    container: str | None = None,
) -> list[Finding]:
    """Every check; use_slurm False (--no-slurm): a node that runs jobns without Slurm.
    container: in_container()'s answer (asked when None)."""
    found: list[Finding] = []
    found += kernel()
    found += loop_devices(
        users=disk_users(config), container=in_container() if container is None else container
    )
    found += state_dir(config.state_dir)
    # A base inside none of the job's mount points is covered in its namespace.
    points = ["/tmp", "/var/tmp", "/dev/shm", *(d.path for d in config.dirs)]
    for role in ("local_base", "shm_base", "shared_base"):
        where = str(getattr(config, role))
        found += base(role, where)
        found += reachable(role, where, config.enforce, not _inside_any(where, points))
    for d in config.dirs:
        found += extra_dir(d)
        covered = not _inside_any(d.base, points)
        found += reachable(f"[[dirs]] base of {d.path}:", d.base, config.enforce, covered)
    found += scratch_base(config)
    found += disk_programs(config)
    found += programs(config)
    found += pid_namespace(config)
    found += propagation()
    if use_slurm:
        found += _slurm_checks(config, slurm_conf, sshd_pam_file)
    else:
        found.append((NOTE, "--no-slurm: Slurm's configuration not checked"))
    found += cdi(cdi_dir, cdi_configured)
    return found


def _slurm_checks(config: config_mod.Config, slurm_conf: str, sshd_pam_file: str) -> list[Finding]:
    found = slurm(slurm_conf, config.enforce)
    found += scripts_by_name(slurm_conf)
    found += state_dir_names(config, slurm_conf)
    found += slurm_commands(config, slurm_conf)
    values = _slurm_values_or_none(slurm_conf)
    if values is None:
        return found
    loaded = bool(spank_plugins(plugstack_of(slurm_conf, values)))
    found += prolog_waits(config.state_dir, loaded)
    if config.enforce:
        found += slurm_namespace_plugins(values, conf_dir=os.path.dirname(slurm_conf))
        found += sshd_pam(sshd_pam_file, values)
    return found


Pending = tuple[str, str]  # (what doctor cannot check yet, after what to run it again)


def not_checked_yet(
    config: config_mod.Config, slurm_conf: str, use_slurm: bool = True
) -> list[Pending]:
    """The parts of the deployment doctor cannot judge yet: they make the node not ready
    (exit 125) although no check failed, and the last line says when to run it again.
    No slurm.conf: nothing of Slurm's side was checked (a fresh node: the docs'
    steps configure Slurm after installing jobns). An enforced node whose slurmd has not
    loaded the plugin (no <state_dir>/tasks-wait, which the plugin makes in slurmd):
    the running slurmd predates the plugstack.conf line, or does not run."""
    if not use_slurm:
        return []
    if not os.path.exists(slurm_conf):
        return [(f"Slurm is not configured yet (no {slurm_conf})", "configuring Slurm")]
    values = _slurm_values_or_none(slurm_conf)
    if values is None or not config.enforce:
        return []  # unreadable: a problem already
    if spank_plugins(plugstack_of(slurm_conf, values)) and not os.path.exists(
        f"{config.state_dir}/tasks-wait"
    ):
        return [
            (
                "slurmd has not loaded the jobns SPANK plugin since it started (no "
                f"{config.state_dir}/tasks-wait)",
                "(re)starting slurmd",
            )
        ]
    return []


def verdict(found: list[Finding], pending: list[Pending]) -> tuple[str, int]:
    """doctor's last line and exit status: 0 only with no problem and nothing pending."""
    problems = sum(1 for kind, _ in found if kind == PROBLEM)
    what = "; ".join(w for w, _ in pending)
    after = [a for _, a in pending]
    if problems:
        line = f"jobns doctor: {problems} problem(s) to fix before this node runs jobs"
        if pending:
            line += f"; not checked yet: {what}"
        return f"{line}; run jobns doctor again after {' and '.join(['fixing them', *after])}", (
            EXIT_JOBNS_FAILED
        )
    if pending:
        return (
            f"jobns doctor: not ready yet: {what}; run jobns doctor again after "
            f"{' and '.join(after)}",
            EXIT_JOBNS_FAILED,
        )
    return "jobns doctor: this node is ready", 0


def config_problem(error: JobnsError, where: str) -> str:
    """The problem line for a jobns.toml that does not load (every check needs it)."""
    return (
        f"{error}; fix: correct {where} (every key: docs/config.md and man jobns; the "
        "packaged /etc/jobns/jobns.toml lists each one, commented out), or remove it to "
        "use the built-in defaults"
    )


def slurm_conf_path(given: object = None) -> str:
    """--slurm-conf, else $SLURM_CONF, else /etc/slurm/slurm.conf."""
    return str(given or os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF)


def main(opts: Options, _command: list[str]) -> int:
    from jobns.launcher.lifecycle.lifecycle import require_root

    require_root("doctor")
    slurm_conf = slurm_conf_path(opts.get("slurm_conf"))
    use_slurm = not opts.get("no_slurm")
    given = str(opts["config"]) if opts.get("config") else None
    try:
        config = config_mod.load(given)
    except JobnsError as e:
        where = config_mod.config_path(given, dict(os.environ))[0] or config_mod.DEFAULT_PATH
        print(f"{PROBLEM}: {config_problem(e, _shown(where))}")
        print(
            "jobns doctor: 1 problem(s) to fix before this node runs jobs; nothing else "
            "was checked (every check needs the config): run jobns doctor again after fixing it"
        )
        return EXIT_JOBNS_FAILED
    from jobns.launcher.mountns.cdi import settings

    cdi_conf = settings(config)
    cdi_dir = str(opts.get("cdi_dir") or (cdi_conf.dir if cdi_conf else DEFAULT_CDI_DIR))
    found = check(config, slurm_conf, cdi_dir, cdi_conf is not None, use_slurm=use_slurm)
    for kind, text in found:
        print(f"{kind}: {text}")
    line, code = verdict(found, not_checked_yet(config, slurm_conf, use_slurm))
    print(line)
    return code
