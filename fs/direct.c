/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The direct path, daemon side (fs/direct.h; protocol and permission argument in lib/direct.h).
 *
 * Why the passed descriptor is the proof: the kernel let the client open the name for reading
 * (mode bits, owners, allow_other, default_permissions), and an open descriptor cannot be made any
 * other way. An O_PATH descriptor needs no read permission, so it is refused; so is one open only
 * for writing, one of another filesystem (st_dev), and one whose inode this daemon does not have
 * open (a descriptor always has an open handle here while it is in flight: the client's open
 * counted one, and the descriptor we hold keeps that handle from being released).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "check.h"
#include "clock.h"
#include "daemon.h"
#include "inode.h"
#include "object.h"
#include "direct.h"
#include "../lib/direct.h"
#include "log.h"

#define DIRECT_WORKERS 4    /* threads answering requests (a first check of an object hashes it) */
#define DIRECT_MAX_CONNS 256 /* connections held at once: waiting for a request, queued, or answered */
#define DIRECT_BACKLOG DIRECT_MAX_CONNS
#define DIRECT_MAX_FDS 2     /* one is expected; room for a second shows a request with more */
#define DIRECT_IDLE_NS (2 * 1000000000ull) /* a connection has this long to send its request */
#define DIRECT_FULL_POLL_MS 50 /* every connection is a request in service: look again this soon */

/* An accepted connection, with its peer's credentials (SO_PEERCRED: those of connect(2)). */
struct direct_conn {
	int fd;
	uid_t uid;
	pid_t pid;
	uint64_t deadline_ns; /* wfs_clock_ns() past which a connection without a request is closed */
};

/*
 * One poller thread accepts every connection at once and holds it until its request has arrived
 * (a SOCK_SEQPACKET request is one message: readable means whole); only then does a worker take
 * it. A connection that sends nothing is closed after DIRECT_IDLE_NS, and when DIRECT_MAX_CONNS are
 * held, a new one closes the oldest waiting connection of the user who holds the most: idle
 * connections, however many, delay no other user's request (before, each of 4 threads waited up to
 * 2 s on one connection, and a user opening 50 a second stalled everyone's for as long as they did).
 */
struct wfs_direct {
	struct wfs_fs *fs;
	char *mountpoint;
	char name[WFS_DIRECT_NAME_MAX + 1]; /* abstract socket name, without the leading NUL */
	int listen_fd;                      /* O_NONBLOCK: the poller polls it */
	int stop_pipe[2];                   /* written once at stop: readable forever after */
	pthread_t poller;
	pthread_t workers[DIRECT_WORKERS];
	unsigned nworkers;
	/* The poller's alone: connections waiting for their request, oldest first. */
	struct direct_conn waiting[DIRECT_MAX_CONNS];
	unsigned nwaiting;
	/* Requests that arrived, for the workers: */
	pthread_mutex_t queue_lock;
	pthread_cond_t queue_cond;           /* (queue_lock) a request was queued, or stopping */
	struct direct_conn queue[DIRECT_MAX_CONNS]; /* (queue_lock) a ring: qhead, qlen */
	unsigned qhead, qlen;                /* (queue_lock) */
	unsigned busy;                       /* (queue_lock) queued or being answered, not closed yet */
	bool stopping;                       /* (queue_lock) */
	pthread_mutex_t dev_lock;
	bool dev_known;                     /* (dev_lock) */
	dev_t dev;                          /* (dev_lock) st_dev of the mount */
};

static atomic_bool warned_refused, warned_dev, warned_evict, warned_accept,
	warned_poll;

bool wfs_direct_served(struct wfs_fs *fs)
{
	return fs->direct != NULL;
}

int wfs_direct_xattr(struct wfs_fs *fs, char *buf, size_t size, size_t *len)
{
	struct wfs_direct *d = fs->direct;

	if (!d)
		return -ENODATA;
	*len = 1 + strlen(d->name);
	if (size == 0)
		return 0;
	if (size < *len)
		return -ERANGE;
	buf[0] = '@';
	memcpy(buf + 1, d->name, *len - 1);
	return 0;
}

/* st_dev of the mount, read once: by then the session loop serves our own stat. */
static int mount_dev(struct wfs_direct *d, dev_t *dev)
{
	struct stat st;
	int ret = 0;

	pthread_mutex_lock(&d->dev_lock);
	if (!d->dev_known) {
		if (stat(d->mountpoint, &st) == 0) {
			d->dev = st.st_dev;
			d->dev_known = true;
		} else {
			ret = -errno;
			wfs_log_once(&warned_dev, WFS_LOG_WARN, "direct path: stat %s: %s", d->mountpoint,
				     strerror(errno));
		}
	}
	*dev = d->dev;
	pthread_mutex_unlock(&d->dev_lock);
	return ret;
}

/*
 * The object behind @fd, a descriptor process @pid passed (its check reads on @pid's NUMA node): into
 * *@obj_fd (O_RDONLY, ours to send) and *@bytes. Returns 0 or -errno: -EACCES (not open for reading, or O_PATH), -EISDIR/-EINVAL (not a
 * regular file), -EXDEV (not a file of this mount), -ESTALE (no open inode of ours), -EBUSY (being
 * written), -EIO (damaged or missing object), -ENOMEM, -EMFILE.
 */
static int direct_object(struct wfs_direct *d, int fd, pid_t pid, int *obj_fd, uint64_t *bytes)
{
	struct wfs_fs *fs = d->fs;
	struct wfs_object *o = NULL;
	struct wfs_inode *in;
	struct wfs_digest digest;
	struct stat st, ost;
	int flags, ret, ofd;
	dev_t dev;

	flags = fcntl(fd, F_GETFL);
	if (flags < 0)
		return -EBADF;
	if ((flags & O_PATH) || (flags & O_ACCMODE) == O_WRONLY)
		return -EACCES;
	if (fstat(fd, &st) < 0)
		return -errno;
	if (S_ISDIR(st.st_mode))
		return -EISDIR;
	if (!S_ISREG(st.st_mode))
		return -EINVAL;
	ret = mount_dev(d, &dev);
	if (ret)
		return ret;
	if (st.st_dev != dev)
		return -EXDEV;

	wfs_lock(&fs->lock);
	in = wfs_inode_find(fs, (uint64_t)st.st_ino);
	if (!in || in->io.nopen == 0)
		ret = -ESTALE;
	else if (in->writer || !in->sealed)
		ret = -EBUSY;
	else if (!(o = wfs_object_pin(fs, &in->digest)))
		ret = -ENOMEM;
	else
		ret = wfs_check_object(fs, o, pid); /* may drop fs->lock; @in stays: @fd keeps it open */
	if (ret == 0 && (in->writer || !in->sealed || !wfs_digest_equal(&in->digest, wfs_object_digest(o))))
		ret = -EBUSY; /* rewritten while the object was checked */
	if (o)
		digest = *wfs_object_digest(o);
	wfs_unlock(&fs->lock);

	/* Pinned: the object file stays while we open it, without fs->lock. */
	if (ret == 0) {
		ofd = wfs_store_object_open(fs->store, &digest, 0);
		if (ofd < 0)
			ret = ofd == -ENOENT ? -EIO : ofd;
		else if (fstat(ofd, &ost) < 0) {
			ret = -errno;
			close(ofd);
		} else {
			*obj_fd = ofd;
			*bytes = (uint64_t)ost.st_size;
		}
	}

	wfs_lock(&fs->lock);
	/* Usually not the last pin (@fd's handle pins the object it read at open); if the name was
	 * rewritten in between, this last unpin releases a backing id like any other (kernel.h). */
	if (o)
		wfs_object_unpin(fs, o);
	if (ret == 0)
		fs->counters->opens_direct++;
	wfs_unlock(&fs->lock);
	return ret;
}

/*
 * Answer the request waiting on @c (its whole message is there: the poller saw it readable), then
 * return; the caller closes @c. Nothing here blocks on the client: the reply, 16 bytes and a
 * descriptor on a socket that holds nothing else, is sent without waiting, and a client that went
 * meanwhile is not answered.
 */
static void serve_one(struct wfs_direct *d, const struct direct_conn *c)
{
	char req_buf[sizeof(struct wfs_direct_request) + 1]; /* one more: a longer message is refused */
	union {
		char buf[CMSG_SPACE(DIRECT_MAX_FDS * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {.iov_base = req_buf, .iov_len = sizeof(req_buf)};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			     .msg_controllen = sizeof(u.buf)};
	struct wfs_direct_request req;
	struct wfs_direct_reply rep = {.magic = WFS_DIRECT_MAGIC};
	int fds[DIRECT_MAX_FDS], nfds = 0, fd = -1, obj_fd = -1, ret;
	ssize_t n;

	n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	if (n <= 0)
		return; /* the client hung up before it sent a request (0), or went (-1) */
	/* Every descriptor that came is ours to close; the kernel dropped those that did not fit. */
	for (struct cmsghdr *h = CMSG_FIRSTHDR(&msg); h; h = CMSG_NXTHDR(&msg, h))
		if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS)
			for (size_t i = 0; i < (h->cmsg_len - CMSG_LEN(0)) / sizeof(int) && nfds < DIRECT_MAX_FDS; i++)
				memcpy(&fds[nfds++], CMSG_DATA(h) + i * sizeof(int), sizeof(int));
	if (nfds == 1)
		fd = fds[0];
	/* cppcheck-suppress uninitvar ; recvmsg() filled it through msg's iovec */
	memcpy(&req, req_buf, sizeof(req));
	if (n != (ssize_t)sizeof(req) || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || nfds > 1 ||
	    req.magic != WFS_DIRECT_MAGIC)
		ret = -EPROTO;
	else if (req.op != WFS_DIRECT_OP_OPEN)
		ret = -EOPNOTSUPP;
	else if (fd < 0)
		ret = -EBADF;
	else
		ret = direct_object(d, fd, c->pid, &obj_fd, &rep.bytes);
	if (ret == -EACCES || ret == -EXDEV || ret == -ESTALE || ret == -EPROTO)
		wfs_log_once(&warned_refused, WFS_LOG_WARN, "direct path: refused a request of pid %d (uid %u): "
			     "%s (logged once)", (int)c->pid, (unsigned)c->uid, strerror(-ret));
	wfs_log(WFS_LOG_DEBUG, "direct path: pid %d uid %u: %s", (int)c->pid, (unsigned)c->uid,
		ret ? strerror(-ret) : "object sent");
	rep.error = -ret;
	/* The client's descriptors go before the answer: one of them is a file on the mount, and a
	 * client that unmounts once answered found the mount busy (EBUSY) while we still held it. The
	 * object is open by then (obj_fd), so the pin that fds[0]'s open handle gave it is not needed. */
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	{
		union {
			char buf[CMSG_SPACE(sizeof(int))];
			struct cmsghdr align;
		} out;
		struct iovec oiov = {.iov_base = &rep, .iov_len = sizeof(rep)};
		struct msghdr omsg = {.msg_iov = &oiov, .msg_iovlen = 1};

		if (obj_fd >= 0) {
			struct cmsghdr *h;

			memset(&out, 0, sizeof(out));
			omsg.msg_control = out.buf;
			omsg.msg_controllen = sizeof(out.buf);
			h = CMSG_FIRSTHDR(&omsg);
			h->cmsg_level = SOL_SOCKET;
			h->cmsg_type = SCM_RIGHTS;
			h->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(h), &obj_fd, sizeof(int));
		}
		(void)sendmsg(c->fd, &omsg, MSG_NOSIGNAL | MSG_DONTWAIT);
	}
	if (obj_fd >= 0)
		close(obj_fd);
}

static void *worker(void *arg)
{
	struct wfs_direct *d = arg;

	pthread_mutex_lock(&d->queue_lock);
	for (;;) {
		struct direct_conn c;

		while (d->qlen == 0 && !d->stopping)
			pthread_cond_wait(&d->queue_cond, &d->queue_lock);
		if (d->stopping)
			break;
		c = d->queue[d->qhead];
		d->qhead = (d->qhead + 1) % DIRECT_MAX_CONNS;
		d->qlen--;
		pthread_mutex_unlock(&d->queue_lock);

		serve_one(d, &c);
		close(c.fd);

		pthread_mutex_lock(&d->queue_lock);
		d->busy--;
	}
	pthread_mutex_unlock(&d->queue_lock);
	return NULL;
}

/* Close waiting connection @i (the poller's), keeping the others in order. */
static void drop_waiting(struct wfs_direct *d, unsigned i)
{
	close(d->waiting[i].fd);
	memmove(&d->waiting[i], &d->waiting[i + 1], (d->nwaiting - i - 1) * sizeof(d->waiting[0]));
	d->nwaiting--;
}

/*
 * Room for one more connection: close the oldest waiting connection of the user who holds the most
 * waiting ones (the first of them to come, on a tie). Linear in the users times the connections:
 * 256 connections of as many users is 65,536 comparisons, once per connection over the limit.
 */
static void evict_one(struct wfs_direct *d)
{
	unsigned best = 0, best_count = 0;

	for (unsigned i = 0; i < d->nwaiting; i++) {
		unsigned count = 0;
		bool seen = false;

		for (unsigned j = 0; j < i && !seen; j++)
			seen = d->waiting[j].uid == d->waiting[i].uid;
		if (seen)
			continue; /* counted at this user's oldest connection */
		for (unsigned j = i; j < d->nwaiting; j++)
			count += d->waiting[j].uid == d->waiting[i].uid;
		if (count > best_count) {
			best = i;
			best_count = count;
		}
	}
	wfs_log_once(&warned_evict, WFS_LOG_WARN, "direct path: %u connections held; closed the oldest "
		     "of uid %u, which holds %u without a request (logged once)", (unsigned)DIRECT_MAX_CONNS,
		     (unsigned)d->waiting[best].uid, best_count);
	drop_waiting(d, best);
}

/*
 * Accept what the listening socket has, as waiting connections, up to DIRECT_MAX_CONNS of them: then
 * the poller looks at the requests that came meanwhile before it accepts more. Returns false when
 * accept(2) failed for want of descriptors or memory (the poller pauses the listening socket a
 * moment then).
 */
static bool accept_some(struct wfs_direct *d)
{
	for (unsigned n = 0; n < DIRECT_MAX_CONNS; n++) {
		struct ucred cred = {0};
		socklen_t clen = sizeof(cred);
		unsigned busy;
		int c;

		pthread_mutex_lock(&d->queue_lock);
		busy = d->busy;
		pthread_mutex_unlock(&d->queue_lock);
		if (d->nwaiting + busy >= DIRECT_MAX_CONNS) {
			if (d->nwaiting == 0)
				return true; /* all in service: the backlog holds the rest meanwhile */
			evict_one(d);
		}
		c = accept4(d->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (c < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return true;
			if (errno == ECONNABORTED || errno == EINTR)
				continue;
			wfs_log_once(&warned_accept, WFS_LOG_WARN, "direct path: accept: %s (logged once)",
				     strerror(errno));
			return false;
		}
		(void)getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &clen);
		d->waiting[d->nwaiting++] = (struct direct_conn){
			.fd = c, .uid = cred.uid, .pid = cred.pid, .deadline_ns = wfs_clock_ns() + DIRECT_IDLE_NS};
	}
	return true;
}

static void *poller(void *arg)
{
	struct wfs_direct *d = arg;
	struct pollfd p[2 + DIRECT_MAX_CONNS];
	uint64_t listen_paused_until = 0;

	for (;;) {
		uint64_t now = wfs_clock_ns();
		unsigned busy, np = 0, first;
		bool listening;
		int timeout = -1;

		pthread_mutex_lock(&d->queue_lock);
		busy = d->busy;
		pthread_mutex_unlock(&d->queue_lock);

		p[np++] = (struct pollfd){.fd = d->stop_pipe[0], .events = POLLIN};
		listening = now >= listen_paused_until && (d->nwaiting > 0 || busy < DIRECT_MAX_CONNS);
		if (listening)
			p[np++] = (struct pollfd){.fd = d->listen_fd, .events = POLLIN};
		else
			timeout = DIRECT_FULL_POLL_MS;
		first = np;
		for (unsigned i = 0; i < d->nwaiting; i++)
			p[np++] = (struct pollfd){.fd = d->waiting[i].fd, .events = POLLIN};
		if (d->nwaiting) {
			uint64_t deadline = d->waiting[0].deadline_ns;
			uint64_t left_ms = deadline > now ? (deadline - now + 999999) / 1000000 : 0;

			if (timeout < 0 || left_ms < (uint64_t)timeout)
				timeout = (int)left_ms;
		}

		if (poll(p, np, timeout) < 0) {
			if (errno != EINTR) {
				wfs_log_once(&warned_poll, WFS_LOG_WARN, "direct path: poll: %s (logged once)",
					     strerror(errno));
				(void)poll(NULL, 0, DIRECT_FULL_POLL_MS);
			}
			continue;
		}
		if (p[0].revents)
			break;

		/* A request arrived (or the client hung up: the worker sees that): hand it on. */
		pthread_mutex_lock(&d->queue_lock);
		{
			unsigned kept = 0;

			for (unsigned i = 0; i < d->nwaiting; i++) {
				if (!p[first + i].revents) {
					d->waiting[kept++] = d->waiting[i];
					continue;
				}
				d->queue[(d->qhead + d->qlen) % DIRECT_MAX_CONNS] = d->waiting[i];
				d->qlen++;
				d->busy++;
				pthread_cond_signal(&d->queue_cond);
			}
			d->nwaiting = kept;
		}
		pthread_mutex_unlock(&d->queue_lock);

		/* Connections past their deadline without a request go (the oldest come first): only now,
		 * after the poll, so that a request that came is answered however long a loop took. */
		now = wfs_clock_ns();
		while (d->nwaiting && d->waiting[0].deadline_ns <= now)
			drop_waiting(d, 0);
		if (listening && p[1].revents && !accept_some(d))
			listen_paused_until = now + (uint64_t)DIRECT_FULL_POLL_MS * 1000000;
	}

	while (d->nwaiting)
		drop_waiting(d, d->nwaiting - 1);
	return NULL;
}

/* Tell the workers to stop and wait for them (each finishes the request it is answering). */
static void stop_workers(struct wfs_direct *d)
{
	pthread_mutex_lock(&d->queue_lock);
	d->stopping = true;
	pthread_cond_broadcast(&d->queue_cond);
	pthread_mutex_unlock(&d->queue_lock);
	for (unsigned i = 0; i < d->nworkers; i++)
		pthread_join(d->workers[i], NULL);
}

int wfs_direct_start(struct wfs_fs *fs, const char *mountpoint)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct wfs_direct *d;
	uint64_t rnd;
	size_t len;
	int ret;

	d = calloc(1, sizeof(*d));
	if (!d || !(d->mountpoint = strdup(mountpoint))) {
		free(d);
		return -ENOMEM;
	}
	d->fs = fs;
	d->listen_fd = d->stop_pipe[0] = d->stop_pipe[1] = -1;
	pthread_mutex_init(&d->dev_lock, NULL);
	pthread_mutex_init(&d->queue_lock, NULL);
	pthread_cond_init(&d->queue_cond, NULL);
	if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd)) {
		ret = -errno;
		goto fail;
	}
	snprintf(d->name, sizeof(d->name), WFS_DIRECT_NAME_PREFIX "%d-%016llx", (int)getpid(),
		 (unsigned long long)rnd);
	len = strlen(d->name);
	memcpy(sa.sun_path + 1, d->name, len);
	d->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (d->listen_fd < 0 || pipe2(d->stop_pipe, O_CLOEXEC) < 0) {
		ret = -errno;
		goto fail;
	}
	if (bind(d->listen_fd, (struct sockaddr *)&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len)) < 0 ||
	    listen(d->listen_fd, DIRECT_BACKLOG) < 0) {
		ret = -errno;
		goto fail;
	}
	for (d->nworkers = 0; d->nworkers < DIRECT_WORKERS; d->nworkers++) {
		ret = -pthread_create(&d->workers[d->nworkers], NULL, worker, d);
		if (ret)
			break;
	}
	if (d->nworkers == 0)
		goto fail;
	ret = -pthread_create(&d->poller, NULL, poller, d);
	if (ret) {
		stop_workers(d);
		goto fail;
	}
	fs->direct = d;
	return 0;
fail:
	wfs_log(WFS_LOG_WARN, "direct path unavailable (%s): clients read the mounted files", strerror(-ret));
	if (d->listen_fd >= 0)
		close(d->listen_fd);
	if (d->stop_pipe[0] >= 0) {
		close(d->stop_pipe[0]);
		close(d->stop_pipe[1]);
	}
	pthread_cond_destroy(&d->queue_cond);
	pthread_mutex_destroy(&d->queue_lock);
	pthread_mutex_destroy(&d->dev_lock);
	free(d->mountpoint);
	free(d);
	return ret;
}

void wfs_direct_stop(struct wfs_fs *fs)
{
	struct wfs_direct *d = fs->direct;

	if (!d)
		return;
	/* The session loop has ended: no handler reads fs->direct any more. The poller closes the
	 * connections waiting for a request and tells the workers to stop; requests queued and not
	 * answered yet are closed here (their clients see the connection end: they read the file). */
	(void)!write(d->stop_pipe[1], "x", 1);
	pthread_join(d->poller, NULL);
	stop_workers(d);
	for (; d->qlen; d->qlen--, d->qhead = (d->qhead + 1) % DIRECT_MAX_CONNS)
		close(d->queue[d->qhead].fd);
	close(d->listen_fd);
	close(d->stop_pipe[0]);
	close(d->stop_pipe[1]);
	pthread_cond_destroy(&d->queue_cond);
	pthread_mutex_destroy(&d->queue_lock);
	pthread_mutex_destroy(&d->dev_lock);
	free(d->mountpoint);
	fs->direct = NULL;
	free(d);
}
