/* SPDX-License-Identifier: Apache-2.0 */
/* holder.h: the process that keeps the FUSE connection and forks a successor when a server dies. */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "holder.h"
#include "log.h"
#include "takeover.h"

static uint64_t now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* The signals the holder waits for instead of handling them. */
static void holder_signals(sigset_t *set)
{
	sigemptyset(set);
	sigaddset(set, SIGCHLD);
	sigaddset(set, SIGTERM);
	sigaddset(set, SIGINT);
	sigaddset(set, SIGHUP);
	sigaddset(set, SIGUSR1);
}

/* "killed by signal 9 (SIGKILL: ...)" or "exited with status N", into @s. */
static void describe_end(int status, char *s, size_t size)
{
	if (WIFSIGNALED(status)) {
		int sig = WTERMSIG(status);

		snprintf(s, size, "killed by signal %d (SIG%s%s)%s", sig, sigabbrev_np(sig) ? sigabbrev_np(sig) : "?",
			 sig == SIGKILL ? ": kill -9 or the OOM killer, the kernel log says which"
			 : sig == SIGABRT ? ": a failed assertion or abort(), the lines before say where"
					  : "",
			 WCOREDUMP(status) ? ", core dumped" : "");
	} else {
		snprintf(s, size, "exited with status %d", WEXITSTATUS(status));
	}
}

/*
 * Fork a server; a successor of server @dead (0 for the first), which ended as @why says, logs the
 * death with both pids. In the child: the signal mask as before, and wfs_takeover_server_start();
 * returns 0. In the holder: the child's pid, or -errno.
 */
static pid_t fork_server(const sigset_t *old, int devfd, pid_t dead, const char *why, const char *mountpoint)
{
	pid_t pid = fork();

	if (pid < 0)
		return -errno;
	if (pid == 0) {
		sigprocmask(SIG_SETMASK, old, NULL);
		if (dead)
			wfs_log(WFS_LOG_WARN, "server pid %d %s; successor pid %d takes %s over", (int)dead, why,
				(int)getpid(), mountpoint);
		wfs_takeover_server_start(devfd);
	}
	return pid;
}

int wfs_holder_run(const char *mountpoint, int devfd)
{
	unsigned short_deaths = 0;
	bool stopping = false;
	sigset_t set, old;
	uint64_t started;
	pid_t pid;
	int ret;

	ret = wfs_takeover_create(getpid());
	if (ret) {
		wfs_log(WFS_LOG_WARN, "-o holder: no shared memory for a successor (%s): this process serves "
			"the mount itself, and a crash leaves it dead", strerror(-ret));
		return ret;
	}
	holder_signals(&set);
	sigprocmask(SIG_BLOCK, &set, &old);
	started = now_ns();
	pid = fork_server(&old, devfd, 0, NULL, mountpoint);
	if (pid == 0)
		return 0;
	if (pid < 0) {
		sigprocmask(SIG_SETMASK, &old, NULL);
		wfs_log(WFS_LOG_WARN, "-o holder: cannot fork the server (%s): this process serves the mount "
			"itself", strerror(-pid));
		return pid;
	}
	wfs_log(WFS_LOG_INFO, "holder pid %d keeps the connection of %s; server pid %d", (int)getpid(),
		mountpoint, (int)pid);
	for (;;) {
		char why[200];
		siginfo_t info;
		int status, sig;
		bool can;

		sig = sigwaitinfo(&set, &info);
		if (sig < 0)
			continue; /* EINTR */
		if (sig == SIGUSR1) {
			wfs_log_reopen();
			kill(pid, SIGUSR1);
			continue;
		}
		if (sig != SIGCHLD) {
			stopping = true;
			kill(pid, sig); /* the server unmounts and exits 0 */
			continue;
		}
		if (waitpid(pid, &status, WNOHANG) != pid)
			continue;
		describe_end(status, why, sizeof(why));
		if ((WIFEXITED(status) && WEXITSTATUS(status) == 0) || stopping) {
			wfs_log(WFS_LOG_INFO, "holder: server pid %d %s; the holder ends too", (int)pid, why);
			_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
		}
		can = wfs_takeover_server_died(now_ns());
		short_deaths = now_ns() - started < (uint64_t)WFS_HOLDER_SHORT_S * 1000000000u ? short_deaths + 1 : 1;
		if (WIFEXITED(status) && WEXITSTATUS(status) == WFS_TAKEOVER_REFUSED) {
			wfs_log(WFS_LOG_ERR, "holder: successor pid %d could not take %s over (its line above says "
				"why): giving up; the mount fails with ENOTCONN until fusermount3 -u %s", (int)pid,
				mountpoint, mountpoint);
			_exit(1);
		}
		if (!can) {
			wfs_log(WFS_LOG_ERR, "holder: server pid %d %s before it answered the kernel's INIT: no "
				"successor can take %s over; giving up (ENOTCONN until fusermount3 -u %s)", (int)pid,
				why, mountpoint, mountpoint);
			_exit(1);
		}
		if (short_deaths >= WFS_HOLDER_DEATHS_MAX) {
			wfs_log(WFS_LOG_ERR, "holder: server pid %d %s: %u servers in a row died within %d s of "
				"their start; giving up, the mount fails with ENOTCONN until fusermount3 -u %s",
				(int)pid, why, short_deaths, WFS_HOLDER_SHORT_S, mountpoint);
			_exit(1);
		}
		started = now_ns();
		pid = fork_server(&old, devfd, pid, why, mountpoint);
		if (pid == 0)
			return 0;
		if (pid < 0) {
			wfs_log(WFS_LOG_ERR, "holder: cannot fork a successor (%s): giving up; the mount fails "
				"with ENOTCONN until fusermount3 -u %s", strerror(-pid), mountpoint);
			_exit(1);
		}
	}
}
