/* SPDX-License-Identifier: Apache-2.0 */
/*
 * seal — a name's version: the bytes being written, the handles counted as its writers, and its seal
 * into an object; the dtype/shape size rule. What a handle does to its file is fileio.h's, what a
 * close means is closing.h's, a digest claim is claim.h's. Nothing here calls openmode.h.
 *
 *   open(O_TRUNC) / create / first write or truncate through a handle
 *       → wfs_seal_writer(): the inode's version (version.h), started when it has none: empty, or a
 *         copy of the sealed object (checked first) for a rewrite in place;
 *       → wfs_seal_join(): the handle counts as a writer of that version until its flush;
 *   write(2) → wfs_fileio_write() (fileio.h) → wfs_version_write(), hashed as it arrives in order;
 *   close(2) (FLUSH) or RELEASE → closing.h decides what the close means (keep writing, refuse
 *       the size, leave, seal, abandon) and calls wfs_seal() or wfs_seal_abandon() here;
 *   wfs_seal(): freeze (digest) → dtype/shape size check → publish the object (dedup: nothing
 *       written when stored already) → catalog commit (inode → digest) → the WAL's fdatasync
 *       (-o sync, when close(2) waits), with fs->lock dropped while hashing, publishing, syncing.
 *   A seal that fails, or a killed writer, drops the version: a name that was sealed keeps its
 *   content, a name never sealed is removed (the kernel hears it through @news before the reply).
 *
 * Errors come back where the caller can hear them: close(2), truncate(2), write(2), setxattr(2).
 * All functions run with fs->lock held unless said otherwise; those that hash, copy, publish or wait
 * drop it meanwhile (said below) and revalidate the inode after.
 */
#ifndef WFS_CORE_SEAL_H
#define WFS_CORE_SEAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

#include "digest.h"

struct wfs_fs;
struct wfs_handle;
struct wfs_attr;
struct wfs_catalog_xattr;
struct wfs_inode;
struct wfs_news;
struct wfs_version;

/* Longest user.weightfs.dtype / user.weightfs.shape values (bytes, no NUL) that can be valid: a dtype
 * name of lib/dtype.c; 32 dimensions of 20 digits with commas and brackets. */
#define WFS_SEAL_DTYPE_MAX 63
#define WFS_SEAL_SHAPE_MAX 1023
/* Free bytes (f_bavail) under which a store counts as full at the seal of bytes the kernel wrote
 * (seal.c, wfs_seal_store_full()). */
#define WFS_SEAL_FULL_BYTES (1 << 20)

/*
 * The version being written of @in, started when there is none: empty when @truncate or when the
 * name has no content yet, otherwise a copy of its sealed object (wfs_version_copy_base(), after
 * checking that object: check.h). Waits while a seal of @in is in progress (fs->seal_done). May drop
 * fs->lock: the caller counts as a writer of @in (in->io.nwritable; a mknod's new inode has no other
 * user), so that no open moves its names to a new inode meanwhile (openmode.h). Returns a referenced version (wfs_version_put() it), or NULL
 * with *@err set (-ENOSPC, -EIO, -ENOMEM, ...).
 */
struct wfs_version *wfs_seal_writer(struct wfs_fs *fs, struct wfs_inode *in, bool truncate, int *err);
/* Count handle @h as a writer of @v (a referenced version of its inode) until its next flush. */
void wfs_seal_join(struct wfs_handle *h, struct wfs_version *v);
/*
 * Seal in->writer: digest, publish the object, point the inode at it (fs->lock dropped while hashing,
 * publishing and syncing). On failure the version is discarded and the name keeps its previous
 * content. @reported: the error reaches the writer (close(2), truncate(2)); only then is a size that
 * does not fit the dtype/shape attributes refused (-EINVAL), and the commit synced (-o sync).
 * Written through the kernel (passthrough), whose write errors the daemon never sees: -ENOSPC too when
 * the store has under WFS_SEAL_FULL_BYTES free at the seal (a write may have failed, cutting the file
 * short); -EBUSY never leaves here (a mapping that outlived the close waits in mapped.h: 0).
 * Returns 0 or -errno (-ENOSPC, -EIO, -EINVAL, -ENOMEM, an -errno of the catalog).
 */
int wfs_seal(struct wfs_fs *fs, struct wfs_inode *in, bool reported);
/*
 * Is the store's filesystem full: under WFS_SEAL_FULL_BYTES free, root's reserve included (the daemon
 * writes as root)? Bytes the kernel writes (passthrough) are never seen by the daemon, nor are their
 * errors: a store this full at their writer's close or at their seal means a write(2) may have failed
 * with ENOSPC and the file may be cut short (closing.c, wfs_seal()). One fstatvfs(2).
 */
bool wfs_seal_store_full(struct wfs_fs *fs);
/*
 * The store was found full (wfs_seal_store_full()): every file being written through the kernel now
 * may have had a write(2) fail with ENOSPC, which the daemon cannot see, and room that comes back
 * before its close (another file's removal) would hide it. So each such version (fs->handles:
 * passthrough writers not being sealed) fails with -ENOSPC: its close(2) says so and nothing is
 * sealed (a new name goes). Logged once. Returns how many were failed now. fs->lock held.
 */
int wfs_seal_store_filled(struct wfs_fs *fs);
/* Drop in->writer unsealed: the name keeps its previous content, if any. */
void wfs_seal_abandon(struct wfs_fs *fs, struct wfs_inode *in);
/* mknod(2) of a regular file: seal new inode @in as the empty object. Returns 0 or -errno. */
int wfs_seal_empty(struct wfs_fs *fs, struct wfs_inode *in);

/*
 * @in's version was just dropped unsealed (its writer was @killed, or the seal failed). A name that
 * was never sealed is removed now — a restarted writer checking "exists, with the right size" must
 * not find a name that fails every open with EIO — and so, when its writer was @killed, is a tensor
 * file that never held its bytes (sealed empty while its dtype and shape declare more: made and
 * declared, then written by the writer that is gone; weightfs.offload's temporary names,
 * lib/tensorfile.h; a close that refused the size leaves it as it was). A name that was sealed
 * with content shows that content again, the kernel's cached size included. @news collects what to
 * tell the kernel.
 */
void wfs_seal_writer_gone(struct wfs_fs *fs, struct wfs_inode *in, bool killed, struct wfs_news *news);
/*
 * A writer through passthrough was killed before it finished (closing.h, DOOM): the same names go as
 * in wfs_seal_writer_gone(@killed), at once, where a daemon-served writer's go at its close: a restart
 * right after the kill must not find them. Its version stays @in's until the release drops it.
 */
void wfs_seal_writer_doomed(struct wfs_fs *fs, struct wfs_inode *in, struct wfs_news *news);

/* utimes(2) on inode @ino while it is being written: its seal keeps @mtime. */
void wfs_seal_set_mtime(struct wfs_fs *fs, uint64_t ino, const struct timespec *mtime);
/*
 * setxattr user.weightfs.digest on inode @ino while a version of it is being written (by the
 * mounting user or root: the handler checks): its writer's word for the digest its bytes will have
 * at the seal (wfs_version_declare(): taken for new content
 * written through passthrough, whose seal would otherwise read the whole file to hash it; the object
 * is then checked before its first read, check.h, wfs_check_soon). With -o verify=none it is taken
 * and not used. Returns 1 (taken), or 0 when @ino has no version being written (or one being
 * sealed): the caller treats the request as a sealed file's (only its own digest may be set).
 */
int wfs_seal_declare(struct wfs_fs *fs, uint64_t ino, const struct wfs_digest *d);
/* Is a version of inode @ino being written, not yet being sealed (where a declaration goes)? */
bool wfs_seal_writing(struct wfs_fs *fs, uint64_t ino);

/*
 * Do @size bytes make the tensor that inode @ino's dtype and shape attributes describe, with
 * attribute @name taken as @value (@len bytes) instead of its stored value when @name is not NULL?
 * 0 when they do, when the two are not both set, or when @size is 0 (every declaration admits an
 * empty file: the tensor before its bytes are written, or one emptied by `: > f` or truncate -s 0);
 * -EINVAL (logged, naming the inode and @what, e.g. "seal refused") when elements × dtype bytes !=
 * @size. @written: @size is what a writer wrote (a close, a seal), so a size short of the
 * declaration is logged with its usual causes (a write that failed, a writer that stopped early);
 * false for a size asked for (truncate, fallocate), a claim's file or a new declaration.
 */
int wfs_seal_fits(struct wfs_fs *fs, uint64_t ino, uint64_t size, const char *name, const char *value,
		  size_t len, bool written, const char *what);
/*
 * The bytes inode @ino's dtype and shape attributes declare (elements × dtype bytes), into *@bytes.
 * Returns 0, or -ENODATA when the two are not both set and valid.
 */
int wfs_seal_declared_size(struct wfs_fs *fs, uint64_t ino, uint64_t *bytes);
/*
 * setxattr of user.weightfs.dtype (a safetensors dtype name) or user.weightfs.shape (a JSON array)
 * @name to @value (@len bytes) on inode @ino: it must parse, and with both set on a sealed non-empty
 * file, elements × dtype bytes must equal the file's size. The caller waits for a pending release
 * seal first (wfs_openmode_wait_release(): the file as close(2) left it)
 * (the file as close(2) left it). Returns 0 or -EINVAL (logged: what did not fit).
 */
int wfs_seal_check_xattr(struct wfs_fs *fs, uint64_t ino, const char *name, const char *value, size_t len);

#endif
