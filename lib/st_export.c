/* SPDX-License-Identifier: Apache-2.0 */
/* st_export.h: a directory of tensor files as one safetensors file. */
#include "st_export.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <jansson.h>

#include "safetensors.h"
#include "weightfs.h"

struct export {
	const char *dir;
	const char *out;
	struct wfs_st_export_options opt;
	struct stat out_st; /* OUT as it was (to leave it out of the walk), when @out_exists */
	bool out_exists;
	struct wfs_st_file *st;
	size_t raw; /* files exported as U8 [bytes] (raw_ok) */
	struct wfs_tf_progress progress;
	struct wfs_copy copy;
	/* A FrozenOffload directory (WFS_FROZEN_MANIFEST): each tensor's file, sorted by tensor name.
	 * Otherwise none, and a tensor's file is its name. */
	struct source {
		char *name, *file;
	} *sources;
	size_t nsources;
};

/* Report one failure through opt->error; returns @ret. */
#define fail(x, ret, path, ...) wfs_tf_report((x)->opt.error, (x)->opt.ctx, ret, path, __VA_ARGS__)

static void progress(struct export *ex)
{
	if (ex->opt.progress)
		ex->opt.progress(ex->opt.ctx, &ex->progress);
}

static void copied(void *ctx, uint64_t bytes)
{
	struct export *ex = ctx;

	ex->progress.bytes_done += bytes;
	progress(ex);
}

/* Read xattr @name of @path into @buf (@size bytes, NUL-terminated). Length, -ENODATA, or -errno. */
static ssize_t get_xattr(const char *path, const char *name, char *buf, size_t size)
{
	ssize_t n = lgetxattr(path, name, buf, size - 1);

	if (n < 0)
		return errno == ENOTSUP ? -ENODATA : -errno;
	buf[n] = '\0';
	return n;
}

/* Add file @path (tensor @rel, @bytes long) from its xattrs. */
static int add_file(struct export *ex, const char *path, const char *rel, uint64_t bytes)
{
	char dtype[64], shape_text[2048], err[WFS_ST_ERR_MAX];
	uint64_t shape[WFS_ST_MAX_DIMS], want;
	unsigned ndim = 0;
	ssize_t nd, ns;
	int ret;

	if (wfs_st_name_check(rel, err, sizeof(err)))
		return fail(ex, -EINVAL, path, "cannot be a tensor name: %s", err);
	nd = get_xattr(path, WFS_XATTR_DTYPE, dtype, sizeof(dtype));
	ns = get_xattr(path, WFS_XATTR_SHAPE, shape_text, sizeof(shape_text));
	if ((nd < 0 && nd != -ENODATA) || (ns < 0 && ns != -ENODATA)) {
		ret = (int)(nd < 0 && nd != -ENODATA ? nd : ns);
		return fail(ex, ret, path, "cannot read its xattrs: %s", strerror(-ret));
	}
	if (nd == -ENODATA && ns == -ENODATA && ex->opt.raw_ok) {
		snprintf(dtype, sizeof(dtype), "U8");
		shape[0] = bytes;
		ndim = 1;
		ex->raw++;
	} else if (nd == -ENODATA || ns == -ENODATA) {
		return fail(ex, -EINVAL, path, "no %s xattr%s",
			    nd == -ENODATA && ns == -ENODATA ? WFS_XATTR_DTYPE "/" WFS_XATTR_SHAPE
			    : nd == -ENODATA ? WFS_XATTR_DTYPE : WFS_XATTR_SHAPE,
			    nd == -ENODATA && ns == -ENODATA ? "s: not a tensor (--raw-ok exports it as U8 [bytes])" : "");
	} else if (wfs_st_shape_parse(shape_text, (size_t)ns, shape, &ndim)) {
		return fail(ex, -EINVAL, path, "%s \"%.64s\" is not a shape like [4096,1024]", WFS_XATTR_SHAPE,
			    shape_text);
	}
	ret = wfs_st_add_tensor(ex->st, rel, dtype, ndim, shape);
	if (ret == -ENOMEM)
		return fail(ex, ret, NULL, "%s", strerror(ENOMEM));
	if (ret)
		return fail(ex, ret, path, "%s \"%.20s\" with shape %.64s is not a tensor safetensors can hold",
			    WFS_XATTR_DTYPE, dtype, shape_text);
	want = ex->st->tensors[ex->st->ntensors - 1].dtype_bytes;
	for (unsigned d = 0; d < ndim; d++)
		want *= shape[d];
	if (want != bytes)
		return fail(ex, -EINVAL, path, "%llu bytes, but %s x %s is %llu bytes", (unsigned long long)bytes, dtype,
			    ndim ? shape_text : "[]", (unsigned long long)want);
	return 0;
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names in directory @path (without "." and ".."), sorted bytewise, into *@out (*@n of them). */
static int list_dir(struct export *ex, const char *path, char ***out, size_t *count)
{
	DIR *d = opendir(path);
	struct dirent *e;
	char **names = NULL;
	size_t n = 0, cap = 0;
	int ret = 0;

	if (!d)
		return fail(ex, -errno, path, "%s", strerror(errno));
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (n == cap) {
			char **grown = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof(*names));

			if (!grown) {
				ret = -ENOMEM;
				break;
			}
			names = grown;
		}
		if (!(names[n] = strdup(e->d_name))) {
			ret = -ENOMEM;
			break;
		}
		n++;
	}
	closedir(d);
	if (n)
		qsort(names, n, sizeof(*names), name_cmp);
	*out = names;
	*count = n;
	return ret ? fail(ex, ret, NULL, "%s", strerror(-ret)) : 0;
}

/* Walk directory @path (tensor names below it start with @rel), sorted. */
static int walk(struct export *ex, const char *path, const char *rel)
{
	char **names = NULL, sub[PATH_MAX], subrel[PATH_MAX], shown[PATH_MAX + 256];
	size_t n = 0;
	int ret = list_dir(ex, path, &names, &n);

	for (size_t i = 0; i < n && !ret; i++) {
		struct stat st;

		if (wfs_tf_path(sub, path, names[i]) || (*rel ? wfs_tf_path(subrel, rel, names[i]) : 0)) {
			snprintf(shown, sizeof(shown), "%s/%s", path, names[i]);
			ret = fail(ex, -ENAMETOOLONG, shown, "%s", strerror(ENAMETOOLONG));
			break;
		}
		if (!*rel)
			snprintf(subrel, sizeof(subrel), "%s", names[i]);
		if (lstat(sub, &st) < 0)
			ret = fail(ex, -errno, sub, "%s", strerror(errno));
		else if (S_ISDIR(st.st_mode))
			ret = walk(ex, sub, subrel);
		else if (!S_ISREG(st.st_mode))
			ret = fail(ex, -EINVAL, sub, "not a regular file or a directory");
		else if (!(ex->out_exists && st.st_dev == ex->out_st.st_dev && st.st_ino == ex->out_st.st_ino))
			ret = add_file(ex, sub, subrel, (uint64_t)st.st_size);
	}
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	return ret;
}

static int write_all_at(int fd, const char *buf, size_t len, uint64_t off)
{
	while (len > 0) {
		ssize_t n = pwrite(fd, buf, len, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		buf += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

static int source_cmp(const void *a, const void *b)
{
	return strcmp(((const struct source *)a)->name, ((const struct source *)b)->name);
}

/* The file below ex->dir that holds tensor @name. */
static const char *source_of(const struct export *ex, const char *name)
{
	struct source key = {.name = (char *)name};
	const struct source *s = ex->nsources ? bsearch(&key, ex->sources, ex->nsources, sizeof(key), source_cmp)
					      : NULL;

	return s ? s->file : name;
}

/*
 * The tensors of a FrozenOffload rank directory: those its manifest (@path, already read into @text,
 * @len bytes) names, each under its parameter name from the file the manifest gives it; other files
 * of the directory are not part of it.
 */
static int add_manifest(struct export *ex, const char *path, const char *text, size_t len)
{
	json_error_t jerr;
	json_t *root = json_loadb(text, len, 0, &jerr), *params = json_object_get(root, "params"), *p;
	const char *name;
	int ret = 0;

	if (!json_is_object(params)) {
		ret = fail(ex, -EINVAL, path, "not a FrozenOffload manifest (%s)",
			   root ? "no \"params\" object" : jerr.text);
		json_decref(root);
		return ret;
	}
	ex->sources = calloc(json_object_size(params) + 1, sizeof(*ex->sources));
	if (!ex->sources)
		ret = fail(ex, -ENOMEM, NULL, "%s", strerror(ENOMEM));
	json_object_foreach(params, name, p) {
		const char *file = json_string_value(json_object_get(p, "file"));
		char sub[PATH_MAX];
		struct stat st;

		if (ret)
			break;
		if (!file || !*file || strchr(file, '/') || strcmp(file, ".") == 0 || strcmp(file, "..") == 0 ||
		    strcmp(file, WFS_FROZEN_MANIFEST) == 0) {
			ret = fail(ex, -EINVAL, path, "parameter \"%.80s\": \"file\" is not a file name of the "
				   "directory", name);
			break;
		}
		if (wfs_tf_path(sub, ex->dir, file)) {
			ret = fail(ex, -ENAMETOOLONG, file, "%s", strerror(ENAMETOOLONG));
			break;
		}
		if (lstat(sub, &st) < 0)
			ret = fail(ex, -errno, sub, "named by %s for parameter \"%.80s\": %s", WFS_FROZEN_MANIFEST,
				   name, strerror(errno));
		else if (!S_ISREG(st.st_mode))
			ret = fail(ex, -EINVAL, sub, "not a regular file");
		else if ((ret = add_file(ex, sub, name, (uint64_t)st.st_size)) == 0) {
			struct source *s = &ex->sources[ex->nsources];

			s->name = strdup(name);
			s->file = strdup(file);
			if (!s->name || !s->file) {
				free(s->name);
				free(s->file);
				ret = fail(ex, -ENOMEM, NULL, "%s", strerror(ENOMEM));
			} else {
				ex->nsources++;
			}
		}
	}
	json_decref(root);
	if (ret == 0 && ex->nsources)
		qsort(ex->sources, ex->nsources, sizeof(*ex->sources), source_cmp);
	return ret;
}

/* The tensors below ex->dir: its manifest's when FrozenOffload wrote it, else every file (walk()). */
static int add_tensors(struct export *ex)
{
	char path[PATH_MAX], *text = NULL;
	size_t len = 0;
	FILE *f;
	int ret;

	if (wfs_tf_path(path, ex->dir, WFS_FROZEN_MANIFEST))
		return fail(ex, -ENAMETOOLONG, ex->dir, "%s", strerror(ENAMETOOLONG));
	f = fopen(path, "re");
	if (!f && errno == ENOENT)
		return walk(ex, ex->dir, "");
	if (!f)
		return fail(ex, -errno, path, "%s", strerror(errno));
	{
		FILE *m = open_memstream(&text, &len);
		char buf[65536];
		size_t n;

		ret = m ? 0 : -ENOMEM;
		while (ret == 0 && (n = fread(buf, 1, sizeof(buf), f)) > 0)
			if (fwrite(buf, 1, n, m) != n)
				ret = -ENOMEM;
		if (ret == 0 && ferror(f))
			ret = -EIO;
		if (m && fclose(m) != 0 && ret == 0)
			ret = -ENOMEM;
	}
	fclose(f);
	if (ret == 0)
		ret = add_manifest(ex, path, text, len);
	else
		fail(ex, ret, path, "%s", strerror(-ret));
	free(text);
	return ret;
}

/* Every tensor's bytes into @fd after the @header_len bytes of header, in data order. */
static int write_data(struct export *ex, int fd, size_t header_len)
{
	int ret = 0;

	ex->progress.tensors_total = ex->st->ntensors;
	ex->progress.bytes_total = ex->st->data_bytes;
	progress(ex);
	for (size_t i = 0; i < ex->st->ntensors && ret == 0; i++) {
		const struct wfs_st_tensor *t = &ex->st->tensors[i];
		char path[PATH_MAX];
		struct stat st;
		int in;

		wfs_tf_path(path, ex->dir, source_of(ex, t->name)); /* fitted when it was added */
		in = open(path, O_RDONLY | O_CLOEXEC);
		if (in < 0 || fstat(in, &st) < 0) {
			ret = fail(ex, -errno, path, "%s", strerror(errno));
		} else if ((uint64_t)st.st_size != t->end - t->begin) {
			ret = fail(ex, -ESTALE, path, "changed while exporting (%llu bytes, was %llu)",
				   (unsigned long long)st.st_size, (unsigned long long)(t->end - t->begin));
		} else {
			ret = wfs_copy_range(&ex->copy, in, 0, fd, header_len + t->begin, t->end - t->begin);
			if (ret && ret != -EINTR)
				fail(ex, ret, path, "%s",
				     ret == -ENODATA ? "changed while exporting (got shorter)" : strerror(-ret));
		}
		if (in >= 0)
			close(in);
		ex->progress.tensors_done++;
		progress(ex);
	}
	return ret;
}

/* Header, then every tensor's bytes, into a temp file renamed to OUT. */
static int write_file(struct export *ex)
{
	char tmp[PATH_MAX], outdir[PATH_MAX], err[WFS_ST_ERR_MAX], *header = NULL;
	const char *base = strrchr(ex->out, '/');
	size_t header_len;
	int fd = -1, ret;

	ret = wfs_st_layout(ex->st, err, sizeof(err));
	if (ret == 0)
		ret = wfs_st_encode(ex->st, &header, &header_len);
	if (ret)
		return fail(ex, ret, ex->dir, "%s",
			    ret == -EFBIG ? "the header would be over 100 MB" : ret == -ENOMEM ? strerror(ENOMEM) : err);
	snprintf(outdir, sizeof(outdir), "%.*s", base ? (int)(base - ex->out + 1) : 0, ex->out);
	if (snprintf(tmp, sizeof(tmp), "%s.%.180s" WFS_TMP_EXPORT_INFIX "XXXXXX", outdir, base ? base + 1 : ex->out) >=
	    (int)sizeof(tmp)) {
		free(header);
		return fail(ex, -ENAMETOOLONG, ex->out, "%s", strerror(ENAMETOOLONG));
	}
	fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0) {
		free(header);
		return fail(ex, -errno, tmp, "cannot create a temporary file: %s", strerror(errno));
	}
	fchmod(fd, 0644);
	ret = write_all_at(fd, header, header_len, 0);
	free(header);
	if (ret)
		fail(ex, ret, tmp, "%s", strerror(-ret));
	else
		ret = write_data(ex, fd, header_len);
	if (ret) { /* reported above */
		close(fd);
		unlink(tmp);
		return ret;
	}
	if (fsync(fd) < 0)
		ret = -errno;
	if (close(fd) < 0 && ret == 0)
		ret = -errno;
	if (ret) {
		unlink(tmp);
		return fail(ex, ret, tmp, "%s", strerror(-ret));
	}
	if (ex->opt.force) {
		ret = rename(tmp, ex->out) < 0 ? -errno : 0;
	} else {
		ret = renameat2(AT_FDCWD, tmp, AT_FDCWD, ex->out, RENAME_NOREPLACE) < 0 ? -errno : 0;
		if (ret == -EINVAL || ret == -ENOSYS) /* the filesystem cannot: link() fails on EEXIST too */
			ret = link(tmp, ex->out) < 0 ? -errno : unlink(tmp) < 0 ? -errno : 0;
	}
	if (ret) {
		unlink(tmp);
		return fail(ex, ret, ex->out, "%s", ret == -EEXIST ? "exists (--force replaces it)" : strerror(-ret));
	}
	fd = open(*outdir ? outdir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
	return 0;
}

/* DIR's WFS_XATTR_ST_META, if set, as the header's metadata. */
static int read_meta(struct export *ex)
{
	char meta[65536], err[WFS_ST_ERR_MAX];
	ssize_t n = get_xattr(ex->dir, WFS_XATTR_ST_META, meta, sizeof(meta));
	int ret;

	if (n < 0 && n != -ENODATA)
		return fail(ex, (int)n, ex->dir, "cannot read %s: %s", WFS_XATTR_ST_META, strerror((int)-n));
	if (n >= 0 && (ret = wfs_st_meta_parse(ex->st, meta, (size_t)n, err, sizeof(err))) != 0)
		return fail(ex, ret, ex->dir, "%s: %s", WFS_XATTR_ST_META, ret == -ENOMEM ? strerror(ENOMEM) : err);
	return 0;
}

int wfs_st_export(const char *dir, const char *out, const struct wfs_st_export_options *opt,
		  struct wfs_st_export_summary *sum)
{
	struct export ex = {.dir = dir, .out = out};
	struct stat st;
	int ret;

	if (opt)
		ex.opt = *opt;
	ex.copy = (struct wfs_copy){.stop = ex.opt.stop, .progress = copied, .ctx = &ex};
	ex.out_exists = stat(out, &ex.out_st) == 0;
	ex.st = wfs_st_new();
	if (!ex.st)
		return fail(&ex, -ENOMEM, NULL, "%s", strerror(ENOMEM));
	if (stat(dir, &st) < 0)
		ret = fail(&ex, -errno, dir, "%s", strerror(errno));
	else if (!S_ISDIR(st.st_mode))
		ret = fail(&ex, -ENOTDIR, dir, "not a directory");
	else if ((ret = read_meta(&ex)) == 0 && (ret = add_tensors(&ex)) == 0)
		ret = write_file(&ex);
	if (ret == 0 && sum)
		*sum = (struct wfs_st_export_summary){
			.tensors = ex.st->ntensors,
			.header_bytes = 8 + ex.st->header_bytes,
			.data_bytes = ex.st->data_bytes,
			.file_bytes = 8 + ex.st->header_bytes + ex.st->data_bytes,
			.metadata = ex.st->has_metadata,
			.raw_files = ex.raw,
		};
	wfs_copy_release(&ex.copy);
	wfs_st_free(ex.st);
	for (size_t i = 0; i < ex.nsources; i++) {
		free(ex.sources[i].name);
		free(ex.sources[i].file);
	}
	free(ex.sources);
	return ret;
}
