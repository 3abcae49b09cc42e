/*
 * jobns_node.h: what every C module of jobns needs of the node's file protocol under
 * state_dir (jobns/launcher/protocol/state.py is its Python side): open a job's directory
 * without following links, read run.env, the prolog's and epilog's marks, and check a
 * pinned namespace. Included by the SPANK plugin (spank/jobns_spank.c), the
 * job_container/namespace plugin (job_container/jobns_container.c) and the PAM module
 * (pam/pam_jobns.c), each a single-file build: every function is static, and none
 * exits, logs or allocates; each says what went wrong in `err`, for its caller to
 * report its own way (a task fails, a login is refused, a daemon logs).
 *
 *   <state_dir>/                   root's, not writable by others
 *   <state_dir>/jobs/<id>.lock     a setup or teardown of the job holds it (flock)
 *   <state_dir>/jobs/<id>.setup    the prolog: a setup of this run is on its way
 *   <state_dir>/jobs/<id>.ending   the epilog: this run is over
 *   <state_dir>/jobs/<id>/run.env  version=1, closed=<state> while no task may join,
 *                                  reason=..., env.NAME=VALUE lines
 *   <state_dir>/jobs/<id>/ns/mnt   the pinned mount namespace (ns/pid: the PID one)
 */
#ifndef JOBNS_NODE_H
#define JOBNS_NODE_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/magic.h>
#include <linux/nsfs.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#define JOBNS_RUN_ENV_MAX 65536
#define JOBNS_RUN_ENV_VERSION "1"
#define JOBNS_ERR 4096
/* Each includer uses some of these functions. */
#define JOBNS_FN static __attribute__((unused))
/* How jobns_open_root_owned checks what it opens. */
#define JOBNS_DIR 1       /* a directory, else a regular file */
#define JOBNS_STICKY_OK 2 /* writable by others if sticky (/tmp, an ancestor of state_dir):
			   * there only root can replace root's entries */

/* The directories and run.env of one job, opened (each -1 until it is). */
struct jobns_job {
	int top, jobs, dir;
	char job[16];
	char shown[1100]; /* <state_dir>/jobs/<job>, for messages */
	char text[JOBNS_RUN_ENV_MAX + 1];
};

/* Open name under dir (AT_FDCWD: an absolute path) without following a link: -1 with
 * errno from openat, or -1 with errno EPERM when it is not root's, is writable by
 * others (unless JOBNS_STICKY_OK and sticky), or is not a directory (JOBNS_DIR in how) /
 * regular file. */
JOBNS_FN int jobns_open_root_owned(int dir, const char *name, int how)
{
	struct stat st;
	int fd = openat(dir, name,
			O_RDONLY | O_NOFOLLOW | O_CLOEXEC | ((how & JOBNS_DIR) ? O_DIRECTORY : 0));

	if (fd < 0)
		return -1;
	if (fstat(fd, &st) < 0 || st.st_uid != 0 ||
	    ((st.st_mode & 022) && !((how & JOBNS_STICKY_OK) && (st.st_mode & S_ISVTX))) ||
	    ((how & JOBNS_DIR) ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode))) {
		close(fd);
		errno = EPERM;
		return -1;
	}
	return fd;
}

/* Copy the value of the line "key=..." of run.env into out (cut to size); 0 if absent. */
JOBNS_FN int jobns_value_of(const char *text, const char *key, char *out, size_t size)
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

/* A script's mark <jobs>/<job><suffix> (root's regular file): 1 with its time in *at. */
JOBNS_FN int jobns_mark_at(int jobs, const char *job, const char *suffix, struct timespec *at)
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

/* Has this run's epilog come (<job>.ending not older than the prolog's <job>.setup: an
 * older one is of an earlier job of the same id, which setup removes)? */
JOBNS_FN int jobns_run_is_over(int jobs, const char *job)
{
	struct timespec ending, setup;

	if (!jobns_mark_at(jobs, job, ".ending", &ending))
		return 0;
	if (!jobns_mark_at(jobs, job, ".setup", &setup))
		return 1;
	return ending.tv_sec > setup.tv_sec ||
	       (ending.tv_sec == setup.tv_sec && ending.tv_nsec >= setup.tv_nsec);
}

/* 1 when a jobns holds the job's lock now (a setup under way). A shared lock taken and
 * dropped at once: it only asks. */
JOBNS_FN int jobns_setup_under_way(int jobs, const char *job)
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

JOBNS_FN void jobns_close(struct jobns_job *j)
{
	int *fds[] = {&j->dir, &j->jobs, &j->top};

	for (int i = 0; i < 3; i++) {
		if (*fds[i] >= 0)
			close(*fds[i]);
		*fds[i] = -1;
	}
}

/* Read run.env of the job open at j->dir into j->text: 0, or -1 with errno. */
JOBNS_FN int jobns_read_run_env(struct jobns_job *j)
{
	ssize_t len;
	int fd = j->dir < 0 ? -1 : jobns_open_root_owned(j->dir, "run.env", 0);

	if (fd < 0)
		return -1;
	len = read(fd, j->text, JOBNS_RUN_ENV_MAX);
	close(fd);
	if (len < 0)
		return -1;
	j->text[len] = '\0';
	return 0;
}

/* state_dir= must be an absolute path without '..' (and fit j->shown). */
JOBNS_FN int jobns_state_dir_ok(const char *state_dir)
{
	return state_dir[0] == '/' && !strstr(state_dir, "/..") && strlen(state_dir) <= 1024;
}

/* j for job_id under state_dir, nothing open yet: 0, or -1 with the reason in err. */
JOBNS_FN int jobns_start(struct jobns_job *j, const char *state_dir, unsigned long job_id,
			 char *err, size_t size)
{
	snprintf(j->job, sizeof(j->job), "%lu", job_id); /* digits only: a safe component */
	snprintf(j->shown, sizeof(j->shown), "%s/jobs/%s", state_dir, j->job);
	j->top = j->jobs = j->dir = -1;
	if (!jobns_state_dir_ok(state_dir)) {
		snprintf(err, size, "state_dir=%s must be an absolute path without '..'", state_dir);
		return -1;
	}
	return 0;
}

/* Look once: open the job's directory under j->jobs (-1: none, errno says why) and read
 * its run.env into j->text. 0, or -1 with errno (EPERM: not root's, or writable by
 * others), j->dir still -1 when the directory itself failed. Waits for nothing. */
JOBNS_FN int jobns_open_dir(struct jobns_job *j)
{
	j->dir = j->jobs < 0 ? -1 : jobns_open_root_owned(j->jobs, j->job, JOBNS_DIR);
	return jobns_read_run_env(j);
}

/* Open <state_dir>/jobs/<job_id> (each component root's, no link followed) and read its
 * run.env once no setup of the job is to come or under way: the packaged prolog leaves
 * its mark (<job>.setup) for the setup it hands on, which takes it under the job's lock
 * and writes run.env before it lets go. So this waits while the mark is there (at most
 * start_wait seconds: the setup has not begun) or the lock is held (a setup under way;
 * run.env may still be an earlier run's), in that order, at most setup_wait seconds in
 * all (0: no bound), and not once the run is over (its epilog came). 0 with j open and
 * j->text read; -1 with the reason in err (j closed). Inside the job's own mount
 * namespace only its directory is visible (no mark, no lock): run.env is read at once. */
JOBNS_FN int jobns_wait_for_setup(struct jobns_job *j, const char *state_dir, unsigned long job_id,
				long start_wait, long setup_wait, char *err, size_t size)
{
	struct timespec t0, now, pause, at;
	long delay_us = 250, waited;
	char value[64];
	int marked, busy;

	if (jobns_start(j, state_dir, job_id, err, size) < 0)
		return -1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		j->top = jobns_open_root_owned(AT_FDCWD, state_dir, JOBNS_DIR);
		if (j->top < 0 && errno == EPERM)
			goto not_roots;
		j->jobs = j->top < 0 ? -1 : jobns_open_root_owned(j->top, "jobs", JOBNS_DIR);
		if (j->jobs < 0 && errno == EPERM)
			goto not_roots;
		clock_gettime(CLOCK_MONOTONIC, &now);
		waited = now.tv_sec - t0.tv_sec;
		marked = j->jobs >= 0 && jobns_mark_at(j->jobs, j->job, ".setup", &at);
		busy = j->jobs >= 0 && jobns_setup_under_way(j->jobs, j->job);
		if (!busy && !(marked && waited < start_wait)) {
			if (jobns_open_dir(j) == 0) {
				if (jobns_value_of(j->text, "closed", value, sizeof(value)) &&
				    strcmp(value, "pending") == 0) {
					snprintf(err, size, "job %s: its setup on this node ended "
						 "without finishing (see the prolog's log: journalctl -t "
						 "jobns)", j->job);
					break;
				}
				return 0;
			}
			if (errno == EPERM)
				goto not_roots;
			if (marked)
				snprintf(err, size, "job %s: its setup on this node did not begin "
					 "within %ld s (start_wait=); see the prolog's log "
					 "(journalctl -t jobns)", j->job, start_wait);
			else
				snprintf(err, size, "job %s is not set up on this node (%s/run.env: "
					 "%s): its prolog (jobns setup) did not run or failed; see the "
					 "prolog's log", j->job, j->shown, strerror(errno));
			break;
		}
		/* Bounds no job can stretch: its run is over (its epilog came: Slurm is ending
		 * the job), or its setup took longer than setup_wait (the setup's own bounds,
		 * [staging] timeout and the programs' timeouts, end it before then). */
		if (j->jobs >= 0 && jobns_run_is_over(j->jobs, j->job)) {
			snprintf(err, size, "job %s ended on this node before its setup finished; "
				 "no task may start", j->job);
			break;
		}
		if (setup_wait > 0 && waited >= setup_wait) {
			snprintf(err, size, "job %s: its setup on this node took longer than %ld s "
				 "(setup_wait=); see the prolog's log (journalctl -t jobns)",
				 j->job, setup_wait);
			break;
		}
		jobns_close(j);
		/* Every 1 ms for the first second (a setup takes tens of ms: a longer pause
		 * would be waited in full after it ends), then every 20 ms (a stage-in). */
		pause.tv_sec = 0;
		pause.tv_nsec = delay_us * 1000;
		nanosleep(&pause, NULL);
		clock_gettime(CLOCK_MONOTONIC, &now);
		delay_us = now.tv_sec - t0.tv_sec >= 1 ? 20000 : delay_us < 1000 ? delay_us * 2 : 1000;
	}
	jobns_close(j);
	return -1;
not_roots:
	snprintf(err, size, "refuse %s: a directory on its way is not root's, or is writable "
		 "by others (check state_dir)", j->shown);
	jobns_close(j);
	return -1;
}

/* run.env (read into j->text) lets a task join: 0; else the reason in err and -1 for an
 * unknown version (never joinable), -2 for a job refused, being set up or ending. */
JOBNS_FN int jobns_check_open(const struct jobns_job *j, char *err, size_t size)
{
	char value[64], reason[2048];

	if (!jobns_value_of(j->text, "version", value, sizeof(value)) ||
	    strcmp(value, JOBNS_RUN_ENV_VERSION) != 0) {
		snprintf(err, size, "%s/run.env: unknown version (set up by another jobns version?)",
			 j->shown);
		return -1;
	}
	if (!jobns_value_of(j->text, "closed", value, sizeof(value)))
		return 0;
	if (strcmp(value, "refused") == 0)
		snprintf(err, size, "job %s was refused by jobns setup on this node: %s", j->job,
			 jobns_value_of(j->text, "reason", reason, sizeof(reason)) ? reason
			 : "see the prolog's log");
	else
		snprintf(err, size, "job %s is %s on this node (state %s): no task may start now",
			 j->job, (!strcmp(value, "post-run") || !strcmp(value, "staging-out") ||
				  !strcmp(value, "teardown")) ? "ending" : "still being set up",
			 value);
	return -2;
}

/* Is this process in the job's mount namespace already (run.env's mnt_ns, in the text
 * of its run.env, names it)? A process Slurm put there (the whole step, joined by the
 * job_container/namespace plugin) sees the job's own directory but not its pins: they
 * are mounts of the node's namespace, so inside they are empty files. */
JOBNS_FN int jobns_inside_text(const char *text)
{
	char want[64], have[64];
	struct stat st;

	if (!jobns_value_of(text, "mnt_ns", want, sizeof(want)) ||
	    stat("/proc/self/ns/mnt", &st) < 0)
		return 0;
	snprintf(have, sizeof(have), "%ju:%ju", (uintmax_t)st.st_dev, (uintmax_t)st.st_ino);
	return strcmp(want, have) == 0;
}

JOBNS_FN int jobns_inside(const struct jobns_job *j)
{
	return jobns_inside_text(j->text);
}

#define JOBNS_ENV_MAX 4200 /* an env. line's NAME=VALUE, with its NUL */

/* The next "env.NAME=VALUE" line of run.env's text from *at: 1 with NAME=VALUE in buf
 * (size JOBNS_ENV_MAX or more), 0 at the end, -1 for a line too long for buf or one with
 * no NAME or no '=' (buf holds its start, for a message); *at moves past the line. */
JOBNS_FN int jobns_next_env(const char **at, char *buf, size_t size)
{
	while (*at && **at) {
		const char *line = *at, *end = strchr(line, '\n');
		size_t len = end ? (size_t)(end - line) : strlen(line);

		*at = end ? end + 1 : NULL;
		if (len <= 4 || strncmp(line, "env.", 4) != 0)
			continue;
		len -= 4;
		if (len >= size) {
			snprintf(buf, size, "%.64s", line + 4);
			return -1;
		}
		memcpy(buf, line + 4, len);
		buf[len] = '\0';
		return buf[0] == '=' || !strchr(buf, '=') ? -1 : 1;
	}
	return 0;
}

/* Does the job have a PID namespace of its own ([namespace] pid: run.env's pid_pin)? */
JOBNS_FN int jobns_has_pidns(const struct jobns_job *j)
{
	char value[8];

	return jobns_value_of(j->text, "pid_pin", value, sizeof(value)) && value[0];
}

/* The namespace file at fd: JOBNS_NS_OK when it is of type nstype and owned by the user
 * namespace this process runs in (the host's, for a daemon or root's task: nobody but
 * root can mount in it); JOBNS_NS_USERS when its user made it (in her own user
 * namespace: root never enters it); JOBNS_NS_NOT when it is no such namespace. */
enum { JOBNS_NS_OK, JOBNS_NS_NOT, JOBNS_NS_USERS };

JOBNS_FN int jobns_roots_namespace(int fd, int nstype)
{
	struct stat owner, mine;
	struct statfs fs;
	int userns, ok;

	if (fstatfs(fd, &fs) < 0 || fs.f_type != NSFS_MAGIC || ioctl(fd, NS_GET_NSTYPE) != nstype)
		return JOBNS_NS_NOT;
	userns = ioctl(fd, NS_GET_USERNS);
	if (userns < 0)
		return JOBNS_NS_NOT;
	ok = fstat(userns, &owner) == 0 && stat("/proc/self/ns/user", &mine) == 0 &&
	     owner.st_dev == mine.st_dev && owner.st_ino == mine.st_ino;
	close(userns);
	return ok ? JOBNS_NS_OK : JOBNS_NS_USERS;
}

/* Open the job's ns/<name> pin (a namespace of type nstype owned by the host's user
 * namespace): the fd, or -1 with errno ENOENT when the job has none, or -1 with the
 * reason in err. */
JOBNS_FN int jobns_open_pin(const struct jobns_job *j, const char *name, int nstype, char *err,
			  size_t size)
{
	int ns = openat(j->dir, "ns", O_RDONLY | O_NOFOLLOW | O_DIRECTORY | O_CLOEXEC);
	int fd = ns < 0 ? -1 : openat(ns, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	int e = errno;

	if (ns >= 0)
		close(ns);
	if (fd < 0) {
		snprintf(err, size, "open %s/ns/%s: %s", j->shown, name, strerror(e));
		errno = e;
		return -1;
	}
	switch (jobns_roots_namespace(fd, nstype)) {
	case JOBNS_NS_OK:
		return fd;
	case JOBNS_NS_USERS:
		snprintf(err, size, "job %s's namespace belongs to its user, so root will not "
			 "enter it (set [slurm] enforce = true in jobns.toml on this node)", j->job);
		break;
	default:
		snprintf(err, size, "%s/ns/%s is not a pinned %s namespace", j->shown, name,
			 nstype == CLONE_NEWPID ? "PID" : "mount");
	}
	close(fd);
	errno = EPERM;
	return -1;
}

#endif /* JOBNS_NODE_H */
