/* SPDX-License-Identifier: Apache-2.0 */
/* st_import.h: a safetensors checkpoint into a directory of tensor files. */
#include "st_import.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <mntent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "digest.h"
#include "dtype.h"
#include "safetensors.h"
#include "weightfs.h"

struct shard {
	char *path;       /* as opened */
	const char *name; /* as the index names it (NULL for a single file) */
	int fd;
	struct wfs_st_file *st;
};

struct item {
	const struct wfs_st_tensor *t;
	struct shard *shard;
	bool unchanged; /* DIR already holds it, the same (check_targets): not written again */
};

struct wfs_st_import {
	struct wfs_st_import_options opt;
	char *checkpoint;
	char dir[PATH_MAX];
	struct wfs_st_index *index;
	struct shard *shards;
	size_t nshards;
	struct item *items; /* every tensor of every shard */
	size_t nitems;
	struct wfs_st_file *meta; /* the shards' __metadata__, merged */
	uint64_t bytes;
	size_t replaced;
	size_t unchanged;
	struct wfs_tf_progress progress;
	struct wfs_copy copy;
};

/* Report one failure through opt->error; returns @ret. */
#define fail(x, ret, path, ...) wfs_tf_report((x)->opt.error, (x)->opt.ctx, ret, path, __VA_ARGS__)

/* @s for a message: at most 80 bytes, control characters as '?'. */
static const char *printable(const char *s, char buf[96])
{
	size_t i = 0;

	for (; i < 80 && s[i]; i++)
		buf[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
	while (s[i] && i > 0 && ((unsigned char)s[i] & 0xc0) == 0x80)
		i--; /* cut on a UTF-8 character boundary */
	snprintf(buf + i, 96 - i, "%s", s[i] ? "..." : "");
	return buf;
}

bool wfs_st_on_weightfs(const char *path)
{
	char real[PATH_MAX];
	FILE *f;
	struct mntent *m;
	size_t best = 0;
	bool weightfs = false;

	if (!realpath(path, real) || !(f = setmntent("/proc/self/mounts", "r")))
		return false;
	while ((m = getmntent(f)) != NULL) {
		size_t len = strlen(m->mnt_dir);

		if (strncmp(real, m->mnt_dir, len) != 0 || (real[len] != '/' && real[len] != '\0' && len > 1))
			continue;
		if (len >= best) {
			best = len;
			weightfs = strcmp(m->mnt_type, "fuse.weightfs") == 0;
		}
	}
	endmntent(f);
	return weightfs;
}

static void progress(struct wfs_st_import *im)
{
	if (im->opt.progress)
		im->opt.progress(im->opt.ctx, &im->progress);
}

static void copied(void *ctx, uint64_t bytes)
{
	struct wfs_st_import *im = ctx;

	im->progress.bytes_done += bytes;
	progress(im);
}

static int item_by_name(const void *a, const void *b)
{
	return strcmp(((const struct item *)a)->t->name, ((const struct item *)b)->t->name);
}

static int item_by_file(const void *a, const void *b)
{
	const struct item *x = a, *y = b;

	if (x->shard != y->shard)
		return x->shard < y->shard ? -1 : 1;
	return x->t->begin < y->t->begin ? -1 : x->t->begin > y->t->begin ? 1 : strcmp(x->t->name, y->t->name);
}

static int read_small_file(const char *path, char **out, size_t *len)
{
	struct stat st;
	char *buf;
	size_t got = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC), ret = 0;

	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size > WFS_ST_INDEX_FILE_MAX) {
		ret = st.st_size > 0 && (uint64_t)st.st_size > WFS_ST_INDEX_FILE_MAX ? -EFBIG : -errno;
		close(fd);
		return ret;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		close(fd);
		return -ENOMEM;
	}
	while (got < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			ret = n < 0 ? -errno : -EIO;
			break;
		}
		got += (size_t)n;
	}
	close(fd);
	if (ret) {
		free(buf);
		return ret;
	}
	buf[got] = '\0';
	*out = buf;
	*len = got;
	return 0;
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);

	return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int no_memory(const struct wfs_st_import *im)
{
	return fail(im, -ENOMEM, NULL, "%s", strerror(ENOMEM));
}

/* The shards an index names, relative to its directory. */
static int index_shards(struct wfs_st_import *im)
{
	char err[WFS_ST_ERR_MAX], *text = NULL, *dir, *slash;
	size_t len = 0;
	int ret = read_small_file(im->checkpoint, &text, &len);

	if (ret)
		return fail(im, ret, im->checkpoint, "%s", ret == -EFBIG ? "index file over 256 MiB" : strerror(-ret));
	ret = wfs_st_index_parse(text, len, &im->index, err, sizeof(err));
	free(text);
	if (ret)
		return fail(im, ret, im->checkpoint, "%s", ret == -ENOMEM ? strerror(ENOMEM) : err);
	im->shards = calloc(im->index->nshards + 1, sizeof(*im->shards));
	dir = strdup(im->checkpoint);
	if (!im->shards || !dir) {
		free(dir);
		return no_memory(im);
	}
	slash = strrchr(dir, '/');
	if (slash)
		slash[1] = '\0';
	else
		dir[0] = '\0';
	for (size_t i = 0; i < im->index->nshards; i++) {
		struct shard *s = &im->shards[im->nshards++];
		size_t n = strlen(dir) + strlen(im->index->shards[i]) + 1;

		s->fd = -1;
		s->name = im->index->shards[i];
		s->path = malloc(n);
		if (!s->path) {
			free(dir);
			return no_memory(im);
		}
		snprintf(s->path, n, "%s%s", dir, s->name);
	}
	free(dir);
	return 0;
}

/* Open and parse every shard (one, for a single file). */
static int read_headers(struct wfs_st_import *im)
{
	char err[WFS_ST_ERR_MAX];
	int ret;

	if (ends_with(im->checkpoint, ".json")) {
		if ((ret = index_shards(im)) != 0)
			return ret;
	} else {
		im->shards = calloc(1, sizeof(*im->shards));
		if (!im->shards || !(im->shards[0].path = strdup(im->checkpoint)))
			return no_memory(im);
		im->shards[0].fd = -1;
		im->nshards = 1;
	}
	for (size_t i = 0; i < im->nshards; i++) {
		struct shard *s = &im->shards[i];

		s->fd = open(s->path, O_RDONLY | O_CLOEXEC);
		if (s->fd < 0)
			return fail(im, -errno, s->path, "%s", strerror(errno));
		ret = wfs_st_read_fd(s->fd, &s->st, err, sizeof(err));
		if (ret)
			return fail(im, ret, s->path, "%s", err);
	}
	return 0;
}

/* Gather all tensors, check them against the index, merge metadata. */
static int gather(struct wfs_st_import *im)
{
	char b[96];
	size_t n = 0;

	for (size_t i = 0; i < im->nshards; i++)
		n += im->shards[i].st->ntensors;
	im->items = calloc(n + 1, sizeof(*im->items));
	im->meta = wfs_st_new();
	if (!im->items || !im->meta)
		return no_memory(im);
	for (size_t i = 0; i < im->nshards; i++) {
		struct shard *s = &im->shards[i];

		for (size_t j = 0; j < s->st->ntensors; j++) {
			const struct wfs_st_tensor *t = &s->st->tensors[j];
			const char *mapped = im->index ? wfs_st_index_shard(im->index, t->name) : NULL;

			if (im->index && !mapped)
				return fail(im, -EINVAL, s->path, "tensor '%s' is not in the index's weight_map",
					    printable(t->name, b));
			if (im->index && strcmp(mapped, s->name) != 0)
				return fail(im, -EINVAL, im->checkpoint, "tensor '%s' is in %s, but the index maps it to %s",
					    printable(t->name, b), s->name, mapped);
			im->items[im->nitems].t = t;
			im->items[im->nitems++].shard = s;
			im->bytes += t->end - t->begin;
		}
		for (size_t j = 0; j < s->st->nmeta; j++) {
			const struct wfs_st_meta *m = &s->st->meta[j];

			for (size_t k = 0; k < im->meta->nmeta; k++)
				if (strcmp(im->meta->meta[k].key, m->key) == 0 &&
				    strcmp(im->meta->meta[k].value, m->value) != 0)
					return fail(im, -EINVAL, s->path, "__metadata__ '%s' differs from an earlier shard's",
						    printable(m->key, b));
			if (wfs_st_set_meta(im->meta, m->key, m->value))
				return no_memory(im);
		}
		if (s->st->has_metadata)
			im->meta->has_metadata = true;
	}
	return 0;
}

/* Every index entry has its tensor; names are unique and can be file names, "a" and "a/b" not both. */
static int check_names(struct wfs_st_import *im)
{
	char err[WFS_ST_ERR_MAX], b[96], b2[96];

	qsort(im->items, im->nitems, sizeof(*im->items), item_by_name);
	if (im->index && im->nitems != im->index->nentries) {
		for (size_t i = 0; i < im->index->nentries; i++) {
			struct wfs_st_tensor key = {.name = im->index->entries[i].name};
			struct item k = {.t = &key};

			if (!bsearch(&k, im->items, im->nitems, sizeof(*im->items), item_by_name))
				return fail(im, -EINVAL, im->checkpoint, "tensor '%s' is not in %s, where the index maps it",
					    printable(key.name, b), im->index->entries[i].shard);
		}
	}
	for (size_t i = 0; i < im->nitems; i++) {
		const char *name = im->items[i].t->name;

		if (i && strcmp(im->items[i - 1].t->name, name) == 0)
			return fail(im, -EINVAL, im->checkpoint, "tensor '%s' is in two shards", printable(name, b));
		if (wfs_st_name_check(name, err, sizeof(err)))
			return fail(im, -EINVAL, im->items[i].shard->path, "%s", err);
		for (const char *slash = strchr(name, '/'); slash; slash = strchr(slash + 1, '/')) {
			char prefix[PATH_MAX];
			struct wfs_st_tensor key = {.name = prefix};
			struct item k = {.t = &key};

			snprintf(prefix, sizeof(prefix), "%.*s", (int)(slash - name), name);
			if (bsearch(&k, im->items, im->nitems, sizeof(*im->items), item_by_name))
				return fail(im, -EINVAL, im->checkpoint, "tensor '%s' is also a directory of tensor '%s'",
					    printable(prefix, b), printable(name, b2));
		}
	}
	return 0;
}

int wfs_st_import_open(const char *checkpoint, const struct wfs_st_import_options *opt,
		       struct wfs_st_import **out)
{
	struct wfs_st_import *im = calloc(1, sizeof(*im));
	int ret;

	if (!im || !(im->checkpoint = strdup(checkpoint))) {
		free(im);
		if (opt && opt->error)
			opt->error(opt->ctx, NULL, strerror(ENOMEM));
		return -ENOMEM;
	}
	if (opt)
		im->opt = *opt;
	im->copy.stop = im->opt.stop;
	im->copy.progress = copied;
	im->copy.ctx = im;
	ret = read_headers(im);
	if (ret == 0)
		ret = gather(im);
	if (ret == 0)
		ret = check_names(im);
	if (ret) {
		wfs_st_import_free(im);
		return ret;
	}
	*out = im;
	return 0;
}

/*
 * Is the regular file @path (@st its lstat) tensor @it already: the same dtype and shape
 * attributes, size and content? The content is compared by digest: the file's user.weightfs.digest
 * on weightfs (no read), else its bytes hashed; the tensor's bytes are hashed where they lie in the
 * checkpoint. Returns 1 (the same), 0 (different), or -errno of reading either (reported).
 */
static int same_tensor(struct wfs_st_import *im, const struct item *it, const char *path, const struct stat *st)
{
	const struct wfs_st_tensor *t = it->t;
	uint64_t dims[WFS_SHAPE_MAX_DIMS];
	char text[512];
	struct wfs_digest have, want;
	unsigned ndim;
	ssize_t n;
	int ret, fd;

	if (!S_ISREG(st->st_mode) || (uint64_t)st->st_size != t->end - t->begin)
		return 0;
	n = lgetxattr(path, WFS_XATTR_DTYPE, text, sizeof(text) - 1);
	if (n < 0 || (size_t)n != strlen(t->dtype) || memcmp(text, t->dtype, (size_t)n) != 0)
		return 0;
	n = lgetxattr(path, WFS_XATTR_SHAPE, text, sizeof(text) - 1);
	if (n < 0 || wfs_shape_parse(text, (size_t)n, dims, &ndim) || ndim != t->ndim ||
	    (ndim && memcmp(dims, t->shape, ndim * sizeof(dims[0])) != 0))
		return 0;
	n = lgetxattr(path, WFS_XATTR_DIGEST, text, sizeof(text) - 1);
	if (n == WFS_DIGEST_HEX_CHARS) {
		text[n] = '\0';
		ret = wfs_digest_from_hex(text, &have);
	} else {
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			return fail(im, -errno, path, "cannot read it to compare: %s", strerror(errno));
		ret = wfs_digest_fd(fd, &have, NULL);
		close(fd);
	}
	if (ret)
		return fail(im, ret, path, "cannot read it to compare: %s", strerror(-ret));
	ret = wfs_digest_range(it->shard->fd, 8 + it->shard->st->header_bytes + t->begin, t->end - t->begin, &want);
	if (ret)
		return fail(im, ret, it->shard->path, "cannot read tensor '%s': %s", t->name,
			    strerror(ret == -ENODATA ? EIO : -ret));
	return wfs_digest_equal(&have, &want);
}

/*
 * Before writing anything: mark the tensors DIR already holds the same (same_tensor(): left as they
 * are, also with @force), refuse names that exist with other content (unless @force), a tensor whose
 * name is a directory there, a parent that is a file, and metadata that differs from DIR's (unless
 * @force).
 */
static int check_targets(struct wfs_st_import *im)
{
	char path[PATH_MAX], shown[PATH_MAX + 100], b[96];
	struct stat st;
	int ret;

	for (size_t i = 0; i < im->nitems; i++) {
		const char *name = im->items[i].t->name;

		for (const char *slash = strchr(name, '/'); slash; slash = strchr(slash + 1, '/')) {
			char prefix[PATH_MAX];

			snprintf(prefix, sizeof(prefix), "%.*s", (int)(slash - name), name);
			if (wfs_tf_path(path, im->dir, prefix) == 0 && stat(path, &st) == 0 && !S_ISDIR(st.st_mode))
				return fail(im, -ENOTDIR, path, "a file, but tensor '%s' needs it to be a directory",
					    printable(name, b));
		}
		if (wfs_tf_path(path, im->dir, name)) {
			snprintf(shown, sizeof(shown), "%s/%s", im->dir, printable(name, b));
			return fail(im, -ENAMETOOLONG, shown, "%s", strerror(ENAMETOOLONG));
		}
		if (lstat(path, &st) < 0)
			continue;
		if (S_ISDIR(st.st_mode))
			return fail(im, -EISDIR, path, "a directory, where tensor '%s' goes", printable(name, b));
		ret = same_tensor(im, &im->items[i], path, &st);
		if (ret < 0)
			return ret;
		if (ret == 1) {
			im->items[i].unchanged = true;
			im->unchanged++;
			continue;
		}
		if (!im->opt.force)
			return fail(im, -EEXIST, path, "exists with other content, dtype or shape (--force replaces it)");
		im->replaced++;
	}
	if (im->meta->has_metadata && !im->opt.force) {
		char *want, have[65536];
		size_t len;
		ssize_t n = lgetxattr(im->dir, WFS_XATTR_ST_META, have, sizeof(have));

		if (n >= 0) {
			if (wfs_st_meta_json(im->meta, &want, &len))
				return no_memory(im);
			if ((size_t)n != len || memcmp(have, want, len) != 0) {
				free(want);
				return fail(im, -EEXIST, im->dir,
					    "holds other safetensors metadata (%s; --force replaces it)", WFS_XATTR_ST_META);
			}
			free(want);
		}
	}
	return 0;
}

/* Report that setting xattr @name (@len bytes) on @path failed with @err (-errno). */
static int xattr_failed(const struct wfs_st_import *im, const char *path, const char *name, size_t len, int err)
{
	if (err == -ENOTSUP)
		return fail(im, err, path, "cannot set %s: the filesystem keeps no user xattrs, "
			    "so dtype and shape would be lost (import into a weightfs mount)", name);
	if (err == -E2BIG || err == -ERANGE || err == -ENOSPC)
		return fail(im, err, path, "cannot set %s: %zu bytes is over the filesystem's xattr size limit (%s)",
			    name, len, strerror(-err));
	return fail(im, err, path, "cannot set %s: %s", name, strerror(-err));
}

static int set_dir_xattr(const struct wfs_st_import *im, int fd, const char *name, const char *value, size_t len)
{
	return fsetxattr(fd, name, value, len, 0) == 0 ? 0 : xattr_failed(im, im->dir, name, len, -errno);
}

/* Write item @it by the tensor-file protocol, and say what failed. */
static int write_one(struct wfs_st_import *im, const struct item *it, unsigned long seq, bool datasync)
{
	const struct wfs_st_tensor *t = it->t;
	struct wfs_tf_spec spec = {
		.dtype = t->dtype, .shape = t->shape, .ndim = t->ndim, .src_fd = it->shard->fd,
		.src_offset = 8 + it->shard->st->header_bytes + t->begin, .bytes = t->end - t->begin,
		.datasync = datasync, .seq = seq,
	};
	struct wfs_tf_error e;
	char shown[PATH_MAX + 100], b[96];
	int ret = wfs_tf_write(im->dir, t->name, &spec, &im->copy, &e);

	if (ret == 0 || ret == -EINTR)
		return ret; /* an interruption is the caller's to report */
	switch (e.step) {
	case WFS_TF_MKDIR:
		return fail(im, ret, e.path, "cannot make the directory: %s", strerror(-ret));
	case WFS_TF_NAME:
		snprintf(shown, sizeof(shown), "%s/%s", im->dir, printable(t->name, b));
		return fail(im, ret, shown, "%s", strerror(-ret));
	case WFS_TF_CREATE:
		return fail(im, ret, e.path, "%s", strerror(-ret));
	case WFS_TF_XATTR:
		return xattr_failed(im, e.path, e.xattr, e.xattr_bytes, ret);
	case WFS_TF_DATA:
		if (ret == -ENODATA)
			return fail(im, ret, it->shard->path, "ended inside tensor '%s' (the file got shorter)",
				    printable(t->name, b));
		return fail(im, ret, e.path, "%s", strerror(-ret));
	case WFS_TF_RENAME:
		return fail(im, ret, e.path, "cannot rename %s into place: %s", e.tmpname, strerror(-ret));
	}
	return ret;
}

int wfs_st_import_run(struct wfs_st_import *im, const char *dir)
{
	char *text;
	size_t len;
	bool datasync;
	int fd, ret;

	if (snprintf(im->dir, sizeof(im->dir), "%s", dir) >= (int)sizeof(im->dir))
		return fail(im, -ENAMETOOLONG, dir, "%s", strerror(ENAMETOOLONG));
	ret = wfs_tf_mkdirs(im->dir);
	if (ret)
		return fail(im, ret, im->dir, "cannot make the directory: %s", strerror(-ret));
	datasync = !wfs_st_on_weightfs(im->dir); /* on weightfs close(2) seals durably */
	if ((ret = check_targets(im)) != 0)
		return ret;
	/* In file order: each shard is read front to back. */
	qsort(im->items, im->nitems, sizeof(*im->items), item_by_file);
	im->progress.tensors_total = im->nitems;
	im->progress.bytes_total = im->bytes;
	progress(im);
	for (size_t i = 0; i < im->nitems; i++) {
		if (im->items[i].unchanged)
			im->progress.bytes_done += im->items[i].t->end - im->items[i].t->begin;
		else if ((ret = write_one(im, &im->items[i], (unsigned long)i, datasync)) != 0)
			return ret;
		im->progress.tensors_done++;
		progress(im);
	}
	fd = open(im->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return fail(im, -errno, im->dir, "%s", strerror(errno));
	if (im->meta->has_metadata) {
		if (wfs_st_meta_json(im->meta, &text, &len)) {
			close(fd);
			return no_memory(im);
		}
		ret = set_dir_xattr(im, fd, WFS_XATTR_ST_META, text, len);
		free(text);
	}
	if (ret == 0 && im->index && im->index->metadata)
		ret = set_dir_xattr(im, fd, WFS_XATTR_ST_INDEX, im->index->metadata, strlen(im->index->metadata));
	/* On weightfs, fsync of a directory makes the namespace (the renames) durable. */
	if (ret == 0 && fsync(fd) < 0 && errno != EINVAL && errno != ENOSYS)
		ret = fail(im, -errno, im->dir, "fsync: %s", strerror(errno));
	close(fd);
	return ret;
}

void wfs_st_import_summary(const struct wfs_st_import *im, struct wfs_st_import_summary *s)
{
	*s = (struct wfs_st_import_summary){
		.shards = im->nshards,
		.tensors = im->nitems,
		.tensors_done = im->progress.tensors_done,
		.bytes = im->bytes,
		.replaced = im->replaced,
		.unchanged = im->unchanged,
		.metadata = im->meta && im->meta->has_metadata,
		.index_metadata = im->index && im->index->metadata,
	};
}

void wfs_st_import_free(struct wfs_st_import *im)
{
	if (!im)
		return;
	for (size_t i = 0; i < im->nshards; i++) {
		if (im->shards[i].fd >= 0)
			close(im->shards[i].fd);
		free(im->shards[i].path);
		wfs_st_free(im->shards[i].st);
	}
	free(im->shards);
	free(im->items);
	wfs_st_free(im->meta);
	wfs_st_index_free(im->index);
	wfs_copy_release(&im->copy);
	free(im->checkpoint);
	free(im);
}
