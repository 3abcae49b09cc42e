/*
 * protocol_reader.c: what the C side of the node's file protocol understands of one job
 * under state_dir, for tests/unit/test_protocol_golden.py to hold against what
 * jobns/launcher/protocol/state.py wrote. Built against the header every C module of
 * jobns includes (jobns/slurm/jobns_node.h, found through -I); its functions decide
 * everything printed here, looking once as the PAM module does (jobns_start, then
 * jobns_open_dir: no waiting for a setup). The env. loop is the one the SPANK plugin and
 * the PAM module each carry (jobns_spank.c set_job_environment: the tighter bound).
 *
 *   protocol_reader STATE_DIR JOB_ID
 *
 * One "key=value" per line; a key is left out when the C side finds nothing for it:
 *   jobs=ok | <strerror>        <state_dir>/jobs, both root's (jobns_open_root_owned)
 *   mark.setup=NS, mark.ending=NS   the marks' times in ns (jobns_mark_at)
 *   run_is_over=0|1             jobns_run_is_over
 *   setup_under_way=0|1         jobns_setup_under_way (<id>.lock held)
 *   open=0 | -1 <strerror>      jobns_open_dir (the job's directory and its run.env)
 *   bytes=N                     how much of run.env was read
 *   version= closed= reason= mnt_ns=   jobns_value_of
 *   check_open=RC ERR           jobns_check_open (0, -1 unknown version, -2 not joinable)
 *   inside=0|1                  jobns_inside (mnt_ns names this process's namespace)
 *   has_pidns=0|1               jobns_has_pidns
 *   pin.mnt=, pin.pid=          ok, or jobns_open_pin's reason
 *   env.NAME=VALUE              each variable a task would get
 *   env_refused=WHY             a line the plugin would refuse the task for
 */
#include "jobns_node.h"

#include <stdint.h>
#include <stdlib.h>


static void print_mark(int jobs, const char *job, const char *suffix)
{
	struct timespec at;

	if (jobns_mark_at(jobs, job, suffix, &at))
		printf("mark%s=%jd\n", suffix, (intmax_t)at.tv_sec * 1000000000 + at.tv_nsec);
}

static void print_value(const char *text, const char *key, size_t size)
{
	char value[JOBNS_RUN_ENV_MAX + 1];

	if (size > sizeof(value))
		size = sizeof(value);
	if (jobns_value_of(text, key, value, size))
		printf("%s=%s\n", key, value);
}

static void print_pin(const struct jobns_job *j, const char *name, int nstype)
{
	char err[JOBNS_ERR];
	int fd = jobns_open_pin(j, name, nstype, err, sizeof(err));

	if (fd >= 0) {
		close(fd);
		printf("pin.%s=ok\n", name);
	} else {
		printf("pin.%s=%s\n", name, err);
	}
}

static void print_env(const char *text)
{
	char buf[JOBNS_ENV_MAX];
	int got;

	while ((got = jobns_next_env(&text, buf, sizeof(buf))) != 0)
		if (got < 0)
			printf("env_refused=%s\n", buf);
		else
			printf("env.%s\n", buf);
}

int main(int argc, char **argv)
{
	static struct jobns_job j; /* run.env's 64 KiB: not on the stack */
	char err[JOBNS_ERR];
	int rc;

	if (argc != 3) {
		fprintf(stderr, "usage: %s STATE_DIR JOB_ID\n", argv[0]);
		return 2;
	}
	if (jobns_start(&j, argv[1], strtoul(argv[2], NULL, 10), err, sizeof(err)) < 0) {
		printf("start=-1 %s\n", err);
		return 0;
	}
	j.top = jobns_open_root_owned(AT_FDCWD, argv[1], JOBNS_DIR);
	j.jobs = j.top < 0 ? -1 : jobns_open_root_owned(j.top, "jobs", JOBNS_DIR);
	printf("jobs=%s\n", j.jobs >= 0 ? "ok" : strerror(errno));
	if (j.jobs >= 0) {
		print_mark(j.jobs, j.job, ".setup");
		print_mark(j.jobs, j.job, ".ending");
		printf("run_is_over=%d\n", jobns_run_is_over(j.jobs, j.job));
		printf("setup_under_way=%d\n", jobns_setup_under_way(j.jobs, j.job));
	}
	if (jobns_open_dir(&j) < 0) {
		printf("open=-1 %s\n", strerror(errno));
		jobns_close(&j);
		return 0;
	}
	printf("open=0\n");
	printf("bytes=%zu\n", strlen(j.text));
	/* The buffers the modules give jobns_value_of (jobns_check_open's own for closed
	 * and reason, the 64 bytes jobns_inside_text gives mnt_ns). */
	print_value(j.text, "version", 64);
	print_value(j.text, "closed", 64);
	print_value(j.text, "reason", 2048);
	print_value(j.text, "mnt_ns", 64);
	rc = jobns_check_open(&j, err, sizeof(err));
	printf("check_open=%d%s%s\n", rc, rc ? " " : "", rc ? err : "");
	printf("inside=%d\n", jobns_inside(&j));
	printf("has_pidns=%d\n", jobns_has_pidns(&j));
	print_pin(&j, "mnt", CLONE_NEWNS);
	print_pin(&j, "pid", CLONE_NEWPID);
	print_env(j.text);
	jobns_close(&j);
	return 0;
}
