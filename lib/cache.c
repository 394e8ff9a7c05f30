/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Page cache of weightfs names, acted on through their object files (cache.h has the design).
 */
#include "cache.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <numa.h>
#include <numaif.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#ifdef WFS_HAVE_CUDA
#include "cudart.h"
#endif
#include "direct.h"
#include "mounts.h"
#include "stage.h"
#include "weightfs.h"

#define READ_CHUNK (2u << 20)
#define PAGES_PER_CALL 4096

struct object {
	char hex[33];
	int fd;
	uint64_t bytes;
};

struct group {
	struct wfs_cache_group pub;
	size_t *objs; /* indices into set->objs, distinct */
	size_t nobjs, cap;
};

struct wfs_cache_set {
	struct object *objs;
	size_t nobjs, cap;
	size_t *hash; /* open addressing: index + 1 into objs, 0 = empty; hcap a power of two */
	size_t hcap;
	struct group *groups;
	size_t ngroups, gcap;
	char **names; /* mounted names, for mounts without passthrough (their own page cache) */
	size_t nnames, ncap;
	/* The mount the last added path was on, and what its daemon said (mount_facts()): a set of
	 * many paths on one mount asks the daemon once. */
	char last_mnt[PATH_MAX];
	bool last_passthrough, last_hidden;
};

int wfs_cache_set_new(struct wfs_cache_set **out)
{
	struct wfs_cache_set *s = calloc(1, sizeof(*s));

	if (!s)
		return -ENOMEM;
	*out = s;
	return 0;
}

void wfs_cache_set_free(struct wfs_cache_set *set)
{
	if (!set)
		return;
	for (size_t i = 0; i < set->nobjs; i++)
		close(set->objs[i].fd);
	for (size_t i = 0; i < set->ngroups; i++) {
		free((char *)set->groups[i].pub.path);
		free(set->groups[i].objs);
	}
	for (size_t i = 0; i < set->nnames; i++)
		free(set->names[i]);
	free(set->names);
	free(set->groups);
	free(set->objs);
	free(set->hash);
	free(set);
}

size_t wfs_cache_set_groups(const struct wfs_cache_set *set)
{
	return set->ngroups;
}

const struct wfs_cache_group *wfs_cache_set_group(const struct wfs_cache_set *set, size_t i)
{
	return &set->groups[i].pub;
}

size_t wfs_cache_set_objects(const struct wfs_cache_set *set)
{
	return set->nobjs;
}

/* ---- the mount behind a path -------------------------------------------------------------------- */

/* Does the daemon serving @mnt read through passthrough (the mount root's user.weightfs.stats)? */
static bool mount_passthrough(const char *mnt)
{
	char buf[8192];
	ssize_t n = getxattr(mnt, WFS_XATTR_STATS, buf, sizeof(buf) - 1);

	if (n <= 0)
		return true;
	buf[n] = '\0';
	return !strstr(buf, "\"passthrough\": false") && !strstr(buf, "\"passthrough\":false");
}

/* For the mount at @mnt serving @store: does its daemon read through passthrough, and is its store
 * hidden from here (wfs_mounts_store_visible())? Asked of the daemon once per mount in a row. */
static void mount_facts(struct wfs_cache_set *set, const char *mnt, const char *store, bool *passthrough,
			bool *hidden)
{
	if (strcmp(set->last_mnt, mnt) != 0) {
		set->last_hidden = wfs_mounts_store_visible(mnt, store) == WFS_MOUNTS_EHIDDEN;
		set->last_passthrough = !set->last_hidden && mount_passthrough(mnt);
		snprintf(set->last_mnt, sizeof(set->last_mnt), "%s", mnt);
	}
	*passthrough = set->last_passthrough;
	*hidden = set->last_hidden;
}

/* ---- building a set ------------------------------------------------------------------------------ */

static size_t hash_hex(const char *hex)
{
	size_t h = 0;

	for (int i = 0; i < 16; i++)
		h = h * 16 + (size_t)(isdigit((unsigned char)hex[i]) ? hex[i] - '0' : (hex[i] | 0x20) - 'a' + 10);
	return h;
}

static int hash_grow(struct wfs_cache_set *s)
{
	size_t hcap = s->hcap ? 2 * s->hcap : 1024;
	size_t *h = calloc(hcap, sizeof(*h));

	if (!h)
		return -ENOMEM;
	for (size_t i = 0; i < s->nobjs; i++) {
		size_t j = hash_hex(s->objs[i].hex) & (hcap - 1);

		while (h[j])
			j = (j + 1) & (hcap - 1);
		h[j] = i + 1;
	}
	free(s->hash);
	s->hash = h;
	s->hcap = hcap;
	return 0;
}

/* Index of object @hex in the set, or SIZE_MAX; *@slot gets where to insert it. */
static size_t hash_find(const struct wfs_cache_set *s, const char *hex, size_t *slot)
{
	size_t j = hash_hex(hex) & (s->hcap - 1);

	while (s->hash[j]) {
		if (memcmp(s->objs[s->hash[j] - 1].hex, hex, 32) == 0)
			return s->hash[j] - 1;
		j = (j + 1) & (s->hcap - 1);
	}
	*slot = j;
	return SIZE_MAX;
}

#define GROW(arr, n, cap)                                                                                 \
	((n) < (cap) ? 0 : ({                                                                             \
		size_t nc_ = (cap) ? 2 * (cap) : 64;                                                        \
		void *p_ = realloc((arr), nc_ * sizeof(*(arr)));                                            \
		p_ ? ((arr) = p_, (cap) = nc_, 0) : -ENOMEM;                                                \
	}))

struct walk {
	struct wfs_cache_set *set;
	struct group *g;
	const char *store;
	bool names; /* keep mounted names (no passthrough) */
	char *err;
	size_t errlen;
	int direct_error; /* wfs_direct_open()'s answer when the store refused us */
};

static int add_file(struct walk *w, const char *path, const struct stat *st)
{
	struct wfs_cache_set *s = w->set;
	char hex[64], obj[PATH_MAX];
	size_t idx, slot = 0;
	ssize_t n;
	int fd;

	w->g->pub.files++;
	n = lgetxattr(path, WFS_XATTR_DIGEST, hex, sizeof(hex) - 1);
	if (n != 32) {
		if (n < 0 && errno == EACCES) {
			w->g->pub.unreadable++; /* another user's file: not this caller's to measure or drop */
			return 0;
		}
		if (n < 0 && errno == EIO) {
			w->g->pub.damaged++; /* its content failed its check: no object to act on */
			return 0;
		}
		if (n < 0 && errno != ENODATA) {
			int ret = -errno;

			snprintf(w->err, w->errlen, "%s: cannot read its digest: %s", path, strerror(-ret));
			return ret;
		}
		w->g->pub.unsealed++;
		return 0;
	}
	hex[32] = '\0';
	if ((s->nobjs + 1) * 2 > s->hcap && hash_grow(s))
		return -ENOMEM;
	idx = hash_find(s, hex, &slot);
	if (idx == SIZE_MAX) {
		snprintf(obj, sizeof(obj), "%s/objects/%.2s/%s", w->store, hex, hex + 2);
		fd = open(obj, O_RDONLY | O_CLOEXEC | O_NOATIME);
		if (fd < 0 && errno == EPERM) /* O_NOATIME needs ownership */
			fd = open(obj, O_RDONLY | O_CLOEXEC);
		if (fd < 0 && errno == EACCES) {
			/* Another user: the daemon hands out the object through the direct path, if it can. */
			int d = wfs_direct_open(path);

			if (d >= 0)
				fd = d;
			else
				errno = EACCES, w->direct_error = d;
		}
		if (fd < 0) {
			int ret = -errno;

			if (ret == -EACCES)
				snprintf(w->err, w->errlen,
					 "%s: cannot open its object file in store %s: permission denied (the store is "
					 "private to the user who mounted it: run this as that user or as root), and "
					 "the daemon's direct path did not hand it out: %s",
					 path, w->store, strerror(-w->direct_error));
			else
				snprintf(w->err, w->errlen, "%s: object %s: %s", path, obj, strerror(-ret));
			return ret == -EACCES ? WFS_CACHE_ESTORE : ret;
		}
		if (GROW(s->objs, s->nobjs, s->cap)) {
			close(fd);
			return -ENOMEM;
		}
		memcpy(s->objs[s->nobjs].hex, hex, 33);
		s->objs[s->nobjs].fd = fd;
		s->objs[s->nobjs].bytes = (uint64_t)st->st_size;
		idx = s->nobjs++;
		s->hash[slot] = idx + 1;
	}
	if (GROW(w->g->objs, w->g->nobjs, w->g->cap))
		return -ENOMEM;
	w->g->objs[w->g->nobjs++] = idx;
	if (w->names) {
		char *copy = strdup(path);

		if (!copy || GROW(s->names, s->nnames, s->ncap)) {
			free(copy);
			return -ENOMEM;
		}
		s->names[s->nnames++] = copy;
	}
	return 0;
}

/* walk()'s answer for an entry whose lstat() its directory's mode refuses (EACCES). */
#define WALK_NO_SEARCH 1

/*
 * Walk @path (a PATH_MAX buffer, restored on return); @top for the path given. Below it, a directory
 * the caller may not list (opendir: EACCES, another user's 0700 directory on an allow_other mount)
 * or search (lstat of its entries: EACCES) is skipped whole and counted once in unreadable_dirs, as
 * unreadable files are: what it holds is this caller's neither to measure nor to drop. Returns 0,
 * WALK_NO_SEARCH (@path's own lstat refused: its directory counts it, or the top reports it), or a
 * negative errno with w->err set.
 */
static int walk(struct walk *w, char *path, bool top)
{
	size_t len = strlen(path);
	struct dirent *e;
	struct stat st;
	int ret = 0;
	DIR *d;

	if (lstat(path, &st) < 0) {
		ret = -errno;
		if (ret == -EACCES && !top)
			return WALK_NO_SEARCH;
		snprintf(w->err, w->errlen, "%s: %s", path, strerror(-ret));
		return ret;
	}
	if (S_ISREG(st.st_mode))
		return add_file(w, path, &st);
	if (!S_ISDIR(st.st_mode))
		return 0;
	d = opendir(path);
	if (!d) {
		ret = -errno;
		if (ret == -EACCES && !top) {
			w->g->pub.unreadable_dirs++;
			return 0;
		}
		snprintf(w->err, w->errlen, "%s: %s", path, strerror(-ret));
		return ret;
	}
	while (ret == 0 && (e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (len + 1 + strlen(e->d_name) >= PATH_MAX) {
			snprintf(w->err, w->errlen, "%s/%s: path too long", path, e->d_name);
			ret = -ENAMETOOLONG;
			break;
		}
		snprintf(path + len, PATH_MAX - len, "/%s", e->d_name);
		ret = walk(w, path, false);
		path[len] = '\0';
	}
	closedir(d);
	if (ret == WALK_NO_SEARCH) {
		/* Listed but not searchable: its first entry's lstat said so, so nothing was added. */
		if (top) {
			snprintf(w->err, w->errlen, "%s: %s", path, strerror(EACCES));
			return -EACCES;
		}
		w->g->pub.unreadable_dirs++;
		ret = 0;
	}
	return ret;
}

/* Per-group distinctness for large groups: sort and squeeze out repeats. */
static int idx_cmp(const void *a, const void *b)
{
	size_t x = *(const size_t *)a, y = *(const size_t *)b;

	return x < y ? -1 : x > y;
}

int wfs_cache_set_add(struct wfs_cache_set *set, const char *path, char *err, size_t errlen)
{
	char real[PATH_MAX], mnt[PATH_MAX], store[PATH_MAX];
	size_t nobjs = set->nobjs, nnames = set->nnames;
	struct walk w = {.set = set, .err = err, .errlen = errlen};
	bool passthrough = true, hidden = false;
	struct group *g;
	size_t k = 0;
	int ret;

	if (!realpath(path, real)) {
		ret = -errno;
		snprintf(err, errlen, "%s: %s", path, strerror(-ret));
		return ret;
	}
	ret = wfs_mounts_holding(real, mnt, store);
	if (ret == -ENOENT)
		ret = -EMEDIUMTYPE;
	if (ret == 0)
		mount_facts(set, mnt, store, &passthrough, &hidden);
	if (ret == 0 && hidden) {
		char why[PATH_MAX + 256];

		snprintf(err, errlen, "%s: %s", path,
			 wfs_mounts_hidden_message(store, "acting on the page cache of its objects", why,
						   sizeof(why)));
		return WFS_MOUNTS_EHIDDEN;
	}
	if (ret) {
		snprintf(err, errlen, "%s: %s", path,
			 ret == -EMEDIUMTYPE ? "not on a weightfs mount" : strerror(-ret));
		return ret;
	}
	if (GROW(set->groups, set->ngroups, set->gcap))
		return -ENOMEM;
	g = &set->groups[set->ngroups];
	memset(g, 0, sizeof(*g));
	g->pub.path = strdup(path);
	if (!g->pub.path)
		return -ENOMEM;
	w.g = g;
	w.store = store;
	w.names = !passthrough;
	ret = walk(&w, real, true);
	if (ret) {
		/* Undo: close what this walk opened and forget its hash entries. */
		for (size_t i = nobjs; i < set->nobjs; i++)
			close(set->objs[i].fd);
		set->nobjs = nobjs;
		for (size_t i = nnames; i < set->nnames; i++)
			free(set->names[i]);
		set->nnames = nnames;
		free((char *)g->pub.path);
		free(g->objs);
		if (set->hcap)
			for (size_t j = 0; j < set->hcap; j++)
				if (set->hash[j] > nobjs)
					set->hash[j] = 0;
		if (set->hcap)
			hash_grow(set); /* rebuild: removing from open addressing breaks probe chains */
		return ret;
	}
	qsort(g->objs, g->nobjs, sizeof(*g->objs), idx_cmp);
	for (size_t i = 0; i < g->nobjs; i++)
		if (i == 0 || g->objs[i] != g->objs[i - 1])
			g->objs[k++] = g->objs[i];
	g->nobjs = k;
	g->pub.objects = k;
	set->ngroups++;
	return 0;
}

/* ---- residency ------------------------------------------------------------------------------------ */

int wfs_cache_node_of_task(pid_t tid)
{
	char path[64], buf[1024], *p;
	long cpu = -1;
	ssize_t n;
	int fd;

	if (tid <= 0 || numa_available() < 0)
		return -1;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)tid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	p = strrchr(buf, ')'); /* the command name may hold spaces */
	for (int field = 3; field <= 39 && p; field++) {
		p = strchr(p + 1, ' ');
		if (p && field == 39)
			cpu = strtol(p + 1, NULL, 10);
	}
	return cpu < 0 ? -1 : numa_node_of_cpu((int)cpu);
}

int wfs_cache_max_node(void)
{
	return numa_available() < 0 ? 0 : numa_max_node();
}

/* Bytes of object @o in its page @i: a page, or what is left of the object in its last one. */
static uint64_t page_bytes(const struct object *o, size_t i, size_t page)
{
	uint64_t start = (uint64_t)i * page;

	return o->bytes - start < page ? o->bytes - start : page;
}

/*
 * Does mincore(2) tell this process the truth about @fd's pages? Since Linux 5.0 it reports every
 * page as resident to a caller that neither owns the file nor may write it (a side channel closed),
 * and touching those "resident" pages for move_pages would read the whole file in. Objects belong
 * to the mounting user: another user, through the direct path, cannot measure them.
 */
static bool mincore_truthful(int fd)
{
	char proc[40];
	struct stat st;

	if (geteuid() == 0 || (fstat(fd, &st) == 0 && st.st_uid == geteuid()))
		return true;
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	return faccessat(AT_FDCWD, proc, W_OK, AT_EACCESS) == 0;
}

/* Add object @o's residency to @r. -EACCES: not measurable by this user (mincore_truthful()). */
static int object_residency(const struct object *o, bool per_node, struct wfs_cache_residency *r)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE), npages, done = 0;
	unsigned char *vec = NULL;
	void **addrs = NULL;
	int *status = NULL;
	void *map;
	int ret = 0;

	r->bytes += o->bytes;
	if (o->bytes == 0)
		return 0;
	if (!mincore_truthful(o->fd))
		return -EACCES;
	npages = (size_t)((o->bytes + page - 1) / page);
	map = mmap(NULL, (size_t)o->bytes, PROT_READ, MAP_SHARED, o->fd, 0);
	if (map == MAP_FAILED)
		return -errno;
	vec = malloc(npages);
	if (!vec) {
		ret = -ENOMEM;
		goto out;
	}
	if (mincore(map, (size_t)o->bytes, vec) < 0) {
		ret = -errno;
		goto out;
	}
	for (size_t i = 0; i < npages; i++)
		if (vec[i] & 1)
			r->resident_bytes += page_bytes(o, i, page);
	if (!per_node)
		goto out;
	if (numa_available() < 0) {
		for (size_t i = 0; i < npages; i++)
			if (vec[i] & 1)
				r->unknown_node_bytes += page_bytes(o, i, page);
		goto out;
	}
	/* move_pages reports only pages mapped here: touch the resident ones (readahead off, no I/O). */
	madvise(map, (size_t)o->bytes, MADV_RANDOM);
	addrs = malloc(PAGES_PER_CALL * sizeof(*addrs));
	status = malloc(PAGES_PER_CALL * sizeof(*status));
	if (!addrs || !status) {
		ret = -ENOMEM;
		goto out;
	}
	while (done < npages) {
		unsigned long n = 0;

		for (; done < npages && n < PAGES_PER_CALL; done++)
			if (vec[done] & 1) {
				volatile const char *p = (const char *)map + done * page;

				(void)*p;
				addrs[n++] = (void *)p;
			}
		if (n == 0)
			continue;
		if (move_pages(0, n, addrs, NULL, status, 0) < 0) {
			for (unsigned long i = 0; i < n; i++)
				status[i] = -errno;
		}
		for (unsigned long i = 0; i < n; i++) {
			/* Only the object's last page can be partial: it is the last address if present. */
			uint64_t b = (size_t)((const char *)addrs[i] - (const char *)map) / page + 1 == npages
					     ? page_bytes(o, npages - 1, page)
					     : page;

			if (status[i] >= 0 && status[i] < WFS_CACHE_MAX_NODES)
				r->node_bytes[status[i]] += b;
			else
				r->unknown_node_bytes += b;
		}

	}
out:
	free(status);
	free(addrs);
	free(vec);
	munmap(map, (size_t)o->bytes);
	return ret;
}

int wfs_cache_status(const struct wfs_cache_set *set, size_t group, bool per_node,
		     struct wfs_cache_residency *out)
{
	struct wfs_cache_residency r;
	int ret = 0;

	memset(&r, 0, sizeof(r));
	if (group == SIZE_MAX) {
		for (size_t i = 0; i < set->nobjs; i++) {
			int e = object_residency(&set->objs[i], per_node, &r);

			ret = ret ? ret : e;
		}
	} else {
		const struct group *g = &set->groups[group];

		for (size_t i = 0; i < g->nobjs; i++) {
			int e = object_residency(&set->objs[g->objs[i]], per_node, &r);

			ret = ret ? ret : e;
		}
	}
	*out = r;
	return ret;
}

int wfs_cache_residency_fd(int fd, uint64_t bytes, bool per_node, struct wfs_cache_residency *r)
{
	struct object o = {.fd = fd, .bytes = bytes};

	return object_residency(&o, per_node, r);
}

/* ---- drop ---------------------------------------------------------------------------------------- */

/* Resident bytes of @o, or WFS_CACHE_UNKNOWN when this user cannot measure them. */
static uint64_t resident_of(const struct object *o)
{
	struct wfs_cache_residency r;

	memset(&r, 0, sizeof(r));
	if (object_residency(o, false, &r) == -EACCES)
		return WFS_CACHE_UNKNOWN;
	return r.resident_bytes;
}

/* @a + @b, where either may be WFS_CACHE_UNKNOWN (then so is the sum). */
static uint64_t add_known(uint64_t a, uint64_t b)
{
	return a == WFS_CACHE_UNKNOWN || b == WFS_CACHE_UNKNOWN ? WFS_CACHE_UNKNOWN : a + b;
}

int wfs_cache_drop(const struct wfs_cache_set *set, uint64_t *before, uint64_t *after)
{
	uint64_t b = 0, a = 0;
	int ret = 0;

	for (size_t i = 0; i < set->nobjs; i++) {
		const struct object *o = &set->objs[i];
		uint64_t left;
		int e;

		if (before)
			b = add_known(b, resident_of(o));
		e = posix_fadvise(o->fd, 0, 0, POSIX_FADV_DONTNEED);
		left = resident_of(o);
		if (e == 0 && left && left != WFS_CACHE_UNKNOWN) {
			/* Dirty pages (a -o nosync mount's new objects) are written back first, then dropped. */
			fdatasync(o->fd);
			e = posix_fadvise(o->fd, 0, 0, POSIX_FADV_DONTNEED);
			left = resident_of(o);
		}
		ret = ret ? ret : -e;
		a = add_known(a, left);
	}
	for (size_t i = 0; i < set->nnames; i++) {
		int fd = open(set->names[i], O_RDONLY | O_CLOEXEC);

		if (fd >= 0) {
			posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
			close(fd);
		}
	}
	if (before)
		*before = b;
	if (after)
		*after = a;
	return ret;
}

/* ---- placement and load -------------------------------------------------------------------------- */

/* libnuma fills its node-to-CPU cache lazily and without a lock (see lib/stage.c). */
static pthread_mutex_t numa_lock = PTHREAD_MUTEX_INITIALIZER;

/* Bind the calling thread's memory policy (and with @run, its CPUs) to @node. 0 or -errno. */
static int bind_thread(int node, enum wfs_cache_policy policy, bool run)
{
	unsigned long mask[WFS_CACHE_MAX_NODES / (8 * sizeof(unsigned long))] = {0};
	int ret = 0;

	if (run) {
		pthread_mutex_lock(&numa_lock);
		if (numa_run_on_node(node) < 0)
			ret = -errno;
		pthread_mutex_unlock(&numa_lock);
		if (ret)
			return ret;
	}
	mask[node / (8 * sizeof(unsigned long))] |= 1ul << (node % (8 * sizeof(unsigned long)));
	if (set_mempolicy(policy == WFS_CACHE_BIND ? MPOL_BIND : MPOL_PREFERRED, mask, WFS_CACHE_MAX_NODES + 1) < 0)
		return -errno;
	return 0;
}

static int check_node(int node)
{
	if (node < 0)
		return 0;
	if (numa_available() < 0)
		return -ENOSYS;
	if (node > numa_max_node() || node >= WFS_CACHE_MAX_NODES || !numa_bitmask_isbitset(numa_nodes_ptr, (unsigned)node))
		return -EINVAL;
	return 0;
}

/* The calling thread's policy: MPOL_* into *@mode and its first node (-1 none) into *@node. */
static void current_policy(int *mode, int *node)
{
	unsigned long mask[WFS_CACHE_MAX_NODES / (8 * sizeof(unsigned long))] = {0};
	int m = -1;

	*node = -1;
	if (get_mempolicy(&m, mask, WFS_CACHE_MAX_NODES + 1, NULL, 0) < 0) {
		*mode = -1;
		return;
	}
	*mode = m;
	for (int i = 0; i < WFS_CACHE_MAX_NODES; i++)
		if (mask[i / (8 * sizeof(unsigned long))] & (1ul << (i % (8 * sizeof(unsigned long))))) {
			*node = i;
			break;
		}
}

/* Read @bytes of @fd through @buf (READ_CHUNK bytes), adding to *@progress. 0 or -errno. */
static int read_all(int fd, uint64_t bytes, char *buf, _Atomic uint64_t *progress)
{
	uint64_t off = 0;

	while (off < bytes) {
		size_t want = bytes - off < READ_CHUNK ? (size_t)(bytes - off) : READ_CHUNK;
		ssize_t n = pread(fd, buf, want, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			break; /* shorter than expected: nothing more to cache */
		off += (uint64_t)n;
		if (progress)
			atomic_fetch_add(progress, (uint64_t)n);
	}
	return 0;
}

int wfs_cache_read_fd(int fd, uint64_t bytes, int node, enum wfs_cache_policy policy, int *seen_mode,
		      int *seen_node)
{
	unsigned long old_mask[WFS_CACHE_MAX_NODES / (8 * sizeof(unsigned long))] = {0};
	int old_mode = MPOL_DEFAULT, m, n, ret;
	char *buf;

	ret = check_node(node);
	if (ret)
		return ret;
	buf = malloc(READ_CHUNK);
	if (!buf)
		return -ENOMEM;
	if (node >= 0) {
		if (get_mempolicy(&old_mode, old_mask, WFS_CACHE_MAX_NODES + 1, NULL, 0) < 0) {
			ret = -errno;
			goto out;
		}
		ret = bind_thread(node, policy, false);
		if (ret)
			goto out;
	}
	current_policy(&m, &n);
	if (seen_mode)
		*seen_mode = m;
	if (seen_node)
		*seen_node = n;
	ret = read_all(fd, bytes, buf, NULL);
	if (node >= 0)
		set_mempolicy(old_mode, old_mode == MPOL_DEFAULT ? NULL : old_mask, WFS_CACHE_MAX_NODES + 1);
out:
	free(buf);
	return ret;
}

struct wfs_cache_load {
	const struct wfs_cache_set *set;
	int node;
	enum wfs_cache_policy policy;
	pthread_t *threads;
	unsigned nthreads;
	_Atomic size_t next;       /* next object to take */
	_Atomic uint64_t done;     /* bytes read */
	_Atomic unsigned running;  /* threads not finished */
	uint64_t total;
	pthread_mutex_t lock;      /* protects error, msg */
	pthread_mutex_t join_lock; /* protects joined; taken before lock, never held by the threads */
	int error;
	char msg[256];
	bool joined;
};

static void load_fail(struct wfs_cache_load *l, int err, const char *what)
{
	pthread_mutex_lock(&l->lock);
	if (!l->error) {
		l->error = err;
		snprintf(l->msg, sizeof(l->msg), "%s: %s", what, strerror(-err));
	}
	pthread_mutex_unlock(&l->lock);
}

static void *load_thread(void *arg)
{
	struct wfs_cache_load *l = arg;
	char *buf = malloc(READ_CHUNK);
	size_t i;

	if (!buf) {
		load_fail(l, -ENOMEM, "read buffer");
		goto out;
	}
	if (l->node >= 0) {
		int ret = bind_thread(l->node, l->policy, true);

		if (ret) {
			load_fail(l, ret, "binding a reader thread to its NUMA node");
			goto out;
		}
	}
	while ((i = atomic_fetch_add(&l->next, 1)) < l->set->nobjs) {
		const struct object *o = &l->set->objs[i];
		int ret = read_all(o->fd, o->bytes, buf, &l->done);

		if (ret)
			load_fail(l, ret, o->hex);
	}
out:
	free(buf);
	atomic_fetch_sub(&l->running, 1);
	return NULL;
}

int wfs_cache_load_start(const struct wfs_cache_set *set, int node, enum wfs_cache_policy policy,
			 unsigned threads, struct wfs_cache_load **out)
{
	struct wfs_cache_load *l;
	int ret = check_node(node);

	if (ret)
		return ret;
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->set = set;
	l->node = node;
	l->policy = policy;
	l->nthreads = threads ? threads : 4;
	if (l->nthreads > set->nobjs)
		l->nthreads = set->nobjs ? (unsigned)set->nobjs : 1;
	for (size_t i = 0; i < set->nobjs; i++)
		l->total += set->objs[i].bytes;
	pthread_mutex_init(&l->lock, NULL);
	pthread_mutex_init(&l->join_lock, NULL);
	l->threads = calloc(l->nthreads, sizeof(*l->threads));
	if (!l->threads) {
		free(l);
		return -ENOMEM;
	}
	atomic_store(&l->running, l->nthreads);
	for (unsigned t = 0; t < l->nthreads; t++) {
		ret = -pthread_create(&l->threads[t], NULL, load_thread, l);
		if (ret) {
			/* The ones started finish the work; account the missing ones as finished. */
			atomic_fetch_sub(&l->running, l->nthreads - t);
			l->nthreads = t;
			if (t == 0) {
				free(l->threads);
				free(l);
				return ret;
			}
			break;
		}
	}
	*out = l;
	return 0;
}

bool wfs_cache_load_poll(struct wfs_cache_load *load, uint64_t *done, uint64_t *total)
{
	if (done)
		*done = atomic_load(&load->done);
	if (total)
		*total = load->total;
	return atomic_load(&load->running) == 0;
}

int wfs_cache_load_wait(struct wfs_cache_load *load, char *err, size_t errlen)
{
	int ret;

	pthread_mutex_lock(&load->join_lock);
	if (!load->joined) {
		for (unsigned t = 0; t < load->nthreads; t++)
			pthread_join(load->threads[t], NULL);
		load->joined = true;
	}
	pthread_mutex_unlock(&load->join_lock);
	pthread_mutex_lock(&load->lock);
	ret = load->error;
	if (ret && err)
		snprintf(err, errlen, "%s", load->msg);
	pthread_mutex_unlock(&load->lock);
	return ret;
}

void wfs_cache_load_free(struct wfs_cache_load *load)
{
	if (!load)
		return;
	wfs_cache_load_wait(load, NULL, 0);
	pthread_mutex_destroy(&load->lock);
	pthread_mutex_destroy(&load->join_lock);
	free(load->threads);
	free(load);
}

int wfs_cache_numa_node_of_device(int device)
{
#ifdef WFS_HAVE_CUDA
	const struct wfs_cudart *rt;
	char bus[32];

	if (wfs_cudart_get(&rt, NULL, 0) < 0 ||
	    rt->cudaDeviceGetPCIBusId(bus, (int)sizeof(bus), device) != cudaSuccess)
		return -ENODEV;
	for (char *p = bus; *p; p++)
		*p = (char)tolower((unsigned char)*p);
	return wfs_stage_numa_node_of_pci("/sys", bus);
#else
	(void)device;
	return -ENODEV;
#endif
}
