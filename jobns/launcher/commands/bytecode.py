"""Load jobns's own modules straight from their cached byte code (the task-launch path).

jobns runs once per task, and a task launch imports about twenty of its own modules.
The import system spends ~45 us on each before any of the module's code runs (module
locks, five suffix probes per directory, spec and loader objects, a stat of the source,
the pyc header checks): ~0.8 ms of a launch that costs ~4 ms above the bare interpreter.
The installed `jobns` (commands/entry.py, the script pip writes from [project.scripts])
calls start() first, then imports the CLI and calls loaded():

* `jobns run` preloads LAUNCH, the modules every task launch imports, in an order where
  each module's own imports come before it: each pyc is read, checked and run into a
  new module object directly (~7 us of overhead each);
* every other import of a jobns module goes through Finder, first on sys.meta_path: it
  maps the name to the pyc under the package's own __pycache__ (~15 us).

Both use a pyc only if importlib would (checked_code: magic number, flags 0, the
source's mtime and size). A missing, stale, hash-based or unreadable pyc is left to
the standard finders, which import the module as usual and write its pyc when they
can; preloading stops there and the rest is imported on demand. So the code that runs
is always the code importlib would run: tests/unit/test_bytecode.py checks that the
two agree, and tests/integration/test_bytecode.py that the installed `jobns run` loads
every module of its launch path this way.
"""

from __future__ import annotations

import sys
from marshal import loads

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.abc import Loader as _LoaderBase  # for mypy only: never imported
    from types import CodeType, ModuleType
else:
    _LoaderBase = object

PACKAGES = ("jobns.launcher.", "jobns.hook.", "jobns.schemas.")

# The modules every `jobns run` imports, each after the modules it imports at its top
# (the unit test checks the order, the integration test that none is missing), named
# below jobns.launcher; a floor (a name without a dot) is a package, loaded before its
# modules. A task that makes its own namespace also needs plan (and fields), fs, locking
# and removal: those come through the finder, so that the far more frequent task joining
# a set-up job does not load them. The floor commands, this module's own package, is
# loaded by then.
LAUNCH = (
    "system",
    "system.errors",
    "system.libc",
    "system.fastimport",
    "model",
    "model.job",
    "model.config",
    "model.request",
    "model.inputs",
    "system.fork",
    "system.supervise",
    "system.user",
    "mountns",
    "mountns.namespace",
    "commands.cli",
    "commands.run",
    "model.enforced",
    "system.files",
    "protocol",
    "protocol.state",
    "model.environment",
)


# The hot set: every jobns module `jobns run` and the OCI hook (`jobns hook createRuntime`,
# `poststop`) import, named below jobns (tests/integration/test_hot_set.py measures the
# real runs and checks that this is exactly what they import). These run once per task or
# per container, so their start is launch time, and only they may use the speed tricks
# docs/speed.md lists ("The hot set"): `TYPE_CHECKING = False` instead of importing typing,
# hand-written __slots__ classes instead of dataclasses, jsonfast instead of json,
# fastimport's signal. Every other module is plain Python (tests/unit/test_hot_set.py).
HOT = (
    "launcher.system.errors",
    "launcher.system.libc",
    "launcher.system.fastimport",
    "launcher.system.files",
    "launcher.system.fork",
    "launcher.system.supervise",
    "launcher.system.user",
    "launcher.system.removal",
    "launcher.system.locking",
    "launcher.system.mountinfo",
    "launcher.system.jsonfast",
    "launcher.system.fields",
    "launcher.protocol.state",
    "launcher.model.job",
    "launcher.model.config",
    "launcher.model.request",
    "launcher.model.inputs",
    "launcher.model.enforced",
    "launcher.model.environment",
    "launcher.model.plan",
    "launcher.model.record",
    "launcher.backing.fs",
    "launcher.mountns.namespace",
    "launcher.commands.bytecode",
    "launcher.commands.entry",
    "launcher.commands.cli",
    "launcher.commands.run",
    "hook.hook",
    "hook.state",
    "hook.holds",
    "hook.bundle",
    "hook.identity",
    "hook.mounts",
    "hook.rootfs",
)


class _Loader(_LoaderBase):
    """Runs one module's already-checked code object in the module's namespace."""

    __slots__ = ("cached", "code", "origin")

    def __init__(self, code: CodeType, origin: str, cached: str) -> None:
        self.code = code
        self.origin = origin
        self.cached = cached

    def create_module(self, spec: object) -> None:
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        module.__file__ = self.origin
        module.__cached__ = self.cached  # type: ignore[attr-defined]
        exec(self.code, module.__dict__)  # noqa: S102 -- jobns's own compiled code


def _paths(directory: str, leaf: str, package: bool = False) -> tuple[str, str]:
    tag = sys.implementation.cache_tag
    if package:
        directory, leaf = f"{directory}/{leaf}", "__init__"
    return f"{directory}/{leaf}.py", f"{directory}/__pycache__/{leaf}.{tag}.pyc"


def _magic() -> bytes:
    import _frozen_importlib_external  # always loaded: it is the import system

    magic: bytes = _frozen_importlib_external.MAGIC_NUMBER
    return magic


def checked_code(origin: str, cached: str, magic: bytes) -> CodeType | None:
    """The code in pyc `cached` if importlib would use it for source `origin`, else None."""
    import os  # plain fds: an io file object costs more than the read

    try:
        fd = os.open(cached, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size  # a buffer of just that size: a large one costs
            data = os.read(fd, size + 1)
        finally:
            os.close(fd)
        st = os.stat(origin)
    except OSError:
        return None  # no pyc yet, or no such module: the standard finders decide
    if (
        len(data) != size  # changed while being read: importlib's turn
        or data[:4] != magic
        or data[4:8] != b"\0\0\0\0"  # a hash-based pyc: importlib's own rules apply
        or int.from_bytes(data[8:12], "little") != int(st.st_mtime) & 0xFFFFFFFF
        or int.from_bytes(data[12:16], "little") != st.st_size & 0xFFFFFFFF
    ):
        return None
    try:
        # The very pyc importlib would load, from the root-owned install: no new trust.
        code: CodeType = loads(memoryview(data)[16:])  # noqa: S302
    except (EOFError, ValueError, TypeError):
        return None  # a damaged pyc: importlib's turn (it reports it as it always would)
    return code


class Finder:
    """A sys.meta_path finder for jobns's modules and its floors' packages."""

    def __init__(self) -> None:
        self.magic = _magic()

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> object:
        if not name.startswith(PACKAGES) or path is None or len(path) != 1:
            return None
        leaf = name.rpartition(".")[2]
        origin, cached = _paths(path[0], leaf)
        code = checked_code(origin, cached, self.magic)
        is_package = code is None  # no such module: perhaps a floor's package
        if is_package:
            origin, cached = _paths(path[0], leaf, package=True)
            code = checked_code(origin, cached, self.magic)
        if code is None:
            return None
        from _frozen_importlib import ModuleSpec

        spec = ModuleSpec(name, _Loader(code, origin, cached), origin=origin, is_package=is_package)
        if is_package:
            spec.submodule_search_locations = [origin.rpartition("/")[0]]
        return spec


def preload(root: ModuleType, names: Sequence[str], magic: bytes) -> None:
    """Run root's modules `names` (LAUNCH's form), in this order, from their pyc into
    sys.modules (what the import system would do, without its per-module work); stop at
    the first that cannot be, leaving it and the rest to the import system."""
    from _frozen_importlib import ModuleSpec

    module_type = type(sys)
    for rel in names:
        name = f"{root.__name__}.{rel}"
        if name in sys.modules:
            continue
        parent_name, _, leaf = name.rpartition(".")
        parent = sys.modules.get(parent_name)
        if parent is None or len(parent.__path__) != 1:
            return  # not loaded yet, or spread over several directories: importlib's job
        is_package = "." not in rel
        origin, cached = _paths(parent.__path__[0], leaf, is_package)
        code = checked_code(origin, cached, magic)
        if code is None:
            return
        loader = _Loader(code, origin, cached)
        module = module_type(name)
        module.__spec__ = ModuleSpec(name, loader, origin=origin, is_package=is_package)
        module.__loader__ = loader
        module.__package__ = name if is_package else parent_name
        if is_package:
            module.__path__ = [origin.rpartition("/")[0]]
            module.__spec__.submodule_search_locations = module.__path__
        sys.modules[name] = module
        try:
            loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        setattr(parent, leaf, module)


def start(argv: Sequence[str]) -> None:
    """entry.main()'s first call: pause the cyclic garbage collector while jobns
    loads (~4 collections, ~0.2 ms, that could free nothing: modules live to the end),
    put the finder first, and for `jobns run` preload the launch path."""
    import gc

    gc.disable()
    if any(isinstance(f, Finder) for f in sys.meta_path):
        return
    finder = Finder()
    sys.meta_path.insert(0, finder)  # type: ignore[arg-type]
    if argv[1:2] == ["run"]:
        preload(sys.modules["jobns.launcher"], LAUNCH, finder.magic)


def loaded() -> None:
    """entry.main()'s second call, once the CLI is imported: what is loaded so far stays
    out of every later collection (gc.freeze: nor does a forked task child copy its
    pages for one), and the collector runs again for the command itself."""
    import gc

    gc.freeze()
    gc.enable()
