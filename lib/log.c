/* SPDX-License-Identifier: Apache-2.0 */
/* log.h: one-line diagnostics for the daemon and tools. */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <syslog.h>
#include <time.h>

static const char *log_prog = "weightfs";
static bool log_syslog;
static enum wfs_log_level log_max = WFS_LOG_INFO;
static FILE *log_file;

void wfs_log_init(const char *prog, bool use_syslog, enum wfs_log_level max_level)
{
	log_prog = prog;
	log_syslog = use_syslog;
	log_max = max_level;
	if (use_syslog)
		openlog(prog, LOG_PID, LOG_DAEMON);
}

static void vlog(enum wfs_log_level level, const char *fmt, va_list ap)
{
	static const int prio[] = {LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG};
	static const char *const tag[] = {"error", "warning", "info", "debug"};
	char line[1024];

	if (level > log_max)
		return;
	vsnprintf(line, sizeof(line), fmt, ap);
	if (log_syslog)
		syslog(prio[level], "%s", line);
	/* One fprintf per line: stdio locks the stream, so lines from threads do not interleave. */
	fprintf(stderr, "%s: %s: %s\n", log_prog, tag[level], line);
	if (log_file) {
		char when[32];
		time_t now = time(NULL);
		struct tm tm;

		strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S%z", localtime_r(&now, &tm));
		fprintf(log_file, "%s %s[%s]: %s\n", when, log_prog, tag[level], line);
	}
}

int wfs_log_open_file(const char *path)
{
	FILE *f = fopen(path, "ae");

	if (!f)
		return -errno;
	setvbuf(f, NULL, _IOLBF, 0);
	log_file = f;
	return 0;
}

void wfs_log(enum wfs_log_level level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vlog(level, fmt, ap);
	va_end(ap);
}

void wfs_log_once(atomic_bool *once, enum wfs_log_level level, const char *fmt, ...)
{
	va_list ap;

	if (atomic_exchange(once, true))
		return;
	va_start(ap, fmt);
	vlog(level, fmt, ap);
	va_end(ap);
}
