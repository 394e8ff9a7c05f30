/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The mount harness: helpers for the Check suites that run a real weightfs daemon (check_mount,
 * check_crash). Root only: it mounts FUSE and tmpfs and unmounts with umount2(2).
 *
 * Each test gets its own daemon on its own temporary store. mu_setup(), installed as a checked
 * fixture (tcase_add_checked_fixture(tc, mu_setup, mu_teardown), so it runs in the test's forked
 * process), makes $TMPDIR/wfs-mount-XXXXXX (TMPDIR unset: /tmp) and starts
 * "$WFS_BUILD/weightfs DIR/store DIR/mnt -f -o passthrough=MODE,nosync" ($WFS_BUILD unset: build);
 * the daemon makes the store on that first mount. MODE is $WFS_TEST_PASSTHROUGH, auto (the default)
 * or off (mu_mode(), mu_passthrough_mode()); tests/run-tests runs check_mount once per mode.
 * mu_daemon_start() returns once DIR/mnt is mounted and fails the test if the daemon exits first
 * or has not mounted after 5 s. The daemon's stderr goes to DIR/daemon.log (mu_log_count()); it runs
 * in a process group of its own with SIGTERM as its parent-death signal, so a failing test (which
 * Check ends with _exit()) takes it down and it unmounts instead of leaving a dead mount.
 *
 * All state is in the static struct mu_mount mu: the paths, the daemon's pid, and what the next
 * mu_daemon_start() passes on: mu.crash_at, mu.fault and mu.delay become WFS_CRASH_AT, WFS_FAULT and WFS_DELAY
 * (lib/fault.h; both removed from its environment when empty), mu.opts extra -o options ("sync"
 * there replaces the default nosync). mu_setup() clears those three; a test sets them and restarts
 * the daemon (mu_daemon_stop(), mu_daemon_start()). mu_tmpfs_store() restarts it on a fresh store on
 * a small tmpfs, for ENOSPC.
 *
 * mu_teardown() stops the daemon (unmount, up to 5 s for it to exit, then SIGKILL), lazily detaches
 * a mount whose daemon died and a tmpfs or ext4 store, and removes DIR. It asserts nothing, neither the
 * daemon's exit status nor its log: a test checks what it needs before it returns.
 *
 * Names are prefixed mu_ (macros MU_) so they never collide with a suite's own statics or with
 * testutil.h's tu_. All are static inline; header-only, each suite is one file.
 */
#ifndef WFS_MOUNTUTIL_H
#define WFS_MOUNTUTIL_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/prctl.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "digest.h"
#include "store.h"
#include "testutil.h"


struct mu_mount {
	char dir[200];   /* test directory */
	char store[256];
	char mnt[256];
	pid_t daemon;
	char crash_at[96]; /* WFS_CRASH_AT for the next mu_daemon_start(), or "" */
	char fault[96];    /* WFS_FAULT for the next mu_daemon_start(), or "" */
	char delay[96];    /* WFS_DELAY for the next mu_daemon_start(), or "" */
	char opts[96];     /* extra -o options for the next mu_daemon_start(), or "" */
};

static struct mu_mount mu;

static inline const char *mu_mode(void)
{
	const char *m = getenv("WFS_TEST_PASSTHROUGH");

	return m ? m : "auto";
}

static inline bool mu_passthrough_mode(void)
{
	return strcmp(mu_mode(), "off") != 0;
}

/*
 * Do creates and O_TRUNC opens write through the kernel (-o passthrough_writes=all, the default, in
 * passthrough mode)? Their seal is then at the release, after close(2) returned, and write(2) errors
 * (ENOSPC) come from the kernel, not the daemon.
 */
static inline bool mu_kernel_writes(void)
{
	const char *extra = getenv("WFS_TEST_OPTS") ? getenv("WFS_TEST_OPTS") : "";

	return mu_passthrough_mode() && !strstr(extra, "passthrough_writes=off") &&
	       !strstr(extra, "passthrough_writes=tensors") && !strstr(mu.opts, "passthrough_writes=off") &&
	       !strstr(mu.opts, "passthrough_writes=tensors");
}

static inline char *mu_path(const char *name)
{
	static char buf[4][PATH_MAX];
	static int i;
	char *p = buf[i++ % 4];

	snprintf(p, PATH_MAX, "%s/%s", mu.mnt, name);
	return p;
}

static inline bool mu_is_mounted(const char *dir)
{
	struct stat a, b;
	char parent[PATH_MAX + 4];

	snprintf(parent, sizeof(parent), "%s/..", dir);
	return stat(dir, &a) == 0 && stat(parent, &b) == 0 && a.st_dev != b.st_dev;
}

static inline void mu_daemon_start(void)
{
	const char *build = getenv("WFS_BUILD") ? getenv("WFS_BUILD") : "build";
	char bin[PATH_MAX], opts[256];

	snprintf(bin, sizeof(bin), "%s/weightfs", build);
	char list[sizeof(mu.opts) + 2];
	bool sync;

	/* nosync unless the test asks for sync: the daemon refuses both at once. */
	snprintf(list, sizeof(list), ",%s,", mu.opts);
	sync = strstr(list, ",sync,") != NULL || strstr(list, ",sync=") != NULL;
	/* $WFS_TEST_OPTS: options every mount of the run adds (a variant under study). */
	const char *extra = getenv("WFS_TEST_OPTS") ? getenv("WFS_TEST_OPTS") : "";

	snprintf(opts, sizeof(opts), "passthrough=%s%s%s%s%s%s", mu_mode(), sync ? "" : ",nosync", mu.opts[0] ? "," : "",
		 mu.opts, extra[0] ? "," : "", extra);
	mu.daemon = fork();
	ck_assert_int_ge(mu.daemon, 0);
	if (mu.daemon == 0) {
		char log[300];
		int fd;

		/* Check ends a test that fails with _exit() and kills its process group: in a group of
		 * its own the daemon survives that, and the test's death sends it SIGTERM, on which it
		 * unmounts (no dead mount left behind under /tmp). */
		setpgid(0, 0);
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (getppid() == 1)
			_exit(1); /* the test died before prctl */

		snprintf(log, sizeof(log), "%s/daemon.log", mu.dir);
		fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd >= 0)
			dup2(fd, STDERR_FILENO);
		if (mu.crash_at[0])
			setenv("WFS_CRASH_AT", mu.crash_at, 1);
		else
			unsetenv("WFS_CRASH_AT");
		if (mu.fault[0])
			setenv("WFS_FAULT", mu.fault, 1);
		else
			unsetenv("WFS_FAULT");
		if (mu.delay[0])
			setenv("WFS_DELAY", mu.delay, 1);
		else
			unsetenv("WFS_DELAY");
		execl(bin, "weightfs", mu.store, mu.mnt, "-f", "-o", opts, (char *)NULL);
		perror(bin);
		_exit(127);
	}
	for (int i = 0; i < 500 && !mu_is_mounted(mu.mnt); i++) {
		int st;

		if (waitpid(mu.daemon, &st, WNOHANG) == mu.daemon)
			ck_abort_msg("weightfs exited before mounting (status %d)", st);
		usleep(10000);
	}
	ck_assert_msg(mu_is_mounted(mu.mnt), "%s not mounted after 5 s", mu.mnt);
}

static inline void mu_daemon_stop(void)
{
	int st;

	if (mu.daemon <= 0)
		return;
	if (umount2(mu.mnt, 0) < 0)
		umount2(mu.mnt, MNT_DETACH);
	for (int i = 0; i < 500; i++) {
		if (waitpid(mu.daemon, &st, WNOHANG) == mu.daemon) {
			mu.daemon = 0;
			return;
		}
		usleep(10000);
	}
	kill(mu.daemon, SIGKILL);
	waitpid(mu.daemon, &st, 0);
	mu.daemon = 0;
}

static inline void mu_setup(void)
{
	mu.crash_at[0] = mu.fault[0] = mu.delay[0] = mu.opts[0] = '\0';
	const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";

	snprintf(mu.dir, sizeof(mu.dir), "%s/wfs-mount-XXXXXX", tmp);
	ck_assert_ptr_nonnull(mkdtemp(mu.dir));
	snprintf(mu.store, sizeof(mu.store), "%s/store", mu.dir);
	snprintf(mu.mnt, sizeof(mu.mnt), "%s/mnt", mu.dir);
	ck_assert_int_eq(mkdir(mu.mnt, 0755), 0);
	mu_daemon_start();
}

static inline void mu_teardown(void)
{
	char cmd[256 + 32];

	mu_daemon_stop();
	umount2(mu.mnt, MNT_DETACH);   /* a mount whose daemon died */
	umount2(mu.store, MNT_DETACH); /* tmpfs and ext4 stores */
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", mu.dir);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", mu.dir);
}

/*
 * Restart the daemon on a fresh store on a tmpfs of @size (mount(8)'s size=, e.g. "4m"): a store
 * filesystem that fills up. mu_teardown() unmounts it.
 */
static inline void mu_tmpfs_store(const char *size)
{
	char cmd[300], opts[64];

	mu_daemon_stop();
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", mu.store);
	ck_assert_int_eq(system(cmd), 0);
	ck_assert_int_eq(mkdir(mu.store, 0700), 0);
	snprintf(opts, sizeof(opts), "size=%s", size);
	ck_assert_msg(mount("tmpfs", mu.store, "tmpfs", 0, opts) == 0, "mount tmpfs: %s", strerror(errno));
	mu_daemon_start();
}

/*
 * Restart the daemon on a fresh store on an ext4 filesystem of @size (truncate(1)'s size, e.g.
 * "160M") in a loop-mounted image file under the test's directory: ext4 keeps blocks that even root
 * cannot write (its reserved clusters, up to 4,096; f_bfree counts them, f_bavail does not), so a
 * write fails with ENOSPC while statfs(2) still shows free blocks, which a tmpfs never does.
 * mu_teardown() unmounts it (the image goes with the directory). Needs mkfs.ext4 and loop devices.
 */
static inline void mu_ext4_store(const char *size)
{
	char cmd[4 * sizeof(mu.store) + 3 * sizeof(mu.dir) + 200];

	mu_daemon_stop();
	snprintf(cmd, sizeof(cmd), "rm -rf '%s' && mkdir -m 0700 '%s' && truncate -s %s '%s/store.img' && "
		 "mkfs.ext4 -q -F '%s/store.img' && mount -o loop '%s/store.img' '%s' && chmod 0700 '%s'",
		 mu.store, mu.store, size, mu.dir, mu.dir, mu.dir, mu.store, mu.store);
	ck_assert_msg(system(cmd) == 0, "an ext4 store of %s (mkfs.ext4, mount -o loop) could not be made", size);
	mu_daemon_start();
}

/*
 * fsync(2) of the mount's root directory: the daemon commits its batch of changes and makes every
 * seal durable (fs/core/commit.h). Before a test kills the daemon, for what must survive.
 */
static inline void mu_sync(void)
{
	int fd = open(mu.mnt, O_RDONLY | O_DIRECTORY);

	ck_assert_msg(fd >= 0, "open %s: %s", mu.mnt, strerror(errno));
	ck_assert_msg(fsync(fd) == 0, "fsync %s: %s", mu.mnt, strerror(errno));
	close(fd);
}

/*
 * After a close(2) of @p that returned 0: wait until its seal is done (written through the kernel,
 * the seal is at the release, after close(2) returned). Returns 0 (sealed), or what the name says of
 * a seal that failed: -EIO (never sealed) or -ENOENT (removed). Up to 10 s, then -ETIMEDOUT.
 */
static inline int mu_await_seal(const char *p)
{
	char hex[WFS_DIGEST_HEX_CHARS + 1];

	for (int i = 0; i < 10000; i++) {
		int fd;

		if (getxattr(p, "user.weightfs.digest", hex, sizeof(hex)) == WFS_DIGEST_HEX_CHARS)
			return 0;
		if (errno != ENODATA)
			return -errno; /* EIO: its object is damaged */
		fd = open(p, O_RDONLY);
		if (fd < 0)
			return -errno; /* EIO: never sealed (the seal failed); ENOENT: removed */
		close(fd);
		usleep(1000);
	}
	return -ETIMEDOUT;
}

/*
 * Write @len bytes to @p (create/truncate) and close; returns close(2)'s result as -errno or 0, and
 * where the kernel wrote the bytes (mu_kernel_writes()) what became of the seal (mu_await_seal()).
 */
static inline int mu_write_file(const char *p, const void *buf, size_t len)
{
	int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	size_t done = 0;
	int ret = 0;

	if (fd < 0)
		return -errno;
	while (done < len) {
		ssize_t n = write(fd, (const char *)buf + done, len - done);

		if (n < 0) {
			ret = -errno;
			break;
		}
		done += (size_t)n;
	}
	if (close(fd) < 0 && ret == 0)
		ret = -errno;
	if (ret == 0 && mu_kernel_writes())
		ret = mu_await_seal(p);
	return ret;
}

static inline unsigned char *mu_pattern(size_t len, uint32_t seed)
{
	unsigned char *buf = malloc(len ? len : 1);

	ck_assert_ptr_nonnull(buf);
	tu_fill(buf, len, seed);
	return buf;
}

/* Does the file at @p hold @len bytes equal to @want? A failure names the first byte that differs
 * and the caller's line (the assertion's own line is this helper's). */
#define mu_assert_file_equals(p, want, len) mu_assert_file_equals_at((p), (want), (len), __LINE__)
static inline void mu_assert_file_equals_at(const char *p, const unsigned char *want, size_t len, int line)
{
	int fd = open(p, O_RDONLY);
	unsigned char *got = malloc(len + 1);
	size_t at = 0;
	ssize_t n;

	ck_assert_msg(fd >= 0, "open %s (line %d): %s", p, line, strerror(errno));
	n = pread(fd, got, len + 1, 0);
	ck_assert_msg(n == (ssize_t)len, "%s (line %d): %zd bytes read, want %zu", p, line, n, len);
	while (at < len && got[at] == want[at])
		at++;
	ck_assert_msg(at == len, "%s (line %d): bytes differ from byte %zu on (0x%02x, want 0x%02x)", p, line, at,
		      at < len ? got[at] : 0, at < len ? want[at] : 0);
	close(fd);
	free(got);
}

/* A new tensor file @name (mode 0644) with user.weightfs.shape @shape and .dtype @dtype, closed
 * before any byte, as lib/tensorfile.h makes one: its next writable open is passthrough. */
static inline void mu_create_tensor(const char *name, const char *shape, const char *dtype)
{
	int fd = open(mu_path(name), O_WRONLY | O_CREAT | O_EXCL, 0644);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fsetxattr(fd, "user.weightfs.shape", shape, strlen(shape), 0), 0);
	ck_assert_int_eq(fsetxattr(fd, "user.weightfs.dtype", dtype, strlen(dtype), 0), 0);
	ck_assert_int_eq(close(fd), 0);
}

/* Write @len bytes of @data to tensor @name (made by mu_create_tensor()) through a second open, as
 * lib/tensorfile.h does, declaring @hex (32 hex digits; NULL: none) as their digest before close(2);
 * with @second_writer another writable descriptor is open meanwhile. */
static inline void mu_write_tensor(const char *name, const unsigned char *data, size_t len,
				   const char *hex, bool second_writer)
{
	int fd = open(mu_path(name), O_WRONLY), fd2 = -1;

	ck_assert_msg(fd >= 0, "open %s for writing: %s", name, strerror(errno));
	if (second_writer) {
		fd2 = open(mu_path(name), O_WRONLY);
		ck_assert_int_ge(fd2, 0);
	}
	ck_assert_int_eq(tu_write_all(fd, data, len), 0);
	if (hex)
		ck_assert_int_eq(fsetxattr(fd, "user.weightfs.digest", hex, WFS_DIGEST_HEX_CHARS, 0), 0);
	if (fd2 >= 0)
		ck_assert_int_eq(close(fd2), 0);
	ck_assert_int_eq(close(fd), 0);
}

static inline void mu_digest_xattr(const char *p, struct wfs_digest *d)
{
	char hex[WFS_DIGEST_HEX_CHARS + 1] = {0};
	ssize_t n = getxattr(p, "user.weightfs.digest", hex, sizeof(hex) - 1);

	ck_assert_msg(n == WFS_DIGEST_HEX_CHARS, "getxattr digest %s: %zd (%s)", p, n, strerror(errno));
	ck_assert_int_eq(wfs_digest_from_hex(hex, d), 0);
}

/* The digest of @p into *@d, if it has one now (sealed): for MU_EVENTUALLY. */
static inline bool mu_has_digest(const char *p, struct wfs_digest *d)
{
	char hex[WFS_DIGEST_HEX_CHARS + 1] = {0};

	return getxattr(p, "user.weightfs.digest", hex, sizeof(hex) - 1) == WFS_DIGEST_HEX_CHARS &&
	       wfs_digest_from_hex(hex, d) == 0;
}

static inline bool mu_object_exists(const struct wfs_digest *d)
{
	char name[34], p[400];

	wfs_store_object_name(d, name);
	snprintf(p, sizeof(p), "%s/objects/%s", mu.store, name);
	return access(p, F_OK) == 0;
}

static inline int mu_count_objects(void)
{
	char p[300];
	DIR *top, *sub;
	struct dirent *e, *f;
	int n = 0;

	snprintf(p, sizeof(p), "%s/objects", mu.store);
	top = opendir(p);
	ck_assert_ptr_nonnull(top);
	while ((e = readdir(top)) != NULL) {
		char sp[600];

		if (e->d_name[0] == '.')
			continue;
		snprintf(sp, sizeof(sp), "%s/%s", p, e->d_name);
		sub = opendir(sp);
		if (!sub)
			continue;
		while ((f = readdir(sub)) != NULL)
			n += f->d_name[0] != '.';
		closedir(sub);
	}
	closedir(top);
	return n;
}

/* Poll @cond for up to 3 s: forget and release reach the daemon asynchronously. */
#define MU_EVENTUALLY(cond)                                       \
	do {                                                      \
		for (int _i = 0; _i < 300 && !(cond); _i++)       \
			usleep(10000);                            \
		ck_assert_msg((cond), "still false after 3 s: %s", #cond); \
	} while (0)

/* Lines of the daemon's log containing @needle. */
static inline int mu_log_count(const char *needle)
{
	char p[300], line[1024];
	FILE *f;
	int n = 0;

	snprintf(p, sizeof(p), "%s/daemon.log", mu.dir);
	f = fopen(p, "r");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, needle) != NULL;
	fclose(f);
	return n;
}

/* Change object @d's bytes behind the daemon's back (@how: 0 flip a byte, 1 truncate, 2 delete). */
static inline void mu_damage_object(const struct wfs_digest *d, int how)
{
	char name[34], op[400];
	int fd;

	wfs_store_object_name(d, name);
	snprintf(op, sizeof(op), "%s/objects/%s", mu.store, name);
	if (how == 2) {
		ck_assert_int_eq(unlink(op), 0);
		return;
	}
	ck_assert_int_eq(chmod(op, 0644), 0);
	fd = open(op, O_RDWR);
	ck_assert_int_ge(fd, 0);
	if (how == 0) {
		unsigned char b;

		ck_assert_int_eq(pread(fd, &b, 1, 1000), 1);
		b ^= 0x01;
		ck_assert_int_eq(pwrite(fd, &b, 1, 1000), 1);
	} else {
		ck_assert_int_eq(ftruncate(fd, 999), 0);
	}
	close(fd);
	chmod(op, 0444);
}

#endif
