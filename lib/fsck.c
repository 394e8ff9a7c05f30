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
	[WFS_FSCK_UNCLEAN] = "unclean",   [WFS_FSCK_TMPNAME] = "tmpname", [WFS_FSCK_UNSEALED] = "unsealed",
};

/* What a damaged catalog means, the start of its finding (docs/integrity.md, "A damaged catalog"). */
#define CATALOG_DAMAGED "the names cannot be read or trusted (the objects stay, checked against their digests)"

const char *wfs_fsck_kind_name(enum wfs_fsck_kind kind)
{
	return kind < WFS_FSCK_KINDS ? kind_names[kind] : "?";
}

uint64_t wfs_fsck_unrepaired(const struct wfs_fsck_report *r)
{
	uint64_t n = 0;

	for (int k = 0; k < WFS_FSCK_KINDS; k++)
		if (k != WFS_FSCK_QUARANTINED && k != WFS_FSCK_UNSEALED)
			n += r->found[k] - r->repaired[k];
	return n;
}

/* An object file found under objects/. */
struct object_file {
	struct wfs_digest digest;
	uint64_t bytes;
	mode_t mode;
};

/* The paths of the names that use one object (wfs_catalog_object_paths), at most WFS_FSCK_NAMES_MAX. */
struct name_list {
	char *v[WFS_FSCK_NAMES_MAX];
	size_t n;       /* in @v */
	uint64_t total; /* names found, also past WFS_FSCK_NAMES_MAX */
};

struct fsck {
	const struct wfs_fsck_options *opt;
	struct wfs_fsck_report *report;
	const char *path;            /* STORE */
	struct wfs_store *store;     /* read-write when offline, else read-only; NULL: objects/ is lost */
	struct wfs_catalog *catalog;
	int dir_fd;                  /* STORE */
	struct wfs_object_row *rows; /* catalog objects, digest order */
	size_t nrows, caprows;
	bool *row_seen;
	struct object_file *files;   /* objects/ contents, digest order */
	size_t nfiles, capfiles;
	bool restored;               /* the catalog was rebuilt from its backup (rebuild) */
	struct timespec start;
};

static void finding_names(struct fsck *f, enum wfs_fsck_kind kind, const char *what, const char *detail,
			  const struct name_list *names, bool repaired)
{
	f->report->found[kind]++;
	if (repaired)
		f->report->repaired[kind]++;
	if (f->opt->finding)
		f->opt->finding(f->opt->ctx, kind, what, detail, names ? (const char *const *)names->v : NULL,
				names ? names->n : 0, repaired);
}

static void finding(struct fsck *f, enum wfs_fsck_kind kind, const char *what, const char *detail,
		    bool repaired)
{
	finding_names(f, kind, what, detail, NULL, repaired);
}

static int add_name(void *ctx, const char *path, uint64_t parent, uint64_t ino)
{
	struct name_list *l = ctx;

	(void)parent;
	(void)ino;
	l->total++;
	if (l->n < WFS_FSCK_NAMES_MAX && (l->v[l->n] = strdup(path)) != NULL)
		l->n++; /* (out of memory: counted, not told) */
	return 0;
}

static void names_free(struct name_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i]);
	l->n = 0;
	l->total = 0;
}

/*
 * A finding about object @d, with the names that use it (none when the catalog is damaged). With
 * @names_fail, the detail says how many names fail because of it (names, not files: hard links
 * count). @quarantined: repair moved the object to quarantine/, which repairs the finding only when
 * no name uses it; names that do still fail (only writing their content again heals them), so the
 * finding is left, as the next check finds it.
 */
static void finding_object(struct fsck *f, enum wfs_fsck_kind kind, const struct wfs_digest *d, const char *what,
			   const char *detail, bool names_fail, bool quarantined)
{
	static struct name_list names; /* large: not on the stack; fsck is one thread */
	const char *moved = quarantined ? "; moved to quarantine/" : "";
	bool repaired = quarantined;
	char text[400];

	if (quarantined)
		f->report->quarantined_now++;
	if (f->catalog && !f->report->catalog_damaged) {
		wfs_catalog_object_paths(f->catalog, d, add_name, &names); /* an error: the names so far */
		if (names_fail && names.total)
			snprintf(text, sizeof(text), "%s%s; %llu names fail with EIO until the content is written again",
				 detail, moved, (unsigned long long)names.total);
		else if (names_fail)
			snprintf(text, sizeof(text), "%s%s; no name uses it", detail, moved);
		else
			snprintf(text, sizeof(text), "%s%s", detail, moved);
		detail = text;
		repaired = quarantined && names.total == 0;
	}
	finding_names(f, kind, what, detail, &names, repaired);
	names_free(&names);
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
	int ret = f->store ? wfs_store_walk(f->store, list_entry, f) : 0; /* objects/ lost: none */

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
	bool repair = f->opt->repair && !f->report->catalog_damaged; /* nothing on a guess */

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
		if (f->report->catalog_damaged) {
			/* No names to go by: only whether the bytes hash to the file's name. */
			static struct wfs_object_row unknown;

			unknown.bytes = of->bytes;
			row = &unknown;
		} else if (!row && f->restored) {
			/* Written after the backup: its names are lost, its bytes may be written again. */
			finding(f, WFS_FSCK_ORPHAN, hex, "object file the rebuilt catalog does not list (written "
				"after its backup): kept as an unreferenced object, for reuse within the store's "
				"retention budget", repair && wfs_catalog_object_adopt(f->catalog, &of->digest,
										      of->bytes) == 0);
			continue;
		} else if (!row) {
			/* Online, a seal may be between its link and its commit: not an orphan yet. */
			if (!f->report->online)
				finding(f, WFS_FSCK_ORPHAN, hex, "object file the catalog does not list",
					repair && wfs_store_object_remove(f->store, &of->digest) == 0);
			continue;
		}
		if (of->mode & 0222) {
			char name[34], p[64];

			wfs_store_object_name(&of->digest, name);
			snprintf(p, sizeof(p), WFS_STORE_OBJECTS "/%s", name);
			finding(f, WFS_FSCK_MODE, hex, "object file is writable",
				repair && fchmodat(f->dir_fd, p, 0444, 0) == 0);
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
			finding_object(f, WFS_FSCK_CORRUPT, &of->digest, hex, detail, true,
				       repair && wfs_store_object_quarantine(f->store, &of->digest) == 0 &&
					       wfs_catalog_object_set_state(f->catalog, &of->digest,
									    WFS_OBJECT_QUARANTINED) == 0);
		} else if (ret && ret != -ENOENT) {
			snprintf(detail, sizeof(detail), "cannot read: %s", strerror(-ret));
			finding_object(f, WFS_FSCK_CORRUPT, &of->digest, hex, detail, true, false);
		}
		if (f->opt->progress)
			f->opt->progress(f->opt->ctx, done, total, i + 1, f->nfiles);
		throttle(f, done);
	}
}

static void check_rows(struct fsck *f)
{
	char hex[WFS_DIGEST_HEX_CHARS + 1];

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
		finding_object(f, WFS_FSCK_MISSING, &row->digest, hex,
			       row->state == WFS_OBJECT_QUARANTINED ? "quarantined" : "object file missing", true, false);
	}
}

/* How the catalog at @db is damaged (@err: what failed, a -errno, or 0 for the check) into @out. */
static void damage_text(const char *db, int err, char *out, size_t size)
{
	char why[256];
	int ret = wfs_catalog_diagnose(db, why, sizeof(why));

	if (ret == -ENOENT)
		snprintf(out, size, "missing");
	else if (ret == 1)
		snprintf(out, size, "damaged (SQLite: %s)", why);
	else
		snprintf(out, size, "damaged (%s)", err ? strerror(-err) : "SQLite integrity check failed");
}

/* No file at @db (the catalog's path): missing, not damaged. */
static bool catalog_missing(const char *db)
{
	return access(db, F_OK) < 0 && errno == ENOENT;
}

/* The backup's path into @backup (PATH_MAX bytes) and its time into @when ("" without one). */
static bool backup_of(struct fsck *f, char *backup, char *when, size_t when_bytes)
{
	struct stat st;
	struct tm tm;

	snprintf(backup, PATH_MAX, "%s/" WFS_STORE_CATALOG_BACKUP, f->path);
	when[0] = '\0';
	if (stat(backup, &st) < 0)
		return false;
	strftime(when, when_bytes, "%Y-%m-%d %H:%M:%S", localtime_r(&st.st_mtime, &tm));
	return true;
}

/*
 * The catalog at @db cannot be read, or failed SQLite's check (@err as damage_text): one finding
 * that says so and what to do, and from here on the names are unknown (f->report->catalog_damaged).
 */
static void catalog_damaged(struct fsck *f, const char *db, int err)
{
	char damage[320], backup[PATH_MAX], when[32], detail[900];

	if (f->report->catalog_damaged)
		return;
	f->report->catalog_damaged = true;
	damage_text(db, err, damage, sizeof(damage));
	if (backup_of(f, backup, when, sizeof(when)) && !f->opt->repair && catalog_missing(db))
		snprintf(detail, sizeof(detail), "%s: %s; weightfsctl fsck --repair restores it from "
			 WFS_STORE_CATALOG_BACKUP " (of %s; docs/integrity.md, A damaged catalog)", damage,
			 CATALOG_DAMAGED, when);
	else if (when[0] && !f->opt->repair)
		snprintf(detail, sizeof(detail), "%s: %s; weightfsctl fsck --repair rebuilds them from "
			 WFS_STORE_CATALOG_BACKUP " (of %s; docs/integrity.md, A damaged catalog)", damage,
			 CATALOG_DAMAGED, when);
	else
		snprintf(detail, sizeof(detail), "%s: %s; %s: with the store unmounted, keep a copy of catalog.db*, "
			 "then restore catalog.db from a backup of your own (docs/integrity.md, A damaged catalog)",
			 damage, CATALOG_DAMAGED, when[0] ? "its backup cannot be used either" : "no backup beside it");
	finding(f, WFS_FSCK_CATALOG, WFS_STORE_CATALOG, detail, false);
}

/*
 * Open the catalog, check it (with repair, fix its counts: refcounts, rows, dentries, links), and
 * read its object rows. Returns 0 (usable), 1 (damaged: *@err as damage_text), or -ENOMEM, -EACCES,
 * -EBUSY.
 */
static int open_catalog(struct fsck *f, const char *db, int *err)
{
	struct wfs_catalog_check *c = &f->report->catalog;
	int ret = wfs_catalog_open(db, f->opt->repair ? 0 : WFS_CATALOG_READONLY, 0, 0, &f->catalog);

	*err = ret;
	if (ret == -ENOMEM || ret == -EACCES || ret == -EBUSY)
		return ret;
	if (ret) /* missing beside objects (a store's catalog is made with it), or damaged */
		return 1;
	ret = wfs_catalog_check(f->catalog, false, c);
	if (ret == 0 && c->integrity_ok && f->opt->repair &&
	    (c->refcounts_wrong || c->digests_without_row || c->dangling_dentries || c->nlink_wrong))
		ret = wfs_catalog_check(f->catalog, true, c);
	if (ret == 0 && c->integrity_ok && (ret = wfs_catalog_objects(f->catalog, add_row, f)) != 0)
		f->nrows = 0; /* part of them: none is told as missing */
	*err = ret < 0 ? ret : ret ? -EIO : 0;
	return ret || !c->integrity_ok ? 1 : 0;
}

/*
 * With repair, a damaged catalog (@damage: how, damage_text) is rebuilt from its backup
 * (wfs_catalog_restore): one catalog finding, repaired, that says from when. Returns 0 when rebuilt
 * (f->restored; the catalog is closed), or -errno.
 */
static int rebuild(struct fsck *f, const char *db, const char *damage)
{
	char backup[PATH_MAX], aside[PATH_MAX], when[32], detail[900];
	bool missing = catalog_missing(db);
	const char *base;
	int ret;

	if (!backup_of(f, backup, when, sizeof(when)))
		return -ENOENT;
	wfs_catalog_close(f->catalog);
	f->catalog = NULL;
	f->nrows = 0;
	ret = wfs_catalog_restore(backup, db, aside);
	if (ret)
		return ret;
	base = strrchr(aside, '/') ? strrchr(aside, '/') + 1 : aside;
	snprintf(detail, sizeof(detail), "%s: %s from " WFS_STORE_CATALOG_BACKUP " of %s: names made, "
		 "renamed or removed after it are as they were then (objects written since are kept "
		 "unreferenced, names of objects removed since are missing)%s%.64s%s",
		 damage, missing ? "restored" : "rebuilt", when, missing ? "" : "; the damaged files are kept as ",
		 missing ? "" : base, missing ? "" : "*");
	finding(f, WFS_FSCK_CATALOG, WFS_STORE_CATALOG, detail, true);
	f->restored = true;
	return 0;
}

/* The catalog's own findings (its counts, checked by open_catalog), repaired with repair. */
static void check_catalog(struct fsck *f)
{
	struct wfs_catalog_check *c = &f->report->catalog;
	char detail[160];
	bool repaired = f->opt->repair;

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

/* What a damaged copy STORE/quarantine/@name is, into @detail (@size bytes); *@d gets its digest
 * when it is a quarantined object (named by its digest), and then true is returned, with *@names_fail
 * true when its names still fail. */
static bool quarantined_copy(struct fsck *f, const char *name, struct wfs_digest *d, char *detail, size_t size,
			     bool *names_fail)
{
	struct wfs_object_row *row;

	if (wfs_digest_from_hex(name, d) != 0) {
		snprintf(detail, size, "moved aside (not an object)");
		return false;
	}
	row = f->nrows ? bsearch(d, f->rows, f->nrows, sizeof(*f->rows), digest_cmp) : NULL;
	*names_fail = false;
	if (f->report->catalog_damaged)
		snprintf(detail, size, "damaged copy (its bytes did not match their digest)");
	else if (!row)
		snprintf(detail, size, "damaged copy of an object the catalog no longer lists");
	else if ((*names_fail = row->state == WFS_OBJECT_QUARANTINED || !f->store ||
				!wfs_store_object_exists(f->store, d)))
		snprintf(detail, size, "damaged copy");
	else
		snprintf(detail, size, "damaged copy; the content was written again since: its names read "
			 "intact bytes (gc --quarantine removes the copy)");
	return true;
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
		if (kind == WFS_FSCK_QUARANTINED) {
			struct wfs_digest digest;
			char detail[200];
			bool names_fail;

			if (quarantined_copy(f, e->d_name, &digest, detail, sizeof(detail), &names_fail))
				finding_object(f, kind, &digest, what, detail, names_fail, false);
			else
				finding(f, kind, what, detail, false);
			continue;
		}
		finding(f, kind, what, "leftover of an interrupted write", f->opt->repair);
	}
	closedir(d);
}

/*
 * The store's last owner did not close it (offline: f->report->unclean). With repair, the crash
 * recovery a mount would run (wfs_catalog_recover: never-sealed names and nameless inodes go) runs
 * now; fsck's own close of the store then marks it closed.
 */
static void check_unclean(struct fsck *f)
{
	struct wfs_fsck_report *r = f->report;
	struct wfs_recovery rec = {0};
	char detail[600];
	bool repaired;

	if (!r->unclean)
		return;
	repaired = f->opt->repair && !r->catalog_damaged && wfs_catalog_recover(f->catalog, &rec) == 0;
	snprintf(detail, sizeof(detail), "not closed by its last owner (pid %d%s%s): killed, crashed or a power "
		 "loss; %s", r->unclean_pid, r->unclean_what[0] ? ", " : "", r->unclean_what,
		 repaired ? "recovered now" : "the next mount (or fsck --repair) runs the recovery");
	if (repaired && (rec.unsealed_removed || rec.orphans_removed || rec.declared_empty_removed))
		snprintf(detail + strlen(detail), sizeof(detail) - strlen(detail),
			 ": %llu never-sealed names, %llu declared-but-empty temporary names and %llu nameless "
			 "inodes removed", (unsigned long long)rec.unsealed_removed,
			 (unsigned long long)rec.declared_empty_removed, (unsigned long long)rec.orphans_removed);
	finding(f, WFS_FSCK_UNCLEAN, "lock", detail, repaired);
}

/* A temporary name found in the namespace (check_tmpnames). */
struct tmpname {
	char *path;
	uint64_t parent, ino;
};

struct tmpnames {
	struct tmpname *v;
	size_t n, cap;
};

static int add_tmpname(void *ctx, const char *path, uint64_t parent, uint64_t ino)
{
	struct tmpnames *l = ctx;

	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 16;
		struct tmpname *p = realloc(l->v, cap * sizeof(*p));

		if (!p)
			return -ENOMEM;
		l->v = p;
		l->cap = cap;
	}
	l->v[l->n].path = strdup(path);
	if (!l->v[l->n].path)
		return -ENOMEM;
	l->v[l->n].parent = parent;
	l->v[l->n++].ino = ino;
	return 0;
}

/*
 * Offline: names of the tensor-file protocol's temporary files (WFS_TMP_PREFIX, and the older
 * WFS_TMP_PREFIX_IMPORT_OLD) left in the namespace by a writer that never renamed them into place.
 * Nothing else makes such names, and no writer runs offline, so repair removes them (the inode goes
 * with its last name; its object, if any, becomes unreferenced, for retention or gc).
 */
static int check_tmpnames(struct fsck *f)
{
	static const char *const prefixes[] = {WFS_TMP_PREFIX, WFS_TMP_PREFIX_IMPORT_OLD};
	struct tmpnames l = {0};
	int ret = 0;

	for (size_t p = 0; ret == 0 && p < sizeof(prefixes) / sizeof(prefixes[0]); p++)
		ret = wfs_catalog_prefixed_paths(f->catalog, prefixes[p], add_tmpname, &l);
	for (size_t i = 0; ret == 0 && i < l.n; i++) {
		struct tmpname *t = &l.v[i];
		const char *base = strrchr(t->path, '/') + 1;
		struct wfs_attr a, old;
		char detail[200];
		uint64_t declared, ino;
		bool repaired = false;

		if (wfs_catalog_getattr(f->catalog, t->ino, &a))
			continue;
		if (wfs_catalog_declared_bytes(f->catalog, t->ino, &declared) == 0)
			snprintf(detail, sizeof(detail), "temporary name of an interrupted write, never renamed into "
				 "place: holds %llu bytes, its dtype and shape declare %llu",
				 (unsigned long long)a.size, (unsigned long long)declared);
		else
			snprintf(detail, sizeof(detail), "temporary name of an interrupted write, never renamed into "
				 "place: holds %llu bytes", (unsigned long long)a.size);
		if (f->opt->repair && wfs_catalog_unlink(f->catalog, t->parent, base, false, &ino) == 0) {
			repaired = true;
			if (wfs_catalog_getattr(f->catalog, ino, &a) == 0 && a.nlink == 0)
				wfs_catalog_inode_drop(f->catalog, ino, &old);
		}
		finding(f, WFS_FSCK_TMPNAME, t->path, detail, repaired);
	}
	for (size_t i = 0; i < l.n; i++)
		free(l.v[i].path);
	free(l.v);
	return ret;
}

/*
 * Regular files never sealed (wfs_catalog_unsealed_paths). Offline, a seal that failed after
 * close(2) returned left them (they read EIO): repair removes their names, as the next mount's
 * recovery would. Online, files being written are among them: told, never repaired.
 */
static int check_unsealed(struct fsck *f)
{
	struct tmpnames l = {0};
	int ret = wfs_catalog_unsealed_paths(f->catalog, add_tmpname, &l);

	for (size_t i = 0; ret == 0 && i < l.n; i++) {
		bool repaired = f->opt->repair &&
				wfs_catalog_unlink_unsealed(f->catalog, l.v[i].ino, false, NULL, NULL) == 0;

		finding(f, WFS_FSCK_UNSEALED, l.v[i].path,
			f->report->online ? "never sealed: being written, or its seal failed after close(2) returned "
					    "(then it reads EIO until written again)"
					  : "never sealed: the daemon stopped while it was written, or its seal "
					    "failed after close(2) returned (the next mount removes it)",
			repaired);
	}
	for (size_t i = 0; i < l.n; i++)
		free(l.v[i].path);
	free(l.v);
	return ret;
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

/*
 * @path is a store that lost its objects/ directory (wfs_store_open: -ENOENT): its catalog, or the
 * backup of one, is there.
 */
static bool objects_lost(const char *path)
{
	char p[PATH_MAX];

	snprintf(p, sizeof(p), "%s/" WFS_STORE_OBJECTS, path);
	if (access(p, F_OK) == 0 || errno != ENOENT)
		return false;
	snprintf(p, sizeof(p), "%s/" WFS_STORE_CATALOG, path);
	if (access(p, F_OK) == 0)
		return true;
	snprintf(p, sizeof(p), "%s/" WFS_STORE_CATALOG_BACKUP, path);
	return access(p, F_OK) == 0;
}

int wfs_fsck(const char *path, const struct wfs_fsck_options *opt, struct wfs_fsck_report *report)
{
	struct wfs_fsck_options check_only = *opt;
	struct fsck f = {.opt = opt, .report = report, .path = path, .dir_fd = -1};
	char db[PATH_MAX];
	int ret, err;

	memset(report, 0, sizeof(*report));
	ret = wfs_store_open(path, WFS_STORE_READONLY, &f.store); /* is it a store at all? */
	if (ret == -ENOENT && objects_lost(path)) {
		/* Every object is gone: report what that breaks, change nothing (what to repair with?). */
		report->objects_lost = true;
		check_only.repair = false;
		f.opt = opt = &check_only;
	} else if (ret) {
		return ret;
	}
	ret = store_locked(path);
	if (ret < 0)
		goto out;
	report->online = ret == 1;
	if (report->online && opt->repair) {
		ret = -EBUSY;
		goto out;
	}
	if (!report->online && f.store)
		report->unclean = wfs_store_unclean(f.store, &report->unclean_pid, report->unclean_what,
						    sizeof(report->unclean_what));
	f.dir_fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (f.dir_fd < 0) {
		ret = -errno;
		goto out;
	}
	/* Offline, tmp/ holds only leftovers; opening the store read-write (for repair) removes them. */
	if (!report->online)
		check_dir(&f, WFS_STORE_TMP, WFS_FSCK_TMP);
	if (opt->repair && f.store) {
		wfs_store_close(f.store);
		f.store = NULL;
		ret = wfs_store_open(path, 0, &f.store);
		if (ret)
			goto out;
	}
	snprintf(db, sizeof(db), "%s/" WFS_STORE_CATALOG, path);
	ret = open_catalog(&f, db, &err);
	if (ret == 1 && opt->repair) {
		char damage[320];

		damage_text(db, err, damage, sizeof(damage));
		if (rebuild(&f, db, damage) == 0)
			ret = open_catalog(&f, db, &err);
	}
	if (ret < 0)
		goto out;
	if (ret == 1)
		catalog_damaged(&f, db, err);
	else
		check_catalog(&f);
	if (report->objects_lost)
		finding(&f, WFS_FSCK_MISSING, WFS_STORE_OBJECTS "/",
			"the objects directory is missing: every object the catalog lists is missing and every "
			"name with content fails with EIO (each listed below); fsck --repair changes nothing: "
			"restore objects/ from a backup of your own, or write the names again", false);
	check_unclean(&f);
	ret = list_objects(&f);
	if (ret)
		goto out;
	f.row_seen = calloc(f.nrows + 1, sizeof(*f.row_seen));
	if (!f.row_seen) {
		ret = -ENOMEM;
		goto out;
	}
	check_files(&f);
	if (!report->catalog_damaged)
		check_rows(&f);
	check_dir(&f, WFS_STORE_QUARANTINE, WFS_FSCK_QUARANTINED);
	if (!report->online && !report->catalog_damaged)
		ret = check_tmpnames(&f);
	if (ret == 0 && !report->catalog_damaged)
		ret = check_unsealed(&f);
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
