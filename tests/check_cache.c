/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lib/cache.c without a mount: page placement of a read under a NUMA preference (the memory policy
 * in force during the read, and the node of the pages it cached), and residency of a plain file.
 * On a machine of one node the only node is 0: the test checks the policy and that move_pages says 0.
 */
#include <numa.h>
#include <numaif.h>

#include "cache.h"
#include "testutil.h"

#define FILE_BYTES (8u << 20)

/* A file of FILE_BYTES + 100 bytes (a partial last page), out of the page cache. Returns its fd. */
static int make_file(uint64_t *bytes)
{
	char path[600];
	void *buf = malloc(FILE_BYTES + 100);
	int fd;

	ck_assert_ptr_nonnull(buf);
	tu_fill(buf, FILE_BYTES + 100, 7);
	tu_path(path, sizeof(path), tu_test_dir, "obj");
	ck_assert_int_eq(tu_write_file(path, buf, FILE_BYTES + 100, 0600), 0);
	free(buf);
	fd = open(path, O_RDONLY);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fdatasync(fd), 0);
	ck_assert_int_eq(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
	*bytes = FILE_BYTES + 100;
	return fd;
}

static void check_placed(int fd, uint64_t bytes, int node)
{
	struct wfs_cache_residency r;

	memset(&r, 0, sizeof(r));
	ck_assert_int_eq(wfs_cache_residency_fd(fd, bytes, true, &r), 0);
	ck_assert_uint_eq(r.bytes, bytes);
	ck_assert_uint_eq(r.resident_bytes, bytes);
	ck_assert_uint_eq(r.node_bytes[node], bytes);
	ck_assert_uint_eq(r.unknown_node_bytes, 0);
}

START_TEST(test_read_preferred)
{
	int mode = -1, node = -1, now_mode = -1, fd;
	uint64_t bytes;

	if (numa_available() < 0)
		return; /* no NUMA support in this kernel: nothing to place */
	fd = make_file(&bytes);
	ck_assert_int_eq(wfs_cache_read_fd(fd, bytes, 0, WFS_CACHE_PREFERRED, &mode, &node), 0);
	ck_assert_int_eq(mode, MPOL_PREFERRED);
	ck_assert_int_eq(node, 0);
	/* The thread's own policy is given back after the read. */
	ck_assert_int_eq(get_mempolicy(&now_mode, NULL, 0, NULL, 0), 0);
	ck_assert_int_eq(now_mode, MPOL_DEFAULT);
	check_placed(fd, bytes, 0);
	close(fd);
}
END_TEST

START_TEST(test_read_bind)
{
	int mode = -1, node = -1, fd;
	uint64_t bytes;

	if (numa_available() < 0)
		return;
	fd = make_file(&bytes);
	ck_assert_int_eq(wfs_cache_read_fd(fd, bytes, numa_max_node(), WFS_CACHE_BIND, &mode, &node), 0);
	ck_assert_int_eq(mode, MPOL_BIND);
	ck_assert_int_eq(node, numa_max_node());
	check_placed(fd, bytes, numa_max_node());
	close(fd);
}
END_TEST

START_TEST(test_read_unbound_and_errors)
{
	struct wfs_cache_residency r;
	int mode = -1, node = 5, fd;
	uint64_t bytes;

	fd = make_file(&bytes);
	memset(&r, 0, sizeof(r));
	ck_assert_int_eq(wfs_cache_residency_fd(fd, bytes, false, &r), 0);
	ck_assert_uint_eq(r.resident_bytes, 0);
	ck_assert_int_eq(wfs_cache_read_fd(fd, bytes, -1, WFS_CACHE_PREFERRED, &mode, &node), 0);
	ck_assert_int_eq(mode, MPOL_DEFAULT);
	ck_assert_int_eq(node, -1);
	memset(&r, 0, sizeof(r));
	ck_assert_int_eq(wfs_cache_residency_fd(fd, bytes, false, &r), 0);
	ck_assert_uint_eq(r.resident_bytes, bytes); /* the partial last page counts its 100 bytes */
	if (numa_available() >= 0)
		ck_assert_int_eq(wfs_cache_read_fd(fd, bytes, numa_max_node() + 1, WFS_CACHE_PREFERRED, NULL, NULL),
				 -EINVAL);
	ck_assert_int_eq(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
	memset(&r, 0, sizeof(r));
	ck_assert_int_eq(wfs_cache_residency_fd(fd, bytes, true, &r), 0);
	ck_assert_uint_eq(r.resident_bytes, 0);
	close(fd);
}
END_TEST

START_TEST(test_set_outside_mount)
{
	struct wfs_cache_set *set = NULL;
	char err[256] = "";

	ck_assert_int_eq(wfs_cache_set_new(&set), 0);
	ck_assert_int_eq(wfs_cache_set_add(set, tu_test_dir, err, sizeof(err)), -EMEDIUMTYPE);
	ck_assert_ptr_nonnull(strstr(err, "not on a weightfs mount"));
	ck_assert_int_eq(wfs_cache_set_add(set, "/nonexistent/x", err, sizeof(err)), -ENOENT);
	ck_assert_uint_eq(wfs_cache_set_groups(set), 0);
	wfs_cache_set_free(set);
}
END_TEST

/* The node a task runs on: this process's is the node of its CPU (node 0 on a one-node machine). */
START_TEST(test_node_of_task)
{
	int node = wfs_cache_node_of_task(getpid());

	if (numa_available() < 0) {
		ck_assert_int_eq(node, -1);
		return;
	}
	ck_assert_int_ge(node, 0);
	ck_assert_int_le(node, numa_max_node());
	if (numa_max_node() == 0)
		ck_assert_int_eq(node, 0);
	ck_assert_int_eq(wfs_cache_node_of_task(0), -1);
	ck_assert_int_eq(wfs_cache_node_of_task(999999999), -1); /* no such task */
}
END_TEST

static Suite *cache_suite(void)
{
	Suite *s = suite_create("cache");
	TCase *tc = tcase_create("placement");

	tcase_add_checked_fixture(tc, tu_test_dir_setup, tu_test_dir_teardown);
	tcase_add_test(tc, test_read_preferred);
	tcase_add_test(tc, test_read_bind);
	tcase_add_test(tc, test_read_unbound_and_errors);
	tcase_add_test(tc, test_set_outside_mount);
	tcase_add_test(tc, test_node_of_task);
	tcase_set_timeout(tc, 30);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tu_main("check_cache", cache_suite(), TU_RUN_DIR, NULL);
}
