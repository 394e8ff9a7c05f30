/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Check suite for lib/fsck and lib/gc: a clean store, each kind of finding injected alone (and found
 * exactly once, with its kind and what), repair and what a second check finds after it, the online
 * (locked) check, the rate limit, gc's retention order, dry run and in-use callback, and
 * wfs_parse_size.
 *
 * Stores are built with the lib API (store + catalog, no FUSE). Damage the catalog has no API for
 * (a wrong refcount, a dangling dentry, a wrong link count) is written with raw SQL on catalog.db.
 * A store "held by a daemon" is the test process itself holding wfs_store_open() read-write: flock
 * is per open file description, so fsck's own attempt on a new descriptor fails as it would next to a
 * real daemon.
 */
#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "catalog.h"
#include "digest.h"
#include "fsck.h"
#include "gc.h"
#include "store.h"
#include "testutil.h"

#define ROOT WFS_ROOT_INO
#define KIB 1024u
#define MIB (1024u * KIB)
#define MAX_FINDINGS 32

static char store_dir[600];
static char db_path[700];
static struct wfs_store *store;
static struct wfs_catalog *cat;

/* ---- fixture --------------------------------------------------------------------------------- */

static void open_store_catalog(void)
{
	int ret = wfs_store_open(store_dir, WFS_STORE_CREATE | WFS_STORE_NOSYNC, &store);

	ck_assert_msg(ret == 0, "wfs_store_open(%s): %s", store_dir, strerror(-ret));
	ret = wfs_catalog_open(db_path, WFS_CATALOG_CREATE, 0, 0, &cat);
	ck_assert_msg(ret == 0, "wfs_catalog_open(%s): %s", db_path, strerror(-ret));
}

/* Let go of the store and catalog, as an unmount would: fsck then runs offline. */
static void close_store_catalog(void)
{
	wfs_catalog_close(cat);
	cat = NULL;
	wfs_store_close(store);
	store = NULL;
}

static void setup(void)
{
	tu_test_dir_setup();
	tu_path(store_dir, sizeof(store_dir), tu_test_dir, "store");
	tu_path(db_path, sizeof(db_path), store_dir, "catalog.db");
	open_store_catalog();
}

static void teardown(void)
{
	close_store_catalog();
	tu_test_dir_teardown();
}

/* ---- building a store ------------------------------------------------------------------------ */

/* "@store_dir/@rel" */
static void spath(char *buf, size_t len, const char *rel)
{
	tu_path(buf, len, store_dir, rel);
}

static void hex_of(const struct wfs_digest *d, char hex[WFS_DIGEST_HEX_CHARS + 1])
{
	wfs_digest_to_hex(d, hex);
}

static void object_path(char *buf, size_t len, const struct wfs_digest *d)
{
	char name[34], rel[64];

	wfs_store_object_name(d, name);
	snprintf(rel, sizeof(rel), "objects/%s", name);
	spath(buf, len, rel);
}

static void quarantine_path(char *buf, size_t len, const struct wfs_digest *d)
{
	char hex[WFS_DIGEST_HEX_CHARS + 1], rel[64];

	hex_of(d, hex);
	snprintf(rel, sizeof(rel), "quarantine/%s", hex);
	spath(buf, len, rel);
}

static bool exists(const char *path)
{
	struct stat st;

	return lstat(path, &st) == 0;
}

/* Publish @len bytes of pattern @seed as an object (no catalog row); its digest into *@d. */
static void put_object(size_t len, uint64_t seed, struct wfs_digest *d)
{
	unsigned char *buf = malloc(len ? len : 1);
	struct wfs_tmpfile t;
	bool existed = true;
	int ret;

	ck_assert_ptr_nonnull(buf);
	tu_fill(buf, len, seed);
	wfs_digest_buf(buf, len, d);
	ret = wfs_store_tmp_create(store, &t);
	ck_assert_msg(ret == 0, "tmp_create: %s", strerror(-ret));
	ck_assert_int_eq(tu_write_all(t.fd, buf, len), 0);
	ret = wfs_store_publish(store, &t, d, true, &existed);
	ck_assert_msg(ret == 0, "publish: %s", strerror(-ret));
	free(buf);
}

/* A sealed regular file @name in @parent holding @len bytes of pattern @seed. Returns its inode. */
static uint64_t put_file(uint64_t parent, const char *name, size_t len, uint64_t seed, struct wfs_digest *d)
{
	struct timespec t = {.tv_sec = 1700000000};
	struct wfs_attr a, old, out;
	struct wfs_digest dd;
	int ret;

	put_object(len, seed, d ? d : &dd);
	ret = wfs_catalog_create(cat, parent, name, S_IFREG | 0644, 0, 0, NULL, &a);
	ck_assert_msg(ret == 0, "create %s: %s", name, strerror(-ret));
	ret = wfs_catalog_set_content(cat, a.ino, d ? d : &dd, len, &t, NULL, 0, &old, &out);
	ck_assert_msg(ret == 0, "set_content %s: %s", name, strerror(-ret));
	return a.ino;
}

static uint64_t refcount_of(const struct wfs_digest *d)
{
	uint64_t n = 999;
	int ret = wfs_catalog_object_refcount(cat, d, &n);

	ck_assert_msg(ret == 0, "object_refcount: %s", strerror(-ret));
	return n;
}

/* Unlink @parent/@name, its only name, and drop the inode: its object becomes unreferenced. */
static void release(uint64_t parent, const char *name, const struct wfs_digest *d)
{
	struct wfs_attr old;
	uint64_t ino = 0;
	int ret = wfs_catalog_unlink(cat, parent, name, false, &ino);

	ck_assert_msg(ret == 0, "unlink %s: %s", name, strerror(-ret));
	ret = wfs_catalog_inode_drop(cat, ino, &old);
	ck_assert_msg(ret == 0, "inode_drop %s: %s", name, strerror(-ret));
	ck_assert(old.sealed);
	ck_assert(wfs_digest_equal(&old.digest, d));
	ck_assert_uint_eq(refcount_of(d), 0);
}

/* Run @sql on catalog.db through a connection of its own (the catalog has no raw-SQL API); it must
 * change exactly @rows rows. */
static void raw_sql(const char *sql, int rows)
{
	sqlite3 *db = NULL;
	char *err = NULL;
	int rc = sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READWRITE, NULL);

	ck_assert_msg(rc == SQLITE_OK, "sqlite3_open %s: %s", db_path, sqlite3_errstr(rc));
	sqlite3_busy_timeout(db, 5000);
	rc = sqlite3_exec(db, sql, NULL, NULL, &err);
	ck_assert_msg(rc == SQLITE_OK, "%s: %s", sql, err ? err : sqlite3_errstr(rc));
	ck_assert_msg(sqlite3_changes(db) == rows, "%s: %d rows changed, want %d", sql, sqlite3_changes(db),
		      rows);
	sqlite3_free(err);
	sqlite3_close(db);
}

/* Set objects.released of @d (unix seconds): it has second resolution, so tests set the order. */
static void set_released(const struct wfs_digest *d, int64_t released)
{
	char hex[WFS_DIGEST_HEX_CHARS + 1], sql[160];

	hex_of(d, hex);
	snprintf(sql, sizeof(sql), "UPDATE objects SET released = %lld WHERE digest = x'%s'",
		 (long long)released, hex);
	raw_sql(sql, 1);
}

struct row_probe {
	struct wfs_digest digest;
	bool found;
	struct wfs_object_row row;
};

static int probe_row(void *ctx, const struct wfs_object_row *row)
{
	struct row_probe *p = ctx;

	if (!wfs_digest_equal(&row->digest, &p->digest))
		return 0;
	p->found = true;
	p->row = *row;
	return 1;
}

/* The catalog's object row of @d, through a fresh read-only handle; false when there is none. */
static bool object_row(const struct wfs_digest *d, struct wfs_object_row *out)
{
	struct row_probe p = {.digest = *d};
	struct wfs_catalog *c = NULL;
	int ret = wfs_catalog_open(db_path, WFS_CATALOG_READONLY, 0, 0, &c);

	ck_assert_msg(ret == 0, "catalog_open read-only: %s", strerror(-ret));
	ret = wfs_catalog_objects(c, probe_row, &p);
	ck_assert_msg(ret == 0, "catalog_objects: %s", strerror(-ret));
	wfs_catalog_close(c);
	if (p.found)
		*out = p.row;
	return p.found;
}

/* Flip the byte at @off of object @d's file (made writable for it, then 0444 again). */
static void flip_byte(const struct wfs_digest *d, off_t off)
{
	char path[800];
	unsigned char b;
	int fd;

	object_path(path, sizeof(path), d);
	ck_assert_int_eq(chmod(path, 0644), 0);
	fd = open(path, O_RDWR);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &b, 1, off), 1);
	b ^= 0x5a;
	ck_assert_int_eq(pwrite(fd, &b, 1, off), 1);
	close(fd);
	ck_assert_int_eq(chmod(path, 0444), 0);
}

/* ---- running fsck ---------------------------------------------------------------------------- */

struct finding_rec {
	enum wfs_fsck_kind kind;
	char what[256];
	char detail[600];
	char names[512]; /* the names told with it, joined by ' ' */
	size_t nnames;
	bool repaired;
};

struct fsck_run {
	int ret;
	struct wfs_fsck_report r;
	struct finding_rec f[MAX_FINDINGS];
	size_t n;
	uint64_t progress_calls;
	uint64_t last_bytes_done, last_bytes_total, last_objects_done, last_objects_total;
};

static void on_finding(void *ctx, enum wfs_fsck_kind kind, const char *what, const char *detail,
		       const char *const *names, size_t nnames, bool repaired)
{
	struct fsck_run *x = ctx;
	size_t off = 0;

	if (x->n == MAX_FINDINGS)
		return;
	x->f[x->n].kind = kind;
	snprintf(x->f[x->n].what, sizeof(x->f[x->n].what), "%s", what);
	snprintf(x->f[x->n].detail, sizeof(x->f[x->n].detail), "%s", detail ? detail : "");
	x->f[x->n].names[0] = '\0';
	for (size_t i = 0; i < nnames && off < sizeof(x->f[x->n].names); i++)
		off += (size_t)snprintf(x->f[x->n].names + off, sizeof(x->f[x->n].names) - off, "%s%s",
					i ? " " : "", names[i]);
	x->f[x->n].nnames = nnames;
	x->f[x->n].repaired = repaired;
	x->n++;
}

static void on_progress(void *ctx, uint64_t bytes_done, uint64_t bytes_total, uint64_t objects_done,
			uint64_t objects_total)
{
	struct fsck_run *x = ctx;

	x->progress_calls++;
	x->last_bytes_done = bytes_done;
	x->last_bytes_total = bytes_total;
	x->last_objects_done = objects_done;
	x->last_objects_total = objects_total;
}

/* All findings of @x, one per line, for failure messages. */
static const char *dump(const struct fsck_run *x)
{
	static char buf[4096];
	size_t off = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < x->n && off < sizeof(buf); i++) {
		int k = snprintf(buf + off, sizeof(buf) - off, "\n  %s %s: %s%s", wfs_fsck_kind_name(x->f[i].kind),
				 x->f[i].what, x->f[i].detail, x->f[i].repaired ? " [repaired]" : "");

		if (k < 0)
			break;
		off += (size_t)k;
	}
	if (!x->n)
		snprintf(buf, sizeof(buf), " (no findings)");
	return buf;
}

static void fsck_opts(struct fsck_run *x, bool repair, uint64_t rate)
{
	struct wfs_fsck_options opt = {
		.repair = repair, .rate = rate, .finding = on_finding, .progress = on_progress, .ctx = x,
	};

	memset(x, 0, sizeof(*x));
	x->ret = wfs_fsck(store_dir, &opt, &x->r);
	/* The report's counters and the callback agree. */
	for (int k = 0; k < WFS_FSCK_KINDS; k++) {
		uint64_t found = 0, repaired = 0;

		for (size_t i = 0; i < x->n; i++) {
			found += x->f[i].kind == (enum wfs_fsck_kind)k;
			repaired += x->f[i].kind == (enum wfs_fsck_kind)k && x->f[i].repaired;
		}
		ck_assert_uint_eq(x->r.found[k], found);
		ck_assert_uint_eq(x->r.repaired[k], repaired);
	}
}

/* fsck that must run (return 0) and runs offline. */
static void fsck_ok(struct fsck_run *x, bool repair)
{
	fsck_opts(x, repair, 0);
	ck_assert_msg(x->ret == 0, "wfs_fsck(%s, repair=%d): %s", store_dir, repair, strerror(-x->ret));
	ck_assert(!x->r.online);
}

static uint64_t total_found(const struct fsck_run *x)
{
	uint64_t n = 0;

	for (int k = 0; k < WFS_FSCK_KINDS; k++)
		n += x->r.found[k];
	return n;
}

/* The only finding of @kind in @x (fails unless there is exactly one). */
static const struct finding_rec *one_of(const struct fsck_run *x, enum wfs_fsck_kind kind)
{
	const struct finding_rec *hit = NULL;

	ck_assert_msg(x->r.found[kind] == 1, "want one %s finding, got %llu:%s", wfs_fsck_kind_name(kind),
		      (unsigned long long)x->r.found[kind], dump(x));
	for (size_t i = 0; i < x->n; i++)
		if (x->f[i].kind == kind)
			hit = &x->f[i];
	ck_assert_ptr_nonnull(hit);
	return hit;
}

/* @x found exactly one thing: @kind about @what, repaired or not. */
static void expect_only(const struct fsck_run *x, enum wfs_fsck_kind kind, const char *what, bool repaired)
{
	const struct finding_rec *f = one_of(x, kind);
	uint64_t want_left;

	ck_assert_msg(total_found(x) == 1, "want only one %s finding:%s", wfs_fsck_kind_name(kind), dump(x));
	ck_assert_str_eq(f->what, what);
	ck_assert_msg(f->repaired == repaired, "%s %s: repaired=%d, want %d", wfs_fsck_kind_name(kind), what,
		      f->repaired, repaired);
	/* Quarantined objects and unsealed files are informational: never counted as left. */
	want_left = repaired || kind == WFS_FSCK_QUARANTINED || kind == WFS_FSCK_UNSEALED ? 0 : 1;
	ck_assert_uint_eq(wfs_fsck_unrepaired(&x->r), want_left);
}

static void expect_clean(const struct fsck_run *x)
{
	ck_assert_msg(total_found(x) == 0, "want no findings:%s", dump(x));
	ck_assert_uint_eq(wfs_fsck_unrepaired(&x->r), 0);
	ck_assert(x->r.catalog.integrity_ok);
}

/* ---- clean store ----------------------------------------------------------------------------- */

/* Two names share one object (dedup), one file is empty, plus a directory and a symlink. */
static void build_small_tree(struct wfs_digest d[3])
{
	struct wfs_attr a;
	uint64_t ino;

	put_file(ROOT, "a", 1000, 1, &d[0]);
	ck_assert_int_eq(wfs_catalog_create(cat, ROOT, "dir", S_IFDIR | 0755, 0, 0, NULL, &a), 0);
	put_file(a.ino, "b", 5000, 2, &d[1]);
	ino = put_file(a.ino, "a-again", 1000, 1, &d[0]);
	ck_assert_uint_gt(ino, ROOT);
	put_file(ROOT, "empty", 0, 3, &d[2]);
	ck_assert_int_eq(wfs_catalog_create(cat, ROOT, "link", S_IFLNK | 0777, 0, 0, "a", &a), 0);
	ck_assert_uint_eq(refcount_of(&d[0]), 2);
}

START_TEST(test_clean_store)
{
	struct wfs_digest d[3];
	struct fsck_run x;

	build_small_tree(d);
	close_store_catalog();
	fsck_ok(&x, false);
	expect_clean(&x);
	ck_assert_uint_eq(x.r.objects_checked, 3);
	ck_assert_uint_eq(x.r.bytes_checked, 1000 + 5000 + 0);
	ck_assert_uint_eq(x.r.catalog.refcounts_wrong, 0);
	ck_assert_uint_eq(x.r.catalog.unsealed, 0);
	/* Progress ends at the totals. */
	ck_assert_uint_eq(x.progress_calls, 3);
	ck_assert_uint_eq(x.last_objects_done, 3);
	ck_assert_uint_eq(x.last_objects_total, 3);
	ck_assert_uint_eq(x.last_bytes_done, 6000);
	ck_assert_uint_eq(x.last_bytes_total, 6000);

	/* Repair on a clean store changes nothing and finds nothing. */
	fsck_ok(&x, true);
	expect_clean(&x);
	ck_assert_uint_eq(x.r.objects_checked, 3);
	open_store_catalog();
	ck_assert_uint_eq(refcount_of(&d[0]), 2);
	ck_assert_uint_eq(refcount_of(&d[1]), 1);
}
END_TEST

START_TEST(test_empty_store)
{
	struct fsck_run x;

	close_store_catalog();
	fsck_ok(&x, false);
	expect_clean(&x);
	ck_assert_uint_eq(x.r.objects_checked, 0);
	ck_assert_uint_eq(x.r.bytes_checked, 0);
	ck_assert_uint_eq(x.progress_calls, 0);
}
END_TEST

START_TEST(test_not_a_store)
{
	struct fsck_run x;
	char other[sizeof(store_dir)];

	close_store_catalog();
	tu_path(other, sizeof(other), tu_test_dir, "nothing-here");
	ck_assert_int_eq(mkdir(other, 0755), 0);
	snprintf(store_dir, sizeof(store_dir), "%s", other);
	fsck_opts(&x, false, 0);
	ck_assert_int_eq(x.ret, -ENOENT);
	ck_assert_uint_eq(total_found(&x), 0);
	/* An inspection tool pointed at the wrong directory leaves it as it was. */
	ck_assert_int_eq(tu_count_files(other), 0);
	tu_path(store_dir, sizeof(store_dir), tu_test_dir, "store");
}
END_TEST

/* ---- corrupt --------------------------------------------------------------------------------- */

START_TEST(test_corrupt_flipped_byte)
{
	struct wfs_digest d, ok;
	char hex[WFS_DIGEST_HEX_CHARS + 1], path[800];
	struct fsck_run x;

	put_file(ROOT, "w", 64 * KIB, 10, &d);
	put_file(ROOT, "ok", 4 * KIB, 11, &ok);
	close_store_catalog();
	flip_byte(&d, 12345);
	hex_of(&d, hex);
	fsck_ok(&x, false);
	expect_only(&x, WFS_FSCK_CORRUPT, hex, false);
	ck_assert_uint_eq(x.r.objects_checked, 2);
	ck_assert_uint_eq(x.r.bytes_checked, 68 * KIB);
	/* A check without repair moves nothing. */
	object_path(path, sizeof(path), &d);
	ck_assert(exists(path));
	quarantine_path(path, sizeof(path), &d);
	ck_assert(!exists(path));
}
END_TEST

START_TEST(test_corrupt_truncated)
{
	struct wfs_digest d;
	char hex[WFS_DIGEST_HEX_CHARS + 1], path[800];
	struct fsck_run x;

	put_file(ROOT, "w", 10000, 12, &d);
	close_store_catalog();
	object_path(path, sizeof(path), &d);
	ck_assert_int_eq(truncate(path, 4000), 0);
	hex_of(&d, hex);
	fsck_ok(&x, false);
	expect_only(&x, WFS_FSCK_CORRUPT, hex, false);
	ck_assert_uint_eq(x.r.bytes_checked, 4000);
}
END_TEST

/* Repair quarantines a corrupt object, but its names still fail: the finding is not repaired and
 * is left (an honest exit status), the same as what a second check finds: the object listed as
 * quarantined, and its names as missing (only writing the content again heals them). */
START_TEST(test_corrupt_repair_quarantines)
{
	struct wfs_digest d, ok;
	char hex[WFS_DIGEST_HEX_CHARS + 1], qwhat[64], path[800];
	const struct finding_rec *f;
	struct wfs_object_row row;
	struct fsck_run x;
	void *data = NULL;
	size_t len = 0;

	put_file(ROOT, "w", 8000, 13, &d);
	put_file(ROOT, "ok", 100, 14, &ok);
	close_store_catalog();
	flip_byte(&d, 0);
	hex_of(&d, hex);
	snprintf(qwhat, sizeof(qwhat), "quarantine/%s", hex);

	fsck_ok(&x, true);
	f = one_of(&x, WFS_FSCK_CORRUPT);
	ck_assert_str_eq(f->what, hex);
	ck_assert(!f->repaired);
	ck_assert_msg(strstr(f->detail, "moved to quarantine/") && strstr(f->detail, "1 names fail with EIO"), "%s",
		      f->detail);
	f = one_of(&x, WFS_FSCK_QUARANTINED);
	ck_assert_str_eq(f->what, qwhat);
	ck_assert_msg(total_found(&x) == 2, "want corrupt + quarantined only:%s", dump(&x));
	ck_assert_uint_eq(wfs_fsck_unrepaired(&x.r), 1);
	ck_assert_uint_eq(x.r.quarantined_now, 1);

	/* The damaged bytes wait in STORE/quarantine/<hex>; objects/ no longer has them. */
	object_path(path, sizeof(path), &d);
	ck_assert(!exists(path));
	quarantine_path(path, sizeof(path), &d);
	ck_assert_int_eq(tu_read_file(path, &data, &len), 0);
	ck_assert_uint_eq(len, 8000);
	free(data);
	ck_assert(object_row(&d, &row));
	ck_assert_int_eq(row.state, WFS_OBJECT_QUARANTINED);
	ck_assert_uint_eq(row.refcount, 1);
	ck_assert(object_row(&ok, &row));
	ck_assert_int_eq(row.state, WFS_OBJECT_OK);

	/* Second check: only the unrepairable missing object and the quarantine listing remain. */
	fsck_ok(&x, false);
	f = one_of(&x, WFS_FSCK_MISSING);
	ck_assert_str_eq(f->what, hex);
	ck_assert(!f->repaired);
	ck_assert_ptr_nonnull(strstr(f->detail, "quarantined"));
	f = one_of(&x, WFS_FSCK_QUARANTINED);
	ck_assert_str_eq(f->what, qwhat);
	ck_assert_msg(total_found(&x) == 2, "want missing + quarantined only:%s", dump(&x));
	ck_assert_uint_eq(wfs_fsck_unrepaired(&x.r), 1);
	ck_assert_uint_eq(x.r.objects_checked, 1);

	/* Repair again cannot fix it and must not forget the row that names still use. */
	fsck_ok(&x, true);
	ck_assert_uint_eq(x.r.found[WFS_FSCK_MISSING], 1);
	ck_assert_uint_eq(x.r.repaired[WFS_FSCK_MISSING], 0);
	ck_assert_uint_eq(wfs_fsck_unrepaired(&x.r), 1);
	ck_assert(object_row(&d, &row));
	ck_assert_int_eq(row.state, WFS_OBJECT_QUARANTINED);
	ck_assert(exists(path));
}
END_TEST

/* A corrupt object no name uses: quarantining it fixes all there is (no name fails). */
START_TEST(test_corrupt_unused_repaired)
{
	struct wfs_digest d;
	char hex[WFS_DIGEST_HEX_CHARS + 1];
	struct fsck_run x;

	put_file(ROOT, "w", 8000, 15, &d);
	release(ROOT, "w", &d);
	close_store_catalog();
	flip_byte(&d, 0);
	hex_of(&d, hex);
	fsck_ok(&x, true);
	ck_assert(one_of(&x, WFS_FSCK_CORRUPT)->repaired);
	ck_assert_uint_eq(wfs_fsck_unrepaired(&x.r), 0);
}
END_TEST

/* A corrupt and a truncated object, both named: repair moves both aside, and says both are left,
 * as the next check does (it said "2 repaired, 0 left" and exit 0, and the next check 2 left). */
START_TEST(test_corrupt_repair_left_as_next_check)
{
	struct wfs_digest a, b;
	char path[800];
	struct fsck_run x;
	uint64_t left;

	put_file(ROOT, "a", 8000, 16, &a);
	put_file(ROOT, "b", 8000, 17, &b);
	close_store_catalog();
	flip_byte(&a, 10);
	object_path(path, sizeof(path), &b);
	ck_assert_int_eq(truncate(path, 50), 0);
	fsck_ok(&x, true);
	ck_assert_uint_eq(x.r.found[WFS_FSCK_CORRUPT], 2);
	ck_assert_uint_eq(x.r.repaired[WFS_FSCK_CORRUPT], 0);
	left = wfs_fsck_unrepaired(&x.r);
	ck_assert_uint_eq(left, 2);
	fsck_ok(&x, false);
	ck_assert_uint_eq(wfs_fsck_unrepaired(&x.r), left);
}
END_TEST

/* ---- missing --------------------------------------------------------------------------------- */

START_TEST(test_missing_used)
{
	struct wfs_digest d, ok;
	char hex[WFS_DIGEST_HEX_CHARS + 1], path[800];
	const struct finding_rec *f;
	struct wfs_object_row row;
	struct fsck_run x;

	put_file(ROOT, "gone", 3000, 20, &d);
	put_file(ROOT, "ok", 3000, 21, &ok);
	close_store_catalog();
	object_path(path, sizeof(path), &d);
	ck_assert_int_eq(unlink(path), 0);
	hex_of(&d, hex);

	fsck_ok(&x, false);
	expect_only(&x, WFS_FSCK_MISSING, hex, false);
	ck_assert_uint_eq(x.r.objects_checked, 1);
	ck_assert_uint_eq(x.r.bytes_checked, 3000);

	/* Not repairable: a name uses it, so the row stays. */
	fsck_ok(&x, true);
	f = one_of(&x, WFS_FSCK_MISSING);
	ck_assert_str_eq(f->what, hex);
	ck_assert(!f->repaired);
	ck_assert_uint_eq(wfs_fsck_unrepaired(&x.r), 1);
	ck_assert(object_row(&d, &row));
	ck_assert_uint_eq(row.refcount, 1);
}
END_TEST

START_TEST(test_missing_unused_forgotten)
{
	struct wfs_digest d;
	char hex[WFS_DIGEST_HEX_CHARS + 1], path[800];
	struct wfs_object_row row;
	struct fsck_run x;

	put_file(ROOT, "old", 2000, 22, &d);
	release(ROOT, "old", &d);
	close_store_catalog();
	object_path(path, sizeof(path), &d);
	ck_assert_int_eq(unlink(path), 0);
	hex_of(&d, hex);

	fsck_ok(&x, false);
	expect_only(&x, WFS_FSCK_MISSING, hex, false);
	ck_assert(object_row(&d, &row));

	fsck_ok(&x, true);
	expect_only(&x, WFS_FSCK_MISSING, hex, true);
	ck_assert(!object_row(&d, &row));

	fsck_ok(&x, false);
	expect_clean(&x);
}
END_TEST

/* ---- orphan ---------------------------------------------------------------------------------- */

START_TEST(test_orphan)
{
	struct wfs_digest d, ok;
	char hex[WFS_DIGEST_HEX_CHARS + 1], path[800];
	struct fsck_run x;

	put_file(ROOT, "ok", 1500, 30, &ok);
	put_object(2500, 31, &d); /* published, never sealed into a name: a crash between the two */
	close_store_catalog();
	hex_of(&d, hex);

	fsck_ok(&x, false);
	expect_only(&x, WFS_FSCK_ORPHAN, hex, false);
	ck_assert_uint_eq(x.r.objects_checked, 1); /* orphans are not hashed */
	ck_assert_uint_eq(x.r.bytes_checked, 1500);
	object_path(path, sizeof(path), &d);
	ck_assert(exists(path));

	fsck_ok(&x, true);
	expect_only(&x, WFS_FSCK_ORPHAN, hex, true);
	ck_assert(!exists(path));
	object_path(path, sizeof(path), &ok);
	ck_assert(exists(path));

	fsck_ok(&x, false);
	expect_clean(&x);
}
END_TEST

/* ---- stray ----------------------------------------------------------------------------------- */

START_TEST(test_stray_in_prefix_dir)
{
	char path[800];
	struct fsck_run x;
	struct wfs_digest ok;

	put_file(ROOT, "ok", 100, 40, &ok);
	close_store_catalog();
	spath(path, sizeof(path), "objects/ab");
	ck_assert(mkdir(path, 0755) == 0 || errno == EEXIST);
	spath(path, sizeof(path), "objects/ab/not-a-digest");
	ck_assert_int_eq(tu_write_file(path, "junk", 4, 0444), 0);

	fsck_ok(&x, false);
	expect_only(&x, WFS_FSCK_STRAY, "objects/ab/not-a-digest", false);
	ck_assert(exists(path));

	/* Repair moves it aside (never deletes what it cannot name), where it is then listed. */
	fsck_ok(&x, true);
	ck_assert_str_eq(one_of(&x, WFS_FSCK_STRAY)->what, "objects/ab/not-a-digest");
	ck_assert(one_of(&x, WFS_FSCK_STRAY)->repaired);
	ck_assert_str_eq(one_of(&x, WFS_FSCK_QUARANTINED)->what, "quarantine/stray.ab.not-a-digest");
	ck_assert_uint_eq(total_found(&x), 2);
	ck_assert(!exists(path));
	spath(path, sizeof(path), "quarantine/stray.ab.not-a-digest");
	ck_assert(exists(path));

	fsck_ok(&x, false);
	expect_only(&x, WFS_FSCK_QUARANTINED, "quarantine/stray.ab.not-a-digest", false);
	ck_assert_uint_eq(wfs_fsck_unrepaired(&x.r), 0); /* quarantine is informational */
}
END_TEST

/* objects/ holds only two-character prefix directories; anything else is stray. @what is "a path
 * under STORE" (fsck.h), as for strays inside a prefix directory. */
START_TEST(test_stray_top_level)
{
	char path[800], what_file[256], what_dir[256];
	struct fsck_run x;

	close_store_catalog();
	spath(path, sizeof(path), "objects/junk");
	ck_assert_int_eq(tu_write_file(path, "x", 1, 0644), 0);
	fsck_ok(&x, false);
	ck_assert_msg(total_found(&x) == 1, "want one stray:%s", dump(&x));
	snprintf(what_file, sizeof(what_file), "%s", one_of(&x, WFS_FSCK_STRAY)->what);
	ck_assert(!one_of(&x, WFS_FSCK_STRAY)->repaired);
	ck_assert_int_eq(unlink(path), 0);

	spath(path, sizeof(path), "objects/abc");
	ck_assert_int_eq(mkdir(path, 0755), 0);
	fsck_ok(&x, true);
	ck_assert_uint_eq(x.r.found[WFS_FSCK_STRAY], 1);
	snprintf(what_dir, sizeof(what_dir), "%s", one_of(&x, WFS_FSCK_STRAY)->what);
	ck_assert(one_of(&x, WFS_FSCK_STRAY)->repaired);
	ck_assert(!exists(path));
	spath(path, sizeof(path), "quarantine/stray.abc");
	ck_assert(exists(path));
	ck_assert_str_eq(one_of(&x, WFS_FSCK_QUARANTINED)->what, "quarantine/stray.abc");

	/* Paths under STORE, like "objects/ab/not-a-digest" above. */
	ck_assert_str_eq(what_file, "objects/junk");
	ck_assert_str_eq(what_dir, "objects/abc");
}
END_TEST

/* A name that parses as hex but is not what the store writes (upper case): the store can never open
 * or remove it by digest, so it is stray, not an orphan that repair could never remove. */
START_TEST(test_stray_upper_case)
{
	char hex[WFS_DIGEST_HEX_CHARS + 1], path[800], rel[64];
	struct wfs_digest d;
	struct fsck_run x;

	close_store_catalog();
	wfs_digest_buf("upper", 5, &d);
	hex_of(&d, hex);
	for (char *p = hex; *p; p++)
		if (*p >= 'a' && *p <= 'f')
			*p = (char)(*p - 'a' + 'A');
	snprintf(rel, sizeof(rel), "objects/%.2s", hex);
	spath(path, sizeof(path), rel);
	ck_assert(mkdir(path, 0755) == 0 || errno == EEXIST);
	snprintf(rel, sizeof(rel), "objects/%.2s/%s", hex, hex + 2);
	spath(path, sizeof(path), rel);
	ck_assert_int_eq(tu_write_file(path, "upper", 5, 0444), 0);

	fsck_ok(&x, true);
	ck_assert_msg(x.r.found[WFS_FSCK_STRAY] == 1 && x.r.repaired[WFS_FSCK_STRAY] == 1,
		      "upper-case object name: want one repaired stray:%s", dump(&x));
	ck_assert_str_eq(one_of(&x, WFS_FSCK_STRAY)->what, rel);
	ck_assert(!exists(path));
	fsck_ok(&x, false);
	ck_assert_uint_eq(wfs_fsck_unrepaired(&x.r), 0);
}
END_TEST

/* ---- mode ------------------------------------------------------------------------------------ */

START_TEST(test_mode)
{
	struct wfs_digest d;
	char hex[WFS_DIGEST_HEX_CHARS + 1], path[800];
	struct fsck_run x;
	struct stat st;

	put_file(ROOT, "w", 4096, 50, &d);
	close_store_catalog();
	object_path(path, sizeof(path), &d);
	ck_assert_int_eq(chmod(path, 0644), 0);
	hex_of(&d, hex);

	fsck_ok(&x, false);
	expect_only(&x, WFS_FSCK_MODE, hex, false);
	ck_assert_uint_eq(x.r.objects_checked, 1); /* still hashed, and it is intact */
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_uint_eq(st.st_mode & 07777, 0644);

	fsck_ok(&x, true);
	expect_only(&x, WFS_FSCK_MODE, hex, true);
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_uint_eq(st.st_mode & 07777, 0444);

	fsck_ok(&x, false);
	expect_clean(&x);
}
END_TEST

/* ---- catalog --------------------------------------------------------------------------------- */

START_TEST(test_catalog_refcount)
{
	struct wfs_digest d;
	struct fsck_run x;

	put_file(ROOT, "w", 300, 60, &d);
	close_store_catalog();
	raw_sql("UPDATE objects SET refcount = 7", 1);

	fsck_ok(&x, false);
	expect_only(&x, WFS_FSCK_CATALOG, "catalog.db", false);
	ck_assert_uint_eq(x.r.catalog.refcounts_wrong, 1);
	ck_assert(x.r.catalog.integrity_ok);

	fsck_ok(&x, true);
	expect_only(&x, WFS_FSCK_CATALOG, "catalog.db", true);
	open_store_catalog();
	ck_assert_uint_eq(refcount_of(&d), 1);
	close_store_catalog();
	fsck_ok(&x, false);
	expect_clean(&x);
}
END_TEST

START_TEST(test_catalog_dangling_dentry)
{
	struct wfs_digest d;
	struct wfs_attr a;
	struct fsck_run x;

	put_file(ROOT, "w", 300, 61, &d);
	close_store_catalog();
	raw_sql("INSERT INTO dentries(parent, name, ino) VALUES (1, 'ghost', 999999)", 1);

	fsck_ok(&x, false);
	expect_only(&x, WFS_FSCK_CATALOG, "catalog.db", false);
	ck_assert_uint_eq(x.r.catalog.dangling_dentries, 1);
	ck_assert_uint_eq(x.r.catalog.refcounts_wrong, 0);

	fsck_ok(&x, true);
	expect_only(&x, WFS_FSCK_CATALOG, "catalog.db", true);
	open_store_catalog();
	ck_assert_int_eq(wfs_catalog_lookup(cat, ROOT, "ghost", &a), -ENOENT);
	ck_assert_int_eq(wfs_catalog_lookup(cat, ROOT, "w", &a), 0);
	close_store_catalog();
	fsck_ok(&x, false);
	expect_clean(&x);
}
END_TEST

START_TEST(test_catalog_nlink)
{
	struct wfs_digest d;
	struct wfs_attr a;
	struct fsck_run x;
	char sql[128];
	uint64_t ino;

	ino = put_file(ROOT, "w", 300, 62, &d);
	close_store_catalog();
	snprintf(sql, sizeof(sql), "UPDATE inodes SET nlink = 3 WHERE ino = %llu", (unsigned long long)ino);
	raw_sql(sql, 1);

	fsck_ok(&x, false);
	expect_only(&x, WFS_FSCK_CATALOG, "catalog.db", false);
	ck_assert_uint_eq(x.r.catalog.nlink_wrong, 1);

	fsck_ok(&x, true);
	expect_only(&x, WFS_FSCK_CATALOG, "catalog.db", true);
	open_store_catalog();
	ck_assert_int_eq(wfs_catalog_getattr(cat, ino, &a), 0);
	ck_assert_uint_eq(a.nlink, 1);
	close_store_catalog();
	fsck_ok(&x, false);
	expect_clean(&x);
}
END_TEST

/* A named file whose nlink says 0 differs from its one dentry (catalog.h invariant 3), and matters:
 * wfs_catalog_recover() at the next mount deletes nlink-0 inodes, which would lose the file. */
START_TEST(test_catalog_nlink_zero_named)
{
	struct wfs_digest d;
	struct wfs_attr a;
	struct fsck_run x;
	char sql[128];
	uint64_t ino;

	ino = put_file(ROOT, "w", 300, 63, &d);
	close_store_catalog();
	snprintf(sql, sizeof(sql), "UPDATE inodes SET nlink = 0 WHERE ino = %llu", (unsigned long long)ino);
	raw_sql(sql, 1);

	fsck_ok(&x, false);
	ck_assert_msg(x.r.catalog.nlink_wrong == 1, "named file with nlink 0: nlink_wrong=%llu:%s",
		      (unsigned long long)x.r.catalog.nlink_wrong, dump(&x));
	expect_only(&x, WFS_FSCK_CATALOG, "catalog.db", false);

	fsck_ok(&x, true);
	open_store_catalog();
	ck_assert_int_eq(wfs_catalog_getattr(cat, ino, &a), 0);
	ck_assert_uint_eq(a.nlink, 1);
}
END_TEST

/* An inode naming a digest with no object row: repair adds the row back, and must not remove the
 * object file as an orphan on the way. */
START_TEST(test_catalog_missing_row_repair_keeps_file)
{
	struct wfs_digest d;
	struct wfs_object_row row;
	char path[800];
	struct fsck_run x;

	put_file(ROOT, "w", 777, 64, &d);
	close_store_catalog();
	raw_sql("DELETE FROM objects", 1);

	fsck_ok(&x, true);
	ck_assert_uint_eq(x.r.catalog.digests_without_row, 1);
	ck_assert_uint_eq(x.r.found[WFS_FSCK_CATALOG], 1);
	ck_assert_uint_eq(x.r.repaired[WFS_FSCK_CATALOG], 1);
	ck_assert_msg(x.r.found[WFS_FSCK_ORPHAN] == 0, "object of a named file taken for an orphan:%s",
		      dump(&x));
	object_path(path, sizeof(path), &d);
	ck_assert(exists(path));
	ck_assert(object_row(&d, &row));
	ck_assert_uint_eq(row.refcount, 1);
	ck_assert_uint_eq(row.bytes, 777);

	fsck_ok(&x, false);
	expect_clean(&x);
}
END_TEST

/* ---- tmp ------------------------------------------------------------------------------------- */

START_TEST(test_tmp_leftover)
{
	char path[800];
	struct fsck_run x;

	close_store_catalog(); /* opening the store cleans tmp/, so the leftover comes after */
	spath(path, sizeof(path), "tmp/w.1234.leftover");
	ck_assert_int_eq(tu_write_file(path, "partial", 7, 0644), 0);

	fsck_ok(&x, false);
	expect_only(&x, WFS_FSCK_TMP, "tmp/w.1234.leftover", false);
	ck_assert(exists(path));

	fsck_ok(&x, true);
	expect_only(&x, WFS_FSCK_TMP, "tmp/w.1234.leftover", true);
	ck_assert(!exists(path));
	spath(path, sizeof(path), "tmp");
	ck_assert_int_eq(tu_count_files(path), 0);

	fsck_ok(&x, false);
	expect_clean(&x);
}
END_TEST

/* A directory in tmp/ (the store never makes one) is a leftover too: reported as repaired only if
 * it is gone afterwards. */
START_TEST(test_tmp_leftover_dir)
{
	char path[800];
	struct fsck_run x;

	close_store_catalog();
	spath(path, sizeof(path), "tmp/d");
	ck_assert_int_eq(mkdir(path, 0755), 0);

	fsck_ok(&x, true);
	expect_only(&x, WFS_FSCK_TMP, "tmp/d", true);
	fsck_ok(&x, false);
	ck_assert_msg(total_found(&x) == 0, "tmp/d reported repaired, still there:%s", dump(&x));
}
END_TEST

/* ---- online ---------------------------------------------------------------------------------- */

START_TEST(test_online_read_only)
{
	struct wfs_digest d, orphan, ok;
	char hex[WFS_DIGEST_HEX_CHARS + 1], path[800], tmp_path[800];
	struct fsck_run x;
	struct stat st;

	/* The test process holds the store read-write, as a mounted daemon does. */
	put_file(ROOT, "w", 2048, 70, &d);
	put_file(ROOT, "ok", 1024, 71, &ok);
	put_object(512, 72, &orphan); /* online, a seal may be between link and commit */
	spath(tmp_path, sizeof(tmp_path), "tmp/w.99.inflight");
	ck_assert_int_eq(tu_write_file(tmp_path, "x", 1, 0644), 0);
	object_path(path, sizeof(path), &d);
	ck_assert_int_eq(chmod(path, 0644), 0);
	hex_of(&d, hex);

	fsck_opts(&x, false, 0);
	ck_assert_int_eq(x.ret, 0);
	ck_assert(x.r.online);
	ck_assert_uint_eq(x.r.found[WFS_FSCK_TMP], 0);
	ck_assert_uint_eq(x.r.found[WFS_FSCK_ORPHAN], 0);
	expect_only(&x, WFS_FSCK_MODE, hex, false); /* objects are still checked */
	ck_assert_uint_eq(x.r.objects_checked, 2);
	ck_assert_uint_eq(x.r.bytes_checked, 3072);

	/* Repair needs the store unmounted, and touches nothing. */
	fsck_opts(&x, true, 0);
	ck_assert_int_eq(x.ret, -EBUSY);
	ck_assert_uint_eq(total_found(&x), 0);
	ck_assert(exists(tmp_path));
	object_path(path, sizeof(path), &orphan);
	ck_assert(exists(path));
	object_path(path, sizeof(path), &d);
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_uint_eq(st.st_mode & 07777, 0644);

	/* Once the "daemon" lets go, the same store is checked offline, tmp and orphans included. */
	wfs_store_close(store);
	store = NULL;
	fsck_opts(&x, false, 0);
	ck_assert_int_eq(x.ret, 0);
	ck_assert(!x.r.online);
	ck_assert_str_eq(one_of(&x, WFS_FSCK_TMP)->what, "tmp/w.99.inflight");
	hex_of(&orphan, hex);
	ck_assert_str_eq(one_of(&x, WFS_FSCK_ORPHAN)->what, hex);
	ck_assert_uint_eq(total_found(&x), 3);
}
END_TEST

/* ---- rate limit ------------------------------------------------------------------------------ */

START_TEST(test_rate_limit)
{
	struct fsck_run x;
	char name[16];
	double t0, elapsed;

	for (int i = 0; i < 3; i++) {
		snprintf(name, sizeof(name), "f%d", i);
		put_file(ROOT, name, MIB, 80 + (uint64_t)i, NULL);
	}
	close_store_catalog();
	t0 = tu_clock_s(CLOCK_MONOTONIC);
	fsck_opts(&x, false, 2 * MIB);
	elapsed = tu_clock_s(CLOCK_MONOTONIC) - t0;
	ck_assert_int_eq(x.ret, 0);
	expect_clean(&x);
	ck_assert_uint_eq(x.r.bytes_checked, 3 * MIB);
	/* 3 MiB at 2 MiB/s is 1.5 s; only a generous lower bound is asserted. */
	ck_assert_msg(elapsed >= 1.0, "3 MiB at 2 MiB/s took %.3f s", elapsed);
}
END_TEST

/* ---- gc -------------------------------------------------------------------------------------- */

#define GC_OBJ_BYTES 4096u

/* Three unreferenced objects of GC_OBJ_BYTES, released at @released[i], plus one still named. */
static void build_unreferenced(struct wfs_digest d[3], const int64_t released[3], struct wfs_digest *kept)
{
	static const char *const names[3] = {"u0", "u1", "u2"};

	for (int i = 0; i < 3; i++)
		put_file(ROOT, names[i], GC_OBJ_BYTES, 90 + (uint64_t)i, &d[i]);
	put_file(ROOT, "named", GC_OBJ_BYTES, 99, kept);
	for (int i = 0; i < 3; i++)
		release(ROOT, names[i], &d[i]);
	for (int i = 0; i < 3; i++)
		set_released(&d[i], released[i]);
}

static bool object_file_exists(const struct wfs_digest *d)
{
	char path[800];

	object_path(path, sizeof(path), d);
	return exists(path);
}

/* Object @d is gone: no file, no row. */
static void assert_removed(const struct wfs_digest *d)
{
	struct wfs_object_row row;

	ck_assert(!object_file_exists(d));
	ck_assert(!object_row(d, &row));
}

static void assert_kept(const struct wfs_digest *d, uint64_t refcount)
{
	struct wfs_object_row row;

	ck_assert(object_file_exists(d));
	ck_assert(object_row(d, &row));
	ck_assert_uint_eq(row.refcount, refcount);
}

START_TEST(test_gc_least_recently_released_first)
{
	/* Release order unrelated to creation or digest order: u1 oldest, then u2, u0 newest. */
	static const int64_t released[3] = {3000, 1000, 2000};
	struct wfs_digest d[3], named;
	struct wfs_gc_report r;

	build_unreferenced(d, released, &named);
	close_store_catalog();
	ck_assert_int_eq(wfs_gc(store_dir, GC_OBJ_BYTES, false, &r), 0);
	ck_assert_uint_eq(r.objects_removed, 2);
	ck_assert_uint_eq(r.bytes_removed, 2 * GC_OBJ_BYTES);
	ck_assert_uint_eq(r.objects_kept, 1);
	ck_assert_uint_eq(r.bytes_kept, GC_OBJ_BYTES);
	assert_removed(&d[1]);
	assert_removed(&d[2]);
	assert_kept(&d[0], 0);
	assert_kept(&named, 1);

	/* Within budget now: nothing more to do. */
	ck_assert_int_eq(wfs_gc(store_dir, GC_OBJ_BYTES, false, &r), 0);
	ck_assert_uint_eq(r.objects_removed, 0);
	ck_assert_uint_eq(r.objects_kept, 1);

	/* Budget 0: the last unreferenced one goes; the named one never does. */
	ck_assert_int_eq(wfs_gc(store_dir, 0, false, &r), 0);
	ck_assert_uint_eq(r.objects_removed, 1);
	ck_assert_uint_eq(r.bytes_removed, GC_OBJ_BYTES);
	ck_assert_uint_eq(r.objects_kept, 0);
	assert_removed(&d[0]);
	assert_kept(&named, 1);
}
END_TEST

START_TEST(test_gc_budget_between_objects)
{
	/* A budget of 1.5 objects keeps one (the newest): what is left must fit. */
	static const int64_t released[3] = {1000, 2000, 3000};
	struct wfs_digest d[3], named;
	struct wfs_gc_report r;

	build_unreferenced(d, released, &named);
	close_store_catalog();
	ck_assert_int_eq(wfs_gc(store_dir, GC_OBJ_BYTES + GC_OBJ_BYTES / 2, false, &r), 0);
	ck_assert_uint_eq(r.objects_removed, 2);
	ck_assert_uint_eq(r.objects_kept, 1);
	assert_removed(&d[0]);
	assert_removed(&d[1]);
	assert_kept(&d[2], 0);
}
END_TEST

START_TEST(test_gc_dry_run)
{
	static const int64_t released[3] = {1000, 2000, 3000};
	struct wfs_digest d[3], named;
	struct wfs_gc_report dry, real;

	build_unreferenced(d, released, &named);
	close_store_catalog();
	ck_assert_int_eq(wfs_gc(store_dir, GC_OBJ_BYTES, true, &dry), 0);
	ck_assert_uint_eq(dry.objects_removed, 2);
	ck_assert_uint_eq(dry.bytes_removed, 2 * GC_OBJ_BYTES);
	ck_assert_uint_eq(dry.objects_kept, 1);
	ck_assert_uint_eq(dry.bytes_kept, GC_OBJ_BYTES);
	for (int i = 0; i < 3; i++)
		assert_kept(&d[i], 0);

	ck_assert_int_eq(wfs_gc(store_dir, GC_OBJ_BYTES, false, &real), 0);
	ck_assert_uint_eq(real.objects_removed, dry.objects_removed);
	ck_assert_uint_eq(real.bytes_removed, dry.bytes_removed);
	ck_assert_uint_eq(real.objects_kept, dry.objects_kept);
	ck_assert_uint_eq(real.bytes_kept, dry.bytes_kept);
	assert_removed(&d[0]);
	assert_removed(&d[1]);
	assert_kept(&d[2], 0);
}
END_TEST

struct in_use_ctx {
	struct wfs_digest busy;
	unsigned calls;
};

static bool in_use(void *ctx, const struct wfs_digest *d)
{
	struct in_use_ctx *u = ctx;

	u->calls++;
	return wfs_digest_equal(d, &u->busy);
}

START_TEST(test_gc_in_use)
{
	static const int64_t released[3] = {1000, 2000, 3000};
	struct wfs_digest d[3], named;
	struct in_use_ctx u;
	struct wfs_gc_report r;

	build_unreferenced(d, released, &named);
	/* The oldest is still open: kept, whatever the budget. */
	u = (struct in_use_ctx){.busy = d[0]};
	ck_assert_int_eq(wfs_gc_collect(store, cat, 0, false, in_use, &u, &r), 0);
	ck_assert_uint_gt(u.calls, 0);
	ck_assert_uint_eq(r.objects_removed, 2);
	ck_assert_uint_eq(r.bytes_removed, 2 * GC_OBJ_BYTES);
	ck_assert_uint_eq(r.objects_kept, 1);
	ck_assert_uint_eq(r.bytes_kept, GC_OBJ_BYTES);
	close_store_catalog();
	assert_kept(&d[0], 0);
	assert_removed(&d[1]);
	assert_removed(&d[2]);
}
END_TEST

/* Objects in use do not count against the budget: with one busy and a budget of one object, the
 * newest idle one stays and only the oldest idle one goes. */
START_TEST(test_gc_in_use_outside_budget)
{
	static const int64_t released[3] = {1000, 2000, 3000};
	struct wfs_digest d[3], named;
	struct in_use_ctx u;
	struct wfs_gc_report r;

	build_unreferenced(d, released, &named);
	u = (struct in_use_ctx){.busy = d[2]};
	ck_assert_int_eq(wfs_gc_collect(store, cat, GC_OBJ_BYTES, false, in_use, &u, &r), 0);
	ck_assert_uint_eq(r.objects_removed, 1);
	ck_assert_uint_eq(r.objects_kept, 2);
	ck_assert_uint_eq(r.bytes_kept, 2 * GC_OBJ_BYTES);
	close_store_catalog();
	assert_removed(&d[0]);
	assert_kept(&d[1], 0);
	assert_kept(&d[2], 0);
}
END_TEST

START_TEST(test_gc_locked)
{
	static const int64_t released[3] = {1000, 2000, 3000};
	struct wfs_digest d[3], named;
	struct wfs_gc_report r;

	build_unreferenced(d, released, &named);
	/* The test still holds the store, as a daemon would. */
	ck_assert_int_eq(wfs_gc(store_dir, 0, false, &r), -EBUSY);
	close_store_catalog();
	for (int i = 0; i < 3; i++)
		assert_kept(&d[i], 0);
}
END_TEST

/* gc.h: a crash between a seal's link and its commit (or between gc's row delete and its unlink)
 * leaves an object file the catalog does not list: gc counts it with --dry-run and removes it. */
START_TEST(test_gc_removes_orphan_file)
{
	struct wfs_digest orphan, named;
	struct wfs_gc_report r;

	put_file(ROOT, "named", 100, 110, &named);
	put_object(200, 111, &orphan);
	close_store_catalog();
	ck_assert(object_file_exists(&orphan));
	ck_assert_int_eq(wfs_gc(store_dir, 0, true, &r), 0);
	ck_assert_uint_eq(r.objects_removed, 0);
	ck_assert_uint_eq(r.orphans_removed, 1);
	ck_assert_uint_eq(r.orphan_bytes_removed, 200);
	ck_assert_msg(object_file_exists(&orphan), "gc --dry-run removed the orphan");
	ck_assert_int_eq(wfs_gc(store_dir, 0, false, &r), 0);
	ck_assert_uint_eq(r.objects_removed, 0);
	ck_assert_uint_eq(r.orphans_removed, 1);
	ck_assert_msg(!object_file_exists(&orphan), "gc left the orphan object file in place");
	assert_kept(&named, 1);
	ck_assert_int_eq(wfs_gc(store_dir, 0, false, &r), 0);
	ck_assert_uint_eq(r.orphans_removed, 0);
}
END_TEST

/* A budget of 0 removes every unreferenced object, empty ones included (weightfsctl gc: "default 0:
 * remove them all"); an empty object still costs a file and a catalog row. */
START_TEST(test_gc_retain_zero_removes_empty_object)
{
	struct wfs_digest empty, other, named;
	struct wfs_gc_report r;

	put_file(ROOT, "empty", 0, 120, &empty);
	put_file(ROOT, "other", 200, 121, &other);
	put_file(ROOT, "named", 300, 122, &named);
	release(ROOT, "empty", &empty);
	release(ROOT, "other", &other);
	set_released(&other, 1000);
	set_released(&empty, 2000);
	close_store_catalog();
	ck_assert_int_eq(wfs_gc(store_dir, 0, false, &r), 0);
	ck_assert_msg(r.objects_removed == 2 && r.objects_kept == 0,
		      "retain 0: removed %llu, kept %llu (%llu bytes); want 2 removed, 0 kept",
		      (unsigned long long)r.objects_removed, (unsigned long long)r.objects_kept,
		      (unsigned long long)r.bytes_kept);
	ck_assert_uint_eq(r.bytes_removed, 200);
	assert_removed(&other);
	assert_removed(&empty);
	assert_kept(&named, 1);
}
END_TEST

/* ---- wfs_parse_size -------------------------------------------------------------------------- */

START_TEST(test_parse_size_accepts)
{
	static const struct {
		const char *text;
		uint64_t bytes;
	} cases[] = {
		{"0", 0},
		{"4096", 4096},
		{"1K", 1024},
		{"4k", 4096},
		{"512M", 512ull << 20},
		{"1.5G", 3ull << 29},
		{"2GiB", 2ull << 30},
		{"2GB", 2ull << 30},
		{"2Gi", 2ull << 30},
		{"20G", 20ull << 30},
		{"1.5T", 3ull << 39},
		{"2P", 2ull << 50},
		{"0.5K", 512},
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint64_t bytes = 12345;
		int ret = wfs_parse_size(cases[i].text, &bytes);

		ck_assert_msg(ret == 0, "wfs_parse_size(\"%s\"): %s", cases[i].text, strerror(-ret));
		ck_assert_msg(bytes == cases[i].bytes, "wfs_parse_size(\"%s\") = %llu, want %llu", cases[i].text,
			      (unsigned long long)bytes, (unsigned long long)cases[i].bytes);
	}
}
END_TEST

START_TEST(test_parse_size_rejects)
{
	/* Only "k" is accepted in lower case; other lower-case units are rejected. */
	static const char *const cases[] = {
		"", "-1", "-1K", "abc", "K", "12Q", "20g", "512m", "1KK", "1Kx", "1iB", "4096 ", "nan", "inf",
		"1e400", "16384P", "18446744073709551616", "0x10", "1e3", "+4K", " 4K",
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint64_t bytes = 12345;
		int ret = wfs_parse_size(cases[i], &bytes);

		ck_assert_msg(ret == -EINVAL, "wfs_parse_size(\"%s\") = %d (%llu), want -EINVAL", cases[i], ret,
			      (unsigned long long)bytes);
		ck_assert_uint_eq(bytes, 12345); /* written only on success */
	}
}
END_TEST

/* ---- suite ----------------------------------------------------------------------------------- */

static TCase *tcase(Suite *s, const char *name)
{
	TCase *tc = tcase_create(name);

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 30);
	suite_add_tcase(s, tc);
	return tc;
}

/* ---- naming what is broken (issue 35) ----------------------------------------------------------- */

/* A lost object is told with every name that uses it (hard links and dedup alike), as paths from
 * the root; a damaged one too, and its quarantined copy after repair. */
START_TEST(test_names_of_broken_objects)
{
	struct wfs_digest d, c, ok;
	char hex[WFS_DIGEST_HEX_CHARS + 1], chex[WFS_DIGEST_HEX_CHARS + 1], path[800], qwhat[64];
	const struct finding_rec *f;
	struct wfs_attr a, sub, l;
	struct fsck_run x;
	uint64_t ino;

	ck_assert_int_eq(wfs_catalog_create(cat, ROOT, "rank0", S_IFDIR | 0755, 0, 0, NULL, &a), 0);
	ck_assert_int_eq(wfs_catalog_create(cat, a.ino, "sub", S_IFDIR | 0755, 0, 0, NULL, &sub), 0);
	ino = put_file(a.ino, "w", 3000, 40, &d);
	ck_assert_int_eq(wfs_catalog_link(cat, ino, ROOT, "link", &l), 0); /* a hard link */
	put_file(sub.ino, "same", 3000, 40, &d);                          /* dedup: one object */
	put_file(ROOT, "c", 5000, 41, &c);
	put_file(ROOT, "ok", 100, 42, &ok);
	close_store_catalog();
	object_path(path, sizeof(path), &d);
	ck_assert_int_eq(unlink(path), 0);
	flip_byte(&c, 7);
	hex_of(&d, hex);
	hex_of(&c, chex);

	fsck_ok(&x, false);
	f = one_of(&x, WFS_FSCK_MISSING);
	ck_assert_str_eq(f->what, hex);
	ck_assert_uint_eq(f->nnames, 3);
	ck_assert_str_eq(f->names, "/link /rank0/sub/same /rank0/w");
	ck_assert_msg(strstr(f->detail, "3 names fail with EIO") != NULL, "%s", f->detail);
	f = one_of(&x, WFS_FSCK_CORRUPT);
	ck_assert_str_eq(f->what, chex);
	ck_assert_str_eq(f->names, "/c");

	fsck_ok(&x, true); /* quarantines c: its copy is told with its name */
	snprintf(qwhat, sizeof(qwhat), "quarantine/%s", chex);
	f = one_of(&x, WFS_FSCK_QUARANTINED);
	ck_assert_str_eq(f->what, qwhat);
	ck_assert_str_eq(f->names, "/c");
	ck_assert_msg(strstr(f->detail, "1 names fail with EIO") != NULL, "%s", f->detail);
	fsck_ok(&x, false);
	ck_assert_uint_eq(x.r.found[WFS_FSCK_MISSING], 2); /* d lost, c quarantined */
	for (size_t i = 0; i < x.n; i++)
		if (x.f[i].kind == WFS_FSCK_MISSING && strcmp(x.f[i].what, chex) == 0)
			ck_assert_str_eq(x.f[i].names, "/c");
}
END_TEST

/* The mark a killed owner leaves in STORE/lock: an offline check says so; repair runs the crash
 * recovery and the store is closed cleanly after it. */
START_TEST(test_unclean_store)
{
	struct wfs_attr a;
	const struct finding_rec *f;
	struct fsck_run x;
	char path[800];

	put_file(ROOT, "w", 100, 43, NULL);
	ck_assert_int_eq(wfs_catalog_create(cat, ROOT, "never-sealed", S_IFREG | 0644, 0, 0, NULL, &a), 0);
	close_store_catalog();
	fsck_ok(&x, false);
	/* Closed cleanly: the never-sealed name is told (it reads EIO), not counted. */
	expect_only(&x, WFS_FSCK_UNSEALED, "/never-sealed", false);
	ck_assert(!x.r.unclean);

	/* What a daemon killed with SIGKILL leaves: its pid and mount point, never emptied. */
	spath(path, sizeof(path), "lock");
	ck_assert_int_eq(tu_write_file(path, "2147483000\nmounted on /mnt/w\n", 29, 0600), 0);
	fsck_ok(&x, false);
	ck_assert_msg(total_found(&x) == 2, "want unclean and unsealed:%s", dump(&x));
	ck_assert_str_eq(one_of(&x, WFS_FSCK_UNSEALED)->what, "/never-sealed");
	ck_assert_uint_eq(wfs_fsck_unrepaired(&x.r), 1);
	ck_assert(x.r.unclean);
	ck_assert_int_eq(x.r.unclean_pid, 2147483000);
	ck_assert_str_eq(x.r.unclean_what, "mounted on /mnt/w");
	f = one_of(&x, WFS_FSCK_UNCLEAN);
	ck_assert_msg(strstr(f->detail, "not closed by its last owner (pid 2147483000, mounted on /mnt/w)") != NULL,
		      "%s", f->detail);

	fsck_ok(&x, true);
	f = one_of(&x, WFS_FSCK_UNCLEAN);
	ck_assert(f->repaired);
	ck_assert_msg(strstr(f->detail, "1 never-sealed names") != NULL, "%s", f->detail);
	fsck_ok(&x, false);
	expect_clean(&x);
	ck_assert(!x.r.unclean);
	open_store_catalog();
	ck_assert_int_eq(wfs_catalog_lookup(cat, ROOT, "never-sealed", &a), -ENOENT);
}
END_TEST

/* A temporary name of the tensor-file protocol left in the namespace: declared 4 MiB, holding 0. */
START_TEST(test_tmpname_left)
{
	struct wfs_attr a, d;
	const struct finding_rec *f;
	struct fsck_run x;
	struct wfs_digest empty;

	ck_assert_int_eq(wfs_catalog_create(cat, ROOT, "rank0", S_IFDIR | 0755, 0, 0, NULL, &d), 0);
	put_file(d.ino, "w", 100, 44, NULL);
	put_file(d.ino, ".wfs-tmp-123-0", 0, 0, &empty);
	ck_assert_int_eq(wfs_catalog_lookup(cat, d.ino, ".wfs-tmp-123-0", &a), 0);
	ck_assert_int_eq(wfs_catalog_xattr_set(cat, a.ino, "user.weightfs.shape", "[1024,1024]", 11, 0), 0);
	ck_assert_int_eq(wfs_catalog_xattr_set(cat, a.ino, "user.weightfs.dtype", "F32", 3, 0), 0);
	close_store_catalog();

	fsck_ok(&x, false);
	expect_only(&x, WFS_FSCK_TMPNAME, "/rank0/.wfs-tmp-123-0", false);
	f = one_of(&x, WFS_FSCK_TMPNAME);
	ck_assert_msg(strstr(f->detail, "holds 0 bytes, its dtype and shape declare 4194304") != NULL, "%s",
		      f->detail);
	fsck_ok(&x, true);
	expect_only(&x, WFS_FSCK_TMPNAME, "/rank0/.wfs-tmp-123-0", true);
	fsck_ok(&x, false);
	expect_clean(&x);
	open_store_catalog();
	ck_assert_int_eq(wfs_catalog_lookup(cat, d.ino, ".wfs-tmp-123-0", &a), -ENOENT);
	ck_assert_int_eq(wfs_catalog_lookup(cat, d.ino, "w", &a), 0);
}
END_TEST

/* A damaged catalog is one finding that says so and what to do; the objects are still checked
 * against their digests, none is taken for an orphan, and repair touches nothing. */
START_TEST(test_catalog_damaged)
{
	struct wfs_digest d, c;
	char path[800], chex[WFS_DIGEST_HEX_CHARS + 1];
	const struct finding_rec *f;
	struct fsck_run x;
	int fd;

	for (int i = 0; i < 40; i++) {
		char name[16];

		snprintf(name, sizeof(name), "f%d", i);
		put_file(ROOT, name, 100, 100 + (uint64_t)i, i == 0 ? &d : NULL);
	}
	put_file(ROOT, "c", 5000, 45, &c);
	close_store_catalog();
	flip_byte(&c, 9);
	hex_of(&c, chex);
	fd = open(db_path, O_RDWR);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pwrite(fd, "\x07\x07\x07\x07\x07\x07\x07\x07", 8, 4096), 8); /* page 2's header */
	close(fd);

	fsck_ok(&x, false);
	ck_assert(x.r.catalog_damaged);
	f = one_of(&x, WFS_FSCK_CATALOG);
	ck_assert_str_eq(f->what, "catalog.db");
	ck_assert_msg(strncmp(f->detail, "damaged (SQLite: ", 17) == 0 && strstr(f->detail, "restore catalog.db") != NULL,
		      "%s", f->detail);
	f = one_of(&x, WFS_FSCK_CORRUPT);
	ck_assert_str_eq(f->what, chex);
	ck_assert_uint_eq(x.r.found[WFS_FSCK_ORPHAN], 0);
	ck_assert_uint_eq(x.r.objects_checked, 41);

	fsck_ok(&x, true);
	ck_assert_uint_eq(x.r.repaired[WFS_FSCK_CORRUPT] + x.r.repaired[WFS_FSCK_ORPHAN], 0);
	object_path(path, sizeof(path), &d);
	ck_assert(exists(path));
	object_path(path, sizeof(path), &c);
	ck_assert(exists(path));
}
END_TEST

/* With a backup beside it, --repair rebuilds a damaged catalog: the names of the backup, the objects
 * written since kept as unreferenced ones, the damaged files kept aside. */
START_TEST(test_catalog_rebuilt)
{
	struct wfs_digest a, late;
	char backup[800], hex[WFS_DIGEST_HEX_CHARS + 1];
	const struct finding_rec *f;
	struct wfs_object_row row;
	struct wfs_attr attr;
	struct fsck_run x;
	int fd;

	for (int i = 0; i < 40; i++) {
		char name[16];

		snprintf(name, sizeof(name), "f%d", i);
		put_file(ROOT, name, 100, 200 + (uint64_t)i, i == 0 ? &a : NULL);
	}
	spath(backup, sizeof(backup), "catalog.db.backup");
	ck_assert_int_eq(wfs_catalog_backup(cat, backup, false), 0);
	put_file(ROOT, "late", 700, 300, &late); /* after the backup */
	close_store_catalog();
	fd = open(db_path, O_RDWR);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pwrite(fd, "\x07\x07\x07\x07\x07\x07\x07\x07", 8, 4096), 8);
	close(fd);

	fsck_ok(&x, false);
	f = one_of(&x, WFS_FSCK_CATALOG);
	ck_assert_msg(strstr(f->detail, "weightfsctl fsck --repair rebuilds them from catalog.db.backup") != NULL, "%s",
		      f->detail);

	fsck_ok(&x, true);
	ck_assert(!x.r.catalog_damaged);
	f = one_of(&x, WFS_FSCK_CATALOG);
	ck_assert(f->repaired);
	ck_assert_msg(strstr(f->detail, "rebuilt from catalog.db.backup of ") != NULL, "%s", f->detail);
	hex_of(&late, hex);
	f = one_of(&x, WFS_FSCK_ORPHAN);
	ck_assert_str_eq(f->what, hex);
	ck_assert(f->repaired);
	ck_assert_uint_eq(wfs_fsck_unrepaired(&x.r), 0);
	ck_assert(object_row(&late, &row)); /* adopted, unreferenced */
	ck_assert_uint_eq(row.refcount, 0);
	ck_assert_uint_eq(row.bytes, 700);

	fsck_ok(&x, false);
	expect_clean(&x);
	open_store_catalog();
	ck_assert_int_eq(wfs_catalog_lookup(cat, ROOT, "f0", &attr), 0);
	ck_assert(wfs_digest_equal(&attr.digest, &a));
	ck_assert_int_eq(wfs_catalog_lookup(cat, ROOT, "late", &attr), -ENOENT);
}
END_TEST

static Suite *fsck_suite(void)
{
	Suite *s = suite_create("fsck");
	TCase *tc;

	tc = tcase(s, "clean");
	tcase_add_test(tc, test_clean_store);
	tcase_add_test(tc, test_empty_store);
	tcase_add_test(tc, test_not_a_store);
	tc = tcase(s, "corrupt");
	tcase_add_test(tc, test_corrupt_flipped_byte);
	tcase_add_test(tc, test_corrupt_truncated);
	tc = tcase(s, "quarantined");
	tcase_add_test(tc, test_corrupt_repair_quarantines);
	tcase_add_test(tc, test_corrupt_unused_repaired);
	tcase_add_test(tc, test_corrupt_repair_left_as_next_check);
	tc = tcase(s, "missing");
	tcase_add_test(tc, test_missing_used);
	tcase_add_test(tc, test_missing_unused_forgotten);
	tcase_add_test(tcase(s, "orphan"), test_orphan);
	tc = tcase(s, "stray");
	tcase_add_test(tc, test_stray_in_prefix_dir);
	tcase_add_test(tc, test_stray_top_level);
	tcase_add_test(tc, test_stray_upper_case);
	tcase_add_test(tcase(s, "mode"), test_mode);
	tc = tcase(s, "catalog");
	tcase_add_test(tc, test_catalog_refcount);
	tcase_add_test(tc, test_catalog_dangling_dentry);
	tcase_add_test(tc, test_catalog_nlink);
	tcase_add_test(tc, test_catalog_nlink_zero_named);
	tcase_add_test(tc, test_catalog_missing_row_repair_keeps_file);
	tc = tcase(s, "tmp");
	tcase_add_test(tc, test_tmp_leftover);
	tcase_add_test(tc, test_tmp_leftover_dir);
	tcase_add_test(tcase(s, "online"), test_online_read_only);
	tc = tcase(s, "names");
	tcase_add_test(tc, test_names_of_broken_objects);
	tcase_add_test(tc, test_unclean_store);
	tcase_add_test(tc, test_tmpname_left);
	tcase_add_test(tc, test_catalog_damaged);
	tcase_add_test(tc, test_catalog_rebuilt);
	tcase_add_test(tcase(s, "rate"), test_rate_limit);
	tc = tcase(s, "gc");
	tcase_add_test(tc, test_gc_least_recently_released_first);
	tcase_add_test(tc, test_gc_budget_between_objects);
	tcase_add_test(tc, test_gc_dry_run);
	tcase_add_test(tc, test_gc_in_use);
	tcase_add_test(tc, test_gc_in_use_outside_budget);
	tcase_add_test(tc, test_gc_locked);
	tcase_add_test(tc, test_gc_removes_orphan_file);
	tcase_add_test(tc, test_gc_retain_zero_removes_empty_object);
	tc = tcase(s, "parse_size");
	tcase_add_test(tc, test_parse_size_accepts);
	tcase_add_test(tc, test_parse_size_rejects);
	return s;
}

int main(void)
{
	return tu_main("check_fsck", fsck_suite(), TU_RUN_DIR, NULL);
}
