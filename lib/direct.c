/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The direct path's client (direct.h): ask a mount's daemon for the object behind a descriptor.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "direct.h"
#include "weightfs.h"

/* Seconds a request may wait for the daemon's answer: long enough for it to hash a large object first. */
#define DIRECT_TIMEOUT_S 300
/* Seconds connect(2) may wait while the daemon's backlog is full (every connection it holds is a
 * request in service): then the caller reads the mounted file (-ETIMEDOUT). */
#define DIRECT_CONNECT_TIMEOUT_S 5

/* The abstract socket name in @fd's direct attribute, into @name (NUL-terminated); *@pid its owner. */
static int socket_name(int fd, char name[WFS_DIRECT_NAME_MAX + 1], pid_t *pid)
{
	char value[WFS_DIRECT_NAME_MAX + 2], *end;
	size_t prefix = strlen(WFS_DIRECT_NAME_PREFIX);
	ssize_t n;
	long p;

	n = fgetxattr(fd, WFS_XATTR_DIRECT, value, sizeof(value) - 1);
	if (n < 0) {
		int err = errno;

		if (err != ENODATA && err != ENOTSUP && err != ERANGE)
			return -err;
		/* No direct attribute: a weightfs file has a digest (an older daemon), others do not. */
		if (fgetxattr(fd, WFS_XATTR_DIGEST, NULL, 0) >= 0)
			return -ENOPROTOOPT;
		return -ENOTSUP;
	}
	value[n] = '\0';
	if (n < 2 || value[0] != '@' || strncmp(value + 1, WFS_DIRECT_NAME_PREFIX, prefix) != 0)
		return -EPROTO;
	errno = 0;
	p = strtol(value + 1 + prefix, &end, 10);
	if (errno || p <= 0 || *end != '-')
		return -EPROTO;
	memcpy(name, value + 1, (size_t)n); /* with its NUL */
	*pid = (pid_t)p;
	return 0;
}

static int connect_daemon(const char *name, pid_t pid)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct timeval tv = {.tv_sec = DIRECT_CONNECT_TIMEOUT_S};
	size_t len = strlen(name);
	struct ucred cred;
	socklen_t clen = sizeof(cred);
	int s, ret;

	memcpy(sa.sun_path + 1, name, len); /* sun_path[0] = 0: the abstract namespace */
	s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -errno;
	/* A UNIX socket's connect(2) waits for room in the listener's backlog as long as SO_SNDTIMEO. */
	(void)setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (connect(s, (struct sockaddr *)&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len)) < 0) {
		ret = errno == EAGAIN ? -ETIMEDOUT : -errno;
		goto fail;
	}
	if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
		ret = -errno;
		goto fail;
	}
	if (cred.pid != pid) {
		ret = -ESRCH; /* someone else's socket under the daemon's name */
		goto fail;
	}
	tv.tv_sec = DIRECT_TIMEOUT_S;
	(void)setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	(void)setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	return s;
fail:
	close(s);
	return ret;
}

static int send_request(int s, int fd)
{
	struct wfs_direct_request req = {.magic = WFS_DIRECT_MAGIC, .op = WFS_DIRECT_OP_OPEN};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {.iov_base = &req, .iov_len = sizeof(req)};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			     .msg_controllen = sizeof(u.buf)};
	struct cmsghdr *c;

	memset(&u, 0, sizeof(u));
	c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	if (sendmsg(s, &msg, MSG_NOSIGNAL) != (ssize_t)sizeof(req))
		return errno ? -errno : -EPROTO;
	return 0;
}

/* Read the reply: the object descriptor, or -errno. Descriptors beyond the one expected are closed. */
static int recv_reply(int s)
{
	struct wfs_direct_reply rep;
	union {
		char buf[CMSG_SPACE(2 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {.iov_base = &rep, .iov_len = sizeof(rep)};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			     .msg_controllen = sizeof(u.buf)};
	int fds[2], nfds = 0, ret;
	ssize_t n;

	n = recvmsg(s, &msg, MSG_CMSG_CLOEXEC);
	if (n < 0)
		return errno == EAGAIN ? -ETIMEDOUT : -errno;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int) && nfds < 2; i++)
			memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
	}
	if (n != (ssize_t)sizeof(rep) || rep.magic != WFS_DIRECT_MAGIC || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)))
		ret = -EPROTO;
	else if (rep.error)
		ret = rep.error > 0 ? -rep.error : -EPROTO;
	else if (nfds != 1)
		ret = -EPROTO;
	else
		ret = fds[0];
	for (int i = 0; i < nfds; i++)
		if (fds[i] != ret)
			close(fds[i]);
	return ret;
}

int wfs_direct_open_fd(int fd)
{
	char name[WFS_DIRECT_NAME_MAX + 1];
	const char *env = getenv(WFS_DIRECT_ENV);
	pid_t pid = 0;
	int s, ret;

	if (env && strcmp(env, "0") == 0)
		return -ENOTSUP;
	ret = socket_name(fd, name, &pid);
	if (ret)
		return ret;
	s = connect_daemon(name, pid);
	if (s < 0)
		return s;
	ret = send_request(s, fd);
	if (ret == 0)
		ret = recv_reply(s);
	close(s);
	return ret;
}

int wfs_direct_open(const char *path)
{
	/* O_NONBLOCK: a FIFO under the mount would wait for a writer; only regular files have objects. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	struct stat st;
	int ret;

	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		ret = S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
		close(fd);
		return ret;
	}
	ret = wfs_direct_open_fd(fd);
	close(fd);
	return ret;
}
