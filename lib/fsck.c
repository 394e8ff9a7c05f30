/* SPDX-License-Identifier: Apache-2.0 */
/* fsck.h: a store's check (objects, catalog, invariants) and its repair. */
#include "fsck.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "digest.h"
#include "mounts.h"
#include "store.h"
#include "weightfs.h"

static const char *const kind_names[WFS_FSCK_KINDS] = {
	[WFS_FSCK_CORRUPT] = "corrupt",   [WFS_FSCK_MISSING] = "missing", [WFS_FSCK_ORPHAN] = "orphan",
	[WFS_FSCK_STRAY] = "stray",       [WFS_FSCK_MODE] = "mode",       [WFS_FSCK_CATALOG] = "catalog",
	[WFS_FSCK_TMP] = "tmp",           [WFS_FSCK_QUARANTINED] = "quarantined",
};

const char *wfs_fsck_kind_name(enum wfs_fsck_kind kind)
{
	return kind < WFS_FSCK_KINDS ? kind_names[kind] : "?";
}

uint64_t wfs_fsck_unrepaired(const struct wfs_fsck_report *r)
{
	uint64_t n = 0;

	for (int k = 0; k < WFS_FSCK_KINDS; k++)
		if (k != WFS_FSCK_QUARANTINED)
			n += r->found[k] - r->repaired[k];
	return n;
}

/* An object file found under objects/. */
struct object_file {
	struct wfs_digest digest;
	uint64_t bytes;
	mode_t mode;
};

struct fsck {
	const struct wfs_fsck_options *opt;
	struct wfs_fsck_report *report;
	struct wfs_store *store;     /* read-write when offline, else read-only */
	struct wfs_catalog *catalog;
	int dir_fd;                  /* STORE */
	struct wfs_object_row *rows; /* catalog objects, digest order */
	size_t nrows, caprows;
	bool *row_seen;
	struct object_file *files;   /* objects/ contents, digest order */
	size_t nfiles, capfiles;
	struct timespec start;
};

static void finding(struct fsck *f, enum wfs_fsck_kind kind, const char *what, const char *detail,
		    bool repaired)
{
	f->report->found[kind]++;
	if (repaired)
		f->report->repaired[kind]++;
	if (f->opt->finding)
		f->opt->finding(f->opt->ctx, kind, what, detail, repaired);
}

static int digest_cmp(const void *a, const void *b)
{
	return memcmp(a, b, WFS_DIGEST_BYTES); /* both structs start with their digest */
}

static int add_row(void *ctx, const struct wfs_object_row *row)
{
	struct fsck *f = ctx;

	if (f->nrows == f->caprows) {
		size_t cap = f->caprows ? 2 * f->caprows : 1024;
		struct wfs_object_row *p = realloc(f->rows, cap * sizeof(*p));

		if (!p)
			return 1;
		f->rows = p;
		f->caprows = cap;
	}
	f->rows[f->nrows++] = *row;
	return 0;
}

/* Move STORE/objects/@sub/@name (not a digest) to STORE/quarantine/stray.@sub.@name. */
static bool quarantine_stray(struct fsck *f, const char *sub, const char *name)
{
	char from[PATH_MAX], to[PATH_MAX];

	mkdirat(f->dir_fd, WFS_STORE_QUARANTINE, 0755);
	snprintf(from, sizeof(from), WFS_STORE_OBJECTS "/%s%s%s", sub, *name ? "/" : "", name);
	snprintf(to, sizeof(to), WFS_STORE_QUARANTINE "/stray.%s%s%s", sub, *name ? "." : "", name);
	return renameat(f->dir_fd, from, f->dir_fd, to) == 0;
}

/* One entry of objects/ (wfs_store_walk): an object into f->files; a stray is reported (and with
 * repair, moved aside). */
static int list_entry(void *ctx, const struct wfs_store_entry *e)
{
	struct fsck *f = ctx;
	char what[PATH_MAX];

	if (!e->object) {
		snprintf(what, sizeof(what), WFS_STORE_OBJECTS "/%s%s%s", e->sub, *e->name ? "/" : "", e->name);
		finding(f, WFS_FSCK_STRAY, what,
			*e->name ? "not an object (name is not a digest, or not a file)" : "not an object directory",
			f->opt->repair && quarantine_stray(f, e->sub, e->name));
		return 0;
	}
	if (f->nfiles == f->capfiles) {
		size_t cap = f->capfiles ? 2 * f->capfiles : 1024;
		struct object_file *p = realloc(f->files, cap * sizeof(*p));

		if (!p)
			return -ENOMEM;
		f->files = p;
		f->capfiles = cap;
	}
	f->files[f->nfiles++] =
		(struct object_file){.digest = e->digest, .bytes = (uint64_t)e->st.st_size, .mode = e->st.st_mode};
	return 0;
}

/* List objects/ into f->files, sorted by digest. */
static int list_objects(struct fsck *f)
{
	int ret = wfs_store_walk(f->store, list_entry, f);

	if (ret == 0 && f->nfiles)
		qsort(f->files, f->nfiles, sizeof(*f->files), digest_cmp);
	return ret;
}

/* Sleep as needed so that @done bytes since the start stay within the rate limit. */
static void throttle(struct fsck *f, uint64_t done)
{
	struct timespec now;
	double elapsed, due;

	if (!f->opt->rate)
		return;
	clock_gettime(CLOCK_MONOTONIC, &now);
	elapsed = (double)(now.tv_sec - f->start.tv_sec) + (double)(now.tv_nsec - f->start.tv_nsec) / 1e9;
	due = (double)done / (double)f->opt->rate;
	if (due > elapsed) {
		double wait = due - elapsed;
		struct timespec ts = {.tv_sec = (time_t)wait, .tv_nsec = (long)((wait - (double)(time_t)wait) * 1e9)};

		nanosleep(&ts, NULL);
	}
}

static void check_files(struct fsck *f)
{
	uint64_t total = 0, done = 0;
	char hex[WFS_DIGEST_HEX_CHARS + 1], detail[128];

	for (size_t i = 0; i < f->nfiles; i++)
		total += f->files[i].bytes;
	clock_gettime(CLOCK_MONOTONIC, &f->start);
	for (size_t i = 0; i < f->nfiles; i++) {
		struct object_file *of = &f->files[i];
		struct wfs_object_row *row =
			f->nrows ? bsearch(&of->digest, f->rows, f->nrows, sizeof(*f->rows), digest_cmp) : NULL;
		struct wfs_digest got;
		uint64_t bytes;
		int fd, ret;

		wfs_digest_to_hex(&of->digest, hex);
		if (row)
			f->row_seen[row - f->rows] = true;
		if (!row) {
			/* Online, a seal may be between its link and its commit: not an orphan yet. */
			if (!f->report->online)
				finding(f, WFS_FSCK_ORPHAN, hex, "object file the catalog does not list",
					f->opt->repair && wfs_store_object_remove(f->store, &of->digest) == 0);
			continue;
		}
		if (of->mode & 0222) {
			char name[34], p[64];

			wfs_store_object_name(&of->digest, name);
			snprintf(p, sizeof(p), WFS_STORE_OBJECTS "/%s", name);
			finding(f, WFS_FSCK_MODE, hex, "object file is writable",
				f->opt->repair && fchmodat(f->dir_fd, p, 0444, 0) == 0);
		}
		fd = wfs_store_object_open(f->store, &of->digest, 0);
		ret = fd < 0 ? fd : wfs_digest_fd(fd, &got, &bytes);
		if (fd >= 0)
			close(fd);
		f->report->objects_checked++;
		f->report->bytes_checked += of->bytes;
		done += of->bytes;
		if (ret == 0 && (!wfs_digest_equal(&got, &of->digest) || bytes != row->bytes)) {
			snprintf(detail, sizeof(detail), "bytes do not match the digest (%llu bytes, catalog %llu)",
				 (unsigned long long)bytes, (unsigned long long)row->bytes);
			finding(f, WFS_FSCK_CORRUPT, hex, detail,
				f->opt->repair && wfs_store_object_quarantine(f->store, &of->digest) == 0 &&
					wfs_catalog_object_set_state(f->catalog, &of->digest,
								     WFS_OBJECT_QUARANTINED) == 0);
		} else if (ret && ret != -ENOENT) {
			snprintf(detail, sizeof(detail), "cannot read: %s", strerror(-ret));
			finding(f, WFS_FSCK_CORRUPT, hex, detail, false);
		}
		if (f->opt->progress)
			f->opt->progress(f->opt->ctx, done, total, i + 1, f->nfiles);
		throttle(f, done);
	}
}

static void check_rows(struct fsck *f)
{
	char hex[WFS_DIGEST_HEX_CHARS + 1], detail[128];

	for (size_t i = 0; i < f->nrows; i++) {
		struct wfs_object_row *row = &f->rows[i];
		bool repaired = false;

		if (f->row_seen[i])
			continue;
		wfs_digest_to_hex(&row->digest, hex);
		if (row->refcount == 0) {
			/* Unused and gone (a crash between two steps of a delete): just forget it. */
			repaired = f->opt->repair && wfs_catalog_object_delete(f->catalog, &row->digest) == 0;
			finding(f, WFS_FSCK_MISSING, hex, "unused catalog object without a file", repaired);
			continue;
		}
		if (row->state == WFS_OBJECT_QUARANTINED)
			snprintf(detail, sizeof(detail), "quarantined; %llu names fail with EIO until the "
				 "content is written again", (unsigned long long)row->refcount);
		else
			snprintf(detail, sizeof(detail), "object file missing; %llu names fail with EIO until "
				 "the content is written again", (unsigned long long)row->refcount);
		finding(f, WFS_FSCK_MISSING, hex, detail, false);
	}
}

static void check_catalog(struct fsck *f)
{
	struct wfs_catalog_check *c = &f->report->catalog;
	char detail[160];
	bool repaired;

	if (wfs_catalog_check(f->catalog, f->opt->repair, c))
		return;
	repaired = f->opt->repair;
	if (!c->integrity_ok)
		finding(f, WFS_FSCK_CATALOG, WFS_STORE_CATALOG, "SQLite integrity check failed", false);
	if (c->refcounts_wrong) {
		snprintf(detail, sizeof(detail), "%llu object refcounts differ from the inodes naming them",
			 (unsigned long long)c->refcounts_wrong);
		finding(f, WFS_FSCK_CATALOG, WFS_STORE_CATALOG, detail, repaired);
	}
	if (c->digests_without_row) {
		snprintf(detail, sizeof(detail), "%llu digests named by inodes have no object row",
			 (unsigned long long)c->digests_without_row);
		finding(f, WFS_FSCK_CATALOG, WFS_STORE_CATALOG, detail, repaired);
	}
	if (c->dangling_dentries) {
		snprintf(detail, sizeof(detail), "%llu names point at missing inodes",
			 (unsigned long long)c->dangling_dentries);
		finding(f, WFS_FSCK_CATALOG, WFS_STORE_CATALOG, detail, repaired);
	}
	if (c->nlink_wrong) {
		snprintf(detail, sizeof(detail), "%llu link counts are wrong", (unsigned long long)c->nlink_wrong);
		finding(f, WFS_FSCK_CATALOG, WFS_STORE_CATALOG, detail, repaired);
	}
}

/*
 * Entries of STORE/@dir (tmp or quarantine), reported. Nothing is removed here: tmp leftovers go when
 * repair opens the store read-write (wfs_store_open), quarantine is kept for inspection.
 */
static void check_dir(struct fsck *f, const char *dir, enum wfs_fsck_kind kind)
{
	int fd = openat(f->dir_fd, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *e;

	if (!d) {
		if (fd >= 0)
			close(fd);
		return;
	}
	while ((e = readdir(d)) != NULL) {
		char what[PATH_MAX];

		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		snprintf(what, sizeof(what), "%s/%s", dir, e->d_name);
		finding(f, kind, what, kind == WFS_FSCK_TMP ? "leftover of an interrupted write" :
			"moved aside (digest mismatch, or not an object)",
			kind == WFS_FSCK_TMP && f->opt->repair);
	}
	closedir(d);
}

/* 1 when a daemon holds STORE/lock, 0 when not, or -errno. */
static int store_locked(const char *path)
{
	char p[PATH_MAX], real[PATH_MAX], dir[PATH_MAX];
	int fd, ret;

	snprintf(p, sizeof(p), "%s/lock", path);
	fd = open(p, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	/* A daemon just unmounted (fusermount3 -u returns before it exits) holds the lock a moment
	 * longer, with no mount of the store left here: wait up to 5 s for it, as wfs_store_open() does,
	 * rather than call the store mounted. One that still serves a mount is online at once. */
	for (int tries = 0;; tries++) {
		if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
			ret = 0; /* released by close */
			break;
		}
		ret = errno == EWOULDBLOCK ? 1 : -errno;
		if (ret != 1 || tries == 50 || !realpath(path, real) || wfs_mounts_of(real, false, dir) != -ENOENT)
			break;
		usleep(100000);
	}
	close(fd);
	return ret;
}

int wfs_fsck(const char *path, const struct wfs_fsck_options *opt, struct wfs_fsck_report *report)
{
	struct fsck f = {.opt = opt, .report = report, .dir_fd = -1};
	char db[PATH_MAX];
	int ret;

	memset(report, 0, sizeof(*report));
	ret = wfs_store_open(path, WFS_STORE_READONLY, &f.store); /* is it a store at all? */
	if (ret)
		return ret;
	ret = store_locked(path);
	if (ret < 0)
		goto out;
	report->online = ret == 1;
	if (report->online && opt->repair) {
		ret = -EBUSY;
		goto out;
	}
	f.dir_fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (f.dir_fd < 0) {
		ret = -errno;
		goto out;
	}
	/* Offline, tmp/ holds only leftovers; opening the store read-write (for repair) removes them. */
	if (!report->online)
		check_dir(&f, WFS_STORE_TMP, WFS_FSCK_TMP);
	if (opt->repair) {
		wfs_store_close(f.store);
		f.store = NULL;
		ret = wfs_store_open(path, 0, &f.store);
		if (ret)
			goto out;
	}
	snprintf(db, sizeof(db), "%s/" WFS_STORE_CATALOG, path);
	ret = wfs_catalog_open(db, opt->repair ? 0 : WFS_CATALOG_READONLY, 0, 0, &f.catalog);
	if (ret)
		goto out;

	check_catalog(&f);
	ret = wfs_catalog_objects(f.catalog, add_row, &f);
	if (ret == 0)
		ret = list_objects(&f);
	if (ret)
		goto out;
	f.row_seen = calloc(f.nrows + 1, sizeof(*f.row_seen));
	if (!f.row_seen) {
		ret = -ENOMEM;
		goto out;
	}
	check_files(&f);
	check_rows(&f);
	check_dir(&f, WFS_STORE_QUARANTINE, WFS_FSCK_QUARANTINED);
out:
	free(f.row_seen);
	free(f.rows);
	free(f.files);
	wfs_catalog_close(f.catalog);
	if (f.dir_fd >= 0)
		close(f.dir_fd);
	wfs_store_close(f.store);
	return ret;
}
