/* SPDX-License-Identifier: Apache-2.0 */
/* gc.h: the removal of objects no name refers to. */
#include "gc.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weightfs.h"

struct unref {
	struct wfs_digest digest;
	uint64_t bytes;
};

struct unref_list {
	struct unref *v;
	size_t n, cap;
};

static int collect_one(void *ctx, const struct wfs_digest *d, uint64_t bytes)
{
	struct unref_list *l = ctx;

	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 256;
		struct unref *p = realloc(l->v, cap * sizeof(*p));

		if (!p)
			return 1;
		l->v = p;
		l->cap = cap;
	}
	l->v[l->n].digest = *d;
	l->v[l->n].bytes = bytes;
	l->n++;
	return 0;
}

/*
 * Remove unreferenced objects not in use, least recently released first, while those left take more
 * than @retain bytes (@retain 0: all of them) or fewer than @want bytes are removed.
 */
static int collect(struct wfs_store *s, struct wfs_catalog *c, uint64_t retain, uint64_t want, bool dry_run,
		   bool (*in_use)(void *ctx, const struct wfs_digest *d), void *ctx, struct wfs_gc_report *r)
{
	struct unref_list l = {0};
	uint64_t total = 0;
	int ret;

	memset(r, 0, sizeof(*r));
	ret = wfs_catalog_unreferenced(c, collect_one, &l); /* oldest release first */
	if (ret)
		goto out;
	for (size_t i = 0; i < l.n; i++)
		if (!in_use || !in_use(ctx, &l.v[i].digest))
			total += l.v[i].bytes;
	for (size_t i = 0; i < l.n; i++) {
		struct unref *u = &l.v[i];
		bool busy = in_use && in_use(ctx, &u->digest);

		/* Within the budget stays; with no budget at all, even empty objects go. */
		if (busy || (total <= retain && retain > 0 && r->bytes_removed >= want)) {
			r->objects_kept++;
			r->bytes_kept += u->bytes;
			continue;
		}
		if (!dry_run) {
			ret = wfs_catalog_object_delete(c, &u->digest);
			if (ret == -EBUSY || ret == -ENOENT) { /* referenced again, or already gone */
				ret = 0;
				continue;
			}
			if (ret)
				goto out;
			ret = wfs_store_object_remove(s, &u->digest);
			if (ret == -ENOENT)
				ret = 0;
			if (ret)
				goto out;
		}
		total -= u->bytes;
		r->objects_removed++;
		r->bytes_removed += u->bytes;
	}
out:
	free(l.v);
	return ret;
}

int wfs_gc_collect(struct wfs_store *s, struct wfs_catalog *c, uint64_t retain, bool dry_run,
		   bool (*in_use)(void *ctx, const struct wfs_digest *d), void *ctx, struct wfs_gc_report *r)
{
	return collect(s, c, retain, 0, dry_run, in_use, ctx, r);
}

int wfs_gc_evict(struct wfs_store *s, struct wfs_catalog *c, uint64_t bytes,
		 bool (*in_use)(void *ctx, const struct wfs_digest *d), void *ctx, struct wfs_gc_report *r)
{
	/* A budget of every byte keeps all but the @bytes removed first. */
	return collect(s, c, UINT64_MAX, bytes, false, in_use, ctx, r);
}

struct orphans {
	struct wfs_store *s;
	struct wfs_catalog *c;
	bool dry_run;
	struct wfs_gc_report *r;
};

static int orphan_entry(void *ctx, const struct wfs_store_entry *e)
{
	struct orphans *o = ctx;
	uint64_t refcount;
	int ret;

	if (!e->object)
		return 0;
	ret = wfs_catalog_object_get(o->c, &e->digest, &refcount, NULL);
	if (ret != -ENOENT)
		return ret; /* listed (0), or the catalog failed */
	if (!o->dry_run) {
		ret = wfs_store_object_remove(o->s, &e->digest);
		if (ret && ret != -ENOENT)
			return ret;
	}
	o->r->orphans_removed++;
	o->r->orphan_bytes_removed += (uint64_t)e->st.st_size;
	return 0;
}

int wfs_gc_orphans(struct wfs_store *s, struct wfs_catalog *c, bool dry_run, struct wfs_gc_report *r)
{
	struct orphans o = {.s = s, .c = c, .dry_run = dry_run, .r = r};

	r->orphans_removed = r->orphan_bytes_removed = 0;
	return wfs_store_walk(s, orphan_entry, &o);
}

int wfs_gc(const char *path, uint64_t retain, bool dry_run, struct wfs_gc_report *r)
{
	struct wfs_catalog *c = NULL;
	struct wfs_store *s = NULL;
	char db[PATH_MAX];
	int ret;

	ret = wfs_store_open(path, dry_run ? WFS_STORE_READONLY : 0, &s);
	if (ret)
		return ret;
	snprintf(db, sizeof(db), "%s/" WFS_STORE_CATALOG, path);
	ret = wfs_catalog_open(db, dry_run ? WFS_CATALOG_READONLY : 0, 0, 0, &c);
	if (ret == 0)
		ret = wfs_gc_collect(s, c, retain, dry_run, NULL, NULL, r);
	if (ret == 0)
		ret = wfs_gc_orphans(s, c, dry_run, r);
	wfs_catalog_close(c);
	wfs_store_close(s);
	return ret;
}

int wfs_gc_quarantine(const char *path, bool dry_run, uint64_t *files, uint64_t *bytes)
{
	struct wfs_store *s = NULL;
	int ret = wfs_store_open(path, dry_run ? WFS_STORE_READONLY : 0, &s);

	*files = *bytes = 0;
	if (ret == 0)
		ret = wfs_store_quarantine_clear(s, dry_run, files, bytes);
	wfs_store_close(s);
	return ret;
}

int wfs_parse_size(const char *text, uint64_t *bytes)
{
	static const char units[] = "KMGTP";
	char *end;
	double v;
	int shift = 0;

	errno = 0;
	v = strtod(text, &end);
	/* Decimal digits and a point only: strtod also takes "0x10", "1e3", "inf" and a sign. */
	if (end == text || errno || v < 0 || isnan(v) || (size_t)(end - text) != strspn(text, "0123456789."))
		return -EINVAL;
	if (*end) {
		const char *u = strchr(units, *end == 'k' ? 'K' : *end);

		if (!u || !*u)
			return -EINVAL;
		shift = 10 * (int)(u - units + 1);
		end++;
		if (*end == 'i')
			end++;
		if (*end == 'B')
			end++;
		if (*end)
			return -EINVAL;
	}
	v = ldexp(v, shift);
	if (v >= 18446744073709551615.0)
		return -EINVAL;
	*bytes = (uint64_t)v;
	return 0;
}
