/* SPDX-License-Identifier: Apache-2.0 */
/*
 * direct — the object file behind a name under a weightfs mount, as a plain read-only descriptor.
 *
 * Without kernel FUSE passthrough, reads of a mounted file go through the daemon and are cached in
 * the FUSE inode: one page-cache copy per name, at FUSE speed. The direct path asks the daemon for
 * the object file itself: every name and every process with that content then shares the object's
 * page cache, at the speed of the store's filesystem, on any kernel where FUSE runs.
 *
 * Permission stays the mount's. The client opens the mounted file O_RDONLY itself (the kernel checks
 * modes, owners, allow_other) and passes that descriptor to the daemon over a UNIX socket
 * (SCM_RIGHTS). The daemon answers only for a descriptor that is open for reading (not O_PATH) on
 * a regular file of its own mount (st_dev of the mount, st_ino the inode number), whose inode is
 * sealed and not being written; it checks the object as an open does (once per daemon run: a damaged
 * object gives EIO and is quarantined) and returns a new O_RDONLY descriptor of the object file.
 *
 * Discovery: getxattr(user.weightfs.direct) on the mounted file gives "@<abstract socket name>",
 * "@weightfs-direct-<daemon pid>-<random hex>", bound by the daemon before it answers the attribute
 * (so the name is its own while it lives). The client connects and checks the peer's pid
 * (SO_PEERCRED) against the name's, so a process that binds the name after the daemon died is not
 * handed a descriptor. Abstract names live in a network namespace: a container with its own sees
 * ECONNREFUSED and falls back to reading the mounted file.
 *
 * Protocol (SOCK_SEQPACKET, one request per connection):
 *   client → daemon: struct wfs_direct_request, SCM_RIGHTS with exactly one descriptor
 *   daemon → client: struct wfs_direct_reply; on error == 0, SCM_RIGHTS with the object descriptor
 * The daemon reads at most sizeof(request) + 1 bytes and one descriptor; anything else is refused.
 *
 * The object descriptor is the caller's; it stays valid after unmount (the object file is only
 * unlinked, never written, when its last name goes).
 */
#ifndef WFS_DIRECT_H
#define WFS_DIRECT_H

#include <stdint.h>

#define WFS_DIRECT_MAGIC 0x31444657u  /* "WFD1" in little-endian byte order */
#define WFS_DIRECT_OP_OPEN 1u         /* the object behind the passed descriptor */
#define WFS_DIRECT_NAME_PREFIX "weightfs-direct-"
#define WFS_DIRECT_NAME_MAX 100       /* bytes of an abstract name, without the leading NUL */
#define WFS_DIRECT_ENV "WEIGHTFS_DIRECT" /* "0": never use the direct path (benchmarks, debugging) */

struct wfs_direct_request {
	uint32_t magic; /* WFS_DIRECT_MAGIC */
	uint32_t op;    /* WFS_DIRECT_OP_OPEN */
};

struct wfs_direct_reply {
	uint32_t magic; /* WFS_DIRECT_MAGIC */
	int32_t error;  /* 0, or a positive errno */
	uint64_t bytes; /* size of the object file in bytes, when error is 0 */
};

/*
 * The object file behind @fd, a descriptor of a file under a weightfs mount opened for reading.
 * Returns a new O_RDONLY | O_CLOEXEC descriptor the caller owns, or:
 *   -ENOTSUP      not a weightfs file (no direct attribute and no digest), or WEIGHTFS_DIRECT=0:
 *                 read @fd itself, nothing to warn about
 *   -ENOPROTOOPT  a weightfs file whose daemon has no direct path (an older daemon)
 *   -EBUSY        the file is being written (no sealed object yet, or a new version in progress)
 *   -EIO          its object is damaged (quarantined) or missing
 *   -ETIMEDOUT    the daemon's backlog stayed full for 5 s, or no answer came in 300 s
 *   -ECONNREFUSED, -ESRCH (the socket is not the daemon's), -EPROTO (a malformed reply),
 *   -EACCES/-EXDEV/-ESTALE (refused by the daemon), -EMFILE, -ENOMEM, or another -errno.
 * @fd is left open. Thread-safe; blocks while the daemon verifies an object not checked yet.
 */
int wfs_direct_open_fd(int fd);

/*
 * The same for the file at @path, opened O_RDONLY here first (its -errno when that fails; a FIFO is
 * not waited on): -EISDIR for a directory, -EINVAL for anything else that is not a regular file.
 */
int wfs_direct_open(const char *path);

#endif
