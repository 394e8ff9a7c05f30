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
 * Set-user-ID and set-group-ID bits. A write or truncate by a user without CAP_FSETID, and a chown
 * of anything but a directory by anyone, clears S_ISUID, and S_ISGID of a group-executable file
 * (the kernel's setattr_should_drop_suidgid(); uid 0 stands for CAP_FSETID), and S_ISGID without
 * group execute when the caller is outside the file's group (setattr_should_drop_sgid(), as ext4;
 * FUSE's own clearing, which follows the protocol's older text, keeps it). Who clears them depends on
 * what the daemon told the kernel at INIT:
 *   - without FUSE_HANDLE_KILLPRIV_V2 the kernel does, with a SETATTR of the mode, for all but a
 *     daemon-served direct I/O write (wfs_fileio_write() clears them at a handle's first write) and
 *     an O_TRUNC open (the kernel drops that SETATTR with the truncate the OPEN did: the bits stay
 *     until a write);
 *   - with it (fs->killpriv_v2) the kernel marks the mount SB_NOSEC, so a write through passthrough
 *     stops asking for security.capability (a GETXATTR per write(2) before), and the daemon clears
 *     them: at a SETATTR carrying FATTR_KILL_SUIDGID (truncate by such a user; chown, whoever asks),
 *     at a SETATTR with nothing to set (what the kernel's file_remove_privs() of a write, fallocate
 *     or copy_file_range through passthrough, or a chown to -1:-1, leaves of its mode change), at an
 *     O_TRUNC open by such a user (the kernel sends its FUSE_OPEN_KILL_SUIDGID, which libfuse 3.17
 *     does not pass on), and at a daemon-served handle's first write as before (libfuse does not
 *     pass FUSE_WRITE_KILL_SUIDGID on either).
 */
/* Who asks for a write, truncate or chown: the FUSE request's fsuid, fsgid and thread (0: none). */
struct wfs_caller {
	uid_t uid;
	gid_t gid;
	pid_t tid;
};
/*
 * @mode of a file of group @gid with S_ISUID cleared, and S_ISGID when S_IXGRP is set or @c is
 * neither root nor in group @gid (wfs_writer_in_group(): a /proc read, only then); a directory's
 * is returned as is (a chown keeps its bits; only regular files are written or truncated).
 */
uint32_t wfs_fileio_mode_killpriv(uint32_t mode, gid_t gid, const struct wfs_caller *c);
/*
 * Clear the set-user-ID and set-group-ID bits of file @ino (wfs_fileio_mode_killpriv()) in the
 * catalog, for caller @c. fs->lock held. Returns true when the mode changed (the kernel's cached
 * attributes are stale), false when it did not or the catalog failed.
 */
bool wfs_fileio_killpriv(struct wfs_fs *fs, uint64_t ino, const struct wfs_caller *c);
/*
 * write(2) of @len bytes at @off through writable handle @h, by caller @c (tid 0: the kernel's
 * writeback). The first write of a handle by a user other than root clears the file's set-user-ID
 * and set-group-ID bits (wfs_fileio_mode_killpriv()), as local filesystems do: *@mode_changed says
 * the kernel's cached attributes are stale. Takes fs->lock itself: call it without. Returns @len,
 * or -EBADF (not writable), -ENOSPC, -EIO, -ENOMEM, another -errno.
 */
ssize_t wfs_fileio_write(struct wfs_fs *fs, struct wfs_handle *h, const struct wfs_caller *c, const void *buf,
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
 * Returns bytes copied, or -EBADF, -errno of the read or write. @c: the caller, as for a write.
 */
ssize_t wfs_fileio_copy_range(struct wfs_fs *fs, struct wfs_handle *hin, off_t off_in, struct wfs_handle *hout,
			    off_t off_out, size_t len, const struct wfs_caller *c);
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
