/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kernel — what the daemon core asks of the kernel, without knowing it is FUSE.
 *
 * The core (fs/core/) owns the state machines; only the handler files (fs/ops.c, fs/xattr.c) and
 * fs/weightfs.c speak libfuse. Two things cross that line:
 *   - passthrough backing files: registering an object file's descriptor with the kernel, and
 *     releasing the registration once no open uses it (struct wfs_kernel, set once at mount);
 *   - news: dentries and cached attributes the kernel must drop after a core call changed the
 *     namespace under it (struct wfs_news). The core collects it under fs->lock; the handler sends
 *     it once the lock is dropped, because a notification may wait for a directory lock that a
 *     request waiting for fs->lock holds.
 * Unit tests (tests/check_core.c) put counting fakes behind struct wfs_kernel.
 */
#ifndef WFS_CORE_KERNEL_H
#define WFS_CORE_KERNEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct wfs_kernel {
	/*
	 * Register descriptor @fd (an object file, O_RDONLY) as a passthrough backing file. The kernel
	 * takes its own reference: @fd stays the caller's. Returns the backing id (> 0) or -errno
	 * (-EPERM without CAP_SYS_ADMIN, -EOPNOTSUPP before Linux 6.9). NULL: passthrough unavailable.
	 */
	int (*backing_open)(void *ctx, int fd);
	/* Release backing id @id (no open uses it any more). Errors are logged, not returned. */
	void (*backing_close)(void *ctx, int id);
	void *ctx;
};

/* What the kernel must hear once fs->lock is dropped (wfs_news_send() in fs/ops.c sends it). */
struct wfs_news {
	uint64_t ino;      /* the inode concerned, 0 for none */
	bool inval;        /* its attributes and page cache are stale */
	bool inval_attr;   /* its attributes only are stale (a seal gave it its mtime and ctime) */
	bool moved;        /* the names below now name another inode (else they are gone) */
	size_t n;          /* names removed or moved */
	struct wfs_news_name {
		uint64_t parent;
		char *name;    /* malloc'ed */
	} *names;
};

/*
 * Add name @name (a dentry of directory @parent) to the news at @ctx (a struct wfs_news). The
 * signature is the catalog's name callback (wfs_catalog_unlink_unsealed, wfs_catalog_inode_replace).
 * On ENOMEM the name is left out: the kernel forgets it at its entry timeout instead.
 */
void wfs_news_name(void *ctx, uint64_t parent, const char *name);
/* Free what @news holds and empty it. */
void wfs_news_release(struct wfs_news *news);

#endif
