/*
 * Whose close is a writer's end: what the daemon reads of a closing process (/proc) to decide
 * whether a flush seals a version. No FUSE here: callers pass the kernel's thread ids.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "version.h"
#include "writer.h"

/* Read /proc/@pid/@file into @buf (NUL-terminated). Returns the length, or -1 when it is gone. */
static ssize_t read_proc(pid_t pid, const char *file, char *buf, size_t size)
{
	char path[64];
	ssize_t n;
	int fd;

	if (pid <= 0)
		return -1;
	snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, file);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	n = read(fd, buf, size - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	return n;
}

int wfs_writer_killed_by(pid_t tid)
{
	char buf[1024], *p;
	unsigned long flags = 0;
	long code = 0;

	if (read_proc(tid, "stat", buf, sizeof(buf)) < 0)
		return 0;
	p = strrchr(buf, ')'); /* the command name may contain spaces and parentheses */
	/* After ")": field 3 (state) onwards; flags is field 9, exit_code field 52. */
	for (int field = 3; field <= 52 && p; field++) {
		p = strchr(p + 1, ' ');
		if (p && field == 9)
			flags = strtoul(p + 1, NULL, 10);
		if (p && field == 52)
			code = strtol(p + 1, NULL, 10);
	}
	return (flags & 0x4 /* PF_EXITING */) ? (int)(code & 0x7f) : 0;
}

pid_t wfs_writer_tgid(pid_t tid)
{
	char buf[512], *p;

	if (read_proc(tid, "status", buf, sizeof(buf)) < 0)
		return 0;
	p = strstr(buf, "\nTgid:");
	return p ? (pid_t)strtol(p + 6, NULL, 10) : 0;
}

bool wfs_writer_killed_before_data(struct wfs_version *v, pid_t opener_tid, pid_t flusher_tid)
{
	pid_t a, b;

	if (!opener_tid || !flusher_tid || wfs_version_has_data(v) || !wfs_writer_killed_by(flusher_tid))
		return false;
	if (flusher_tid == opener_tid)
		return true;
	a = wfs_writer_tgid(flusher_tid);
	b = wfs_writer_tgid(opener_tid);
	return a && a == b; /* the opener gone (its process exited): not known to be its close */
}

bool wfs_writer_flush_ends(struct wfs_version *v, pid_t writer_tid, pid_t flusher_tid)
{
	pid_t a, b;

	if (!wfs_version_has_data(v))
		return false;
	if (!writer_tid || flusher_tid == writer_tid)
		return true;
	a = wfs_writer_tgid(flusher_tid);
	b = wfs_writer_tgid(writer_tid);
	return !a || !b || a == b; /* unknown: seal, as close(2) promises */
}
