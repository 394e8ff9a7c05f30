/* SPDX-License-Identifier: Apache-2.0 */
/*
 * seal — a name's write path: the version being written, the handles writing it, and its seal into
 * an object (or a digest claim, which seals a name without its bytes).
 *
 *   open(O_TRUNC) / create / first write or truncate through a handle
 *       → wfs_seal_writer(): the inode's version (version.h), started when it has none: empty, or a
 *         copy of the sealed object (checked first) for a rewrite in place;
 *       → wfs_seal_join(): the handle counts as a writer of that version until its flush;
 *   write(2) → wfs_seal_write() → wfs_version_write(), hashed as it arrives when in order;
 *   close(2) (FLUSH, when writer.h says this close ends the writing) or RELEASE
 *       → wfs_seal_leave(): the last writer to leave seals, unless the writer was killed
 *         (then the version is abandoned: nothing sealed);
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

/*
 * The version being written of @in, started when there is none: empty when @truncate or when the
 * name has no content yet, otherwise a copy of its sealed object (wfs_version_copy_base(), after
 * checking that object: check.h). Waits while a seal of @in is in progress (fs->seal_done). May drop
 * fs->lock. Returns a referenced version (wfs_version_put() it), or NULL with *@err set (-ENOSPC,
 * -EIO, -ENOMEM, ...).
 */
struct wfs_version *wfs_seal_writer(struct wfs_fs *fs, struct wfs_inode *in, bool truncate, int *err);
/* Count handle @h as a writer of @v (a referenced version of its inode) until its next flush. */
void wfs_seal_join(struct wfs_handle *h, struct wfs_version *v);
/*
 * Stop counting @h as a writer (its flush ended the writing, or its release); the last writer seals
 * the version, or abandons it when the closing thread's process is being killed: @sig is the
 * signal killing it, as the caller read it (wfs_writer_killed_by(), without fs->lock where it can),
 * or 0. @at_release:
 * nobody hears the seal's errors (a size that does not fit dtype/shape is then sealed and logged,
 * not refused, and the seal is not synced). Returns 0 or the seal's -errno. @news gets what the
 * kernel must hear when the version was dropped unsealed (a never-sealed name removed).
 */
int wfs_seal_leave(struct wfs_fs *fs, struct wfs_handle *h, bool at_release, int sig,
		   struct wfs_news *news);
/*
 * Seal in->writer: digest, publish the object, point the inode at it (fs->lock dropped while hashing,
 * publishing and syncing). On failure the version is discarded and the name keeps its previous
 * content. @reported: the error reaches the writer (close(2), truncate(2)); only then is a size that
 * does not fit the dtype/shape attributes refused (-EINVAL), and the commit synced (-o sync).
 * Returns 0 or -errno (-ENOSPC, -EIO, -EINVAL, -ENOMEM, an -errno of the catalog).
 */
int wfs_seal(struct wfs_fs *fs, struct wfs_inode *in, bool reported);
/* Drop in->writer unsealed: the name keeps its previous content, if any. */
void wfs_seal_abandon(struct wfs_fs *fs, struct wfs_inode *in);
/* mknod(2) of a regular file: seal new inode @in as the empty object. Returns 0 or -errno. */
int wfs_seal_empty(struct wfs_fs *fs, struct wfs_inode *in);

/*
 * close(2) of passthrough writer @h by a thread of its process (a flush that ends its writing), whose
 * process is being killed by signal @sig (wfs_writer_killed_by(); 0: it is not):
 * the kernel wrote the bytes, and may go on writing through a mapping until the release, where the
 * seal is. What close(2) can still hear is checked now: a size that does not fit dtype/shape is
 * -EINVAL, and a writer being killed is logged; either way the release drops the version.
 */
int wfs_seal_check_close(struct wfs_fs *fs, struct wfs_handle *h, int sig);

/*
 * write(2) of @len bytes at @off through writable handle @h, by thread @tid of user @uid. The first
 * write of a handle by a user other than root clears the file's set-user-ID bit (and set-group-ID
 * of a group-executable file), as local filesystems do: *@mode_changed says the kernel's cached
 * attributes are stale. Takes fs->lock itself: call it without. Returns @len, or -EBADF (not
 * writable), -ENOSPC, -EIO, -ENOMEM, another -errno.
 */
ssize_t wfs_seal_write(struct wfs_fs *fs, struct wfs_handle *h, uid_t uid, pid_t tid, const void *buf,
		       size_t len, off_t off, bool *mode_changed);
/*
 * fallocate(2) through writable handle @h: space reserved in the version (wfs_version_fallocate()),
 * a size change held to dtype/shape now, as ftruncate(2) is. Takes fs->lock itself. Returns 0,
 * -EBADF, -EOPNOTSUPP (modes other than 0 and FALLOC_FL_KEEP_SIZE), -EINVAL, -ENOSPC, -errno.
 */
int wfs_seal_fallocate(struct wfs_fs *fs, struct wfs_handle *h, pid_t tid, int mode, off_t off, off_t len);
/*
 * copy_file_range(2) of @len bytes (at most 1 GiB, the reply's 32 bits) from @hin at @off_in to
 * writable @hout at @off_out. A whole sealed file onto an empty one (what cp does) claims the
 * source's object: no byte moves. A range the destination holds already (same object, same offset)
 * is done at once. Anything else is read and written through the version. Takes fs->lock itself.
 * Returns bytes copied, or -EBADF, -errno of the read or write.
 */
ssize_t wfs_seal_copy_range(struct wfs_fs *fs, struct wfs_handle *hin, off_t off_in, struct wfs_handle *hout,
			    off_t off_out, size_t len, uid_t uid, pid_t tid);
/*
 * truncate(2)/ftruncate(2) of inode @ino to @size bytes: a new version of that size, sealed now
 * unless a writable handle is open on it (then at its close). @h: the handle (ftruncate), or NULL.
 * Through a handle, a size that does not fit dtype/shape is refused now. Returns 0, or -ESTALE (the
 * name moved to a new inode: the kernel looks it up again), -ETXTBSY, -EISDIR, -EINVAL, the seal's
 * -errno. @news: as wfs_seal_leave(), and a moved name.
 */
int wfs_seal_truncate(struct wfs_fs *fs, uint64_t ino, struct wfs_handle *h, uint64_t size,
		      struct wfs_news *news);
/* utimes(2) on inode @ino while it is being written: its seal keeps @mtime. */
void wfs_seal_set_mtime(struct wfs_fs *fs, uint64_t ino, const struct timespec *mtime);
/*
 * A file closed with nothing written (touch, or created and given attributes only) is sealed at its
 * release, which close(2) does not wait for; so is a tensor written through passthrough. When every
 * writable handle of inode @ino has been closed, give the release up to 100 ms to come, and a seal
 * that has started up to a minute to end (a digest asked for right after the close must find it),
 * and the release's news to reach the kernel (fs->releases_telling); a release held back by a
 * mapping is not waited for. May drop fs->lock.
 */
void wfs_seal_wait_release(struct wfs_fs *fs, uint64_t ino);

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
 * Digest claim (setxattr user.weightfs.claim) on inode @ino: seal the empty regular file as stored
 * object @d, without its bytes being written. An empty version being written (a file just created,
 * or opened with O_TRUNC) is dropped; its handles stay open and later writes start a new version.
 * May drop fs->lock. Returns 0, or
 *   -ENODATA  no intact object @d in the store (missing, quarantined, or failing its check),
 *   -EEXIST   the file has content, or bytes were written to it,
 *   -ETXTBSY  the file is open read-only through passthrough (its backing file is fixed),
 *   -EINVAL   not a regular file, or the object's size does not fit its dtype/shape attributes,
 *   -ENOMEM, or an -errno of the catalog (its commit failed: nothing changed).
 */
int wfs_seal_claim(struct wfs_fs *fs, uint64_t ino, const struct wfs_digest *d);
/*
 * A digest claim that makes its file: new regular file @name in directory @parent (permissions
 * @mode, owner @uid/@gid), sealed as stored object @d from the start, with stored attributes
 * @xattrs (@nxattrs; the caller has checked that a dtype and shape among them fit the object's
 * size, @st->st_size). @st: the object file's stat (wfs_store_object_stat()), taken under fs->lock
 * just before, without dropping it since. What a create, setxattrs and wfs_seal_claim() do, as one
 * catalog call (wfs_catalog_create_sealed()), for batch claims: no inode is made in memory and no
 * version is started. May drop fs->lock (a size not as cataloged is checked by reading). Returns 0
 * with *@out the new file's attributes, or -ENODATA (the object is damaged), -EEXIST, -ENOMEM, or an
 * -errno of the catalog (nothing changed).
 */
int wfs_seal_claim_new(struct wfs_fs *fs, uint64_t parent, const char *name, uint32_t mode, uint32_t uid,
		       uint32_t gid, const struct wfs_digest *d, const struct stat *st,
		       const struct wfs_catalog_xattr *xattrs, size_t nxattrs, struct wfs_attr *out);

/*
 * Do @size bytes make the tensor that inode @ino's dtype and shape attributes describe, with
 * attribute @name taken as @value (@len bytes) instead of its stored value when @name is not NULL?
 * 0 when they do, when the two are not both set, or when @size is 0 (every declaration admits an
 * empty file: the tensor before its bytes are written, or one emptied by `: > f` or truncate -s 0);
 * -EINVAL (logged, naming the inode and @what, e.g. "seal refused") when elements × dtype bytes !=
 * @size.
 */
int wfs_seal_fits(struct wfs_fs *fs, uint64_t ino, uint64_t size, const char *name, const char *value,
		  size_t len, const char *what);
/*
 * The bytes inode @ino's dtype and shape attributes declare (elements × dtype bytes), into *@bytes.
 * Returns 0, or -ENODATA when the two are not both set and valid.
 */
int wfs_seal_declared_size(struct wfs_fs *fs, uint64_t ino, uint64_t *bytes);
/*
 * setxattr of user.weightfs.dtype (a safetensors dtype name) or user.weightfs.shape (a JSON array)
 * @name to @value (@len bytes) on inode @ino: it must parse, and with both set on a sealed non-empty
 * file, elements × dtype bytes must equal the file's size. Waits for a pending release seal first
 * (the file as close(2) left it). Returns 0 or -EINVAL (logged: what did not fit).
 */
int wfs_seal_check_xattr(struct wfs_fs *fs, uint64_t ino, const char *name, const char *value, size_t len);

#endif
