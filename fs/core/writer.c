/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Whose close is a writer's end: what the daemon reads of a closing process (/proc) to decide
 * whether a flush seals a version. No FUSE here: callers pass the kernel's thread ids.
 */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
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

/*
 * Descriptors of /proc/TID/task/TID/stat kept open for the threads asked about last: a trainer
 * closes thousands of files from one thread, and a pread(2) of an open descriptor costs a quarter
 * of open + read + close (1.4 against 5.5 µs on the 2-core test machine). A descriptor stays bound
 * to the task it was opened for: once that task is reaped its reads fail (ESRCH), and the thread
 * id, if the kernel reuses it, is opened again. The task/TID file is the thread's own (the
 * process's /proc/TID/stat adds up every thread's times), with the same flags and exit code.
 */
#define STAT_FDS 16
static struct {
	pid_t tid; /* 0: free */
	int fd;
} stat_fds[STAT_FDS];
static unsigned stat_fds_next; /* the slot to reuse next, round robin */
static pthread_mutex_t stat_fds_lock = PTHREAD_MUTEX_INITIALIZER;

/* Read thread @tid's stat line into @buf (NUL-terminated). Returns the length, or -1 when it is gone. */
static ssize_t read_stat(pid_t tid, char *buf, size_t size)
{
	char path[64];
	ssize_t n = -1;
	unsigned i;
	int fd;

	if (tid <= 0)
		return -1;
	pthread_mutex_lock(&stat_fds_lock);
	for (i = 0; i < STAT_FDS && stat_fds[i].tid != tid; i++)
		;
	if (i < STAT_FDS) {
		n = pread(stat_fds[i].fd, buf, size - 1, 0);
		if (n <= 0) { /* that task is gone: the id may be another's now */
			close(stat_fds[i].fd);
			stat_fds[i].tid = 0;
		}
	}
	if (n <= 0) {
		snprintf(path, sizeof(path), "/proc/%d/task/%d/stat", (int)tid, (int)tid);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		n = fd < 0 ? -1 : read(fd, buf, size - 1);
		if (n > 0) {
			i = stat_fds_next++ % STAT_FDS;
			if (stat_fds[i].tid)
				close(stat_fds[i].fd);
			stat_fds[i].tid = tid;
			stat_fds[i].fd = fd;
		} else if (fd >= 0) {
			close(fd);
		}
	}
	pthread_mutex_unlock(&stat_fds_lock);
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

	if (read_stat(tid, buf, sizeof(buf)) < 0)
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

bool wfs_writer_in_group(pid_t tid, gid_t fsgid, gid_t gid)
{
	char buf[4096], *p, *end;

	if (gid == fsgid)
		return true;
	if (read_proc(tid, "status", buf, sizeof(buf)) < 0 || !(p = strstr(buf, "\nGroups:")))
		return false;
	p += 8;
	if ((end = strchr(p, '\n')))
		*end = '\0'; /* the line only */
	for (; *p; p = end) {
		unsigned long g = strtoul(p, &end, 10);

		if (end == p)
			break;
		if (g == (unsigned long)gid)
			return true;
	}
	return false;
}

int wfs_writer_killed_before_data(struct wfs_version *v, pid_t opener_tid, pid_t flusher_tid)
{
	pid_t a, b;
	int sig;

	if (!opener_tid || !flusher_tid || wfs_version_has_data(v) || !(sig = wfs_writer_killed_by(flusher_tid)))
		return 0;
	if (flusher_tid == opener_tid)
		return sig;
	a = wfs_writer_tgid(flusher_tid);
	b = wfs_writer_tgid(opener_tid);
	return a && a == b ? sig : 0; /* the opener gone (its process exited): not known to be its close */
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

/*
 * The mount ids (/proc/self/mountinfo field 1) of every mount of the filesystem mounted on
 * @mountpoint (the same MAJ:MIN, field 3: bind mounts too), into @ids (@max at most). Returns how
 * many, 0 when @mountpoint is not found. Paths in mountinfo escape space, tab, newline and backslash
 * as octal (\040): compared as written, so such a mount point is not found.
 */
static size_t mount_ids(const char *mountpoint, int *ids, size_t max)
{
	char *line = NULL, dev[32] = "", point[4096];
	size_t cap = 0, n = 0;
	FILE *f = fopen("/proc/self/mountinfo", "re");
	int id;

	if (!f)
		return 0;
	for (int pass = 0; pass < 2; pass++) {
		rewind(f);
		while (getline(&line, &cap, f) > 0) {
			char majmin[32];

			if (sscanf(line, "%d %*d %31s %*s %4095s", &id, majmin, point) != 3)
				continue;
			if (pass == 0 && strcmp(point, mountpoint) == 0)
				snprintf(dev, sizeof(dev), "%s", majmin); /* the last: the mount on top */
			else if (pass == 1 && dev[0] && strcmp(majmin, dev) == 0 && n < max)
				ids[n++] = id;
		}
	}
	free(line);
	fclose(f);
	return n;
}

/* Does process @pid hold a descriptor open for writing of inode @ino on a mount in @ids? */
static bool holds_writable(pid_t pid, uint64_t ino, const int *ids, size_t nids)
{
	char path[64], buf[512];
	struct dirent *e;
	bool found = false;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/fdinfo", (int)pid);
	d = opendir(path);
	if (!d)
		return false;
	while (!found && (e = readdir(d)) != NULL) {
		unsigned long long fino = 0;
		unsigned flags = 0;
		const char *p;
		int mnt = -1;
		char file[64 + 256];

		if (e->d_name[0] < '0' || e->d_name[0] > '9')
			continue;
		snprintf(file, sizeof(file), "fdinfo/%s", e->d_name);
		if (read_proc(pid, file, buf, sizeof(buf)) < 0)
			continue;
		if ((p = strstr(buf, "flags:")) != NULL)
			flags = (unsigned)strtoul(p + 6, NULL, 8);
		if ((p = strstr(buf, "mnt_id:")) != NULL)
			mnt = (int)strtol(p + 7, NULL, 10);
		if ((p = strstr(buf, "\nino:")) != NULL)
			fino = strtoull(p + 5, NULL, 10);
		if (fino != ino || (flags & O_ACCMODE) == O_RDONLY)
			continue;
		for (size_t i = 0; i < nids && !found; i++)
			found = ids[i] == mnt;
	}
	closedir(d);
	return found;
}

struct proc {
	pid_t pid, ppid;
	bool mine; /* @tgid or one of its descendants */
};

static int by_pid(const void *a, const void *b)
{
	pid_t x = ((const struct proc *)a)->pid, y = ((const struct proc *)b)->pid;

	return (x > y) - (x < y);
}

bool wfs_writer_forked_holder(pid_t tid, uint64_t ino, const char *mountpoint)
{
	struct proc *ps = NULL;
	size_t n = 0, cap = 0, nids;
	pid_t tgid = wfs_writer_tgid(tid);
	bool grew = true, found = false;
	int ids[64];
	struct dirent *e;
	DIR *d;

	if (!tgid || !mountpoint || (nids = mount_ids(mountpoint, ids, 64)) == 0)
		return false;
	d = opendir("/proc");
	if (!d)
		return false;
	while ((e = readdir(d)) != NULL) {
		char buf[1024], *p;
		pid_t pid = (pid_t)strtol(e->d_name, NULL, 10);

		if (pid <= 0 || read_proc(pid, "stat", buf, sizeof(buf)) < 0)
			continue;
		p = strrchr(buf, ')'); /* then " STATE PPID ..." */
		if (!p)
			continue;
		if (n == cap) {
			struct proc *more = reallocarray(ps, cap ? cap * 2 : 256, sizeof(*ps));

			if (!more)
				break; /* no memory: decided on the processes listed so far */
			ps = more;
			cap = cap ? cap * 2 : 256;
		}
		ps[n++] = (struct proc){.pid = pid, .ppid = (pid_t)strtol(p + 4, NULL, 10), .mine = pid == tgid};
	}
	closedir(d);
	/* Descendants of @tgid: marked generation by generation (a child's child, and so on). */
	if (n)
		qsort(ps, n, sizeof(*ps), by_pid);
	while (grew) {
		grew = false;
		for (size_t i = 0; i < n; i++) {
			struct proc key = {.pid = ps[i].ppid}, *parent;

			if (ps[i].mine)
				continue;
			parent = bsearch(&key, ps, n, sizeof(*ps), by_pid);
			if (parent && parent->mine)
				ps[i].mine = grew = true;
		}
	}
	for (size_t i = 0; i < n && !found; i++)
		found = ps[i].mine && ps[i].pid != tgid && holds_writable(ps[i].pid, ino, ids, nids);
	free(ps);
	return found;
}
