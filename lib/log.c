/* SPDX-License-Identifier: Apache-2.0 */
/* log.h: one-line diagnostics, the daemon's log file, and the trace a fatal signal leaves. */
#include "log.h"

#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

static const char *log_prog = "weightfs";
static bool log_syslog;
static enum wfs_log_level log_max = WFS_LOG_INFO;
static FILE *log_file;
static bool log_stderr = true;   /* false once stderr is the log file (wfs_log_take_stderr) */
static volatile int log_fd = -1; /* the log file's descriptor, for the fatal-signal handler */
static char log_path[PATH_MAX];  /* for wfs_log_reopen() */
/* Limits that left lines out (struct wfs_log_limit's listed), newest first, for
 * wfs_log_limits_flush(); each limit's lock is taken before this one, never after. */
static pthread_mutex_t limits_lock = PTHREAD_MUTEX_INITIALIZER;
static struct wfs_log_limit *limits; /* (limits_lock) */

void wfs_log_init(const char *prog, bool use_syslog, enum wfs_log_level max_level)
{
	log_prog = prog;
	log_syslog = use_syslog;
	log_max = max_level;
	if (use_syslog)
		openlog(prog, LOG_PID, LOG_DAEMON);
}

/*
 * @in as one line into @out (@cap bytes, at least 5; NUL-terminated, cut at an escape's start where
 * it does not fit): control characters as escapes, a backslash doubled (log.h). The C1 controls
 * are looked for in their UTF-8 form only: other bytes of 0x80 and above are a name's UTF-8.
 */
static void escape(char *out, size_t cap, const char *in)
{
	static const char hex[] = "0123456789abcdef";
	size_t o = 0;

	for (const unsigned char *p = (const unsigned char *)in; *p; p++) {
		char esc[9];
		size_t n = 0;
		unsigned char c = *p;

		if (c == '\\' || c == '\n' || c == '\r' || c == '\t') {
			esc[n++] = '\\';
			esc[n++] = c == '\n' ? 'n' : c == '\r' ? 'r' : c == '\t' ? 't' : '\\';
		} else if (c < 0x20 || c == 0x7f || (c == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f)) {
			for (int i = 0; i < (c == 0xc2 ? 2 : 1); i++) {
				esc[n++] = '\\';
				esc[n++] = 'x';
				esc[n++] = hex[p[i] >> 4];
				esc[n++] = hex[p[i] & 0xf];
			}
			p += c == 0xc2;
		} else {
			esc[n++] = (char)c;
		}
		if (o + n >= cap)
			break;
		memcpy(out + o, esc, n);
		o += n;
	}
	out[o] = '\0';
}

static void vlog(enum wfs_log_level level, const char *fmt, va_list ap)
{
	static const int prio[] = {LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG};
	static const char *const tag[] = {"error", "warning", "info", "debug"};
	char raw[1024], line[4 * sizeof(raw)]; /* an escape is at most 4 bytes a byte */

	if (level > log_max)
		return;
	vsnprintf(raw, sizeof(raw), fmt, ap);
	escape(line, sizeof(line), raw);
	if (log_syslog)
		syslog(prio[level], "%s", line);
	/* One fprintf per line: stdio locks the stream, so lines from threads do not interleave. The
	 * store's log first (line-buffered: written by this call): a line seen on stderr is in
	 * STORE/weightfs.log already (check_mount holder_death_logged read the file between the two,
	 * 1 run of a CI rehearsal). */
	if (log_file) {
		char when[32];
		time_t now = time(NULL);
		struct tm tm;

		strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S%z", localtime_r(&now, &tm));
		fprintf(log_file, "%s %s[%s]: %s\n", when, log_prog, tag[level], line);
	}
	if (log_stderr)
		fprintf(stderr, "%s: %s: %s\n", log_prog, tag[level], line);
}

int wfs_log_open_file(const char *path)
{
	FILE *f = fopen(path, "ae");

	if (!f)
		return -errno;
	setvbuf(f, NULL, _IOLBF, 0);
	snprintf(log_path, sizeof(log_path), "%s", path);
	log_file = f;
	log_fd = fileno(f);
	return 0;
}

int wfs_log_reopen(void)
{
	int fd, ret = 0;

	if (log_fd < 0 || !log_path[0])
		return -EBADF;
	fd = open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	/* The stream keeps its descriptor number: no lock against threads writing lines meanwhile. */
	if (dup3(fd, log_fd, O_CLOEXEC) < 0)
		ret = -errno;
	else if (!log_stderr && dup2(fd, STDERR_FILENO) < 0)
		ret = -errno;
	close(fd);
	return ret;
}

static void reopen_signal(int sig)
{
	int saved = errno;

	(void)sig;
	wfs_log_reopen();
	errno = saved;
}

int wfs_log_reopen_on(int sig)
{
	struct sigaction sa = {.sa_handler = reopen_signal, .sa_flags = SA_RESTART};

	sigemptyset(&sa.sa_mask);
	return sigaction(sig, &sa, NULL) < 0 ? -errno : 0;
}

int wfs_log_take_stderr(void)
{
	if (!log_file)
		return -EBADF;
	fflush(stderr);
	if (dup2(fileno(log_file), STDERR_FILENO) < 0)
		return -errno;
	log_stderr = false;
	return 0;
}

/* write(2) all of @s to @fd, as far as it goes (async-signal-safe). */
static void put(int fd, const char *s)
{
	size_t len = strlen(s);

	while (len > 0) {
		ssize_t n = write(fd, s, len);

		if (n <= 0)
			return;
		s += n;
		len -= (size_t)n;
	}
}

/* Decimal @v into @buf (at least 21 bytes) without stdio (async-signal-safe). Returns @buf. */
static char *decimal(char *buf, long v)
{
	char tmp[21];
	int n = 0, i = 0;
	unsigned long u = v < 0 ? 0UL - (unsigned long)v : (unsigned long)v;

	do
		tmp[n++] = (char)('0' + u % 10);
	while ((u /= 10) != 0);
	if (v < 0)
		buf[i++] = '-';
	while (n > 0)
		buf[i++] = tmp[--n];
	buf[i] = '\0';
	return buf;
}

/* @n (0 to 10^@width - 1) as @width decimal digits at @p. */
static void digits(char *p, unsigned n, int width)
{
	while (width-- > 0) {
		p[width] = (char)('0' + n % 10);
		n /= 10;
	}
}

void wfs_log_time_utc(int64_t seconds, char buf[WFS_LOG_TIME_BYTES])
{
	const int64_t last = 253402300799; /* 9999-12-31T23:59:59 */
	int64_t t = seconds < 0 ? 0 : seconds > last ? last : seconds;
	/* Days since 0000-03-01 in 400-year eras of 146,097 days, a year starting in March so that
	 * the leap day ends it (H. Hinnant, "chrono-Compatible Low-Level Date Algorithms"). */
	int64_t days = t / 86400 + 719468;
	unsigned secs = (unsigned)(t % 86400), era = (unsigned)(days / 146097);
	unsigned doe = (unsigned)(days - (int64_t)era * 146097);                 /* day of era */
	unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;    /* year of era */
	unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);                  /* day of year */
	unsigned mp = (5 * doy + 2) / 153;                                       /* March = 0 */
	unsigned day = doy - (153 * mp + 2) / 5 + 1, month = mp < 10 ? mp + 3 : mp - 9;
	unsigned year = yoe + era * 400 + (month <= 2);

	memcpy(buf, "0000-00-00T00:00:00+0000", WFS_LOG_TIME_BYTES);
	digits(buf, year, 4);
	digits(buf + 5, month, 2);
	digits(buf + 8, day, 2);
	digits(buf + 11, secs / 3600, 2);
	digits(buf + 14, secs / 60 % 60, 2);
	digits(buf + 17, secs % 60, 2);
}

static void fatal_signal(int sig)
{
	int fds[2] = {log_fd, log_stderr || log_fd < 0 ? STDERR_FILENO : -1};
	void *frames[64];
	int depth = backtrace(frames, 64);
	char num[2][24], when[WFS_LOG_TIME_BYTES];
	struct timespec now = {0, 0};

	clock_gettime(CLOCK_REALTIME, &now); /* async-signal-safe, as time(2) is; gmtime(3) is not */
	wfs_log_time_utc((int64_t)now.tv_sec, when);
	for (int i = 0; i < 2; i++) {
		if (fds[i] < 0)
			continue;
		put(fds[i], when);
		put(fds[i], " ");
		put(fds[i], log_prog);
		put(fds[i], "[fatal]: killed by signal ");
		put(fds[i], decimal(num[0], sig));
		put(fds[i], " (");
		put(fds[i], sigabbrev_np(sig) ? sigabbrev_np(sig) : "?");
		put(fds[i], "), pid ");
		put(fds[i], decimal(num[1], (long)getpid()));
		put(fds[i], sig == SIGABRT ? "; an assertion's message, if any, is the line before. Backtrace "
					     "(addr2line -f -e BINARY +OFFSET names a frame):\n"
					   : ". Backtrace (addr2line -f -e BINARY +OFFSET names a frame):\n");
		backtrace_symbols_fd(frames, depth, fds[i]);
	}
	signal(sig, SIG_DFL);
	raise(sig);
}

void wfs_log_crash_handlers(void)
{
	static const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
	struct sigaction sa = {.sa_handler = fatal_signal, .sa_flags = SA_RESETHAND | SA_NODEFER};
	void *frame;

	backtrace(&frame, 1); /* loads libgcc now: the first call may allocate, not safe in a handler */
	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
		sigaction(sigs[i], &sa, NULL);
}

void wfs_log(enum wfs_log_level level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vlog(level, fmt, ap);
	va_end(ap);
}

void wfs_log_once(atomic_bool *once, enum wfs_log_level level, const char *fmt, ...)
{
	va_list ap;

	if (atomic_exchange(once, true))
		return;
	va_start(ap, fmt);
	vlog(level, fmt, ap);
	va_end(ap);
}

void wfs_log_limited(struct wfs_log_limit *l, enum wfs_log_level level, const char *fmt, ...)
{
	unsigned long left = 0;
	struct timespec now;
	char msg[900], note[192] = "";
	bool write, last = false, list = false;
	va_list ap;

	if (level > log_max)
		return; /* not written whatever the count: not counted either */
	clock_gettime(CLOCK_MONOTONIC, &now);
	pthread_mutex_lock(&l->lock);
	if (l->window_s == INT64_MIN || (int64_t)now.tv_sec - l->window_s >= WFS_LOG_BURST_S) {
		l->window_s = (int64_t)now.tv_sec;
		l->lines = 0;
	}
	write = l->lines < WFS_LOG_BURST;
	if (write) {
		last = ++l->lines == WFS_LOG_BURST;
		left = l->left_out;
		l->left_out = 0;
	} else {
		l->left_out++;
		list = !l->listed;
		l->listed = true;
	}
	pthread_mutex_unlock(&l->lock);
	if (list) { /* not under l->lock: wfs_log_limits_flush() takes limits_lock first */
		pthread_mutex_lock(&limits_lock);
		l->next = limits;
		limits = l;
		pthread_mutex_unlock(&limits_lock);
	}
	if (!write)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&l->lock);
	l->level = level;
	if (strlen(msg) < sizeof(l->last)) {
		memcpy(l->last, msg, strlen(msg) + 1);
	} else {
		memcpy(l->last, msg, sizeof(l->last) - 4);
		memcpy(l->last + sizeof(l->last) - 4, "...", 4);
	}
	pthread_mutex_unlock(&l->lock);
	if (left)
		snprintf(note, sizeof(note), " (%lu more like it left out before this line: at most %d every %d s)",
			 left, WFS_LOG_BURST, WFS_LOG_BURST_S);
	if (last)
		snprintf(note + strlen(note), sizeof(note) - strlen(note),
			 " (at most %d like it every %d s: the next are counted, not written)", WFS_LOG_BURST,
			 WFS_LOG_BURST_S);
	wfs_log(level, "%s%s", msg, note);
}

void wfs_log_limits_flush(void)
{
	pthread_mutex_lock(&limits_lock);
	for (struct wfs_log_limit *l = limits; l; l = l->next) {
		enum wfs_log_level level;
		unsigned long left;
		char last[WFS_LOG_LIMIT_LAST];

		pthread_mutex_lock(&l->lock);
		left = l->left_out;
		l->left_out = 0;
		level = l->level;
		memcpy(last, l->last, sizeof(last));
		pthread_mutex_unlock(&l->lock);
		if (left)
			wfs_log(level, "log: %lu more lines like \"%s\" were left out after the last one written "
				"(at most %d every %d s)", left, last, WFS_LOG_BURST, WFS_LOG_BURST_S);
	}
	pthread_mutex_unlock(&limits_lock);
}
