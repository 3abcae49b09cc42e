"""Extra private directories ([[dirs]]) in a standalone `jobns run` (no prolog).

Without setup nothing would unmount a file system after the job's last task, so a
standalone run never applies a backing: every entry is a plain directory
<base>/job-ID, like the job's /tmp (launcher.plan builds it so). An ordinary user can
make one only in a base she may write: a site's base is normally root's (jobns doctor
asks for that), and then the entry is left out of her namespace with one warning
line: the task sees the node's own directory there, as it would without jobns.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing costs ~9 ms to import; mypy honours the name
if TYPE_CHECKING:
    from jobns.launcher.plan import Plan


def for_standalone(plan: Plan) -> Plan:
    """plan with every extra directory a plain one, without those whose base an
    unprivileged caller cannot write; each one left out is said once on stderr."""
    from jobns.launcher.plan import Extra

    root = os.geteuid() == 0
    drop = set()
    for i, t in enumerate(plan.trees):
        if t.extra is None:
            continue
        t.extra = Extra(t.extra.target, "directory", None, t.extra.options)
        if not root and not os.access(t.base, os.W_OK | os.X_OK):
            drop.add(i)
    for i in sorted(drop):
        t = plan.trees[i]
        assert t.extra is not None
        sys.stderr.write(
            f"jobns: warning: {t.extra.target} is not private in this task: its base "
            f"{t.base} is not yours to write (jobns setup, as a prolog, makes it)\n"
        )
    return without(plan, drop)


def without(plan: Plan, drop: set[int]) -> Plan:
    """PURE: plan without the trees numbered in drop, and without their binds."""
    from jobns.launcher.plan import Bind, Plan, Tree

    if not drop:
        return plan
    new_index: dict[int, int] = {}
    trees: list[Tree] = []
    for i, t in enumerate(plan.trees):
        if i not in drop:
            new_index[i] = len(trees)
            trees.append(t)
    binds = [
        Bind(new_index[b.tree], b.child, b.target, b.options)
        for b in plan.binds
        if b.tree in new_index
    ]
    return Plan(trees, binds, plan.env, plan.task_dirs, plan.owner)
