/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Check suite for lib/stage: the ring, the threads and every error path, through a host-memory
 * stager (no GPU needed), plus the NUMA lookup against a fake sysfs.
 *
 * GPU tests (a device stager moving real bytes to and from an H200) form a separate suite that runs
 * only when WFS_TEST_GPU=1; then a missing GPU is a failure, not a skip. Without it the runner prints
 * one line saying the GPU suite was not run, so a skipped GPU test is never counted as passed.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <numa.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "digest.h"
#include "stage.h"
#include "testutil.h"

#ifdef WFS_HAVE_CUDA
#include "cudart.h"
#endif

#define KIB 1024u
#define BUF_BYTES (64u * KIB)
#define NBUF 4u

static char tmpdir[256];

static void setup_tmp(void)
{
	tu_mkdtemp(tmpdir, sizeof(tmpdir), "check_stage");
}

static void teardown_tmp(void)
{
	tu_rmtree(tmpdir);
}

static void tpath(char *out, size_t len, const char *name)
{
	snprintf(out, len, "%s/%s", tmpdir, name);
}

static unsigned char *write_file(const char *name, size_t n, uint64_t seed)
{
	char p[512];
	unsigned char *data = malloc(n ? n : 1);
	FILE *f;

	ck_assert_ptr_nonnull(data);
	tu_fill(data, n, seed);
	tpath(p, sizeof(p), name);
	f = fopen(p, "we");
	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fwrite(data, 1, n, f), n);
	ck_assert_int_eq(fclose(f), 0);
	return data;
}

static unsigned char *read_file(const char *path, size_t *n)
{
	struct stat sb;
	unsigned char *data;
	int fd = open(path, O_RDONLY);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fstat(fd, &sb), 0);
	*n = (size_t)sb.st_size;
	data = malloc(*n ? *n : 1);
	ck_assert_ptr_nonnull(data);
	ck_assert_int_eq(pread(fd, data, *n, 0), (ssize_t)*n);
	close(fd);
	return data;
}

static struct wfs_stager *host_stager(unsigned buffers, size_t bytes, unsigned threads)
{
	struct wfs_stage_opts o;
	struct wfs_stager *st = NULL;
	char err[WFS_STAGE_MSG_MAX];

	wfs_stage_opts_init(&o);
	o.mem = WFS_STAGE_MEM_HOST;
	o.buffers = buffers;
	o.buffer_bytes = bytes;
	o.threads = threads;
	ck_assert_msg(wfs_stage_new(&o, &st, err, sizeof(err)) == 0, "%s", err);
	return st;
}

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	ck_assert_ptr_nonnull(d);
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

/* ---- round trips through a host destination ------------------------------------------------- */

static const size_t rt_sizes[] = {
	0, 1, 4095, BUF_BYTES - 1, BUF_BYTES, BUF_BYTES + 1, 3 * BUF_BYTES + 12345, /* not a multiple */
	NBUF * BUF_BYTES,                                                          /* exactly the ring */
	37 * BUF_BYTES + 7,                                                        /* many buffers */
};

START_TEST(test_load_roundtrip)
{
	size_t n = rt_sizes[_i];
	struct wfs_stager *st = host_stager(NBUF, BUF_BYTES, 3);
	unsigned char *want = write_file("w.bin", n, n + 1);
	unsigned char *got = malloc(n + 64);
	char p[512], err[WFS_STAGE_MSG_MAX];
	struct wfs_stage_stats s;

	ck_assert_ptr_nonnull(got);
	/* Guard bytes after the destination: a chunk copied too long would show here. */
	memset(got, 0xa5, n + 64);
	tpath(p, sizeof(p), "w.bin");
	ck_assert_msg(wfs_stage_load(st, p, 0, n, got, WFS_STAGE_EXACT, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(memcmp(got, want, n), 0);
	for (size_t i = 0; i < 64; i++)
		ck_assert_uint_eq(got[n + i], 0xa5);
	wfs_stage_stats(st, &s);
	ck_assert_uint_eq(s.bytes_loaded, n);
	ck_assert_uint_le(s.buffers_in_use_peak, NBUF);
	wfs_stage_free(st);
	free(got);
	free(want);
}
END_TEST

START_TEST(test_load_range)
{
	size_t n = 5 * BUF_BYTES + 999, off = BUF_BYTES / 2 + 3, len = 2 * BUF_BYTES + 17;
	struct wfs_stager *st = host_stager(2, BUF_BYTES, 2);
	unsigned char *want = write_file("r.bin", n, 42);
	unsigned char *got = calloc(1, len);
	char p[512], err[WFS_STAGE_MSG_MAX];

	tpath(p, sizeof(p), "r.bin");
	ck_assert_msg(wfs_stage_load(st, p, off, len, got, 0, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(memcmp(got, want + off, len), 0);
	/* The same range with EXACT is a size mismatch: the file goes on past the range. */
	ck_assert_int_eq(wfs_stage_load(st, p, off, len, got, WFS_STAGE_EXACT, err, sizeof(err)), WFS_STAGE_ESIZE);
	/* A range up to the very end is fine with EXACT. */
	ck_assert_int_eq(wfs_stage_load(st, p, n - 10, 10, got, WFS_STAGE_EXACT, err, sizeof(err)), 0);
	ck_assert_int_eq(memcmp(got, want + n - 10, 10), 0);
	wfs_stage_free(st);
	free(got);
	free(want);
}
END_TEST

/* ---- batches and per-item errors -------------------------------------------------------------- */

START_TEST(test_batch_errors)
{
	struct wfs_stager *st = host_stager(NBUF, BUF_BYTES, 4);
	unsigned char *a = write_file("a.bin", 3 * BUF_BYTES + 5, 1);
	unsigned char *s = write_file("short.bin", 1000, 2);
	unsigned char *m = write_file("big.bin", 5000, 3);
	unsigned char *z = write_file("b.bin", 4096, 4);
	unsigned char *ga = malloc(3 * BUF_BYTES + 5), *gs = malloc(4096), *gm = malloc(4096), *gz = malloc(4096);
	char pa[512], pm[512], ps[512], pb[512], pz[512];
	struct wfs_stage_item items[5];
	struct wfs_stage_batch *b;
	const char *msg;
	int fds = count_fds();

	tpath(pa, sizeof(pa), "a.bin");
	tpath(pm, sizeof(pm), "missing.bin");
	tpath(ps, sizeof(ps), "short.bin");
	tpath(pb, sizeof(pb), "big.bin");
	tpath(pz, sizeof(pz), "b.bin");
	items[0] = (struct wfs_stage_item){ pa, 0, 3 * BUF_BYTES + 5, ga, WFS_STAGE_EXACT, NULL };
	items[1] = (struct wfs_stage_item){ pm, 0, 4096, gs, WFS_STAGE_EXACT, NULL };
	items[2] = (struct wfs_stage_item){ ps, 0, 4096, gs, WFS_STAGE_EXACT, NULL };
	items[3] = (struct wfs_stage_item){ pb, 0, 4096, gm, WFS_STAGE_EXACT, NULL };
	items[4] = (struct wfs_stage_item){ pz, 0, 4096, gz, WFS_STAGE_EXACT, NULL };
	ck_assert_int_eq(wfs_stage_submit(st, items, 5, &b), 0);
	/* The lowest-numbered failure is reported. */
	ck_assert_int_eq(wfs_stage_wait(b), -ENOENT);

	ck_assert_int_eq(wfs_stage_result(b, 0, &msg), 0);
	ck_assert_str_eq(msg, "");
	ck_assert_int_eq(memcmp(ga, a, 3 * BUF_BYTES + 5), 0);

	ck_assert_int_eq(wfs_stage_result(b, 1, &msg), -ENOENT);
	ck_assert_ptr_nonnull(strstr(msg, "missing.bin: open: No such file or directory"));

	ck_assert_int_eq(wfs_stage_result(b, 2, &msg), WFS_STAGE_ESHORT);
	ck_assert_ptr_nonnull(strstr(msg, "short.bin: short file: 1000 bytes, expected 4096"));

	ck_assert_int_eq(wfs_stage_result(b, 3, &msg), WFS_STAGE_ESIZE);
	ck_assert_ptr_nonnull(strstr(msg, "big.bin: size mismatch: 5000 bytes, expected 4096"));

	ck_assert_int_eq(wfs_stage_result(b, 4, &msg), 0);
	ck_assert_int_eq(memcmp(gz, z, 4096), 0);
	ck_assert_int_eq(wfs_stage_result(b, 5, &msg), -EINVAL);
	wfs_stage_batch_free(b);
	/* Every descriptor the batch opened is closed again, the failed ones too. */
	ck_assert_int_eq(count_fds(), fds);

	/* A directory is not a file. */
	ck_assert_int_eq(wfs_stage_load(st, tmpdir, 0, 0, gz, 0, NULL, 0), -EISDIR);
	wfs_stage_free(st);
	free(a); free(s); free(m); free(z); free(ga); free(gs); free(gm); free(gz);
}
END_TEST

START_TEST(test_submit_invalid)
{
	struct wfs_stager *st = host_stager(2, BUF_BYTES, 1);
	struct wfs_stage_batch *b = NULL;
	char buf[16];
	struct wfs_stage_item bad[] = {
		{ NULL, 0, 1, buf, 0, NULL },
		{ "x", 0, 1, NULL, 0, NULL },
		{ "x", 1, 1, buf, WFS_STAGE_OFFLOAD, NULL },
		{ "x", 0, 1, buf, WFS_STAGE_OFFLOAD | WFS_STAGE_EXACT, NULL },
		{ "x", 0, 1, buf, WFS_STAGE_FSYNC, NULL },
		{ "x", 0, 1, buf, 0, "0123456789abcdef0123456789abcdef" },  /* a digest on a backload */
		{ "x", 0, 1, buf, WFS_STAGE_OFFLOAD, "0123456789abcdef" },  /* not 32 hex digits */
		{ "x", 0, 1, buf, WFS_STAGE_OFFLOAD, "0123456789abcdef0123456789abcdeg" },
	};
	struct wfs_stage_item ovf = { "x", UINT64_MAX - 1, 4, buf, 0, NULL };
	struct wfs_stage_opts o;
	struct wfs_stager *st2 = NULL;
	char err[WFS_STAGE_MSG_MAX];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_int_eq(wfs_stage_submit(st, &bad[i], 1, &b), -EINVAL);
	ck_assert_int_eq(wfs_stage_submit(st, &ovf, 1, &b), -EOVERFLOW);
	/* An empty batch is finished at once. */
	ck_assert_int_eq(wfs_stage_submit(st, NULL, 0, &b), 0);
	ck_assert_int_eq(wfs_stage_wait(b), 0);
	wfs_stage_batch_free(b);
	wfs_stage_free(st);

	wfs_stage_opts_init(&o);
	o.mem = WFS_STAGE_MEM_HOST;
	o.buffer_bytes = 4096 + 1; /* not page-aligned */
	ck_assert_int_eq(wfs_stage_new(&o, &st2, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_null(st2);
	ck_assert_ptr_nonnull(strstr(err, "invalid options"));
	o.buffer_bytes = 4096;
	o.buffers = 0;
	ck_assert_int_eq(wfs_stage_new(&o, &st2, err, sizeof(err)), -EINVAL);
	o.buffers = 1;
	o.numa_node = 100000;
	ck_assert_int_eq(wfs_stage_new(&o, &st2, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "NUMA node 100000 does not exist"));
}
END_TEST

/*
 * An offload item whose path another item of the batch gives is refused, nothing queued: two
 * workers wrote one file at once (weightfsctl stage --offload of rank0/w and rank1/w, a user trial:
 * one file of mixed bytes, both items successful). Two reads of one file stay allowed.
 */
START_TEST(test_submit_shared_path)
{
	struct wfs_stager *st = host_stager(NBUF, BUF_BYTES, 2);
	size_t n = 3 * BUF_BYTES + 5, got = 0;
	unsigned char *a = malloc(n), *c = malloc(n), *src = write_file("src", n, 11), *back;
	struct wfs_stage_batch *b = NULL;
	char out[512], in[512], other[512];

	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(c);
	tu_fill(a, n, 12);
	tpath(out, sizeof(out), "out");
	tpath(in, sizeof(in), "src");
	tpath(other, sizeof(other), "other");
	{
		struct wfs_stage_item two_writers[] = {
			{ out, 0, n, a, WFS_STAGE_OFFLOAD, NULL },
			{ other, 0, n, a, WFS_STAGE_OFFLOAD, NULL },
			{ out, 0, 5, c, WFS_STAGE_OFFLOAD, NULL },
		};
		struct wfs_stage_item writer_reader[] = {
			{ in, 0, n, c, 0, NULL },
			{ in, 0, n, a, WFS_STAGE_OFFLOAD, NULL },
		};
		struct wfs_stage_item two_readers[] = {
			{ in, 0, n, a, WFS_STAGE_EXACT, NULL },
			{ in, 0, n, c, 0, NULL },
			{ out, 0, n, src, WFS_STAGE_OFFLOAD | WFS_STAGE_FSYNC, NULL },
		};

		ck_assert_int_eq(wfs_stage_submit(st, two_writers, 3, &b), -EINVAL);
		ck_assert_int_eq(wfs_stage_submit(st, writer_reader, 2, &b), -EINVAL);
		ck_assert_int_eq(access(out, F_OK), -1);
		ck_assert_int_eq(access(other, F_OK), -1);
		back = read_file(in, &got);
		ck_assert_uint_eq(got, n);
		ck_assert_mem_eq(back, src, n);
		free(back);

		ck_assert_int_eq(wfs_stage_submit(st, two_readers, 3, &b), 0);
		ck_assert_int_eq(wfs_stage_wait(b), 0);
		wfs_stage_batch_free(b);
	}
	ck_assert_mem_eq(a, src, n);
	ck_assert_mem_eq(c, src, n);
	back = read_file(out, &got);
	ck_assert_uint_eq(got, n);
	ck_assert_mem_eq(back, src, n);
	free(back);
	wfs_stage_free(st);
	free(a);
	free(c);
	free(src);
}
END_TEST

/* Two batches from two threads, waited for out of order. */
struct conc_arg {
	struct wfs_stager *st;
	int seed;
};

static void *conc_thread(void *arg)
{
	struct conc_arg *a = arg;
	char name[32], p[512];
	size_t n = 7 * BUF_BYTES + (size_t)a->seed;
	unsigned char *got = malloc(n), *want = malloc(n);
	intptr_t ok;

	snprintf(name, sizeof(name), "c%d.bin", a->seed);
	tpath(p, sizeof(p), name);
	tu_fill(want, n, (uint64_t)a->seed);
	ok = wfs_stage_load(a->st, p, 0, n, got, WFS_STAGE_EXACT, NULL, 0) == 0 && !memcmp(got, want, n);
	free(got);
	free(want);
	return (void *)ok;
}

START_TEST(test_concurrent_batches)
{
	struct wfs_stager *st = host_stager(3, BUF_BYTES, 2);
	pthread_t t[4];
	struct conc_arg a[4];
	void *ok;

	for (int i = 0; i < 4; i++) {
		char name[32];

		snprintf(name, sizeof(name), "c%d.bin", i);
		free(write_file(name, 7 * BUF_BYTES + (size_t)i, (uint64_t)i));
		a[i] = (struct conc_arg){ st, i };
		ck_assert_int_eq(pthread_create(&t[i], NULL, conc_thread, &a[i]), 0);
	}
	for (int i = 3; i >= 0; i--) {
		ck_assert_int_eq(pthread_join(t[i], &ok), 0);
		ck_assert_msg(ok, "thread %d got wrong bytes", i);
	}
	wfs_stage_free(st);
}
END_TEST

/* ---- offload through a host source ------------------------------------------------------------ */

START_TEST(test_offload_roundtrip)
{
	size_t n = rt_sizes[_i];
	struct wfs_stager *st = host_stager(NBUF, BUF_BYTES, 3);
	unsigned char *src = malloc(n ? n : 1), *got;
	char p[512], err[WFS_STAGE_MSG_MAX], hex[WFS_DIGEST_HEX_CHARS + 1], xv[64];
	struct wfs_digest d;
	ssize_t xn;
	size_t gn;
	struct wfs_stage_stats s;

	tu_fill(src, n, n * 3 + 7);
	tpath(p, sizeof(p), "off.bin");
	/* An old, longer file under the name must be replaced, not overwritten in place. */
	free(write_file("off.bin", n + 5000, 9));
	/* Odd sizes also declare the digest: set on the file before its close (on a plain filesystem
	 * with user xattrs it is stored as it is; on weightfs it is the seal's). */
	wfs_digest_buf(src, n, &d);
	wfs_digest_to_hex(&d, hex);
	ck_assert_msg(wfs_stage_offload(st, src, n, p, n % 2 ? WFS_STAGE_FSYNC : 0, n % 2 ? hex : NULL, err,
					sizeof(err)) == 0, "%s", err);
	got = read_file(p, &gn);
	ck_assert_uint_eq(gn, n);
	ck_assert_int_eq(memcmp(got, src, n), 0);
	xn = getxattr(p, "user.weightfs.digest", xv, sizeof(xv));
	if (n % 2 && !(xn < 0 && (errno == ENOTSUP || errno == EOPNOTSUPP)))
		ck_assert(xn == WFS_DIGEST_HEX_CHARS && memcmp(xv, hex, WFS_DIGEST_HEX_CHARS) == 0);
	else if (!(n % 2))
		ck_assert_int_eq(xn, -1);
	wfs_stage_stats(st, &s);
	ck_assert_uint_eq(s.bytes_offloaded, n);
	wfs_stage_free(st);
	free(got);
	free(src);
}
END_TEST

START_TEST(test_offload_errors)
{
	struct wfs_stager *st = host_stager(NBUF, BUF_BYTES, 2);
	unsigned char src[100] = { 0 };
	char p[512], err[WFS_STAGE_MSG_MAX];

	tpath(p, sizeof(p), "no/such/dir/x.bin");
	ck_assert_int_eq(wfs_stage_offload(st, src, sizeof(src), p, 0, NULL, err, sizeof(err)), -ENOENT);
	ck_assert_ptr_nonnull(strstr(err, "x.bin: create: No such file or directory"));
	/* A device node takes the bytes but is never unlinked, not even on failure. */
	if (access("/dev/full", W_OK) == 0) {
		struct stat sb;

		ck_assert_int_eq(wfs_stage_offload(st, src, sizeof(src), "/dev/full", 0, NULL, err, sizeof(err)), -ENOSPC);
		ck_assert_ptr_nonnull(strstr(err, "/dev/full: write at byte 0"));
		ck_assert_int_eq(stat("/dev/full", &sb), 0);
		ck_assert(S_ISCHR(sb.st_mode));
	}
	wfs_stage_free(st);
}
END_TEST

/* ---- fault injection ---------------------------------------------------------------------------- */

struct fault_plan {
	const char *name; /* fail I/O on paths ending in this */
	uint64_t at;      /* at this file offset */
	int err;
	enum wfs_stage_io op;
};

static int fault_hook(void *arg, const char *path, enum wfs_stage_io op, uint64_t offset)
{
	const struct fault_plan *f = arg;
	size_t pl = strlen(path), nl = strlen(f->name);

	if (op == f->op && pl >= nl && !strcmp(path + pl - nl, f->name) && offset == f->at)
		return f->err;
	return 0;
}

START_TEST(test_read_eio)
{
	struct fault_plan plan = { "bad.bin", 2 * BUF_BYTES, -EIO, WFS_STAGE_IO_READ };
	struct wfs_stage_opts o;
	struct wfs_stager *st = NULL;
	size_t n = 6 * BUF_BYTES + 1;
	unsigned char *good = write_file("good.bin", n, 5), *bad = write_file("bad.bin", n, 6);
	unsigned char *g1 = malloc(n), *g2 = malloc(n);
	char pg[512], pb[512], want[600];
	struct wfs_stage_item items[2];
	struct wfs_stage_batch *b;
	const char *msg;
	int fds = count_fds();

	wfs_stage_opts_init(&o);
	o.mem = WFS_STAGE_MEM_HOST;
	o.buffers = NBUF;
	o.buffer_bytes = BUF_BYTES;
	o.threads = 3;
	o.io_fault = fault_hook;
	o.io_fault_arg = &plan;
	ck_assert_int_eq(wfs_stage_new(&o, &st, NULL, 0), 0);
	tpath(pg, sizeof(pg), "good.bin");
	tpath(pb, sizeof(pb), "bad.bin");
	items[0] = (struct wfs_stage_item){ pb, 0, n, g1, WFS_STAGE_EXACT, NULL };
	items[1] = (struct wfs_stage_item){ pg, 0, n, g2, WFS_STAGE_EXACT, NULL };
	ck_assert_int_eq(wfs_stage_submit(st, items, 2, &b), 0);
	ck_assert_int_eq(wfs_stage_wait(b), -EIO);
	ck_assert_int_eq(wfs_stage_result(b, 0, &msg), -EIO);
	snprintf(want, sizeof(want), "%s: read at byte %u: Input/output error", pb, 2 * BUF_BYTES);
	ck_assert_str_eq(msg, want);
	/* The failure stays with its item: the next file still arrives whole. */
	ck_assert_int_eq(wfs_stage_result(b, 1, &msg), 0);
	ck_assert_int_eq(memcmp(g2, good, n), 0);
	wfs_stage_batch_free(b);
	ck_assert_int_eq(count_fds(), fds);

	/* A write fault during offload fails the item and leaves no partial file behind. */
	plan = (struct fault_plan){ "out.bin", BUF_BYTES, -EIO, WFS_STAGE_IO_WRITE };
	tpath(pb, sizeof(pb), "out.bin");
	ck_assert_int_eq(wfs_stage_offload(st, good, n, pb, 0, NULL, want, sizeof(want)), -EIO);
	ck_assert_ptr_nonnull(strstr(want, "out.bin: write at byte 65536: Input/output error"));
	ck_assert_int_eq(access(pb, F_OK), -1);
	/* A close(2) error (how weightfs reports a failed seal) fails the offload the same way. */
	plan = (struct fault_plan){ "out.bin", 0, -ENOSPC, WFS_STAGE_IO_CLOSE };
	ck_assert_int_eq(wfs_stage_offload(st, good, n, pb, WFS_STAGE_FSYNC, NULL, want, sizeof(want)), -ENOSPC);
	ck_assert_ptr_nonnull(strstr(want, "out.bin: close: No space left on device"));
	ck_assert_int_eq(access(pb, F_OK), -1);
	ck_assert_int_eq(count_fds(), fds);
	wfs_stage_free(st);
	free(good); free(bad); free(g1); free(g2);
}
END_TEST

/* ---- bounded memory ------------------------------------------------------------------------------ */

START_TEST(test_ring_bound)
{
	/* 1000 small files and one file 50× the ring: the ring is all the memory, always. */
	struct wfs_stager *st = host_stager(3, 16 * KIB, 4);
	size_t big = 50 * 3 * 16 * KIB + 77, nsmall = 1000;
	unsigned char *want = write_file("big.bin", big, 11), *got = malloc(big);
	unsigned char *small = malloc(nsmall * 100);
	struct wfs_stage_item *items = calloc(nsmall, sizeof(*items));
	char (*paths)[512] = calloc(nsmall, 512);
	struct wfs_stage_batch *b;
	struct wfs_stage_stats s;
	char p[512];
	int fds = count_fds();

	for (size_t i = 0; i < nsmall; i++) {
		char name[32];
		unsigned char *d;

		snprintf(name, sizeof(name), "s%zu", i);
		d = write_file(name, 100, 1000 + i);
		free(d);
		tpath(paths[i], 512, name);
		items[i] = (struct wfs_stage_item){ paths[i], 0, 100, small + 100 * i, WFS_STAGE_EXACT, NULL };
	}
	ck_assert_int_eq(wfs_stage_submit(st, items, nsmall, &b), 0);
	tpath(p, sizeof(p), "big.bin");
	ck_assert_int_eq(wfs_stage_load(st, p, 0, big, got, WFS_STAGE_EXACT, NULL, 0), 0);
	ck_assert_int_eq(wfs_stage_wait(b), 0);
	wfs_stage_batch_free(b);
	ck_assert_int_eq(memcmp(got, want, big), 0);
	for (size_t i = 0; i < nsmall; i++) {
		unsigned char d[100];

		tu_fill(d, 100, 1000 + i);
		ck_assert_int_eq(memcmp(small + 100 * i, d, 100), 0);
	}
	wfs_stage_stats(st, &s);
	ck_assert_uint_eq(s.ring_bytes, 3 * 16 * KIB);
	ck_assert_uint_eq(s.host_bytes_peak, 3 * 16 * KIB);
	ck_assert_uint_le(s.buffers_in_use_peak, 3);
	ck_assert_uint_ge(s.buffers_in_use_peak, 1);
	ck_assert_uint_eq(s.bytes_loaded, big + nsmall * 100);
	ck_assert(!s.pinned);
	ck_assert_int_eq(count_fds(), fds);
	wfs_stage_free(st);
	free(want); free(got); free(small); free(items); free(paths);
}
END_TEST

/* ---- NUMA lookup -------------------------------------------------------------------------------- */

static void fake_numa(const char *bus, const char *content)
{
	char p[512];
	FILE *f;

	snprintf(p, sizeof(p), "mkdir -p %s/bus/pci/devices/%s", tmpdir, bus);
	ck_assert_int_eq(system(p), 0);
	snprintf(p, sizeof(p), "%s/bus/pci/devices/%s/numa_node", tmpdir, bus);
	f = fopen(p, "we");
	ck_assert_ptr_nonnull(f);
	fputs(content, f);
	fclose(f);
}

START_TEST(test_numa_lookup)
{
	fake_numa("0000:3b:00.0", "1\n");
	fake_numa("0000:c1:00.0", "-1\n");
	/* CUDA reports upper case, sometimes with an 8-digit domain. */
	ck_assert_int_eq(wfs_stage_numa_node_of_pci(tmpdir, "0000:3B:00.0"), 1);
	ck_assert_int_eq(wfs_stage_numa_node_of_pci(tmpdir, "00000000:3b:00.0"), 1);
	ck_assert_int_eq(wfs_stage_numa_node_of_pci(tmpdir, "0000:C1:00.0"), -1);
	ck_assert_int_eq(wfs_stage_numa_node_of_pci(tmpdir, "0000:99:00.0"), -1);
	ck_assert_int_eq(wfs_stage_numa_node_of_pci(tmpdir, "garbage"), -EINVAL);
	ck_assert_int_eq(wfs_stage_numa_node_of_pci(tmpdir, "0000:3b:00.0x"), -EINVAL);
}
END_TEST

START_TEST(test_numa_env)
{
	struct wfs_stager *st;
	struct wfs_stage_stats s;
	struct wfs_stage_opts o;
	char err[WFS_STAGE_MSG_MAX];

	wfs_stage_opts_init(&o);
	o.mem = WFS_STAGE_MEM_HOST;
	o.buffers = 2;
	o.buffer_bytes = 4096;
	setenv("WFS_STAGE_NUMA_NODE", "0", 1);
	ck_assert_msg(wfs_stage_new(&o, &st, err, sizeof(err)) == 0, "%s", err);
	wfs_stage_stats(st, &s);
	/* Node 0 exists wherever libnuma works; without NUMA support the stager runs unbound. */
	ck_assert_int_eq(s.numa_node, numa_available() < 0 ? -1 : 0);
	wfs_stage_free(st);
	setenv("WFS_STAGE_NUMA_NODE", "none", 1);
	ck_assert_int_eq(wfs_stage_new(&o, &st, err, sizeof(err)), 0);
	wfs_stage_stats(st, &s);
	ck_assert_int_eq(s.numa_node, -1);
	wfs_stage_free(st);
	setenv("WFS_STAGE_NUMA_NODE", "zero", 1);
	ck_assert_int_eq(wfs_stage_new(&o, &st, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "WFS_STAGE_NUMA_NODE=zero"));
	unsetenv("WFS_STAGE_NUMA_NODE");
}
END_TEST

/* ---- device stager without a GPU: a clear error, not a crash ------------------------------------ */

START_TEST(test_device_unavailable)
{
	struct wfs_stager *st = NULL;
	struct wfs_stage_opts o;
	char err[WFS_STAGE_MSG_MAX];
	int r;

	wfs_stage_opts_init(&o);
	o.device = 4096; /* no machine has this one */
	r = wfs_stage_new(&o, &st, err, sizeof(err));
	ck_assert_ptr_null(st);
	if (!wfs_stage_have_cuda()) {
		ck_assert_int_eq(r, WFS_STAGE_ENOCUDA);
		ck_assert_ptr_nonnull(strstr(err, "not built with CUDA"));
		return;
	}
#ifdef WFS_HAVE_CUDA
	const struct wfs_cudart *rt;

	if (wfs_cudart_get(&rt, NULL, 0) < 0) {
		/* Built with CUDA, run where no runtime is installed. */
		ck_assert_int_eq(r, WFS_STAGE_ENOCUDA);
		ck_assert_msg(strstr(err, "cannot load the CUDA runtime"), "%s", err);
		return;
	}
#endif
	ck_assert_int_eq(r, WFS_STAGE_ENODEV);
	ck_assert_msg(strstr(err, "no usable CUDA device") || strstr(err, "does not exist"), "%s", err);
}
END_TEST

#ifdef WFS_HAVE_CUDA
/*
 * No CUDA runtime where the stager looks (WFS_CUDART names a file that does not exist, or a library
 * that is not the runtime): a device stager fails with WFS_STAGE_ENOCUDA and a line naming the file;
 * a host stager still works. The runtime is loaded once per process, and Check runs each test in its
 * own child, so this test's WFS_CUDART is the one the loader sees.
 */
static const char *const missing_cudart[][2] = {
	{ "/nonexistent/libcudart.so.99", "cannot load the CUDA runtime (WFS_CUDART): /nonexistent/libcudart.so.99" },
	{ "libm.so.6", "the CUDA runtime libm.so.6 has no cudaGetErrorString" },
};

START_TEST(test_cudart_missing)
{
	struct wfs_stager *st = NULL;
	struct wfs_stage_opts o;
	char err[WFS_STAGE_MSG_MAX];
	const struct wfs_cudart *rt = NULL;

	ck_assert_int_eq(setenv("WFS_CUDART", missing_cudart[_i][0], 1), 0);
	wfs_stage_opts_init(&o);
	ck_assert_int_eq(wfs_stage_new(&o, &st, err, sizeof(err)), WFS_STAGE_ENOCUDA);
	ck_assert_ptr_null(st);
	ck_assert_msg(strstr(err, "stage: GPU staging is not available: ") == err, "%s", err);
	ck_assert_msg(strstr(err, missing_cudart[_i][1]), "%s", err);
	/* Every later caller gets the same answer; *out is not written. */
	ck_assert_int_eq(wfs_cudart_get(&rt, err, sizeof(err)), -ENOTSUP);
	ck_assert_ptr_null(rt);
	ck_assert_msg(strstr(err, missing_cudart[_i][1]) == err, "%s", err);
	o.mem = WFS_STAGE_MEM_HOST;
	o.threads = 2;
	ck_assert_msg(wfs_stage_new(&o, &st, err, sizeof(err)) == 0, "%s", err);
	wfs_stage_free(st);
}
END_TEST
#endif

/* ---- GPU (WFS_TEST_GPU=1 only) ---------------------------------------------------------------- */

#ifdef WFS_HAVE_CUDA
static const struct wfs_cudart *cudart(void)
{
	const struct wfs_cudart *rt = NULL;
	char err[WFS_STAGE_MSG_MAX];

	ck_assert_msg(wfs_cudart_get(&rt, err, sizeof(err)) == 0, "%s", err);
	return rt;
}

static struct wfs_stager *gpu_stager(unsigned buffers, size_t bytes, unsigned threads)
{
	struct wfs_stage_opts o;
	struct wfs_stager *st = NULL;
	char err[WFS_STAGE_MSG_MAX];

	wfs_stage_opts_init(&o);
	o.buffers = buffers;
	o.buffer_bytes = bytes;
	o.threads = threads;
	ck_assert_msg(wfs_stage_new(&o, &st, err, sizeof(err)) == 0, "%s", err);
	return st;
}

START_TEST(test_gpu_roundtrip)
{
	size_t n = rt_sizes[_i];
	struct wfs_stager *st = gpu_stager(NBUF, BUF_BYTES, 3);
	unsigned char *want = write_file("g.bin", n, n + 99), *got = malloc(n + 1), *back;
	void *dev = NULL;
	char p[512], err[WFS_STAGE_MSG_MAX];
	size_t bn;
	struct wfs_stage_stats s;
	const struct wfs_cudart *rt = cudart();

	ck_assert_int_eq(rt->cudaMalloc(&dev, n + 1), cudaSuccess);
	ck_assert_int_eq(rt->cudaMemset(dev, 0, n + 1), cudaSuccess);
	tpath(p, sizeof(p), "g.bin");
	ck_assert_msg(wfs_stage_load(st, p, 0, n, dev, WFS_STAGE_EXACT, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(rt->cudaMemcpy(got, dev, n + 1, cudaMemcpyDeviceToHost), cudaSuccess);
	ck_assert_int_eq(memcmp(got, want, n), 0);
	ck_assert_uint_eq(got[n], 0);
	/* And back out: device → file → same bytes. */
	tpath(p, sizeof(p), "g.out");
	ck_assert_msg(wfs_stage_offload(st, dev, n, p, WFS_STAGE_FSYNC, NULL, err, sizeof(err)) == 0, "%s", err);
	back = read_file(p, &bn);
	ck_assert_uint_eq(bn, n);
	ck_assert_int_eq(memcmp(back, want, n), 0);
	wfs_stage_stats(st, &s);
	ck_assert(s.pinned);
	ck_assert_uint_eq(s.ring_bytes, NBUF * BUF_BYTES);
	ck_assert_str_ne(s.pci_bus_id, "");
	rt->cudaFree(dev);
	wfs_stage_free(st);
	free(want); free(got); free(back);
}
END_TEST

START_TEST(test_gpu_errors)
{
	struct wfs_stager *st = gpu_stager(NBUF, BUF_BYTES, 2);
	unsigned char *want = write_file("s.bin", 1000, 1);
	void *dev = NULL;
	char p[512], err[WFS_STAGE_MSG_MAX];
	unsigned char host[4096];
	const struct wfs_cudart *rt = cudart();

	ck_assert_int_eq(rt->cudaMalloc(&dev, 4096), cudaSuccess);
	tpath(p, sizeof(p), "s.bin");
	ck_assert_int_eq(wfs_stage_load(st, p, 0, 4096, dev, WFS_STAGE_EXACT, err, sizeof(err)), WFS_STAGE_ESHORT);
	ck_assert_ptr_nonnull(strstr(err, "s.bin: short file: 1000 bytes, expected 4096"));
	/* A pointer that is not device memory: a CUDA error naming the file, not a crash. */
	memset(host, 0, sizeof(host));
	ck_assert_int_eq(wfs_stage_load(st, p, 0, 1000, (void *)0x10, 0, err, sizeof(err)), WFS_STAGE_ECUDA);
	ck_assert_ptr_nonnull(strstr(err, "s.bin: host-to-device copy"));
	/* The stager still works after a failed copy. */
	ck_assert_int_eq(wfs_stage_load(st, p, 0, 1000, dev, WFS_STAGE_EXACT, err, sizeof(err)), 0);
	ck_assert_int_eq(rt->cudaMemcpy(host, dev, 1000, cudaMemcpyDeviceToHost), cudaSuccess);
	ck_assert_int_eq(memcmp(host, want, 1000), 0);
	rt->cudaFree(dev);
	wfs_stage_free(st);
	free(want);
}
END_TEST
#endif

static Suite *stage_suite(void)
{
	Suite *s = suite_create("stage");
	TCase *tc;
	int nsizes = (int)(sizeof(rt_sizes) / sizeof(rt_sizes[0]));

#define ADD(name, fn)                                                                                 \
	tc = tcase_create(name);                                                                      \
	tcase_add_checked_fixture(tc, setup_tmp, teardown_tmp);                                       \
	tcase_add_test(tc, fn);                                                                       \
	suite_add_tcase(s, tc)

	tc = tcase_create("load_roundtrip");
	tcase_add_checked_fixture(tc, setup_tmp, teardown_tmp);
	tcase_add_loop_test(tc, test_load_roundtrip, 0, nsizes);
	suite_add_tcase(s, tc);
	ADD("load_range", test_load_range);
	ADD("batch_errors", test_batch_errors);
	ADD("submit_invalid", test_submit_invalid);
	ADD("submit_shared_path", test_submit_shared_path);
	ADD("concurrent_batches", test_concurrent_batches);
	tc = tcase_create("offload_roundtrip");
	tcase_add_checked_fixture(tc, setup_tmp, teardown_tmp);
	tcase_add_loop_test(tc, test_offload_roundtrip, 0, nsizes);
	suite_add_tcase(s, tc);
	ADD("offload_errors", test_offload_errors);
	ADD("read_eio", test_read_eio);
	ADD("ring_bound", test_ring_bound);
	tcase_set_timeout(tc, 60);
	ADD("numa_lookup", test_numa_lookup);
	ADD("numa_env", test_numa_env);
	ADD("device_unavailable", test_device_unavailable);
#ifdef WFS_HAVE_CUDA
	tc = tcase_create("cudart_missing");
	tcase_add_checked_fixture(tc, setup_tmp, teardown_tmp);
	tcase_add_loop_test(tc, test_cudart_missing, 0, (int)(sizeof(missing_cudart) / sizeof(missing_cudart[0])));
	suite_add_tcase(s, tc);
#endif
	return s;
}

#ifdef WFS_HAVE_CUDA
static Suite *gpu_suite(void)
{
	Suite *s = suite_create("stage_gpu");
	TCase *tc = tcase_create("gpu_roundtrip");

	tcase_add_checked_fixture(tc, setup_tmp, teardown_tmp);
	tcase_add_loop_test(tc, test_gpu_roundtrip, 0, (int)(sizeof(rt_sizes) / sizeof(rt_sizes[0])));
	suite_add_tcase(s, tc);
	ADD("gpu_errors", test_gpu_errors);
	return s;
}
#endif

/* The GPU suite runs with WFS_TEST_GPU=1, and then must: built without CUDA is a failure. */
static int add_gpu_suite(SRunner *sr)
{
	const char *gpu = getenv("WFS_TEST_GPU");

	if (gpu && !strcmp(gpu, "1")) {
#ifdef WFS_HAVE_CUDA
		srunner_add_suite(sr, gpu_suite());
#else
		(void)sr;
		fprintf(stderr, "check_stage: WFS_TEST_GPU=1 but built without CUDA: GPU suite cannot run\n");
		return -1;
#endif
	} else {
		printf("check_stage: GPU suite NOT RUN (set WFS_TEST_GPU=1 on a machine with a GPU)\n");
	}
	return 0;
}

int main(void)
{
	static const struct tu_main_hooks hooks = {.prepare = add_gpu_suite};

	return tu_main("check_stage", stage_suite(), 0, &hooks);
}
