/* SPDX-License-Identifier: Apache-2.0 */
/*
 * st_export — a directory of tensor files as one safetensors file (prefix wfs_st_export_).
 *
 * Every regular file below DIR is a tensor named by its path relative to DIR ("a/b" for DIR/a/b),
 * with the dtype and shape of its user.weightfs.dtype / user.weightfs.shape xattrs; its size in
 * bytes must be elements × dtype bytes. DIR's WFS_XATTR_ST_META xattr, if set, becomes the header's
 * "__metadata__". Anything below DIR that is neither a regular file nor a directory, a name
 * wfs_st_name_check() refuses, or a file without both xattrs (unless @raw_ok: then it is U8
 * [bytes]) is an error. OUT itself, when it lies below DIR, is left out.
 *
 * The file is written in the reference implementation's layout (lib/safetensors.h: wfs_st_layout,
 * wfs_st_encode), so the output depends only on the tensors, and what st_import read comes back
 * byte-identical. It goes to a temporary file next to OUT (".<base>" WFS_TMP_EXPORT_INFIX
 * "XXXXXX", mode 0644), is fsync()ed and renamed over OUT (with RENAME_NOREPLACE unless @force),
 * and OUT's directory is fsync()ed: OUT is either the old file or the complete new one.
 *
 * Errors: 0 or a negative errno; on error opt->error has been called once with the path concerned
 * (NULL for -ENOMEM) and a one-line reason, e.g. path "dir/a.weight", "no user.weightfs.shape
 * xattr". -EINTR (opt->stop) is not reported. Not thread-safe; keeps nothing after it returns.
 */
#ifndef WFS_ST_EXPORT_H
#define WFS_ST_EXPORT_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensorfile.h"

struct wfs_st_export_options {
	bool force;                        /* replace OUT when it exists */
	bool raw_ok;                       /* a file without dtype/shape xattrs is U8 [bytes] */
	const volatile sig_atomic_t *stop; /* non-zero: stop at the next chunk (-EINTR); may be NULL */
	/* Called before the first tensor's bytes, as bytes are copied and after each tensor. May be NULL. */
	void (*progress)(void *ctx, const struct wfs_tf_progress *p);
	/* Called once per failure: @path may be NULL, @message has no trailing newline. May be NULL. */
	void (*error)(void *ctx, const char *path, const char *message);
	void *ctx;
};

struct wfs_st_export_summary {
	size_t tensors;
	uint64_t header_bytes; /* 8 + N: the prefix and the JSON with its padding */
	uint64_t data_bytes;   /* the data buffer */
	uint64_t file_bytes;   /* header_bytes + data_bytes: OUT's size */
	bool metadata;         /* the header has "__metadata__" (DIR's WFS_XATTR_ST_META) */
	size_t raw_files;      /* files exported as U8 [bytes] (@raw_ok) */
};

/*
 * Export directory @dir to file @out (both paths as given to open(2)): every regular file below it,
 * named by its relative path; or, when @dir holds WFS_FROZEN_MANIFEST (a FrozenOffload rank), the
 * files its manifest names, under their parameter names. On success *@sum (may be NULL) says what
 * was written. Returns 0, -ENOTDIR (@dir is not a directory), -EINVAL (a file is
 * not a tensor: name, xattrs, size, DIR's metadata, a malformed manifest), -EEXIST (OUT exists and not @force), -ESTALE
 * or -ENODATA (a file changed while exporting), -EFBIG (the header would pass WFS_ST_HEADER_MAX),
 * -EOVERFLOW, -EINTR, -ENOMEM, -ENAMETOOLONG, or -errno of opendir/lstat/getxattr/open/write/
 * fsync/rename (-ENOSPC, -EIO, ...). On error OUT is as it was and no temporary file is left.
 */
int wfs_st_export(const char *dir, const char *out, const struct wfs_st_export_options *opt,
		  struct wfs_st_export_summary *sum);

#endif
