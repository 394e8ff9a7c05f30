/* SPDX-License-Identifier: Apache-2.0 */
/*
 * log — one-line diagnostics for the daemon and tools.
 *
 * Messages go to stderr (and to syslog when wfs_log_init() asked for it), one line each, prefixed with
 * the program name. wfs_log_once() keys a message on a caller-provided flag so a failure class is
 * reported once per process, not once per request; wfs_log_limited() lets a burst of one through.
 * Thread-safe.
 *
 * A message is one line whatever it holds: its control characters (below 0x20, 0x7f, and the C1
 * controls U+0080 to U+009F in UTF-8) are written as escapes, "\n", "\r", "\t" or "\xHH", and a
 * backslash as "\\", so a value a user chose (an xattr's, a file name) cannot end its line and
 * forge the next one, nor move a terminal's cursor.
 */
#ifndef WFS_LOG_H
#define WFS_LOG_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

enum wfs_log_level { WFS_LOG_ERR, WFS_LOG_WARN, WFS_LOG_INFO, WFS_LOG_DEBUG };

/* @prog is kept by reference (pass a string literal or argv[0]). */
void wfs_log_init(const char *prog, bool use_syslog, enum wfs_log_level max_level);
/* Also append every line, with a timestamp, to the file at @path. Returns 0 or -errno. */
int wfs_log_open_file(const char *path);
/*
 * Open the log file again by its path (after logrotate moved it away): the descriptor the log
 * writes to is replaced in place (dup3), and so is stderr when wfs_log_take_stderr() made it the
 * log. Async-signal-safe. Returns 0, -EBADF (no log file open) or -errno of open(2) or dup3(2); on
 * failure the log goes on to the old file.
 */
int wfs_log_reopen(void);
/* Call wfs_log_reopen() on signal @sig (SIGUSR1 for the daemon; weightfs.8). Returns 0 or -errno. */
int wfs_log_reopen_on(int sig);
/*
 * A daemon whose stderr went to /dev/null (fuse_daemonize()): make the log file (wfs_log_open_file())
 * its stderr too, so that what libraries and the C library write there — a failed assertion's
 * message before abort(), libfuse's and SQLite's complaints — lands in the log. Lines of wfs_log()
 * are then written once, with their timestamp. Returns 0, -EBADF (no log file open) or -errno of
 * dup2(2).
 */
int wfs_log_take_stderr(void);
#define WFS_LOG_TIME_BYTES 25 /* "2026-12-05T19:57:52+0000" and its NUL */
/*
 * @seconds since the epoch in UTC, in the form of the log file's times: "YYYY-MM-DDTHH:MM:SS+0000"
 * into @buf (WFS_LOG_TIME_BYTES bytes, NUL-terminated); seconds before 1970 or after 9999 are
 * clamped to those years' ends. Async-signal-safe: arithmetic only (civil from days), no gmtime(3),
 * strftime(3) or locale, for the fatal-signal handler.
 */
void wfs_log_time_utc(int64_t seconds, char buf[WFS_LOG_TIME_BYTES]);
/*
 * On a fatal signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT: a failed assertion aborts) write one
 * line, with the time (UTC: wfs_log_time_utc()) as the log file's lines have it, naming the signal
 * and the pid, and a backtrace (backtrace_symbols_fd(3): addresses, and
 * function names where the binary exports them), to the log file and stderr, then die of the same
 * signal with its default action (a core dump where enabled). Async-signal-safe; install once.
 */
void wfs_log_crash_handlers(void);
void wfs_log(enum wfs_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Log only the first time *@once is found clear; sets it. */
void wfs_log_once(atomic_bool *once, enum wfs_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/*
 * A burst limit for one kind of message (one static struct per call site: one that left lines out
 * stays listed for wfs_log_limits_flush()): at most WFS_LOG_BURST
 * lines in each WFS_LOG_BURST_S seconds; the rest are counted, and the next line written says how
 * many were left out. The last line a window lets through says that those after it are counted.
 * For messages a workload can repeat thousands of times a second — a seal failing on a full
 * store, whose log file lives on that same full disk (4,799 lines in a few seconds in a trial, the
 * last one cut mid-word) — and for every line a request can cause, which any user can repeat
 * (50,000 refused xattr lines, 5.8 MB, in 3.7 s from one unprivileged process in a trial).
 */
#define WFS_LOG_BURST 10
#define WFS_LOG_BURST_S 10
#define WFS_LOG_LIMIT_LAST 120 /* bytes of the last line written that wfs_log_limits_flush() quotes */
struct wfs_log_limit {
	pthread_mutex_t lock;          /* WFS_LOG_LIMIT_INIT; taken before log.c's list lock, never after */
	int64_t window_s;              /* CLOCK_MONOTONIC second the window began */
	unsigned lines;                /* written in it */
	unsigned long left_out;        /* not written since the last line */
	enum wfs_log_level level;      /* the last line's */
	char last[WFS_LOG_LIMIT_LAST]; /* the last line's start, NUL-terminated */
	bool listed;                   /* on log.c's list of limits that left lines out (once: never taken off) */
	struct wfs_log_limit *next;    /* that list's next (log.c's list lock) */
};
#define WFS_LOG_LIMIT_INIT {.lock = PTHREAD_MUTEX_INITIALIZER, .window_s = INT64_MIN}
void wfs_log_limited(struct wfs_log_limit *l, enum wfs_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/*
 * wfs_log_limited() under a limit of the call site's own (a static struct wfs_log_limit): for a
 * line that a request, and so any user, can have the daemon write again and again — a refused
 * value, a claim passed over, an object that cannot be opened.
 */
#define WFS_LOG_LIMITED(level, ...)                                                                \
	do {                                                                                       \
		static struct wfs_log_limit wfs_log_site_limit_ = WFS_LOG_LIMIT_INIT;              \
		wfs_log_limited(&wfs_log_site_limit_, (level), __VA_ARGS__);                       \
	} while (0)
/*
 * For every limit that left lines out since its last line (a flood that stopped: no later line
 * told them), write one line with the count and the start of the last line written, at that
 * line's level. The daemon calls it when it stops serving: at its unmount, and before it hands the
 * mount to an upgrade's next server. Thread-safe.
 */
void wfs_log_limits_flush(void);

#endif
