/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mapped — files written through passthrough whose writable mapping outlived their last close.
 *
 * Under passthrough the kernel maps a file's backing file itself (fs/fuse/passthrough.c, backing
 * file mmap): a shared writable mapping holds the version's tmp file, not the FUSE file, so the
 * RELEASE comes at close(2) while the mapping still writes (a C program's mmap, close, fill,
 * munmap; Python's mmap keeps a descriptor of its own and holds the release back). A seal then
 * cannot take the bytes yet: wfs_version_freeze() says -EBUSY and the version stays the inode's,
 * OPEN, unsealed (reads serve its file, as they would the file being written). This module notes
 * such inodes and seals each once nothing can write its file any more — the read-lease test of
 * version.h, tried every WFS_MAPPED_POLL_MS by one thread — or publishes a copy of the bytes as they
 * are at unmount (what the mapping writes after that is lost, and logged).
 *
 * All functions run with fs->lock held, except _start() and _stop().
 */
#ifndef WFS_CORE_MAPPED_H
#define WFS_CORE_MAPPED_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct wfs_fs;
struct wfs_inode;

#define WFS_MAPPED_POLL_MS 50 /* how soon after a munmap its file is sealed, at most (plus the seal) */

/* The thread's state, in struct wfs_fs (all (L)): inode numbers whose version waits for its mapping. */
struct wfs_mapped {
	pthread_t thread;
	pthread_cond_t due; /* an inode was noted, or the thread is to stop */
	bool started, stop;
	uint64_t *inos;
	size_t n, cap;
};

/*
 * Note @in, whose writer version (in->writer, no writers left) is still written through a mapping:
 * sealed when the mapping goes. Returns 0, or -ENOMEM (then nothing seals it until the next close of
 * a writer or the unmount, and the caller logs it).
 */
int wfs_mapped_add(struct wfs_fs *fs, struct wfs_inode *in);
/*
 * A caller about to answer with what close(2) and munmap(2) left of @in (the digest attribute, a
 * dtype or shape set on it: wfs_openmode_wait_release()), whose version no writable handle holds:
 * when that version is noted here and its mapping has gone, seal it now instead of at the next
 * poll (up to WFS_MAPPED_POLL_MS later: a digest asked for right after munmap(2) was the old
 * content's); when a seal of it is running (this module's), wait up to a minute for its end. Still
 * mapped: nothing (the name holds the version's bytes, which the mapping may still change). Drops
 * fs->lock while it seals or waits; @in is pinned meanwhile.
 */
void wfs_mapped_settle(struct wfs_fs *fs, struct wfs_inode *in);
/* Start the thread. Returns 0 or -errno of pthread_create (noted inodes then seal at unmount). */
int wfs_mapped_start(struct wfs_fs *fs);
/*
 * Stop the thread and seal every inode still noted, publishing a copy of each file as it is now (the
 * unmount: nobody can tell the daemon of a munmap afterwards). Takes fs->lock itself.
 */
void wfs_mapped_stop(struct wfs_fs *fs);

#endif
