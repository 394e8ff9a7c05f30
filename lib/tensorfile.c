/* SPDX-License-Identifier: Apache-2.0 */
/* tensorfile.h: one tensor file written the way weightfs expects it. */
#include "tensorfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "dtype.h"
#include "safetensors.h"

int wfs_tf_report(void (*error)(void *ctx, const char *path, const char *message), void *ctx, int ret,
		  const char *path, const char *fmt, ...)
{
	char msg[2 * PATH_MAX + 512];
	va_list ap;

	if (!error)
		return ret;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	error(ctx, path, msg);
	return ret;
}

int wfs_tf_path(char *out, const char *dir, const char *name)
{
	int n = snprintf(out, PATH_MAX, "%s%s%s", dir, *dir && dir[strlen(dir) - 1] != '/' ? "/" : "", name);

	return n < 0 || n >= PATH_MAX ? -ENAMETOOLONG : 0;
}

int wfs_tf_mkdirs(const char *path)
{
	char buf[PATH_MAX];
	size_t len = strlen(path);

	if (len >= sizeof(buf))
		return -ENAMETOOLONG;
	memcpy(buf, path, len + 1);
	for (char *p = buf + 1;; p++) {
		if (*p == '/' || *p == '\0') {
			char c = *p;
			struct stat st;

			*p = '\0';
			if (mkdir(buf, 0755) < 0 && errno != EEXIST)
				return -errno;
			if (stat(buf, &st) < 0)
				return -errno;
			if (!S_ISDIR(st.st_mode))
				return -ENOTDIR;
			*p = c;
			if (!c)
				return 0;
		}
	}
}

static int failed(struct wfs_tf_error *err, enum wfs_tf_step step, const char *path, int ret)
{
	if (err) {
		err->step = step;
		snprintf(err->path, sizeof(err->path), "%s", path);
	}
	return ret;
}

int wfs_tf_write(const char *dir, const char *name, const struct wfs_tf_spec *spec, struct wfs_copy *copy,
		 struct wfs_tf_error *err)
{
	char final[PATH_MAX], tmp[PATH_MAX], parent[PATH_MAX], tmpname[64], shape[WFS_SHAPE_MAX_DIMS * 21 + 2];
	const char *slash = strrchr(name, '/');
	int fd, ret = 0;

	snprintf(parent, sizeof(parent), "%s", dir);
	if (slash) {
		char sub[PATH_MAX];

		snprintf(sub, sizeof(sub), "%.*s", (int)(slash - name), name);
		if (wfs_tf_path(parent, dir, sub))
			return failed(err, WFS_TF_MKDIR, parent, -ENAMETOOLONG);
		if ((ret = wfs_tf_mkdirs(parent)) != 0)
			return failed(err, WFS_TF_MKDIR, parent, ret);
	}
	snprintf(tmpname, sizeof(tmpname), WFS_TMP_PREFIX "%ld-%lu", (long)getpid(), spec->seq);
	if (err)
		snprintf(err->tmpname, sizeof(err->tmpname), "%s", tmpname);
	if (wfs_tf_path(final, dir, name) || wfs_tf_path(tmp, parent, tmpname))
		return failed(err, WFS_TF_NAME, dir, -ENAMETOOLONG);
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0)
		return failed(err, WFS_TF_CREATE, tmp, -errno);
	if (err) {
		err->xattr = WFS_XATTR_SHAPE;
		err->xattr_bytes = 0;
	}
	if (wfs_st_shape_format(spec->shape, spec->ndim, shape, sizeof(shape)) < 0) {
		ret = -EINVAL; /* more than WFS_SHAPE_MAX_DIMS dimensions */
	} else if (fsetxattr(fd, WFS_XATTR_SHAPE, shape, strlen(shape), 0) < 0) {
		ret = -errno;
		if (err)
			err->xattr_bytes = strlen(shape);
	} else if (fsetxattr(fd, WFS_XATTR_DTYPE, spec->dtype, strlen(spec->dtype), 0) < 0) {
		ret = -errno;
		if (err) {
			err->xattr = WFS_XATTR_DTYPE;
			err->xattr_bytes = strlen(spec->dtype);
		}
	}
	if (ret) {
		close(fd);
		unlink(tmp);
		return failed(err, WFS_TF_XATTR, tmp, ret);
	}
	/* A large tensor is written through kernel passthrough on weightfs when opened for writing
	 * after its attributes are set (lib/weightfs.h): open it again. Elsewhere this costs a close. */
	if (spec->bytes >= WFS_PASSTHROUGH_WRITE_MIN) {
		close(fd);
		fd = open(tmp, O_WRONLY | O_CLOEXEC);
		if (fd < 0) {
			ret = -errno;
			unlink(tmp);
			return failed(err, WFS_TF_CREATE, tmp, ret);
		}
	}
	ret = wfs_copy_range(copy, spec->src_fd, spec->src_offset, fd, 0, spec->bytes);
	if (ret == 0 && spec->datasync && fdatasync(fd) < 0)
		ret = -errno;
	if (close(fd) < 0 && ret == 0)
		ret = -errno; /* on weightfs: the seal's error (ENOSPC, EIO) */
	if (ret) {
		unlink(tmp);
		return failed(err, WFS_TF_DATA, final, ret);
	}
	if (rename(tmp, final) < 0) {
		ret = -errno;
		unlink(tmp);
		return failed(err, WFS_TF_RENAME, final, ret);
	}
	return 0;
}
