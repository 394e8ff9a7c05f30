/* SPDX-License-Identifier: Apache-2.0 */
/* fault.h: test-only crash points and I/O fault injection. */
#include "fault.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct spec {
	char point[128];
	long nth;          /* pass that triggers (1-based); 0: every pass */
	int err;           /* errno to inject (faults), milliseconds to sleep (delays) */
	atomic_long count; /* passes so far */
};

static struct spec crash, fault, delays[4];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static int parse_errno(const char *s)
{
	static const struct {
		const char *name;
		int err;
	} names[] = {{"EIO", EIO}, {"ENOSPC", ENOSPC}, {"EDQUOT", EDQUOT}, {"ENOMEM", ENOMEM},
		     {"EROFS", EROFS}, {"EMFILE", EMFILE}, {"EACCES", EACCES}, {"EPERM", EPERM}};

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strcmp(s, names[i].name) == 0)
			return names[i].err;
	return atoi(s);
}

/* "NAME[:N]" into @sp; for faults "NAME=ERRNO[:N]", for delays "NAME=MS[:N]". */
static void parse_one(const char *v, struct spec *sp, bool with_errno, long default_nth)
{
	char buf[128], *colon, *eq;

	if (!v || !*v)
		return;
	snprintf(buf, sizeof(buf), "%s", v);
	sp->nth = default_nth;
	colon = strrchr(buf, ':');
	if (colon) {
		*colon = '\0';
		sp->nth = atol(colon + 1);
	}
	if (with_errno) {
		eq = strchr(buf, '=');
		if (!eq)
			return;
		*eq = '\0';
		sp->err = parse_errno(eq + 1);
		if (sp->err <= 0)
			return;
	}
	snprintf(sp->point, sizeof(sp->point), "%s", buf);
}

/* A comma-separated list of specs in @env into @sp[0..@n). */
static void parse(const char *env, struct spec *sp, size_t n, bool with_errno, long default_nth)
{
	const char *v = getenv(env);
	char buf[512], *save = NULL, *one;

	if (!v || !*v)
		return;
	snprintf(buf, sizeof(buf), "%s", v);
	for (one = strtok_r(buf, ",", &save); one && n > 0; one = strtok_r(NULL, ",", &save), sp++, n--)
		parse_one(one, sp, with_errno, default_nth);
}

static void init(void)
{
	parse("WFS_CRASH_AT", &crash, 1, false, 1);
	parse("WFS_FAULT", &fault, 1, true, 1);
	parse("WFS_DELAY", delays, sizeof(delays) / sizeof(delays[0]), true, 0);
}

static bool hit(struct spec *sp, const char *point)
{
	long n;

	pthread_once(&once, init);
	if (!sp->point[0] || strcmp(sp->point, point) != 0)
		return false;
	n = atomic_fetch_add(&sp->count, 1) + 1;
	return sp->nth == 0 || n == sp->nth;
}

void wfs_crashpoint(const char *point)
{
	if (hit(&crash, point)) {
		fprintf(stderr, "weightfs: crash point %s reached: killing the process\n", point);
		kill(getpid(), SIGKILL);
		pause();
	}
}

int wfs_fault(const char *point)
{
	return hit(&fault, point) ? -fault.err : 0;
}

void wfs_delay(const char *point)
{
	for (size_t i = 0; i < sizeof(delays) / sizeof(delays[0]); i++)
		if (hit(&delays[i], point))
			usleep((useconds_t)delays[i].err * 1000);
}
