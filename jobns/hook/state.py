"""The OCI state a runtime writes to a hook's stdin: read, parsed, checked, and the stage.

Each field is checked as it is read (launcher.system.fields), as
jobns/schemas/oci-state.schema.json says: jsonschema costs ~100 ms to import, and a hook
runs at every container start.

Stage: the argument (`jobns hook STAGE`) when given, else from the state's status:

  status    stage          why
  creating  createRuntime  runc 1.1 passes "creating" to prestart and createRuntime hooks
  created   createRuntime  crun 1.8 passes "created" to them (runtime-spec's startContainer
                           also sees "created", but runs inside the container, where jobns
                           cannot work: it is refused below when named)
  stopped   poststop
  running   refused        poststart: the container already runs, too late to mount
  paused    refused
"""

from __future__ import annotations

import os

from jobns.launcher.system.errors import JobnsError

TYPE_CHECKING = False  # the hot set imports no typing (docs/speed.md); mypy honours the name
if TYPE_CHECKING:
    from jobns.launcher.system.fields import Doc

CREATE = "createRuntime"
POSTSTOP = "poststop"
# prestart is createRuntime's deprecated twin: both run in the runtime namespace,
# after the container's mounts and before pivot_root.
STAGES = {"prestart": CREATE, "createRuntime": CREATE, "poststop": POSTSTOP}
NOT_HERE = {
    "createContainer": "runs inside the container's mount namespace, not the host's",
    "startContainer": "runs inside the container after pivot_root",
    "poststart": "runs after the container started, too late to mount its /tmp",
}
FROM_STATUS = {"creating": CREATE, "created": CREATE, "stopped": POSTSTOP}
MAX_STATE = 1 << 20
FIX = (
    "jobns hook is run by an OCI runtime with the container state on stdin "
    '(see docs/containers.md "OCI hook")'
)


class OciState:
    __slots__ = ("annotations", "bundle", "id", "pid", "status", "version")

    def __init__(
        self,
        version: str,
        cid: str,
        status: str,
        pid: int,
        bundle: str,
        annotations: dict[str, str],
    ) -> None:
        self.version = version
        self.id = cid
        self.status = status
        self.pid = pid  # host pid of the container's init; 0 when stopped
        self.bundle = bundle
        self.annotations = annotations


def read_stdin() -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            chunk = os.read(0, 65536)
        except OSError as e:
            raise JobnsError(f"read the OCI state on stdin: {e.strerror}; {FIX}") from None
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_STATE:
            raise JobnsError(f"read the OCI state on stdin: more than {MAX_STATE} bytes; {FIX}")
        chunks.append(chunk)


def parse(data: bytes) -> OciState:
    from jobns.launcher.system.fields import Doc
    from jobns.launcher.system.jsonfast import loads

    if not data.strip():
        raise JobnsError(f"read the OCI state on stdin: it is empty; {FIX}")
    try:
        doc = loads(data)
    except ValueError as e:
        raise JobnsError(f"read the OCI state on stdin: not JSON ({e}); {FIX}") from None
    if isinstance(doc, dict) and "bundle" not in doc and "bundlePath" not in doc:
        raise JobnsError(f"read the OCI state on stdin: it names no bundle (nor bundlePath); {FIX}")
    try:
        d = Doc(doc, "read the OCI state on stdin")
        version = _bounded(d, "ociVersion", 256)
        cid = _bounded(d, "id", 1024)
        status = str(d.string("status", choices=STATUSES))
        pid = d.integer("pid", required=False, minimum=0) or 0
        if pid > MAX_PID:
            raise JobnsError(f"read the OCI state on stdin: 'pid' must be at most {MAX_PID}")
        bundle = _bounded(d, "bundle", 4096, required=False)
        bundle_path = _bounded(d, "bundlePath", 4096, required=False)
        annotations = d.string_map("annotations")
    except JobnsError as e:
        raise JobnsError(f"{e}; {FIX}") from None
    bundle = bundle if d.has("bundle") else bundle_path
    if not _clean_path(bundle):
        # The container's name for a directory root opens, checks and names in messages:
        # a NUL, control character or lone surrogate is no bundle a runtime made.
        raise JobnsError(
            f"read the OCI state on stdin: bundle {bundle!r} contains a NUL, a "
            f"control character or a lone surrogate; {FIX}"
        )
    return OciState(version, cid, status, pid, bundle, annotations)


# What jobns/schemas/oci-state.schema.json allows (tests/unit/test_hook_state.py checks
# that parse() refuses exactly what the schema refuses).
STATUSES = ("creating", "created", "running", "stopped", "paused")
MAX_PID = 4194304  # the kernel's pid_max limit


def _bounded(d: Doc, key: str, longest: int, required: bool = True) -> str:
    value = d.string(key, required=required, nonempty=True)
    if value is None:
        return ""
    if len(value) > longest:
        raise JobnsError(f"{d.where}: '{key}' must be at most {longest} characters")
    return value


def _clean_path(path: str) -> bool:
    # Control characters (C0, DEL, C1) and the Unicode line separators: all break a line.
    if any(c < " " or "\x7f" <= c <= "\x9f" or c in "\u2028\u2029" for c in path):
        return False
    try:
        path.encode("utf-8")  # strict: JSON from a runtime is UTF-8, surrogates are not
    except UnicodeEncodeError:
        return False
    return True


def stage_for(arg: str | None, status: str) -> str:
    """createRuntime or poststop, from the argument or else the status (table above)."""
    if arg is not None:
        if arg in STAGES:
            return STAGES[arg]
        if arg in NOT_HERE:
            raise JobnsError(
                f"hook stage {arg}: jobns cannot work there (it {NOT_HERE[arg]}); "
                "install jobns as a createRuntime (or prestart) hook and a "
                "poststop hook"
            )
        raise JobnsError(
            f"hook stage {arg!r}: unknown; expected createRuntime, prestart or poststop"
        )
    if status in FROM_STATUS:
        return FROM_STATUS[status]
    raise JobnsError(
        f"hook: container status {status!r} belongs to no stage jobns works in "
        "(a poststart hook?); install jobns as a createRuntime and a poststop "
        "hook, or name the stage: jobns hook createRuntime|poststop"
    )
