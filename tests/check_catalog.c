/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Check suite for lib/catalog: the namespace (create, lookup, link, unlink, rename), link counts,
 * object reference counts, crash recovery, readdir cookies, xattrs, stats, inode-number stability
 * and persistence. Each test opens a fresh catalog in its own temporary directory.
 */
#include <errno.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "catalog.h"
#include "digest.h"
#include "testutil.h"

#define ROOT WFS_ROOT_INO
#define UID 1000u
#define GID 1001u

static char db_path[600];
static struct wfs_catalog *cat;

static void cat_setup(void)
{
	int ret;

	tu_test_dir_setup();
	tu_path(db_path, sizeof(db_path), tu_test_dir, "catalog.db");
	ret = wfs_catalog_open(db_path, WFS_CATALOG_CREATE, UID, GID, &cat);
	ck_assert_msg(ret == 0, "wfs_catalog_open(%s): %s", db_path, strerror(-ret));
}

static void cat_teardown(void)
{
	wfs_catalog_close(cat);
	cat = NULL;
	tu_test_dir_teardown();
}

/* ---- helpers --------------------------------------------------------------------------------- */

static uint64_t mk(uint64_t parent, const char *name, uint32_t mode, const char *target)
{
	struct wfs_attr a;
	int ret = wfs_catalog_create(cat, parent, name, mode, UID, GID, target, &a);

	ck_assert_msg(ret == 0, "create %llu/%s: %s", (unsigned long long)parent, name, strerror(-ret));
	ck_assert_uint_gt(a.ino, ROOT);
	return a.ino;
}

static uint64_t mkfile(uint64_t parent, const char *name)
{
	return mk(parent, name, S_IFREG | 0644, NULL);
}

static uint64_t mkdir_(uint64_t parent, const char *name)
{
	return mk(parent, name, S_IFDIR | 0755, NULL);
}

static struct wfs_attr get(uint64_t ino)
{
	struct wfs_attr a;
	int ret = wfs_catalog_getattr(cat, ino, &a);

	ck_assert_msg(ret == 0, "getattr %llu: %s", (unsigned long long)ino, strerror(-ret));
	return a;
}

static uint32_t nlink_of(uint64_t ino)
{
	return get(ino).nlink;
}

/* The inode @parent/@name names, or 0 when lookup fails with -ENOENT. */
static uint64_t ino_at(uint64_t parent, const char *name)
{
	struct wfs_attr a;
	int ret = wfs_catalog_lookup(cat, parent, name, &a);

	if (ret == -ENOENT)
		return 0;
	ck_assert_msg(ret == 0, "lookup %llu/%s: %s", (unsigned long long)parent, name, strerror(-ret));
	return a.ino;
}

static struct wfs_digest dg(const char *s)
{
	struct wfs_digest d;

	wfs_digest_buf(s, strlen(s), &d);
	return d;
}

static void seal(uint64_t ino, const char *content, uint64_t size)
{
	struct wfs_digest d = dg(content);
	struct timespec t = {.tv_sec = 1700000000, .tv_nsec = 123456789};
	struct wfs_attr old, out;
	int ret = wfs_catalog_set_content(cat, ino, &d, size, &t, NULL, 0, &old, &out);

	ck_assert_msg(ret == 0, "set_content %llu: %s", (unsigned long long)ino, strerror(-ret));
}

static uint64_t refcount(const char *content)
{
	struct wfs_digest d = dg(content);
	uint64_t n = 999;
	int ret = wfs_catalog_object_refcount(cat, &d, &n);

	ck_assert_msg(ret == 0, "refcount of \"%s\": %s", content, strerror(-ret));
	return n;
}

static void unlink_ok(uint64_t parent, const char *name, bool dir, uint64_t want_ino)
{
	uint64_t ino = 0;
	int ret = wfs_catalog_unlink(cat, parent, name, dir, &ino);

	ck_assert_msg(ret == 0, "unlink %s: %s", name, strerror(-ret));
	ck_assert_uint_eq(ino, want_ino);
}

static int64_t ns(const struct timespec *t)
{
	return (int64_t)t->tv_sec * 1000000000 + t->tv_nsec;
}

static int64_t now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	return ns(&t);
}

static void assert_attr_eq(const struct wfs_attr *a, const struct wfs_attr *b)
{
	ck_assert_uint_eq(a->ino, b->ino);
	ck_assert_uint_eq(a->mode, b->mode);
	ck_assert_uint_eq(a->uid, b->uid);
	ck_assert_uint_eq(a->gid, b->gid);
	ck_assert_uint_eq(a->nlink, b->nlink);
	ck_assert_uint_eq(a->size, b->size);
	ck_assert_uint_eq(a->parent, b->parent);
	ck_assert_int_eq(ns(&a->atime), ns(&b->atime));
	ck_assert_int_eq(ns(&a->mtime), ns(&b->mtime));
	ck_assert_int_eq(ns(&a->ctime), ns(&b->ctime));
	ck_assert_int_eq(a->sealed, b->sealed);
	if (a->sealed)
		ck_assert_mem_eq(a->digest.bytes, b->digest.bytes, WFS_DIGEST_BYTES);
}

/* ---- open ------------------------------------------------------------------------------------ */

START_TEST(test_open_root)
{
	struct wfs_attr a = get(ROOT);
	struct wfs_catalog *c2 = NULL;

	ck_assert_uint_eq(a.ino, ROOT);
	ck_assert_uint_eq(a.mode, S_IFDIR | 0755);
	ck_assert_uint_eq(a.nlink, 2);
	ck_assert_uint_eq(a.uid, UID);
	ck_assert_uint_eq(a.gid, GID);
	ck_assert_uint_eq(a.parent, ROOT);
	ck_assert_uint_eq(a.size, 0);
	ck_assert(!a.sealed);
	ck_assert_int_gt(ns(&a.mtime), 0);
	ck_assert_int_eq(ns(&a.mtime), ns(&a.ctime));
	wfs_catalog_close(cat);
	/* Opening again with CREATE and another owner leaves the existing root alone. */
	ck_assert_int_eq(wfs_catalog_open(db_path, WFS_CATALOG_CREATE, 0, 0, &cat), 0);
	ck_assert_uint_eq(get(ROOT).uid, UID);
	ck_assert_uint_eq(get(ROOT).gid, GID);
	ck_assert_int_eq(wfs_catalog_open(db_path, 0, 0, 0, &c2), 0);
	wfs_catalog_close(c2);
}
END_TEST

START_TEST(test_open_errors)
{
	struct wfs_catalog *c = (struct wfs_catalog *)&c; /* sentinel: must stay untouched */
	struct wfs_catalog *const sentinel = c;
	char path[400];

	tu_path(path, sizeof(path), tu_test_dir, "missing.db");
	ck_assert_int_eq(wfs_catalog_open(path, 0, 0, 0, &c), -ENOENT);
	ck_assert_int_eq(wfs_catalog_open(path, WFS_CATALOG_READONLY, 0, 0, &c), -ENOENT);
	ck_assert_int_eq(access(path, F_OK), -1);
	tu_path(path, sizeof(path), tu_test_dir, "no/such/dir.db");
	ck_assert_int_eq(wfs_catalog_open(path, WFS_CATALOG_CREATE, 0, 0, &c), -ENOENT);
	/* Not a database at all. */
	tu_path(path, sizeof(path), tu_test_dir, "garbage.db");
	{
		char junk[4096];

		tu_fill(junk, sizeof(junk), 1);
		ck_assert_int_eq(tu_write_file(path, junk, sizeof(junk), 0644), 0);
	}
	ck_assert_int_eq(wfs_catalog_open(path, 0, 0, 0, &c), -EIO);
	ck_assert_int_eq(wfs_catalog_open(path, WFS_CATALOG_CREATE, 0, 0, &c), -EIO);
	ck_assert_ptr_eq(c, sentinel);
}
END_TEST

/* A catalog written by a newer weightfs (schema_version 2) is refused with -EIO. */
START_TEST(test_open_newer_schema)
{
	struct wfs_catalog *c = NULL;
	sqlite3 *db;

	wfs_catalog_close(cat);
	cat = NULL;
	ck_assert_int_eq(sqlite3_open(db_path, &db), SQLITE_OK);
	ck_assert_int_eq(sqlite3_exec(db, "UPDATE meta SET value = 99 WHERE key = 'schema_version'", NULL,
				      NULL, NULL),
			 SQLITE_OK);
	ck_assert_int_eq(sqlite3_changes(db), 1);
	sqlite3_close(db);
	ck_assert_int_eq(wfs_catalog_open(db_path, 0, 0, 0, &c), -EIO);
	ck_assert_int_eq(wfs_catalog_open(db_path, WFS_CATALOG_CREATE, 0, 0, &c), -EIO);
	ck_assert_ptr_null(c);
}
END_TEST

/* ---- create / lookup ------------------------------------------------------------------------- */

START_TEST(test_create_kinds)
{
	int64_t before = now(), after;
	struct wfs_attr f, d, l, got;
	char buf[64];

	ck_assert_int_eq(wfs_catalog_create(cat, ROOT, "file", S_IFREG | 0640, 10, 20, NULL, &f), 0);
	ck_assert_int_eq(wfs_catalog_create(cat, ROOT, "dir", S_IFDIR | 0750, 11, 21, NULL, &d), 0);
	ck_assert_int_eq(wfs_catalog_create(cat, d.ino, "link", S_IFLNK | 0777, 12, 22, "../file", &l), 0);
	after = now();

	ck_assert_uint_eq(f.mode, S_IFREG | 0640);
	ck_assert_uint_eq(f.uid, 10);
	ck_assert_uint_eq(f.gid, 20);
	ck_assert_uint_eq(f.nlink, 1);
	ck_assert_uint_eq(f.size, 0);
	ck_assert_uint_eq(f.parent, 0);
	ck_assert(!f.sealed); /* invariant 2: a new file is unsealed */
	ck_assert_int_ge(ns(&f.mtime), before);
	ck_assert_int_le(ns(&f.mtime), after);
	ck_assert_int_eq(ns(&f.atime), ns(&f.mtime));
	ck_assert_int_eq(ns(&f.ctime), ns(&f.mtime));

	ck_assert_uint_eq(d.mode, S_IFDIR | 0750);
	ck_assert_uint_eq(d.nlink, 2);
	ck_assert_uint_eq(d.parent, ROOT);
	ck_assert_uint_eq(d.size, 0);

	ck_assert_uint_eq(l.mode, S_IFLNK | 0777);
	ck_assert_uint_eq(l.nlink, 1);
	ck_assert_uint_eq(l.size, strlen("../file"));
	ck_assert_uint_eq(l.parent, 0);

	/* Distinct inode numbers, and lookup, getattr and create agree. */
	ck_assert_uint_ne(f.ino, d.ino);
	ck_assert_uint_ne(d.ino, l.ino);
	ck_assert_uint_ne(f.ino, l.ino);
	ck_assert_int_eq(wfs_catalog_lookup(cat, ROOT, "file", &got), 0);
	assert_attr_eq(&got, &f);
	got = get(f.ino);
	assert_attr_eq(&got, &f);
	/* d's mtime and ctime moved when "link" was made in it; the rest is as created. */
	ck_assert_int_eq(wfs_catalog_lookup(cat, ROOT, "dir", &got), 0);
	ck_assert_int_ge(ns(&got.mtime), ns(&l.mtime));
	ck_assert_int_eq(ns(&got.ctime), ns(&got.mtime));
	ck_assert_int_eq(ns(&got.atime), ns(&d.atime));
	got.mtime = d.mtime;
	got.ctime = d.ctime;
	assert_attr_eq(&got, &d);
	ck_assert_int_eq(wfs_catalog_lookup(cat, ROOT, "dir", &d), 0);
	got = get(d.ino);
	assert_attr_eq(&got, &d);
	ck_assert_int_eq(wfs_catalog_lookup(cat, d.ino, "link", &got), 0);
	assert_attr_eq(&got, &l);
	got = get(l.ino);
	assert_attr_eq(&got, &l);

	ck_assert_int_eq(wfs_catalog_readlink(cat, l.ino, buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "../file");
	ck_assert_int_eq(wfs_catalog_readlink(cat, l.ino, buf, 4), 0); /* truncated to size - 1 */
	ck_assert_str_eq(buf, "../");
	ck_assert_int_eq(wfs_catalog_readlink(cat, f.ino, buf, sizeof(buf)), -EINVAL);
	ck_assert_int_eq(wfs_catalog_readlink(cat, d.ino, buf, sizeof(buf)), -EINVAL);
	ck_assert_int_eq(wfs_catalog_readlink(cat, 999999, buf, sizeof(buf)), -ENOENT);

	/* The root's mtime moved when "dir" was made in it. */
	got = get(ROOT);
	ck_assert_int_ge(ns(&got.mtime), ns(&d.atime));
}
END_TEST

START_TEST(test_create_invalid)
{
	struct wfs_attr a;

	ck_assert_int_eq(wfs_catalog_create(cat, ROOT, "fifo", S_IFIFO | 0644, 0, 0, NULL, &a), -EINVAL);
	ck_assert_int_eq(wfs_catalog_create(cat, ROOT, "sock", S_IFSOCK | 0644, 0, 0, NULL, &a), -EINVAL);
	ck_assert_int_eq(wfs_catalog_create(cat, ROOT, "l", S_IFLNK | 0777, 0, 0, NULL, &a), -EINVAL);
	ck_assert_int_eq(wfs_catalog_create(cat, ROOT, "f", S_IFREG | 0644, 0, 0, "x", &a), -EINVAL);
	ck_assert_uint_eq(ino_at(ROOT, "fifo"), 0);
	ck_assert_uint_eq(ino_at(ROOT, "l"), 0);
	ck_assert_uint_eq(ino_at(ROOT, "f"), 0);
}
END_TEST

START_TEST(test_create_eexist)
{
	uint64_t f = mkfile(ROOT, "a"), d = mkdir_(ROOT, "d");
	struct wfs_attr a, before = get(ROOT);

	a.ino = 4242;
	ck_assert_int_eq(wfs_catalog_create(cat, ROOT, "a", S_IFREG | 0644, 0, 0, NULL, &a), -EEXIST);
	ck_assert_int_eq(wfs_catalog_create(cat, ROOT, "a", S_IFDIR | 0755, 0, 0, NULL, &a), -EEXIST);
	ck_assert_int_eq(wfs_catalog_create(cat, ROOT, "d", S_IFREG | 0644, 0, 0, NULL, &a), -EEXIST);
	ck_assert_int_eq(wfs_catalog_create(cat, ROOT, "d", S_IFLNK | 0777, 0, 0, "t", &a), -EEXIST);
	ck_assert_uint_eq(a.ino, 4242); /* out parameter untouched */
	ck_assert_uint_eq(ino_at(ROOT, "a"), f);
	ck_assert_uint_eq(ino_at(ROOT, "d"), d);
	ck_assert_uint_eq(nlink_of(ROOT), 3); /* the failed mkdir did not count */
	ck_assert_uint_eq(get(ROOT).nlink, before.nlink);
	/* The same name in another directory is fine. */
	ck_assert_uint_ne(mkfile(d, "a"), f);
}
END_TEST

START_TEST(test_create_enotdir)
{
	uint64_t f = mkfile(ROOT, "f"), d = mkdir_(ROOT, "d");
	struct wfs_attr a;

	ck_assert_int_eq(wfs_catalog_create(cat, f, "x", S_IFREG | 0644, 0, 0, NULL, &a), -ENOTDIR);
	ck_assert_int_eq(wfs_catalog_create(cat, f, "x", S_IFDIR | 0755, 0, 0, NULL, &a), -ENOTDIR);
	ck_assert_int_eq(wfs_catalog_lookup(cat, f, "x", &a), -ENOTDIR);
	ck_assert_int_eq(wfs_catalog_create(cat, 987654, "x", S_IFREG | 0644, 0, 0, NULL, &a), -ENOENT);
	ck_assert_int_eq(wfs_catalog_lookup(cat, ROOT, "nothing", &a), -ENOENT);
	ck_assert_int_eq(wfs_catalog_getattr(cat, 987654, &a), -ENOENT);
	/* A removed directory (still referenced, nlink 0) takes no new entries. */
	unlink_ok(ROOT, "d", true, d);
	ck_assert_int_eq(wfs_catalog_create(cat, d, "x", S_IFREG | 0644, 0, 0, NULL, &a), -ENOENT);
	ck_assert_int_eq(nlink_of(f), 1);
}
END_TEST

/* ---- unlink / rmdir, link counts ------------------------------------------------------------- */

START_TEST(test_unlink_semantics)
{
	uint64_t f = mkfile(ROOT, "f"), d = mkdir_(ROOT, "d"), e = mkdir_(ROOT, "e");
	uint64_t inner = mkfile(d, "inner"), ino = 77;

	ck_assert_int_eq(wfs_catalog_unlink(cat, ROOT, "d", false, &ino), -EISDIR);
	ck_assert_int_eq(wfs_catalog_unlink(cat, ROOT, "f", true, &ino), -ENOTDIR);
	ck_assert_int_eq(wfs_catalog_unlink(cat, ROOT, "d", true, &ino), -ENOTEMPTY);
	ck_assert_int_eq(wfs_catalog_unlink(cat, ROOT, "missing", false, &ino), -ENOENT);
	ck_assert_int_eq(wfs_catalog_unlink(cat, ROOT, "missing", true, &ino), -ENOENT);
	ck_assert_int_eq(wfs_catalog_unlink(cat, f, "x", false, &ino), -ENOTDIR);
	ck_assert_uint_eq(ino, 77);
	ck_assert_uint_eq(nlink_of(ROOT), 4);

	unlink_ok(ROOT, "f", false, f);
	ck_assert_uint_eq(ino_at(ROOT, "f"), 0);
	ck_assert_uint_eq(nlink_of(f), 0); /* the inode lives on until dropped */
	ck_assert_uint_eq(nlink_of(ROOT), 4);

	unlink_ok(ROOT, "e", true, e);
	ck_assert_uint_eq(nlink_of(e), 0);
	ck_assert_uint_eq(nlink_of(ROOT), 3);

	unlink_ok(d, "inner", false, inner);
	unlink_ok(ROOT, "d", true, d);
	ck_assert_uint_eq(nlink_of(d), 0);
	ck_assert_uint_eq(nlink_of(ROOT), 2);
	ck_assert_uint_eq(ino_at(ROOT, "d"), 0);
}
END_TEST

/* A directory's nlink is 2 + its subdirectories; files do not count. */
START_TEST(test_nlink_dirs)
{
	uint64_t a, b, x;

	ck_assert_uint_eq(nlink_of(ROOT), 2);
	a = mkdir_(ROOT, "a");
	b = mkdir_(ROOT, "b");
	ck_assert_uint_eq(nlink_of(ROOT), 4);
	x = mkdir_(a, "x");
	mkdir_(a, "y");
	mkfile(a, "file");
	mk(a, "sym", S_IFLNK | 0777, "t");
	ck_assert_uint_eq(nlink_of(a), 4);
	ck_assert_uint_eq(nlink_of(x), 2);
	ck_assert_uint_eq(nlink_of(b), 2);
	ck_assert_uint_eq(nlink_of(ROOT), 4);
	unlink_ok(a, "x", true, x);
	ck_assert_uint_eq(nlink_of(a), 3);
	unlink_ok(ROOT, "b", true, b);
	ck_assert_uint_eq(nlink_of(ROOT), 3);
}
END_TEST

START_TEST(test_hard_links)
{
	uint64_t f = mkfile(ROOT, "f"), d = mkdir_(ROOT, "d"), g = mkfile(ROOT, "g");
	struct wfs_attr a;

	ck_assert_int_eq(wfs_catalog_link(cat, f, d, "f2", &a), 0);
	ck_assert_uint_eq(a.ino, f);
	ck_assert_uint_eq(a.nlink, 2);
	ck_assert_int_eq(wfs_catalog_link(cat, f, ROOT, "f3", &a), 0);
	ck_assert_uint_eq(a.nlink, 3);
	ck_assert_uint_eq(ino_at(d, "f2"), f);
	ck_assert_uint_eq(ino_at(ROOT, "f3"), f);
	ck_assert_uint_eq(nlink_of(d), 2); /* hard links to files do not change a directory's nlink */

	a.ino = 55;
	ck_assert_int_eq(wfs_catalog_link(cat, d, ROOT, "d2", &a), -EPERM);
	ck_assert_int_eq(wfs_catalog_link(cat, f, ROOT, "g", &a), -EEXIST);
	ck_assert_int_eq(wfs_catalog_link(cat, f, g, "x", &a), -ENOTDIR);
	ck_assert_int_eq(wfs_catalog_link(cat, 987654, ROOT, "x", &a), -ENOENT);
	ck_assert_uint_eq(a.ino, 55);
	ck_assert_uint_eq(nlink_of(f), 3);
	ck_assert_uint_eq(nlink_of(g), 1);

	unlink_ok(ROOT, "f", false, f);
	ck_assert_uint_eq(nlink_of(f), 2);
	unlink_ok(d, "f2", false, f);
	ck_assert_uint_eq(nlink_of(f), 1);
	unlink_ok(ROOT, "f3", false, f);
	ck_assert_uint_eq(nlink_of(f), 0);
	/* An inode without names cannot gain one back. */
	ck_assert_int_eq(wfs_catalog_link(cat, f, ROOT, "again", &a), -ENOENT);
}
END_TEST

/* ---- rename ---------------------------------------------------------------------------------- */

START_TEST(test_rename_plain)
{
	uint64_t f = mkfile(ROOT, "f"), a = mkdir_(ROOT, "a"), b = mkdir_(ROOT, "b");
	uint64_t sub = mkdir_(a, "sub"), replaced = 99;

	/* Same directory. */
	ck_assert_int_eq(wfs_catalog_rename(cat, ROOT, "f", ROOT, "g", 0, &replaced), 0);
	ck_assert_uint_eq(replaced, 0);
	ck_assert_uint_eq(ino_at(ROOT, "f"), 0);
	ck_assert_uint_eq(ino_at(ROOT, "g"), f);
	ck_assert_uint_eq(nlink_of(f), 1);
	/* Across directories. */
	ck_assert_int_eq(wfs_catalog_rename(cat, ROOT, "g", a, "g", 0, &replaced), 0);
	ck_assert_uint_eq(ino_at(a, "g"), f);
	ck_assert_uint_eq(ino_at(ROOT, "g"), 0);
	/* A directory moving between parents moves a link count and its ".." with it. */
	ck_assert_uint_eq(nlink_of(a), 3);
	ck_assert_uint_eq(nlink_of(b), 2);
	ck_assert_int_eq(wfs_catalog_rename(cat, a, "sub", b, "moved", 0, &replaced), 0);
	ck_assert_uint_eq(replaced, 0);
	ck_assert_uint_eq(ino_at(b, "moved"), sub);
	ck_assert_uint_eq(get(sub).parent, b);
	ck_assert_uint_eq(nlink_of(sub), 2);
	ck_assert_uint_eq(nlink_of(a), 2);
	ck_assert_uint_eq(nlink_of(b), 3);
	ck_assert_uint_eq(nlink_of(ROOT), 4);
	/* Renaming a name onto another name of the same inode does nothing (rename(2)). */
	ck_assert_int_eq(wfs_catalog_link(cat, f, a, "g2", &(struct wfs_attr){0}), 0);
	ck_assert_int_eq(wfs_catalog_rename(cat, a, "g", a, "g2", 0, &replaced), 0);
	ck_assert_uint_eq(replaced, 0);
	ck_assert_uint_eq(ino_at(a, "g"), f);
	ck_assert_uint_eq(ino_at(a, "g2"), f);
	ck_assert_uint_eq(nlink_of(f), 2);
	/* Missing source. */
	replaced = 99;
	ck_assert_int_eq(wfs_catalog_rename(cat, ROOT, "nope", ROOT, "x", 0, &replaced), -ENOENT);
	ck_assert_int_eq(wfs_catalog_rename(cat, ROOT, "a", 987654, "x", 0, &replaced), -ENOENT);
	ck_assert_int_eq(wfs_catalog_rename(cat, ROOT, "a", f, "x", 0, &replaced), -ENOTDIR);
	ck_assert_uint_eq(replaced, 99);
}
END_TEST

START_TEST(test_rename_replace)
{
	uint64_t src = mkfile(ROOT, "src"), dst = mkfile(ROOT, "dst"), linked = mkfile(ROOT, "linked");
	uint64_t d1 = mkdir_(ROOT, "d1"), d2 = mkdir_(ROOT, "d2"), replaced = 0;

	ck_assert_int_eq(wfs_catalog_rename(cat, ROOT, "src", ROOT, "dst", 0, &replaced), 0);
	ck_assert_uint_eq(replaced, dst);
	ck_assert_uint_eq(nlink_of(dst), 0);
	ck_assert_uint_eq(ino_at(ROOT, "dst"), src);
	ck_assert_uint_eq(ino_at(ROOT, "src"), 0);
	ck_assert_uint_eq(nlink_of(src), 1);

	/* Replacing one name of a hard-linked file leaves the other. */
	ck_assert_int_eq(wfs_catalog_link(cat, linked, d1, "other", &(struct wfs_attr){0}), 0);
	ck_assert_int_eq(wfs_catalog_rename(cat, ROOT, "dst", ROOT, "linked", 0, &replaced), 0);
	ck_assert_uint_eq(replaced, linked);
	ck_assert_uint_eq(nlink_of(linked), 1);
	ck_assert_uint_eq(ino_at(d1, "other"), linked);

	/* A directory over an empty directory, across parents. */
	ck_assert_uint_eq(nlink_of(ROOT), 4);
	{
		uint64_t victim = mkdir_(d2, "victim"), mover = mkdir_(d1, "mover");

		ck_assert_uint_eq(nlink_of(d1), 3);
		ck_assert_uint_eq(nlink_of(d2), 3);
		ck_assert_int_eq(wfs_catalog_rename(cat, d1, "mover", d2, "victim", 0, &replaced), 0);
		ck_assert_uint_eq(replaced, victim);
		ck_assert_uint_eq(nlink_of(victim), 0);
		ck_assert_uint_eq(ino_at(d2, "victim"), mover);
		ck_assert_uint_eq(get(mover).parent, d2);
		ck_assert_uint_eq(nlink_of(d1), 2);
		ck_assert_uint_eq(nlink_of(d2), 3);
		/* And within one parent. */
		mkdir_(d2, "other");
		ck_assert_uint_eq(nlink_of(d2), 4);
		ck_assert_int_eq(wfs_catalog_rename(cat, d2, "victim", d2, "other", 0, &replaced), 0);
		ck_assert_uint_ne(replaced, 0);
		ck_assert_uint_eq(nlink_of(replaced), 0);
		ck_assert_uint_eq(nlink_of(d2), 3);
		ck_assert_uint_eq(ino_at(d2, "other"), mover);
	}
	ck_assert_uint_eq(nlink_of(ROOT), 4);
}
END_TEST

START_TEST(test_rename_noreplace)
{
	uint64_t a = mkfile(ROOT, "a"), b = mkfile(ROOT, "b"), replaced = 99;

	ck_assert_int_eq(wfs_catalog_rename(cat, ROOT, "a", ROOT, "b", RENAME_NOREPLACE, &replaced),
			 -EEXIST);
	ck_assert_uint_eq(replaced, 99);
	ck_assert_uint_eq(ino_at(ROOT, "a"), a);
	ck_assert_uint_eq(ino_at(ROOT, "b"), b);
	ck_assert_uint_eq(nlink_of(b), 1);
	ck_assert_int_eq(wfs_catalog_rename(cat, ROOT, "a", ROOT, "c", RENAME_NOREPLACE, &replaced), 0);
	ck_assert_uint_eq(replaced, 0);
	ck_assert_uint_eq(ino_at(ROOT, "c"), a);
	ck_assert_uint_eq(ino_at(ROOT, "a"), 0);
}
END_TEST

START_TEST(test_rename_exchange)
{
	uint64_t f = mkfile(ROOT, "f"), g = mkfile(ROOT, "g"), a = mkdir_(ROOT, "a"), b = mkdir_(ROOT, "b");
	uint64_t sub = mkdir_(a, "sub"), file_in_b = mkfile(b, "file"), replaced = 99;

	ck_assert_int_eq(wfs_catalog_rename(cat, ROOT, "f", ROOT, "g", RENAME_EXCHANGE, &replaced), 0);
	ck_assert_uint_eq(replaced, 0);
	ck_assert_uint_eq(ino_at(ROOT, "f"), g);
	ck_assert_uint_eq(ino_at(ROOT, "g"), f);
	ck_assert_uint_eq(nlink_of(f), 1);
	ck_assert_uint_eq(nlink_of(g), 1);

	/* A directory and a file in different parents: the directory's link moves with it. */
	ck_assert_uint_eq(nlink_of(a), 3);
	ck_assert_uint_eq(nlink_of(b), 2);
	ck_assert_int_eq(wfs_catalog_rename(cat, a, "sub", b, "file", RENAME_EXCHANGE, &replaced), 0);
	ck_assert_uint_eq(ino_at(a, "sub"), file_in_b);
	ck_assert_uint_eq(ino_at(b, "file"), sub);
	ck_assert_uint_eq(get(sub).parent, b);
	ck_assert_uint_eq(nlink_of(a), 2);
	ck_assert_uint_eq(nlink_of(b), 3);
	ck_assert_uint_eq(nlink_of(sub), 2);

	/* Two directories. */
	ck_assert_int_eq(wfs_catalog_rename(cat, ROOT, "a", ROOT, "b", RENAME_EXCHANGE, &replaced), 0);
	ck_assert_uint_eq(ino_at(ROOT, "a"), b);
	ck_assert_uint_eq(ino_at(ROOT, "b"), a);
	ck_assert_uint_eq(nlink_of(ROOT), 4);

	replaced = 99;
	ck_assert_int_eq(wfs_catalog_rename(cat, ROOT, "f", ROOT, "none", RENAME_EXCHANGE, &replaced),
			 -ENOENT);
	ck_assert_int_eq(wfs_catalog_rename(cat, ROOT, "f", ROOT, "g", RENAME_EXCHANGE | RENAME_NOREPLACE,
					    &replaced),
			 -EINVAL);
	ck_assert_int_eq(wfs_catalog_rename(cat, ROOT, "f", ROOT, "g", RENAME_WHITEOUT, &replaced), -EINVAL);
	ck_assert_int_eq(wfs_catalog_rename(cat, ROOT, "f", ROOT, "g", 1u << 20, &replaced), -EINVAL);
	ck_assert_uint_eq(replaced, 99);
	ck_assert_uint_eq(ino_at(ROOT, "f"), g);
}
END_TEST

START_TEST(test_rename_into_subtree)
{
	uint64_t a = mkdir_(ROOT, "a"), b = mkdir_(a, "b"), c = mkdir_(b, "c"), replaced = 99;

	ck_assert_int_eq(wfs_catalog_rename(cat, ROOT, "a", a, "x", 0, &replaced), -EINVAL);
	ck_assert_int_eq(wfs_catalog_rename(cat, ROOT, "a", b, "x", 0, &replaced), -EINVAL);
	ck_assert_int_eq(wfs_catalog_rename(cat, ROOT, "a", c, "x", 0, &replaced), -EINVAL);
	ck_assert_int_eq(wfs_catalog_rename(cat, a, "b", c, "x", RENAME_NOREPLACE, &replaced), -EINVAL);
	/* Exchanging a directory with one of its descendants. */
	ck_assert_int_eq(wfs_catalog_rename(cat, ROOT, "a", b, "c", RENAME_EXCHANGE, &replaced), -EINVAL);
	ck_assert_int_eq(wfs_catalog_rename(cat, b, "c", ROOT, "a", RENAME_EXCHANGE, &replaced), -EINVAL);
	ck_assert_uint_eq(replaced, 99);
	ck_assert_uint_eq(ino_at(ROOT, "a"), a);
	ck_assert_uint_eq(ino_at(a, "b"), b);
	ck_assert_uint_eq(ino_at(b, "c"), c);
	ck_assert_uint_eq(get(c).parent, b);
	/* Moving up is fine. */
	ck_assert_int_eq(wfs_catalog_rename(cat, b, "c", ROOT, "c", 0, &replaced), 0);
	ck_assert_uint_eq(get(c).parent, ROOT);
	ck_assert_uint_eq(nlink_of(b), 2);
	ck_assert_uint_eq(nlink_of(ROOT), 4);
}
END_TEST

START_TEST(test_rename_type_errors)
{
	uint64_t d = mkdir_(ROOT, "d"), full = mkdir_(ROOT, "full"), f = mkfile(ROOT, "f");
	uint64_t in_full = mkfile(full, "x"), replaced = 99;

	ck_assert_int_eq(wfs_catalog_rename(cat, ROOT, "d", ROOT, "full", 0, &replaced), -ENOTEMPTY);
	ck_assert_int_eq(wfs_catalog_rename(cat, ROOT, "f", ROOT, "d", 0, &replaced), -EISDIR);
	ck_assert_int_eq(wfs_catalog_rename(cat, ROOT, "d", ROOT, "f", 0, &replaced), -ENOTDIR);
	ck_assert_uint_eq(replaced, 99);
	ck_assert_uint_eq(ino_at(ROOT, "d"), d);
	ck_assert_uint_eq(ino_at(ROOT, "full"), full);
	ck_assert_uint_eq(ino_at(ROOT, "f"), f);
	ck_assert_uint_eq(ino_at(full, "x"), in_full);
	ck_assert_uint_eq(nlink_of(f), 1);
	ck_assert_uint_eq(nlink_of(d), 2);
	ck_assert_uint_eq(nlink_of(full), 2);
	ck_assert_uint_eq(nlink_of(ROOT), 4);
}
END_TEST

/* ---- content, refcounts, drop ---------------------------------------------------------------- */

START_TEST(test_set_content_refcounts)
{
	uint64_t f = mkfile(ROOT, "f"), g = mkfile(ROOT, "g"), d = mkdir_(ROOT, "d");
	struct wfs_digest x = dg("X"), y = dg("Y");
	struct timespec t = {.tv_sec = 1600000000, .tv_nsec = 42};
	struct wfs_attr old, out;
	uint64_t n = 0;

	int64_t t0 = now();

	ck_assert_int_eq(wfs_catalog_object_refcount(cat, &x, &n), -ENOENT);
	ck_assert_int_eq(wfs_catalog_set_content(cat, f, &x, 1000, &t, NULL, 0, &old, &out), 0);
	ck_assert(!old.sealed);
	ck_assert_uint_eq(old.ino, f);
	ck_assert(out.sealed);
	ck_assert_mem_eq(out.digest.bytes, x.bytes, WFS_DIGEST_BYTES);
	ck_assert_uint_eq(out.size, 1000);
	ck_assert_int_eq(ns(&out.mtime), ns(&t)); /* as given: a writer's utimes(2) */
	ck_assert_int_ge(ns(&out.ctime), t0);     /* the change's time, never set */
	{
		struct wfs_attr again = get(f);

		assert_attr_eq(&again, &out);
	}
	ck_assert_uint_eq(refcount("X"), 1);
	ck_assert_int_eq(wfs_catalog_set_content(cat, g, &x, 1000, &t, NULL, WFS_CONTENT_DURABLE, &old, &out), 0);
	ck_assert_uint_eq(refcount("X"), 2);

	/* Re-sealing g with another object: 1 and 1; old gives the previous content. */
	ck_assert_int_eq(wfs_catalog_set_content(cat, g, &y, 7, &t, NULL, 0, &old, &out), 0);
	ck_assert(old.sealed);
	ck_assert_mem_eq(old.digest.bytes, x.bytes, WFS_DIGEST_BYTES);
	ck_assert_uint_eq(old.size, 1000);
	ck_assert_uint_eq(out.size, 7);
	ck_assert_uint_eq(refcount("X"), 1);
	ck_assert_uint_eq(refcount("Y"), 1);
	/* The same content again changes nothing. */
	ck_assert_int_eq(wfs_catalog_set_content(cat, g, &y, 7, &t, NULL, 0, &old, &out), 0);
	ck_assert_uint_eq(refcount("Y"), 1);

	/* Only regular files take content. */
	ck_assert_int_eq(wfs_catalog_set_content(cat, d, &x, 1, &t, NULL, 0, &old, &out), -EISDIR);
	ck_assert_int_eq(wfs_catalog_set_content(cat, 987654, &x, 1, &t, NULL, 0, &old, &out), -ENOENT);
	ck_assert_uint_eq(refcount("X"), 1);

	/* Unlink and drop g: Y becomes unreferenced, and only then may it be forgotten. */
	ck_assert_int_eq(wfs_catalog_object_delete(cat, &y), -EBUSY);
	unlink_ok(ROOT, "g", false, g);
	ck_assert_uint_eq(refcount("Y"), 1); /* the nlink-0 inode still references it */
	ck_assert_int_eq(wfs_catalog_inode_drop(cat, g, &old), 0);
	ck_assert(old.sealed);
	ck_assert_mem_eq(old.digest.bytes, y.bytes, WFS_DIGEST_BYTES);
	ck_assert_uint_eq(refcount("Y"), 0);
	ck_assert_uint_eq(refcount("X"), 1);
	ck_assert_int_eq(wfs_catalog_object_delete(cat, &x), -EBUSY);
	ck_assert_int_eq(wfs_catalog_object_delete(cat, &y), 0);
	ck_assert_int_eq(wfs_catalog_object_refcount(cat, &y, &n), -ENOENT);
	ck_assert_int_eq(wfs_catalog_object_delete(cat, &y), -ENOENT);
}
END_TEST

/* A file sealed at its creation: one transaction, as create + xattrs + set_content would leave it. */
START_TEST(test_create_sealed)
{
	struct wfs_digest x = dg("X"), y = dg("Y");
	struct wfs_catalog_xattr xa[2] = {{"user.weightfs.dtype", "BF16", 4}, {"user.weightfs.shape", "[500]", 5}};
	struct wfs_attr out, seen;
	uint64_t f = mkfile(ROOT, "f"), d = mkdir_(ROOT, "d");
	int64_t t0 = now();
	char buf[16];
	size_t len = 0;

	seal(f, "X", 1000); /* the object row exists already: one more reference */
	ck_assert_int_eq(wfs_catalog_create_sealed(cat, d, "t", S_IFREG | 0640, 7, 8, &x, 1000, xa, 2, &out), 0);
	ck_assert(out.sealed);
	ck_assert_mem_eq(out.digest.bytes, x.bytes, WFS_DIGEST_BYTES);
	ck_assert_uint_eq(out.size, 1000);
	ck_assert_uint_eq(out.nlink, 1);
	ck_assert_uint_eq(out.mode, S_IFREG | 0640);
	ck_assert_int_ge(ns(&out.mtime), t0);
	ck_assert_int_le(ns(&out.mtime), now());
	ck_assert_int_eq(wfs_catalog_lookup(cat, d, "t", &seen), 0);
	assert_attr_eq(&seen, &out);
	ck_assert_uint_eq(refcount("X"), 2);
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, out.ino, "user.weightfs.dtype", buf, sizeof(buf), &len), 0);
	ck_assert_uint_eq(len, 4);
	ck_assert_mem_eq(buf, "BF16", 4);
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, out.ino, "user.weightfs.shape", buf, sizeof(buf), &len), 0);
	ck_assert_mem_eq(buf, "[500]", 5);
	seen = get(d);
	ck_assert_int_ge(ns(&seen.mtime), t0); /* the directory changed */

	/* A new object gets its row; no attributes is fine. */
	ck_assert_int_eq(wfs_catalog_create_sealed(cat, ROOT, "y", S_IFREG | 0644, 0, 0, &y, 7, NULL, 0, &out), 0);
	ck_assert_uint_eq(refcount("Y"), 1);
	ck_assert_int_eq(wfs_catalog_xattr_list(cat, out.ino, buf, sizeof(buf), &len), 0);
	ck_assert_uint_eq(len, 0);

	/* Errors change nothing. */
	ck_assert_int_eq(wfs_catalog_create_sealed(cat, d, "t", S_IFREG | 0644, 0, 0, &x, 1000, NULL, 0, &out), -EEXIST);
	ck_assert_int_eq(wfs_catalog_create_sealed(cat, f, "u", S_IFREG | 0644, 0, 0, &x, 1000, NULL, 0, &out), -ENOTDIR);
	ck_assert_int_eq(wfs_catalog_create_sealed(cat, d, "u", S_IFDIR | 0755, 0, 0, &x, 1000, NULL, 0, &out), -EINVAL);
	xa[1].name = xa[0].name;
	ck_assert_int_eq(wfs_catalog_create_sealed(cat, d, "u", S_IFREG | 0644, 0, 0, &x, 1000, xa, 2, &out), -EINVAL);
	ck_assert_int_eq(wfs_catalog_lookup(cat, d, "u", &seen), -ENOENT);
	ck_assert_uint_eq(refcount("X"), 2);
}
END_TEST

struct unref_list {
	int n, stop_after;
	struct wfs_digest d[16];
	uint64_t bytes[16];
};

static int collect_unref(void *ctx, const struct wfs_digest *d, uint64_t bytes)
{
	struct unref_list *l = ctx;

	if (l->n < 16) {
		l->d[l->n] = *d;
		l->bytes[l->n] = bytes;
	}
	l->n++;
	return l->stop_after && l->n >= l->stop_after;
}

/* Index in @l of @content's digest, or -1. */
static int unref_find(const struct unref_list *l, const char *content)
{
	struct wfs_digest d = dg(content);

	for (int i = 0; i < l->n && i < 16; i++)
		if (wfs_digest_equal(&l->d[i], &d))
			return i;
	return -1;
}

START_TEST(test_unreferenced)
{
	uint64_t a = mkfile(ROOT, "a"), b = mkfile(ROOT, "b"), c = mkfile(ROOT, "c");
	struct unref_list l = {0};
	struct wfs_attr old;

	seal(a, "A", 10);
	seal(b, "B", 20);
	seal(c, "C", 30);
	ck_assert_int_eq(wfs_catalog_unreferenced(cat, collect_unref, &l), 0);
	ck_assert_int_eq(l.n, 0);

	seal(a, "A2", 11); /* A loses its only reference */
	unlink_ok(ROOT, "b", false, b);
	ck_assert_int_eq(wfs_catalog_inode_drop(cat, b, &old), 0); /* so does B */
	ck_assert_int_eq(wfs_catalog_unreferenced(cat, collect_unref, &l), 0);
	ck_assert_int_eq(l.n, 2);
	ck_assert_int_ge(unref_find(&l, "A"), 0);
	ck_assert_int_ge(unref_find(&l, "B"), 0);
	ck_assert_uint_eq(l.bytes[unref_find(&l, "A")], 10);
	ck_assert_uint_eq(l.bytes[unref_find(&l, "B")], 20);

	/* A non-zero return stops the walk. */
	memset(&l, 0, sizeof(l));
	l.stop_after = 1;
	ck_assert_int_eq(wfs_catalog_unreferenced(cat, collect_unref, &l), 0);
	ck_assert_int_eq(l.n, 1);

	/* Re-referencing an unreferenced object takes it off the list. */
	seal(c, "A", 10);
	memset(&l, 0, sizeof(l));
	ck_assert_int_eq(wfs_catalog_unreferenced(cat, collect_unref, &l), 0);
	ck_assert_int_eq(l.n, 2);
	ck_assert_int_ge(unref_find(&l, "B"), 0);
	ck_assert_int_ge(unref_find(&l, "C"), 0);
	ck_assert_int_eq(unref_find(&l, "A"), -1);
}
END_TEST

/* The retention budget is the store's: recorded once, read back by every later handle. */
START_TEST(test_retain_budget)
{
	struct wfs_catalog *ro = NULL;
	uint64_t bytes = 1;

	ck_assert_int_eq(wfs_catalog_retain_get(cat, &bytes), 0);
	ck_assert_uint_eq(bytes, 0); /* never recorded: keep nothing */
	ck_assert_int_eq(wfs_catalog_retain_set(cat, 4ull << 30), 0);
	ck_assert_int_eq(wfs_catalog_retain_set(cat, 64ull << 30), 0); /* replaced, not added */
	wfs_catalog_close(cat);
	ck_assert_int_eq(wfs_catalog_open(db_path, 0, 0, 0, &cat), 0);
	ck_assert_int_eq(wfs_catalog_retain_get(cat, &bytes), 0);
	ck_assert_uint_eq(bytes, 64ull << 30);
	ck_assert_int_eq(wfs_catalog_retain_set(cat, UINT64_MAX - 1), 0); /* the whole uint64_t range */
	ck_assert_int_eq(wfs_catalog_open(db_path, WFS_CATALOG_READONLY, 0, 0, &ro), 0);
	ck_assert_int_eq(wfs_catalog_retain_get(ro, &bytes), 0);
	ck_assert_uint_eq(bytes, UINT64_MAX - 1);
	ck_assert_int_eq(wfs_catalog_retain_set(ro, 0), -EROFS);
	wfs_catalog_close(ro);
}
END_TEST

START_TEST(test_inode_drop)
{
	uint64_t f = mkfile(ROOT, "f"), d = mkdir_(ROOT, "d");
	struct wfs_attr old;
	char buf[8];
	size_t len = 0;

	old.ino = 31337;
	ck_assert_int_eq(wfs_catalog_inode_drop(cat, f, &old), -EBUSY);
	ck_assert_int_eq(wfs_catalog_inode_drop(cat, d, &old), -EBUSY);
	ck_assert_int_eq(wfs_catalog_inode_drop(cat, ROOT, &old), -EBUSY);
	ck_assert_int_eq(wfs_catalog_inode_drop(cat, 987654, &old), -ENOENT);
	ck_assert_uint_eq(old.ino, 31337);

	ck_assert_int_eq(wfs_catalog_xattr_set(cat, f, "user.k", "v", 1, 0), 0);
	seal(f, "F", 5);
	unlink_ok(ROOT, "f", false, f);
	ck_assert_uint_eq(nlink_of(f), 0);
	ck_assert_int_eq(wfs_catalog_inode_drop(cat, f, &old), 0);
	ck_assert_uint_eq(old.ino, f);
	ck_assert_uint_eq(old.nlink, 0);
	ck_assert(old.sealed);
	ck_assert_uint_eq(old.size, 5);
	ck_assert_uint_eq(refcount("F"), 0);
	ck_assert_int_eq(wfs_catalog_getattr(cat, f, &old), -ENOENT);
	ck_assert_int_eq(wfs_catalog_inode_drop(cat, f, &old), -ENOENT);
	/* Its xattrs went with it. */
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, f, "user.k", buf, sizeof(buf), &len), -ENODATA);

	unlink_ok(ROOT, "d", true, d);
	ck_assert_int_eq(wfs_catalog_inode_drop(cat, d, &old), 0);
	ck_assert(S_ISDIR(old.mode));
	ck_assert_uint_eq(nlink_of(ROOT), 2);
}
END_TEST

/* Inode numbers only grow: a dropped inode's number is never handed out again, even after reopen. */
START_TEST(test_ino_never_reused)
{
	uint64_t a = mkfile(ROOT, "a"), b = mkfile(ROOT, "b"), c;
	struct wfs_attr old;

	ck_assert_uint_gt(b, a);
	unlink_ok(ROOT, "b", false, b);
	ck_assert_int_eq(wfs_catalog_inode_drop(cat, b, &old), 0);
	c = mkfile(ROOT, "c");
	ck_assert_uint_gt(c, b);
	unlink_ok(ROOT, "c", false, c);
	ck_assert_int_eq(wfs_catalog_inode_drop(cat, c, &old), 0);
	wfs_catalog_close(cat);
	ck_assert_int_eq(wfs_catalog_open(db_path, 0, 0, 0, &cat), 0);
	ck_assert_uint_gt(mkfile(ROOT, "d"), c);
}
END_TEST

/* ---- recovery -------------------------------------------------------------------------------- */

START_TEST(test_recover)
{
	uint64_t d = mkdir_(ROOT, "d");
	uint64_t sealed = mkfile(ROOT, "sealed"), unsealed = mkfile(ROOT, "unsealed");
	uint64_t deep = mkfile(d, "deep"), sym = mk(ROOT, "sym", S_IFLNK | 0777, "sealed");
	uint64_t orphan = mkfile(ROOT, "orphan"), empty = mkdir_(d, "empty");
	uint64_t raw_orphan = mkfile(ROOT, "raw"), gone_dir = mkdir_(ROOT, "gone");
	struct wfs_recovery r = {77, 77, 77};
	struct wfs_attr a;
	char buf[8];
	size_t len;

	seal(sealed, "S", 1);
	seal(orphan, "O", 2);
	ck_assert_int_eq(wfs_catalog_xattr_set(cat, unsealed, "user.x", "1", 1, 0), 0);
	unlink_ok(ROOT, "orphan", false, orphan); /* sealed, unlinked while open */
	unlink_ok(ROOT, "raw", false, raw_orphan); /* unsealed, unlinked while open */
	unlink_ok(ROOT, "gone", true, gone_dir);
	ck_assert_uint_eq(refcount("O"), 1);

	ck_assert_int_eq(wfs_catalog_recover(cat, &r), 0);
	ck_assert_uint_eq(r.unsealed_removed, 2); /* "unsealed" and "d/deep" */
	ck_assert_uint_eq(r.orphans_removed, 3);  /* orphan, raw, gone */

	ck_assert_uint_eq(ino_at(ROOT, "unsealed"), 0);
	ck_assert_uint_eq(ino_at(d, "deep"), 0);
	ck_assert_int_eq(wfs_catalog_getattr(cat, unsealed, &a), -ENOENT);
	ck_assert_int_eq(wfs_catalog_getattr(cat, deep, &a), -ENOENT);
	ck_assert_int_eq(wfs_catalog_getattr(cat, orphan, &a), -ENOENT);
	ck_assert_int_eq(wfs_catalog_getattr(cat, raw_orphan, &a), -ENOENT);
	ck_assert_int_eq(wfs_catalog_getattr(cat, gone_dir, &a), -ENOENT);
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, unsealed, "user.x", buf, sizeof(buf), &len), -ENODATA);
	ck_assert_uint_eq(refcount("O"), 0);
	/* Kept: sealed files, directories, symlinks, and the root. */
	ck_assert_uint_eq(ino_at(ROOT, "sealed"), sealed);
	ck_assert_uint_eq(ino_at(ROOT, "sym"), sym);
	ck_assert_uint_eq(ino_at(ROOT, "d"), d);
	ck_assert_uint_eq(ino_at(d, "empty"), empty);
	ck_assert_uint_eq(refcount("S"), 1);
	ck_assert_uint_eq(nlink_of(ROOT), 3);
	ck_assert_uint_eq(nlink_of(d), 3);

	/* Nothing left to do. */
	ck_assert_int_eq(wfs_catalog_recover(cat, &r), 0);
	ck_assert_uint_eq(r.unsealed_removed, 0);
	ck_assert_uint_eq(r.orphans_removed, 0);
}
END_TEST

/*
 * An unsealed file with two names (link(2) while it was still being written) next to one real
 * orphan: recover must report the two names and the one orphan.
 */
START_TEST(test_recover_counts_linked_unsealed)
{
	uint64_t u = mkfile(ROOT, "u"), orphan = mkfile(ROOT, "orphan");
	struct wfs_recovery r = {77, 77, 77};
	struct wfs_attr a;

	ck_assert_int_eq(wfs_catalog_link(cat, u, ROOT, "u2", &a), 0);
	seal(orphan, "O", 2);
	unlink_ok(ROOT, "orphan", false, orphan);
	ck_assert_int_eq(wfs_catalog_recover(cat, &r), 0);
	ck_assert_int_eq(wfs_catalog_getattr(cat, u, &a), -ENOENT);
	ck_assert_int_eq(wfs_catalog_getattr(cat, orphan, &a), -ENOENT);
	ck_assert_uint_eq(r.unsealed_removed, 2);
	ck_assert_msg(r.orphans_removed == 1, "orphans_removed = %llu, want 1 (the one unlinked sealed inode)",
		      (unsigned long long)r.orphans_removed);
}
END_TEST

/*
 * A large tensor's temporary name is closed empty once its dtype and shape are set, then reopened
 * for writing: a daemon killed meanwhile leaves it sealed with no bytes, declaring some. Recovery
 * removes those, and only those (issue 35).
 */
START_TEST(test_recover_declared_empty_tmp)
{
	uint64_t d = mkdir_(ROOT, "rank0");
	uint64_t cut = mkfile(d, ".wfs-tmp-1-0"), zero = mkfile(d, ".wfs-tmp-1-1");
	uint64_t full = mkfile(d, ".wfs-tmp-1-2"), bare = mkfile(d, ".wfs-tmp-1-3");
	uint64_t placeholder = mkfile(d, "placeholder");
	struct wfs_recovery r = {77, 77, 77};
	uint64_t declared = 0;
	struct wfs_attr a;
	char buf[8];
	size_t len;

	for (uint64_t *i = (uint64_t[]){cut, zero, bare, placeholder, 0}; *i; i++)
		seal(*i, "", 0);
	seal(full, "F", 16);
	ck_assert_int_eq(wfs_catalog_xattr_set(cat, cut, "user.weightfs.shape", "[1024,1024]", 11, 0), 0);
	ck_assert_int_eq(wfs_catalog_xattr_set(cat, cut, "user.weightfs.dtype", "F32", 3, 0), 0);
	ck_assert_int_eq(wfs_catalog_xattr_set(cat, zero, "user.weightfs.shape", "[0,8]", 5, 0), 0);
	ck_assert_int_eq(wfs_catalog_xattr_set(cat, zero, "user.weightfs.dtype", "F32", 3, 0), 0);
	ck_assert_int_eq(wfs_catalog_xattr_set(cat, full, "user.weightfs.shape", "[4]", 3, 0), 0);
	ck_assert_int_eq(wfs_catalog_xattr_set(cat, full, "user.weightfs.dtype", "F32", 3, 0), 0);
	ck_assert_int_eq(wfs_catalog_xattr_set(cat, placeholder, "user.weightfs.shape", "[4]", 3, 0), 0);
	ck_assert_int_eq(wfs_catalog_xattr_set(cat, placeholder, "user.weightfs.dtype", "BF16", 4, 0), 0);
	ck_assert_int_eq(wfs_catalog_declared_bytes(cat, cut, &declared), 0);
	ck_assert_uint_eq(declared, 4194304);
	ck_assert_int_eq(wfs_catalog_declared_bytes(cat, placeholder, &declared), 0);
	ck_assert_uint_eq(declared, 8);
	ck_assert_int_eq(wfs_catalog_declared_bytes(cat, bare, &declared), -ENODATA);
	ck_assert_uint_eq(refcount(""), 4);

	ck_assert_int_eq(wfs_catalog_recover(cat, &r), 0);
	ck_assert_uint_eq(r.declared_empty_removed, 1);
	ck_assert_uint_eq(r.unsealed_removed, 0);
	ck_assert_uint_eq(r.orphans_removed, 0);
	ck_assert_uint_eq(ino_at(d, ".wfs-tmp-1-0"), 0);
	ck_assert_int_eq(wfs_catalog_getattr(cat, cut, &a), -ENOENT);
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, cut, "user.weightfs.dtype", buf, sizeof(buf), &len), -ENODATA);
	ck_assert_uint_eq(refcount(""), 3);
	/* Kept: one that declares nothing, one that holds bytes, one without attributes, any other name. */
	ck_assert_uint_eq(ino_at(d, ".wfs-tmp-1-1"), zero);
	ck_assert_uint_eq(ino_at(d, ".wfs-tmp-1-2"), full);
	ck_assert_uint_eq(ino_at(d, ".wfs-tmp-1-3"), bare);
	ck_assert_uint_eq(ino_at(d, "placeholder"), placeholder);
	ck_assert_int_eq(wfs_catalog_recover(cat, &r), 0);
	ck_assert_uint_eq(r.declared_empty_removed, 0);
}
END_TEST

/* A backup is the committed catalog at its time; a restore puts it in place of a damaged one, whose
 * files are kept aside; a damaged catalog never replaces a good backup. */
START_TEST(test_backup_restore)
{
	char backup[700], aside[PATH_MAX], path[PATH_MAX], why[128];
	uint64_t a = mkfile(ROOT, "a"), b;
	struct wfs_attr attr;
	int fd;

	seal(a, "A", 1);
	tu_path(backup, sizeof(backup), tu_test_dir, "catalog.db.backup");
	ck_assert_int_eq(wfs_catalog_backup(cat, backup, true), 0);
	ck_assert_int_eq(wfs_catalog_diagnose(backup, why, sizeof(why)), 0);
	ck_assert_str_eq(why, "ok");
	b = mkfile(ROOT, "b"); /* after the backup */
	seal(b, "B", 2);
	wfs_catalog_close(cat);
	cat = NULL;
	fd = open(db_path, O_RDWR);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pwrite(fd, "\x07\x07\x07\x07\x07\x07\x07\x07", 8, 4096), 8);
	close(fd);
	ck_assert_int_eq(wfs_catalog_diagnose(db_path, why, sizeof(why)), 1);

	ck_assert_int_eq(wfs_catalog_restore(backup, db_path, aside), 0);
	snprintf(path, sizeof(path), "%s", aside);
	ck_assert_int_eq(access(path, F_OK), 0); /* the damaged file, kept */
	ck_assert_int_eq(wfs_catalog_diagnose(path, why, sizeof(why)), 1);
	ck_assert_int_eq(wfs_catalog_open(db_path, 0, UID, GID, &cat), 0);
	ck_assert_uint_eq(ino_at(ROOT, "a"), a);
	ck_assert_uint_eq(ino_at(ROOT, "b"), 0); /* made after the backup */
	ck_assert_int_eq(wfs_catalog_getattr(cat, a, &attr), 0);
	ck_assert(attr.sealed);
	ck_assert_uint_eq(refcount("A"), 1);

	/* A damaged source: the backup stays as it was. */
	{
		char bad[700];
		struct wfs_catalog *c2 = NULL;

		tu_path(bad, sizeof(bad), tu_test_dir, "bad.db");
		ck_assert_int_eq(wfs_catalog_open(bad, WFS_CATALOG_CREATE, UID, GID, &c2), 0);
		for (int i = 0; i < 40; i++) {
			char name[16];

			snprintf(name, sizeof(name), "f%d", i);
			ck_assert_int_eq(wfs_catalog_create(c2, ROOT, name, S_IFREG | 0644, 0, 0, NULL, &attr), 0);
		}
		ck_assert_int_eq(wfs_catalog_checkpoint(c2), 0);
		fd = open(bad, O_RDWR);
		ck_assert_int_ge(fd, 0);
		ck_assert_int_eq(pwrite(fd, "\x07\x07\x07\x07\x07\x07\x07\x07", 8, 4096), 8);
		close(fd);
		ck_assert_int_eq(wfs_catalog_backup(c2, backup, false), -EIO);
		wfs_catalog_close(c2);
		ck_assert_int_eq(wfs_catalog_diagnose(backup, why, sizeof(why)), 0);
	}
	/* No backup: nothing changes. */
	tu_path(path, sizeof(path), tu_test_dir, "none.backup");
	ck_assert_int_eq(wfs_catalog_restore(path, db_path, aside), -ENOENT);
}
END_TEST

/* ---- readdir --------------------------------------------------------------------------------- */

#define MAX_ENTRIES 10000

struct listing {
	int n, stop_after;
	char (*names)[32];
	uint64_t ino[MAX_ENTRIES];
	uint64_t cookie[MAX_ENTRIES];
	struct wfs_attr first_attr;
};

static int collect(void *ctx, const char *name, const struct wfs_attr *attr, uint64_t next_cookie)
{
	struct listing *l = ctx;

	if (l->n >= MAX_ENTRIES)
		return 1;
	if (l->n == 0)
		l->first_attr = *attr;
	snprintf(l->names[l->n], sizeof(l->names[0]), "%s", name);
	l->ino[l->n] = attr->ino;
	l->cookie[l->n] = next_cookie;
	l->n++;
	return l->stop_after && l->n >= l->stop_after;
}

static struct listing *listing_new(void)
{
	struct listing *l = calloc(1, sizeof(*l));

	ck_assert_ptr_nonnull(l);
	l->names = calloc(MAX_ENTRIES, sizeof(l->names[0]));
	ck_assert_ptr_nonnull(l->names);
	return l;
}

static void listing_reset(struct listing *l)
{
	l->n = 0;
	l->stop_after = 0;
}

static void listing_free(struct listing *l)
{
	free(l->names);
	free(l);
}

START_TEST(test_readdir_order_and_resume)
{
	const int n = 50;
	struct listing *all = listing_new(), *again = listing_new(), *rest = listing_new();
	uint64_t ino[50], d = mkdir_(ROOT, "d"), f;
	char name[32];

	for (int i = 0; i < n; i++) {
		/* Names not in creation order alphabetically, to show order is stable, not sorted. */
		snprintf(name, sizeof(name), "e%02d", (i * 37) % n);
		ino[i] = i % 5 == 0 ? mkdir_(d, name) : mkfile(d, name);
	}
	ck_assert_int_eq(wfs_catalog_readdir(cat, d, 0, collect, all), 0);
	ck_assert_int_eq(all->n, n);
	/* Each entry once, "." and ".." not among them, attributes as getattr has them. */
	for (int i = 0; i < n; i++) {
		int seen = 0;

		for (int j = 0; j < n; j++)
			seen += all->ino[j] == ino[i];
		ck_assert_int_eq(seen, 1);
		ck_assert_str_ne(all->names[i], ".");
		ck_assert_str_ne(all->names[i], "..");
		ck_assert_uint_eq(ino_at(d, all->names[i]), all->ino[i]);
	}
	{
		struct wfs_attr first = get(all->ino[0]);

		assert_attr_eq(&all->first_attr, &first);
	}
	/* Stable: a second listing is identical. */
	ck_assert_int_eq(wfs_catalog_readdir(cat, d, 0, collect, again), 0);
	ck_assert_int_eq(again->n, n);
	for (int i = 0; i < n; i++) {
		ck_assert_str_eq(again->names[i], all->names[i]);
		ck_assert_uint_eq(again->cookie[i], all->cookie[i]);
	}
	/* Resuming after entry k returns exactly entries k+1.. in the same order. */
	for (int k = 0; k < n; k++) {
		listing_reset(rest);
		ck_assert_int_eq(wfs_catalog_readdir(cat, d, all->cookie[k], collect, rest), 0);
		ck_assert_int_eq(rest->n, n - 1 - k);
		for (int i = 0; i < rest->n; i++)
			ck_assert_str_eq(rest->names[i], all->names[k + 1 + i]);
	}
	/* A non-zero return from the callback stops the listing. */
	listing_reset(rest);
	rest->stop_after = 3;
	ck_assert_int_eq(wfs_catalog_readdir(cat, d, 0, collect, rest), 0);
	ck_assert_int_eq(rest->n, 3);

	/* Remove the entry a cookie points at and some after it: resumption still works. */
	ck_assert_int_eq(wfs_catalog_unlink(cat, d, all->names[10], S_ISDIR(get(all->ino[10]).mode),
					    &f),
			 0);
	ck_assert_int_eq(wfs_catalog_unlink(cat, d, all->names[11], S_ISDIR(get(all->ino[11]).mode),
					    &f),
			 0);
	ck_assert_int_eq(wfs_catalog_unlink(cat, d, all->names[20], S_ISDIR(get(all->ino[20]).mode),
					    &f),
			 0);
	mkfile(d, "late"); /* created after the listing began: comes last */
	listing_reset(rest);
	ck_assert_int_eq(wfs_catalog_readdir(cat, d, all->cookie[10], collect, rest), 0);
	ck_assert_int_eq(rest->n, n - 12 - 1 + 1);
	for (int i = 0, k = 12; k < n; k++) {
		if (k == 20)
			continue;
		ck_assert_str_eq(rest->names[i], all->names[k]);
		i++;
	}
	ck_assert_str_eq(rest->names[rest->n - 1], "late");

	/* Errors. */
	f = mkfile(ROOT, "plain");
	ck_assert_int_eq(wfs_catalog_readdir(cat, f, 0, collect, rest), -ENOTDIR);
	ck_assert_int_eq(wfs_catalog_readdir(cat, 987654, 0, collect, rest), -ENOENT);
	/* An empty directory lists nothing; the root lists d and plain. */
	listing_reset(rest);
	ck_assert_int_eq(wfs_catalog_readdir(cat, ino[0], 0, collect, rest), 0);
	ck_assert_int_eq(rest->n, 0);
	listing_reset(rest);
	ck_assert_int_eq(wfs_catalog_readdir(cat, ROOT, 0, collect, rest), 0);
	ck_assert_int_eq(rest->n, 2);
	ck_assert_str_eq(rest->names[0], "d");
	ck_assert_str_eq(rest->names[1], "plain");
	listing_free(all);
	listing_free(again);
	listing_free(rest);
}
END_TEST

/* The callback may call into the catalog (the daemon looks entries up while listing). */
static int collect_and_lookup(void *ctx, const char *name, const struct wfs_attr *attr,
			      uint64_t next_cookie)
{
	struct listing *l = ctx;
	struct wfs_attr a;

	if (wfs_catalog_lookup(cat, ROOT, name, &a) != 0 || a.ino != attr->ino)
		return 1;
	return collect(ctx, name, attr, next_cookie) || l->n > MAX_ENTRIES;
}

START_TEST(test_readdir_reentrant)
{
	struct listing *l = listing_new();

	mkfile(ROOT, "a");
	mkfile(ROOT, "b");
	mkdir_(ROOT, "c");
	ck_assert_int_eq(wfs_catalog_readdir(cat, ROOT, 0, collect_and_lookup, l), 0);
	ck_assert_int_eq(l->n, 3);
	listing_free(l);
}
END_TEST

START_TEST(test_readdir_10k)
{
	const int n = 10000;
	struct listing *all = listing_new(), *page = listing_new();
	uint64_t d = mkdir_(ROOT, "big"), cookie = 0;
	char name[32];
	int total = 0;

	for (int i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "tensor.%05d", i);
		mkfile(d, name);
	}
	ck_assert_int_eq(wfs_catalog_readdir(cat, d, 0, collect, all), 0);
	ck_assert_int_eq(all->n, n);
	for (int i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "tensor.%05d", i);
		ck_assert_str_eq(all->names[i], name); /* creation order */
	}
	/* Page through 128 at a time, as getdents with a small buffer would. */
	for (;;) {
		listing_reset(page);
		page->stop_after = 128;
		ck_assert_int_eq(wfs_catalog_readdir(cat, d, cookie, collect, page), 0);
		if (page->n == 0)
			break;
		for (int i = 0; i < page->n; i++)
			ck_assert_str_eq(page->names[i], all->names[total + i]);
		total += page->n;
		cookie = page->cookie[page->n - 1];
	}
	ck_assert_int_eq(total, n);
	listing_free(all);
	listing_free(page);
}
END_TEST

/* ---- xattrs ---------------------------------------------------------------------------------- */

START_TEST(test_xattr_get_set)
{
	uint64_t f = mkfile(ROOT, "f"), g = mkfile(ROOT, "g");
	static const char bin[] = {'a', '\0', 'b', '\xff', '\0'};
	char buf[64];
	size_t len = 1234;

	ck_assert_int_eq(wfs_catalog_xattr_get(cat, f, "user.none", buf, sizeof(buf), &len), -ENODATA);
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, f, "user.none", NULL, 0, &len), -ENODATA);
	ck_assert_uint_eq(len, 1234);

	ck_assert_int_eq(wfs_catalog_xattr_set(cat, f, "user.model", "llama", 5, 0), 0);
	/* Size probe: size 0 gives the length and copies nothing. */
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, f, "user.model", NULL, 0, &len), 0);
	ck_assert_uint_eq(len, 5);
	len = 0;
	memset(buf, 'z', sizeof(buf));
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, f, "user.model", buf, 5, &len), 0);
	ck_assert_uint_eq(len, 5);
	ck_assert_mem_eq(buf, "llama", 5);
	ck_assert_int_eq(buf[5], 'z');
	len = 1234;
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, f, "user.model", buf, 4, &len), -ERANGE);
	ck_assert_uint_eq(len, 1234);
	/* Not visible on another inode. */
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, g, "user.model", buf, sizeof(buf), &len), -ENODATA);

	/* Flags. */
	ck_assert_int_eq(wfs_catalog_xattr_set(cat, f, "user.model", "x", 1, XATTR_CREATE), -EEXIST);
	ck_assert_int_eq(wfs_catalog_xattr_set(cat, f, "user.new", "x", 1, XATTR_REPLACE), -ENODATA);
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, f, "user.new", buf, sizeof(buf), &len), -ENODATA);
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, f, "user.model", buf, sizeof(buf), &len), 0);
	ck_assert_uint_eq(len, 5);
	ck_assert_mem_eq(buf, "llama", 5);
	ck_assert_int_eq(wfs_catalog_xattr_set(cat, f, "user.model", "mistral-7b", 10, XATTR_REPLACE), 0);
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, f, "user.model", buf, sizeof(buf), &len), 0);
	ck_assert_uint_eq(len, 10);
	ck_assert_mem_eq(buf, "mistral-7b", 10);
	ck_assert_int_eq(wfs_catalog_xattr_set(cat, f, "user.model", "q", 1, 0), 0); /* 0: upsert */
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, f, "user.model", buf, sizeof(buf), &len), 0);
	ck_assert_uint_eq(len, 1);
	ck_assert_int_eq(buf[0], 'q');
	ck_assert_int_eq(wfs_catalog_xattr_set(cat, f, "user.created", "c", 1, XATTR_CREATE), 0);

	/* Binary values and empty values. */
	ck_assert_int_eq(wfs_catalog_xattr_set(cat, g, "user.bin", bin, sizeof(bin), 0), 0);
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, g, "user.bin", buf, sizeof(buf), &len), 0);
	ck_assert_uint_eq(len, sizeof(bin));
	ck_assert_mem_eq(buf, bin, sizeof(bin));
	ck_assert_int_eq(wfs_catalog_xattr_set(cat, g, "user.empty", "", 0, 0), 0);
	len = 99;
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, g, "user.empty", NULL, 0, &len), 0);
	ck_assert_uint_eq(len, 0);
	len = 99;
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, g, "user.empty", buf, sizeof(buf), &len), 0);
	ck_assert_uint_eq(len, 0);

	/* Remove. */
	ck_assert_int_eq(wfs_catalog_xattr_remove(cat, f, "user.model"), 0);
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, f, "user.model", buf, sizeof(buf), &len), -ENODATA);
	ck_assert_int_eq(wfs_catalog_xattr_remove(cat, f, "user.model"), -ENODATA);
	ck_assert_int_eq(wfs_catalog_xattr_remove(cat, f, "user.never"), -ENODATA);
	ck_assert_int_eq(wfs_catalog_xattr_remove(cat, g, "user.created"), -ENODATA);
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, f, "user.created", buf, sizeof(buf), &len), 0);
}
END_TEST

/* The name list @buf (@len bytes, NUL-separated) holds exactly @want (a NULL-terminated array). */
static void assert_names(const char *buf, size_t len, const char *const *want)
{
	size_t total = 0, nwant = 0, found = 0;

	for (const char *const *w = want; *w; w++) {
		total += strlen(*w) + 1;
		nwant++;
	}
	ck_assert_uint_eq(len, total);
	for (size_t off = 0; off < len; off += strlen(buf + off) + 1) {
		bool known = false;

		ck_assert_msg(memchr(buf + off, '\0', len - off) != NULL, "name list not NUL-terminated");
		for (const char *const *w = want; *w; w++)
			known |= strcmp(buf + off, *w) == 0;
		ck_assert_msg(known, "unexpected xattr name \"%s\"", buf + off);
		found++;
	}
	ck_assert_uint_eq(found, nwant);
}

START_TEST(test_xattr_list)
{
	uint64_t f = mkfile(ROOT, "f"), g = mkfile(ROOT, "g");
	static const char *const names[] = {"user.b", "user.a", "trusted.weightfs.c", NULL};
	static const char *const after[] = {"user.b", "trusted.weightfs.c", NULL};
	char buf[128];
	size_t len = 1234, want = 0;

	ck_assert_int_eq(wfs_catalog_xattr_list(cat, f, NULL, 0, &len), 0);
	ck_assert_uint_eq(len, 0);
	for (int i = 0; names[i]; i++) {
		ck_assert_int_eq(wfs_catalog_xattr_set(cat, f, names[i], "v", 1, 0), 0);
		want += strlen(names[i]) + 1;
	}
	ck_assert_int_eq(wfs_catalog_xattr_set(cat, g, "user.other", "v", 1, 0), 0);
	ck_assert_int_eq(wfs_catalog_xattr_list(cat, f, NULL, 0, &len), 0);
	ck_assert_uint_eq(len, want);
	memset(buf, 'z', sizeof(buf));
	len = 0;
	ck_assert_int_eq(wfs_catalog_xattr_list(cat, f, buf, want, &len), 0);
	assert_names(buf, len, names);
	len = 1234;
	ck_assert_int_eq(wfs_catalog_xattr_list(cat, f, buf, want - 1, &len), -ERANGE);
	ck_assert_int_eq(wfs_catalog_xattr_list(cat, f, buf, 1, &len), -ERANGE);
	ck_assert_uint_eq(len, 1234);
	ck_assert_int_eq(wfs_catalog_xattr_remove(cat, f, "user.a"), 0);
	ck_assert_int_eq(wfs_catalog_xattr_list(cat, f, buf, sizeof(buf), &len), 0);
	assert_names(buf, len, after);
}
END_TEST

/* ---- stats ----------------------------------------------------------------------------------- */

START_TEST(test_stats)
{
	/*
	 *  /a            sealed X (100 B)
	 *  /d/b          sealed X (100 B)      same object as /a
	 *  /d/c          sealed Y (50 B)
	 *  /d/a2         hard link to /a       a second name: counted again in names and logical bytes
	 *  /d/e/         empty directory
	 *  /s -> a       symlink
	 *  /u            unsealed (0 B)
	 *  object Z (30 B), its only inode dropped: unreferenced
	 */
	uint64_t d = mkdir_(ROOT, "d"), a = mkfile(ROOT, "a"), b = mkfile(d, "b"), c = mkfile(d, "c");
	uint64_t z = mkfile(ROOT, "z");
	struct wfs_catalog_stats st;
	struct wfs_attr out;

	mkdir_(d, "e");
	mk(ROOT, "s", S_IFLNK | 0777, "a");
	mkfile(ROOT, "u");
	seal(a, "X", 100);
	seal(b, "X", 100);
	seal(c, "Y", 50);
	seal(z, "Z", 30);
	ck_assert_int_eq(wfs_catalog_link(cat, a, d, "a2", &out), 0);
	unlink_ok(ROOT, "z", false, z);
	ck_assert_int_eq(wfs_catalog_inode_drop(cat, z, &out), 0);

	memset(&st, 0xff, sizeof(st));
	ck_assert_int_eq(wfs_catalog_stats(cat, &st), 0);
	ck_assert_uint_eq(st.names, 5);
	ck_assert_uint_eq(st.directories, 3);
	ck_assert_uint_eq(st.symlinks, 1);
	ck_assert_uint_eq(st.logical_bytes, 350);
	ck_assert_uint_eq(st.objects, 2);
	ck_assert_uint_eq(st.object_bytes, 150);
	ck_assert_uint_eq(st.unreferenced_objects, 1);
	ck_assert_uint_eq(st.unreferenced_bytes, 30);

	/* A removed (not yet dropped) directory no longer counts. */
	unlink_ok(d, "e", true, ino_at(d, "e"));
	ck_assert_int_eq(wfs_catalog_stats(cat, &st), 0);
	ck_assert_uint_eq(st.directories, 2);
}
END_TEST

START_TEST(test_stats_empty)
{
	struct wfs_catalog_stats st;

	memset(&st, 0xff, sizeof(st));
	ck_assert_int_eq(wfs_catalog_stats(cat, &st), 0);
	ck_assert_uint_eq(st.names, 0);
	ck_assert_uint_eq(st.directories, 1);
	ck_assert_uint_eq(st.symlinks, 0);
	ck_assert_uint_eq(st.logical_bytes, 0);
	ck_assert_uint_eq(st.objects, 0);
	ck_assert_uint_eq(st.object_bytes, 0);
	ck_assert_uint_eq(st.unreferenced_objects, 0);
	ck_assert_uint_eq(st.unreferenced_bytes, 0);
}
END_TEST

/* ---- setattr --------------------------------------------------------------------------------- */

START_TEST(test_setattr)
{
	uint64_t f = mkfile(ROOT, "f");
	struct wfs_attr in = {0}, out, before = get(f);
	int64_t t0;

	in.mode = S_IFDIR | 04711; /* the type bits are ignored */
	in.uid = 5;
	in.gid = 6;
	in.atime = (struct timespec){.tv_sec = 100, .tv_nsec = 1};
	in.mtime = (struct timespec){.tv_sec = 200, .tv_nsec = 2};
	t0 = now();
	ck_assert_int_eq(wfs_catalog_setattr(cat, f, &in, WFS_ATTR_MODE | WFS_ATTR_UID | WFS_ATTR_ATIME
							       | WFS_ATTR_MTIME,
					     &out),
			 0);
	ck_assert_uint_eq(out.mode, S_IFREG | 04711);
	ck_assert_uint_eq(out.uid, 5);
	ck_assert_uint_eq(out.gid, before.gid); /* not named in @valid */
	ck_assert_int_eq(ns(&out.atime), ns(&in.atime));
	ck_assert_int_eq(ns(&out.mtime), ns(&in.mtime));
	ck_assert_int_ge(ns(&out.ctime), t0); /* ctime becomes now */
	{
		struct wfs_attr again = get(f);

		assert_attr_eq(&again, &out);
	}
	in.ctime = (struct timespec){.tv_sec = 300, .tv_nsec = 3};
	ck_assert_int_eq(wfs_catalog_setattr(cat, f, &in, WFS_ATTR_GID | WFS_ATTR_CTIME, &out), 0);
	ck_assert_uint_eq(out.gid, 6);
	ck_assert_int_eq(ns(&out.ctime), ns(&in.ctime));
	ck_assert_int_eq(wfs_catalog_setattr(cat, 987654, &in, WFS_ATTR_GID, &out), -ENOENT);
}
END_TEST

/* ---- persistence ----------------------------------------------------------------------------- */

START_TEST(test_persist_reopen)
{
	uint64_t d = mkdir_(ROOT, "d"), f = mkfile(d, "f"), l = mk(ROOT, "l", S_IFLNK | 0777, "d/f");
	struct wfs_attr fa, da, la, ra, got;
	struct wfs_catalog *ro = NULL;
	char buf[64];
	size_t len;

	seal(f, "persist", 7);
	ck_assert_int_eq(wfs_catalog_xattr_set(cat, f, "user.k", "value", 5, 0), 0);
	ck_assert_int_eq(wfs_catalog_sync(cat), 0);
	fa = get(f);
	da = get(d);
	la = get(l);
	ra = get(ROOT);
	wfs_catalog_close(cat);
	cat = NULL;

	ck_assert_int_eq(wfs_catalog_open(db_path, 0, 0, 0, &cat), 0);
	ck_assert_uint_eq(ino_at(ROOT, "d"), d);
	ck_assert_uint_eq(ino_at(d, "f"), f);
	ck_assert_uint_eq(ino_at(ROOT, "l"), l);
	got = get(f);
	assert_attr_eq(&got, &fa);
	got = get(d);
	assert_attr_eq(&got, &da);
	got = get(l);
	assert_attr_eq(&got, &la);
	got = get(ROOT);
	assert_attr_eq(&got, &ra);
	ck_assert_int_eq(wfs_catalog_readlink(cat, l, buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "d/f");
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, f, "user.k", buf, sizeof(buf), &len), 0);
	ck_assert_uint_eq(len, 5);
	ck_assert_mem_eq(buf, "value", 5);
	ck_assert_uint_eq(refcount("persist"), 1);

	/* A read-only handle alongside sees the same and refuses changes. */
	ck_assert_int_eq(wfs_catalog_open(db_path, WFS_CATALOG_READONLY, 0, 0, &ro), 0);
	ck_assert_int_eq(wfs_catalog_getattr(ro, f, &got), 0);
	assert_attr_eq(&got, &fa);
	ck_assert_int_eq(wfs_catalog_create(ro, ROOT, "new", S_IFREG | 0644, 0, 0, NULL, &got), -EROFS);
	ck_assert_int_eq(wfs_catalog_sync(ro), 0);
	wfs_catalog_close(ro);
	ck_assert_uint_eq(ino_at(ROOT, "new"), 0);
}
END_TEST

/* "@db_path@suffix" exists. */
static bool beside(const char *suffix)
{
	char p[700];

	snprintf(p, sizeof(p), "%s%s", db_path, suffix);
	return access(p, F_OK) == 0;
}

/*
 * A read-only handle is an inspection: next to a writer it reads the writer's WAL (what is committed
 * there and not yet in catalog.db); with no writer it makes no file (it left catalog.db-wal and
 * -shm behind); a missing catalog stays missing.
 */
START_TEST(test_readonly_makes_no_file)
{
	struct wfs_catalog *ro = NULL;
	struct wfs_attr a;
	char why[128], missing[700];
	uint64_t ino = mkfile(ROOT, "x");
	long files;

	ck_assert(beside("-wal"));
	ck_assert_int_eq(wfs_catalog_open(db_path, WFS_CATALOG_READONLY, 0, 0, &ro), 0);
	ck_assert_int_eq(wfs_catalog_lookup(ro, ROOT, "x", &a), 0);
	ck_assert_uint_eq(a.ino, ino);
	wfs_catalog_close(ro);

	wfs_catalog_close(cat); /* the last handle: the WAL is checkpointed and removed */
	cat = NULL;
	ck_assert(!beside("-wal") && !beside("-shm"));
	ck_assert_int_eq(wfs_catalog_open(db_path, WFS_CATALOG_READONLY, 0, 0, &ro), 0);
	ck_assert_int_eq(wfs_catalog_lookup(ro, ROOT, "x", &a), 0);
	ck_assert_uint_eq(a.ino, ino);
	wfs_catalog_close(ro);
	ck_assert_msg(!beside("-wal") && !beside("-shm"), "a read-only open left -wal or -shm");
	ck_assert_int_eq(wfs_catalog_diagnose(db_path, why, sizeof(why)), 0);
	ck_assert_msg(!beside("-wal") && !beside("-shm"), "diagnose left -wal or -shm");

	files = tu_count_files(tu_test_dir);
	tu_path(missing, sizeof(missing), tu_test_dir, "gone.db");
	ck_assert_int_eq(wfs_catalog_open(missing, WFS_CATALOG_READONLY, 0, 0, &ro), -ENOENT);
	ck_assert_int_eq(tu_count_files(tu_test_dir), files);
}
END_TEST

/* FIFOs, sockets and device nodes: a type and an rdev, no object; recover, check and stats agree. */
START_TEST(test_mknod_special)
{
	struct wfs_catalog_check chk;
	struct wfs_catalog_stats st;
	struct wfs_recovery r;
	struct wfs_attr a, got;

	ck_assert_int_eq(wfs_catalog_mknod(cat, ROOT, "fifo", S_IFIFO | 0640, 0, UID, GID, NULL, &a), 0);
	ck_assert(S_ISFIFO(a.mode));
	ck_assert(!a.sealed);
	ck_assert_int_eq(wfs_catalog_mknod(cat, ROOT, "null", S_IFCHR | 0666, makedev(1, 3), UID, GID,
					   NULL, &a), 0);
	ck_assert_uint_eq(a.rdev, makedev(1, 3));
	ck_assert_int_eq(wfs_catalog_mknod(cat, ROOT, "sda", S_IFBLK | 0600, makedev(8, 0), 0, 0, NULL, &a),
			 0);
	ck_assert_int_eq(wfs_catalog_mknod(cat, ROOT, "sock", S_IFSOCK | 0755, 0, 0, 0, NULL, &a), 0);
	ck_assert_int_eq(wfs_catalog_mknod(cat, ROOT, "bad", S_IFIFO | 0644, 5, 0, 0, NULL, &a), -EINVAL);
	ck_assert_int_eq(wfs_catalog_link(cat, ino_at(ROOT, "fifo"), ROOT, "fifo2", &a), 0);
	ck_assert_int_eq(wfs_catalog_lookup(cat, ROOT, "null", &got), 0);
	ck_assert_uint_eq(got.rdev, makedev(1, 3));
	ck_assert_int_eq(wfs_catalog_recover(cat, &r), 0);
	ck_assert_uint_eq(r.unsealed_removed, 0);
	ck_assert_uint_ne(ino_at(ROOT, "fifo"), 0);
	ck_assert_int_eq(wfs_catalog_check(cat, false, &chk), 0);
	ck_assert_uint_eq(chk.unsealed, 0);
	ck_assert_uint_eq(chk.nlink_wrong, 0);
	ck_assert_int_eq(wfs_catalog_stats(cat, &st), 0);
	ck_assert_uint_eq(st.special_files, 5);
	ck_assert_uint_eq(st.names, 0);
	ck_assert_uint_eq(st.unsealed_files, 0);
}
END_TEST

/* A schema-1 catalog (no rdev column) opens, read-only too: upgraded in place to schema 2. */
START_TEST(test_open_schema1)
{
	struct wfs_catalog *c = NULL;
	struct wfs_attr a;
	sqlite3 *db;
	sqlite3_stmt *s;
	uint64_t ino;

	ck_assert_int_eq(wfs_catalog_create(cat, ROOT, "f", S_IFREG | 0644, UID, GID, NULL, &a), 0);
	ino = a.ino;
	wfs_catalog_close(cat);
	cat = NULL;
	/* What a schema-1 catalog looks like: the same tables without inodes.rdev. */
	ck_assert_int_eq(sqlite3_open(db_path, &db), SQLITE_OK);
	ck_assert_int_eq(sqlite3_exec(db, "ALTER TABLE inodes DROP COLUMN rdev;"
				      "UPDATE meta SET value = 1 WHERE key = 'schema_version'",
				      NULL, NULL, NULL),
			 SQLITE_OK);
	sqlite3_close(db);

	ck_assert_int_eq(wfs_catalog_open(db_path, WFS_CATALOG_READONLY, 0, 0, &c), 0);
	ck_assert_int_eq(wfs_catalog_getattr(c, ino, &a), 0);
	ck_assert_uint_eq(a.rdev, 0);
	wfs_catalog_close(c);

	ck_assert_int_eq(wfs_catalog_open(db_path, 0, 0, 0, &cat), 0);
	ck_assert_int_eq(wfs_catalog_lookup(cat, ROOT, "f", &a), 0);
	ck_assert_uint_eq(a.ino, ino);
	ck_assert_int_eq(wfs_catalog_mknod(cat, ROOT, "null", S_IFCHR | 0666, makedev(1, 3), 0, 0, NULL, &a),
			 0);
	ck_assert_uint_eq(a.rdev, makedev(1, 3));
	ck_assert_int_eq(sqlite3_open(db_path, &db), SQLITE_OK);
	ck_assert_int_eq(sqlite3_prepare_v2(db, "SELECT value FROM meta WHERE key = 'schema_version'", -1, &s,
					    NULL), SQLITE_OK);
	ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
	ck_assert_int_eq(sqlite3_column_int(s, 0), 2);
	sqlite3_finalize(s);
	sqlite3_close(db);
}
END_TEST

/* Batched commits: calls join one transaction; other connections see it at the commit. */
static int pending_calls;
static void count_first_pending(void *ctx)
{
	(void)ctx;
	pending_calls++;
}

/* Does a second, read-only connection see @parent/@name? */
static bool seen_elsewhere(uint64_t parent, const char *name)
{
	struct wfs_catalog *ro = NULL;
	struct wfs_attr a;
	int ret;

	ck_assert_int_eq(wfs_catalog_open(db_path, WFS_CATALOG_READONLY, 0, 0, &ro), 0);
	ret = wfs_catalog_lookup(ro, parent, name, &a);
	wfs_catalog_close(ro);
	ck_assert_msg(ret == 0 || ret == -ENOENT, "lookup elsewhere: %s", strerror(-ret));
	return ret == 0;
}

START_TEST(test_batch_commit)
{
	struct wfs_attr a;
	uint64_t f, g;

	ck_assert_int_eq(wfs_catalog_batch(cat, true, count_first_pending, NULL), 0);
	ck_assert_uint_eq(wfs_catalog_pending(cat), 0);
	/* The first change commits at once: the WAL's headroom is known only after a commit. */
	mkfile(ROOT, "first");
	ck_assert_uint_eq(wfs_catalog_pending(cat), 0);
	ck_assert(seen_elsewhere(ROOT, "first"));
	pending_calls = 0;
	f = mkfile(ROOT, "f");
	ck_assert_int_eq(pending_calls, 1);
	g = mkfile(ROOT, "g");
	seal(g, "batched", 7);
	ck_assert_int_eq(pending_calls, 1); /* told once per batch */
	ck_assert_uint_eq(wfs_catalog_pending(cat), 3);
	/* This connection sees its own batch; another sees the last commit. */
	ck_assert_uint_eq(ino_at(ROOT, "f"), f);
	ck_assert(!seen_elsewhere(ROOT, "f"));
	/* A failing call is rolled back alone: the batch before it stays. */
	ck_assert_int_eq(wfs_catalog_create(cat, ROOT, "f", S_IFREG | 0644, UID, GID, NULL, &a), -EEXIST);
	ck_assert_uint_eq(wfs_catalog_pending(cat), 3);
	ck_assert_uint_eq(ino_at(ROOT, "g"), g);
	ck_assert_int_eq(wfs_catalog_commit(cat), 0);
	ck_assert_uint_eq(wfs_catalog_pending(cat), 0);
	ck_assert(seen_elsewhere(ROOT, "f"));
	ck_assert(seen_elsewhere(ROOT, "g"));
	ck_assert_uint_eq(refcount("batched"), 1);

	/* A rollback drops the open batch, and only it. */
	mkfile(ROOT, "dropped");
	ck_assert_int_eq(pending_calls, 2);
	wfs_catalog_rollback(cat);
	ck_assert_uint_eq(ino_at(ROOT, "dropped"), 0);
	ck_assert_uint_eq(ino_at(ROOT, "f"), f);

	/* Closing commits what is pending; so does turning batching off. */
	mkfile(ROOT, "at-close");
	wfs_catalog_close(cat);
	cat = NULL;
	ck_assert(seen_elsewhere(ROOT, "at-close"));
	ck_assert_int_eq(wfs_catalog_open(db_path, 0, 0, 0, &cat), 0);
	ck_assert_int_eq(wfs_catalog_batch(cat, true, NULL, NULL), 0);
	mkfile(ROOT, "committed-first"); /* as above: the first change commits at once */
	mkfile(ROOT, "at-off");
	ck_assert(!seen_elsewhere(ROOT, "at-off"));
	ck_assert_int_eq(wfs_catalog_batch(cat, false, NULL, NULL), 0);
	ck_assert(seen_elsewhere(ROOT, "at-off"));
	mkfile(ROOT, "unbatched"); /* commits by itself again */
	ck_assert(seen_elsewhere(ROOT, "unbatched"));
}
END_TEST

/* An object's row is forgotten by a commit before its caller removes the file. */
START_TEST(test_batch_object_delete_commits)
{
	struct wfs_digest d = dg("gone");
	uint64_t f = mkfile(ROOT, "f"), ino = 0, refs;

	seal(f, "gone", 4);
	ck_assert_int_eq(wfs_catalog_batch(cat, true, NULL, NULL), 0);
	ck_assert_int_eq(wfs_catalog_unlink(cat, ROOT, "f", false, &ino), 0);
	ck_assert_int_eq(wfs_catalog_inode_drop(cat, ino, &(struct wfs_attr){0}), 0);
	ck_assert_uint_gt(wfs_catalog_pending(cat), 0);
	ck_assert_int_eq(wfs_catalog_object_delete(cat, &d), 0);
	ck_assert_uint_eq(wfs_catalog_pending(cat), 0);
	ck_assert(!seen_elsewhere(ROOT, "f"));
	ck_assert_int_eq(wfs_catalog_object_refcount(cat, &d, &refs), -ENOENT);
}
END_TEST

/* A batching handle does not checkpoint at its commits; wfs_catalog_checkpoint() keeps the WAL small. */
START_TEST(test_batch_checkpoint)
{
	char wal[700], name[32];
	struct stat st;
	off_t most = 0;

	snprintf(wal, sizeof(wal), "%s-wal", db_path);
	ck_assert_int_eq(wfs_catalog_batch(cat, true, NULL, NULL), 0);
	for (int round = 0; round < 300; round++) {
		for (int i = 0; i < 100; i++) {
			struct wfs_attr a;

			snprintf(name, sizeof(name), "f%d.%d", round, i);
			ck_assert_int_eq(wfs_catalog_create(cat, ROOT, name, S_IFREG | 0644, UID, GID, NULL, &a), 0);
		}
		ck_assert_int_eq(wfs_catalog_commit(cat), 0);
		ck_assert_int_eq(wfs_catalog_checkpoint(cat), 0);
		ck_assert_int_eq(stat(wal, &st), 0);
		most = st.st_size > most ? st.st_size : most;
	}
	/* Past 4 MiB it is checkpointed and restarts from its beginning: a few commits over that. */
	ck_assert_int_lt(most, 8 << 20);
	ck_assert(seen_elsewhere(ROOT, "f299.99"));
	ck_assert(seen_elsewhere(ROOT, "f0.0"));
}
END_TEST

/* @ino's row as a second, read-only connection reads it (committed state, no kept rows). */
static struct wfs_attr get_elsewhere(uint64_t ino)
{
	struct wfs_catalog *ro = NULL;
	struct wfs_attr a;

	ck_assert_int_eq(wfs_catalog_open(db_path, WFS_CATALOG_READONLY, 0, 0, &ro), 0);
	ck_assert_int_eq(wfs_catalog_getattr(ro, ino, &a), 0);
	wfs_catalog_close(ro);
	return a;
}

/* Are @a and @b the same row (every column; not compared with memcmp: padding)? */
static bool same_row(const struct wfs_attr *a, const struct wfs_attr *b)
{
	return a->ino == b->ino && a->mode == b->mode && a->uid == b->uid && a->gid == b->gid &&
	       a->nlink == b->nlink && a->size == b->size && a->parent == b->parent &&
	       a->atime.tv_sec == b->atime.tv_sec && a->atime.tv_nsec == b->atime.tv_nsec &&
	       a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec &&
	       a->ctime.tv_sec == b->ctime.tv_sec && a->ctime.tv_nsec == b->ctime.tv_nsec &&
	       a->sealed == b->sealed && a->rdev == b->rdev;
}

/* getattr of directory @ino on this connection (twice: a kept row the second time) equals the row
 * another connection reads. */
static void assert_dir_row(uint64_t ino)
{
	struct wfs_attr a = get(ino), b = get(ino), o = get_elsewhere(ino);

	ck_assert(same_row(&a, &b));
	ck_assert_msg(same_row(&a, &o), "directory %llu: its kept row is not the catalog's", (unsigned long long)ino);
}

/*
 * The directory rows the catalog keeps (struct dir_slot in catalog.c) are the rows SQLite holds:
 * after each kind of change of a directory (each call commits alone here, so a second connection
 * sees the same state), and after a rollback undid changes that it had kept.
 */
START_TEST(test_kept_dir_rows)
{
	struct wfs_attr a, set = {0}, before;
	uint64_t d, e, sub, moved, replaced = 0;

	d = mkdir_(ROOT, "d");
	e = mkdir_(ROOT, "e");
	assert_dir_row(d);
	assert_dir_row(ROOT);
	mkfile(d, "f"); /* touch_dir */
	assert_dir_row(d);
	sub = mkdir_(d, "sub"); /* nlink_add, touch_dir */
	assert_dir_row(d);
	assert_dir_row(sub);
	ck_assert_int_eq(wfs_catalog_rename(cat, d, "f", e, "g", 0, &replaced), 0); /* two directories */
	assert_dir_row(d);
	assert_dir_row(e);
	ck_assert_int_eq(wfs_catalog_rename(cat, d, "sub", e, "sub", 0, &replaced), 0); /* reparent, nlinks */
	assert_dir_row(d);
	assert_dir_row(e);
	assert_dir_row(sub);
	set.mode = 0700;
	set.uid = 7;
	ck_assert_int_eq(wfs_catalog_setattr(cat, e, &set, WFS_ATTR_MODE | WFS_ATTR_UID, &a), 0);
	assert_dir_row(e);
	ck_assert_int_eq(wfs_catalog_unlink(cat, e, "sub", true, &moved), 0); /* rmdir: nlinks */
	assert_dir_row(e);
	ck_assert_int_eq(wfs_catalog_getattr(cat, sub, &a) == 0 ? a.nlink : 0, 0);

	/* Rolled back: a failing call's savepoint in a batch, and a whole batch. */
	ck_assert_int_eq(wfs_catalog_batch(cat, true, NULL, NULL), 0);
	mkfile(ROOT, "first"); /* commits at once (the WAL's headroom is known after a commit) */
	before = get(d);
	mkfile(d, "h"); /* kept: the new times, in the open batch */
	(void)get(d);
	wfs_catalog_rollback(cat);
	a = get(d);
	ck_assert(same_row(&a, &before));
	ck_assert_int_eq(wfs_catalog_create(cat, d, "h2", S_IFREG | 0644, UID, GID, NULL, &a), 0);
	ck_assert_int_eq(wfs_catalog_commit(cat), 0);
	assert_dir_row(d);
	ck_assert_int_eq(wfs_catalog_batch(cat, false, NULL, NULL), 0);
}
END_TEST

static void note_name(void *ctx, uint64_t parent, const char *name)
{
	(void)ctx, (void)parent, (void)name;
}

static void count_name(void *ctx, uint64_t parent, const char *name)
{
	(void)parent, (void)name;
	(*(int *)ctx)++;
}

/* A writer beside readers moves every hard link of the inode to one new inode (openmode.h): both
 * names then look up the new inode, with nlink 2; the old keeps its row with nlink 0. An inode with
 * no name left cannot move. */
START_TEST(test_inode_replace_hard_links)
{
	struct wfs_attr a, b, fresh;
	uint64_t d = mkdir_(ROOT, "d"), f = mkfile(ROOT, "f");
	int names = 0;

	ck_assert_int_eq(wfs_catalog_link(cat, f, d, "f2", &a), 0);
	ck_assert_int_eq(wfs_catalog_inode_replace(cat, f, count_name, &names, &fresh), 0);
	ck_assert_int_eq(names, 2);
	ck_assert_uint_ne(fresh.ino, f);
	ck_assert_uint_eq(fresh.nlink, 2);
	ck_assert_int_eq(wfs_catalog_lookup(cat, ROOT, "f", &a), 0);
	ck_assert_int_eq(wfs_catalog_lookup(cat, d, "f2", &b), 0);
	ck_assert_uint_eq(a.ino, fresh.ino);
	ck_assert_uint_eq(b.ino, fresh.ino);
	ck_assert_int_eq(wfs_catalog_getattr(cat, f, &a), 0);
	ck_assert_uint_eq(a.nlink, 0);
	ck_assert_int_eq(wfs_catalog_inode_replace(cat, f, count_name, &names, &fresh), -ENOENT);
	ck_assert_int_eq(names, 2);
}
END_TEST

/*
 * A file this connection made answers "no xattrs" without a query until one is set (BARE_SLOTS in
 * catalog.c): each way an xattr reaches an inode is seen, and so is a rollback that hands its inode
 * number out again.
 */
START_TEST(test_new_file_xattrs)
{
	char buf[64];
	size_t len = 99;
	struct wfs_attr a, fresh;
	uint64_t f, g;

	f = mkfile(ROOT, "f");
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, f, "user.weightfs.dtype", buf, sizeof(buf), &len), -ENODATA);
	ck_assert_int_eq(wfs_catalog_xattr_list(cat, f, buf, sizeof(buf), &len), 0);
	ck_assert_uint_eq(len, 0);
	ck_assert_int_eq(wfs_catalog_xattr_set(cat, f, "user.weightfs.dtype", "F32", 3, 0), 0);
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, f, "user.weightfs.dtype", buf, sizeof(buf), &len), 0);
	ck_assert_uint_eq(len, 3);
	ck_assert_int_eq(wfs_catalog_xattr_list(cat, f, buf, sizeof(buf), &len), 0);
	ck_assert_uint_eq(len, sizeof("user.weightfs.dtype"));

	/* The inode that replaces a name carries its xattrs over. */
	g = mkfile(ROOT, "g");
	ck_assert_int_eq(wfs_catalog_xattr_set(cat, g, "user.a", "1", 1, 0), 0);
	ck_assert_int_eq(wfs_catalog_inode_replace(cat, g, note_name, NULL, &fresh), 0);
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, fresh.ino, "user.a", buf, sizeof(buf), &len), 0);

	/* A file made in a batch that is rolled back: its number comes again, with xattrs this time. */
	ck_assert_int_eq(wfs_catalog_batch(cat, true, NULL, NULL), 0);
	mkfile(ROOT, "first"); /* commits at once */
	g = mkfile(ROOT, "dropped");
	wfs_catalog_rollback(cat);
	ck_assert_int_eq(wfs_catalog_create(cat, ROOT, "again", S_IFREG | 0644, UID, GID, NULL, &a), 0);
	ck_assert_uint_eq(a.ino, g); /* SQLite hands the number out again after the rollback */
	ck_assert_int_eq(wfs_catalog_xattr_set(cat, a.ino, "user.b", "2", 1, 0), 0);
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, a.ino, "user.b", buf, sizeof(buf), &len), 0);
	ck_assert_int_eq(wfs_catalog_batch(cat, false, NULL, NULL), 0);
}
END_TEST

/* What a process's death leaves of its batch: its redo log (a copy), the batch itself rolled back
 * and the handle closed. The caller frees the copy. */
static void *die_with_log(const void *area, size_t bytes)
{
	void *copy = aligned_alloc(8, bytes);

	ck_assert_ptr_nonnull(copy);
	memcpy(copy, area, bytes);
	wfs_catalog_rollback(cat);
	wfs_catalog_close(cat);
	ck_assert_int_eq(wfs_catalog_open(db_path, 0, 0, 0, &cat), 0);
	return copy;
}

/* A batch's changes outlive the handle that made them through its redo log, exactly, once. */
START_TEST(test_redo_replay)
{
	const size_t bytes = 1u << 20;
	void *area = aligned_alloc(8, bytes), *log;
	struct wfs_attr ga, ha, a;
	uint64_t d, f, g, h, n = 99, ino = 0;
	char buf[8];
	size_t len;

	ck_assert_ptr_nonnull(area);
	memset(area, 0, bytes);
	ck_assert_int_eq(wfs_catalog_batch(cat, true, NULL, NULL), 0);
	ck_assert_int_eq(wfs_catalog_redo(cat, area, 100), -EINVAL);
	ck_assert_int_eq(wfs_catalog_redo(cat, area, bytes), 0);
	d = mkdir_(ROOT, "d"); /* alone in its batch (the WAL's headroom is not known yet): committed */
	f = mkfile(d, "f");
	seal(f, "ff", 2);
	ck_assert_int_eq(wfs_catalog_commit(cat), 0); /* the log holds nothing of what is committed */
	/* The batch a death would lose: a file written under a temporary name and renamed over f,
	 * an attribute, f dropped, a new file with its inode number from AUTOINCREMENT. */
	g = mkfile(d, "tmp.g");
	seal(g, "gg", 2);
	ck_assert_int_eq(wfs_catalog_rename(cat, d, "tmp.g", d, "f", 0, &ino), 0);
	ck_assert_uint_eq(ino, f);
	ck_assert_int_eq(wfs_catalog_inode_drop(cat, f, &a), 0);
	ck_assert_int_eq(wfs_catalog_xattr_set(cat, g, "user.k", "v1", 2, 0), 0);
	ck_assert_int_eq(wfs_catalog_create(cat, d, "f", S_IFREG | 0644, UID, GID, NULL, &a), -EEXIST);
	h = mk(ROOT, "link", S_IFLNK | 0777, "d/f");
	ck_assert_uint_gt(wfs_catalog_pending(cat), 0);
	ga = get(g);
	ha = get(h);
	log = die_with_log(area, bytes);
	ck_assert_uint_eq(ino_at(d, "f"), f); /* as committed */

	ck_assert_int_eq(wfs_catalog_redo_replay(cat, log, bytes, &n), 0);
	ck_assert_uint_eq(n, 6); /* the failed create left no record */
	ck_assert_uint_eq(ino_at(d, "f"), g);
	ck_assert_uint_eq(ino_at(d, "tmp.g"), 0);
	a = get(g);
	assert_attr_eq(&ga, &a);
	a = get(h);
	assert_attr_eq(&ha, &a);
	ck_assert_int_eq(wfs_catalog_getattr(cat, f, &a), -ENOENT);
	ck_assert_int_eq(wfs_catalog_xattr_get(cat, g, "user.k", buf, sizeof(buf), &len), 0);
	ck_assert_mem_eq(buf, "v1", 2);
	ck_assert_uint_eq(refcount("gg"), 1);
	ck_assert_uint_eq(refcount("ff"), 0);
	/* Applied once: the catalog now says so, and the next inode follows the replayed ones. */
	ck_assert_int_eq(wfs_catalog_redo_replay(cat, log, bytes, &n), 0);
	ck_assert_uint_eq(n, 0);
	ck_assert_uint_eq(mkfile(ROOT, "next"), h + 1);
	free(log);

	/* A log replayed on a catalog that moved on since is refused, and nothing is applied. */
	ck_assert_int_eq(wfs_catalog_batch(cat, true, NULL, NULL), 0);
	ck_assert_int_eq(wfs_catalog_redo(cat, area, bytes), 0);
	mkfile(ROOT, "alone"); /* committed alone, as above */
	mkfile(ROOT, "logged");
	log = die_with_log(area, bytes);
	mkfile(ROOT, "meanwhile"); /* takes the inode number "logged" had */
	ck_assert_int_eq(wfs_catalog_redo_replay(cat, log, bytes, &n), -EPROTO);
	ck_assert_uint_eq(ino_at(ROOT, "logged"), 0);
	/* An area never used (zeros) holds nothing. */
	memset(log, 0, bytes);
	ck_assert_int_eq(wfs_catalog_redo_replay(cat, log, bytes, &n), 0);
	ck_assert_uint_eq(n, 0);
	free(log);
	free(area);
}
END_TEST

/* A full log commits the batch, which empties it: what a replay needs is always there. */
START_TEST(test_redo_full)
{
	const size_t bytes = WFS_CATALOG_REDO_MIN;
	void *area = aligned_alloc(8, bytes), *log;
	char name[64];
	uint64_t n;

	ck_assert_ptr_nonnull(area);
	ck_assert_int_eq(wfs_catalog_batch(cat, true, NULL, NULL), 0);
	ck_assert_int_eq(wfs_catalog_redo(cat, area, bytes), 0);
	mkfile(ROOT, "alone");
	for (int i = 0; i < 400; i++) { /* about 400 bytes of log each: the area fills twice */
		snprintf(name, sizeof(name), "model.layers.%03d.self_attn.q_proj.weight", i);
		mkfile(ROOT, name);
	}
	ck_assert(seen_elsewhere(ROOT, "model.layers.000.self_attn.q_proj.weight"));
	ck_assert(!seen_elsewhere(ROOT, "model.layers.399.self_attn.q_proj.weight"));
	log = die_with_log(area, bytes);
	ck_assert_int_eq(wfs_catalog_redo_replay(cat, log, bytes, &n), 0);
	ck_assert_uint_gt(n, 0);
	ck_assert_uint_lt(n, 400);
	for (int i = 0; i < 400; i++) {
		snprintf(name, sizeof(name), "model.layers.%03d.self_attn.q_proj.weight", i);
		ck_assert_msg(ino_at(ROOT, name) != 0, "%s lost", name);
	}
	free(log);
	free(area);
}
END_TEST

/* ---- runner ---------------------------------------------------------------------------------- */

static void add(Suite *s, const char *name, const TTest *test)
{
	TCase *tc = tcase_create(name);

	tcase_add_checked_fixture(tc, cat_setup, cat_teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test);
	suite_add_tcase(s, tc);
}

static Suite *catalog_suite(void)
{
	Suite *s = suite_create("catalog");

	add(s, "open_root", test_open_root);
	add(s, "open_errors", test_open_errors);
	add(s, "open_newer_schema", test_open_newer_schema);
	add(s, "create_kinds", test_create_kinds);
	add(s, "kept_dir_rows", test_kept_dir_rows);
	add(s, "new_file_xattrs", test_new_file_xattrs);
	add(s, "inode_replace_hard_links", test_inode_replace_hard_links);
	add(s, "create_invalid", test_create_invalid);
	add(s, "create_eexist", test_create_eexist);
	add(s, "create_enotdir", test_create_enotdir);
	add(s, "unlink_semantics", test_unlink_semantics);
	add(s, "nlink_dirs", test_nlink_dirs);
	add(s, "hard_links", test_hard_links);
	add(s, "rename_plain", test_rename_plain);
	add(s, "rename_replace", test_rename_replace);
	add(s, "rename_noreplace", test_rename_noreplace);
	add(s, "rename_exchange", test_rename_exchange);
	add(s, "rename_into_subtree", test_rename_into_subtree);
	add(s, "rename_type_errors", test_rename_type_errors);
	add(s, "set_content_refcounts", test_set_content_refcounts);
	add(s, "create_sealed", test_create_sealed);
	add(s, "unreferenced", test_unreferenced);
	add(s, "retain_budget", test_retain_budget);
	add(s, "recover_declared_empty_tmp", test_recover_declared_empty_tmp);
	add(s, "backup_restore", test_backup_restore);
	add(s, "inode_drop", test_inode_drop);
	add(s, "ino_never_reused", test_ino_never_reused);
	add(s, "recover", test_recover);
	add(s, "recover_counts_linked_unsealed", test_recover_counts_linked_unsealed);
	add(s, "readdir_order_and_resume", test_readdir_order_and_resume);
	add(s, "readdir_reentrant", test_readdir_reentrant);
	add(s, "readdir_10k", test_readdir_10k);
	add(s, "xattr_get_set", test_xattr_get_set);
	add(s, "xattr_list", test_xattr_list);
	add(s, "stats", test_stats);
	add(s, "stats_empty", test_stats_empty);
	add(s, "setattr", test_setattr);
	add(s, "persist_reopen", test_persist_reopen);
	add(s, "readonly_makes_no_file", test_readonly_makes_no_file);
	add(s, "mknod_special", test_mknod_special);
	add(s, "open_schema1", test_open_schema1);
	add(s, "batch_commit", test_batch_commit);
	add(s, "batch_object_delete_commits", test_batch_object_delete_commits);
	add(s, "batch_checkpoint", test_batch_checkpoint);
	add(s, "redo_replay", test_redo_replay);
	add(s, "redo_full", test_redo_full);
	return s;
}

int main(void)
{
	return tu_main("check_catalog", catalog_suite(), TU_RUN_DIR, NULL);
}
