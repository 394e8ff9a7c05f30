/* SPDX-License-Identifier: Apache-2.0 */
/*
 * st_import — a safetensors checkpoint into a directory of tensor files (prefix wfs_st_import_).
 *
 * CHECKPOINT is one .safetensors file, or a sharded checkpoint's index (a name ending in ".json",
 * lib/safetensors.h: struct wfs_st_index) whose shards are read from the index's directory. Each
 * tensor becomes file DIR/<tensor name> ("a/b" is file b in directory a), written by the
 * tensor-file protocol (lib/tensorfile.h) with user.weightfs.dtype and user.weightfs.shape; the
 * shards' "__metadata__" (merged; they must agree) goes into DIR's WFS_XATTR_ST_META xattr as
 * canonical JSON (wfs_st_meta_json()), an index's "metadata" into WFS_XATTR_ST_INDEX.
 *
 * Two phases, so that nothing is written before everything is checked:
 *   wfs_st_import_open()  reads every header and the index, and checks them against each other and
 *                         the tensor names as file names (wfs_st_name_check(), no "a" and "a/b");
 *   wfs_st_import_run()   checks DIR (a name that holds the tensor already, the same dtype, shape
 *                         and content by digest, is left as it is and counted unchanged, so
 *                         importing a checkpoint again succeeds; other existing names need
 *                         @force; a tensor's name may not be a
 *                         directory there, nor its parent a file; DIR's metadata must match unless
 *                         @force), then writes the tensors in file order, sets DIR's xattrs and
 *                         fsyncs DIR. On weightfs the close of each file seals it; elsewhere each
 *                         file is fdatasync()ed before its rename. Tensors written before an error
 *                         stay.
 *
 * Errors: every function returns 0 or a negative errno and, on error, has called opt->error once
 * with the path concerned (a checkpoint, a shard or a file under DIR; NULL for -ENOMEM) and a
 * one-line reason (control characters in tensor names shown as '?', names cut at 80 bytes), e.g.
 *   path "ckpt.safetensors", "byte 123: tensor 'a.weight': data_offsets [0, 10] but F32 x [3] is 12 bytes"
 *   path "out/a.weight", "exists with other content, dtype or shape (--force replaces it)"
 * An -EINTR (opt->stop was set) is not reported: the caller knows.
 *
 * Memory: a struct wfs_st_import is the caller's (wfs_st_import_free()); it holds the shards open
 * (one descriptor each) until freed. Not thread-safe: one thread uses one import.
 */
#ifndef WFS_ST_IMPORT_H
#define WFS_ST_IMPORT_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensorfile.h"

#define WFS_ST_INDEX_FILE_MAX (256ull << 20) /* largest index file read, bytes */

struct wfs_st_import_options {
	bool force;                        /* replace existing tensor files and DIR's metadata */
	const volatile sig_atomic_t *stop; /* non-zero: stop at the next chunk (-EINTR); may be NULL */
	/* Called before the first tensor, as bytes are copied and after each tensor. May be NULL. */
	void (*progress)(void *ctx, const struct wfs_tf_progress *p);
	/* Called once per failure: @path may be NULL, @message has no trailing newline. May be NULL. */
	void (*error)(void *ctx, const char *path, const char *message);
	void *ctx;
};

struct wfs_st_import_summary {
	size_t shards;       /* safetensors files read (1 without an index) */
	size_t tensors;      /* tensors in the checkpoint */
	size_t tensors_done; /* tensors written so far by wfs_st_import_run() */
	uint64_t bytes;      /* bytes of tensor data in the checkpoint */
	size_t replaced;     /* existing tensor files replaced (@force): other content, dtype or shape */
	size_t unchanged;    /* existing tensor files that were the tensor already: left, not written */
	bool metadata;       /* a shard had a "__metadata__" (DIR's WFS_XATTR_ST_META set) */
	bool index_metadata; /* the index had "metadata" (DIR's WFS_XATTR_ST_INDEX set) */
};

struct wfs_st_import;

/*
 * Read and check checkpoint @checkpoint (phase 1; nothing written). @opt is copied. On success
 * *@out is a new import the caller owns. Returns 0, -EINVAL (malformed: a header, the index, a
 * tensor name, shards that disagree), -EFBIG (an index over WFS_ST_INDEX_FILE_MAX), -ENOMEM, or
 * -errno of open/read. *@out is written only on success.
 */
int wfs_st_import_open(const char *checkpoint, const struct wfs_st_import_options *opt,
		       struct wfs_st_import **out);

/*
 * Write @im's tensors under directory @dir (made when missing; phase 2); those @dir holds already
 * are not written again (summary's unchanged). Returns 0, -EEXIST (a name exists with other content,
 * dtype or shape, or DIR's metadata differs, and not @force), -EISDIR / -ENOTDIR (a name or its parent has the
 * wrong type in DIR), -EINTR, -ENAMETOOLONG, or an error of wfs_tf_write() (-ENOTSUP: DIR keeps no
 * user xattrs; -ENOSPC, -EIO: a seal), or -errno of mkdir/open/fsetxattr/fsync on DIR.
 */
int wfs_st_import_run(struct wfs_st_import *im, const char *dir);

/* What @im holds and has done so far. */
void wfs_st_import_summary(const struct wfs_st_import *im, struct wfs_st_import_summary *s);

/* Close the shards and free @im. NULL is fine. */
void wfs_st_import_free(struct wfs_st_import *im);

/* Is @path on a fuse.weightfs mount (the /proc/self/mounts entry with the longest prefix of its
 * real path)? false when it cannot tell. */
bool wfs_st_on_weightfs(const char *path);

#endif
