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
 * here until its job's run.env is final (read_when_set_up). docs/admin.md "What the
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
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <linux/nsfs.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(jobns, 1);

#define DEFAULT_STATE_DIR "/run/jobns"
#define RUN_ENV_MAX 65536
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
	char msg[2300];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	slurm_error("jobns: %s", msg);
	_exit(1);
}

/* Open name under dir (AT_FDCWD: an absolute path) without following a link; it must
 * be root's and writable by nobody else (a directory when want_dir). */
static int open_root_owned(int dir, const char *name, int want_dir, const char *shown)
{
	struct stat st;
	int fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC |
				   (want_dir ? O_DIRECTORY : 0));

	if (fd < 0)
		return -1;
	if (fstat(fd, &st) < 0 || st.st_uid != 0 || (st.st_mode & 022) ||
	    (want_dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode))) {
		close(fd);
		refuse("refuse %s: not root's, or writable by others (check state_dir)", shown);
	}
	return fd;
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
 * (read_when_set_up) and the prolog may return before setup is done. slurmd makes it
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

/* Copy the value of the line "key=..." of run.env into out (cut to size); 0 if absent. */
static int value_of(const char *text, const char *key, char *out, size_t size)
{
	size_t n = strlen(key);

	for (const char *line = text; line && *line;) {
		const char *end = strchr(line, '\n');
		size_t len = end ? (size_t)(end - line) : strlen(line);

		if (len > n && strncmp(line, key, n) == 0 && line[n] == '=') {
			len -= n + 1;
			if (len >= size)
				len = size - 1;
			memcpy(out, line + n + 1, len);
			out[len] = '\0';
			return 1;
		}
		line = end ? end + 1 : NULL;
	}
	return 0;
}

/* Each "env.NAME=VALUE" line of run.env becomes NAME=VALUE in the task's environment. */
static void set_job_environment(spank_t sp, const char *text, const char *shown)
{
	const char *line = text;

	while (line && *line) {
		const char *end = strchr(line, '\n');
		size_t len = end ? (size_t)(end - line) : strlen(line);

		if (len > 4 && strncmp(line, "env.", 4) == 0) {
			char buf[4200];
			char *eq;

			if (len >= sizeof(buf))
				refuse("%s: a variable longer than %zu bytes", shown, sizeof(buf));
			memcpy(buf, line + 4, len - 4);
			buf[len - 4] = '\0';
			eq = strchr(buf, '=');
			if (!eq || eq == buf)
				refuse("%s: malformed line 'env.%s'", shown, buf);
			*eq = '\0';
			if (spank_setenv(sp, buf, eq + 1, 1) != ESPANK_SUCCESS)
				refuse("set %s in the task's environment", buf);
		}
		line = end ? end + 1 : NULL;
	}
}

/* Open <state_dir>/jobs/<job>/ns/pid ([namespace] pid = true in jobns.toml) without
 * following a link, each directory root's (open_root_owned): -1 with errno ENOENT when
 * the job has none; anything but a pinned PID namespace of the host's user namespace is
 * refused. */
static int open_pid_pin(const char *state_dir, const char *job)
{
	char shown[1200];
	struct stat owner, mine;
	struct statfs fs;
	int top, jobs, dir, ns, fd, userns, err, ok;

	snprintf(shown, sizeof(shown), "%s/jobs/%s/ns/pid", state_dir, job);
	top = open_root_owned(AT_FDCWD, state_dir, 1, shown);
	jobs = top < 0 ? -1 : open_root_owned(top, "jobs", 1, shown);
	dir = jobs < 0 ? -1 : open_root_owned(jobs, job, 1, shown);
	ns = dir < 0 ? -1 : openat(dir, "ns", O_RDONLY | O_NOFOLLOW | O_DIRECTORY | O_CLOEXEC);
	fd = ns < 0 ? -1 : openat(ns, "pid", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	err = errno;
	for (int i = 0, fds[] = {ns, dir, jobs, top}; i < 4; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	if (fd < 0) {
		errno = err;
		return -1;
	}
	userns = ioctl(fd, NS_GET_USERNS);
	ok = fstatfs(fd, &fs) == 0 && fs.f_type == NSFS_MAGIC &&
	     ioctl(fd, NS_GET_NSTYPE) == CLONE_NEWPID && userns >= 0 &&
	     fstat(userns, &owner) == 0 && stat("/proc/self/ns/user", &mine) == 0 &&
	     owner.st_dev == mine.st_dev && owner.st_ino == mine.st_ino;
	if (!ok)
		refuse("%s is not a pinned PID namespace of root's", shown);
	close(userns);
	return fd;
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

/* 1 when a jobns holds the job's lock <jobs>/<job>.lock now (a setup under way), else 0.
 * A shared lock taken and dropped at once: it only asks. */
static int setup_under_way(int jobs, const char *job)
{
	char name[32];
	int fd, held;

	snprintf(name, sizeof(name), "%s.lock", job);
	fd = openat(jobs, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return 0;
	held = flock(fd, LOCK_SH | LOCK_NB) < 0 && errno == EWOULDBLOCK;
	close(fd);
	return held;
}

/* The marks the packaged scripts leave in <jobs> (launcher/system/state.py "marks"):
 * <job>.setup (the prolog: a setup of this run is on its way; the setup takes it under
 * the job's lock) and <job>.ending (the epilog: the run is over). 0 when absent, else 1
 * with its time in *at. */
static int mark_at(int jobs, const char *job, const char *suffix, struct timespec *at)
{
	char name[40];
	struct stat st;

	snprintf(name, sizeof(name), "%s%s", job, suffix);
	if (fstatat(jobs, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode) ||
	    st.st_uid != 0)
		return 0;
	*at = st.st_mtim;
	return 1;
}

/* Has this run's epilog come (<job>.ending, not older than the prolog's <job>.setup: an
 * older one is of an earlier job of the same id, which setup removes)? */
static int run_is_over(int jobs, const char *job)
{
	struct timespec ending, setup;

	if (!mark_at(jobs, job, ".ending", &ending))
		return 0;
	if (!mark_at(jobs, job, ".setup", &setup))
		return 1;
	return ending.tv_sec > setup.tv_sec ||
	       (ending.tv_sec == setup.tv_sec && ending.tv_nsec >= setup.tv_nsec);
}

/* Read <state_dir>/jobs/<job>/run.env into text once no setup of the job is to come or
 * under way: the packaged prolog returns at once and leaves its mark (<job>.setup) for
 * the setup it hands on (`jobns setup --background`, or the resident helper), which
 * takes the mark under the job's lock and writes run.env before it lets go. So a task
 * waits while the mark is there (at most start_wait seconds: the setup has not begun)
 * or the lock is held (a setup under way; run.env may still be an earlier run's), in
 * that order, at most setup_wait seconds in all; then run.env is the answer. The wait
 * ends at once when the run is over (its epilog came). Returns the job's directory
 * (fd); *jobs_out, *top_out are the directories above it. */
static int read_when_set_up(const char *state_dir, const char *job, const char *shown,
			    long start_wait, long setup_wait, char *text, int *jobs_out,
			    int *top_out)
{
	struct timespec t0, now, pause, at;
	long delay_us = 250, waited;
	int top, jobs, dir, envfd, marked, busy, err;
	ssize_t len;
	char value[64];

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		top = open_root_owned(AT_FDCWD, state_dir, 1, state_dir);
		jobs = top < 0 ? -1 : open_root_owned(top, "jobs", 1, shown);
		clock_gettime(CLOCK_MONOTONIC, &now);
		waited = now.tv_sec - t0.tv_sec;
		marked = jobs >= 0 && mark_at(jobs, job, ".setup", &at);
		busy = jobs >= 0 && setup_under_way(jobs, job);
		if (!busy && !(marked && waited < start_wait)) {
			dir = jobs < 0 ? -1 : open_root_owned(jobs, job, 1, shown);
			envfd = dir < 0 ? -1 : open_root_owned(dir, "run.env", 0, shown);
			err = errno;
			if (envfd >= 0) {
				len = read(envfd, text, RUN_ENV_MAX);
				close(envfd);
				if (len < 0)
					refuse("read %s/run.env: %s", shown, strerror(errno));
				text[len] = '\0';
				if (value_of(text, "closed", value, sizeof(value)) &&
				    strcmp(value, "pending") == 0)
					refuse("job %s: its setup on this node ended without finishing "
					       "(see the prolog's log: journalctl -t jobns)", job);
				break;
			}
			if (marked)
				refuse("job %s: its setup on this node did not begin within %ld s "
				       "(plugstack.conf start_wait=); see the prolog's log "
				       "(journalctl -t jobns)", job, start_wait);
			refuse("job %s is not set up on this node (%s/run.env: %s): its "
			       "prolog (jobns setup) did not run or failed; see the prolog's "
			       "log", job, shown, strerror(err));
		}
		/* Bounds no job can stretch: its run is over (its epilog came: Slurm is ending
		 * the job), or its setup took longer than setup_wait (the setup's own bounds,
		 * [staging] timeout and the programs' timeouts, end it before then). */
		if (jobs >= 0 && run_is_over(jobs, job))
			refuse("job %s ended on this node before its setup finished; no task may "
			       "start", job);
		if (setup_wait > 0 && waited >= setup_wait)
			refuse("job %s: its setup on this node took longer than %ld s "
			       "(plugstack.conf setup_wait=); see the prolog's log "
			       "(journalctl -t jobns)", job, setup_wait);
		for (int i = 0, fds[] = {jobs, top}; i < 2; i++)
			if (fds[i] >= 0)
				close(fds[i]);
		/* Every 1 ms for the first second (a setup takes tens of ms: a longer pause
		 * would be waited in full after it ends), then every 20 ms (a stage-in). */
		pause.tv_sec = 0;
		pause.tv_nsec = delay_us * 1000;
		nanosleep(&pause, NULL);
		clock_gettime(CLOCK_MONOTONIC, &now);
		delay_us = now.tv_sec - t0.tv_sec >= 1 ? 20000 : delay_us < 1000 ? delay_us * 2 : 1000;
	}
	*jobs_out = jobs;
	*top_out = top;
	return dir;
}

int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
	char job[16], shown[1200], text[RUN_ENV_MAX + 1], cwd[4096], joined[96];
	char value[64], reason[2048];
	struct stat pin, mine, owner;
	struct statfs fs;
	const char *state_dir;
	uint32_t job_id;
	long start_wait, setup_wait;
	int top, jobs, dir, ns, fd, userns, have_cwd, pidns;

	if (!spank_remote(sp))
		return 0;
	state_dir = parse_args(ac, av, &start_wait, &setup_wait, reason, sizeof(reason));
	if (!state_dir)
		refuse("%s", reason);
	if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS)
		refuse("no job id from slurmstepd");
	snprintf(job, sizeof(job), "%u", job_id); /* digits only: a safe path component */
	snprintf(shown, sizeof(shown), "%s/jobs/%s", state_dir, job);
	dir = read_when_set_up(state_dir, job, shown, start_wait, setup_wait, text, &jobs, &top);

	if (!value_of(text, "version", value, sizeof(value)) || strcmp(value, "1") != 0)
		refuse("%s/run.env: unknown version (set up by another jobns version?)", shown);
	if (value_of(text, "closed", value, sizeof(value))) {
		if (strcmp(value, "refused") == 0)
			refuse("job %s was refused by jobns setup on this node: %s", job,
			       value_of(text, "reason", reason, sizeof(reason)) ? reason
			       : "see the prolog's log");
		refuse("job %s is %s on this node (state %s): no task may start now", job,
		       (!strcmp(value, "post-run") || !strcmp(value, "staging-out") ||
			!strcmp(value, "teardown")) ? "ending" : "still being set up", value);
	}
	set_job_environment(sp, text, shown);
	pidns = open_pid_pin(state_dir, job);
	if (pidns < 0 && errno != ENOENT)
		refuse("open %s/ns/pid: %s", shown, strerror(errno));

	ns = openat(dir, "ns", O_RDONLY | O_NOFOLLOW | O_DIRECTORY | O_CLOEXEC);
	fd = ns < 0 ? -1 : openat(ns, "mnt", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		refuse("open %s/ns/mnt: %s", shown, strerror(errno));
	if (fstatfs(fd, &fs) < 0 || fs.f_type != NSFS_MAGIC ||
	    ioctl(fd, NS_GET_NSTYPE) != CLONE_NEWNS || fstat(fd, &pin) < 0)
		refuse("%s/ns/mnt is not a pinned mount namespace", shown);
	/* Owned by the user namespace slurmstepd runs in (the host's): nobody but root can
	 * mount in it. A namespace a user made (in her own user namespace) is refused. */
	userns = ioctl(fd, NS_GET_USERNS);
	if (userns < 0 || fstat(userns, &owner) < 0 || stat("/proc/self/ns/user", &mine) < 0 ||
	    owner.st_dev != mine.st_dev || owner.st_ino != mine.st_ino)
		refuse("job %s's namespace belongs to its user, so root will not enter it (set "
		       "[slurm] enforce = true in jobns.toml on this node)", job);
	close(userns);

	have_cwd = getcwd(cwd, sizeof(cwd)) != NULL;
	if (setns(fd, CLONE_NEWNS) < 0)
		refuse("join %s/ns/mnt: %s", shown, strerror(errno));
	close(fd);
	close(ns);
	close(dir);
	close(jobs);
	close(top);
	/* setns() moved us to the namespace's root: look the working directory up again
	 * inside (a directory under the host's /tmp is not there; start in /tmp then). */
	if (!have_cwd || chdir(cwd) < 0) {
		slurm_info("jobns: working directory %s does not exist inside job %s; "
			   "starting in /tmp", have_cwd ? cwd : "?", job);
		if (chdir("/tmp") < 0)
			refuse("chdir /tmp inside job %s: %s", job, strerror(errno));
	}
	/* For `jobns run` inside the task: it is in the job's namespace already. */
	snprintf(joined, sizeof(joined), "%s:%ju:%ju", job, (uintmax_t)pin.st_dev,
		 (uintmax_t)pin.st_ino);
	if (spank_setenv(sp, JOINED_VAR, joined, 1) != ESPANK_SUCCESS)
		refuse("set %s in the task's environment", JOINED_VAR);
	if (pidns >= 0)
		enter_pid_namespace(pidns, job);
	return 0;
}
