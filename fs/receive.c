/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The request threads' receive path: a spinning leader and followers (receive.h says why).
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "receive.h"
#include "takeover.h"

#ifndef FUSE_UNIQUE_RESEND
#define FUSE_UNIQUE_RESEND (1ull << 63)
#endif

/*
 * One per daemon (one session). Under mu: who leads, whether the leader is answering a light
 * request itself (inline), and a count of those requests, by which a follower tells a leader that
 * is stuck on one from a leader that keeps answering them.
 */
static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;       /* followers wait here for the leadership */
	bool led;                /* a thread leads (it reads the device, or answers a light request) */
	bool inline_busy;        /* the leader is answering a light request */
	uint64_t inline_count;   /* light requests the leaders have taken so far */
	uint64_t term;           /* which leadership is the current one: a taken-over leader's is not */
	unsigned watchers;       /* followers in a timed wait, watching an inline leader */
	unsigned sleepers;       /* followers waiting without a timeout */
	bool ended;              /* the device said ENODEV: the file system is unmounted */
	enum wfs_receive_gate gate; /* what is left unanswered (an upgrade's drain) */
	bool resend_watch;       /* a successor whose resend is not over yet (takeover.h) */
	bool resend_read;        /* ... a request queued after the resent ones was read */
	unsigned resent_busy;    /* ... resent requests taken and not yet done */
	unsigned busy;           /* requests taken and not yet done (threads with working set) */
	uint64_t left;           /* requests left unanswered by the gate */
	uint64_t spin_ns;
	struct wfs_receive_stats stats;
} rx = {
	.mu = PTHREAD_MUTEX_INITIALIZER,
	.cv = PTHREAD_COND_INITIALIZER,
};

/* The term this thread leads, 0 when it is a follower. */
static __thread uint64_t my_term;
/* The request this thread read last is one the kernel resent (a takeover; takeover.h), and its
 * unique. */
static __thread bool resent;
static __thread uint64_t unique;
/* This thread took a resent request and counts in rx.resent_busy until it comes back. */
static __thread bool working_resent;
/* This thread took a request and counts in rx.busy until it comes back for the next one. */
static __thread bool working;

/*
 * Requests the leader answers itself. Everything else is heavy: the leader passes the leadership
 * on before it works on it. Heavy on purpose: READ/WRITE (data), FSYNC, SETATTR (a truncate copies
 * a version), FALLOCATE, COPY_FILE_RANGE, SETXATTR (a digest claim), and any opcode this list does
 * not know.
 * Light, handing the leadership over themselves (wfs_receive_hand_over()) when they find heavy work:
 *   - RELEASE: the kernel sends it after close(2) has returned, and answered in the order it came, a
 *     file's seal at release (an empty file's) is in the catalog before the caller's next change
 *     (docs/integrity.md, crash order); one that seals data hands over;
 *   - FLUSH: a passthrough writer's only decides (closing.h); a daemon-served writer's seals and
 *     hands over;
 *   - OPEN: a read-only open of a sealed file only registers its backing file; a writable one (it
 *     may copy a version) hands over, and so does a first open that verifies its object and one
 *     that waits for a seal (the lock's long hook, lock.h).
 * A small tensor written, renamed and mapped is ten requests in a row (docs/benchmarks.md, "small");
 * with FLUSH and OPEN heavy, two of them woke another thread each (tests/bench/small_calls.py on
 * the 2-core VM: close 55-87 us -> 30-37, open 100-118 -> 70-91; on the 16-CPU H100 machine, where
 * the woken thread has a CPU of its own, no gain: the tensor's median 3% slower, within its spread).
 */
static bool light(uint32_t opcode)
{
	switch (opcode) {
	case FUSE_LOOKUP:
	case FUSE_FORGET:
	case FUSE_BATCH_FORGET:
	case FUSE_GETATTR:
	case FUSE_READLINK:
	case FUSE_MKNOD:
	case FUSE_MKDIR:
	case FUSE_UNLINK:
	case FUSE_RMDIR:
	case FUSE_SYMLINK:
	case FUSE_RENAME:
	case FUSE_RENAME2:
	case FUSE_LINK:
	case FUSE_CREATE:
	case FUSE_OPENDIR:
	case FUSE_READDIR:
	case FUSE_READDIRPLUS:
	case FUSE_RELEASE:
	case FUSE_FLUSH:
	case FUSE_OPEN:
	case FUSE_RELEASEDIR:
	case FUSE_STATFS:
	case FUSE_GETXATTR:
	case FUSE_LISTXATTR:
	case FUSE_ACCESS:
	case FUSE_INTERRUPT:
		return true;
	default:
		return false;
	}
}

/*
 * Under rx.mu, in a successor: is the resend over? The kernel puts the requests it resends ahead of
 * every other one in its queue (fs/fuse/dev.c, fuse_resend()), so once a request without
 * FUSE_UNIQUE_RESEND is read from that queue (not an INTERRUPT or a FORGET, which have queues of
 * their own), every resent one has been read; and once none of those is still in a handler, each
 * was answered or took what it needed (takeover.h, wfs_takeover_claim()).
 */
static void resend_note(const struct fuse_in_header *in)
{
	if (in && (in->unique & FUSE_UNIQUE_RESEND)) {
		rx.resent_busy++;
		working_resent = true;
	} else if (in && in->opcode != FUSE_INTERRUPT && in->opcode != FUSE_FORGET &&
		   in->opcode != FUSE_BATCH_FORGET) {
		rx.resend_read = true;
	}
	if (rx.resend_read && rx.resent_busy == 0) {
		rx.resend_watch = false;
		wfs_takeover_resend_over();
	}
}

/* Under rx.mu: does the gate leave request @buf (@n bytes) to the successor (receive.h)? */
static bool gate_leaves(const void *buf, ssize_t n)
{
	const struct fuse_in_header *in = buf;

	if (rx.gate == WFS_RECEIVE_ALL || n < (ssize_t)sizeof(*in))
		return false;
	if (rx.gate == WFS_RECEIVE_NONE)
		return in->opcode != FUSE_FORGET && in->opcode != FUSE_BATCH_FORGET;
	if (in->opcode == FUSE_CREATE)
		return true;
	if (in->opcode == FUSE_OPEN && n >= (ssize_t)(sizeof(*in) + sizeof(struct fuse_open_in))) {
		uint32_t flags = ((const struct fuse_open_in *)(const void *)(in + 1))->flags;

		return (flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC);
	}
	return false;
}

static void unlock_mu(void *arg)
{
	(void)arg;
	pthread_mutex_unlock(&rx.mu);
}

/*
 * Under rx.mu: wait until this thread may lead, and lead. Returns false when the file system is
 * unmounted.
 *
 * A follower is a watcher while the leader answers light requests: it wakes every
 * WFS_RECEIVE_TAKEOVER_MS, and takes over when the leader is still on the request it was on at the
 * last wake-up. When a whole period passes with no light request, it waits without a timeout (an
 * idle daemon wakes no thread); the leader's next light request then wakes one follower to watch
 * (inline(): a wake-up per burst, not per request).
 */
static bool become_leader(void)
{
	bool watching;
	uint64_t seen;

	if (rx.led && my_term == rx.term) {
		rx.inline_busy = false; /* back from a light request: still the leader */
		return !rx.ended;
	}
	my_term = 0;
	watching = rx.inline_busy;
	seen = rx.inline_count;
	while (rx.led && !rx.ended) {
		struct timespec until;
		int rc;

		if (!watching) {
			rx.sleepers++;
			pthread_cond_wait(&rx.cv, &rx.mu);
			rx.sleepers--;
			watching = rx.inline_busy;
			seen = rx.inline_count;
			continue;
		}
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += WFS_RECEIVE_TAKEOVER_MS * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		rx.watchers++;
		rc = pthread_cond_timedwait(&rx.cv, &rx.mu, &until);
		rx.watchers--;
		if (rc != ETIMEDOUT)
			continue;
		if (rx.led && rx.inline_busy && rx.inline_count == seen) {
			rx.stats.takeovers++; /* the leader is stuck on one request: lead in its place */
			break;
		}
		watching = rx.inline_busy || rx.inline_count != seen; /* quiet for a period: sleep */
		seen = rx.inline_count;
	}
	if (rx.ended)
		return false;
	rx.led = true;
	rx.inline_busy = false;
	my_term = ++rx.term;
	return true;
}

/* Under rx.mu: the leader answers the light request it read; one follower watches it. */
static void inline_request(void)
{
	rx.inline_busy = true;
	rx.inline_count++;
	if (rx.watchers == 0 && rx.sleepers > 0)
		pthread_cond_signal(&rx.cv); /* every waiter sleeps: this one becomes a watcher */
}

/* Under rx.mu: stop leading (if this thread still does) and wake one follower to lead. */
static void hand_over(void)
{
	if (rx.led && my_term == rx.term) {
		rx.led = false;
		rx.inline_busy = false;
		rx.stats.handovers++;
		pthread_cond_signal(&rx.cv);
	}
	my_term = 0;
}

/*
 * Waits for a request on @fd: polls without sleeping for rx.spin_ns, then sleeps in poll(2).
 * Returns poll's result; *@slept tells whether it had to sleep.
 */
static int wait_readable(int fd, bool *slept)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	uint64_t until = wfs_clock_ns() + rx.spin_ns;
	int n;

	*slept = false;
	while (rx.spin_ns) {
		n = poll(&p, 1, 0);
		if (n != 0)
			return n;
		if (wfs_clock_ns() >= until)
			break;
	}
	*slept = true;
	return poll(&p, 1, -1);
}

/* fuse_custom_io.read: one request into @buf, as read(2) of /dev/fuse would give it. */
static ssize_t receive_read(int fd, void *buf, size_t len, void *userdata)
{
	bool leading, slept;
	ssize_t n;
	int err;

	(void)userdata;
	pthread_mutex_lock(&rx.mu);
	if (working) { /* done with the last request */
		rx.busy--;
		working = false;
	}
	if (working_resent) {
		rx.resent_busy--;
		working_resent = false;
		if (rx.resend_watch)
			resend_note(NULL);
	}
	pthread_cleanup_push(unlock_mu, NULL); /* pthread_cond_wait is where a stopping loop cancels */
	leading = become_leader();
	pthread_cleanup_pop(1);
	if (!leading) {
		errno = ENODEV;
		return -1; /* libfuse ends the loop on ENODEV, as on an unmount it read itself */
	}

again:
	n = wait_readable(fd, &slept);
	n = n < 0 ? -1 : read(fd, buf, len);
	err = errno;
	unique = n >= (ssize_t)sizeof(struct fuse_in_header) ? ((struct fuse_in_header *)buf)->unique : 0;
	resent = unique & FUSE_UNIQUE_RESEND;
	unique &= ~FUSE_UNIQUE_RESEND;
	if (n > 0 && atomic_load_explicit(&wfs_takeover_watching, memory_order_relaxed))
		wfs_takeover_note_read(buf, (size_t)n); /* the INIT, for a successor */

	pthread_mutex_lock(&rx.mu);
	if (n > 0 && gate_leaves(buf, n)) { /* left to the successor: still the leader, read on */
		rx.left++;
		pthread_mutex_unlock(&rx.mu);
		goto again;
	}
	if (n > 0) {
		rx.busy++;
		working = true;
	}
	if (n >= (ssize_t)sizeof(struct fuse_in_header) && rx.resend_watch)
		resend_note(buf);
	if (n > 0 && slept)
		rx.stats.taken_sleeping++;
	else if (n > 0)
		rx.stats.taken_spinning++;
	if (n >= (ssize_t)sizeof(struct fuse_in_header) && light(((struct fuse_in_header *)buf)->opcode) &&
	    my_term == rx.term) {
		inline_request(); /* keep leading: answer it, come back */
	} else {
		if (n < 0 && err == ENODEV) {
			rx.ended = true;
			pthread_cond_broadcast(&rx.cv);
		}
		hand_over();
	}
	pthread_mutex_unlock(&rx.mu);
	errno = err;
	return n;
}

static ssize_t receive_writev(int fd, struct iovec *iov, int count, void *userdata)
{
	ssize_t len;

	(void)userdata;
	if (atomic_load_explicit(&wfs_takeover_watching, memory_order_relaxed) &&
	    wfs_takeover_note_write(iov, count, &len))
		return len; /* the reply to a replayed INIT: the kernel has the first one */
	return writev(fd, iov, count);
}

static ssize_t receive_splice_send(int fdin, off_t *offin, int fdout, off_t *offout, size_t len,
				   unsigned int flags, void *userdata)
{
	(void)userdata;
	return splice(fdin, offin, fdout, offout, len, flags);
}

/* -o clone_fd: a descriptor of the same connection for one thread (what libfuse does itself). */
static int receive_clone_fd(int master_fd)
{
	uint32_t master = (uint32_t)master_fd;
	int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);

	if (fd < 0)
		return -1;
	if (ioctl(fd, FUSE_DEV_IOC_CLONE, &master) == -1) {
		int err = errno;

		close(fd);
		errno = err;
		return -1;
	}
	return fd;
}

static const struct fuse_custom_io receive_io = {
	.writev = receive_writev,
	.read = receive_read,
	.splice_send = receive_splice_send,
	.clone_fd = receive_clone_fd,
};

void wfs_receive_hand_over(void)
{
	if (!my_term)
		return; /* a follower, or a thread that reads no requests */
	pthread_mutex_lock(&rx.mu);
	if (my_term && my_term == rx.term && rx.inline_busy)
		hand_over();
	pthread_mutex_unlock(&rx.mu);
}

void wfs_receive_gate(enum wfs_receive_gate gate)
{
	pthread_mutex_lock(&rx.mu);
	rx.gate = gate;
	pthread_mutex_unlock(&rx.mu);
}

unsigned wfs_receive_busy(uint64_t *left)
{
	unsigned busy;

	pthread_mutex_lock(&rx.mu);
	busy = rx.busy;
	if (left)
		*left = rx.left;
	pthread_mutex_unlock(&rx.mu);
	return busy;
}

bool wfs_receive_resent(void)
{
	return resent;
}

uint64_t wfs_receive_unique(void)
{
	return unique;
}

void wfs_receive_stats(struct wfs_receive_stats *out)
{
	pthread_mutex_lock(&rx.mu);
	*out = rx.stats;
	pthread_mutex_unlock(&rx.mu);
}

int wfs_receive_install(struct fuse_session *se, unsigned spin_us)
{
	int ret;

	rx.spin_ns = (uint64_t)spin_us * 1000u;
	rx.stats.spin_us = spin_us;
	rx.stats.installed = true;
	rx.resend_watch = wfs_takeover_successor();
	ret = fuse_session_custom_io(se, &receive_io, sizeof(receive_io), fuse_session_fd(se));
	if (ret) {
		rx.stats.installed = false;
		wfs_log(WFS_LOG_WARN, "request threads: libfuse's own receive path (custom io: %s)",
			strerror(-ret));
	}
	return ret;
}
