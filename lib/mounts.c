/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mounts — the weightfs entries of /proc/self/mounts, of /proc/self/mountinfo for device numbers,
 * and the fstab's entries above a path (mounts.h).
 */
#include "mounts.h"

#include <errno.h>
#include <limits.h>
#include <mntent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <paths.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/xattr.h>

#include <jansson.h>

#include "weightfs.h"

/* One line of the table: mount point, source, type and options, each up to a path long. */
#define LINE_BYTES (4 * PATH_MAX)

int wfs_mounts_each(int (*fn)(void *ctx, const struct wfs_mount *m), void *ctx)
{
	char *line = malloc(LINE_BYTES);
	struct mntent ent;
	FILE *f;
	int ret = 0;

	if (!line)
		return -ENOMEM;
	f = setmntent("/proc/self/mounts", "r");
	if (!f) {
		ret = -errno;
		free(line);
		return ret;
	}
	while (ret == 0 && getmntent_r(f, &ent, line, LINE_BYTES))
		if (strcmp(ent.mnt_type, WFS_MOUNT_TYPE) == 0)
			ret = fn(ctx, &(struct wfs_mount){.dir = ent.mnt_dir, .store = ent.mnt_fsname});
	if (ret == 0 && ferror(f))
		ret = -EIO;
	endmntent(f);
	free(line);
	return ret;
}

/* What a search looks for, and where its answer goes. */
struct search {
	const char *key;   /* a mount point, a store, or a path below a mount point */
	bool live;         /* of: only a mount whose daemon answers statfs */
	bool key_known;    /* of: key_st holds the store's identity */
	struct stat key_st;
	char *dir, *store; /* the answer (PATH_MAX bytes each), or NULL where not asked */
	size_t best;       /* below: length of the longest mount point found; 0: none */
	bool found;
};

static void answer(struct search *s, const struct wfs_mount *m)
{
	if (s->dir)
		snprintf(s->dir, PATH_MAX, "%s", m->dir);
	if (s->store)
		snprintf(s->store, PATH_MAX, "%s", m->store);
	s->found = true;
}

static int on_dir(void *ctx, const struct wfs_mount *m)
{
	struct search *s = ctx;

	if (strcmp(m->dir, s->key) == 0)
		answer(s, m); /* and go on: a later one is stacked on top of it */
	return 0;
}

static int of_store(void *ctx, const struct wfs_mount *m)
{
	struct search *s = ctx;
	struct statfs sf;
	struct stat st;

	if (strcmp(m->store, s->key) != 0 &&
	    (!s->key_known || stat(m->store, &st) < 0 || st.st_dev != s->key_st.st_dev ||
	     st.st_ino != s->key_st.st_ino))
		return 0;
	if (s->live && statfs(m->dir, &sf) < 0)
		return 0;
	answer(s, m);
	return 1;
}

static int holding(void *ctx, const struct wfs_mount *m)
{
	struct search *s = ctx;
	size_t n = strlen(m->dir);

	if (n < s->best || strncmp(s->key, m->dir, n) != 0 || (s->key[n] != '/' && !(n == 1 && m->dir[0] == '/')))
		return 0;
	answer(s, m);
	s->best = n;
	return 0;
}

/* Run search @s with @fn: 0 when it found a mount, -ENOENT when not, or wfs_mounts_each()'s error. */
static int search(int (*fn)(void *ctx, const struct wfs_mount *m), struct search *s)
{
	int ret = wfs_mounts_each(fn, s);

	if (ret < 0)
		return ret;
	return s->found ? 0 : -ENOENT;
}

int wfs_mounts_on(const char *dir, char *store)
{
	return search(on_dir, &(struct search){.key = dir, .store = store});
}

bool wfs_mounts_same_store(const char *a, const char *b)
{
	struct stat sa, sb;

	if (strcmp(a, b) == 0)
		return true;
	return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int wfs_mounts_of(const char *store, bool live, char *dir)
{
	struct search s = {.key = store, .live = live, .dir = dir};

	s.key_known = stat(store, &s.key_st) == 0 && S_ISDIR(s.key_st.st_mode);
	return search(of_store, &s);
}

int wfs_mounts_below(const char *path, char *dir, char *store)
{
	return search(holding, &(struct search){.key = path, .dir = dir, .store = store});
}

int wfs_mounts_holding(const char *path, char *dir, char *store)
{
	int ret = wfs_mounts_on(path, store);

	if (ret == 0) {
		snprintf(dir, PATH_MAX, "%s", path);
		return 0;
	}
	return ret == -ENOENT ? wfs_mounts_below(path, dir, store) : ret;
}

/* The unsigned integer of top-level key @key in the JSON object @json, into *@out. 0 or -ENOENT. */
static int json_u64(json_t *json, const char *key, unsigned long long *out)
{
	json_t *v = json_object_get(json, key);

	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return -ENOENT;
	*out = (unsigned long long)json_integer_value(v);
	return 0;
}

int wfs_mounts_store_visible(const char *dir, const char *store)
{
	unsigned long long dev, ino;
	char buf[16384];
	struct stat st;
	json_t *stats = NULL;
	ssize_t n;
	int ret = 0;

	if (stat(store, &st) < 0)
		return errno == ENOENT || errno == ENOTDIR ? WFS_MOUNTS_EHIDDEN : 0;
	n = getxattr(dir, WFS_XATTR_STATS, buf, sizeof(buf));
	if (n > 0)
		stats = json_loadb(buf, (size_t)n, 0, NULL);
	if (stats && json_u64(stats, "store_dev", &dev) == 0 && json_u64(stats, "store_ino", &ino) == 0 &&
	    ((unsigned long long)st.st_dev != dev || (unsigned long long)st.st_ino != ino))
		ret = WFS_MOUNTS_EHIDDEN;
	json_decref(stats);
	return ret;
}

const char *wfs_mounts_hidden_message(const char *store, const char *needs, char *out, size_t out_bytes)
{
	snprintf(out, out_bytes, "the store %s is not visible from this mount namespace (a container that sees "
		 "the mount only): %s needs the store's directory; bind-mount it into the container at the "
		 "same path, or run this on the host", store, needs);
	return out;
}

int wfs_mounts_device(const char *dir, char dev[WFS_MOUNT_DEV_BYTES])
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	char *line = NULL;
	size_t cap = 0;
	int ret = -ENOENT;

	if (!f)
		return -errno;
	while (getline(&line, &cap, f) > 0) {
		char majmin[WFS_MOUNT_DEV_BYTES], point[PATH_MAX], type[64], *sep = strstr(line, " - "), *in, *out;

		/* Fields: id, parent id, MAJ:MIN, root, mount point, ...; after " - ": type, source. */
		if (!sep || sscanf(line, "%*s %*s %31s %*s %4095s", majmin, point) != 2 ||
		    sscanf(sep + 3, "%63s", type) != 1 || strcmp(type, WFS_MOUNT_TYPE) != 0)
			continue;
		for (in = out = point; *in; out++) { /* undo the table's octal escapes (\040: a space) */
			if (in[0] == '\\' && in[1] >= '0' && in[1] <= '3' && in[2] && in[3]) {
				*out = (char)((in[1] - '0') * 64 + (in[2] - '0') * 8 + (in[3] - '0'));
				in += 4;
			} else {
				*out = *in++;
			}
		}
		*out = '\0';
		if (strcmp(point, dir) == 0) {
			snprintf(dev, WFS_MOUNT_DEV_BYTES, "%s", majmin);
			ret = 0; /* keep going: the last one is on top */
		}
	}
	free(line);
	fclose(f);
	return ret;
}

/* Is @dir the root of a mount now? A missing @dir is not. */
static bool mounted_on(const char *dir)
{
	struct statx stx;

	if (statx(AT_FDCWD, dir, AT_NO_AUTOMOUNT, STATX_BASIC_STATS, &stx) < 0)
		return false;
	return (stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) && (stx.stx_attributes & STATX_ATTR_MOUNT_ROOT);
}

int wfs_mounts_fstab_absent(const char *path, char *dir, char *source)
{
	const char *fstab = getenv("WFS_FSTAB");
	char *line = malloc(LINE_BYTES);
	struct mntent ent;
	size_t best = 0;
	FILE *f;
	int ret = 0;

	if (!line)
		return -ENOMEM;
	f = setmntent(fstab && *fstab ? fstab : _PATH_MNTTAB, "r");
	if (!f) {
		ret = errno == ENOENT ? -ENOENT : -errno;
		free(line);
		return ret;
	}
	while (getmntent_r(f, &ent, line, LINE_BYTES)) {
		size_t n = strlen(ent.mnt_dir);

		while (n > 1 && ent.mnt_dir[n - 1] == '/')
			ent.mnt_dir[--n] = '\0';
		if (ent.mnt_dir[0] != '/' || n == 1 || strcmp(ent.mnt_type, WFS_MOUNT_TYPE) == 0 ||
		    strcmp(ent.mnt_type, "swap") == 0 || n <= best || n >= PATH_MAX)
			continue;
		if (strncmp(path, ent.mnt_dir, n) != 0 || (path[n] != '\0' && path[n] != '/'))
			continue;
		best = n;
		memcpy(dir, ent.mnt_dir, n + 1);
		snprintf(source, PATH_MAX, "%s", ent.mnt_fsname);
	}
	ret = ferror(f) ? -EIO : 0;
	endmntent(f);
	free(line);
	if (ret)
		return ret;
	return best && !mounted_on(dir) ? 0 : -ENOENT;
}
