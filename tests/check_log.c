/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Check suite for lib/log: the UTC time the fatal-signal handler writes without gmtime(3) (golden
 * dates, then gmtime_r(3) as the reference over a sweep), the line a fatal signal leaves in the
 * log file, a burst limit's lines and the count a flush tells, and control characters written as
 * escapes.
 */
#include <errno.h>
#include <fcntl.h>
#include <regex.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "testutil.h"

static const struct {
	int64_t seconds;
	const char *want;
} golden[] = {
	{0, "1970-01-01T00:00:00+0000"},
	{-1, "1970-01-01T00:00:00+0000"},          /* clamped */
	{68255999, "1972-02-29T23:59:59+0000"},    /* a leap day */
	{951782400, "2000-02-29T00:00:00+0000"},   /* divisible by 400: leap */
	{978307199, "2000-12-31T23:59:59+0000"},
	{1709251199, "2024-02-29T23:59:59+0000"},
	{1709251200, "2024-03-01T00:00:00+0000"},
	{1796499472, "2026-12-05T19:37:52+0000"},
	{4107456000, "2100-02-28T00:00:00+0000"},  /* divisible by 100: not leap */
	{4107542400, "2100-03-01T00:00:00+0000"},
	{253402300799, "9999-12-31T23:59:59+0000"},
	{253402300800, "9999-12-31T23:59:59+0000"}, /* clamped */
};

START_TEST(test_time_golden)
{
	char buf[WFS_LOG_TIME_BYTES];

	memset(buf, 'x', sizeof(buf));
	wfs_log_time_utc(golden[_i].seconds, buf);
	ck_assert_str_eq(buf, golden[_i].want);
}
END_TEST

/* strftime(3) over gmtime_r(3), the normal lines' form in UTC, agrees over 1970-9999. */
START_TEST(test_time_matches_gmtime)
{
	char got[WFS_LOG_TIME_BYTES], want[64];
	uint64_t x = 0x9e3779b97f4a7c15ull;

	for (int i = 0; i < 200000; i++) {
		time_t t;
		struct tm tm;

		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		t = i < 1000 ? (time_t)i * 86399 : (time_t)(x % 253402300800ull);
		ck_assert_ptr_nonnull(gmtime_r(&t, &tm));
		strftime(want, sizeof(want), "%Y-%m-%dT%H:%M:%S+0000", &tm);
		wfs_log_time_utc((int64_t)t, got);
		ck_assert_msg(strcmp(got, want) == 0, "%lld: %s, want %s", (long long)t, got, want);
	}
}
END_TEST

/*
 * A fatal signal writes its line to the log file with the time as the file's other lines have it
 * (it was "@<seconds>"): "YYYY-MM-DDTHH:MM:SS+0000 PROG[fatal]: killed by signal N (...)".
 */
START_TEST(test_fatal_line)
{
	char path[600], line[512];
	time_t before = time(NULL), after;
	regex_t re;
	struct tm tm;
	FILE *f;
	pid_t pid;
	int st;

	snprintf(path, sizeof(path), "%s/log", tu_test_dir);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY);

		if (null >= 0)
			dup2(null, STDERR_FILENO); /* the backtrace goes there too: not into the suite's output */
		wfs_log_init("check_log", false, WFS_LOG_INFO);
		if (wfs_log_open_file(path) != 0)
			_exit(2);
		wfs_log_crash_handlers();
		raise(SIGSEGV);
		_exit(3);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	after = time(NULL);
	ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "status %d", st);
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	ck_assert_ptr_nonnull(fgets(line, sizeof(line), f));
	fclose(f);
	ck_assert_int_eq(regcomp(&re, "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\+0000 "
				 "check_log\\[fatal\\]: killed by signal 11 \\(SEGV\\), pid [0-9]+\\. ",
				 REG_EXTENDED | REG_NOSUB), 0);
	ck_assert_msg(regexec(&re, line, 0, NULL, 0) == 0, "fatal line: %s", line);
	regfree(&re);
	memset(&tm, 0, sizeof(tm));
	ck_assert_ptr_nonnull(strptime(line, "%Y-%m-%dT%H:%M:%S", &tm));
	ck_assert_int_ge(timegm(&tm), before);
	ck_assert_int_le(timegm(&tm), after);
}
END_TEST

/* The lines of the log file at @path holding @needle. */
static int count_lines(const char *path, const char *needle)
{
	char line[1024];
	int n = 0;
	FILE *f = fopen(path, "r");

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		n += strstr(line, needle) != NULL;
	fclose(f);
	return n;
}

/* wfs_log_limited(): a burst of WFS_LOG_BURST lines, the rest counted and told by the next line
 * written once the window is over. */
START_TEST(test_limited_burst)
{
	struct wfs_log_limit l = WFS_LOG_LIMIT_INIT;
	char path[600], want[128];
	pid_t pid;
	int st;

	snprintf(path, sizeof(path), "%s/log", tu_test_dir);
	pid = fork(); /* the log's file and stderr are the process's: a child's own */
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY);

		if (null >= 0)
			dup2(null, STDERR_FILENO);
		wfs_log_init("check_log", false, WFS_LOG_INFO);
		if (wfs_log_open_file(path) != 0)
			_exit(2);
		for (int i = 0; i < WFS_LOG_BURST + 25; i++)
			wfs_log_limited(&l, WFS_LOG_WARN, "seal failed %d", i);
		l.window_s -= WFS_LOG_BURST_S; /* the window is over */
		wfs_log_limited(&l, WFS_LOG_WARN, "seal failed last");
		wfs_log_limited(&l, WFS_LOG_WARN, "seal failed after");
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d", st);
	ck_assert_int_eq(count_lines(path, "seal failed"), WFS_LOG_BURST + 2);
	ck_assert_int_eq(count_lines(path, "seal failed 9"), 1);
	ck_assert_int_eq(count_lines(path, "seal failed 10"), 0);
	snprintf(want, sizeof(want), "seal failed last (25 more like it left out before this line: at most "
		 "%d every %d s)", WFS_LOG_BURST, WFS_LOG_BURST_S);
	ck_assert_int_eq(count_lines(path, want), 1);
	ck_assert_int_eq(count_lines(path, "after (left out"), 0);
	ck_assert_int_eq(count_lines(path, "left out"), 1);
}
END_TEST

/*
 * Run @body in a child whose log goes to the file @path, its stderr to @err_path (either NULL:
 * /dev/null): the log's file and stderr are the process's. Asserts the child exited 0.
 */
static void in_child(const char *path, const char *err_path, void (*body)(void))
{
	pid_t pid = fork();
	int st;

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int fd = open(err_path ? err_path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0600);

		if (fd >= 0)
			dup2(fd, STDERR_FILENO);
		wfs_log_init("check_log", false, WFS_LOG_INFO);
		if (wfs_log_open_file(path) != 0)
			_exit(2);
		body();
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d", st);
}

/* Every line of the file at @path into @lines (@max of them, 512 bytes each), a log file's line
 * without its time and tag (what follows the first "]: "). Returns the count. */
static int read_lines(const char *path, char lines[][512], int max)
{
	char buf[512];
	int n = 0;
	FILE *f = fopen(path, "r");

	ck_assert_ptr_nonnull(f);
	while (fgets(buf, sizeof(buf), f)) {
		const char *msg = buf[0] >= '0' && buf[0] <= '9' && strstr(buf, "]: ") ? strstr(buf, "]: ") + 3 : buf;

		ck_assert_int_lt(n, max);
		snprintf(lines[n], sizeof(lines[n]), "%s", msg);
		n++;
	}
	fclose(f);
	return n;
}

static void log_forged(void)
{
	/* The trial's forged line: a value that ends its line and writes a daemon-looking one. */
	wfs_log(WFS_LOG_WARN, "inode 8: user.weightfs.shape=\"%s\" refused",
		"[1]\n2026-12-06T18:00:00+0000 weightfs[info]: /tmp/trial-mnt: unmounted, store closed");
	wfs_log(WFS_LOG_WARN, "cr\rtab\tesc\x1b[2Jsoh\x01" "del\x7f c1\xc2\x9b utf8 \xc3\xa9 bs\\n end");
}

/* Control characters in a message are escapes, in the log file and on stderr: each call is one
 * line, and no line another caller's text could be taken for. */
START_TEST(test_escaped)
{
	static const char *const want[] = {
		"inode 8: user.weightfs.shape=\"[1]\\n2026-12-06T18:00:00+0000 weightfs[info]: /tmp/trial-mnt: "
		"unmounted, store closed\" refused\n",
		"cr\\rtab\\tesc\\x1b[2Jsoh\\x01del\\x7f c1\\xc2\\x9b utf8 \xc3\xa9 bs\\\\n end\n",
	};
	char path[600], err_path[600], lines[8][512];

	snprintf(path, sizeof(path), "%s/log", tu_test_dir);
	snprintf(err_path, sizeof(err_path), "%s/stderr", tu_test_dir);
	in_child(path, err_path, log_forged);
	ck_assert_int_eq(read_lines(path, lines, 8), 2);
	ck_assert_str_eq(lines[0], want[0]);
	ck_assert_str_eq(lines[1], want[1]);
	ck_assert_int_eq(read_lines(err_path, lines, 8), 2);
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(strncmp(lines[i], "check_log: warning: ", 20), 0);
		ck_assert_str_eq(lines[i] + 20, want[i]);
	}
}
END_TEST

static void flood_then_flush(void)
{
	static struct wfs_log_limit other = WFS_LOG_LIMIT_INIT;

	for (int i = 0; i < 1000; i++)
		WFS_LOG_LIMITED(WFS_LOG_WARN, "inode 8: user.weightfs.shape=\"[x]\" refused (%d)", i);
	for (int i = 0; i < WFS_LOG_BURST + 3; i++)
		wfs_log_limited(&other, WFS_LOG_INFO, "other line");
	other.window_s -= WFS_LOG_BURST_S; /* the window is over: the next line tells the 3, not the flush */
	wfs_log_limited(&other, WFS_LOG_INFO, "other line");
	wfs_log_limits_flush();
	wfs_log_limits_flush(); /* told once */
}

/*
 * A flood through WFS_LOG_LIMITED: a burst of WFS_LOG_BURST lines, the last of which says the next
 * are counted; wfs_log_limits_flush() then tells the count no later line told, once, quoting the last
 * line written.
 */
START_TEST(test_limited_flush)
{
	char path[600], want[256], lines[32][512];
	int n;

	snprintf(path, sizeof(path), "%s/log", tu_test_dir);
	in_child(path, NULL, flood_then_flush);
	n = read_lines(path, lines, 32);
	ck_assert_int_eq(n, 2 * WFS_LOG_BURST + 2);
	ck_assert_str_eq(lines[0], "inode 8: user.weightfs.shape=\"[x]\" refused (0)\n");
	snprintf(want, sizeof(want), "inode 8: user.weightfs.shape=\"[x]\" refused (%d) (at most %d like it every "
		 "%d s: the next are counted, not written)\n", WFS_LOG_BURST - 1, WFS_LOG_BURST, WFS_LOG_BURST_S);
	ck_assert_str_eq(lines[WFS_LOG_BURST - 1], want);
	snprintf(want, sizeof(want), "log: %d more lines like \"inode 8: user.weightfs.shape=\"[x]\" refused (%d)\" "
		 "were left out after the last one written (at most %d every %d s)\n", 1000 - WFS_LOG_BURST,
		 WFS_LOG_BURST - 1, WFS_LOG_BURST, WFS_LOG_BURST_S);
	ck_assert_str_eq(lines[n - 1], want); /* the other limit's count was told: no line */
	ck_assert_int_eq(count_lines(path, "other line"), WFS_LOG_BURST + 1);
	ck_assert_int_eq(count_lines(path, "left out"), 2);
}
END_TEST

static Suite *log_suite(void)
{
	Suite *s = suite_create("log");
	TCase *tc = tcase_create("time");

	tcase_add_loop_test(tc, test_time_golden, 0, (int)(sizeof(golden) / sizeof(golden[0])));
	tcase_add_test(tc, test_time_matches_gmtime);
	suite_add_tcase(s, tc);
	tc = tcase_create("fatal");
	tcase_add_checked_fixture(tc, tu_test_dir_setup, tu_test_dir_teardown);
	tcase_add_test(tc, test_fatal_line);
	tcase_add_test(tc, test_limited_burst);
	suite_add_tcase(s, tc);
	tc = tcase_create("line");
	tcase_add_checked_fixture(tc, tu_test_dir_setup, tu_test_dir_teardown);
	tcase_add_test(tc, test_escaped);
	tcase_add_test(tc, test_limited_flush);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tu_main("check_log", log_suite(), TU_RUN_DIR, NULL);
}
