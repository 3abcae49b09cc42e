"""The OCI hook: a container gets its job's private /tmp, /var/tmp and /dev/shm.

    jobns hook [createRuntime|prestart|poststop]   (state JSON on stdin, run as root)
    jobns oci-config BUNDLE                        (rewrite a bundle to mount them itself)

Flow (createRuntime): state (jobns/hook/state.py: parsed with the C JSON scanner,
each field checked as jobns/schemas/oci-state.schema.json says) -> bundle
(jobns/hook/bundle.py: config.json, root.path, process.env/user) -> job
(jobns/hook/identity.py: org.jobns.* annotations, else SLURM_* in process.env, else
the container id and its process user) -> plan (launcher.model.plan.build, or the
prolog's record) -> trees (launcher.backing.fs.acquire_tree) -> binds inside the
container's mount namespace (jobns/hook/mounts.py, jobns/hook/rootfs.py) -> hold
(jobns/hook/holds.py). Any failure: one line `jobns: ...` on stderr, exit 125 (the
runtime aborts the container), and what this call made is undone.

Whose container (SECURITY.md rule 7): the container's process user (process.user,
mapped to the host through the live init's uid_map, else linux.uidMappings) must be
the job's owner: the prolog's recorded user, the user an annotation or SLURM_JOB_USER/
UID names, or the owner of a standalone job's directories already on the node. A root
container gets only a root job's directories. A rootfs path through a symlink that is
not root's, and a mount point on a shared mount (the bind would reach the host), are
refused too.

Stage mapping (no STAGE argument): status creating (runc) or created (crun) ->
createRuntime; stopped -> poststop; running/paused -> refused (too late).

Mount points: resolved by an fd walk from the rootfs (O_PATH|O_NOFOLLOW per
component); a symbolic link or non-directory anywhere on the way is refused,
never followed; missing ones are made (mkdirat, 1777 for tmp dirs, 0755 else)
and removed again if the hook fails.

Who holds a job's trees on a node, and who removes them:
- a prolog-set-up job (`jobns setup`): its record owns the trees; containers only
  bind them; the epilog (`jobns teardown`) removes them. No holds.
- a standalone job: every user holds LOCK_SH on each tree root while it runs,
  and on leaving removes the trees if it wins LOCK_EX|LOCK_NB (launcher.backing.fs).
  A `jobns run` task does this itself. A container gets a *holder*, a tiny
  detached process forked by its createRuntime hook that keeps the hook's
  share-locked fds and waits (pidfd) for the container's init to exit, then
  releases like a finishing task, so bare tasks and containers of one job share
  the trees, the last one out removes them, and `jobns gc` sees them in use,
  with no change to the launcher. Its hold file
  <state_dir>/holds/<job-id>/<container-id> (root 0600, flock'ed by the holder)
  lets poststop wait for the holder and finish its work if it was killed. If a
  prolog sets the job up meanwhile, its record adopts the trees (fs.release_tree's
  `adopted`) and the holder leaves them to the epilog.

Already bound: when the runtime itself bound exactly the job's verified trees (a bundle
from oci-config, a job's CDI spec), seen through /proc/PID/root with no link on the way
to the rootfs, the hook forks no bind child (hook.already_bound).

One stage: the holder notices the container's exit by itself, so the shipped hooks.d
file and oci-config install createRuntime only (one Python start per container); a
poststop call from an older hooks.d file or bundle is still accepted.

Speed: runtimes run a hook per stage as a new process, so the interpreter's start
dominates; poststop imports neither ctypes nor json, createRuntime no json/re
(jobns/launcher/system/jsonfast.py), and `jobns oci-config` on a prolog's job needs no hook at all
(ci/bench-hook).
"""
