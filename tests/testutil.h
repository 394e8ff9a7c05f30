/* SPDX-License-Identifier: Apache-2.0 */
/* Shared helpers for the Check suites. */
#ifndef WFS_TESTUTIL_H
#define WFS_TESTUTIL_H

#include <check.h>

/*
 * Helpers below are prefixed tu_ so they never collide with a suite's own statics. All are
 * static inline: a suite that does not use one gets no unused-function warning.
 */
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* @t in seconds (a struct stat time, or a clock reading). */
static inline double tu_ts_s(const struct timespec *t)
{
	return (double)t->tv_sec + (double)t->tv_nsec / 1e9;
}

/* Clock @clock (CLOCK_MONOTONIC for durations, CLOCK_REALTIME to compare with file times), seconds. */
static inline double tu_clock_s(clockid_t clock)
{
	struct timespec t;

	clock_gettime(clock, &t);
	return tu_ts_s(&t);
}

/* Bytes that differ per seed and per position (splitmix64 of both), reproducible across runs. */
static inline void tu_fill(void *buf, size_t len, uint64_t seed)
{
	unsigned char *p = buf;
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;

	for (size_t i = 0; i < len; i += 8) {
		uint64_t z = (x += 0x9e3779b97f4a7c15ull);

		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
		z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
		z ^= z >> 31;
		for (size_t j = 0; j < 8 && i + j < len; j++)
			p[i + j] = (unsigned char)(z >> (8 * j));
	}
}

/*
 * Make a fresh directory "@base/<prefix>.XXXXXX" and write its path into @buf (@len bytes).
 * Returns 0 or -errno; usable outside a running test (from main()).
 */
static inline int tu_mkdtemp_in(char *buf, size_t len, const char *base, const char *prefix)
{
	int n = snprintf(buf, len, "%s/%s.XXXXXX", base, prefix);

	if (n < 0 || (size_t)n >= len)
		return -ENAMETOOLONG;
	return mkdtemp(buf) ? 0 : -errno;
}

/* $TMPDIR, or /tmp when it is unset or empty. */
static inline const char *tu_tmpdir_base(void)
{
	const char *base = getenv("TMPDIR");

	return base && *base ? base : "/tmp";
}

/*
 * Make a fresh directory "$TMPDIR/<prefix>.XXXXXX" (TMPDIR defaults to /tmp) and write its path into
 * @buf (@len bytes). Fails the running test on error.
 */
static inline void tu_mkdtemp(char *buf, size_t len, const char *prefix)
{
	int ret = tu_mkdtemp_in(buf, len, tu_tmpdir_base(), prefix);

	ck_assert_msg(ret == 0, "mkdtemp under %s: %s", tu_tmpdir_base(), strerror(-ret));
}

static inline int tu_rmtree_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(path) < 0 && errno != ENOENT ? -1 : 0;
}

/* Remove @path and everything below it (no symlinks followed). Returns 0 or -errno. */
static inline int tu_rmtree(const char *path)
{
	if (nftw(path, tu_rmtree_one, 16, FTW_DEPTH | FTW_PHYS) < 0)
		return errno == ENOENT ? 0 : -errno;
	return 0;
}

/* "@dir/@name" into @buf; fails the running test when it does not fit. */
static inline void tu_path(char *buf, size_t len, const char *dir, const char *name)
{
	int n = snprintf(buf, len, "%s/%s", dir, name);

	ck_assert_msg(n > 0 && (size_t)n < len, "path too long: %s/%s", dir, name);
}

/* Write all @len bytes at @buf to @fd (retrying short writes). Returns 0 or -errno. */
static inline int tu_write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len > 0) {
		ssize_t n = write(fd, p, len);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Create or truncate @path with @mode and write @len bytes into it. Returns 0 or -errno. */
static inline int tu_write_file(const char *path, const void *buf, size_t len, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
	int ret;

	if (fd < 0)
		return -errno;
	ret = tu_write_all(fd, buf, len);
	if (close(fd) < 0 && ret == 0)
		ret = -errno;
	return ret;
}

/*
 * Read the whole file at @path into a new buffer (*@buf, free() it; one spare NUL byte after the
 * data) and its length in bytes into *@len. Returns 0 or -errno.
 */
static inline int tu_read_file(const char *path, void **buf, size_t *len)
{
	struct stat st;
	char *p = NULL;
	size_t got = 0;
	int fd, ret = 0;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0) {
		ret = -errno;
		goto out;
	}
	p = malloc((size_t)st.st_size + 1);
	if (!p) {
		ret = -ENOMEM;
		goto out;
	}
	while (got < (size_t)st.st_size) {
		ssize_t n = read(fd, p + got, (size_t)st.st_size - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			ret = -errno;
			goto out;
		}
		if (n == 0)
			break;
		got += (size_t)n;
	}
	p[got] = '\0';
out:
	close(fd);
	if (ret) {
		free(p);
		return ret;
	}
	*buf = p;
	*len = got;
	return 0;
}

/* Number of regular files at or below @path, or -1 when it cannot be read. */
static inline long tu_count_files(const char *path)
{
	struct dirent *e;
	struct stat st;
	char sub[4096];
	long n = 0;
	DIR *d;

	if (lstat(path, &st) < 0)
		return -1;
	if (!S_ISDIR(st.st_mode))
		return S_ISREG(st.st_mode) ? 1 : 0;
	d = opendir(path);
	if (!d)
		return -1;
	while ((e = readdir(d)) != NULL) {
		long k;
		int len;

		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		len = snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
		k = len > 0 && (size_t)len < sizeof(sub) ? tu_count_files(sub) : -1;
		if (k < 0) {
			n = -1;
			break;
		}
		n += k;
	}
	closedir(d);
	return n;
}

/* ---- the shared main() and per-test directory ------------------------------------------------- */

/*
 * The run's directory, "$TMPDIR/<suite>.XXXXXX": made by tu_main() with TU_RUN_DIR, holds every
 * test's directory, removed at exit with whatever a failed test left. Empty without TU_RUN_DIR.
 */
static char tu_run_dir[256] __attribute__((unused));
/* This test's directory, fresh in tu_run_dir: made by tu_test_dir_setup(). */
static char tu_test_dir[512] __attribute__((unused));

/* A checked fixture: a new, empty tu_test_dir. Fails the test when it cannot be made. */
static inline void tu_test_dir_setup(void)
{
	int ret = tu_mkdtemp_in(tu_test_dir, sizeof(tu_test_dir), tu_run_dir, "t");

	ck_assert_msg(ret == 0, "mkdtemp in %s: %s", tu_run_dir, strerror(-ret));
}

/* The fixture's teardown: tu_test_dir and everything in it removed. */
static inline void tu_test_dir_teardown(void)
{
	tu_rmtree(tu_test_dir);
}

#define TU_RUN_DIR (1u << 0)    /* make tu_run_dir before the tests, remove it after */
#define TU_NEEDS_ROOT (1u << 1) /* refuse to run (exit 1, one line) unless root: FUSE mounts */

/* What a suite's main() may add around the run; every field may be NULL. */
struct tu_main_hooks {
	const char *root_why;              /* TU_NEEDS_ROOT: what needs root, for the message */
	int (*prepare)(SRunner *sr);       /* after the runner is made: add suites, print a line;
					      non-zero ends the run with EXIT_FAILURE */
	void (*cleanup)(const char *run_dir); /* after the run, before tu_run_dir is removed */
};

/*
 * The Check suites' main(): run @suite (and what @hooks->prepare adds) with CK_NORMAL output.
 * @name is the program's name for messages and the run directory's prefix; @flags TU_*. Returns
 * EXIT_SUCCESS when every test passed, else EXIT_FAILURE (also when the run could not start).
 */
static inline int tu_main(const char *name, Suite *suite, unsigned flags, const struct tu_main_hooks *hooks)
{
	SRunner *sr;
	int failed, ret;

	if ((flags & TU_NEEDS_ROOT) && geteuid() != 0) {
		fprintf(stderr, "%s: needs root (%s)\n", name, hooks && hooks->root_why ? hooks->root_why : "FUSE mounts");
		return EXIT_FAILURE;
	}
	if (flags & TU_RUN_DIR) {
		ret = tu_mkdtemp_in(tu_run_dir, sizeof(tu_run_dir), tu_tmpdir_base(), name);
		if (ret) {
			fprintf(stderr, "%s: mkdtemp under %s: %s\n", name, tu_tmpdir_base(), strerror(-ret));
			return EXIT_FAILURE;
		}
	}
	sr = srunner_create(suite);
	if (hooks && hooks->prepare && hooks->prepare(sr) != 0) {
		srunner_free(sr);
		failed = 1;
	} else {
		srunner_run_all(sr, CK_NORMAL);
		failed = srunner_ntests_failed(sr);
		srunner_free(sr);
	}
	if (hooks && hooks->cleanup)
		hooks->cleanup(tu_run_dir);
	if (flags & TU_RUN_DIR)
		tu_rmtree(tu_run_dir);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#endif
