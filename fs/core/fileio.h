/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fileio — what a writable handle does to its file: write(2), fallocate(2), copy_file_range(2),
 * truncate(2)/ftruncate(2). Each finds or starts the inode's version (seal.h, wfs_seal_writer()),
 * counts the handle as one of its writers (wfs_seal_join()) and changes the version's bytes
 * (version.h) without fs->lock; the close that ends the writing is closing.h's. A truncate with no
 * writer open seals at once.
 */
#ifndef WFS_CORE_FILEIO_H
#define WFS_CORE_FILEIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct wfs_fs;
struct wfs_handle;
struct wfs_news;

/*
 * write(2) of @len bytes at @off through writable handle @h, by thread @tid of user @uid. The first
 * write of a handle by a user other than root clears the file's set-user-ID bit (and set-group-ID
 * of a group-executable file), as local filesystems do: *@mode_changed says the kernel's cached
 * attributes are stale. Takes fs->lock itself: call it without. Returns @len, or -EBADF (not
 * writable), -ENOSPC, -EIO, -ENOMEM, another -errno.
 */
ssize_t wfs_fileio_write(struct wfs_fs *fs, struct wfs_handle *h, uid_t uid, pid_t tid, const void *buf,
		       size_t len, off_t off, bool *mode_changed);
/*
 * fallocate(2) through writable handle @h: space reserved in the version (wfs_version_fallocate()),
 * a size change held to dtype/shape now, as ftruncate(2) is; or a hole punched (PUNCH_HOLE |
 * KEEP_SIZE: zeros, the size unchanged). Takes fs->lock itself. Returns 0, -EBADF, -EOPNOTSUPP
 * (modes other than 0, FALLOC_FL_KEEP_SIZE and a punch), -EINVAL, -ENOSPC, -errno.
 */
int wfs_fileio_fallocate(struct wfs_fs *fs, struct wfs_handle *h, pid_t tid, int mode, off_t off, off_t len);
/*
 * copy_file_range(2) of @len bytes (at most 1 GiB, the reply's 32 bits) from @hin at @off_in to
 * writable @hout at @off_out. A whole sealed file onto an empty one (what cp does) claims the
 * source's object: no byte moves. A range the destination holds already (same object, same offset)
 * is done at once. Anything else is read and written through the version. Takes fs->lock itself.
 * Returns bytes copied, or -EBADF, -errno of the read or write.
 */
ssize_t wfs_fileio_copy_range(struct wfs_fs *fs, struct wfs_handle *hin, off_t off_in, struct wfs_handle *hout,
			    off_t off_out, size_t len, uid_t uid, pid_t tid);
/*
 * truncate(2)/ftruncate(2) of inode @ino to @size bytes: a new version of that size, sealed now
 * unless a writable handle is open on it (then at its close). @h: the handle (ftruncate), or NULL:
 * by path, a seal on its way is waited for first (wfs_openmode_wait_release()), and the truncate
 * counts as a writer (in->io.nwritable) until it returns. May drop fs->lock.
 * Through a handle, a size that does not fit dtype/shape is refused now. Returns 0, or -ESTALE (the
 * name moved to a new inode: the kernel looks it up again), -ETXTBSY, -EISDIR, -EINVAL, the seal's
 * -errno. @tid: the calling thread (its retry after -ESTALE goes ahead in place). @news: a
 * never-sealed name removed (wfs_seal_writer_gone()), and a moved name.
 */
int wfs_fileio_truncate(struct wfs_fs *fs, uint64_t ino, struct wfs_handle *h, uint64_t size, pid_t tid,
		      struct wfs_news *news);

#endif
