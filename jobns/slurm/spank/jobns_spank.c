/*
 * jobns_spank.c: put every task of a Slurm job into the job's mount namespace.
 *
 * One thing only: in slurm_spank_task_init_privileged (slurmstepd calls it as root in
 * each task it forks, the batch script included, before it drops privileges) open the
 * namespace `jobns setup` (the prolog) pinned for this job and setns() into it. Every
 * decision is the prolog's (Python): which directories, which namespace, which variables
 * a task gets (the `env.NAME=VALUE` lines of run.env), and whether the job was refused.
 * A job with a PID namespace of its own ([namespace] pid) is joined too, by a fork
 * (enter_pid_namespace).
 *
 * The prolog may return before setup is done: in slurmd the plugin makes
 * <state_dir>/tasks-wait (slurm_spank_init; removed by slurm_spank_slurmd_exit), the
 * packaged prolog then leaves `jobns setup --background` running, and each task waits
 * here until its job's run.env is final (jobns_wait_for_setup, ../jobns_node.h, the node's
 * file protocol every C module of jobns shares). docs/admin.md "What the
 * prolog and epilog wait for".
 *
 *   plugstack.conf:  required /usr/lib/x86_64-linux-gnu/slurm-wlm/jobns_spank.so [state_dir=/run/jobns] [start_wait=60] [setup_wait=4000]
 *
 * Build it against the headers of the Slurm that will load it (ci/build-spank): Slurm
 * refuses a plugin whose plugin_version (SLURM_VERSION_NUMBER) is of another major.minor.
 * `required`, so that a plugin that cannot be loaded stops the node instead of letting its
 * jobs run outside their namespaces (docs/admin.md "Upgrading Slurm: rebuild the plugin first").
 *
 * Fail closed, but never the node: a job that is not set up, was refused, or whose pin
 * is not a root-owned mount namespace gets its task killed (exit 1) with one line
 * ("slurmstepd: error: jobns: ...") in the job's output; slurmstepd and slurmd go on.
 * Security: root joins only a namespace owned by the host's user namespace (the one
 * slurmstepd runs in), i.e. one no job user can mount in (SECURITY.md rule 1); every
 * path is opened component by component without following links, and run.env and the
 * directories must be root's and writable by nobody else.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <slurm/spank.h>

#include "../jobns_node.h"

SPANK_PLUGIN(jobns, 1);

#define DEFAULT_STATE_DIR "/run/jobns"
/* Seconds a task waits for a background prolog's setup to begin (start_wait=) */
#define DEFAULT_START_WAIT 60
/* Seconds a task waits for its job's setup in all (setup_wait=): longer than [staging]
 * deadline, jobns.toml's bound on a stage-in (3600 by default) */
#define DEFAULT_SETUP_WAIT 4000
#define TASKS_WAIT "tasks-wait"
#define JOINED_VAR "JOBNS_JOINED"

/* The task must not start: say why in the job's output and end this task only (this
 * hook runs in the task's own child of slurmstepd). Tried on Slurm 22.05, 24.11 and 26.05
 * (tests/e2e/test_rig_slurm.py), for a batch script and for srun steps: exit 1 here fails
 * the job with this one line in its output, and the node stays idle. Returning -1 also leaves the node idle, but adds three lines
 * of slurmstepd's own ("task_init_privileged() failed", "write to unblock task 0
 * failed"). Neither path fails slurmd or the step daemon, so neither drains the node. */
static void refuse(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void refuse(const char *fmt, ...)
{
	char msg[JOBNS_ERR + 64];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	slurm_error("jobns: %s", msg);
	_exit(1);
}

/* Whole seconds 0..max from "name=value" (value at arg); -1 with a message in err. */
static long seconds_arg(const char *name, const char *arg, long max, char *err, size_t size)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(arg, &end, 10);
	if (errno || *end || end == arg || v < 0 || v > max) {
		snprintf(err, size, "plugstack.conf: %s=%s must be whole seconds, 0 to %ld",
			 name, arg, max);
		return -1;
	}
	return v;
}

/* The plugstack.conf arguments: state_dir (returned), start_wait and setup_wait; NULL
 * with a message in err when one is wrong. */
static const char *parse_args(int ac, char **av, long *start_wait, long *setup_wait, char *err,
			      size_t size)
{
	const char *dir = DEFAULT_STATE_DIR;

	*start_wait = DEFAULT_START_WAIT;
	*setup_wait = DEFAULT_SETUP_WAIT;
	for (int i = 0; i < ac; i++) {
		if (strncmp(av[i], "state_dir=", 10) == 0) {
			dir = av[i] + 10;
		} else if (strncmp(av[i], "start_wait=", 11) == 0) {
			if ((*start_wait = seconds_arg("start_wait", av[i] + 11, 3600, err, size)) < 0)
				return NULL;
		} else if (strncmp(av[i], "setup_wait=", 11) == 0) {
			if ((*setup_wait = seconds_arg("setup_wait", av[i] + 11, 86400, err, size)) < 0)
				return NULL;
		} else {
			snprintf(err, size, "plugstack.conf: unknown argument '%s' (only "
				 "state_dir=PATH, start_wait=SECONDS and setup_wait=SECONDS)", av[i]);
			return NULL;
		}
	}
	if (dir[0] != '/' || strstr(dir, "/..") || strlen(dir) > 1024) {
		snprintf(err, size, "plugstack.conf: state_dir=%s must be an absolute path "
			 "without '..'", dir);
		return NULL;
	}
	return dir;
}

/* The marker the packaged prolog looks for (<state_dir>/tasks-wait): while it exists,
 * the node's slurmd has this plugin loaded, so every task waits for its job's setup
 * (jobns_wait_for_setup) and the prolog may return before setup is done. slurmd makes it
 * when it loads the plugin (slurm_spank_init in slurmd's context) and removes it when
 * it stops. (Not its pid: slurmd 22.05 loads plugins before it daemonizes. A slurmd
 * killed without its exit callback leaves the marker: `jobns doctor` finds it when the
 * plugin is gone from plugstack.conf.) */
static void mark_tasks_wait(const char *state_dir, int on)
{
	struct stat st;
	int top, fd;

	if (on && mkdir(state_dir, 0755) < 0 && errno != EEXIST) {
		slurm_error("jobns: mkdir %s: %s (the prolog will wait for setup)", state_dir,
			    strerror(errno));
		return;
	}
	top = open(state_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (top < 0 || fstat(top, &st) < 0 || st.st_uid != 0 || (st.st_mode & 022)) {
		slurm_error("jobns: %s is not a directory of root's, writable by root only: "
			    "the prolog will wait for setup", state_dir);
		if (top >= 0)
			close(top);
		return;
	}
	if (!on) {
		unlinkat(top, TASKS_WAIT, 0);
	} else {
		fd = openat(top, TASKS_WAIT, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
		if (fd < 0)
			slurm_error("jobns: create %s/%s: %s (the prolog will wait for setup)",
				    state_dir, TASKS_WAIT, strerror(errno));
		else
			close(fd);
	}
	close(top);
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	char err[1200];
	const char *state_dir;
	long start_wait, setup_wait;

	(void)sp;
	if (spank_context() != S_CTX_SLURMD)
		return 0;
	state_dir = parse_args(ac, av, &start_wait, &setup_wait, err, sizeof(err));
	if (!state_dir) {
		slurm_error("jobns: %s", err); /* a `required` plugin: slurmd does not start */
		return -1;
	}
	mark_tasks_wait(state_dir, 1);
	return 0;
}

int slurm_spank_slurmd_exit(spank_t sp, int ac, char **av)
{
	char err[1200];
	const char *state_dir;
	long start_wait, setup_wait;

	(void)sp;
	state_dir = parse_args(ac, av, &start_wait, &setup_wait, err, sizeof(err));
	if (state_dir)
		mark_tasks_wait(state_dir, 0);
	return 0;
}

/* Each "env.NAME=VALUE" line of run.env becomes NAME=VALUE in the task's environment. */
static void set_job_environment(spank_t sp, const char *text, const char *shown)
{
	char buf[JOBNS_ENV_MAX];
	int got;

	while ((got = jobns_next_env(&text, buf, sizeof(buf))) != 0) {
		char *eq = strchr(buf, '=');

		if (got < 0)
			refuse("%s: a malformed line or a variable longer than %zu bytes: 'env.%s'",
			       shown, sizeof(buf), buf);
		*eq = '\0';
		if (spank_setenv(sp, buf, eq + 1, 1) != ESPANK_SUCCESS)
			refuse("set %s in the task's environment", buf);
	}
}

/* [namespace] pid: setns(CLONE_NEWPID) moves no process, only the children it forks
 * afterwards, and a process whose children would go to another PID namespace can no
 * longer create threads (clone(CLONE_THREAD): EINVAL): joining in slurmstepd itself made
 * the step daemon's I/O threads fail (seen on 26.05). So the task joins, here, at the
 * very end of the hook, and forks: the child returns, inside the job's PID namespace, and
 * becomes the task (slurmstepd drops privileges and execs in it); this process, the one
 * slurmstepd tracks, holds no fd, waits for it and ends as it ended. Signals are not relayed: Slurm
 * signals a step through its process tracking, which reaches the child too (a relay would
 * deliver each signal twice). */
static void enter_pid_namespace(int fd, const char *job)
{
	struct rlimit none = {0, 0};
	int status, sig;
	pid_t child;

	if (setns(fd, CLONE_NEWPID) < 0)
		refuse("join job %s's PID namespace: %s", job, strerror(errno));
	close(fd);
	child = fork();
	if (child < 0)
		refuse("start a task in job %s's PID namespace: %s (its init has ended: the job "
		       "is ending)", job, strerror(errno));
	if (child == 0)
		return;
	/* Hold nothing of the task's (its output pipes, slurmstepd's own): only the child's
	 * exit may close them. */
	close_range(0, ~0U, 0);
	for (sig = 1; sig < NSIG; sig++)
		if (sig != SIGKILL && sig != SIGSTOP && sig != SIGCHLD)
			signal(sig, SIG_IGN);
	while (waitpid(child, &status, 0) < 0)
		if (errno != EINTR)
			_exit(1);
	if (WIFEXITED(status))
		_exit(WEXITSTATUS(status));
	sig = WTERMSIG(status);
	setrlimit(RLIMIT_CORE, &none); /* the task dumped its core already, if it did */
	signal(sig, SIG_DFL);
	raise(sig);
	_exit(128 + sig);
}

int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
	static struct jobns_job j; /* run.env's 64 KiB: not on the task's stack */
	char cwd[4096], joined[96], err[JOBNS_ERR];
	struct stat pin;
	const char *state_dir;
	uint32_t job_id;
	long start_wait, setup_wait;
	int fd, have_cwd, pidns;

	if (!spank_remote(sp))
		return 0;
	state_dir = parse_args(ac, av, &start_wait, &setup_wait, err, sizeof(err));
	if (!state_dir)
		refuse("%s", err);
	if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS)
		refuse("no job id from slurmstepd");
	if (jobns_wait_for_setup(&j, state_dir, job_id, start_wait, setup_wait, err, sizeof(err)) < 0 ||
	    jobns_check_open(&j, err, sizeof(err)) < 0)
		refuse("%s", err);
	set_job_environment(sp, j.text, j.shown);
	if (jobns_inside(&j)) {
		/* Slurm put the task there already (the job_container/namespace plugin), where
		 * the pins are not visible: only the environment is left to do. */
		if (jobns_has_pidns(&j))
			refuse("job %s: its task is in the job's mount namespace already, where its "
			       "PID namespace cannot be reached", j.job);
		char ns_id[64];

		jobns_value_of(j.text, "mnt_ns", ns_id, sizeof(ns_id));
		snprintf(joined, sizeof(joined), "%s:%s", j.job, ns_id);
		jobns_close(&j);
		if (spank_setenv(sp, JOINED_VAR, joined, 1) != ESPANK_SUCCESS)
			refuse("set %s in the task's environment", JOINED_VAR);
		return 0;
	}
	pidns = jobns_open_pin(&j, "pid", CLONE_NEWPID, err, sizeof(err));
	if (pidns < 0 && errno != ENOENT)
		refuse("%s", err);
	fd = jobns_open_pin(&j, "mnt", CLONE_NEWNS, err, sizeof(err));
	if (fd < 0 || fstat(fd, &pin) < 0)
		refuse("%s", err);

	have_cwd = getcwd(cwd, sizeof(cwd)) != NULL;
	if (setns(fd, CLONE_NEWNS) < 0)
		refuse("join %s/ns/mnt: %s", j.shown, strerror(errno));
	close(fd);
	jobns_close(&j);
	/* setns() moved us to the namespace's root: look the working directory up again
	 * inside (a directory under the host's /tmp is not there; start in /tmp then). */
	if (!have_cwd || chdir(cwd) < 0) {
		slurm_info("jobns: working directory %s does not exist inside job %s; "
			   "starting in /tmp", have_cwd ? cwd : "?", j.job);
		if (chdir("/tmp") < 0)
			refuse("chdir /tmp inside job %s: %s", j.job, strerror(errno));
	}
	/* For `jobns run` inside the task: it is in the job's namespace already. */
	snprintf(joined, sizeof(joined), "%s:%ju:%ju", j.job, (uintmax_t)pin.st_dev,
		 (uintmax_t)pin.st_ino);
	if (spank_setenv(sp, JOINED_VAR, joined, 1) != ESPANK_SUCCESS)
		refuse("set %s in the task's environment", JOINED_VAR);
	if (pidns >= 0)
		enter_pid_namespace(pidns, j.job);
	return 0;
}
