/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Crash safety: the daemon killed (SIGKILL) at every crash point of the write, seal and delete paths
 * (lib/fault.h), and at random moments of a large write; writers killed mid-write. After each crash
 * the store is remounted (after `umount -l`, as after "Transport endpoint is not connected") and
 * checked:
 *   - every name sealed before the crash reads back its exact bytes;
 *   - the name being written holds exactly its old or its new bytes (or, if new, is absent);
 *   - fsck finds no corrupt, missing or orphan object and no catalog inconsistency (the daemon,
 *     started after its killed predecessor, removed the object files whose commit was lost);
 *   - STORE/tmp is empty.
 */
#include "fsck.h"
#include "mountutil.h"

/* The crash points on the paths these tests drive (grep wfs_crashpoint). */
static const char *const points[] = {
	"version.after-pwrite",    "seal.after-digest", "publish.after-fdatasync", "publish.after-link",
	"seal.before-commit",      "seal.after-commit", "delete.after-row",
};
#define NPOINTS ((int)(sizeof(points) / sizeof(points[0])))

static int daemon_status = -1;

/* Has the daemon exited? Its status goes to daemon_status. */
static bool daemon_gone(void)
{
	return daemon_status != -1 || waitpid(mu.daemon, &daemon_status, WNOHANG) == mu.daemon;
}

static void crash_restart(void)
{
	/* The daemon is gone: the mount answers ENOTCONN until lazily unmounted. */
	if (daemon_status == -1)
		waitpid(mu.daemon, &daemon_status, 0);
	ck_assert_msg(WIFSIGNALED(daemon_status) && WTERMSIG(daemon_status) == SIGKILL,
		      "daemon did not die by SIGKILL");
	daemon_status = -1;
	mu.daemon = 0;
	ck_assert_int_eq(umount2(mu.mnt, MNT_DETACH), 0);
	mu.crash_at[0] = '\0';
	mu_daemon_start();
}

/* fsck of the (unmounted) store: nothing corrupt, missing, orphaned or inconsistent; tmp empty. */
static void assert_store_consistent(void)
{
	struct wfs_fsck_options opt = {0};
	struct wfs_fsck_report r;

	mu_daemon_stop();
	ck_assert_int_eq(wfs_fsck(mu.store, &opt, &r), 0);
	ck_assert_msg(r.found[WFS_FSCK_CORRUPT] == 0, "corrupt objects after crash");
	ck_assert_msg(r.found[WFS_FSCK_MISSING] == 0, "names point at missing objects after crash");
	ck_assert_msg(r.found[WFS_FSCK_ORPHAN] == 0, "%llu orphan object files after the restart",
		      (unsigned long long)r.found[WFS_FSCK_ORPHAN]);
	ck_assert_msg(r.found[WFS_FSCK_CATALOG] == 0, "catalog inconsistent after crash");
	ck_assert_msg(r.found[WFS_FSCK_STRAY] == 0 && r.found[WFS_FSCK_MODE] == 0, "stray or writable object");
	ck_assert_msg(r.found[WFS_FSCK_TMP] == 0, "tmp leftovers after remount");
	mu_daemon_start();
}

/* @p gets @len bytes of @buf through writes the daemon serves (no O_TRUNC: ftruncate instead). */
static void write_daemon_served(const char *p, const unsigned char *buf, size_t len)
{
	int fd = open(p, O_WRONLY | O_CREAT, 0644);

	if (fd < 0)
		return;
	if (ftruncate(fd, 0) == 0)
		(void)tu_write_all(fd, buf, len);
	close(fd);
}

/* Either absent or exactly @want. */
static void assert_absent_or(const char *p, const unsigned char *want, size_t len)
{
	if (access(p, F_OK) != 0) {
		ck_assert_int_eq(errno, ENOENT);
		return;
	}
	mu_assert_file_equals(p, want, len);
}

/* Exactly @a or exactly @b. */
static void assert_one_of(const char *p, const unsigned char *a, const unsigned char *b, size_t len)
{
	unsigned char *got = malloc(len + 1);
	int fd = open(p, O_RDONLY);
	ssize_t n;

	ck_assert_msg(fd >= 0, "open %s: %s", p, strerror(errno));
	n = pread(fd, got, len + 1, 0);
	close(fd);
	ck_assert_int_eq(n, (ssize_t)len);
	ck_assert_msg(memcmp(got, a, len) == 0 || memcmp(got, b, len) == 0, "%s: neither old nor new bytes", p);
	free(got);
}

/*
 * Daemon killed at crash point _i while: a new name is written, an existing name is rewritten,
 * and a name whose object nothing else uses is unlinked (in that order, so later points on
 * the same path are reached by later operations).
 */
START_TEST(daemon_killed_at_crash_point)
{
	size_t len = 3 << 20; /* larger than what versions keep in memory: the tmp file is used */
	unsigned char *keep = mu_pattern(len, 20), *old = mu_pattern(len, 21), *new = mu_pattern(len, 22),
		      *gone = mu_pattern(len, 23);
	const char *point = points[_i];

	ck_assert_int_eq(mu_write_file(mu_path("keep"), keep, len), 0);
	ck_assert_int_eq(mu_write_file(mu_path("target"), old, len), 0);
	ck_assert_int_eq(mu_write_file(mu_path("gone"), gone, len), 0);
	mu_daemon_stop();
	snprintf(mu.crash_at, sizeof(mu.crash_at), "%s", point);
	mu_daemon_start();

	/* Each step may fail with ENOTCONN once the daemon has died. The daemon's own pwrite is
	 * reached only where it serves the writes: not through an O_TRUNC open, which the kernel may
	 * write itself (passthrough), so those writes open, then truncate. */
	if (strcmp(point, "version.after-pwrite") == 0) {
		write_daemon_served(mu_path("fresh"), new, len);
		write_daemon_served(mu_path("target"), new, len);
	} else {
		mu_write_file(mu_path("fresh"), new, len);
		mu_write_file(mu_path("target"), new, len);
	}
	unlink(mu_path("gone"));
	/* An unlinked object goes when the kernel forgets the inode, which may come a little later. */
	MU_EVENTUALLY(daemon_gone());
	crash_restart();

	mu_assert_file_equals(mu_path("keep"), keep, len);
	assert_absent_or(mu_path("fresh"), new, len);
	assert_one_of(mu_path("target"), old, new, len);
	assert_absent_or(mu_path("gone"), gone, len);
	assert_store_consistent();
	/* The store works normally afterwards. */
	ck_assert_int_eq(mu_write_file(mu_path("after"), old, len), 0);
	mu_assert_file_equals(mu_path("after"), old, len);
	free(keep);
	free(old);
	free(new);
	free(gone);
}
END_TEST

/* SIGKILL from outside at a random moment of a 64 MiB write, several times. */
START_TEST(daemon_killed_mid_write)
{
	size_t chunk = 1 << 20, len = 64 << 20;
	unsigned char *keep = mu_pattern(chunk, 30), *big = mu_pattern(len, 31);
	unsigned seed = (unsigned)time(NULL);

	ck_assert_int_eq(mu_write_file(mu_path("keep"), keep, chunk), 0);
	mu_sync(); /* a small file's seal is committed with the next batch: now */
	for (int round = 0; round < 4; round++) {
		pid_t writer = fork();

		ck_assert_int_ge(writer, 0);
		if (writer == 0) {
			_exit(mu_write_file(mu_path("big"), big, len) == 0 ? 0 : 1);
		}
		usleep(1000 * (useconds_t)(rand_r(&seed) % 300));
		kill(mu.daemon, SIGKILL);
		waitpid(writer, NULL, 0);
		crash_restart();
		mu_assert_file_equals(mu_path("keep"), keep, chunk);
		assert_absent_or(mu_path("big"), big, len);
		unlink(mu_path("big"));
	}
	assert_store_consistent();
	free(keep);
	free(big);
}
END_TEST

/* A writer killed mid-write seals nothing: a new name is gone at once, an old one keeps its bytes. */
START_TEST(writer_killed)
{
	size_t len = 2 << 20;
	unsigned char *old = mu_pattern(len, 40), *new = mu_pattern(len, 41);

	ck_assert_int_eq(mu_write_file(mu_path("existing"), old, len), 0);
	for (int i = 0; i < 2; i++) {
		pid_t writer = fork();

		ck_assert_int_ge(writer, 0);
		if (writer == 0) {
			int fd = open(mu_path(i ? "existing" : "new"), O_WRONLY | O_CREAT | O_TRUNC, 0644);

			if (fd < 0 || write(fd, new, len / 2) != (ssize_t)(len / 2))
				_exit(1);
			kill(getpid(), SIGKILL);
		}
		waitpid(writer, NULL, 0);
	}
	ck_assert_int_eq(open(mu_path("new"), O_RDONLY), -1);
	ck_assert_int_eq(errno, ENOENT);
	mu_assert_file_equals(mu_path("existing"), old, len);
	/* And after a remount; rewriting works. */
	mu_daemon_stop();
	mu_daemon_start();
	ck_assert_int_eq(access(mu_path("new"), F_OK), -1);
	ck_assert_int_eq(mu_write_file(mu_path("new"), new, len), 0);
	mu_assert_file_equals(mu_path("new"), new, len);
	free(old);
	free(new);
}
END_TEST

/*
 * Batched commits (fs/core/commit.h): the daemon killed moments after a run of creates and renames.
 * A file whose writer called fsync(2) before close(2) is there with its bytes; of the changes after
 * it, a prefix survives, in order: when name i exists, every name before it does.
 */
START_TEST(daemon_killed_after_batched_changes)
{
	size_t len = 64 << 10;
	unsigned char *bytes = mu_pattern(len, 50);
	char name[32], to[32];
	int n = 300;
	bool done;

	for (int round = 0; round < 3; round++) {
		int fd = open(mu_path("sealed"), O_CREAT | O_WRONLY | O_TRUNC, 0644);

		ck_assert_int_ge(fd, 0);
		ck_assert_int_eq(write(fd, bytes, len), (ssize_t)len);
		ck_assert_int_eq(fsync(fd), 0);
		ck_assert_int_eq(close(fd), 0);
		for (int i = 0; i < n; i++) {
			snprintf(name, sizeof(name), "e%d.%03d", round, i);
			snprintf(to, sizeof(to), "r%d.%03d", round, i);
			ck_assert_int_eq(mu_write_file(mu_path(name), NULL, 0), 0);
			ck_assert_int_eq(rename(mu_path(name), mu_path(to)), 0);
		}
		kill(mu.daemon, SIGKILL);
		crash_restart();
		mu_assert_file_equals(mu_path("sealed"), bytes, len);
		/* The changes were: create e.i, rename it to r.i, for i in order. A prefix of them
		 * survives: r.* up to some point, then perhaps one e.*, then nothing. */
		done = false;
		for (int i = 0; i < n; i++) {
			bool renamed, created;

			snprintf(name, sizeof(name), "e%d.%03d", round, i);
			snprintf(to, sizeof(to), "r%d.%03d", round, i);
			renamed = access(mu_path(to), F_OK) == 0;
			created = access(mu_path(name), F_OK) == 0;
			ck_assert_msg(!(renamed && created), "%s exists under both names", name);
			ck_assert_msg(!done || (!renamed && !created), "%s survived a crash that an earlier change did not",
				      renamed ? to : name);
			if (!renamed)
				done = true;
		}
		unlink(mu_path("sealed"));
	}
	assert_store_consistent();
	free(bytes);
}
END_TEST

/*
 * A tensor sealed on a wrong declared digest, the daemon killed after the object's link and before
 * its commit: the object file is there, unlisted, its bytes never read. A daemon with -o
 * verify=none still reads such an object before anything uses it: a claim of that digest is
 * refused (ENODATA), and a write of the declared content under another name stores its own bytes.
 */
START_TEST(declared_lie_killed_before_commit)
{
	size_t len = 8u << 20;
	unsigned char *a, *b;
	char hb[WFS_DIGEST_HEX_CHARS + 1];
	struct wfs_digest db, got;
	int fd;

	if (!mu_passthrough_mode())
		return; /* no declaration is taken without passthrough */
	a = mu_pattern(len, 41);
	b = mu_pattern(len, 42);
	wfs_digest_buf(b, len, &db);
	wfs_digest_to_hex(&db, hb);
	mu_create_tensor("lie", "[2097152]", "F32");
	mu_daemon_stop();
	snprintf(mu.crash_at, sizeof(mu.crash_at), "seal.before-commit"); /* the lie's seal is the next */
	mu_daemon_start();
	mu_write_tensor("lie", a, len, hb, false);
	for (int i = 0; i < 500 && !daemon_gone(); i++)
		usleep(10 * 1000);
	snprintf(mu.opts, sizeof(mu.opts), "verify=none");
	crash_restart();

	fd = open(mu_path("claimed"), O_WRONLY | O_CREAT | O_EXCL, 0644);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fsetxattr(fd, "user.weightfs.claim", hb, WFS_DIGEST_HEX_CHARS, 0), -1);
	ck_assert_int_eq(errno, ENODATA);
	ck_assert_int_eq(close(fd), 0);
	mu_create_tensor("honest", "[2097152]", "F32");
	mu_write_tensor("honest", b, len, NULL, false);
	mu_digest_xattr(mu_path("honest"), &got);
	ck_assert(wfs_digest_equal(&got, &db));
	mu_assert_file_equals(mu_path("honest"), b, len);
	free(a);
	free(b);
}
END_TEST

static Suite *crash_suite(void)
{
	Suite *s = suite_create("crash");
	TCase *tc;

	tc = tcase_create("daemon_killed_at_crash_point");
	tcase_add_checked_fixture(tc, mu_setup, mu_teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, daemon_killed_at_crash_point, 0, NPOINTS);
	suite_add_tcase(s, tc);

	tc = tcase_create("daemon_killed_mid_write");
	tcase_add_checked_fixture(tc, mu_setup, mu_teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, daemon_killed_mid_write);
	suite_add_tcase(s, tc);

	tc = tcase_create("writer_killed");
	tcase_add_checked_fixture(tc, mu_setup, mu_teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, writer_killed);
	suite_add_tcase(s, tc);

	tc = tcase_create("daemon_killed_after_batched_changes");
	tcase_add_checked_fixture(tc, mu_setup, mu_teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, daemon_killed_after_batched_changes);
	suite_add_tcase(s, tc);

	tc = tcase_create("declared_lie_killed_before_commit");
	tcase_add_checked_fixture(tc, mu_setup, mu_teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, declared_lie_killed_before_commit);
	suite_add_tcase(s, tc);
	return s;
}

static int announce(SRunner *sr)
{
	(void)sr;
	printf("check_crash: passthrough=%s, %d crash points\n", mu_mode(), NPOINTS);
	return 0;
}

int main(void)
{
	static const struct tu_main_hooks hooks = {.root_why = "FUSE mounts", .prepare = announce};

	return tu_main("check_crash", crash_suite(), TU_NEEDS_ROOT, &hooks);
}
