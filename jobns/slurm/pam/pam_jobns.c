/*
 * pam_jobns.c: put an ssh session that pam_slurm_adopt adopted into a Slurm job into that
 * job's mount namespace, on a node where the site enforces jobns through Slurm
 * ([slurm] enforce = true plus the SPANK plugin, jobns/slurm/spank/jobns_spank.c).
 *
 *   /etc/pam.d/sshd:
 *     account  required  pam_slurm_adopt.so
 *     account  required  pam_jobns.so [state_dir=/run/jobns] [admin_group=GROUP]
 *                                     [action_unjoinable=deny|allow]
 *     ...
 *     session  required  pam_jobns.so [the same arguments]
 *
 * Which job: the one pam_slurm_adopt adopted the connection into. Its account function
 * puts SLURM_JOB_ID in the PAM environment (pam_putenv) only once the job's extern step
 * took the process, so it must come first in the account stack. pam_jobns reads the id
 * there (pam_getenv), never from the process environment (sshd's own) and never from a
 * variable the client sent (AcceptEnv values reach only the session's child, after
 * PAM). It keeps the id it checked with pam_set_data, so a session module stacked before
 * it (pam_env reading a user's ~/.pam_environment) cannot change which job is joined.
 *
 * account: root and members of admin_group pass unjoined. Anyone else's job must be set
 *   up on this node and running, be the PAM user's own, and be pinned as a root-owned
 *   mount namespace; otherwise the login is refused with one line (sshd shows an account
 *   module's message to the client).
 * session: the same checks again (the job may have ended meanwhile), then setns() into
 *   the namespace and pam_putenv the job environment (run.env's env.NAME=VALUE lines:
 *   TMPDIR, JOBNS_JOB_ID, PMIx, ARC) plus JOBNS_JOINED, as the SPANK plugin does for a
 *   task. sshd opens the session in its privileged monitor process and forks the user's
 *   session from it, so everything the user runs starts in the job's namespace, and
 *   jobns teardown ends it with the job's other processes.
 *
 * A job that is not set up here, was refused by jobns setup, is still being set up or is
 * ending, or no SLURM_JOB_ID at all (not adopted): the login is refused, or with
 * action_unjoinable=allow let in unjoined (the node's own /tmp) with the line as a
 * warning. Always refused, whatever the arguments: a malformed id, another user's job,
 * state that is not root's, a namespace its user owns (root never enters a namespace a
 * user can mount in: SECURITY.md rule 1), a caller with threads (setns(CLONE_NEWNS)
 * fails with EINVAL in a multithreaded process; sshd's monitor has none), a failed join.
 *
 * No policy beyond that: who may log into the node at all is pam_slurm_adopt's decision.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <syslog.h>

#include "../jobns_node.h"

#define PAM_SM_ACCOUNT
#define PAM_SM_SESSION
#include <security/pam_ext.h>
#include <security/pam_modules.h>
#include <security/pam_modutil.h>

#define DEFAULT_STATE_DIR "/run/jobns"
#define JOB_ID_MAX_DIGITS 10 /* Slurm job ids are uint32 */
#define DATA_KEY "pam_jobns_job_id"

struct options {
	const char *state_dir;
	const char *admin_group;
	int allow_unjoinable;
};

/* Why a login cannot join: UNJOINABLE follows action_unjoinable, DENY always refuses. */
enum verdict { JOIN, UNJOINABLE, DENY };

struct job {
	char id[JOB_ID_MAX_DIGITS + 1];
	struct jobns_job j;          /* its directory (open while checked) and run.env */
	char why[2400];              /* the one line when not JOIN */
	int ns_fd;                   /* the pin, open, when JOIN */
	int pid_fd;                  /* ns/pid ([namespace] pid), open, or -1 */
	struct stat pin;
};

static enum verdict fail(struct job *job, enum verdict v, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static enum verdict fail(struct job *job, enum verdict v, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(job->why, sizeof(job->why), fmt, ap);
	va_end(ap);
	return v;
}

static int parse_options(pam_handle_t *pamh, int argc, const char **argv, struct options *o)
{
	o->state_dir = DEFAULT_STATE_DIR;
	o->admin_group = NULL;
	o->allow_unjoinable = 0;
	for (int i = 0; i < argc; i++) {
		if (strncmp(argv[i], "state_dir=", 10) == 0)
			o->state_dir = argv[i] + 10;
		else if (strncmp(argv[i], "admin_group=", 12) == 0 && argv[i][12])
			o->admin_group = argv[i] + 12;
		else if (strcmp(argv[i], "action_unjoinable=deny") == 0)
			o->allow_unjoinable = 0;
		else if (strcmp(argv[i], "action_unjoinable=allow") == 0)
			o->allow_unjoinable = 1;
		else {
			pam_syslog(pamh, LOG_ERR, "jobns: unknown argument '%s' (state_dir=PATH, "
				   "admin_group=GROUP, action_unjoinable=deny|allow); refusing "
				   "every login until /etc/pam.d is fixed", argv[i]);
			return -1;
		}
	}
	if (!jobns_state_dir_ok(o->state_dir)) {
		pam_syslog(pamh, LOG_ERR, "jobns: state_dir=%s must be an absolute path without "
			   "'..'; refusing every login until /etc/pam.d is fixed", o->state_dir);
		return -1;
	}
	return 0;
}

/* The state directory, one component at a time from "/" (stricter than the other
 * modules: sshd's monitor is root). An ancestor may be sticky, where only root can
 * replace root's entries. */
static int open_state_dir(const char *path)
{
	char buf[1100], *save = NULL, *part, *next;
	int fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC), sub;

	snprintf(buf, sizeof(buf), "%s", path);
	for (part = strtok_r(buf, "/", &save); part && fd >= 0; part = next) {
		next = strtok_r(NULL, "/", &save);
		sub = jobns_open_root_owned(fd, part, JOBNS_DIR | (next ? JOBNS_STICKY_OK : 0));
		close(fd);
		fd = sub;
	}
	return fd;
}

/* Digits only, no leading zero, at most a uint32: one safe path component. */
static int valid_job_id(const char *id)
{
	size_t len = strlen(id);

	if (len == 0 || len > JOB_ID_MAX_DIGITS || id[0] == '0')
		return 0;
	for (size_t i = 0; i < len; i++)
		if (id[i] < '0' || id[i] > '9')
			return 0;
	return strtoull(id, NULL, 10) <= UINT32_MAX;
}

/* run.env of the job (open in job->j) lets it join and it is the user's; then its pins,
 * unless the login is in its namespace already. */
static enum verdict check_open_job(struct job *job, uid_t uid)
{
	struct jobns_job *j = &job->j;
	char value[64];
	int rc = jobns_check_open(j, job->why, sizeof(job->why));

	if (rc < 0) /* -1: an unknown version; -2: refused, being set up or ending */
		return rc == -1 ? DENY : UNJOINABLE;
	if (!jobns_value_of(j->text, "uid", value, sizeof(value)) ||
	    strtoul(value, NULL, 10) != (unsigned long)uid || !value[0])
		return fail(job, DENY, "job %s is not yours", job->id);
	if (jobns_inside(j)) {
		/* pam_slurm_adopt put the login there (jobns's job_container/namespace plugin
		 * handed it the pin): only the job's variables are left to set. Its PID
		 * namespace is not reachable from inside: that plugin hands no pin of such a
		 * job, which this module joins whole. */
		if (stat("/proc/self/ns/mnt", &job->pin) < 0)
			return fail(job, DENY, "stat /proc/self/ns/mnt: %s", strerror(errno));
		return JOIN;
	}
	job->ns_fd = jobns_open_pin(j, "mnt", CLONE_NEWNS, job->why, sizeof(job->why));
	if (job->ns_fd < 0)
		return DENY;
	if (fstat(job->ns_fd, &job->pin) < 0)
		return fail(job, DENY, "%s/ns/mnt: %s", j->shown, strerror(errno));
	/* ns/pid: a job with [namespace] pid; none (ENOENT) is a job without one */
	job->pid_fd = jobns_open_pin(j, "pid", CLONE_NEWPID, job->why, sizeof(job->why));
	return job->pid_fd >= 0 || errno == ENOENT ? JOIN : DENY;
}

/* Look once (a login never waits for a setup): <state_dir>/jobs/<id> and its run.env. */
static enum verdict check_job(struct job *job, const struct options *o, uid_t uid)
{
	struct jobns_job *j = &job->j;
	enum verdict v;
	int e;

	if (jobns_start(j, o->state_dir, strtoul(job->id, NULL, 10), job->why,
			sizeof(job->why)) < 0)
		return DENY;
	j->top = open_state_dir(o->state_dir);
	if (j->top < 0)
		return fail(job, errno == ENOENT ? UNJOINABLE : DENY, "job %s is not set up on "
			    "this node (state directory %s: %s)", job->id, o->state_dir,
			    errno == EPERM ? "not root's, or writable by others" : strerror(errno));
	j->jobs = jobns_open_root_owned(j->top, "jobs", JOBNS_DIR);
	if (jobns_open_dir(j) < 0) {
		e = errno;
		v = fail(job, e == ENOENT ? UNJOINABLE : DENY,
			 "job %s is not set up on this node (%s%s: %s)", job->id, j->shown,
			 j->dir < 0 ? "" : "/run.env", e == EPERM && j->dir < 0 ?
			 "not root's, or writable by others" : strerror(e));
	} else {
		v = check_open_job(job, uid);
	}
	jobns_close(j);
	return v;
}

/* The job pam_slurm_adopt adopted the session into, as the account function saw it. */
static enum verdict job_of_session(pam_handle_t *pamh, struct job *job, int account)
{
	const void *kept = NULL;
	const char *id = NULL;

	if (!account && pam_get_data(pamh, DATA_KEY, &kept) == PAM_SUCCESS && kept)
		id = kept;
	else
		id = pam_getenv(pamh, "SLURM_JOB_ID");
	if (!id || !*id)
		return fail(job, UNJOINABLE, "this login was not adopted into a job (no "
			    "SLURM_JOB_ID from pam_slurm_adopt)");
	if (!valid_job_id(id))
		return fail(job, DENY, "SLURM_JOB_ID '%.32s' is not a job id", id);
	snprintf(job->id, sizeof(job->id), "%s", id);
	return JOIN;
}

static void forget(pam_handle_t *pamh, void *data, int status)
{
	(void)pamh;
	(void)status;
	free(data);
}

static int threads(void)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* Each "env.NAME=VALUE" line of run.env into the PAM environment (sshd copies it into
 * the session's environment), then JOBNS_JOINED for `jobns run` inside the session. */
static enum verdict set_environment(pam_handle_t *pamh, struct job *job)
{
	char buf[JOBNS_ENV_MAX];
	const char *at = job->j.text;
	int got;

	while ((got = jobns_next_env(&at, buf, sizeof(buf))) != 0)
		if (got < 0 || pam_putenv(pamh, buf) != PAM_SUCCESS)
			return fail(job, DENY, "job %s: cannot set '%.64s' (malformed, or longer "
				    "than %zu bytes)", job->id, buf, sizeof(buf));
	snprintf(buf, sizeof(buf), "SLURM_JOB_ID=%s", job->id);
	if (pam_putenv(pamh, buf) != PAM_SUCCESS)
		return fail(job, DENY, "set SLURM_JOB_ID");
	snprintf(buf, sizeof(buf), "JOBNS_JOINED=%s:%ju:%ju", job->id, (uintmax_t)job->pin.st_dev,
		 (uintmax_t)job->pin.st_ino);
	if (pam_putenv(pamh, buf) != PAM_SUCCESS)
		return fail(job, DENY, "set JOBNS_JOINED");
	return JOIN;
}

static enum verdict join(pam_handle_t *pamh, struct job *job)
{
	int n = threads();

	if (job->ns_fd < 0) /* inside already */
		return set_environment(pamh, job);
	if (n != 1)
		return fail(job, DENY, "cannot join job %s: this process has %d threads and "
			    "setns(CLONE_NEWNS) needs one (stack pam_jobns in sshd's session)",
			    job->id, n);
	if (setns(job->ns_fd, CLONE_NEWNS) < 0)
		return fail(job, DENY, "join job %s's namespace: %s", job->id, strerror(errno));
	/* setns() moved cwd to the namespace's root; sshd chdirs to the user's home later */
	/* A PID namespace takes only the children forked after this: the user's session,
	 * which sshd forks from this process. */
	if (job->pid_fd >= 0 && setns(job->pid_fd, CLONE_NEWPID) < 0)
		return fail(job, DENY, "join job %s's PID namespace: %s", job->id,
			    strerror(errno));
	return set_environment(pamh, job);
}

static int exempt(pam_handle_t *pamh, const char *user, const struct passwd *pw,
		  const struct options *o)
{
	return pw->pw_uid == 0 ||
	       (o->admin_group && pam_modutil_user_in_group_nam_nam(pamh, user, o->admin_group));
}

/* Both phases: check (and in the session, join); one line and a PAM status. */
static int run(pam_handle_t *pamh, int argc, const char **argv, int account)
{
	const int refused = account ? PAM_PERM_DENIED : PAM_SESSION_ERR;
	struct options o;
	const struct passwd *pw;
	const char *user = NULL;
	struct job *job;
	enum verdict v;
	int rc;

	if (parse_options(pamh, argc, argv, &o) < 0)
		return refused;
	if (pam_get_user(pamh, &user, NULL) != PAM_SUCCESS || !user ||
	    !(pw = pam_modutil_getpwnam(pamh, user))) {
		pam_syslog(pamh, LOG_ERR, "jobns: no such user '%s'", user ? user : "?");
		return refused;
	}
	if (exempt(pamh, user, pw, &o))
		return PAM_SUCCESS; /* root or an administrator: the node's own namespace */
	if (!(job = calloc(1, sizeof(*job))))
		return PAM_BUF_ERR;
	job->ns_fd = -1;
	job->pid_fd = -1;
	v = job_of_session(pamh, job, account);
	if (account) /* the id this check saw ("" for none) is the one the session joins */
		pam_set_data(pamh, DATA_KEY, strdup(v == JOIN ? job->id : ""), forget);
	if (v == JOIN)
		v = check_job(job, &o, pw->pw_uid);
	if (v == JOIN && !account)
		v = join(pamh, job);
	if (job->ns_fd >= 0)
		close(job->ns_fd);
	if (job->pid_fd >= 0)
		close(job->pid_fd);
	if (v == JOIN) {
		if (!account)
			pam_syslog(pamh, LOG_INFO, "jobns: session of %s joined job %s", user, job->id);
		rc = PAM_SUCCESS;
	} else if (v == UNJOINABLE && o.allow_unjoinable) {
		pam_syslog(pamh, LOG_NOTICE, "jobns: %s logs in outside any job: %s", user, job->why);
		if (account)
			pam_info(pamh, "jobns: %s; this session runs outside the job's /tmp", job->why);
		rc = PAM_SUCCESS;
	} else {
		pam_syslog(pamh, LOG_NOTICE, "jobns: refused %s: %s", user, job->why);
		pam_error(pamh, "jobns: access denied: %s", job->why);
		rc = refused;
	}
	free(job);
	return rc;
}

PAM_EXTERN int pam_sm_acct_mgmt(pam_handle_t *pamh, int flags, int argc, const char **argv)
{
	(void)flags;
	return run(pamh, argc, argv, 1);
}

PAM_EXTERN int pam_sm_open_session(pam_handle_t *pamh, int flags, int argc, const char **argv)
{
	(void)flags;
	return run(pamh, argc, argv, 0);
}

PAM_EXTERN int pam_sm_close_session(pam_handle_t *pamh, int flags, int argc,
				    const char **argv)
{
	(void)pamh;
	(void)flags;
	(void)argc;
	(void)argv;
	return PAM_SUCCESS;
}
