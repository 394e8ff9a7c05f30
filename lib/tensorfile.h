/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tensorfile — write one tensor file the way weightfs expects it (prefix wfs_tf_).
 *
 * The protocol, for tensor @name (a relative path, "a/b.weight" being file b.weight in directory
 * a) under directory @dir:
 *   1. make @dir/<parent of name> (mkdir -p, mode 0755);
 *   2. create <parent>/WFS_TMP_PREFIX<pid>-<seq> (lib/weightfs.h; O_EXCL, mode 0644);
 *   3. set user.weightfs.shape ("[4096,1024]") then user.weightfs.dtype ("BF16") on it, before any
 *      byte: on weightfs the seal is then held to them (size = elements × dtype bytes);
 *   4. a tensor of WFS_PASSTHROUGH_WRITE_MIN bytes or more: close the file and open it again for
 *      writing, which weightfs serves through kernel passthrough (writes at the store disk's speed;
 *      the seal then happens at the release, moments after close(2));
 *      then copy the bytes in order (lib/copy.h), fdatasync() them when asked (a plain filesystem; on
 *      weightfs the seal is durable itself);
 *   5. close(2): on weightfs this is the seal, and its errors (ENOSPC, EIO, EINVAL from the
 *      size check) come back here;
 *   6. rename(2) the temporary name over @dir/@name.
 * A crash or an error never leaves a half-written tensor, or one without its xattrs, under a
 * tensor's name; on error the temporary file is removed. The Python package's offload() uses the
 * same temporary names (WFS_TMP_PREFIX<pid>-<n>-<tag>), so one stale-file sweep finds both.
 *
 * Dtypes are lib/dtype.h's names, shapes dimension counts (elements), sizes bytes. Thread-safe on
 * distinct files; names are the caller's, never kept.
 */
#ifndef WFS_TENSORFILE_H
#define WFS_TENSORFILE_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "copy.h"
#include "weightfs.h"

/* Which step of the protocol failed (struct wfs_tf_error). */
enum wfs_tf_step {
	WFS_TF_MKDIR,  /* step 1: error.path is the directory */
	WFS_TF_NAME,   /* the names do not fit in PATH_MAX: error.path is @dir */
	WFS_TF_CREATE, /* step 2: error.path is the temporary file */
	WFS_TF_XATTR,  /* step 3: error.path is the temporary file, error.xattr the attribute */
	WFS_TF_DATA,   /* step 4 (or 5: the seal): error.path is the final name */
	WFS_TF_RENAME, /* step 6: error.path is the final name, error.tmpname the temporary one */
};

/* Where a wfs_tf_write() failed; written only on error. */
struct wfs_tf_error {
	enum wfs_tf_step step;
	char path[PATH_MAX];
	const char *xattr;  /* WFS_TF_XATTR: WFS_XATTR_SHAPE or WFS_XATTR_DTYPE */
	size_t xattr_bytes; /* WFS_TF_XATTR: bytes of the value that was refused */
	char tmpname[64];  /* the temporary file's name (no directory) */
};

/* One tensor to write: @bytes bytes of @src_fd from byte @src_offset, of @dtype × @shape. */
struct wfs_tf_spec {
	const char *dtype;     /* a lib/dtype.h name, e.g. "BF16" (not checked here: weightfs does) */
	const uint64_t *shape; /* @ndim dimensions, in elements */
	unsigned ndim;         /* 0 (a scalar) .. WFS_SHAPE_MAX_DIMS */
	int src_fd;            /* read with pread/copy_file_range; the caller's */
	uint64_t src_offset;   /* bytes */
	uint64_t bytes;        /* should be elements × dtype bytes; weightfs refuses the seal if not */
	bool datasync;         /* fdatasync() before close: for a filesystem that is not weightfs */
	unsigned long seq;     /* makes the temporary name unique within this process */
};

/* Progress over a set of tensor files (st_import.h, st_export.h). */
struct wfs_tf_progress {
	size_t tensors_done, tensors_total;
	uint64_t bytes_done, bytes_total;
};

/*
 * Write tensor @name under @dir by the protocol above, copying with @copy (its stop flag and
 * progress callback apply). Returns 0, or: -ENAMETOOLONG (WFS_TF_NAME), -errno of mkdir/open/
 * fsetxattr/copy/fdatasync/close/rename (-ENOTSUP: the filesystem keeps no user xattrs; -E2BIG,
 * -ERANGE, -ENOSPC: an xattr over its size limit; -ENOSPC, -EIO, -EINVAL: the seal), -ENODATA
 * (@src_fd ended before @bytes), -EINTR (copy->stop was set), -ENOMEM. On error *@err (may be NULL)
 * says which step and on which path.
 */
int wfs_tf_write(const char *dir, const char *name, const struct wfs_tf_spec *spec, struct wfs_copy *copy,
		 struct wfs_tf_error *err);

/*
 * Format one error line (printf @fmt) and pass it with @path (may be NULL) to @error (may be NULL):
 * how st_import and st_export report through their options' error callback. Returns @ret.
 */
__attribute__((format(printf, 5, 6))) int wfs_tf_report(void (*error)(void *ctx, const char *path,
								       const char *message),
							void *ctx, int ret, const char *path, const char *fmt, ...);

/* "@dir/@name" into @out (PATH_MAX bytes; no '/' added when @dir ends with one or is empty).
 * Returns 0 or -ENAMETOOLONG. */
int wfs_tf_path(char *out, const char *dir, const char *name);

/* mkdir -p @path (mode 0755 for what it makes). Returns 0, -ENOTDIR (a component is a file), or
 * -errno of mkdir/stat. */
int wfs_tf_mkdirs(const char *path);

#endif
