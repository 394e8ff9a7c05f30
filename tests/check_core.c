/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Check suite for the daemon core (fs/core/): versions, seal, claim and open mode, without FUSE, a
 * mount or root. Each test gets a store and catalog of its own in a fresh directory, a struct wfs_fs
 * set up as the daemon sets it up (wfs_fs_init), and a fake kernel (struct wfs_kernel) that counts
 * passthrough backing files registered and released.
 *
 * The core's rule is that its functions run with fs->lock held unless their header says they take it
 * themselves (wfs_fileio_write, wfs_fileio_fallocate, wfs_openmode_read, ...); the tests follow it.
 */
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "catalog.h"
#include "claim.h"
#include "closing.h"
#include "daemon.h"
#include "digest.h"
#include "fileio.h"
#include "filelock.h"
#include "inode.h"
#include "keep.h"
#include "lock.h"
#include "map.h"
#include "object.h"
#include "openmode.h"
#include "seal.h"
#include "store.h"
#include "testutil.h"
#include "version.h"
#include "weightfs.h"

#define MIB (1024u * 1024u)

static struct wfs_fs fs;

/*
 * The fake kernel: backing ids handed out and released. Like the kernel it holds the registered file
 * (a dup of the descriptor) until the id is released; backing_path() names it, to open it as a
 * passthrough open's own backing file would be.
 */
#define FAKE_IDS 16
static struct {
	int opened, closed, last_closed;
	int fd[FAKE_IDS];
} kern;

static int fake_backing_open(void *ctx, int fd)
{
	(void)ctx;
	if (fd < 0 || kern.opened + 1 >= FAKE_IDS)
		return -EPERM;
	kern.opened++;
	kern.fd[kern.opened] = dup(fd);
	return 100 + kern.opened;
}

static void fake_backing_close(void *ctx, int id)
{
	(void)ctx;
	kern.closed++;
	kern.last_closed = id;
	if (id > 100 && id - 100 < FAKE_IDS && kern.fd[id - 100] >= 0) {
		close(kern.fd[id - 100]);
		kern.fd[id - 100] = -1;
	}
}

/* The file registered as backing id @id, opened with @flags (what the kernel does per open). */
static int backing_open_as(int id, int flags)
{
	char proc[32];

	ck_assert(id > 100 && id - 100 < FAKE_IDS && kern.fd[id - 100] >= 0);
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", kern.fd[id - 100]);
	return open(proc, flags | O_CLOEXEC);
}

static void core_setup(void)
{
	char path[700];
	int ret;

	tu_test_dir_setup();
	memset(&fs, 0, sizeof(fs));
	memset(&kern, 0, sizeof(kern));
	fs.opt.verify = 1;
	fs.opt.sync = 0;
	fs.opt.passthrough_writes = 1;
	for (int i = 0; i < FAKE_IDS; i++)
		kern.fd[i] = -1;
	tu_path(path, sizeof(path), tu_test_dir, "store");
	ret = wfs_store_open(path, WFS_STORE_CREATE | WFS_STORE_NOSYNC, &fs.store);
	ck_assert_msg(ret == 0, "store: %s", strerror(-ret));
	tu_path(path, sizeof(path), tu_test_dir, "store/" WFS_STORE_CATALOG);
	ret = wfs_catalog_open(path, WFS_CATALOG_CREATE, getuid(), getgid(), &fs.catalog);
	ck_assert_msg(ret == 0, "catalog: %s", strerror(-ret));
	fs.kernel = (struct wfs_kernel){.backing_open = fake_backing_open, .backing_close = fake_backing_close};
	atomic_store(&fs.passthrough, true);
	ck_assert_int_eq(wfs_fs_init(&fs), 0);
}

static void core_teardown(void)
{
	wfs_fs_release(&fs);
	wfs_catalog_close(fs.catalog);
	wfs_store_close(fs.store);
	tu_test_dir_teardown();
}

/* A new regular file @name in the root (unsealed, as after create) and its in-memory inode. */
static struct wfs_inode *new_file(const char *name)
{
	struct wfs_attr a;
	struct wfs_inode *in;

	ck_assert_int_eq(wfs_catalog_create(fs.catalog, WFS_ROOT_INO, name, S_IFREG | 0644, 0, 0, NULL, &a), 0);
	in = wfs_inode_get(&fs, &a);
	ck_assert_ptr_nonnull(in);
	return in;
}

/* Seal @len bytes of @buf as inode @in's content, as a create + write + close would (fs->lock held). */
static int seal_bytes(struct wfs_inode *in, const void *buf, size_t len)
{
	struct wfs_version *v;
	int ret;

	v = wfs_seal_writer(&fs, in, true, &ret);
	ck_assert_ptr_nonnull(v);
	ck_assert_int_eq(wfs_version_write(v, buf, len, 0), (ssize_t)len);
	ret = wfs_seal(&fs, in, true);
	wfs_version_put(v);
	return ret;
}

static void assert_sealed_as(uint64_t ino, const void *buf, size_t len)
{
	struct wfs_digest want;
	struct wfs_attr a;

	wfs_digest_buf(buf, len, &want);
	ck_assert_int_eq(wfs_catalog_getattr(fs.catalog, ino, &a), 0);
	ck_assert(a.sealed);
	ck_assert_uint_eq(a.size, len);
	ck_assert(wfs_digest_equal(&a.digest, &want));
	ck_assert(wfs_store_object_exists(fs.store, &want));
}

/* ---- keep: versions a successor adopts ------------------------------------------------------- */

struct kept {
	struct wfs_keep_record r[8];
	size_t n;
};

static void collect(const struct wfs_keep_record *r, void *arg)
{
	struct kept *k = arg;

	if (k->n < 8)
		k->r[k->n++] = *r;
}

/* Read @v whole and compare it with @want (@len bytes). */
static void assert_version_holds(struct wfs_version *v, const unsigned char *want, size_t len)
{
	unsigned char *back = malloc(len + 1);

	ck_assert_uint_eq(wfs_version_size(v), len);
	ck_assert_int_eq(wfs_version_read(v, back, len + 1, 0), (ssize_t)len);
	ck_assert_mem_eq(back, want, len);
	free(back);
}

/*
 * Under a holder a version keeps its bytes where another process finds them: a small one in its
 * record's slot, a grown one in a named tmp file. What a successor adopts from the records reads
 * the same bytes; a version with a write error is LOST and refused; a finished one leaves none.
 */
START_TEST(keep_adopts_what_a_server_left)
{
	size_t area = wfs_keep_area_bytes(), big = 3 * MIB + 5;
	void *p = mmap(NULL, area, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	unsigned char small[5000], *large = malloc(big);
	struct wfs_inode *a, *b, *c;
	struct wfs_version *va, *vb, *vc, *adopted;
	struct kept k = {0};
	int err;

	ck_assert_ptr_ne(p, MAP_FAILED);
	wfs_keep_attach(p, true);
	tu_fill(small, sizeof(small), 3);
	tu_fill(large, big, 4);
	wfs_lock(&fs.lock);
	a = new_file("a");
	b = new_file("b");
	c = new_file("c");
	va = wfs_seal_writer(&fs, a, true, &err);
	vb = wfs_seal_writer(&fs, b, true, &err);
	vc = wfs_seal_writer(&fs, c, true, &err);
	ck_assert(va && vb && vc);
	ck_assert_int_eq(wfs_version_write(va, small + 100, sizeof(small) - 100, 100), (ssize_t)sizeof(small) - 100);
	ck_assert_int_eq(wfs_version_write(va, small, 100, 0), 100);
	ck_assert_int_eq(wfs_version_write(vb, large, big, 0), (ssize_t)big);
	ck_assert_int_eq(wfs_version_write(vc, small, 10, 0), 10);
	wfs_version_fail(vc, -EIO);
	ck_assert_uint_eq(wfs_keep_each(collect, &k), 3);
	for (size_t i = 0; i < k.n; i++) {
		const struct wfs_keep_record *r = &k.r[i];

		adopted = wfs_version_adopt(fs.store, r, &err);
		if (r->ino == c->ino) {
			ck_assert_int_eq(r->state, WFS_KEEP_LOST);
			ck_assert_ptr_null(adopted);
			ck_assert_int_eq(err, -EIO);
			continue;
		}
		ck_assert_ptr_nonnull(adopted);
		ck_assert_int_eq(r->state, WFS_KEEP_LIVE);
		if (r->ino == a->ino) {
			ck_assert(r->in_memory);
			assert_version_holds(adopted, small, sizeof(small));
		} else {
			ck_assert(!r->in_memory);
			ck_assert_str_ne(r->tmp_name, "");
			assert_version_holds(adopted, large, big);
		}
		wfs_version_put(adopted); /* as a successor that dies too: the record goes with it */
	}
	/* A sealed version leaves no record. */
	wfs_seal_abandon(&fs, c);
	wfs_version_put(vc);
	ck_assert_int_eq(wfs_seal(&fs, a, true), 0);
	wfs_version_put(va);
	assert_sealed_as(a->ino, small, sizeof(small));
	wfs_seal_abandon(&fs, b);
	wfs_version_put(vb);
	wfs_unlock(&fs.lock);
	k.n = 0;
	ck_assert_uint_eq(wfs_keep_each(collect, &k), 0);
	wfs_keep_attach(NULL, false);
	munmap(p, area);
	free(large);
}
END_TEST

/* ---- versions ------------------------------------------------------------------------------- */

/* In-order writes are hashed as they arrive, across the move from memory to a tmp file. */
START_TEST(version_in_order_spills)
{
	size_t len = 3 * MIB + 123;
	unsigned char *buf = malloc(len), *back = malloc(len);
	struct wfs_digest d, want;
	struct wfs_version *v;
	bool unwritten, existed;
	uint64_t size;
	int err;

	tu_fill(buf, len, 1);
	v = wfs_version_new(fs.store, &err);
	ck_assert_ptr_nonnull(v);
	for (size_t off = 0; off < len; off += 700 * 1024) {
		size_t n = len - off < 700 * 1024 ? len - off : 700 * 1024;

		ck_assert_int_eq(wfs_version_write(v, buf + off, n, (off_t)off), (ssize_t)n);
	}
	ck_assert_uint_eq(wfs_version_size(v), len);
	ck_assert_int_eq(wfs_version_read(v, back, len, 0), (ssize_t)len);
	ck_assert_mem_eq(back, buf, len);
	ck_assert_int_eq(wfs_version_freeze(v, &d, &size, &unwritten), 0);
	wfs_digest_buf(buf, len, &want);
	ck_assert(wfs_digest_equal(&d, &want));
	ck_assert_uint_eq(size, len);
	ck_assert(!unwritten);
	ck_assert_int_eq(wfs_version_write(v, buf, 1, 0), -EAGAIN); /* FROZEN */
	ck_assert_int_eq(wfs_version_read(v, back, 10, 0), 10);      /* reads still served */
	ck_assert_int_eq(wfs_version_publish(v, &d, false, false, true, &existed), 0);
	ck_assert(!existed);
	ck_assert(wfs_store_object_exists(fs.store, &d));
	ck_assert_int_eq(wfs_version_read(v, back, 10, 0), -EAGAIN); /* DONE */
	wfs_version_put(v);
	free(buf);
	free(back);
}
END_TEST

/* Out-of-order writes, truncation and growth: the seal rehashes what the version holds. */
START_TEST(version_out_of_order_and_truncate)
{
	unsigned char buf[8192], want_bytes[6000] = {0};
	struct wfs_digest d, want;
	struct wfs_version *v;
	bool unwritten;
	uint64_t size;
	int err;

	tu_fill(buf, sizeof(buf), 2);
	v = wfs_version_new(fs.store, &err);
	ck_assert_int_eq(wfs_version_write(v, buf + 4096, 4096, 4096), 4096);
	ck_assert_int_eq(wfs_version_write(v, buf, 4096, 0), 4096);
	ck_assert_int_eq(wfs_version_truncate(v, 5000), 0);
	ck_assert_int_eq(wfs_version_truncate(v, 6000), 0); /* grows with zeros */
	memcpy(want_bytes, buf, 5000);
	ck_assert_int_eq(wfs_version_freeze(v, &d, &size, &unwritten), 0);
	wfs_digest_buf(want_bytes, sizeof(want_bytes), &want);
	ck_assert(wfs_digest_equal(&d, &want));
	ck_assert_uint_eq(size, 6000);
	wfs_version_discard(v);
	ck_assert_int_eq(wfs_version_write(v, buf, 1, 0), -EAGAIN);
	wfs_version_put(v);
}
END_TEST

START_TEST(version_fallocate_modes)
{
	unsigned char zeros[4096] = {0}, back[4096];
	struct wfs_version *v;
	int err;

	v = wfs_version_new(fs.store, &err);
	ck_assert_int_eq(wfs_version_fallocate(v, FALLOC_FL_ZERO_RANGE, 0, 10), -EOPNOTSUPP);
	ck_assert_int_eq(wfs_version_fallocate(v, FALLOC_FL_PUNCH_HOLE, 0, 10), -EOPNOTSUPP);
	ck_assert_int_eq(wfs_version_fallocate(v, 0, 0, 0), -EINVAL);
	ck_assert_int_eq(wfs_version_fallocate(v, FALLOC_FL_KEEP_SIZE, 0, 4096), 0);
	ck_assert_uint_eq(wfs_version_size(v), 0); /* reserved, size kept */
	ck_assert_int_eq(wfs_version_fallocate(v, 0, 0, 4096), 0);
	ck_assert_uint_eq(wfs_version_size(v), 4096);
	ck_assert_int_eq(wfs_version_read(v, back, sizeof(back), 0), 4096);
	ck_assert_mem_eq(back, zeros, sizeof(zeros));
	/* A punched hole: zeros, size kept; in memory, then in the tmp file. */
	ck_assert_int_eq(wfs_version_write(v, "abcdef", 6, 100), 6);
	ck_assert_int_eq(wfs_version_fallocate(v, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 102, 2), 0);
	ck_assert_int_eq(wfs_version_read(v, back, 6, 100), 6);
	ck_assert_mem_eq(back, "ab\0\0ef", 6);
	ck_assert_uint_eq(wfs_version_size(v), 4096);
	ck_assert_int_eq(wfs_version_fallocate(v, 0, 0, 2 * MIB), 0); /* past memory: a tmp file */
	ck_assert_uint_eq(wfs_version_size(v), 2 * MIB);
	ck_assert_int_eq(wfs_version_fallocate(v, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 100, 2 * MIB), 0);
	ck_assert_int_eq(wfs_version_read(v, back, 6, 100), 6);
	ck_assert_mem_eq(back, zeros, 6);
	ck_assert_uint_eq(wfs_version_size(v), 2 * MIB);
	wfs_version_discard(v);
	wfs_version_put(v);
}
END_TEST

/* A claim freezes an empty version (no write may land before it commits) and thaws it if it fails. */
START_TEST(version_claim_freeze_thaw)
{
	struct wfs_version *v;
	int err;

	v = wfs_version_new(fs.store, &err);
	ck_assert_int_eq(wfs_version_claim_freeze(v, true), 0);
	ck_assert(wfs_version_frozen(v));
	ck_assert_int_eq(wfs_version_write(v, "x", 1, 0), -EAGAIN);
	wfs_version_thaw(v);
	ck_assert(!wfs_version_frozen(v));
	ck_assert_int_eq(wfs_version_write(v, "x", 1, 0), 1);
	ck_assert_int_eq(wfs_version_claim_freeze(v, false), -EEXIST); /* has bytes now */
	wfs_version_discard(v);
	wfs_version_put(v);
}
END_TEST

/* ---- seal ---------------------------------------------------------------------------------- */

/* The second seal of the same bytes publishes nothing: a dedup hit. */
START_TEST(seal_publishes_then_dedups)
{
	unsigned char buf[5000];
	struct wfs_inode *a, *b;

	tu_fill(buf, sizeof(buf), 3);
	wfs_lock(&fs.lock);
	a = new_file("a");
	b = new_file("b");
	ck_assert_int_eq(seal_bytes(a, buf, sizeof(buf)), 0);
	ck_assert(a->sealed && !a->writer);
	assert_sealed_as(a->ino, buf, sizeof(buf));
	ck_assert_int_eq(seal_bytes(b, buf, sizeof(buf)), 0);
	assert_sealed_as(b->ino, buf, sizeof(buf));
	ck_assert_uint_eq(fs.counters->seals, 2);
	ck_assert_uint_eq(fs.counters->objects_published, 1);
	ck_assert_uint_eq(fs.counters->dedup_hits, 1);
	ck_assert_uint_eq(fs.counters->bytes_published, sizeof(buf));
	wfs_unlock(&fs.lock);
}
END_TEST

/* A rewrite in place starts from a copy of the sealed bytes; the old object goes when unreferenced. */
START_TEST(seal_rewrite_copies_base)
{
	unsigned char buf[3000], want[3000];
	struct wfs_digest old;
	struct wfs_version *v;
	struct wfs_inode *in;
	int err;

	tu_fill(buf, sizeof(buf), 4);
	wfs_lock(&fs.lock);
	in = new_file("w");
	ck_assert_int_eq(seal_bytes(in, buf, sizeof(buf)), 0);
	old = in->digest;
	v = wfs_seal_writer(&fs, in, false, &err);
	ck_assert_ptr_nonnull(v);
	ck_assert_uint_eq(wfs_version_size(v), sizeof(buf)); /* the copy of the sealed bytes */
	ck_assert_int_eq(wfs_version_write(v, "XYZ", 3, 100), 3);
	ck_assert_int_eq(wfs_seal(&fs, in, true), 0);
	wfs_version_put(v);
	memcpy(want, buf, sizeof(want));
	memcpy(want + 100, "XYZ", 3);
	assert_sealed_as(in->ino, want, sizeof(want));
	ck_assert(!wfs_store_object_exists(fs.store, &old)); /* no name has it, nothing pins it */
	wfs_unlock(&fs.lock);
}
END_TEST

/*
 * A truncate (an O_TRUNC open) of a file whose rewrite is copying its sealed bytes waits for the copy
 * without fs->lock: it waited on the version's lock while holding fs->lock, and every other request
 * waited as long as the copy took (WFS_DELAY version.copy stands for a large file's copy).
 */
struct copy_arg {
	struct wfs_inode *in;
	bool truncate;
	struct wfs_version *v;
};

static void *start_writer(void *p)
{
	struct copy_arg *a = p;
	int err;

	wfs_lock(&fs.lock);
	a->v = wfs_seal_writer(&fs, a->in, a->truncate, &err);
	wfs_unlock(&fs.lock);
	return NULL;
}

START_TEST(seal_copy_leaves_fs_lock)
{
	unsigned char buf[3000];
	struct copy_arg copy = {0}, trunc = {0};
	struct timespec t0, t1;
	pthread_t a, b;
	double waited_ms;

	setenv("WFS_DELAY", "version.copy=600", 1);
	tu_fill(buf, sizeof(buf), 6);
	wfs_lock(&fs.lock);
	copy.in = trunc.in = new_file("c");
	ck_assert_int_eq(seal_bytes(copy.in, buf, sizeof(buf)), 0);
	wfs_inode_pin(copy.in);
	wfs_unlock(&fs.lock);
	trunc.truncate = true;
	ck_assert_int_eq(pthread_create(&a, NULL, start_writer, &copy), 0); /* copies for 600 ms */
	usleep(100 * 1000);
	ck_assert_int_eq(pthread_create(&b, NULL, start_writer, &trunc), 0); /* the O_TRUNC open */
	usleep(100 * 1000);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	wfs_lock(&fs.lock); /* any other request */
	clock_gettime(CLOCK_MONOTONIC, &t1);
	wfs_unlock(&fs.lock);
	waited_ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
	ck_assert_int_eq(pthread_join(a, NULL), 0);
	ck_assert_int_eq(pthread_join(b, NULL), 0);
	ck_assert_msg(waited_ms < 150, "fs->lock waited %.0f ms for a copy", waited_ms);
	ck_assert_ptr_nonnull(copy.v);
	ck_assert_ptr_eq(trunc.v, copy.v); /* the truncate joined the copied version ... */
	ck_assert_uint_eq(wfs_version_size(trunc.v), 0); /* ... after the copy, and emptied it */
	wfs_lock(&fs.lock);
	wfs_version_put(copy.v);
	wfs_version_put(trunc.v);
	wfs_inode_unpin(&fs, copy.in);
	wfs_unlock(&fs.lock);
}
END_TEST

/* With dtype and shape set, a size that does not fit is refused where close(2) hears it, sealed
 * (and logged) at release, where nobody would. */
START_TEST(seal_holds_size_to_dtype_shape)
{
	struct wfs_inode *in;
	char bytes[12] = {0};

	wfs_lock(&fs.lock);
	in = new_file("t");
	ck_assert_int_eq(wfs_catalog_xattr_set(fs.catalog, in->ino, WFS_XATTR_DTYPE, "F32", 3, 0), 0);
	ck_assert_int_eq(wfs_catalog_xattr_set(fs.catalog, in->ino, WFS_XATTR_SHAPE, "[4]", 3, 0), 0);
	ck_assert_int_eq(seal_bytes(in, bytes, sizeof(bytes)), -EINVAL);
	ck_assert(!in->sealed && !in->writer); /* the version was dropped */
	ck_assert_int_eq(wfs_seal_fits(&fs, in->ino, 16, NULL, NULL, 0, true, "test"), 0);
	ck_assert_int_eq(wfs_seal_fits(&fs, in->ino, 16, WFS_XATTR_SHAPE, "[5]", 3, false, "test"), -EINVAL);
	ck_assert_int_eq(wfs_seal_check_xattr(&fs, in->ino, WFS_XATTR_DTYPE, "F33", 3), -EINVAL);
	ck_assert_int_eq(wfs_seal_check_xattr(&fs, in->ino, WFS_XATTR_SHAPE, "[4,", 3), -EINVAL);
	{
		struct wfs_version *v;
		int err;

		v = wfs_seal_writer(&fs, in, true, &err);
		ck_assert_int_eq(wfs_version_write(v, bytes, sizeof(bytes), 0), (ssize_t)sizeof(bytes));
		ck_assert_int_eq(wfs_seal(&fs, in, false), 0); /* at release */
		wfs_version_put(v);
	}
	assert_sealed_as(in->ino, bytes, sizeof(bytes));
	wfs_unlock(&fs.lock);
}
END_TEST

/* The last writable handle to leave seals; an earlier one does not. */
START_TEST(seal_last_writer_seals)
{
	struct wfs_handle h1 = {.writable = true}, h2 = {.writable = true};
	struct wfs_news news = {0};
	struct wfs_version *v;
	struct wfs_inode *in;
	int err;

	wfs_lock(&fs.lock);
	in = new_file("two");
	h1.inode = h2.inode = in;
	v = wfs_seal_writer(&fs, in, true, &err);
	wfs_seal_join(&h1, v);
	wfs_seal_join(&h2, v);
	ck_assert_uint_eq(wfs_version_writers(v), 2);
	ck_assert_int_eq(wfs_version_write(v, "abc", 3, 0), 3);
	wfs_version_put(v);
	ck_assert_int_eq(wfs_closing_flush(&fs, &h1, 0, &news), 0);
	ck_assert(!in->sealed && in->writer == v);
	ck_assert_int_eq(wfs_closing_flush(&fs, &h2, 0, &news), 0);
	ck_assert(in->sealed && !in->writer);
	assert_sealed_as(in->ino, "abc", 3);
	ck_assert_uint_eq(news.n, 0);
	wfs_news_release(&news);
	wfs_unlock(&fs.lock);
}
END_TEST

/*
 * A never-sealed name whose close refused its size stays while the open file may still complete
 * it (another descriptor); its release drops the version, removes the name and tells the kernel.
 */
START_TEST(seal_failed_new_name_removed)
{
	struct wfs_handle h = {.writable = true};
	struct wfs_news news = {0};
	struct wfs_version *v;
	struct wfs_inode *in;
	struct wfs_attr a;
	int err;

	wfs_lock(&fs.lock);
	in = new_file("gone");
	h.inode = in;
	ck_assert_int_eq(wfs_catalog_xattr_set(fs.catalog, in->ino, WFS_XATTR_DTYPE, "F32", 3, 0), 0);
	ck_assert_int_eq(wfs_catalog_xattr_set(fs.catalog, in->ino, WFS_XATTR_SHAPE, "[4]", 3, 0), 0);
	v = wfs_seal_writer(&fs, in, true, &err);
	wfs_seal_join(&h, v);
	ck_assert_int_eq(wfs_version_write(v, "abc", 3, 0), 3); /* 3 bytes do not make F32 [4] */
	wfs_version_put(v);
	ck_assert_int_eq(wfs_closing_flush(&fs, &h, 0, &news), -EINVAL);
	ck_assert_uint_eq(news.n, 0);
	ck_assert_int_eq(wfs_catalog_lookup(fs.catalog, WFS_ROOT_INO, "gone", &a), 0);
	ck_assert_int_eq(wfs_closing_release(&fs, &h, 0, &news), 0); /* the release */
	ck_assert_uint_eq(news.n, 1);
	ck_assert_str_eq(news.names[0].name, "gone");
	ck_assert(news.inval && !news.moved);
	ck_assert_int_eq(wfs_catalog_lookup(fs.catalog, WFS_ROOT_INO, "gone", &a), -ENOENT);
	wfs_news_release(&news);
	wfs_unlock(&fs.lock);
}
END_TEST

/* ---- claim ---------------------------------------------------------------------------------- */

START_TEST(claim_cases)
{
	unsigned char buf[4096];
	struct wfs_digest d, missing;
	uint64_t dst, full;
	struct wfs_inode *src;

	tu_fill(buf, sizeof(buf), 5);
	wfs_digest_buf(buf, sizeof(buf), &d);
	wfs_digest_buf("nothing", 7, &missing);
	wfs_lock(&fs.lock);
	src = new_file("src");
	ck_assert_int_eq(seal_bytes(src, buf, sizeof(buf)), 0);
	dst = new_file("dst")->ino; /* by number: a claim frees the entry of an inode nobody holds */
	full = new_file("full")->ino;
	ck_assert_int_eq(seal_bytes(wfs_inode_find(&fs, full), "x", 1), 0);
	ck_assert_int_eq(wfs_claim(&fs, dst, &missing), -ENODATA);
	ck_assert_uint_eq(fs.counters->claim_misses, 1);
	ck_assert_int_eq(wfs_claim(&fs, full, &d), -EEXIST);
	ck_assert_int_eq(wfs_claim(&fs, WFS_ROOT_INO, &d), -EINVAL);
	ck_assert_int_eq(wfs_claim(&fs, dst, &d), 0);
	ck_assert_uint_eq(fs.counters->claims, 1);
	assert_sealed_as(dst, buf, sizeof(buf));
	ck_assert_int_eq(wfs_claim(&fs, dst, &d), -EEXIST); /* has content now */
	wfs_unlock(&fs.lock);
}
END_TEST

/* ---- open mode ------------------------------------------------------------------------------- */

/* Open, then release, with fs->lock taken here as the handlers take it. */
static int open_ino(uint64_t ino, bool writable, struct wfs_handle **h, struct wfs_open_reply *r,
		    struct wfs_news *news)
{
	return wfs_openmode_open(&fs, ino, writable, 0, 0, h, r, news);
}

static uint64_t sealed_file(const char *name, const void *buf, size_t len)
{
	struct wfs_inode *in = new_file(name);
	uint64_t ino = in->ino;

	ck_assert_int_eq(seal_bytes(in, buf, len), 0);
	wfs_inode_maybe_free(&fs, in); /* nothing holds it, as after the writer's release */
	return ino;
}

/* Read-only opens share one backing file, released at the last close. */
START_TEST(openmode_passthrough_shared)
{
	struct wfs_handle *h1, *h2;
	struct wfs_open_reply r1, r2;
	struct wfs_news news = {0};
	uint64_t ino;

	wfs_lock(&fs.lock);
	ino = sealed_file("p", "hello", 5);
	ck_assert_int_eq(open_ino(ino, false, &h1, &r1, &news), 0);
	ck_assert_int_eq(open_ino(ino, false, &h2, &r2, &news), 0);
	ck_assert_int_gt(r1.backing_id, 0);
	ck_assert_int_eq(r2.backing_id, r1.backing_id);
	ck_assert_int_eq(kern.opened, 1);
	ck_assert_uint_eq(h1->inode->io.npassthrough, 2);
	wfs_openmode_release(&fs, h1, 0, &news);
	ck_assert_int_eq(kern.closed, 0);
	wfs_openmode_release(&fs, h2, 0, &news);
	ck_assert_int_eq(kern.closed, 1);
	ck_assert_int_eq(kern.last_closed, r1.backing_id);
	ck_assert_ptr_null(wfs_inode_find(&fs, ino)); /* no lookups, no opens: freed */
	ck_assert_uint_eq(fs.counters->opens_passthrough, 2);
	wfs_unlock(&fs.lock);
}
END_TEST

/* A daemon-served (cached) open keeps later read-only opens daemon-served: the kernel refuses mixing. */
START_TEST(openmode_cached_excludes_passthrough)
{
	struct wfs_handle *w, *r;
	struct wfs_open_reply rw, rr;
	struct wfs_news news = {0};
	uint64_t ino;

	wfs_lock(&fs.lock);
	ino = sealed_file("c", "hello", 5);
	ck_assert_int_eq(open_ino(ino, true, &w, &rw, &news), 0);
	ck_assert_int_eq(rw.backing_id, 0);
	ck_assert_int_eq(open_ino(ino, false, &r, &rr, &news), 0);
	ck_assert_int_eq(rr.backing_id, 0);
	ck_assert_int_eq(kern.opened, 0);
	ck_assert_uint_eq(w->inode->io.ncached, 2);
	wfs_openmode_release(&fs, r, 0, &news);
	wfs_openmode_release(&fs, w, 0, &news);
	ck_assert_uint_eq(fs.counters->opens_daemon, 2);
	wfs_unlock(&fs.lock);
}
END_TEST

/* A writer beside passthrough readers: the name moves to a new inode (ESTALE, then the retry opens
 * the new one in place); a hard-linked file's names move together. */
START_TEST(openmode_writer_beside_readers)
{
	struct wfs_handle *r, *w;
	struct wfs_open_reply rr, rw;
	struct wfs_news news = {0};
	struct wfs_attr a, link;
	uint64_t ino;

	wfs_lock(&fs.lock);
	ino = sealed_file("m", "hello", 5);
	ck_assert_int_eq(open_ino(ino, false, &r, &rr, &news), 0);
	ck_assert_int_gt(rr.backing_id, 0);
	ck_assert_int_eq(open_ino(ino, true, &w, &rw, &news), -ESTALE);
	ck_assert(news.moved);
	ck_assert_uint_eq(news.n, 1);
	ck_assert_str_eq(news.names[0].name, "m");
	wfs_news_release(&news);
	ck_assert_int_eq(wfs_catalog_lookup(fs.catalog, WFS_ROOT_INO, "m", &a), 0);
	ck_assert_uint_ne(a.ino, ino);
	ck_assert_int_eq(open_ino(ino, true, &w, &rw, &news), -ESTALE); /* the old inode, again */
	ck_assert_int_eq(open_ino(a.ino, true, &w, &rw, &news), 0);     /* the retry */
	ck_assert_uint_eq(fs.counters->moved_from_readers, 1);
	wfs_openmode_release(&fs, w, 0, &news);
	wfs_openmode_release(&fs, r, 0, &news);

	/* Hard links move together: both names, one new inode with two links. */
	ino = sealed_file("l", "hello", 5);
	ck_assert_int_eq(wfs_catalog_link(fs.catalog, ino, WFS_ROOT_INO, "l2", &link), 0);
	ck_assert_int_eq(open_ino(ino, false, &r, &rr, &news), 0);
	ck_assert_int_eq(open_ino(ino, true, &w, &rw, &news), -ESTALE);
	ck_assert(news.moved);
	ck_assert_uint_eq(news.n, 2);
	wfs_news_release(&news);
	ck_assert_int_eq(wfs_catalog_lookup(fs.catalog, WFS_ROOT_INO, "l", &a), 0);
	ck_assert_int_eq(wfs_catalog_lookup(fs.catalog, WFS_ROOT_INO, "l2", &link), 0);
	ck_assert_uint_ne(a.ino, ino);
	ck_assert_uint_eq(link.ino, a.ino);
	ck_assert_uint_eq(a.nlink, 2);
	ck_assert_int_eq(open_ino(a.ino, true, &w, &rw, &news), 0); /* the retry */
	ck_assert_uint_eq(fs.counters->moved_from_readers, 2);
	wfs_openmode_release(&fs, w, 0, &news);
	wfs_openmode_release(&fs, r, 0, &news);
	wfs_unlock(&fs.lock);
}
END_TEST

/*
 * A successor adopts a dead server's readers (takeover.h): their inode is decided as the kernel holds
 * it. Passthrough readers on the dead server's backing id: read-only opens share that id (the
 * kernel refuses any other), a writer moves the name away, the id goes back at the last release. A
 * daemon-served reader keeps reads daemon-served. A reader whose record disagrees is refused.
 * Unlinked under its readers, the inode is reached only through a name the kernel still holds (a
 * move the dead server did not live to tell): ESTALE, then the retry that reaches it again waits
 * for the readers (ETXTBSY).
 */
START_TEST(openmode_adopted_readers)
{
	struct wfs_handle *a1, *a2, *r, *w, *c;
	struct wfs_open_reply rr, rw;
	struct wfs_news news = {0};
	struct wfs_attr moved;
	uint64_t ino, ino2, gone;

	wfs_lock(&fs.lock);
	ino = sealed_file("a", "hello", 5);
	ck_assert_int_eq(wfs_openmode_adopt_reader(&fs, ino, 77, &a1), 1); /* the inode takes id 77 */
	ck_assert_int_eq(wfs_openmode_adopt_reader(&fs, ino, 77, &a2), 0); /* shared */
	ck_assert_int_eq(wfs_openmode_adopt_reader(&fs, ino, 78, &c), -EBUSY);
	ck_assert_int_eq(wfs_openmode_adopt_reader(&fs, ino, 0, &c), -EBUSY);
	ck_assert_int_eq(open_ino(ino, false, &r, &rr, &news), 0);
	ck_assert_int_eq(rr.backing_id, 77);
	ck_assert_int_eq(kern.opened, 0); /* nothing registered: the dead server's file serves */
	ck_assert_int_eq(open_ino(ino, true, &w, &rw, &news), -ESTALE);
	ck_assert(news.moved);
	wfs_news_release(&news);
	ck_assert_int_eq(wfs_catalog_lookup(fs.catalog, WFS_ROOT_INO, "a", &moved), 0);
	ck_assert_uint_ne(moved.ino, ino);
	wfs_openmode_release(&fs, a1, 0, &news);
	wfs_openmode_release(&fs, r, 0, &news);
	ck_assert_int_eq(kern.closed, 0);
	wfs_openmode_release(&fs, a2, 0, &news);
	ck_assert_int_eq(kern.closed, 1);
	ck_assert_int_eq(kern.last_closed, 77);

	/* A daemon-served reader: later reads are daemon-served too, and a passthrough one is refused. */
	ino2 = sealed_file("b", "hello", 5);
	ck_assert_int_eq(wfs_openmode_adopt_reader(&fs, ino2, 0, &c), 0);
	ck_assert_int_eq(wfs_openmode_adopt_reader(&fs, ino2, 79, &a1), -EBUSY);
	ck_assert_int_eq(open_ino(ino2, false, &r, &rr, &news), 0);
	ck_assert_int_eq(rr.backing_id, 0);
	wfs_openmode_release(&fs, r, 0, &news);
	wfs_openmode_release(&fs, c, 0, &news);

	/* Unlinked (nlink 0) under an adopted passthrough reader: ESTALE once, then ETXTBSY. */
	ck_assert_int_eq(wfs_openmode_adopt_reader(&fs, ino2, 80, &a1), 1);
	ck_assert_int_eq(wfs_catalog_unlink(fs.catalog, WFS_ROOT_INO, "b", false, &gone), 0);
	ck_assert_int_eq(open_ino(ino2, true, &w, &rw, &news), -ESTALE);
	ck_assert_int_eq(open_ino(ino2, true, &w, &rw, &news), -ETXTBSY);
	wfs_openmode_release(&fs, a1, 0, &news);
	ck_assert_int_eq(kern.last_closed, 80);
	wfs_unlock(&fs.lock);
}
END_TEST

/* A name whose writer never sealed it fails opens with EIO; without passthrough reads are served. */
START_TEST(openmode_unsealed_and_daemon_reads)
{
	struct wfs_handle *h;
	struct wfs_open_reply r;
	struct wfs_news news = {0};
	struct wfs_inode *in;
	char back[16];
	uint64_t ino;

	wfs_lock(&fs.lock);
	in = new_file("u");
	ino = in->ino;
	wfs_inode_maybe_free(&fs, in);
	ck_assert_int_eq(open_ino(ino, false, &h, &r, &news), -EIO);
	ino = sealed_file("d", "daemon", 6);
	atomic_store(&fs.passthrough, false);
	ck_assert_int_eq(open_ino(ino, false, &h, &r, &news), 0);
	ck_assert_int_eq(r.backing_id, 0);
	wfs_unlock(&fs.lock);
	ck_assert_int_eq(wfs_openmode_read(&fs, h, 0, back, sizeof(back), 0), 6);
	ck_assert_mem_eq(back, "daemon", 6);
	wfs_lock(&fs.lock);
	wfs_openmode_release(&fs, h, 0, &news);
	wfs_unlock(&fs.lock);
}
END_TEST

/* Write through a handle and close it: the flush by the writer seals. */
START_TEST(openmode_write_flush_seals)
{
	struct wfs_handle *h;
	struct wfs_open_reply r;
	struct wfs_news news = {0};
	struct wfs_inode *in;
	bool mode_changed;
	uint64_t ino;

	wfs_lock(&fs.lock);
	in = new_file("f");
	ino = in->ino;
	ck_assert_int_eq(wfs_openmode_create(&fs, in, 0, 0, &h, &r), 0);
	wfs_unlock(&fs.lock);
	ck_assert_int_eq(wfs_fileio_write(&fs, h, &(struct wfs_caller){.tid = gettid()}, "weights", 7, 0, &mode_changed), 7);
	ck_assert(!mode_changed);
	wfs_lock(&fs.lock);
	ck_assert_int_eq(wfs_openmode_flush(&fs, h, gettid(), &news), 0);
	assert_sealed_as(ino, "weights", 7);
	wfs_openmode_release(&fs, h, gettid(), &news);
	ck_assert_ptr_null(wfs_inode_find(&fs, ino));
	wfs_unlock(&fs.lock);
}
END_TEST


/* A tensor declared at 8 MiB, created and closed: the writer's reopen is passthrough on a version. */
static uint64_t declared_tensor(const char *name)
{
	struct wfs_inode *in = new_file(name);
	uint64_t ino = in->ino;

	ck_assert_int_eq(wfs_catalog_xattr_set(fs.catalog, ino, WFS_XATTR_DTYPE, "U8", 2, 0), 0);
	ck_assert_int_eq(wfs_catalog_xattr_set(fs.catalog, ino, WFS_XATTR_SHAPE, "[8388608]", 9, 0), 0);
	ck_assert_int_eq(wfs_seal_empty(&fs, in), 0); /* the create's close */
	wfs_inode_maybe_free(&fs, in);
	return ino;
}

/* Written through the (fake) kernel, sealed at the release after the lease check passes. */
START_TEST(openmode_passthrough_writer)
{
	size_t len = 8u << 20;
	unsigned char *data = malloc(len);
	struct wfs_handle *w, *r;
	struct wfs_open_reply rw, rr;
	struct wfs_news news = {0};
	struct wfs_attr a;
	uint64_t ino;
	int kfd;

	tu_fill(data, len, 9);
	wfs_lock(&fs.lock);
	ino = declared_tensor("big");
	ck_assert_int_eq(open_ino(ino, true, &w, &rw, &news), 0);
	ck_assert_int_gt(rw.backing_id, 0);
	ck_assert_uint_eq(fs.counters->opens_passthrough_write, 1);
	ck_assert_int_eq(open_ino(ino, false, &r, &rr, &news), 0);
	ck_assert_int_eq(rr.backing_id, rw.backing_id); /* the reader shares the version's file */
	kfd = backing_open_as(rw.backing_id, O_RDWR);
	ck_assert_int_ge(kfd, 0);
	ck_assert_int_eq(tu_write_all(kfd, data, len), 0);
	ck_assert_uint_eq(wfs_version_size(w->inode->writer), len); /* the file's size */
	ck_assert_int_eq(wfs_openmode_flush(&fs, w, 0, &news), 0);
	ck_assert_ptr_nonnull(w->inode->writer); /* not sealed at the flush: at the release */
	ck_assert_int_eq(wfs_catalog_getattr(fs.catalog, ino, &a), 0);
	ck_assert_uint_eq(a.size, 0); /* the catalog still has the create's empty seal */
	close(kfd); /* the kernel puts the writer's backing file */
	wfs_openmode_release(&fs, w, 0, &news);
	assert_sealed_as(ino, data, len);
	ck_assert_uint_eq(fs.counters->published_copies, 0);
	ck_assert_int_eq(kern.closed, 0); /* the reader still uses it */
	wfs_openmode_release(&fs, r, 0, &news);
	ck_assert_int_eq(kern.closed, 1);
	wfs_unlock(&fs.lock);
	free(data);
}
END_TEST

/* A descriptor that can still write the file at the release: the seal publishes a copy, and later
 * writes through that descriptor do not reach the object. */
START_TEST(openmode_passthrough_writer_still_open)
{
	size_t len = 8u << 20;
	unsigned char *data = malloc(len), *back = NULL;
	struct wfs_handle *w;
	struct wfs_open_reply rw;
	struct wfs_news news = {0};
	struct wfs_attr a;
	size_t back_len;
	char path[700], name[34];
	uint64_t ino;
	int kfd;

	tu_fill(data, len, 10);
	wfs_lock(&fs.lock);
	ino = declared_tensor("held");
	ck_assert_int_eq(open_ino(ino, true, &w, &rw, &news), 0);
	kfd = backing_open_as(rw.backing_id, O_RDWR);
	ck_assert_int_eq(tu_write_all(kfd, data, len), 0);
	/* kfd stays open: a writer the daemon cannot see (a mapping that outlived its close). */
	wfs_openmode_release(&fs, w, 0, &news);
	ck_assert_int_eq(wfs_catalog_getattr(fs.catalog, ino, &a), 0);
	ck_assert_uint_eq(a.size, 0); /* not sealed under it (still the empty file): when it goes (mapped.h) */
	ck_assert_uint_eq(fs.mapped.n, 1);
	ck_assert_int_eq(pwrite(kfd, "XXXX", 4, 0), 4); /* still the file's bytes */
	close(kfd);
	wfs_unlock(&fs.lock);
	ck_assert_int_eq(wfs_mapped_start(&fs), 0);
	for (int i = 0; i < 200; i++) {
		wfs_lock(&fs.lock);
		ck_assert_int_eq(wfs_catalog_getattr(fs.catalog, ino, &a), 0);
		wfs_unlock(&fs.lock);
		if (a.size == len)
			break; /* sealed by the thread, after the close */
		usleep(10000);
	}
	ck_assert_uint_eq(a.size, len);
	wfs_mapped_stop(&fs);
	memcpy(data, "XXXX", 4);
	wfs_lock(&fs.lock);
	assert_sealed_as(ino, data, len);
	ck_assert_uint_eq(fs.counters->published_copies, 0); /* the file itself, nobody writes it now */
	ck_assert_int_eq(wfs_catalog_getattr(fs.catalog, ino, &a), 0);
	wfs_store_object_name(&a.digest, name);
	snprintf(path, sizeof(path), "%s/store/objects/%s", tu_test_dir, name);
	ck_assert_int_eq(tu_read_file(path, (void **)&back, &back_len), 0);
	ck_assert_uint_eq(back_len, len);
	ck_assert(memcmp(back, data, len) == 0);
	free(back);

	/* Still open for writing at the unmount: a copy of the bytes as they are is sealed. */
	ino = declared_tensor("kept");
	ck_assert_int_eq(open_ino(ino, true, &w, &rw, &news), 0);
	kfd = backing_open_as(rw.backing_id, O_RDWR);
	tu_fill(data, len, 11);
	ck_assert_int_eq(tu_write_all(kfd, data, len), 0);
	wfs_openmode_release(&fs, w, 0, &news);
	wfs_unlock(&fs.lock);
	wfs_mapped_stop(&fs);
	wfs_lock(&fs.lock);
	assert_sealed_as(ino, data, len);
	ck_assert_uint_eq(fs.counters->published_copies, 1);
	ck_assert_int_eq(pwrite(kfd, "XXXX", 4, 0), 4); /* too late: the object is a copy */
	close(kfd);
	ck_assert_int_eq(wfs_catalog_getattr(fs.catalog, ino, &a), 0);
	wfs_store_object_name(&a.digest, name);
	snprintf(path, sizeof(path), "%s/store/objects/%s", tu_test_dir, name);
	ck_assert_int_eq(tu_read_file(path, (void **)&back, &back_len), 0);
	ck_assert(back_len == len && memcmp(back, data, len) == 0);
	wfs_unlock(&fs.lock);
	free(back);
	free(data);
}
END_TEST

/* Undeclared, small, or with passthrough writes off: the daemon serves the writer. */
START_TEST(openmode_writer_daemon_served)
{
	struct wfs_handle *w;
	struct wfs_open_reply rw;
	struct wfs_news news = {0};
	struct wfs_inode *in;
	uint64_t ino;

	wfs_lock(&fs.lock);
	in = new_file("plain");
	ino = in->ino;
	ck_assert_int_eq(seal_bytes(in, "x", 1), 0);
	wfs_inode_maybe_free(&fs, in);
	ck_assert_int_eq(open_ino(ino, true, &w, &rw, &news), 0);
	ck_assert_int_eq(rw.backing_id, 0);
	wfs_openmode_release(&fs, w, 0, &news);
	ino = declared_tensor("off");
	fs.opt.passthrough_writes = 0;
	ck_assert_int_eq(open_ino(ino, true, &w, &rw, &news), 0);
	ck_assert_int_eq(rw.backing_id, 0);
	wfs_openmode_release(&fs, w, 0, &news);
	ck_assert_uint_eq(fs.counters->opens_passthrough_write, 0);
	wfs_unlock(&fs.lock);
}
END_TEST

/* Tearing a table down: every entry popped once, also when entries are added part way. */
START_TEST(map_pop_empties_once)
{
	enum { N = 20000 };
	struct wfs_map m;
	struct wfs_map_node *nodes = calloc(N + 100, sizeof(*nodes)), *n;
	unsigned char *seen = calloc(N + 100, 1);
	size_t popped = 0;

	ck_assert(nodes && seen);
	wfs_map_init(&m);
	for (size_t i = 0; i < N; i++) {
		nodes[i].key = i * 2654435761u;
		ck_assert_int_eq(wfs_map_insert(&m, &nodes[i]), 0);
	}
	while ((n = wfs_map_pop(&m)) != NULL) {
		size_t i = (size_t)(n - nodes);

		ck_assert(!seen[i]);
		seen[i] = 1;
		if (++popped == N / 2) /* an insert part way: the scan starts over and finds it */
			for (size_t j = N; j < N + 100; j++) {
				nodes[j].key = j;
				ck_assert_int_eq(wfs_map_insert(&m, &nodes[j]), 0);
			}
	}
	ck_assert_uint_eq(popped, N + 100);
	ck_assert_uint_eq(m.count, 0);
	wfs_map_release(&m);
	free(nodes);
	free(seen);
}
END_TEST

/*
 * fs->lock's record (lock.h): the longest hold with where it was taken and released, holds of
 * WFS_LOCK_SLOW_MS or more counted; time waiting on a condition variable is not a hold.
 */
START_TEST(lock_records_long_holds)
{
	struct timespec deadline;
	pthread_cond_t c = PTHREAD_COND_INITIALIZER;
	struct wfs_lock l;
	int taken;

	ck_assert_int_eq(wfs_lock_init(&l), 0);
	wfs_lock(&l);
	wfs_unlock(&l);
	ck_assert_uint_eq(l.slow, 0);
	ck_assert_uint_lt(l.held_max_ns, (uint64_t)WFS_LOCK_SLOW_MS * 1000000u);
	wfs_lock(&l);
	taken = __LINE__ - 1;
	deadline = wfs_deadline_in(3 * WFS_LOCK_SLOW_MS);
	ck_assert_int_eq(wfs_lock_timedwait(&c, &l, &deadline), ETIMEDOUT); /* waiting: no hold */
	wfs_unlock(&l);
	ck_assert_uint_eq(l.slow, 0);
	wfs_lock(&l);
	taken = __LINE__ - 1;
	usleep(2 * WFS_LOCK_SLOW_MS * 1000);
	wfs_unlock(&l);
	ck_assert_uint_eq(l.slow, 1);
	ck_assert_uint_ge(l.held_max_ns, (uint64_t)2 * WFS_LOCK_SLOW_MS * 1000000u);
	ck_assert_uint_ge(l.slow_ns, l.held_max_ns);
	ck_assert_str_eq(l.max_site, __func__);
	ck_assert_int_eq(l.max_line, taken);
	ck_assert_int_eq(l.max_end_line, taken + 3);
	wfs_lock_destroy(&l);
}
END_TEST

struct lend_probe {
	struct wfs_lock *l;
	bool light;       /* wfs_lock_light() instead of wfs_lock() */
	bool got, lent;   /* acquired; the light hold found the lock lent */
};

static void *lend_prober(void *arg)
{
	struct lend_probe *p = arg;

	if (p->light)
		p->lent = wfs_lock_light(p->l);
	else
		wfs_lock(p->l);
	__atomic_store_n(&p->got, true, __ATOMIC_SEQ_CST);
	wfs_unlock(p->l);
	return NULL;
}

/* A lent lock (lock.h): ordinary acquisitions wait for the reclaim, light ones get in and are told. */
START_TEST(lock_lent_lets_light_holds_in)
{
	struct lend_probe ord = {0}, light = {.light = true};
	pthread_t t1, t2;
	struct wfs_lock l;

	ck_assert_int_eq(wfs_lock_init(&l), 0);
	ord.l = light.l = &l;
	ck_assert(!wfs_lock_light(&l)); /* not lent: an ordinary hold */
	wfs_lock_lend(&l);
	ck_assert_int_eq(pthread_create(&t1, NULL, lend_prober, &ord), 0);
	ck_assert_int_eq(pthread_create(&t2, NULL, lend_prober, &light), 0);
	ck_assert_int_eq(pthread_join(t2, NULL), 0);
	ck_assert(light.got && light.lent);
	usleep(50000);
	ck_assert(!__atomic_load_n(&ord.got, __ATOMIC_SEQ_CST)); /* still waiting for the lender */
	wfs_lock_reclaim(&l);
	ck_assert(!wfs_lock_is_lent(&l));
	wfs_unlock(&l);
	ck_assert_int_eq(pthread_join(t1, NULL), 0);
	ck_assert(ord.got);
	ck_assert_uint_eq(l.lends, 1);
	ck_assert_uint_ge(l.lent_max_ns, 50000000u);
	ck_assert_uint_eq(l.light_holds, 1);
	wfs_lock_destroy(&l);
}
END_TEST

/* ---- closing: what a close means, as a table ------------------------------------------------ */

/*
 * The close→seal rule (closing.h), one row per case. Cases that once needed a root mount to see are
 * rows here: a killed writer beside a finished one, numpy's sizing byte, a refused size, a killed
 * declared tensor, and a writer whose version a seal holds already (it sealed twice and aborted).
 */
#define FLUSH .at_release = false
#define RELEASE .at_release = true
#define PT .passthrough = true
#define MINE .current = true
#define KILLED(sig) .killed_known = true, .killed = (sig)
#define FITS(yes) .fits_known = true, .fits = (yes)
#define FORKED(yes) .forked_known = true, .forked = (yes)

static const struct closing_row {
	const char *what;
	struct wfs_close_facts f;
	enum wfs_close_action want;
} closing_rows[] = {
	{"a forked child's close, no data yet", {FLUSH, .writers = 1, MINE}, WFS_CLOSE_KEEP},
	{"numpy's sizing byte, opener alive: ask", {FLUSH, .opener_known = true, .writers = 1, MINE},
	 WFS_CLOSE_ASK_KILLED},
	{"numpy's sizing byte, opener alive", {FLUSH, .opener_known = true, .writers = 1, MINE, KILLED(0)},
	 WFS_CLOSE_KEEP},
	{"opener killed before its first write: ask for a forked child", {FLUSH, .opener_known = true,
	 .writers = 1, MINE, KILLED(9)}, WFS_CLOSE_ASK_FORKED},
	{"opener killed before its first write", {FLUSH, .opener_known = true, .writers = 1, MINE, KILLED(9),
	 FORKED(false)}, WFS_CLOSE_ABANDON_UNLINK},
	{"opener killed before data, its forked child holds the file", {FLUSH, .opener_known = true,
	 .writers = 1, MINE, KILLED(9), FORKED(true)}, WFS_CLOSE_KEEP},
	{"the writer's close: ask for the size", {FLUSH, .ends = true, .writers = 1, MINE, KILLED(0)},
	 WFS_CLOSE_ASK_FITS},
	{"the writer's close, size fits", {FLUSH, .ends = true, .writers = 1, MINE, KILLED(0), FITS(true)},
	 WFS_CLOSE_SEAL},
	{"the writer's close, size refused", {FLUSH, .ends = true, .writers = 1, MINE, KILLED(0), FITS(false)},
	 WFS_CLOSE_REFUSE},
	{"first of two writers closes", {FLUSH, .ends = true, .writers = 2, MINE, KILLED(0)},
	 WFS_CLOSE_LEAVE_FINISHED},
	{"a killed writer beside one still writing", {FLUSH, .ends = true, .writers = 2, MINE, KILLED(9)},
	 WFS_CLOSE_LEAVE},
	{"killed last writer after another finished", {FLUSH, .ends = true, .writers = 1, MINE, .finished = true,
	 KILLED(9), FITS(true)}, WFS_CLOSE_SEAL},
	{"killed sole writer: ask for a forked child", {FLUSH, .ends = true, .writers = 1, MINE, KILLED(15)},
	 WFS_CLOSE_ASK_FORKED},
	{"killed sole writer", {FLUSH, .ends = true, .writers = 1, MINE, KILLED(15), FORKED(false)},
	 WFS_CLOSE_ABANDON_UNLINK},
	{"killed writer whose forked child writes on", {FLUSH, .ends = true, .writers = 1, MINE, KILLED(9),
	 FORKED(true)}, WFS_CLOSE_KEEP},
	{"a writer whose version a seal holds", {FLUSH, .ends = true, .writers = 1, MINE, .sealing = true,
	 KILLED(0), FITS(true)}, WFS_CLOSE_LEAVE_FINISHED},
	{"a writer whose version was replaced", {FLUSH, .ends = true, .writers = 1, KILLED(0)}, WFS_CLOSE_LEAVE},
	{"passthrough close before the end", {FLUSH, PT, .opener_known = true, .writers = 1, MINE},
	 WFS_CLOSE_ASK_KILLED},
	{"passthrough close before data", {FLUSH, PT, .opener_known = true, .writers = 1, MINE, KILLED(0)},
	 WFS_CLOSE_KEEP},
	{"passthrough opener killed before data", {FLUSH, PT, .opener_known = true, .writers = 1, MINE,
	 KILLED(9), FORKED(false)}, WFS_CLOSE_DOOM},
	{"passthrough tensor closed, fits", {FLUSH, PT, .ends = true, .writers = 1, MINE, KILLED(0), FITS(true)},
	 WFS_CLOSE_FINISH},
	{"passthrough tensor closed short", {FLUSH, PT, .ends = true, .writers = 1, MINE, KILLED(0), FITS(false)},
	 WFS_CLOSE_REFUSE},
	{"killed declared tensor writer: ask for a forked child", {FLUSH, PT, .ends = true, .writers = 1, MINE,
	 KILLED(9)}, WFS_CLOSE_ASK_FORKED},
	{"killed declared tensor writer", {FLUSH, PT, .ends = true, .writers = 1, MINE, KILLED(9),
	 FORKED(false)}, WFS_CLOSE_DOOM},
	{"killed passthrough writer whose forked child writes on", {FLUSH, PT, .ends = true, .writers = 1,
	 MINE, KILLED(9), FORKED(true)}, WFS_CLOSE_KEEP},
	{"killed tensor writer beside a finished one", {FLUSH, PT, .ends = true, .writers = 1, MINE,
	 .finished = true, KILLED(9)}, WFS_CLOSE_KEEP},
	{"killed tensor writer beside another", {FLUSH, PT, .ends = true, .writers = 2, MINE, KILLED(9)},
	 WFS_CLOSE_KEEP},
	{"release: ask who wrote last", {RELEASE, .writers = 1, MINE}, WFS_CLOSE_ASK_KILLED},
	{"release of one of two writers", {RELEASE, .writers = 2, MINE, KILLED(0)}, WFS_CLOSE_LEAVE},
	{"release with the refused size", {RELEASE, .writers = 1, MINE, .refused = true, KILLED(0)},
	 WFS_CLOSE_ABANDON},
	{"release of a killed writer", {RELEASE, .writers = 1, MINE, KILLED(9)}, WFS_CLOSE_ABANDON_UNLINK},
	{"release of a killed writer after a finished one", {RELEASE, .writers = 1, MINE, .finished = true,
	 KILLED(9)}, WFS_CLOSE_SEAL},
	{"release of a mapping's writer", {RELEASE, .writers = 1, MINE, KILLED(0)}, WFS_CLOSE_SEAL},
	{"release of a passthrough tensor", {RELEASE, PT, .writers = 1, MINE, .finished = true, KILLED(0)},
	 WFS_CLOSE_SEAL},
	{"release while a seal holds the version", {RELEASE, .writers = 1, MINE, .sealing = true, KILLED(0)},
	 WFS_CLOSE_LEAVE},
};

START_TEST(closing_table)
{
	const struct closing_row *r = &closing_rows[_i];
	enum wfs_close_action got = wfs_closing_decide(&r->f);

	ck_assert_msg(got == r->want, "%s: %s, want %s", r->what, wfs_closing_action_name(got),
		      wfs_closing_action_name(r->want));
}
END_TEST

/* A seal takes its version before it drops fs->lock: writes and new writers wait from then on. */
START_TEST(version_seal_begin_stops_writes)
{
	int err;
	struct wfs_version *v = wfs_version_new(fs.store, &err);

	ck_assert_ptr_nonnull(v);
	ck_assert_int_eq(wfs_version_write(v, "ab", 2, 0), 2);
	ck_assert(!wfs_version_frozen(v));
	ck_assert(wfs_version_seal_begin(v));
	ck_assert(wfs_version_frozen(v));
	ck_assert(!wfs_version_seal_begin(v)); /* a second seal is refused */
	ck_assert_int_eq(wfs_version_write(v, "c", 1, 2), -EAGAIN);
	ck_assert_int_eq(wfs_version_truncate(v, 0), -EAGAIN);
	ck_assert_uint_eq(wfs_version_size(v), 2);
	wfs_version_discard(v);
	wfs_version_put(v);
}
END_TEST

static void *seal_begin_thread(void *arg)
{
	return wfs_version_seal_begin(arg) ? arg : NULL;
}

/*
 * A seal begins under fs->lock only, without the version lock, beside a write or truncate that a
 * passthrough open makes outside fs->lock (wfs_version_kernel_backing()): the truncate either goes
 * through before the seal or finds it (-EAGAIN), and reads @sealing on its own. A stopped() that let
 * GCC fold its flag tests into one 4-byte load read it non-atomically: make tsan reported it (CI).
 */
START_TEST(version_seal_begin_beside_truncate)
{
	int err;
	struct wfs_version *v = wfs_version_new(fs.store, &err);
	pthread_t t;
	void *began;
	int ret;

	ck_assert_ptr_nonnull(v);
	ck_assert_int_eq(wfs_version_write(v, "abcd", 4, 0), 4);
	ck_assert_int_eq(pthread_create(&t, NULL, seal_begin_thread, v), 0);
	ret = wfs_version_truncate(v, 2);
	ck_assert_int_eq(pthread_join(t, &began), 0);
	ck_assert_ptr_eq(began, v);
	ck_assert_msg(ret == 0 || ret == -EAGAIN, "truncate beside a seal's begin: %d", ret);
	ck_assert_uint_eq(wfs_version_size(v), ret == 0 ? 2 : 4);
	ck_assert_int_eq(wfs_version_truncate(v, 1), -EAGAIN); /* the seal holds it now */
	wfs_version_discard(v);
	wfs_version_put(v);
}
END_TEST

/* POSIX request of @owner through handle @fh: @type on [@start, @end]. */
static struct wfs_filelock_req fl_posix(uint64_t owner, uint64_t fh, short type, off_t start, off_t end)
{
	return (struct wfs_filelock_req){.owner = owner, .fh = fh, .pid = (pid_t)owner, .type = type,
					 .start = start, .end = end};
}

/*
 * The lock table's rules (filelock.h): a moved inode shares its identity (chains too); POSIX ranges
 * split and merge per owner, conflicts only with other owners; flock and POSIX apart; a blocked
 * request is granted by the unlock that frees it, in order, or cancelled; FLUSH and RELEASE drops.
 */
START_TEST(filelock_rules)
{
	struct wfs_filelocks t;
	struct wfs_filelock_req rq, held;
	struct wfs_filelock_wait *granted = NULL, *left, w1 = {0}, w2 = {0};

	ck_assert_int_eq(wfs_filelocks_init(&t), 0);
	ck_assert_int_eq(wfs_filelock_moved(&t, 10, 11), 0);
	ck_assert_int_eq(wfs_filelock_moved(&t, 11, 12), 0);
	ck_assert_uint_eq(wfs_filelock_identity(&t, 12), 10);
	ck_assert(!wfs_filelock_flush_wanted(&t, 12));

	/* Owner 1 reads [0, 99] through inode 10; owner 2 asks through inode 12 (two moves on). */
	rq = fl_posix(1, 100, F_RDLCK, 0, 99);
	ck_assert_int_eq(wfs_filelock_set(&t, 10, &rq, NULL, &granted), 0);
	ck_assert(wfs_filelock_flush_wanted(&t, 12));
	rq = fl_posix(2, 200, F_WRLCK, 50, 60);
	ck_assert_int_eq(wfs_filelock_set(&t, 12, &rq, NULL, &granted), -EAGAIN);
	ck_assert_int_eq(wfs_filelock_test(&t, 12, &rq, &held), 1);
	ck_assert_int_eq(held.type, F_RDLCK);
	ck_assert_int_eq(held.start, 0);
	ck_assert_int_eq(held.end, 99);
	ck_assert_int_eq(held.pid, 1);
	rq = fl_posix(2, 200, F_RDLCK, 50, 60); /* readers share */
	ck_assert_int_eq(wfs_filelock_set(&t, 12, &rq, NULL, &granted), 0);
	rq = fl_posix(2, 200, F_UNLCK, 0, WFS_FILELOCK_EOF);
	ck_assert_int_eq(wfs_filelock_set(&t, 12, &rq, NULL, &granted), 0);
	rq = fl_posix(2, 200, F_WRLCK, 100, WFS_FILELOCK_EOF); /* past owner 1's range */
	ck_assert_int_eq(wfs_filelock_set(&t, 12, &rq, NULL, &granted), 0);
	ck_assert_int_eq(wfs_filelock_set(&t, 99, &rq, NULL, &granted), 0); /* another file */

	/* Owner 1 unlocks the middle: [0, 39] and [61, 99] stay; re-locking it merges them back. */
	rq = fl_posix(1, 100, F_UNLCK, 40, 60);
	ck_assert_int_eq(wfs_filelock_set(&t, 10, &rq, NULL, &granted), 0);
	rq = fl_posix(3, 300, F_WRLCK, 40, 60);
	ck_assert_int_eq(wfs_filelock_test(&t, 10, &rq, &held), 0);
	rq = fl_posix(3, 300, F_WRLCK, 0, 0);
	ck_assert_int_eq(wfs_filelock_test(&t, 10, &rq, &held), 1);
	ck_assert_int_eq(held.end, 39);
	rq = fl_posix(1, 100, F_RDLCK, 40, 60);
	ck_assert_int_eq(wfs_filelock_set(&t, 10, &rq, NULL, &granted), 0);
	rq = fl_posix(3, 300, F_WRLCK, 0, 0);
	ck_assert_int_eq(wfs_filelock_test(&t, 10, &rq, &held), 1);
	ck_assert_int_eq(held.start, 0);
	ck_assert_int_eq(held.end, 99);

	/* flock beside POSIX: apart. Owner 5's LOCK_EX waits for owner 4's LOCK_SH; then owner 6's. */
	rq = (struct wfs_filelock_req){.owner = 4, .fh = 400, .type = F_RDLCK, .flock = true};
	ck_assert_int_eq(wfs_filelock_set(&t, 11, &rq, NULL, &granted), 0);
	w1.rq = (struct wfs_filelock_req){.owner = 5, .fh = 500, .type = F_WRLCK, .flock = true};
	ck_assert_int_eq(wfs_filelock_set(&t, 12, &w1.rq, NULL, &granted), -EAGAIN);
	ck_assert_int_eq(wfs_filelock_set(&t, 12, &w1.rq, &w1, &granted), WFS_FILELOCK_QUEUED);
	w2.rq = (struct wfs_filelock_req){.owner = 6, .fh = 600, .type = F_WRLCK, .flock = true};
	ck_assert_int_eq(wfs_filelock_set(&t, 12, &w2.rq, &w2, &granted), WFS_FILELOCK_QUEUED);
	ck_assert_ptr_null(granted);
	wfs_filelock_drop_handle(&t, 10, 400, &granted); /* owner 4's release */
	ck_assert_ptr_eq(granted, &w1);
	ck_assert_ptr_null(w1.next);
	granted = NULL;
	ck_assert(wfs_filelock_cancel(&t, &w2)); /* an interrupt */
	ck_assert(!wfs_filelock_cancel(&t, &w2));
	ck_assert(!wfs_filelock_cancel(&t, &w1)); /* granted already: not the interrupt's */
	wfs_filelock_drop_owner(&t, 10, 5, true, &granted);
	ck_assert_ptr_null(granted);

	/* A wait cancelled before it is queued is refused, not queued. */
	memset(&w2, 0, sizeof(w2));
	w2.rq = fl_posix(7, 700, F_WRLCK, 0, 0);
	ck_assert(!wfs_filelock_cancel(&t, &w2));
	ck_assert_int_eq(wfs_filelock_set(&t, 10, &w2.rq, &w2, &granted), -EINTR);

	/* FLUSH of owner 1 drops its POSIX locks: owner 7's write lock fits now. */
	w2 = (struct wfs_filelock_wait){.rq = fl_posix(7, 700, F_WRLCK, 0, 0)};
	ck_assert_int_eq(wfs_filelock_set(&t, 10, &w2.rq, &w2, &granted), WFS_FILELOCK_QUEUED);
	wfs_filelock_drop_owner(&t, 11, 1, false, &granted);
	ck_assert_ptr_eq(granted, &w2);
	granted = NULL;
	rq = fl_posix(8, 800, F_RDLCK, 0, 0);
	ck_assert_int_eq(wfs_filelock_test(&t, 10, &rq, &held), 1);
	ck_assert_int_eq(held.pid, 7);
	rq.type = 9;
	ck_assert_int_eq(wfs_filelock_set(&t, 10, &rq, NULL, &granted), -EINVAL);
	rq = fl_posix(8, 800, F_RDLCK, 10, 5);
	ck_assert_int_eq(wfs_filelock_set(&t, 10, &rq, NULL, &granted), -EINVAL);
	wfs_filelocks_release(&t, &left);
	ck_assert_ptr_null(left);
}
END_TEST

static Suite *core_suite(void)
{
	Suite *s = suite_create("core");
	TCase *tc;

	tc = tcase_create("map");
	tcase_add_test(tc, map_pop_empties_once);
	tcase_add_test(tc, lock_records_long_holds);
	tcase_add_test(tc, lock_lent_lets_light_holds_in);
	tcase_add_test(tc, filelock_rules);
	suite_add_tcase(s, tc);

	tc = tcase_create("version");
	tcase_add_checked_fixture(tc, core_setup, core_teardown);
	tcase_add_test(tc, version_in_order_spills);
	tcase_add_test(tc, keep_adopts_what_a_server_left);
	tcase_add_test(tc, version_out_of_order_and_truncate);
	tcase_add_test(tc, version_fallocate_modes);
	tcase_add_test(tc, version_claim_freeze_thaw);
	tcase_add_test(tc, version_seal_begin_stops_writes);
	tcase_add_test(tc, version_seal_begin_beside_truncate);
	suite_add_tcase(s, tc);

	tc = tcase_create("closing");
	tcase_add_loop_test(tc, closing_table, 0, (int)(sizeof(closing_rows) / sizeof(closing_rows[0])));
	suite_add_tcase(s, tc);

	tc = tcase_create("seal");
	tcase_add_checked_fixture(tc, core_setup, core_teardown);
	tcase_add_test(tc, seal_publishes_then_dedups);
	tcase_add_test(tc, seal_rewrite_copies_base);
	tcase_add_test(tc, seal_copy_leaves_fs_lock);
	tcase_add_test(tc, seal_holds_size_to_dtype_shape);
	tcase_add_test(tc, seal_last_writer_seals);
	tcase_add_test(tc, seal_failed_new_name_removed);
	suite_add_tcase(s, tc);

	tc = tcase_create("claim");
	tcase_add_checked_fixture(tc, core_setup, core_teardown);
	tcase_add_test(tc, claim_cases);
	suite_add_tcase(s, tc);

	tc = tcase_create("openmode");
	tcase_add_checked_fixture(tc, core_setup, core_teardown);
	tcase_add_test(tc, openmode_passthrough_shared);
	tcase_add_test(tc, openmode_cached_excludes_passthrough);
	tcase_add_test(tc, openmode_writer_beside_readers);
	tcase_add_test(tc, openmode_adopted_readers);
	tcase_add_test(tc, openmode_unsealed_and_daemon_reads);
	tcase_add_test(tc, openmode_write_flush_seals);
	tcase_add_test(tc, openmode_passthrough_writer);
	tcase_add_test(tc, openmode_passthrough_writer_still_open);
	tcase_add_test(tc, openmode_writer_daemon_served);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tu_main("check_core", core_suite(), TU_RUN_DIR, NULL);
}
