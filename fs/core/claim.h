/* SPDX-License-Identifier: Apache-2.0 */
/*
 * claim — a digest claim: a name sealed as an object the store holds already, without its bytes
 * being written (setxattr user.weightfs.claim, batch claims, and copy_file_range of a whole file).
 * All functions run with fs->lock held; those that check an object or wait may drop it.
 */
#ifndef WFS_CORE_CLAIM_H
#define WFS_CORE_CLAIM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "digest.h"

/*
 * How long a claim waits (ms) for another file whose claim of the same content missed, and whose
 * writer is writing it: ranks that offload one tensor at once move its bytes once. Past it, the
 * claim misses and its writer writes the bytes too (today's cost, never a wrong answer).
 */
#define WFS_CLAIM_WAIT_MS 10000
/*
 * How many claims wait at once, at most: each holds a request thread (libfuse's max_threads, 10 by
 * default), and the writer they wait for needs threads for its own requests. Past it, a claim misses
 * at once and its writer writes too.
 */
#define WFS_CLAIM_WAITERS_MAX 4

struct wfs_fs;
struct wfs_attr;
struct wfs_catalog_xattr;
struct wfs_inode;

/*
 * Digest claim (setxattr user.weightfs.claim) on inode @ino: seal the empty regular file as stored
 * object @d, without its bytes being written. An empty version being written (a file just created,
 * or opened with O_TRUNC) is dropped; its handles stay open and later writes start a new version.
 * May drop fs->lock. Returns 0, or
 *   -ENODATA  no intact object @d in the store (missing, quarantined, or failing its check);
 *             when another file's claim of @d missed and its bytes are being written, after
 *             waiting up to WFS_CLAIM_WAIT_MS for them (a hit then); a miss makes this file the
 *             one others wait for, until it seals content, loses its writer or goes away,
 *   -EEXIST   the file has content, or bytes were written to it,
 *   -ETXTBSY  the file is open read-only through passthrough (its backing file is fixed),
 *   -EINVAL   not a regular file, or the object's size does not fit its dtype/shape attributes,
 *   -ENOMEM, or an -errno of the catalog (its commit failed: nothing changed).
 */
int wfs_claim(struct wfs_fs *fs, uint64_t ino, const struct wfs_digest *d);
/*
 * A digest claim that makes its file: new regular file @name in directory @parent (permissions
 * @mode, owner @uid/@gid), sealed as stored object @d from the start, with stored attributes
 * @xattrs (@nxattrs; the caller has checked that a dtype and shape among them fit the object's
 * size, @st->st_size). @st: the object file's stat (wfs_store_object_stat()), taken under fs->lock
 * just before, without dropping it since. What a create, setxattrs and wfs_claim() do, as one
 * catalog call (wfs_catalog_create_sealed()), for batch claims: no inode is made in memory and no
 * version is started. May drop fs->lock (a size not as cataloged is checked by reading). Returns 0
 * with *@out the new file's attributes, or -ENODATA (the object is damaged), -EEXIST, -ENOMEM, or an
 * -errno of the catalog (nothing changed).
 */
int wfs_claim_new(struct wfs_fs *fs, uint64_t parent, const char *name, uint32_t mode, uint32_t uid,
		       uint32_t gid, const struct wfs_digest *d, const struct stat *st,
		       const struct wfs_catalog_xattr *xattrs, size_t nxattrs, struct wfs_attr *out);
/*
 * wfs_claim() on inode @in, held in memory by the caller, whose passthrough readers the caller has
 * waited for (wfs_openmode_wait_readers()). Same returns as wfs_claim(), but -EINVAL and -ETXTBSY.
 */
int wfs_claim_inode(struct wfs_fs *fs, struct wfs_inode *in, const struct wfs_digest *d);

#endif
