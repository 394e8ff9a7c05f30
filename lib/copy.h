/* SPDX-License-Identifier: Apache-2.0 */
/*
 * copy — move a byte range from one file to another, in order (prefix wfs_copy_).
 *
 * In order matters: weightfs hashes a file as it is written, so a tensor file's bytes go front to
 * back. copy_file_range(2) is tried first (a reflink or an in-kernel copy where the filesystems
 * allow); the first refusal that is about the pair of files (EXDEV, EOPNOTSUPP, EINVAL: across
 * filesystems, FUSE) switches the copier to pread/pwrite through one WFS_COPY_RW_CHUNK buffer for
 * the rest of its life. Errors that are about the data (ENOSPC, EDQUOT, EIO) are returned, never
 * retried another way.
 *
 * A struct wfs_copy is one caller's: not thread-safe; zero-initialise it (or set the fields
 * below), and wfs_copy_release() it when done.
 */
#ifndef WFS_COPY_H
#define WFS_COPY_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#define WFS_COPY_CHUNK (8u << 20)    /* bytes per copy_file_range call: progress moves at this grain */
#define WFS_COPY_RW_CHUNK (1u << 20) /* bytes per read/write when copy_file_range cannot be used */

struct wfs_copy {
	/* Set by the caller (all optional): */
	const volatile sig_atomic_t *stop;               /* non-zero (e.g. set by a signal handler):
							    stop at the next chunk with -EINTR */
	void (*progress)(void *ctx, uint64_t bytes);     /* called after each chunk with its bytes */
	void *ctx;
	/* The copier's own: */
	bool no_cfr; /* copy_file_range refused once: read/write from now on */
	char *buf;   /* WFS_COPY_RW_CHUNK bytes, allocated on first use, freed by wfs_copy_release() */
};

/*
 * Copy @bytes bytes from @in at byte @in_off to @out at byte @out_off (pread/pwrite semantics:
 * neither file offset moves). Returns 0, -EINTR (*stop was set), -ENODATA (@in ended before
 * @bytes bytes), -ENOMEM (no buffer), or -errno of copy_file_range/pread/pwrite (-ENOSPC, -EIO,
 * ...). On error some prefix of the range may have been written. Descriptors stay the caller's.
 */
int wfs_copy_range(struct wfs_copy *c, int in, uint64_t in_off, int out, uint64_t out_off, uint64_t bytes);

/* Free @c's buffer (the struct itself is the caller's). */
void wfs_copy_release(struct wfs_copy *c);

#endif
