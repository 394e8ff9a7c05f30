/* SPDX-License-Identifier: Apache-2.0 */
/* holder.h: the process that keeps the FUSE connection and forks a successor when a server dies. */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "holder.h"
#include "clock.h"
#include "log.h"
#include "takeover.h"
#include "upgrade.h"

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

/* The holder's state (one process, one thread). */
static struct {
	const struct wfs_holder_args *a;
	sigset_t old;            /* the signal mask a server starts with */
	int sfd, lfd;            /* signalfd; the upgrade socket (-1: none) */
	char own[PATH_MAX];      /* this process's binary (/proc/self/exe) */
	char cur[PATH_MAX];      /* the binary successors run; "" this process's own image (a fork) */
	int cur_fd;              /* @cur as opened when its upgrade was asked (O_PATH; -1: a fork):
				  * successors execute that file, whatever the path names since */
	/* An upgrade under way: DRAINING the server, then STARTING the new binary. */
	enum { IDLE, DRAINING, STARTING } state;
	int client;              /* who asked, to be answered */
	char next[PATH_MAX];     /* the new binary */
	int next_fd;             /* @next, opened (O_PATH) when it was checked */
	pid_t old_pid;
	uint64_t asked_ns, stopped_ns, gate_ns, deadline_ns;
	uint32_t wait_ms;
} H = {.sfd = -1, .lfd = -1, .client = -1, .cur_fd = -1, .next_fd = -1};

/* The binary successors run, for messages. */
static const char *cur_binary(void)
{
	return H.cur[0] ? H.cur : H.own;
}

/*
 * Is the kernel's connection still up? A server exits with status 0 once the kernel ended the
 * session (an unmount: its read of /dev/fuse said ENODEV, after the kernel aborted the connection),
 * and /dev/fuse then polls POLLERR. One that exits 0 on a live connection did not see an unmount:
 * a binary that is no server (an upgrade to /bin/true), or a server whose unmount left the mount
 * lazily detached with files still open. Waits up to WFS_HOLDER_ENDED_MS for the abort.
 */
static bool connection_alive(void)
{
	struct pollfd p = {.fd = H.a->devfd, .events = 0};

	return poll(&p, 1, WFS_HOLDER_ENDED_MS) == 0;
}

/*
 * Fork a server running @binary ("" or NULL: this image, a plain fork), opened as @binary_fd; a
 * successor of server @dead (0 for the first), which ended as @why says, logs the death with both
 * pids. In a child of this image: the signal mask as before, and wfs_takeover_server_start(); returns
 * 0. A child of another binary executes it (upgrade.h). In the holder: the child's pid, or -errno.
 */
static pid_t fork_server(const char *binary, int binary_fd, pid_t dead, const char *why)
{
	pid_t pid = fork();

	if (pid < 0)
		return -errno;
	if (pid == 0) {
		sigset_t mask = H.old;

		/* SIGUSR2 (an upgrade's drain) stays blocked until the server can take it:
		 * wfs_upgrade_server_start() unblocks it once its handler is in; one that came
		 * earlier waits, instead of killing a server still starting. */
		sigaddset(&mask, SIGUSR2);
		sigprocmask(SIG_SETMASK, &mask, NULL);
		if (H.sfd >= 0)
			close(H.sfd);
		if (H.lfd >= 0)
			close(H.lfd);
		if (H.client >= 0)
			close(H.client);
		if (dead) /* a death is a warning, a drain for an upgrade is not */
			wfs_log(strstr(why, "drained") ? WFS_LOG_INFO : WFS_LOG_WARN,
				"server pid %d %s; successor pid %d%s%s takes %s over", (int)dead, why,
				(int)getpid(), binary && binary[0] ? " of " : "", binary && binary[0] ? binary : "",
				H.a->mountpoint);
		if (binary && binary[0])
			wfs_upgrade_exec(binary, binary_fd, H.a->argv, H.a->devfd, H.a->lock_fd, H.a->store,
					 H.a->mountpoint);
		wfs_takeover_server_start(H.a->devfd);
	}
	return pid;
}

/* The holder ends with @status: the client of an upgrade under way is told, the socket goes. */
static __attribute__((noreturn)) void holder_exit(int status)
{
	if (H.client >= 0)
		wfs_upgrade_answer(H.client, "refused\tthe holder of %s ended (STORE/weightfs.log says why)",
				   H.a->mountpoint);
	if (H.lfd >= 0)
		wfs_upgrade_unlisten(H.a->store);
	_exit(status);
}

/* A client on the upgrade socket: check what it asks, then have server @pid drain (upgrade.h). */
static void upgrade_asked(pid_t pid)
{
	char bin[PATH_MAX], why[160];
	uint32_t wait_ms;
	int cfd = wfs_upgrade_accept(H.lfd, bin, sizeof(bin), &wait_ms), bfd = -1;

	if (cfd < 0)
		return;
	if (H.state != IDLE) {
		wfs_upgrade_answer(cfd, "refused\tan upgrade of %s to %s is under way", H.a->mountpoint, H.next);
		return;
	}
	/* Opened now: what was checked is what every later successor executes (a package removed or
	 * replaced on the disk since does not change it). */
	if (wfs_upgrade_check_binary(bin, why, sizeof(why)) == 0 && (bfd = open(bin, O_PATH | O_CLOEXEC)) < 0)
		snprintf(why, sizeof(why), "%s", strerror(errno));
	if (bfd < 0) {
		wfs_log(WFS_LOG_WARN, "upgrade of %s refused: %s: %s; server pid %d (%s) serves on",
			H.a->mountpoint, bin, why, (int)pid, cur_binary());
		wfs_upgrade_answer(cfd, "refused\t%s: %s", bin, why);
		return;
	}
	H.asked_ns = wfs_clock_ns(); /* before the signal: the server may drain before sigqueue returns */
	wfs_takeover_note_upgrade();
	if (sigqueue(pid, SIGUSR2, (union sigval){.sival_int = (int)wait_ms}) < 0) {
		wfs_upgrade_answer(cfd, "refused\tcannot signal server pid %d: %s", (int)pid, strerror(errno));
		close(bfd);
		return;
	}
	wfs_log(WFS_LOG_INFO, "upgrade of %s asked: server pid %d (%s) drains (writers get up to %u ms), then "
		"%s takes over", H.a->mountpoint, (int)pid, cur_binary(), wait_ms, bin);
	H.state = DRAINING;
	H.client = cfd;
	snprintf(H.next, sizeof(H.next), "%s", bin);
	H.next_fd = bfd;
	H.old_pid = pid;
	H.wait_ms = wait_ms;
	H.deadline_ns = H.asked_ns + ((uint64_t)wait_ms + WFS_UPGRADE_QUIET_MS + 10000u) * 1000000u;
}

/* SIGUSR2: a successor answers. The new binary's: the upgrade is done. */
static void upgrade_served(pid_t pid)
{
	struct wfs_takeover_serving sv;
	double drain_ms, pause_ms;

	wfs_takeover_serving(&sv);
	if (H.state != STARTING || sv.pid != pid)
		return;
	drain_ms = (double)((H.gate_ns ? H.gate_ns : H.stopped_ns) - H.asked_ns) / 1e6;
	pause_ms = (double)(sv.since_ns - (H.gate_ns ? H.gate_ns : H.stopped_ns)) / 1e6;
	if (sv.writers_adopted == WFS_TAKEOVER_UNTOLD) { /* a new server of an older build */
		wfs_log(WFS_LOG_INFO, "upgrade: %s is served by pid %d (%s) instead of pid %d (%s): new opens "
			"for writing waited %.1f ms more, every request %.1f ms; %u files open for writing were "
			"closed first, %u were still open (the new server, of an older build, does not tell how "
			"many it adopted: its takeover line does)", H.a->mountpoint, (int)pid, H.next,
			(int)H.old_pid, cur_binary(), drain_ms + pause_ms, pause_ms, sv.writers_closed,
			sv.writers_lost);
		wfs_upgrade_answer(H.client, "ok\t%d\t%d\t%.1f\t%.1f\t%u\t%u\t%s\t%s", (int)H.old_pid, (int)pid,
				   drain_ms, pause_ms, sv.writers_closed, sv.writers_lost, cur_binary(), H.next);
	} else {
		wfs_log(WFS_LOG_INFO, "upgrade: %s is served by pid %d (%s) instead of pid %d (%s): new opens "
			"for writing waited %.1f ms more, every request %.1f ms; %u files open for writing were "
			"closed first, %u still open were adopted by the new server, %u lost their bytes (EIO)",
			H.a->mountpoint, (int)pid, H.next, (int)H.old_pid, cur_binary(), drain_ms + pause_ms,
			pause_ms, sv.writers_closed, sv.writers_adopted, sv.writers_lost);
		wfs_upgrade_answer(H.client, "ok\t%d\t%d\t%.1f\t%.1f\t%u\t%u\t%s\t%s\t%u", (int)H.old_pid,
				   (int)pid, drain_ms, pause_ms, sv.writers_closed, sv.writers_lost, cur_binary(),
				   H.next, sv.writers_adopted);
	}
	H.client = -1;
	snprintf(H.cur, sizeof(H.cur), "%s", H.next);
	if (H.cur_fd >= 0)
		close(H.cur_fd);
	H.cur_fd = H.next_fd;
	H.next_fd = -1;
	H.state = IDLE;
}

/* An upgrade that went nowhere: the client is told @why (nothing changed). */
static void upgrade_refused(const char *why)
{
	wfs_upgrade_answer(H.client, "refused\t%s", why);
	H.client = -1;
	if (H.next_fd >= 0)
		close(H.next_fd);
	H.next_fd = -1;
	H.state = IDLE;
}

/* poll(2)'s timeout: until the deadline of an upgrade under way, else none. */
static int poll_timeout_ms(void)
{
	uint64_t now = wfs_clock_ns();

	if (H.state == IDLE)
		return -1;
	return now >= H.deadline_ns ? 0 : (int)((H.deadline_ns - now) / 1000000u) + 1;
}

int wfs_holder_run(const struct wfs_holder_args *a)
{
	unsigned short_deaths = 0;
	bool stopping = false;
	sigset_t set;
	uint64_t started;
	ssize_t n;
	pid_t pid;
	int ret;

	H.a = a;
	n = readlink("/proc/self/exe", H.own, sizeof(H.own) - 1);
	H.own[n > 0 ? n : 0] = '\0';
	ret = wfs_takeover_create(getpid());
	if (ret) {
		wfs_log(WFS_LOG_WARN, "-o holder: no shared memory for a successor (%s): this process serves "
			"the mount itself, and a crash leaves it dead", strerror(-ret));
		return ret;
	}
	holder_signals(&set);
	sigaddset(&set, SIGUSR2);
	sigprocmask(SIG_BLOCK, &set, &H.old);
	started = wfs_clock_ns();
	pid = fork_server(NULL, -1, 0, NULL);
	if (pid == 0)
		return 0;
	if (pid < 0) {
		sigprocmask(SIG_SETMASK, &H.old, NULL);
		wfs_log(WFS_LOG_WARN, "-o holder: cannot fork the server (%s): this process serves the mount "
			"itself", strerror(-pid));
		return pid;
	}
	H.sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
	if (H.sfd < 0) {
		wfs_log(WFS_LOG_ERR, "holder: signalfd: %s: the holder cannot wait for its server; it stops it",
			strerror(errno));
		kill(pid, SIGTERM);
		waitpid(pid, NULL, 0);
		_exit(1);
	}
	H.lfd = wfs_upgrade_listen(a->store);
	if (H.lfd < 0)
		wfs_log(WFS_LOG_WARN, "holder: no upgrade socket %s/" WFS_UPGRADE_SOCKET " (%s): weightfsctl "
			"upgrade cannot reach this mount", a->store, strerror(-H.lfd));
	wfs_log(WFS_LOG_INFO, "holder pid %d keeps the connection of %s; server pid %d", (int)getpid(),
		a->mountpoint, (int)pid);
	for (;;) {
		struct pollfd p[2] = {{.fd = H.sfd, .events = POLLIN}, {.fd = H.lfd, .events = POLLIN}};
		struct signalfd_siginfo info;
		const char *next;
		char why[200];
		int status, sig, r, next_fd;
		bool can, drained;

		r = poll(p, H.lfd >= 0 ? 2 : 1, poll_timeout_ms());
		if (r < 0)
			continue; /* EINTR */
		if (r == 0 && H.state == DRAINING) {
			wfs_log(WFS_LOG_ERR, "upgrade of %s refused: server pid %d did not drain within %u ms; it "
				"serves on", a->mountpoint, (int)pid, H.wait_ms + WFS_UPGRADE_QUIET_MS + 10000u);
			snprintf(why, sizeof(why), "server pid %d did not drain in time (STORE/weightfs.log); it "
				 "serves on", (int)pid);
			upgrade_refused(why);
		} else if (r == 0 && H.state == STARTING) {
			wfs_log(WFS_LOG_ERR, "upgrade: pid %d of %s does not answer %d s after its start: killed",
				(int)pid, H.next, WFS_UPGRADE_START_S);
			kill(pid, SIGKILL);
			H.deadline_ns = wfs_clock_ns() + 60ull * 1000000000u; /* its SIGCHLD comes next */
		}
		if (H.lfd >= 0 && (p[1].revents & POLLIN) && !stopping)
			upgrade_asked(pid);
		if (!(p[0].revents & POLLIN))
			continue;
		if (read(H.sfd, &info, sizeof(info)) != (ssize_t)sizeof(info))
			continue;
		sig = (int)info.ssi_signo;
		if (sig == SIGUSR1) {
			wfs_log_reopen();
			kill(pid, SIGUSR1);
			continue;
		}
		if (sig == SIGUSR2) {
			upgrade_served(pid);
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
		if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && !stopping && connection_alive()) {
			wfs_log(WFS_LOG_WARN, "holder: server pid %d exited with status 0, and the kernel's "
				"connection of %s is still up: not an unmount, a death", (int)pid, a->mountpoint);
			snprintf(why, sizeof(why), "exited with status 0 on a live connection");
		} else if ((WIFEXITED(status) && WEXITSTATUS(status) == 0) || stopping) {
			wfs_log(WFS_LOG_INFO, "holder: server pid %d %s; the holder ends too", (int)pid, why);
			holder_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
		}
		can = wfs_takeover_server_died(wfs_clock_ns());
		drained = WIFEXITED(status) && WEXITSTATUS(status) == WFS_UPGRADE_EXIT;
		next = H.cur;
		next_fd = H.cur_fd;
		if (H.state == DRAINING) {
			struct wfs_takeover_serving sv;

			/* Drained (or died draining): the new binary takes over either way. */
			wfs_takeover_serving(&sv);
			H.stopped_ns = wfs_clock_ns();
			H.gate_ns = drained ? sv.gate_ns : 0;
			H.state = STARTING;
			H.deadline_ns = H.stopped_ns + (uint64_t)WFS_UPGRADE_START_S * 1000000000u;
			if (drained)
				snprintf(why, sizeof(why), "drained and left for the upgrade");
			next = H.next;
			next_fd = H.next_fd;
		} else if (H.state == STARTING) {
			wfs_log(WFS_LOG_ERR, "upgrade of %s refused: pid %d of %s %s before it answered (its lines "
				"above say why); %s serves the mount again", a->mountpoint, (int)pid, H.next, why,
				cur_binary());
			{
				char msg[2 * PATH_MAX + 160];

				snprintf(msg, sizeof(msg), "pid %d of %s could not take the mount over "
					 "(STORE/weightfs.log says why); %s serves it again", (int)pid, H.next,
					 cur_binary());
				upgrade_refused(msg);
			}
			snprintf(why, sizeof(why), "(the upgrade's new server) ended");
		} else if (WIFEXITED(status) && WEXITSTATUS(status) == WFS_TAKEOVER_REFUSED) {
			wfs_log(WFS_LOG_ERR, "holder: successor pid %d could not take %s over (its line above says "
				"why): giving up; the mount fails with ENOTCONN until fusermount3 -u %s", (int)pid,
				a->mountpoint, a->mountpoint);
			holder_exit(1);
		}
		short_deaths = drained ? 0
			       : wfs_clock_ns() - started < (uint64_t)WFS_HOLDER_SHORT_S * 1000000000u ? short_deaths + 1
												  : 1;
		if (!can) {
			wfs_log(WFS_LOG_ERR, "holder: server pid %d %s before it answered the kernel's INIT: no "
				"successor can take %s over; giving up (ENOTCONN until fusermount3 -u %s)", (int)pid,
				why, a->mountpoint, a->mountpoint);
			holder_exit(1);
		}
		if (short_deaths >= WFS_HOLDER_DEATHS_MAX) {
			wfs_log(WFS_LOG_ERR, "holder: server pid %d %s: %u servers in a row died within %d s of "
				"their start; giving up, the mount fails with ENOTCONN until fusermount3 -u %s",
				(int)pid, why, short_deaths, WFS_HOLDER_SHORT_S, a->mountpoint);
			holder_exit(1);
		}
		started = wfs_clock_ns();
		pid = fork_server(next, next_fd, pid, why);
		if (pid == 0)
			return 0;
		if (pid < 0) {
			wfs_log(WFS_LOG_ERR, "holder: cannot fork a successor (%s): giving up; the mount fails "
				"with ENOTCONN until fusermount3 -u %s", strerror(-pid), a->mountpoint);
			holder_exit(1);
		}
	}
}
