"""PURE: what the burst buffer keeps of a job, and hands the job's prolog.

One JSON file per job, ``<shared_base>/.jobns-bb/job-ID.json`` (root's, 0600, in a
root-only directory on the cluster file system: launcher.burstbuffer.store), written by
``jobns bb`` on the controller and read by ``jobns setup`` on every node of the job:

* the job's directives as its user wrote them (the batch script's header, where its
  ``#JOBNS`` lines are, and its comment), which the prolog parses again with the
  node's configuration; a prolog gets neither from Slurm (only the comment);
* its ``--tmp`` (MiB), so the prolog asks the controller nothing;
* the copies the burst buffer owns (``stage_in`` into and ``stage_out`` out of the
  shared tmpdir, by their directive lines) and which of them are done; the prolog and
  the epilog leave those alone;
* the shared tree it made (its path and identity), which only its teardown removes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jobns.launcher.system.errors import JobnsError
from jobns.launcher.system.fields import Doc

VERSION = 1
DIR = ".jobns-bb"  # in shared_base: '.' is never the start of a job tree's name
POOL = "shared"  # the pool the shared tmpdir is offered as (#BB_LUA pool=shared)

# The burst buffer's own states of a job (Slurm shows its own in `scontrol show burst`).
SET_UP = "set-up"  # the shared tree is made, nothing copied yet
STAGED_IN = "staged-in"
STAGED_OUT = "staged-out"
STAGE_OUT_FAILED = "stage-out-failed"  # outputs kept whole in the shared tree
STATES = (SET_UP, STAGED_IN, STAGED_OUT, STAGE_OUT_FAILED)


def file_name(job_id: str) -> str:
    return f"job-{job_id}.json"


@dataclass(slots=True)
class BbRecord:
    job_id: str
    uid: int
    gid: int
    user: str
    state: str = SET_UP
    layout: str = "local"
    no_rm_tmpdir: bool = False
    size: int = 0  # bytes Slurm reserved for the job in the pool (#BB_LUA capacity=)
    script_header: str = ""
    comment: str = ""
    work_dir: str = ""
    job_name: str = ""
    array_job_id: str = ""
    array_task_id: str = ""
    tmp_mib: int | None = None
    tree_path: str = ""  # the shared tree, when the layout is shared
    # The copies the burst buffer makes ({"source", "destination", "line"}, host paths).
    stage_in: list[dict[str, str]] = field(default_factory=list)
    stage_out: list[dict[str, str]] = field(default_factory=list)
    stage_in_done: list[str] = field(default_factory=list)
    stage_out_done: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def lines(self, key: str) -> frozenset[str]:
        """The directive lines of the copies the burst buffer makes ("stage_in" or
        "stage_out"): the prolog's and the epilog's staging leave them out."""
        copies: list[dict[str, str]] = getattr(self, key)
        return frozenset(c["line"] for c in copies)

    def to_json(self) -> bytes:
        import json  # not at the top: every prolog imports this module, few read a record

        d = {"version": VERSION}
        d.update({k: getattr(self, k) for k in FIELDS})
        return (json.dumps(d, indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> BbRecord:
        import json

        try:
            raw = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise JobnsError(f"read burst-buffer record {where}: not JSON ({e})") from None
        doc = Doc(raw, f"burst-buffer record {where}").closed(("version", *FIELDS))
        if doc.integer("version") != VERSION:
            raise JobnsError(
                f"read burst-buffer record {where}: version {raw.get('version')!r} is not "
                f"{VERSION}; was it written by another jobns release?"
            )
        state = doc.string("state")
        if state not in STATES:
            raise JobnsError(f"read burst-buffer record {where}: unknown state {state!r}")
        tmp = doc.integer("tmp_mib", minimum=1, null=True)

        def ints(key: str) -> int:
            value = doc.integer(key)
            assert value is not None
            return value

        def texts(key: str) -> str:
            value = doc.string(key)
            assert value is not None
            return value

        def lines(key: str) -> list[str]:
            return list(doc.strings(key) or [])

        def copies(key: str) -> list[dict[str, str]]:
            out = []
            for c in doc.objects(key):
                c.closed(COPY_KEYS)
                out.append({k: str(c.string(k)) for k in COPY_KEYS})
            return out

        return cls(
            job_id=texts("job_id"),
            uid=ints("uid"),
            gid=ints("gid"),
            user=texts("user"),
            state=texts("state"),
            layout=texts("layout"),
            no_rm_tmpdir=doc.boolean("no_rm_tmpdir") is True,
            size=ints("size"),
            script_header=texts("script_header"),
            comment=texts("comment"),
            work_dir=texts("work_dir"),
            job_name=texts("job_name"),
            array_job_id=texts("array_job_id"),
            array_task_id=texts("array_task_id"),
            tmp_mib=tmp,
            tree_path=texts("tree_path"),
            stage_in=copies("stage_in"),
            stage_out=copies("stage_out"),
            stage_in_done=lines("stage_in_done"),
            stage_out_done=lines("stage_out_done"),
            errors=lines("errors"),
        )


COPY_KEYS = ("source", "destination", "line")
FIELDS = tuple(BbRecord.__dataclass_fields__)
