/*
 * jobns_container.c: Slurm's job_container plugin (22.05, 24.11: JobContainerType=
 * job_container/jobns) and namespace plugin (25.11 and later: NamespaceType=
 * namespace/jobns) of jobns. One thing only: where Slurm itself acts for a job on the node,
 * join the mount namespace `jobns setup` (the prolog) pinned for the job, with the checks
 * the SPANK plugin makes (../jobns_node.h: the pin root's, in the host's user namespace,
 * the job's setup final and not refused). Every decision is the prolog's (Python).
 *
 * Where Slurm calls join (read at each release's tag; docs/admin.md "Inside Slurm: the
 * job_container and namespace plugin"), and what this plugin does there today:
 *   - sbcast and `srun --bcast`: slurmd's child that opens the file as the user
 *     (_open_as_other): joined, so the file lands in the job's /tmp;
 *   - 24.11 and later: slurmd's child that execs each step's slurmstepd (step_create):
 *     not yet (see join_job);
 *   - each task, TaskEpilog, X11's xauth set-up (a child of slurmstepd): left to the
 *     SPANK plugin (see join_job).
 * join_external (pam_slurm_adopt's request, in a threaded slurmstepd) only opens and
 * checks the pin and hands it over. The rest of the interface is empty: the prolog makes
 * and the epilog removes the namespace.
 *
 * Beside the SPANK plugin, not instead of it: that one sets the job's variables (run.env's
 * env. lines), forks each task into the job's PID namespace, and fails a refused job's
 * tasks with the reason in their output. So the whole-step join lets a job that cannot be
 * joined go on in the node's namespace (its tasks are refused there, with the reason)
 * instead of failing the launch (Slurm would requeue the job held).
 *
 * A process already in the job's namespace (a task of a step joined whole) cannot see
 * the pins (state_dir is a private mount): run.env's mnt_ns names the namespace, and such
 * a process joins nothing.
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
#define START_WAIT 60   /* as the SPANK plugin's start_wait= default */
#define SETUP_WAIT 4000 /* as its setup_wait= default */
/* What a join in a child of slurmd waits for a background setup at most: a thread of
 * slurmd waits for that child (the step's launch, sbcast's open). A setup takes tens of
 * milliseconds; one that takes longer (a stage-in) leaves the step in the node's
 * namespace and its tasks wait in the SPANK plugin. */
#define SLURMD_WAIT 10

#if SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(25, 11, 0)
#define PREFIX "namespace"
#else
#define PREFIX "job_container"
#endif

const char plugin_name[] = "jobns: Slurm's own work for a job in the job's namespace";
const char plugin_type[] = PREFIX "/jobns";
const uint32_t plugin_version = SLURM_VERSION_NUMBER;

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

/* Join job_id's mount namespace, waiting for its background setup (at most `wait`
 * seconds, 0: as long as a task waits). lenient: a job that cannot be joined is not this
 * call's failure (its tasks are refused with the reason by the SPANK plugin). */
static int join_job(uint32_t job_id, const char *where, int lenient, long wait)
{
	static struct jobns_job j; /* 64 KiB: not on a daemon thread's stack */
	char err[JOBNS_ERR];
	int fd;

	if (job_id == 0 || job_id == NO_VAL)
		return SLURM_SUCCESS;
	/* Not yet where the SPANK plugin must follow: inside the job's namespace, state_dir
	 * is hidden (launcher/mountns/pins.py hold()), so a task joined here, or a whole
	 * step, could not read its job's run.env (its variables, its PID namespace) in the
	 * SPANK plugin. Tasks (and so TaskEpilog and X11, which this plugin cannot tell from
	 * them on 22.05) are joined by the SPANK plugin; the whole step stays in the node's
	 * namespace. Until the job's own directory is visible inside its namespace. */
	if (lenient || in_stepd())
		return SLURM_SUCCESS;
	if (jobns_wait_for_setup(&j, JOBNS_STATE_DIR, job_id, wait ? wait : START_WAIT,
				 wait ? wait : SETUP_WAIT, err, sizeof(err)) < 0 ||
	    jobns_check_open(&j, err, sizeof(err)) < 0)
		goto cannot;
	if (jobns_inside(&j)) {
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
	if (lenient) {
		slurm_info("jobns: %s: %s (its tasks are refused with this reason)", where, err);
		return SLURM_SUCCESS;
	}
	slurm_error("jobns: %s: %s", where, err);
	return SLURM_ERROR;
}

/* The pin for pam_slurm_adopt (a threaded slurmstepd: open and check, never setns),
 * kept open for the extern step's life as Slurm's own plugins keep theirs; -1 if the job
 * cannot be joined (the login is refused). */
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
	if (jobns_wait_for_setup(j, JOBNS_STATE_DIR, job_id, 0, 0, err, sizeof(err)) < 0 ||
	    jobns_check_open(j, err, sizeof(err)) < 0 ||
	    (fd = jobns_open_pin(j, "mnt", CLONE_NEWNS, err, sizeof(err))) < 0)
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
	/* a task, TaskEpilog, X11, or sbcast's open (slurmd's child): no step tells which */
	return join_job(job_id, "join", 0, SLURMD_WAIT);
}

extern int container_p_join_external(uint32_t job_id)
{
	return adopt_fd(job_id);
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
	if (step_id->step_id == SLURM_EXTERN_CONT && step_create)
		return SLURM_SUCCESS; /* the extern step's daemon holds nothing of the job's */
	/* step_create, or sbcast's open (no step): a child a thread of slurmd waits for */
	if (step_create || step_id->step_id == NO_VAL)
		return join_job(step_id->job_id, step_create ? "join the step" : "sbcast",
				step_create, SLURMD_WAIT);
	return join_job(step_id->job_id, "join", 0, 0);
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
	return adopt_fd(job_id);
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
