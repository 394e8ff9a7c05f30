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
#include "daemon.h"
#include "inode.h"
#include "object.h"
#include "direct.h"
#include "../lib/direct.h"
#include "log.h"

#define DIRECT_THREADS 4
#define DIRECT_BACKLOG 64
#define DIRECT_MAX_FDS 2      /* one is expected; room for a second shows a request with more */
#define DIRECT_IO_TIMEOUT_S 2 /* a client has this long to send its request and take the reply */

struct wfs_direct {
	struct wfs_fs *fs;
	char *mountpoint;
	char name[WFS_DIRECT_NAME_MAX + 1]; /* abstract socket name, without the leading NUL */
	int listen_fd;                      /* O_NONBLOCK: the threads poll it */
	int stop_pipe[2];                   /* written once at stop: readable forever after */
	pthread_t threads[DIRECT_THREADS];
	unsigned nthreads;
	pthread_mutex_t dev_lock;
	bool dev_known;                     /* (dev_lock) */
	dev_t dev;                          /* (dev_lock) st_dev of the mount */
};

static atomic_bool warned_refused, warned_dev;

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

/* One connection: read the request and its descriptor, answer, close. */
static void serve_one(struct wfs_direct *d, int c)
{
	struct timeval tv = {.tv_sec = DIRECT_IO_TIMEOUT_S};
	struct ucred cred = {0};
	socklen_t clen = sizeof(cred);
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

	(void)setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	(void)setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	(void)getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &clen);
	n = recvmsg(c, &msg, MSG_CMSG_CLOEXEC);
	if (n < 0)
		return;
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
		ret = direct_object(d, fd, cred.pid, &obj_fd, &rep.bytes);
	if (ret == -EACCES || ret == -EXDEV || ret == -ESTALE || ret == -EPROTO)
		wfs_log_once(&warned_refused, WFS_LOG_WARN, "direct path: refused a request of pid %d (uid %u): "
			     "%s (logged once)", (int)cred.pid, (unsigned)cred.uid, strerror(-ret));
	wfs_log(WFS_LOG_DEBUG, "direct path: pid %d uid %u: %s", (int)cred.pid, (unsigned)cred.uid,
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
		(void)sendmsg(c, &omsg, MSG_NOSIGNAL);
	}
	if (obj_fd >= 0)
		close(obj_fd);
}

static void *serve(void *arg)
{
	struct wfs_direct *d = arg;
	struct pollfd p[2] = {{.fd = d->listen_fd, .events = POLLIN}, {.fd = d->stop_pipe[0], .events = POLLIN}};

	for (;;) {
		int c;

		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (p[1].revents)
			break;
		c = accept4(d->listen_fd, NULL, NULL, SOCK_CLOEXEC);
		if (c < 0)
			continue; /* another thread took it (EAGAIN), or the client went (ECONNABORTED) */
		serve_one(d, c);
		close(c);
	}
	return NULL;
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
	for (d->nthreads = 0; d->nthreads < DIRECT_THREADS; d->nthreads++) {
		ret = -pthread_create(&d->threads[d->nthreads], NULL, serve, d);
		if (ret)
			break;
	}
	if (d->nthreads == 0)
		goto fail;
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
	/* The session loop has ended: no handler reads fs->direct any more. */
	(void)!write(d->stop_pipe[1], "x", 1);
	for (unsigned i = 0; i < d->nthreads; i++)
		pthread_join(d->threads[i], NULL);
	close(d->listen_fd);
	close(d->stop_pipe[0]);
	close(d->stop_pipe[1]);
	pthread_mutex_destroy(&d->dev_lock);
	free(d->mountpoint);
	fs->direct = NULL;
	free(d);
}
