/* SPDX-License-Identifier: Apache-2.0 */
/* upgrade.h: a mount's server replaced by another binary without unmounting. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "commit.h"
#include "daemon.h"
#include "lock.h"
#include "clock.h"
#include "log.h"
#include "receive.h"
#include "takeover.h"
#include "upgrade.h"

extern char **environ;

static void sleep_ms(unsigned ms)
{
	struct timespec t = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};

	while (nanosleep(&t, &t) < 0 && errno == EINTR)
		;
}

/* ---- the server ------------------------------------------------------------------------------ */

static struct {
	sem_t go;                   /* posted by the SIGUSR2 handler */
	atomic_int wait_ms;         /* the bound the holder asked for */
	atomic_int writers;         /* this server's handles open for writing */
	atomic_uint closed;         /* of those, released since the drain began */
	atomic_bool draining;
	struct wfs_fs *fs;
} up;

void wfs_upgrade_writer_opened(void)
{
	atomic_fetch_add_explicit(&up.writers, 1, memory_order_relaxed);
}

void wfs_upgrade_writer_released(void)
{
	atomic_fetch_sub_explicit(&up.writers, 1, memory_order_relaxed);
	if (atomic_load_explicit(&up.draining, memory_order_relaxed))
		atomic_fetch_add_explicit(&up.closed, 1, memory_order_relaxed);
}

static void on_upgrade_signal(int sig, siginfo_t *si, void *ctx)
{
	int ms = si->si_code == SI_QUEUE ? si->si_value.sival_int : WFS_UPGRADE_WAIT_MS;

	(void)sig;
	(void)ctx;
	atomic_store(&up.wait_ms, ms < 0 ? 0 : ms);
	sem_post(&up.go); /* async-signal-safe */
}

/* Make what this server committed durable before it goes (-o sync; nothing with sync=none). */
static void settle(struct wfs_fs *fs)
{
	wfs_lock(&fs->lock);
	wfs_commit_now(fs);
	wfs_unlock(&fs->lock);
	if (fs->opt.sync)
		wfs_commit_sync(fs);
}

/* The drain (upgrade.h, step 2), once SIGUSR2 came. Ends the process. */
static void *drain_main(void *arg)
{
	struct wfs_fs *fs = arg;
	uint64_t t0, until, gate, left = 0;
	unsigned busy;
	int wait_ms, still_open;

	while (sem_wait(&up.go) != 0)
		; /* EINTR */
	/* Asked while this server was starting: no next server can take the mount over before the
	 * kernel's INIT is answered (the holder would give up), so the drain begins after it. */
	while (!wfs_takeover_init_answered())
		sleep_ms(2);
	t0 = wfs_clock_ns();
	wait_ms = atomic_load(&up.wait_ms);
	atomic_store(&up.draining, true);
	wfs_receive_gate(WFS_RECEIVE_NO_WRITERS);
	wfs_log(WFS_LOG_INFO, "upgrade: server pid %d drains: new creates and opens for writing wait for the "
		"next server; %d files open for writing get up to %d ms to be closed", (int)getpid(),
		atomic_load(&up.writers), wait_ms);
	until = t0 + (uint64_t)wait_ms * 1000000u;
	while (atomic_load(&up.writers) > 0 && wfs_clock_ns() < until)
		sleep_ms(2);
	settle(fs); /* the bulk of the syncing before the pause, the rest after it */
	wfs_receive_gate(WFS_RECEIVE_NONE);
	gate = wfs_clock_ns();
	until = gate + (uint64_t)WFS_UPGRADE_QUIET_MS * 1000000u;
	while ((busy = wfs_receive_busy(&left)) > 0 && wfs_clock_ns() < until)
		sleep_ms(1);
	still_open = atomic_load(&up.writers);
	settle(fs);
	wfs_takeover_note_drain(gate, atomic_load(&up.closed), still_open > 0 ? (uint32_t)still_open : 0);
	if (still_open > 0)
		wfs_log(WFS_LOG_INFO, "upgrade: %d files still open for writing after %d ms: the next server "
			"adopts them (their versions are kept: fs/core/keep.h)", still_open, wait_ms);
	if (busy)
		wfs_log(WFS_LOG_WARN, "upgrade: %u requests still in progress after %d ms: the next server "
			"gets them again", busy, WFS_UPGRADE_QUIET_MS);
	wfs_log_limits_flush(); /* the lines left out that no later line told of (log.h) */
	wfs_log(WFS_LOG_INFO, "upgrade: server pid %d leaves the mount to the next server: waited %.1f ms "
		"for %u writers to close, stopped in %.1f ms, %llu requests left for the next server",
		(int)getpid(), (double)(gate - t0) / 1e6, atomic_load(&up.closed),
		(double)(wfs_clock_ns() - gate) / 1e6, (unsigned long long)left);
	_exit(WFS_UPGRADE_EXIT); /* no unmount, no unwinding: the holder starts the next server */
	return NULL;
}

int wfs_upgrade_server_start(struct wfs_fs *fs)
{
	struct wfs_receive_stats rs;
	struct sigaction sa = {0};
	sigset_t unblock;
	pthread_t t;
	int ret;

	wfs_receive_stats(&rs);
	if (!rs.installed) {
		wfs_log(WFS_LOG_WARN, "upgrade: libfuse's own receive path cannot leave requests to a next "
			"server: weightfsctl upgrade is refused on this mount");
		return -ENOTSUP;
	}
	up.fs = fs;
	if (sem_init(&up.go, 0, 0) < 0)
		return -errno;
	ret = pthread_create(&t, NULL, drain_main, fs);
	if (ret)
		return -ret;
	pthread_detach(t);
	sa.sa_sigaction = on_upgrade_signal;
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGUSR2, &sa, NULL) < 0)
		return -errno;
	/* Blocked since the holder forked this server (holder.c): a drain asked while it started
	 * comes now. */
	sigemptyset(&unblock);
	sigaddset(&unblock, SIGUSR2);
	pthread_sigmask(SIG_UNBLOCK, &unblock, NULL);
	return 0;
}

/* A decimal descriptor number from @s up to @end; -1 when it is not one, or not open. */
static int parse_fd(const char *s, char **end)
{
	long v;

	errno = 0;
	v = strtol(s, end, 10);
	if (errno || *end == s || v < 0 || v > 1 << 20 || fcntl((int)v, F_GETFD) < 0)
		return -1;
	return (int)v;
}

int wfs_upgrade_inherited(struct wfs_upgrade_inherited *out)
{
	const char *fds = getenv("WFS_UPGRADE_FDS");
	const char *store = getenv("WFS_UPGRADE_STORE"), *mount = getenv("WFS_UPGRADE_MOUNT"), *holder;
	struct wfs_upgrade_inherited u = {0};
	char *end, *st, *mnt;

	if (!fds)
		return 0;
	u.devfd = parse_fd(fds, &end);
	if (u.devfd < 0 || *end != ',')
		return -EINVAL;
	u.region_fd = parse_fd(end + 1, &end);
	if (u.region_fd < 0 || *end != ',')
		return -EINVAL;
	u.lock_fd = parse_fd(end + 1, &end);
	if (u.lock_fd < 0 || *end || !store || store[0] != '/' || !mount || mount[0] != '/')
		return -EINVAL;
	/* The holder forks and execs its server: a process between them (a wrapper script that ran
	 * weightfs without exec) would get its signals and its death, not this one. Absent: a holder
	 * older than the variable. */
	holder = getenv("WFS_UPGRADE_HOLDER");
	if (holder && strtol(holder, NULL, 10) != (long)getppid())
		return -ECHILD;
	st = strdup(store);
	mnt = strdup(mount);
	if (!st || !mnt) {
		free(st);
		free(mnt);
		return -EINVAL;
	}
	u.store = st; /* the caller's: wfs_upgrade_inherited_free() */
	u.mount = mnt;
	unsetenv("WFS_UPGRADE_FDS");
	unsetenv("WFS_UPGRADE_STORE");
	unsetenv("WFS_UPGRADE_MOUNT");
	unsetenv("WFS_UPGRADE_HOLDER");
	/* This process's own from here on: none goes to what it runs (fusermount3). */
	fcntl(u.devfd, F_SETFD, FD_CLOEXEC);
	fcntl(u.lock_fd, F_SETFD, FD_CLOEXEC);
	*out = u;
	return 1;
}

void wfs_upgrade_inherited_free(struct wfs_upgrade_inherited *u)
{
	free((char *)u->store);
	free((char *)u->mount);
	u->store = u->mount = NULL;
}

void wfs_upgrade_unmount(const char *mountpoint)
{
	char prog[] = "fusermount3", u[] = "-u", q[] = "-q", z[] = "-z", end[] = "--";
	char *const argv[] = {prog, u, q, z, end, (char *)mountpoint, NULL};
	pid_t pid;
	int status;

	if (umount2(mountpoint, MNT_DETACH) == 0)
		return;
	if (posix_spawnp(&pid, "fusermount3", NULL, NULL, argv, environ) != 0 ||
	    waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
		wfs_log(WFS_LOG_WARN, "%s: cannot unmount (umount2: %s; fusermount3 -u -z failed): clear it with "
			"fusermount3 -u %s", mountpoint, strerror(errno), mountpoint);
}

/* ---- the holder ------------------------------------------------------------------------------ */

/* STORE/WFS_UPGRADE_SOCKET into @sa; -ENAMETOOLONG when it does not fit sun_path. */
static int socket_address(const char *store, struct sockaddr_un *sa)
{
	int n;

	*sa = (struct sockaddr_un){.sun_family = AF_UNIX};
	n = snprintf(sa->sun_path, sizeof(sa->sun_path), "%s/" WFS_UPGRADE_SOCKET, store);
	return n < 0 || (size_t)n >= sizeof(sa->sun_path) ? -ENAMETOOLONG : 0;
}

int wfs_upgrade_listen(const char *store)
{
	struct sockaddr_un sa;
	int fd, ret;

	ret = socket_address(store, &sa);
	if (ret)
		return ret;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	unlink(sa.sun_path); /* a killed holder's; the store's lock says no other holder lives */
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || chmod(sa.sun_path, 0600) < 0 || listen(fd, 4) < 0) {
		ret = -errno;
		close(fd);
		return ret;
	}
	return fd;
}

void wfs_upgrade_unlisten(const char *store)
{
	struct sockaddr_un sa;

	if (socket_address(store, &sa) == 0)
		unlink(sa.sun_path);
}

void wfs_upgrade_answer(int cfd, const char *fmt, ...)
{
	char line[2 * 4096 + 256];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		n = 0;
	if ((size_t)n > sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	if (send(cfd, line, (size_t)n, MSG_NOSIGNAL) < 0)
		wfs_log(WFS_LOG_DEBUG, "upgrade: the client left before its answer: %s", strerror(errno));
	close(cfd);
}

int wfs_upgrade_accept(int lfd, char *binary, size_t binary_bytes, uint32_t *wait_ms)
{
	struct timeval tv = {.tv_sec = 2};
	struct ucred cred;
	socklen_t len = sizeof(cred);
	char line[4200], *end, *path;
	size_t n = 0;
	unsigned long ms;
	int cfd;

	cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	if (cfd < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	if (getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || (cred.uid != 0 && cred.uid != geteuid())) {
		wfs_upgrade_answer(cfd, "refused\tonly root and the mount's owner (uid %u) may upgrade it",
				   (unsigned)geteuid());
		return -EPERM;
	}
	/* The client writes its line at once: a short bound keeps a stuck one from holding the holder. */
	setsockopt(cfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	while (n < sizeof(line) - 1) {
		ssize_t r = recv(cfd, line + n, sizeof(line) - 1 - n, 0);

		if (r <= 0)
			break;
		n += (size_t)r;
		if (memchr(line, '\n', n))
			break;
	}
	line[n] = '\0';
	end = strchr(line, '\n');
	if (end)
		*end = '\0';
	if (!end || strncmp(line, "upgrade ", 8) != 0)
		goto bad;
	errno = 0;
	ms = strtoul(line + 8, &path, 10);
	if (errno || path == line + 8 || *path != ' ' || ms > WFS_UPGRADE_WAIT_MAX_MS || path[1] != '/' ||
	    strlen(path + 1) >= binary_bytes)
		goto bad;
	snprintf(binary, binary_bytes, "%s", path + 1);
	*wait_ms = (uint32_t)ms;
	return cfd;
bad:
	wfs_upgrade_answer(cfd, "refused\tmalformed request (expected \"upgrade WAIT_MS /PATH\")");
	return -EPROTO;
}

int wfs_upgrade_check_binary(const char *binary, char *why, size_t why_bytes)
{
	struct stat st;

	if (binary[0] != '/') {
		snprintf(why, why_bytes, "not an absolute path");
		return -EINVAL;
	}
	if (stat(binary, &st) < 0) {
		int err = errno;

		snprintf(why, why_bytes, "%s", strerror(err));
		return -err;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(why, why_bytes, "not a regular file");
		return -EINVAL;
	}
	if (access(binary, X_OK) < 0) {
		int err = errno;

		snprintf(why, why_bytes, "not executable (%s)", strerror(err));
		return -err;
	}
	return 0;
}

void wfs_upgrade_exec(const char *binary, int binary_fd, char *const argv[], int devfd, int lock_fd,
		      const char *store, const char *mount)
{
	int region = wfs_takeover_region_fd();
	char fds[64], holder[24];
	size_t argc = 0;
	char **args;

	while (argv[argc])
		argc++;
	args = calloc(argc + 1, sizeof(*args));
	snprintf(fds, sizeof(fds), "%d,%d,%d", devfd, region, lock_fd);
	snprintf(holder, sizeof(holder), "%d", (int)getppid()); /* this is the holder's child */
	if (!args || region < 0 || setenv("WFS_UPGRADE_FDS", fds, 1) < 0 || setenv("WFS_UPGRADE_STORE", store, 1) < 0 ||
	    setenv("WFS_UPGRADE_MOUNT", mount, 1) < 0 || setenv("WFS_UPGRADE_HOLDER", holder, 1) < 0) {
		wfs_log(WFS_LOG_ERR, "upgrade: cannot start %s: no memory or no shared region", binary);
		_exit(WFS_UPGRADE_EXEC_FAILED);
	}
	for (size_t i = 0; i < argc; i++)
		args[i] = argv[i];
	args[0] = (char *)binary;
	/* This child's own descriptor table: the three go through the exec, the holder's stay as they are. */
	fcntl(devfd, F_SETFD, 0);
	fcntl(region, F_SETFD, 0);
	fcntl(lock_fd, F_SETFD, 0);
	/* The file that was checked, whatever @binary names now. A script cannot be run so (its
	 * interpreter would open /dev/fd/N, which the exec closed: ENOENT): it runs from its path. */
	if (binary_fd >= 0)
		fexecve(binary_fd, args, environ);
	if (binary_fd < 0 || errno == ENOENT)
		execv(binary, args);
	wfs_log(WFS_LOG_ERR, "%s: cannot execute %s: %s", binary_fd >= 0 ? "successor" : "upgrade", binary,
		strerror(errno));
	_exit(WFS_UPGRADE_EXEC_FAILED);
}
