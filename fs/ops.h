/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ops — the FUSE low-level handlers: the only daemon code that speaks libfuse besides weightfs.c
 * (the mount and the loop) and receive.c (how request threads read /dev/fuse).
 *
 * Each handler parses its request, calls the core (fs/core/, daemon.h) and sends exactly one reply.
 * What the core collected for the kernel (struct wfs_news) is sent after fs->lock is dropped.
 * ops.c holds the namespace, file and directory handlers; xattr.c the user.weightfs.* namespace.
 */
#ifndef WFS_OPS_H
#define WFS_OPS_H

#define FUSE_USE_VERSION 317
#include <fuse_lowlevel.h>

#include <jansson.h>
#include <stdatomic.h>
#include <stdint.h>

#include "daemon.h"

extern const struct fuse_lowlevel_ops wfs_ops;

/*
 * The kernel interface of the core (kernel.h) for session @se: passthrough backing files registered
 * and released on the session's /dev/fuse descriptor. Backing ids belong to the connection, not to a
 * request, so a release needs no request (an object's last pin may drop in the direct path).
 */
struct wfs_kernel wfs_ops_kernel(struct fuse_session *se);
/* Tell the kernel what @news holds now, from this thread (fs->lock not held), and empty it. */
void wfs_ops_news_send(struct wfs_fs *fs, struct wfs_news *news);
/*
 * Hand @news to the notifier thread, which tells the kernel soon (in order), and empty it: for many
 * names told after a reply (a batch claim's), each of which takes the directory's lock that the
 * caller's next request may hold while it waits for a request thread. One name told after a reply
 * (a moved name) holds a thread for a moment only and goes through wfs_ops_news_send(), so other
 * processes see it sooner. Told here when the notifier is not running or memory is short.
 */
void wfs_ops_news_post(struct wfs_fs *fs, struct wfs_news *news);
/* Start the notifier for @fs (its session set). Returns 0 or -errno: news are then told in place. */
int wfs_ops_notifier_start(struct wfs_fs *fs);
/* Tell what is queued and stop the notifier; before the session is destroyed. Idempotent. */
void wfs_ops_notifier_stop(void);
/*
 * The daemon state behind request @req, for a handler to call first, without fs->lock: it also does
 * what waits for the next request (the readahead after INIT; after a takeover, the release of the
 * handles no resent request took, which may seal files).
 */
struct wfs_fs *wfs_ops_fs(fuse_req_t req);
/*
 * The owner of a new entry in directory @parent made for @req's caller: the caller's uid and gid, or
 * a set-group-ID directory's group (and for a directory, S_ISGID added to *@mode). fs->lock held.
 */
void wfs_ops_new_owner(struct wfs_fs *fs, fuse_req_t req, fuse_ino_t parent, uint32_t *mode, uint32_t *uid,
		       uint32_t *gid);

/*
 * FUSE requests by opcode, counted since the mount (user.weightfs.stats "requests", weightfsctl
 * stat): what an operation costs in round trips, measured in a run instead of read off -d. Names are
 * the kernel's (include/uapi/linux/fuse.h, FUSE_LOOKUP ...). Each handler starts with
 * WFS_OPS_COUNT(opcode): it counts the request and, at the handler's return, adds the time the
 * handler ran (CLOCK_MONOTONIC, nanoseconds; "request_ms" in the stats). That is the daemon's own
 * share of a round trip: the reply is sent inside the handler, so its time is in, while the kernel's
 * queueing and the two context switches are not (tests/bench/roundtrip.py measures those).
 */
#define WFS_OPS_REQUESTS(X) X(LOOKUP) X(FORGET) X(BATCH_FORGET) X(GETATTR) X(SETATTR) X(READLINK) \
	X(MKNOD) X(MKDIR) X(UNLINK) X(RMDIR) X(SYMLINK) X(RENAME) X(LINK) X(OPEN) X(READ) X(WRITE) \
	X(FALLOCATE) X(COPY_FILE_RANGE) X(FLUSH) X(RELEASE) X(FSYNC) X(OPENDIR) X(READDIR) X(READDIRPLUS) \
	X(RELEASEDIR) X(FSYNCDIR) X(STATFS) X(SETXATTR) X(GETXATTR) X(LISTXATTR) X(REMOVEXATTR) X(CREATE) \
	X(GETLK) X(SETLK) X(SETLKW)
enum wfs_ops_request {
#define WFS_OPS_ENUM(n) WFS_REQ_##n,
	WFS_OPS_REQUESTS(WFS_OPS_ENUM)
#undef WFS_OPS_ENUM
	WFS_REQ_COUNT
};
struct wfs_ops_tally {
	_Atomic uint64_t count; /* requests handled */
	_Atomic uint64_t ns;    /* their handlers' time, CLOCK_MONOTONIC nanoseconds */
};
/*
 * The tallies by opcode, WFS_REQ_COUNT of them: this process's own, or (set before the session loop,
 * weightfs.c) the holder's region's (takeover.h, wfs_takeover_request_tallies()), where they count
 * on across takeovers. Opcodes are only ever appended: another build reads them by position.
 */
extern struct wfs_ops_tally *wfs_ops_requests;
/* A handler's timer: started by WFS_OPS_COUNT, stopped when it goes out of scope. */
struct wfs_ops_timer {
	enum wfs_ops_request op;
	uint64_t start_ns;
};
struct wfs_ops_timer wfs_ops_timer_start(enum wfs_ops_request op);
void wfs_ops_timer_stop(struct wfs_ops_timer *t);
#define WFS_OPS_COUNT(n)                                                                           \
	struct wfs_ops_timer wfs_ops_timer_ __attribute__((cleanup(wfs_ops_timer_stop), unused)) =   \
		wfs_ops_timer_start(WFS_REQ_##n)
/*
 * The tallies as two JSON objects, opcodes seen only: *@counts {"LOOKUP": n, ...} and *@ms
 * {"LOOKUP": milliseconds in its handlers, ...}. New references; NULL on ENOMEM (both, then).
 */
void wfs_ops_requests_json(json_t **counts, json_t **ms);

/* xattr.c */
void wfs_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size);
void wfs_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value, size_t size, int flags);
void wfs_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size);
void wfs_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name);

#endif
