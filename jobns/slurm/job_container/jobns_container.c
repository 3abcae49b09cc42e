/*
 * jobns_container.c: Slurm's job_container plugin (22.05, 24.11: JobContainerType=
 * job_container/jobns) and namespace plugin (25.11 and later: NamespaceType=
 * namespace/jobns) of jobns. One thing only: where Slurm itself acts for a job on the node,
 * join the mount namespace `jobns setup` (the prolog) pinned for the job, with the checks
 * the SPANK plugin makes (../jobns_node.h: the pin root's, in the host's user namespace,
 * the job's setup final and not refused). Every decision is the prolog's (Python).
 *
 * Where Slurm calls join (read at each release's tag; docs/admin.md "Inside Slurm: the
 * job_container and namespace plugin"), and what this plugin does there:
 *   - sbcast and `srun --bcast`: slurmd's child that opens the file as the user
 *     (_open_as_other): joined, or the transfer fails, so the file lands in the job's
 *     /tmp or nowhere;
 *   - 24.11 and later: slurmd's child that execs each step's slurmstepd (step_create,
 *     not the extern step's): joined, so the step daemon's own files (step output to
 *     /tmp, the PMIx client directories) are the job's, and every child of the daemon
 *     (tasks, TaskEpilog, X11's xauth set-up, SPANK hooks' children) starts inside;
 *   - a child of slurmstepd not inside yet (every release; on 22.05 always): joined.
 * join_external (pam_slurm_adopt's request, in a threaded slurmstepd) only opens and
 * checks the pin and hands it over. The rest of the interface is empty: the prolog makes
 * and the epilog removes the namespace.
 *
 * Beside the SPANK plugin, not instead of it: that one sets the job's variables (run.env's
 * env. lines), forks each task into the job's PID namespace, and fails a refused job's
 * tasks with the reason in their output. So a join for a step or a child of its daemon
 * that cannot be made lets the job go on in the node's namespace (its tasks are refused
 * there, with the reason) instead of failing the launch (Slurm would drain the node or
 * requeue the job held). A job with a PID namespace is left to the SPANK plugin
 * whole (join_job says why).
 *
 * Build against the headers of the exact Slurm that loads it: Slurm loads a plugin of
 * this type only when its plugin_version is the daemon's major.minor.micro (SPANK
 * plugins: major.minor). ci/build-spank and debian/rules build it with the SPANK plugin.
 */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>
#include <slurm/spank.h> /* slurm_error, slurm_info: exported by slurmd and slurmstepd */

#include "../jobns_node.h"

#ifndef JOBNS_STATE_DIR
#define JOBNS_STATE_DIR "/run/jobns"
#endif
/* What any join waits for a background setup at most: a thread of slurmd waits for the
 * child that joins (the step's launch, sbcast's open), slurmstepd for its (a task, a
 * SPANK hook's child), a thread of slurmstepd for pam_slurm_adopt's pin. A setup takes
 * tens of milliseconds; one that takes longer (a stage-in) leaves the step in the node's
 * namespace, and its tasks wait in the SPANK plugin (its setup_wait=). */
#define SLURMD_WAIT 10

#if SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(25, 11, 0)
#define PREFIX "namespace"
#else
#define PREFIX "job_container"
#endif

const char plugin_name[] = "jobns: Slurm's own work for a job in the job's namespace";
const char plugin_type[] = PREFIX "/jobns";
const uint32_t plugin_version = SLURM_VERSION_NUMBER;

/* How a join treats a job it cannot join. */
enum how {
	STRICT,  /* sbcast's open: the file must land in the job's /tmp or nowhere */
	LENIENT, /* the whole step, a task, TaskEpilog, X11: the SPANK plugin refuses the
		  * job's tasks with the reason, the rest runs in the node's namespace */
};

/* Join job_id's mount namespace, waiting for its background setup at most SLURMD_WAIT
 * seconds. A job with a PID namespace of its own is joined by the SPANK plugin only: its
 * mount namespace has that PID namespace's /proc, in which a step daemon or a process
 * Slurm forks before the SPANK plugin runs would not find itself. */
static int join_job(uint32_t job_id, const char *where, enum how how)
{
	static struct jobns_job j; /* 64 KiB: not on a daemon thread's stack */
	char err[JOBNS_ERR];
	int fd;

	if (job_id == 0 || job_id == NO_VAL)
		return SLURM_SUCCESS;
	if (jobns_wait_for_setup(&j, JOBNS_STATE_DIR, job_id, SLURMD_WAIT, SLURMD_WAIT, err,
				 sizeof(err)) < 0 ||
	    jobns_check_open(&j, err, sizeof(err)) < 0)
		goto cannot;
	/* Slurm put this process there already (a child of a step joined whole), where the
	 * job's own directory is visible but its pins are empty files. */
	if (jobns_inside(&j) || (how == LENIENT && jobns_has_pidns(&j))) {
		jobns_close(&j);
		return SLURM_SUCCESS;
	}
	fd = jobns_open_pin(&j, "mnt", CLONE_NEWNS, err, sizeof(err));
	if (fd < 0)
		goto cannot;
	if (setns(fd, CLONE_NEWNS) < 0) {
		snprintf(err, sizeof(err), "join %s/ns/mnt: %s", j.shown, strerror(errno));
		close(fd);
		goto cannot;
	}
	close(fd);
	jobns_close(&j);
	return SLURM_SUCCESS;
cannot:
	jobns_close(&j);
	if (how == LENIENT) {
		slurm_info("jobns: %s: %s (its tasks are refused with this reason)", where, err);
		return SLURM_SUCCESS;
	}
	slurm_error("jobns: %s: %s", where, err);
	return SLURM_ERROR;
}

#define NO_PIN (-2) /* adopt_fd: a job pam_jobns joins whole (its PID namespace) */

/* The pin for pam_slurm_adopt (a threaded slurmstepd: open and check, never setns),
 * kept open for the extern step's life as Slurm's own plugins keep theirs; -1 if the job
 * cannot be joined (the login is refused), NO_PIN for a job with a PID namespace. */
static int adopt_fd(uint32_t job_id)
{
	static int fd = -1;
	struct jobns_job *j;
	char err[JOBNS_ERR];

	if (fd >= 0)
		return fd;
	j = malloc(sizeof(*j));
	if (!j)
		return -1;
	if (jobns_wait_for_setup(j, JOBNS_STATE_DIR, job_id, SLURMD_WAIT, SLURMD_WAIT, err,
				 sizeof(err)) < 0 ||
	    jobns_check_open(j, err, sizeof(err)) < 0)
		slurm_error("jobns: adopt into job %u: %s", job_id, err);
	/* A job with a PID namespace: pam_slurm_adopt gets no pin and joins nothing, and
	 * pam_jobns joins both (one setns of a mount namespace here would leave the login
	 * outside the PID one, where the namespace's /proc does not show it). */
	else if (jobns_has_pidns(j))
		fd = NO_PIN;
	else if ((fd = jobns_open_pin(j, "mnt", CLONE_NEWNS, err, sizeof(err))) < 0)
		slurm_error("jobns: adopt into job %u: %s", job_id, err);
	jobns_close(j);
	free(j);
	return fd;
}

extern int init(void)
{
	return SLURM_SUCCESS;
}

extern void fini(void)
{
}

#if SLURM_VERSION_NUMBER < SLURM_VERSION_NUM(24, 11, 0)
/* 22.05: no step is known at join, and no whole-step join exists. */
/* Is this a child of slurmstepd (a task, TaskEpilog, X11's set-up) rather than of
 * slurmd (sbcast's open, the whole step before its slurmstepd)? 22.05 says no more. */
static int in_stepd(void)
{
	char path[64], comm[32] = "";
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/comm", (int)getppid());
	f = fopen(path, "re");
	if (!f)
		return 0;
	if (!fgets(comm, sizeof(comm), f))
		comm[0] = '\0';
	fclose(f);
	return strncmp(comm, "slurmstepd", 10) == 0;
}

extern int container_p_create(uint32_t job_id, uid_t uid)
{
	(void)job_id;
	(void)uid;
	return SLURM_SUCCESS; /* called before the prolog: the prolog makes the namespace */
}

extern int container_p_add_cont(uint32_t job_id, uint64_t cont_id)
{
	(void)job_id;
	(void)cont_id;
	return SLURM_SUCCESS;
}

extern int container_p_join(uint32_t job_id, uid_t uid)
{
	(void)uid;
	/* a child of slurmstepd (a task, TaskEpilog, a SPANK hook's child), or sbcast's
	 * open (a child of slurmd): no step says which */
	return in_stepd() ? join_job(job_id, "join", LENIENT) : join_job(job_id, "sbcast", STRICT);
}

extern int container_p_join_external(uint32_t job_id)
{
	int fd = adopt_fd(job_id);

	return fd == NO_PIN ? 0 : fd; /* 0: no fd, pam_slurm_adopt joins nothing */
}

extern int container_p_delete(uint32_t job_id)
{
	(void)job_id;
	return SLURM_SUCCESS; /* the epilog removes the namespace */
}

extern int container_p_restore(char *dir_name, bool recover)
{
	(void)dir_name;
	(void)recover;
	return SLURM_SUCCESS;
}

extern void container_p_reconfig(void)
{
}

extern int container_p_stepd_create(uint32_t job_id, uid_t uid)
{
	(void)job_id;
	(void)uid;
	return SLURM_SUCCESS;
}

extern int container_p_stepd_delete(uint32_t job_id)
{
	(void)job_id;
	return SLURM_SUCCESS;
}

#else
/* 24.11 and later: a step at join; step_create is slurmd's child before slurmstepd. */
typedef struct stepd_step_rec stepd_step_rec_t; /* only ever a pointer here */

static int join_step(slurm_step_id_t *step_id, bool step_create)
{
	if (step_create) /* slurmd's child, before it execs the step's slurmstepd */
		return join_job(step_id->job_id, "join the step", LENIENT);
	if (step_id->step_id == NO_VAL) /* sbcast's open, in a child of slurmd */
		return join_job(step_id->job_id, "sbcast", STRICT);
	/* a child of slurmstepd: inside already when its step was joined whole */
	return join_job(step_id->job_id, "join", LENIENT);
}

static int no_stepd_data(int fd)
{
	(void)fd;
	return SLURM_SUCCESS; /* nothing to hand slurmstepd: send and recv stay in step */
}

#if SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(25, 11, 0)
extern int namespace_p_join(slurm_step_id_t *step_id, uid_t uid, bool step_create)
{
	(void)uid;
	return join_step(step_id, step_create);
}

extern int namespace_p_join_external(slurm_step_id_t *step_id, list_t *ns_map)
{
	static ns_fd_map_t entry; /* the list has no destructor: nothing to free */
	int fd = adopt_fd(step_id->job_id);

	if (fd == NO_PIN)
		return 0; /* nothing to hand: pam_jobns joins that job */
	if (fd < 0)
		return -1;
	entry.type = CLONE_NEWNS;
	entry.fd = fd;
	slurm_list_append(ns_map, &entry);
	return 1;
}

extern int namespace_p_restore(char *dir_name, bool recover)
{
	(void)dir_name;
	(void)recover;
	return SLURM_SUCCESS;
}

extern int namespace_p_stepd_create(stepd_step_rec_t *step)
{
	(void)step;
	return SLURM_SUCCESS;
}

extern int namespace_p_stepd_delete(stepd_step_rec_t *step)
{
	(void)step;
	return SLURM_SUCCESS;
}

extern int namespace_p_send_stepd(int fd)
{
	return no_stepd_data(fd);
}

extern int namespace_p_recv_stepd(int fd)
{
	return no_stepd_data(fd);
}

extern bool namespace_p_can_bpf(stepd_step_rec_t *step)
{
	(void)step;
	return true; /* no user namespace of ours stands in BPF's way */
}

extern int namespace_p_setup_bpf_token(stepd_step_rec_t *step)
{
	(void)step;
	return SLURM_SUCCESS;
}

#else
extern int container_p_join(slurm_step_id_t *step_id, uid_t uid, bool step_create)
{
	(void)uid;
	return join_step(step_id, step_create);
}

extern int container_p_join_external(uint32_t job_id)
{
	int fd = adopt_fd(job_id);

	return fd == NO_PIN ? 0 : fd; /* 0: no fd, pam_slurm_adopt joins nothing */
}

extern int container_p_restore(char *dir_name, bool recover)
{
	(void)dir_name;
	(void)recover;
	return SLURM_SUCCESS;
}

extern int container_p_stepd_create(uint32_t job_id, stepd_step_rec_t *step)
{
	(void)job_id;
	(void)step;
	return SLURM_SUCCESS;
}

extern int container_p_stepd_delete(uint32_t job_id)
{
	(void)job_id;
	return SLURM_SUCCESS;
}

extern int container_p_send_stepd(int fd)
{
	return no_stepd_data(fd);
}

extern int container_p_recv_stepd(int fd)
{
	return no_stepd_data(fd);
}
#endif
#endif
