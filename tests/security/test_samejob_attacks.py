"""Attacks of one job on another job of the same user. File permissions cannot keep them
apart (both are alice's), so a job must not see the host directories that back another
job's trees at all: inside a job, every base that holds job trees (a local_base or
shared_base outside /tmp, each [[dirs]] base) shows only that job's own trees."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.security.conftest import NS_JOIN, World, no_crash

pytestmark = pytest.mark.root

SECRET = "secret-of-job-72"

# argv: PID PATH...: enter the user and mount namespaces of PID (a task of her own
# voluntary job: they are hers) and try to unmount or move away what covers each PATH.
NS_UNCOVER = (
    NS_JOIN
    + r"""
for path in sys.argv[2:]:
    r = libc.umount2(path.encode(), 2)  # MNT_DETACH
    print(path, "unmounted" if r == 0 else os.strerror(ctypes.get_errno()))
    os.makedirs("/tmp/moved", exist_ok=True)
    r = libc.mount(path.encode(), b"/tmp/moved", None, 8192, None)  # MS_MOVE
    print(path, "moved" if r == 0 else os.strerror(ctypes.get_errno()))
    r = libc.mount(path.encode(), b"/tmp/moved", None, 4096, None)  # MS_BIND, not recursive
    print(path, "bound" if r == 0 else os.strerror(ctypes.get_errno()))
print("done")
"""
)


LIFTED = (["unmounted"], ["moved"], ["bound"])


class Site:
    """The sandbox's bases (local_base and shared_base outside /tmp) and one [[dirs]]
    entry, a plain directory in a sticky world-writable base; enforced or not."""

    def __init__(self, world: World, enforce: bool, layout: str) -> None:
        root = world.box.root
        self.world = world
        self.enforce = enforce
        self.layout = ["--use-shared-tmpdir=per-node"] if layout == "per-node" else []
        self.scratch_base = world.box.shared if layout == "per-node" else world.box.local
        self.dirs_base = root / "xdir"
        self.dirs_base.mkdir()
        self.dirs_base.chmod(0o1777)
        self.target = root / "mnt" / "scratch"
        self.target.mkdir(parents=True)
        slurm = "[slurm]\nenforce = true\n" if enforce else ""
        world.box.write_config(
            slurm + f'[[dirs]]\npath = "{self.target}"\nbase = "{self.dirs_base}"\n'
        )

    def setup(self, job: str) -> None:
        r = self.world.setup(job, *self.layout)
        assert r.returncode == 0, r.stderr
        no_crash(r)

    def run(self, job: str, script: str) -> str:
        """A task of the job, started by root (which joins, then becomes alice) when the
        site enforces namespaces, by alice herself otherwise; its output."""
        r = self.world.run(job, script, user=None if self.enforce else self.world.alice)
        no_crash(r)
        return r.stdout + r.stderr

    def host_paths(self, job: str) -> list[Path]:
        """Where the host keeps the job's files named s (its /tmp, its extra directory)."""
        found = [*self.scratch_base.glob(f"job-{job}/**/tmp/s"), self.dirs_base / f"job-{job}/s"]
        assert all(p.read_text() == f"{SECRET}\n" for p in found if job == "72"), found
        return found


@pytest.mark.parametrize("layout", ["local", "per-node"])
@pytest.mark.parametrize("enforce", [False, True], ids=["voluntary", "enforced"])
def test_another_job_of_hers_sees_nothing_of_this_job(
    world: World, enforce: bool, layout: str
) -> None:
    """Attack: alice runs jobs 71 and 72 at once. Job 72 keeps a file in /tmp and in its
    extra directory; a task of job 71 reads them by their host paths, <base>/job-72/...,
    which stay visible in 71's namespace wherever the base is not hidden by one of 71's
    own binds (a local_base or shared_base outside /tmp, every [[dirs]] base), and lists
    the bases to find other jobs. In the voluntary mode she also tries to unmount, move
    or bind (non-recursively) what hides them, in the namespace she owns. Defence: setup
    covers each such base in the job's namespace with an empty read-only tmpfs of
    root's, holding only the job's own trees at their usual paths: job 71 sees nothing of
    72 and still reaches its own trees there; the covers cannot be lifted."""
    site = Site(world, enforce, layout)
    site.setup("71")
    site.setup("72")
    out = site.run("72", f"echo {SECRET} > /tmp/s; echo {SECRET} > {site.target}/s; echo ok")
    assert "ok" in out, out
    theirs = site.host_paths("72")
    bases = [site.scratch_base, site.dirs_base]
    look = "; ".join(
        [*(f"cat {p} 2>/dev/null || echo gone" for p in theirs), *(f"ls -A {b}" for b in bases)]
    )
    seen = ["gone"] * len(theirs) + ["job-71"] * len(bases)  # nothing but its own
    assert site.run("71", look).split() == seen
    # Its own trees stay where the job (and a container's hook) finds them by path.
    out = site.run("71", f"echo mine > /tmp/s; echo mine > {site.target}/s; echo done")
    assert "done" in out, out
    mine = site.host_paths("71")
    out = site.run("71", "; ".join(f"cat {p}" for p in mine))
    assert out.split() == ["mine"] * len(mine), out
    if not enforce:
        _, pid = world.task("71", world.alice)
        r = world.python(world.alice, NS_UNCOVER, str(pid), *map(str, bases))
        assert "done" in r.stdout, r.stdout + r.stderr
        lifted = [line for line in r.stdout.splitlines() if line.split()[1:] in LIFTED]
        assert lifted == [], r.stdout
        assert site.run("71", look).split() == seen
    for p in world.procs:
        p.kill()
    for job in ("71", "72"):
        r = world.teardown(job)
        assert (r.returncode, r.stderr) == (0, ""), r.stderr


def test_the_jobs_own_paths_under_a_covered_base_still_work(world: World) -> None:
    """What the covers must not break: an extra directory whose path lies under a
    covered base (local_base here) still gets its mount point, and the job still walks
    to its own trees, when the prolog's umask is 077."""
    box = world.box
    base = box.root / "xdir"
    base.mkdir()
    base.chmod(0o1777)
    target = box.local / "mnt"
    target.mkdir()
    box.write_config(f'[[dirs]]\npath = "{target}"\nbase = "{base}"\n')
    r = box.run(["setup", "--job-id", "73", "--user", world.alice.name], umask=0o077)
    assert r.returncode == 0, r.stderr
    script = f"echo x > {target}/f; test -d {box.local}/job-73/tmp && echo walked; "
    r = world.run("73", script + f"ls -A {box.local}; cat {base}/job-73/f", world.alice)
    assert (r.returncode, r.stdout.split()) == (0, ["walked", "job-73", "mnt", "x"]), r.stderr
    assert world.teardown("73").returncode == 0
