/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Check suite for lib/store: the directory layout, the owner lock, tmp cleanup, publishing (names,
 * modes, dedup, races), object access, and ENOSPC injected through a small tmpfs.
 *
 * Every test gets a fresh directory under one run directory that main() creates and, at the end,
 * unmounts and removes: a test that fails while a tmpfs is mounted (Check forks each test and a
 * failed assertion exits the child before its teardown) still leaves nothing behind.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "digest.h"
#include "store.h"
#include "testutil.h"

#define KIB 1024u
#define MIB (1024u * KIB)

static char store_dir[600];

/* Publish flags under test; loop tests run each behaviour with and without syncing. */
static const unsigned flag_sets[] = {WFS_STORE_CREATE, WFS_STORE_CREATE | WFS_STORE_NOSYNC};
#define NFLAGS ((int)(sizeof(flag_sets) / sizeof(flag_sets[0])))

static void tmp_setup(void)
{
	tu_test_dir_setup();
	tu_path(store_dir, sizeof(store_dir), tu_test_dir, "store");
}

static void tmp_teardown(void)
{
	tu_test_dir_teardown();
}

/* "@store_dir/@rel" */
static void spath(char *buf, size_t len, const char *rel)
{
	tu_path(buf, len, store_dir, rel);
}

static void object_path(char *buf, size_t len, const struct wfs_digest *d)
{
	char name[34], rel[64];

	wfs_store_object_name(d, name);
	snprintf(rel, sizeof(rel), "objects/%s", name);
	spath(buf, len, rel);
}

static struct wfs_store *open_store(unsigned flags)
{
	struct wfs_store *s = NULL;
	int ret = wfs_store_open(store_dir, flags, &s);

	ck_assert_msg(ret == 0, "wfs_store_open(%s, %#x): %s", store_dir, flags, strerror(-ret));
	ck_assert_ptr_nonnull(s);
	return s;
}

static bool fd_is_open(int fd)
{
	return fcntl(fd, F_GETFD) != -1;
}

/* Write @len bytes into a new tmp file and publish it. Returns publish's result. */
static int put(struct wfs_store *s, const void *buf, size_t len, struct wfs_digest *d, bool *existed)
{
	struct wfs_tmpfile t;
	int ret;

	ret = wfs_store_tmp_create(s, &t);
	if (ret)
		return ret;
	ret = tu_write_all(t.fd, buf, len);
	if (ret) {
		wfs_store_tmp_discard(s, &t);
		return ret;
	}
	wfs_digest_buf(buf, len, d);
	return wfs_store_publish(s, &t, d, true, existed);
}

/* The object file of @d holds exactly @len bytes equal to @buf, mode 0444, and hashes to its name. */
static void assert_object(const struct wfs_digest *d, const void *buf, size_t len)
{
	char path[700], name[34], hex[WFS_DIGEST_HEX_CHARS + 1], dhex[WFS_DIGEST_HEX_CHARS + 1];
	struct wfs_digest got;
	uint64_t bytes = 0;
	struct stat st;
	void *data = NULL;
	size_t n = 0;
	int fd;

	object_path(path, sizeof(path), d);
	ck_assert_msg(stat(path, &st) == 0, "object %s: %s", path, strerror(errno));
	ck_assert(S_ISREG(st.st_mode));
	ck_assert_uint_eq(st.st_mode & 07777, 0444);
	ck_assert_uint_eq(st.st_nlink, 1);
	ck_assert_uint_eq((uint64_t)st.st_size, len);
	ck_assert_int_eq(tu_read_file(path, &data, &n), 0);
	ck_assert_uint_eq(n, len);
	ck_assert(len == 0 || memcmp(data, buf, len) == 0);
	free(data);
	/* `xxhsum -H2 FILE` prints the name: the hex of the file's digest is "ab" + "<30 hex>". */
	fd = open(path, O_RDONLY);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(wfs_digest_fd(fd, &got, &bytes), 0);
	close(fd);
	ck_assert_uint_eq(bytes, len);
	wfs_digest_to_hex(&got, hex);
	wfs_digest_to_hex(d, dhex);
	ck_assert_str_eq(hex, dhex);
	wfs_store_object_name(&got, name);
	ck_assert_int_eq(name[2], '/');
	ck_assert_int_eq(strncmp(name, hex, 2), 0);
	ck_assert_str_eq(name + 3, hex + 2);
	ck_assert_str_eq(strrchr(path, '/') + 1, hex + 2);
}

static long count_under(const char *rel)
{
	char path[700];

	spath(path, sizeof(path), rel);
	return tu_count_files(path);
}

/* ---- open ------------------------------------------------------------------------------------ */

START_TEST(test_open_creates_layout)
{
	struct wfs_store *s = open_store(WFS_STORE_CREATE | WFS_STORE_NOSYNC);
	char path[700];
	struct stat st;

	ck_assert_str_eq(wfs_store_path(s), store_dir);
	ck_assert_int_eq(stat(store_dir, &st), 0);
	ck_assert(S_ISDIR(st.st_mode));
	spath(path, sizeof(path), "objects");
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert(S_ISDIR(st.st_mode));
	spath(path, sizeof(path), "tmp");
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert(S_ISDIR(st.st_mode));
	spath(path, sizeof(path), "lock");
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert(S_ISREG(st.st_mode));
	ck_assert_int_eq(count_under("objects"), 0);
	ck_assert_int_eq(count_under("tmp"), 0);
	wfs_store_close(s);
	/* Reopening an existing store, with or without CREATE, works. */
	s = open_store(0);
	wfs_store_close(s);
	s = open_store(WFS_STORE_CREATE);
	wfs_store_close(s);
	wfs_store_close(NULL);
}
END_TEST

START_TEST(test_open_missing)
{
	struct wfs_store *s = (struct wfs_store *)&s; /* sentinel: must stay untouched */
	struct wfs_store *const sentinel = s;
	char file[700];
	struct stat st;

	ck_assert_int_eq(wfs_store_open(store_dir, 0, &s), -ENOENT);
	ck_assert_int_eq(wfs_store_open(store_dir, WFS_STORE_READONLY, &s), -ENOENT);
	ck_assert_ptr_eq(s, sentinel);
	ck_assert_int_eq(stat(store_dir, &st), -1);
	ck_assert_int_eq(errno, ENOENT);
	/* CREATE makes only the store directory, not missing parents. */
	tu_path(file, sizeof(file), tu_test_dir, "no/such/store");
	ck_assert_int_eq(wfs_store_open(file, WFS_STORE_CREATE, &s), -ENOENT);
	/* A regular file where the store should be. */
	tu_path(file, sizeof(file), tu_test_dir, "file");
	ck_assert_int_eq(tu_write_file(file, "x", 1, 0644), 0);
	ck_assert_int_eq(wfs_store_open(file, 0, &s), -ENOTDIR);
	ck_assert_int_eq(wfs_store_open(file, WFS_STORE_CREATE, &s), -ENOTDIR);
	ck_assert_ptr_eq(s, sentinel);
}
END_TEST

/* An existing directory that is not a store: -ENOENT without CREATE, and the directory is left as
 * it was (an inspection tool pointed at the wrong path must not write into it). */
START_TEST(test_open_not_a_store)
{
	struct wfs_store *s = NULL;

	ck_assert_int_eq(mkdir(store_dir, 0755), 0);
	ck_assert_int_eq(wfs_store_open(store_dir, WFS_STORE_READONLY, &s), -ENOENT);
	ck_assert_int_eq(tu_count_files(store_dir), 0);
	ck_assert_int_eq(wfs_store_open(store_dir, 0, &s), -ENOENT);
	ck_assert_ptr_null(s);
	ck_assert_msg(tu_count_files(store_dir) == 0,
		      "wfs_store_open(non-store dir, 0) returned -ENOENT but left %ld file(s) behind "
		      "(STORE/lock)",
		      tu_count_files(store_dir));
	/* CREATE turns it into a store. */
	s = open_store(WFS_STORE_CREATE);
	wfs_store_close(s);
}
END_TEST

/*
 * CREATE lays a store out only where nothing else lives: a directory with other files is refused
 * (-ENOTEMPTY) and left as it was; INIT lays it out there anyway. A new store is private (0700).
 */
START_TEST(test_open_create_where)
{
	struct wfs_store *s = NULL;
	char file[700], sub[700];
	struct stat st;

	ck_assert_int_eq(mkdir(store_dir, 0755), 0);
	spath(file, sizeof(file), "notes.txt");
	ck_assert_int_eq(tu_write_file(file, "x", 1, 0644), 0);
	ck_assert_int_eq(wfs_store_open(store_dir, WFS_STORE_CREATE, &s), -ENOTEMPTY);
	ck_assert_ptr_null(s);
	ck_assert_int_eq(tu_count_files(store_dir), 1);
	spath(sub, sizeof(sub), "objects");
	ck_assert_int_eq(stat(sub, &st), -1);
	ck_assert_int_eq(stat(store_dir, &st), 0);
	ck_assert_int_eq(st.st_mode & 07777, 0755);
	/* The explicit step: the layout next to the files, and the directory made private. */
	s = open_store(WFS_STORE_INIT | WFS_STORE_NOSYNC);
	wfs_store_close(s);
	ck_assert_int_eq(stat(store_dir, &st), 0);
	ck_assert_int_eq(st.st_mode & 07777, 0700);
	ck_assert_int_eq(stat(sub, &st), 0);
	ck_assert_int_eq(st.st_mode & 07777, 0700);
	ck_assert_int_eq(access(file, F_OK), 0);
	/* Now a store: CREATE opens it, and keeps the mode its owner gives it. */
	ck_assert_int_eq(chmod(store_dir, 0750), 0);
	s = open_store(WFS_STORE_CREATE);
	wfs_store_close(s);
	ck_assert_int_eq(stat(store_dir, &st), 0);
	ck_assert_int_eq(st.st_mode & 07777, 0750);
	/* An empty directory (lost+found aside, as on a fresh filesystem) becomes a private store. */
	tu_rmtree(store_dir);
	ck_assert_int_eq(mkdir(store_dir, 0755), 0);
	spath(sub, sizeof(sub), "lost+found");
	ck_assert_int_eq(mkdir(sub, 0700), 0);
	s = open_store(WFS_STORE_CREATE);
	wfs_store_close(s);
	ck_assert_int_eq(stat(store_dir, &st), 0);
	ck_assert_int_eq(st.st_mode & 07777, 0700);
	/* A missing one is made 0700 whatever the umask. */
	tu_rmtree(store_dir);
	mode_t old = umask(0);
	s = open_store(WFS_STORE_CREATE);
	umask(old);
	wfs_store_close(s);
	ck_assert_int_eq(stat(store_dir, &st), 0);
	ck_assert_int_eq(st.st_mode & 07777, 0700);
	spath(sub, sizeof(sub), "tmp");
	ck_assert_int_eq(stat(sub, &st), 0);
	ck_assert_int_eq(st.st_mode & 07777, 0700);
}
END_TEST

/* The holder of a store is recorded in STORE/lock: its pid, and what it says it does. */
START_TEST(test_open_owner)
{
	struct wfs_store *s = open_store(WFS_STORE_CREATE | WFS_STORE_NOSYNC);
	char what[64] = "sentinel";
	int pid = 0;

	ck_assert_int_eq(wfs_store_owner(store_dir, &pid, what, sizeof(what)), 0);
	ck_assert_int_eq(pid, (int)getpid());
	ck_assert_str_eq(what, "");
	wfs_store_set_owner(s, "mounted on /mnt/x");
	ck_assert_int_eq(wfs_store_owner(store_dir, &pid, what, sizeof(what)), 0);
	ck_assert_int_eq(pid, (int)getpid());
	ck_assert_str_eq(what, "mounted on /mnt/x");
	wfs_store_close(s);
	/* A pid that is gone is not reported. */
	{
		char lock[700];
		int fd;

		spath(lock, sizeof(lock), "lock");
		fd = open(lock, O_WRONLY | O_TRUNC);
		ck_assert_int_ge(fd, 0);
		ck_assert_int_eq(write(fd, "2147483646\nx\n", 13), 13);
		close(fd);
	}
	ck_assert_int_eq(wfs_store_owner(store_dir, &pid, what, sizeof(what)), -ENOENT);
}
END_TEST

/* STORE/lock left filled names an owner that never closed the store (killed); a clean close empties it. */
START_TEST(test_open_unclean)
{
	struct wfs_store *s = open_store(WFS_STORE_CREATE | WFS_STORE_NOSYNC);
	char what[64] = "sentinel";
	int pid = 0, status;
	pid_t child;

	ck_assert(!wfs_store_unclean(s, &pid, what, sizeof(what))); /* a new store */
	wfs_store_close(s);
	s = open_store(0);
	ck_assert(!wfs_store_unclean(s, &pid, what, sizeof(what))); /* closed cleanly */
	/* A forked child closing the store it inherited leaves the parent's record alone. */
	child = fork();
	ck_assert_int_ge(child, 0);
	if (child == 0) {
		wfs_store_close(s);
		_exit(0);
	}
	ck_assert_int_eq(waitpid(child, &status, 0), child);
	ck_assert_int_eq(wfs_store_owner(store_dir, &pid, NULL, 0), 0);
	ck_assert_int_eq(pid, (int)getpid());
	wfs_store_close(s);
	/* An owner that exits without closing (as SIGKILL would end it). */
	child = fork();
	ck_assert_int_ge(child, 0);
	if (child == 0) {
		struct wfs_store *c = NULL;

		if (wfs_store_open(store_dir, 0, &c) != 0)
			_exit(1);
		wfs_store_set_owner(c, "mounted on /mnt/y");
		_exit(0);
	}
	ck_assert_int_eq(waitpid(child, &status, 0), child);
	ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	/* Inspection (fsck) reads the mark too, and leaves it for the next owner. */
	s = open_store(WFS_STORE_READONLY);
	ck_assert(wfs_store_unclean(s, &pid, what, sizeof(what)));
	ck_assert_int_eq(pid, (int)child);
	wfs_store_close(s);
	s = open_store(0);
	ck_assert(wfs_store_unclean(s, &pid, what, sizeof(what)));
	ck_assert_int_eq(pid, (int)child);
	ck_assert_str_eq(what, "mounted on /mnt/y");
	wfs_store_close(s);
	s = open_store(0);
	ck_assert(!wfs_store_unclean(s, &pid, what, sizeof(what)));
	{
		/* While an owner holds it, a read-only open is not told of its filled lock. */
		struct wfs_store *ro = open_store(WFS_STORE_READONLY);

		ck_assert(!wfs_store_unclean(ro, &pid, what, sizeof(what)));
		wfs_store_close(ro);
	}
	wfs_store_close(s);
}
END_TEST

START_TEST(test_open_busy)
{
	struct wfs_store *a = open_store(WFS_STORE_CREATE | WFS_STORE_NOSYNC), *b = NULL, *ro = NULL;

	ck_assert_int_eq(wfs_store_open(store_dir, 0, &b), -EBUSY);
	ck_assert_int_eq(wfs_store_open(store_dir, WFS_STORE_CREATE, &b), -EBUSY);
	ck_assert_ptr_null(b);
	/* Inspection opens take no lock. */
	ck_assert_int_eq(wfs_store_open(store_dir, WFS_STORE_READONLY, &ro), 0);
	ck_assert_ptr_nonnull(ro);
	wfs_store_close(a);
	ck_assert_int_eq(wfs_store_open(store_dir, 0, &b), 0);
	wfs_store_close(b);
	wfs_store_close(ro);
}
END_TEST

/*
 * In a child process: try to open the store read-write and exit 0 when the result is @want, else
 * with the errno (255 for success). The child frees what it inherited so leak checkers stay quiet;
 * closing its copies of the parent's descriptors does not drop the parent's flock.
 */
static void child_open(struct wfs_store *inherited, int want)
{
	struct wfs_store *c = NULL;
	int ret = wfs_store_open(store_dir, 0, &c);

	if (ret == 0)
		wfs_store_close(c);
	wfs_store_close(inherited);
	_exit(ret == want ? 0 : ret < 0 && ret > -255 ? -ret : 255);
}

/* The lock holds against another process too, and goes with its holder. */
START_TEST(test_open_busy_other_process)
{
	struct wfs_store *a = open_store(WFS_STORE_CREATE | WFS_STORE_NOSYNC), *b = NULL;
	int status;
	pid_t pid;

	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0)
		child_open(a, -EBUSY);
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "second process did not get -EBUSY (wait status %#x)", status);
	/* Still ours after the child closed its inherited copies. */
	ck_assert_int_eq(wfs_store_open(store_dir, 0, &b), -EBUSY);
	wfs_store_close(a);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0)
		child_open(NULL, 0);
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "open after close failed in another process (wait status %#x)", status);
	ck_assert_int_eq(wfs_store_open(store_dir, 0, &b), 0);
	wfs_store_close(b);
}
END_TEST

START_TEST(test_open_cleans_tmp)
{
	struct wfs_store *s = open_store(WFS_STORE_CREATE | WFS_STORE_NOSYNC);
	struct wfs_digest d;
	char path[700];
	bool existed;

	ck_assert_int_eq(put(s, "kept", 4, &d, &existed), 0);
	wfs_store_close(s);
	spath(path, sizeof(path), "tmp/w.123.abcdefghijklmnop");
	ck_assert_int_eq(tu_write_file(path, "partial", 7, 0644), 0);
	spath(path, sizeof(path), "tmp/leftover");
	ck_assert_int_eq(tu_write_file(path, "", 0, 0444), 0);
	spath(path, sizeof(path), "tmp/.hidden");
	ck_assert_int_eq(tu_write_file(path, "h", 1, 0644), 0);
	ck_assert_int_eq(count_under("tmp"), 3);
	/* Inspection leaves tmp/ alone. */
	s = open_store(WFS_STORE_READONLY);
	wfs_store_close(s);
	ck_assert_int_eq(count_under("tmp"), 3);
	s = open_store(0);
	ck_assert_int_eq(count_under("tmp"), 0);
	ck_assert_int_eq(count_under("objects"), 1);
	assert_object(&d, "kept", 4);
	wfs_store_close(s);
}
END_TEST

START_TEST(test_readonly_refuses_writes)
{
	struct wfs_store *s = open_store(WFS_STORE_CREATE | WFS_STORE_NOSYNC), *ro = NULL;
	struct wfs_tmpfile t = {.fd = -1};
	struct wfs_digest d;
	struct stat st;
	bool existed;
	int fd;

	ck_assert_int_eq(put(s, "hello\n", 6, &d, &existed), 0);
	wfs_store_close(s);
	ck_assert_int_eq(wfs_store_open(store_dir, WFS_STORE_READONLY, &ro), 0);
	ck_assert_int_eq(wfs_store_tmp_create(ro, &t), -EROFS);
	ck_assert_int_eq(wfs_store_object_remove(ro, &d), -EROFS);
	/* Reading works. */
	ck_assert_int_eq(wfs_store_object_stat(ro, &d, &st), 0);
	ck_assert_int_eq(st.st_size, 6);
	fd = wfs_store_object_open(ro, &d, 0);
	ck_assert_int_ge(fd, 0);
	close(fd);
	/* publish on a read-only store still consumes the tmp file it is given. */
	fd = open(store_dir, O_RDONLY | O_DIRECTORY);
	ck_assert_int_ge(fd, 0);
	t.fd = openat(fd, "tmp", O_TMPFILE | O_RDWR, 0644);
	close(fd);
	ck_assert_int_ge(t.fd, 0);
	t.name[0] = '\0';
	fd = t.fd;
	existed = true;
	ck_assert_int_eq(wfs_store_publish(ro, &t, &d, true, &existed), -EROFS);
	ck_assert(!existed);
	ck_assert_int_eq(t.fd, -1);
	ck_assert(!fd_is_open(fd));
	wfs_store_close(ro);
}
END_TEST

/* ---- tmp files and publishing (loop: _i indexes flag_sets) ----------------------------------- */

START_TEST(test_tmp_discard)
{
	struct wfs_store *s = open_store(flag_sets[_i]);
	struct wfs_tmpfile t;
	int fd;

	ck_assert_int_eq(wfs_store_tmp_create(s, &t), 0);
	ck_assert_int_ge(t.fd, 0);
	ck_assert_int_eq(tu_write_all(t.fd, "abc", 3), 0);
	fd = t.fd;
	wfs_store_tmp_discard(s, &t);
	ck_assert_int_eq(t.fd, -1);
	ck_assert_str_eq(t.name, "");
	ck_assert(!fd_is_open(fd));
	wfs_store_tmp_discard(s, &t); /* safe on fd == -1 */
	ck_assert_int_eq(count_under("tmp"), 0);
	ck_assert_int_eq(count_under("objects"), 0);
	wfs_store_close(s);
}
END_TEST

START_TEST(test_publish_new)
{
	struct wfs_store *s = open_store(flag_sets[_i]);
	char path[700], name[34];
	struct wfs_tmpfile t;
	struct wfs_digest d;
	bool existed = true;
	int fd;

	ck_assert_int_eq(wfs_store_tmp_create(s, &t), 0);
	ck_assert_int_eq(tu_write_all(t.fd, "hello\n", 6), 0);
	ck_assert_int_eq(wfs_digest_fd(t.fd, &d, NULL), 0);
	fd = t.fd;
	ck_assert_int_eq(wfs_store_publish(s, &t, &d, true, &existed), 0);
	ck_assert(!existed);
	ck_assert_int_eq(t.fd, -1);
	ck_assert(!fd_is_open(fd));
	/* The golden name of "hello\n" (check_digest.c), split after two hex digits. */
	wfs_store_object_name(&d, name);
	ck_assert_str_eq(name, "6b/ba86c7e069f56d5a10b435f1c8e49c");
	spath(path, sizeof(path), "objects/6b/ba86c7e069f56d5a10b435f1c8e49c");
	ck_assert_int_eq(access(path, F_OK), 0);
	assert_object(&d, "hello\n", 6);
	ck_assert_int_eq(count_under("objects"), 1);
	ck_assert_int_eq(count_under("tmp"), 0);
	wfs_store_close(s);
}
END_TEST

START_TEST(test_publish_large_and_empty)
{
	struct wfs_store *s = open_store(flag_sets[_i]);
	const size_t len = 5 * MIB + 3;
	unsigned char *buf = malloc(len);
	struct wfs_digest d, e;
	char name[34];
	bool existed = true;

	ck_assert_ptr_nonnull(buf);
	tu_fill(buf, len, 7);
	ck_assert_int_eq(put(s, buf, len, &d, &existed), 0);
	ck_assert(!existed);
	assert_object(&d, buf, len);
	existed = true;
	ck_assert_int_eq(put(s, "", 0, &e, &existed), 0);
	ck_assert(!existed);
	wfs_store_object_name(&e, name);
	ck_assert_str_eq(name, "99/aa06d3014798d86001c324468d497f");
	assert_object(&e, "", 0);
	ck_assert_int_eq(count_under("objects"), 2);
	free(buf);
	wfs_store_close(s);
}
END_TEST

START_TEST(test_publish_existing)
{
	struct wfs_store *s = open_store(flag_sets[_i]);
	struct wfs_digest d1, d2;
	char path[700];
	struct stat st1, st2;
	bool existed = true;

	ck_assert_int_eq(put(s, "same bytes", 10, &d1, &existed), 0);
	ck_assert(!existed);
	object_path(path, sizeof(path), &d1);
	ck_assert_int_eq(stat(path, &st1), 0);
	existed = false;
	ck_assert_int_eq(put(s, "same bytes", 10, &d2, &existed), 0);
	ck_assert(existed);
	ck_assert(wfs_digest_equal(&d1, &d2));
	/* The first file stays; the second tmp file is gone. */
	ck_assert_int_eq(stat(path, &st2), 0);
	ck_assert_uint_eq(st1.st_ino, st2.st_ino);
	ck_assert_int_eq(count_under("objects"), 1);
	ck_assert_int_eq(count_under("tmp"), 0);
	assert_object(&d1, "same bytes", 10);
	/* And once more across a reopen. */
	wfs_store_close(s);
	s = open_store(flag_sets[_i]);
	existed = false;
	ck_assert_int_eq(put(s, "same bytes", 10, &d2, &existed), 0);
	ck_assert(existed);
	ck_assert_int_eq(count_under("objects"), 1);
	wfs_store_close(s);
}
END_TEST

/*
 * A named tmp file (the fallback where O_TMPFILE is missing) publishes by its name and is removed;
 * with keep_name (a version a successor may still adopt) the name stays until the discard.
 */
START_TEST(test_publish_named_tmp)
{
	struct wfs_store *s = open_store(flag_sets[_i]);
	struct wfs_tmpfile t = {.fd = -1};
	struct wfs_digest d;
	char path[700];
	bool existed = true;
	int fd;

	spath(path, sizeof(path), "tmp/w.1.named");
	t.fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0644);
	ck_assert_int_ge(t.fd, 0);
	snprintf(t.name, sizeof(t.name), "w.1.named");
	ck_assert_int_eq(tu_write_all(t.fd, "named", 5), 0);
	wfs_digest_buf("named", 5, &d);
	fd = t.fd;
	ck_assert_int_eq(wfs_store_publish(s, &t, &d, true, &existed), 0);
	ck_assert(!existed);
	ck_assert(!fd_is_open(fd));
	ck_assert_int_eq(t.fd, -1);
	ck_assert_int_eq(access(path, F_OK), -1);
	ck_assert_int_eq(count_under("tmp"), 0);
	assert_object(&d, "named", 5);

	spath(path, sizeof(path), "tmp/w.1.kept");
	t.fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0644);
	ck_assert_int_ge(t.fd, 0);
	snprintf(t.name, sizeof(t.name), "w.1.kept");
	t.keep_name = true;
	ck_assert_int_eq(tu_write_all(t.fd, "kept!", 5), 0);
	wfs_digest_buf("kept!", 5, &d);
	fd = t.fd;
	ck_assert_int_eq(wfs_store_publish(s, &t, &d, true, &existed), 0);
	ck_assert(!fd_is_open(fd));
	ck_assert_int_eq(t.fd, -1);
	ck_assert_int_eq(access(path, F_OK), 0); /* kept for the caller: a second link of the object */
	wfs_store_tmp_discard(s, &t);
	ck_assert_int_eq(access(path, F_OK), -1);
	ck_assert_int_eq(count_under("tmp"), 0);
	assert_object(&d, "kept!", 5);
	wfs_store_close(s);
}
END_TEST

/*
 * publish consumes the tmp file when it fails: a regular file where objects/ab/ should be makes
 * link() fail with ENOTDIR; the fd is closed, the named tmp file removed, no object added.
 */
START_TEST(test_publish_error_consumes)
{
	struct wfs_store *s = open_store(flag_sets[_i]);
	struct wfs_tmpfile t;
	struct wfs_digest d;
	char path[700], name[34], prefix[16];
	struct stat st;
	bool existed = true;
	int fd;

	wfs_digest_buf("blocked", 7, &d);
	wfs_store_object_name(&d, name);
	snprintf(prefix, sizeof(prefix), "objects/%.2s", name);
	spath(path, sizeof(path), prefix);
	ck_assert_int_eq(tu_write_file(path, "", 0, 0644), 0);

	/* Anonymous tmp file. */
	ck_assert_int_eq(wfs_store_tmp_create(s, &t), 0);
	ck_assert_int_eq(tu_write_all(t.fd, "blocked", 7), 0);
	fd = t.fd;
	ck_assert_int_eq(wfs_store_publish(s, &t, &d, true, &existed), -ENOTDIR);
	ck_assert(!existed);
	ck_assert_int_eq(t.fd, -1);
	ck_assert(!fd_is_open(fd));

	/* Named tmp file. */
	spath(path, sizeof(path), "tmp/w.2.named");
	t.fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0644);
	ck_assert_int_ge(t.fd, 0);
	snprintf(t.name, sizeof(t.name), "w.2.named");
	ck_assert_int_eq(tu_write_all(t.fd, "blocked", 7), 0);
	fd = t.fd;
	ck_assert_int_eq(wfs_store_publish(s, &t, &d, true, &existed), -ENOTDIR);
	ck_assert(!fd_is_open(fd));
	ck_assert_int_eq(access(path, F_OK), -1);

	ck_assert_int_eq(count_under("tmp"), 0);
	ck_assert_int_eq(wfs_store_object_stat(s, &d, &st), -ENOTDIR);
	ck_assert_int_eq(count_under("objects"), 1); /* only the blocking file */
	wfs_store_close(s);
}
END_TEST

START_TEST(test_object_access)
{
	struct wfs_store *s = open_store(flag_sets[_i]);
	struct wfs_digest d, missing;
	char buf[32];
	struct stat st;
	bool existed;
	int fd, keep;

	ck_assert_int_eq(put(s, "object bytes", 12, &d, &existed), 0);
	ck_assert_int_eq(wfs_store_object_stat(s, &d, &st), 0);
	ck_assert(S_ISREG(st.st_mode));
	ck_assert_uint_eq(st.st_mode & 07777, 0444);
	ck_assert_int_eq(st.st_size, 12);

	fd = wfs_store_object_open(s, &d, 0);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY);
	ck_assert(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	ck_assert_int_eq(pread(fd, buf, sizeof(buf), 0), 12);
	ck_assert_mem_eq(buf, "object bytes", 12);
	ck_assert_int_eq(write(fd, "x", 1), -1); /* read-only descriptor */
	close(fd);
	/* Extra flags are honoured. */
	fd = wfs_store_object_open(s, &d, O_NOATIME);
	ck_assert_int_ge(fd, 0);
	ck_assert(fcntl(fd, F_GETFL) & O_NOATIME);
	keep = fd;

	/* Remove: the name goes, an open reader keeps its bytes. */
	ck_assert_int_eq(wfs_store_object_remove(s, &d), 0);
	ck_assert_int_eq(wfs_store_object_stat(s, &d, &st), -ENOENT);
	ck_assert_int_eq(wfs_store_object_open(s, &d, 0), -ENOENT);
	ck_assert_int_eq(wfs_store_object_remove(s, &d), -ENOENT);
	ck_assert_int_eq(pread(keep, buf, sizeof(buf), 0), 12);
	ck_assert_mem_eq(buf, "object bytes", 12);
	close(keep);
	ck_assert_int_eq(count_under("objects"), 0);

	/* Never stored, prefix directory missing too. */
	ck_assert_int_eq(wfs_digest_from_hex("00000000000000000000000000000000", &missing), 0);
	ck_assert_int_eq(wfs_store_object_stat(s, &missing, &st), -ENOENT);
	ck_assert_int_eq(wfs_store_object_open(s, &missing, 0), -ENOENT);
	ck_assert_int_eq(wfs_store_object_remove(s, &missing), -ENOENT);

	/* Publishing the removed content again stores it anew. */
	existed = true;
	ck_assert_int_eq(put(s, "object bytes", 12, &d, &existed), 0);
	/* Removed with its space freed later: the name goes at once, the file lives until the close. */
	{
		struct stat held;
		int path_fd = wfs_store_object_unlink_open(s, &d);

		ck_assert_int_ge(path_fd, 0);
		ck_assert_int_eq(wfs_store_object_stat(s, &d, &st), -ENOENT);
		ck_assert_int_eq(fstat(path_fd, &held), 0);
		ck_assert_int_eq(held.st_size, 12);
		ck_assert_int_eq(held.st_nlink, 0);
		close(path_fd);
		ck_assert_int_eq(wfs_store_object_unlink_open(s, &d), -ENOENT);
		ck_assert_int_eq(put(s, "object bytes", 12, &d, &existed), 0);
		ck_assert(!existed);
	}
	ck_assert(!existed);
	assert_object(&d, "object bytes", 12);
	wfs_store_close(s);
}
END_TEST

START_TEST(test_object_name)
{
	struct wfs_digest d;
	char name[34];

	memset(name, 'x', sizeof(name));
	ck_assert_int_eq(wfs_digest_from_hex("0123456789ABCDEF0123456789abcdef", &d), 0);
	wfs_store_object_name(&d, name);
	ck_assert_str_eq(name, "01/23456789abcdef0123456789abcdef");
	ck_assert_uint_eq(strlen(name), 33);
}
END_TEST

START_TEST(test_statfs)
{
	struct wfs_store *s = open_store(flag_sets[_i]);
	struct statvfs a, b;

	ck_assert_int_eq(wfs_store_statfs(s, &a), 0);
	ck_assert_int_eq(statvfs(store_dir, &b), 0);
	ck_assert_uint_eq(a.f_fsid, b.f_fsid);
	ck_assert_uint_eq(a.f_bsize, b.f_bsize);
	ck_assert_uint_eq(a.f_blocks, b.f_blocks);
	wfs_store_close(s);
}
END_TEST

/* ---- concurrent publishing ------------------------------------------------------------------- */

#define NTHREADS 8
#define RACE_BYTES (64u * KIB)

struct racer {
	struct wfs_store *s;
	pthread_barrier_t *barrier;
	uint64_t seed; /* content seed; equal seeds publish equal bytes */
	int rounds;
	/* results, per round */
	int ret[32];
	bool existed[32];
	struct wfs_digest digest[32];
};

static void *race_main(void *arg)
{
	struct racer *r = arg;
	unsigned char *buf = malloc(RACE_BYTES);

	for (int round = 0; round < r->rounds; round++) {
		struct wfs_tmpfile t;

		r->ret[round] = -ENOMEM;
		if (buf)
			tu_fill(buf, RACE_BYTES, r->seed * 1000 + (uint64_t)round);
		if (buf && (r->ret[round] = wfs_store_tmp_create(r->s, &t)) == 0) {
			r->ret[round] = tu_write_all(t.fd, buf, RACE_BYTES);
			wfs_digest_buf(buf, RACE_BYTES, &r->digest[round]);
		}
		/* Everyone links at once. */
		pthread_barrier_wait(r->barrier);
		if (r->ret[round] == 0)
			r->ret[round] = wfs_store_publish(r->s, &t, &r->digest[round], true, &r->existed[round]);
		pthread_barrier_wait(r->barrier);
	}
	free(buf);
	return NULL;
}

static void run_racers(struct wfs_store *s, struct racer *r, bool same, int rounds)
{
	pthread_barrier_t barrier;
	pthread_t th[NTHREADS];

	ck_assert_int_le(rounds, 32);
	ck_assert_int_eq(pthread_barrier_init(&barrier, NULL, NTHREADS), 0);
	for (int i = 0; i < NTHREADS; i++) {
		memset(&r[i], 0, sizeof(r[i]));
		r[i].s = s;
		r[i].barrier = &barrier;
		r[i].seed = same ? 1 : (uint64_t)i + 2;
		r[i].rounds = rounds;
		ck_assert_int_eq(pthread_create(&th[i], NULL, race_main, &r[i]), 0);
	}
	for (int i = 0; i < NTHREADS; i++)
		ck_assert_int_eq(pthread_join(th[i], NULL), 0);
	pthread_barrier_destroy(&barrier);
}

/* Eight threads publish the same bytes at the same moment: all succeed, exactly one adds the object. */
START_TEST(test_race_same_content)
{
	struct wfs_store *s = open_store(flag_sets[_i]);
	const int rounds = 16;
	struct racer r[NTHREADS];
	unsigned char *buf = malloc(RACE_BYTES);

	ck_assert_ptr_nonnull(buf);
	run_racers(s, r, true, rounds);
	for (int round = 0; round < rounds; round++) {
		int added = 0;

		for (int i = 0; i < NTHREADS; i++) {
			ck_assert_msg(r[i].ret[round] == 0, "round %d thread %d: %s", round, i,
				      strerror(-r[i].ret[round]));
			ck_assert(wfs_digest_equal(&r[i].digest[round], &r[0].digest[round]));
			added += !r[i].existed[round];
		}
		ck_assert_msg(added == 1, "round %d: %d threads reported a new object", round, added);
		tu_fill(buf, RACE_BYTES, 1000 + (uint64_t)round);
		assert_object(&r[0].digest[round], buf, RACE_BYTES);
	}
	ck_assert_int_eq(count_under("objects"), rounds);
	ck_assert_int_eq(count_under("tmp"), 0);
	free(buf);
	wfs_store_close(s);
}
END_TEST

/* Eight threads publish different bytes at once: every object is there, each with its own bytes. */
START_TEST(test_race_different_content)
{
	struct wfs_store *s = open_store(flag_sets[_i]);
	const int rounds = 16;
	struct racer r[NTHREADS];
	unsigned char *buf = malloc(RACE_BYTES);

	ck_assert_ptr_nonnull(buf);
	run_racers(s, r, false, rounds);
	for (int i = 0; i < NTHREADS; i++) {
		for (int round = 0; round < rounds; round++) {
			ck_assert_msg(r[i].ret[round] == 0, "round %d thread %d: %s", round, i,
				      strerror(-r[i].ret[round]));
			ck_assert(!r[i].existed[round]);
			tu_fill(buf, RACE_BYTES, r[i].seed * 1000 + (uint64_t)round);
			assert_object(&r[i].digest[round], buf, RACE_BYTES);
		}
	}
	ck_assert_int_eq(count_under("objects"), NTHREADS * rounds);
	ck_assert_int_eq(count_under("tmp"), 0);
	free(buf);
	wfs_store_close(s);
}
END_TEST

/* ---- ENOSPC through a small tmpfs ------------------------------------------------------------ */

/* Mount a tmpfs with @opts on @tu_test_dir/mnt and put the store inside it. Failing to mount fails. */
static void mount_small_tmpfs(const char *opts)
{
	char mnt[700];

	tu_path(mnt, sizeof(mnt), tu_test_dir, "mnt");
	ck_assert_int_eq(mkdir(mnt, 0755), 0);
	ck_assert_msg(mount("tmpfs", mnt, "tmpfs", 0, opts) == 0,
		      "mount -t tmpfs -o %s tmpfs %s failed: %s (this test needs root and may not be "
		      "skipped)",
		      opts, mnt, strerror(errno));
	tu_path(store_dir, sizeof(store_dir), mnt, "store");
}

static void tmpfs_teardown(void)
{
	char mnt[700];

	tu_path(mnt, sizeof(mnt), tu_test_dir, "mnt");
	umount2(mnt, MNT_DETACH);
	tu_test_dir_teardown();
}

/* Writing more than the filesystem holds fails with ENOSPC; discarding leaves no object behind. */
START_TEST(test_enospc_write)
{
	struct wfs_store *s;
	const size_t len = 2 * MIB;
	unsigned char *buf = malloc(len);
	struct wfs_tmpfile t;
	struct wfs_digest d;
	bool existed = true;

	ck_assert_ptr_nonnull(buf);
	mount_small_tmpfs("size=1m,mode=0755");
	s = open_store(flag_sets[_i]);
	tu_fill(buf, len, 3);
	ck_assert_int_eq(wfs_store_tmp_create(s, &t), 0);
	ck_assert_int_eq(tu_write_all(t.fd, buf, len), -ENOSPC);
	wfs_store_tmp_discard(s, &t);
	ck_assert_int_eq(count_under("objects"), 0);
	ck_assert_int_eq(count_under("tmp"), 0);
	/* The space came back: a small object publishes. */
	ck_assert_int_eq(put(s, buf, 64 * KIB, &d, &existed), 0);
	ck_assert(!existed);
	assert_object(&d, buf, 64 * KIB);
	free(buf);
	wfs_store_close(s);
}
END_TEST

/*
 * publish itself hits ENOSPC: with every inode of the tmpfs used, the object's prefix directory
 * cannot be made. publish returns -ENOSPC, consumes the tmp file, and adds no object.
 */
START_TEST(test_enospc_publish)
{
	struct wfs_store *s;
	struct wfs_tmpfile t;
	struct wfs_digest d;
	char path[700], name[32];
	struct stat st;
	bool existed = true;
	int fd, fillers = 0;

	mount_small_tmpfs("size=1m,nr_inodes=32,mode=0755");
	s = open_store(flag_sets[_i]);
	ck_assert_int_eq(wfs_store_tmp_create(s, &t), 0);
	ck_assert_int_eq(tu_write_all(t.fd, "no room", 7), 0);
	wfs_digest_buf("no room", 7, &d);
	/* Use up the remaining inodes. */
	for (;;) {
		snprintf(name, sizeof(name), "fill%d", fillers);
		spath(path, sizeof(path), name);
		fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
		if (fd < 0)
			break;
		close(fd);
		ck_assert_int_lt(++fillers, 64);
	}
	ck_assert_int_eq(errno, ENOSPC);
	fd = t.fd;
	ck_assert_int_eq(wfs_store_publish(s, &t, &d, true, &existed), -ENOSPC);
	ck_assert(!existed);
	ck_assert_int_eq(t.fd, -1);
	ck_assert(!fd_is_open(fd));
	ck_assert_int_eq(wfs_store_object_stat(s, &d, &st), -ENOENT);
	ck_assert_int_eq(count_under("objects"), 0);
	ck_assert_int_eq(count_under("tmp"), 0);
	wfs_store_close(s);
}
END_TEST

/* ---- runner ---------------------------------------------------------------------------------- */

static bool keep_named_keep(const char *name, void *arg)
{
	(void)arg;
	return strcmp(name, "w.1.keep") == 0;
}

/*
 * wfs_store_tmp_sweep() after the open's own clean-up of STORE/tmp (which walked tmp_fd to its end:
 * a dup shares that offset) still sees every entry: it removes what its rule does not keep (a
 * killed server's named tmp files, keep.h) and leaves the rest.
 */
START_TEST(test_tmp_sweep_after_open)
{
	struct wfs_store *s = open_store(WFS_STORE_CREATE);
	char keep[PATH_MAX], drop[PATH_MAX];
	struct stat st;
	int fd;

	spath(keep, sizeof(keep), "tmp/w.1.keep");
	spath(drop, sizeof(drop), "tmp/w.2.drop");
	fd = open(keep, O_CREAT | O_WRONLY, 0644);
	ck_assert_int_ge(fd, 0);
	close(fd);
	fd = open(drop, O_CREAT | O_WRONLY, 0644);
	ck_assert_int_ge(fd, 0);
	close(fd);
	wfs_store_tmp_sweep(s, keep_named_keep, NULL);
	ck_assert_int_eq(stat(keep, &st), 0);
	ck_assert_msg(stat(drop, &st) != 0 && errno == ENOENT, "tmp/w.2.drop is still there");
	wfs_store_close(s);
}
END_TEST

static TCase *tcase(Suite *s, const char *name)
{
	TCase *tc = tcase_create(name);

	tcase_add_checked_fixture(tc, tmp_setup, tmp_teardown);
	tcase_set_timeout(tc, 60);
	suite_add_tcase(s, tc);
	return tc;
}

static Suite *store_suite(void)
{
	Suite *s = suite_create("store");
	TCase *tc;

	tcase_add_test(tcase(s, "open_creates_layout"), test_open_creates_layout);
	tcase_add_test(tcase(s, "open_missing"), test_open_missing);
	tcase_add_test(tcase(s, "open_not_a_store"), test_open_not_a_store);
	tcase_add_test(tcase(s, "open_create_where"), test_open_create_where);
	tcase_add_test(tcase(s, "open_owner"), test_open_owner);
	tcase_add_test(tcase(s, "open_unclean"), test_open_unclean);
	tc = tcase(s, "open_lock");
	tcase_add_test(tc, test_open_busy);
	tcase_add_test(tc, test_open_busy_other_process);
	tcase_add_test(tcase(s, "open_cleans_tmp"), test_open_cleans_tmp);
	tcase_add_test(tcase(s, "tmp_sweep_after_open"), test_tmp_sweep_after_open);
	tcase_add_test(tcase(s, "readonly"), test_readonly_refuses_writes);
	tcase_add_loop_test(tcase(s, "tmp_discard"), test_tmp_discard, 0, NFLAGS);
	tc = tcase(s, "publish_new");
	tcase_add_loop_test(tc, test_publish_new, 0, NFLAGS);
	tcase_add_loop_test(tc, test_publish_large_and_empty, 0, NFLAGS);
	tcase_add_loop_test(tc, test_publish_named_tmp, 0, NFLAGS);
	tcase_add_loop_test(tcase(s, "publish_existing"), test_publish_existing, 0, NFLAGS);
	tcase_add_loop_test(tcase(s, "publish_error"), test_publish_error_consumes, 0, NFLAGS);
	tc = tcase(s, "object_access");
	tcase_add_loop_test(tc, test_object_access, 0, NFLAGS);
	tcase_add_test(tc, test_object_name);
	tcase_add_loop_test(tc, test_statfs, 0, NFLAGS);
	tc = tcase(s, "publish_race");
	tcase_add_loop_test(tc, test_race_same_content, 0, NFLAGS);
	tcase_add_loop_test(tc, test_race_different_content, 0, NFLAGS);
	tc = tcase_create("enospc");
	tcase_add_checked_fixture(tc, tmp_setup, tmpfs_teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, test_enospc_write, 0, NFLAGS);
	tcase_add_loop_test(tc, test_enospc_publish, 0, NFLAGS);
	suite_add_tcase(s, tc);
	return s;
}

/* Detach every mount below @dir (left by a test that failed with its tmpfs mounted). */
static void umount_below(const char *dir)
{
	size_t n = strlen(dir);
	char line[4096], mnt[4096];
	bool again = true;

	for (int pass = 0; again && pass < 8; pass++) {
		FILE *f = fopen("/proc/self/mounts", "r");

		again = false;
		if (!f)
			return;
		while (fgets(line, sizeof(line), f)) {
			if (sscanf(line, "%*s %4095s", mnt) == 1 && strncmp(mnt, dir, n) == 0 &&
			    mnt[n] == '/' && umount2(mnt, MNT_DETACH) == 0)
				again = true;
		}
		fclose(f);
	}
}

/* A failed tmpfs test may leave its mount: unmount before the run directory is removed. */
static void cleanup(const char *dir)
{
	umount_below(dir);
}

int main(void)
{
	static const struct tu_main_hooks hooks = {.cleanup = cleanup};

	return tu_main("check_store", store_suite(), TU_RUN_DIR, &hooks);
}
