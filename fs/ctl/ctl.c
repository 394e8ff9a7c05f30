/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ctl — what the weightfsctl subcommands share (ctl.h): options, the progress line, JSON output, the
 * store behind a path, and --store's namespace for import and export.
 */
#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "gc.h"
#include "mounts.h"
#include "store.h"
#include "tensorfile.h"
#include "weightfs.h"

#define MOUNT_WAIT_MS 10000 /* how long the private daemon has to mount, or to exit */

/* ---- options -------------------------------------------------------------------------------- */

/* Set option @o from its argument @arg. Returns 0, or -1 with the usage error printed. */
static int set_option(const struct wfs_ctl_cmd *cmd, const struct wfs_ctl_opt *o, const char *arg)
{
	char *end;
	long v;

	switch (o->kind) {
	case WFS_CTL_FLAG:
		*(bool *)o->out = true;
		return 0;
	case WFS_CTL_STRING:
		*(const char **)o->out = arg;
		return 0;
	case WFS_CTL_SIZE:
		if (wfs_parse_size(arg, o->out) == 0)
			return 0;
		break;
	case WFS_CTL_LONG:
		errno = 0;
		v = strtol(arg, &end, 10);
		if (errno == 0 && end != arg && *end == '\0' && v >= o->min && v <= o->max) {
			*(long *)o->out = v;
			return 0;
		}
		break;
	}
	if (o->bad)
		fprintf(stderr, "weightfsctl %s: --%s %s: %s\n", cmd->name, o->name, arg, o->bad);
	else
		fprintf(stderr, "weightfsctl %s: --%s: bad value '%s' (%ld..%ld)\n", cmd->name, o->name, arg, o->min,
			o->max);
	return -1;
}

int wfs_ctl_parse(const struct wfs_ctl_cmd *cmd, int argc, char **argv)
{
	struct option longopts[WFS_CTL_MAX_OPTS + 2];
	char shortopts[2 * WFS_CTL_MAX_OPTS + 2], *s = shortopts;
	int n = 0, c, operands;

	for (; n < WFS_CTL_MAX_OPTS && cmd->opts && cmd->opts[n].name; n++) {
		const struct wfs_ctl_opt *o = &cmd->opts[n];

		/* An option without a letter is known by its index, above every char. */
		longopts[n] = (struct option){o->name, o->kind == WFS_CTL_FLAG ? no_argument : required_argument,
					      NULL, o->letter ? o->letter : 256 + n};
		if (o->letter) {
			*s++ = o->letter;
			if (o->kind != WFS_CTL_FLAG)
				*s++ = ':';
		}
	}
	assert(!cmd->opts || !cmd->opts[n].name); /* no more than WFS_CTL_MAX_OPTS */
	longopts[n] = (struct option){"help", no_argument, NULL, 'h'};
	longopts[n + 1] = (struct option){NULL, 0, NULL, 0};
	*s++ = 'h';
	*s = '\0';
	optind = 1;
	while ((c = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
		int i = 0;

		if (c == 'h') {
			cmd->usage(stdout);
			return 0;
		}
		while (i < n && longopts[i].val != c)
			i++;
		if (i == n) { /* unknown, or its argument missing: getopt said which */
			cmd->usage(stderr);
			return 2;
		}
		if (set_option(cmd, &cmd->opts[i], optarg))
			return 2;
	}
	operands = argc - optind;
	if (operands < cmd->min_operands || (cmd->max_operands >= 0 && operands > cmd->max_operands)) {
		cmd->usage(stderr);
		return 2;
	}
	return WFS_CTL_GO_ON;
}

/* ---- the progress line ---------------------------------------------------------------------- */

double wfs_ctl_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void wfs_ctl_progress_init(struct wfs_ctl_progress *p, bool enabled)
{
	*p = (struct wfs_ctl_progress){.tty = enabled && isatty(STDERR_FILENO)};
}

void wfs_ctl_progress_show(struct wfs_ctl_progress *p, bool force, const char *fmt, ...)
{
	struct timespec now;
	long long ms;
	va_list ap;

	if (!p->tty)
		return;
	clock_gettime(CLOCK_MONOTONIC, &now);
	ms = (now.tv_sec - p->last.tv_sec) * 1000 + (now.tv_nsec - p->last.tv_nsec) / 1000000;
	if (!force && p->shown && ms < WFS_CTL_PROGRESS_MS)
		return;
	p->last = now;
	fputs("\r\033[K", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	p->shown = true;
}

void wfs_ctl_progress_clear(struct wfs_ctl_progress *p)
{
	if (p->shown)
		fputs("\r\033[K", stderr);
	p->shown = false;
}

/* ---- JSON output ---------------------------------------------------------------------------- */

/* Bytes in the UTF-8 sequence that starts at @s (1 to 4), or 0 when none starts there. */
static size_t utf8_len(const unsigned char *s)
{
	size_t n = s[0] < 0x80 ? 1 : s[0] < 0xc2 ? 0 : s[0] < 0xe0 ? 2 : s[0] < 0xf0 ? 3 : s[0] < 0xf5 ? 4 : 0;

	for (size_t i = 1; i < n; i++)
		if ((s[i] & 0xc0) != 0x80)
			return 0; /* this also stops at the terminating NUL */
	if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] > 0x9f) || (s[0] == 0xf0 && s[1] < 0x90) ||
	    (s[0] == 0xf4 && s[1] > 0x8f))
		return 0; /* too long a form, a surrogate, or beyond U+10FFFF */
	return n;
}

json_t *wfs_ctl_json_string(const char *text)
{
	json_t *j;
	char *clean, *w;

	if (!text)
		return NULL;
	j = json_string(text);
	if (j)
		return j;
	/* Not UTF-8 (a path can be any bytes): each stray byte becomes U+FFFD, 3 bytes. */
	clean = malloc(3 * strlen(text) + 1);
	if (!clean)
		return NULL;
	w = clean;
	for (const unsigned char *s = (const unsigned char *)text; *s;) {
		size_t n = utf8_len(s);

		if (n) {
			memcpy(w, s, n);
			w += n;
			s += n;
		} else {
			memcpy(w, "\xef\xbf\xbd", 3);
			w += 3;
			s++;
		}
	}
	*w = '\0';
	j = json_string(clean);
	free(clean);
	return j;
}

json_t *wfs_ctl_json_fixed(double v, int decimals)
{
	char text[512];

	snprintf(text, sizeof(text), "%.*f", decimals, v);
	return json_real(strtod(text, NULL));
}

int wfs_ctl_json_print(json_t *v, size_t flags)
{
	if (!v) {
		fprintf(stderr, "weightfsctl: out of memory for the JSON output\n");
		return 1;
	}
	json_dumpf(v, stdout, flags | JSON_REAL_PRECISION(15));
	putchar('\n');
	json_decref(v);
	return 0;
}

/* ---- the store behind a path ---------------------------------------------------------------- */

/*
 * A mounted store's daemon commits its changes in batches (fs/core/commit.h): fsync(2) of the mount
 * point has it commit (and sync) them, so that catalog.db shows every change made before this command.
 * Nothing when the store is not mounted or the mount cannot be opened.
 */
static void settle(const char *store)
{
	char mnt[PATH_MAX];
	int fd;

	if (wfs_mounts_of(store, true, mnt))
		return;
	fd = open(mnt, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
}

/* What wfs_ctl_store_error() says for WFS_MOUNTS_EHIDDEN: set by the wfs_ctl_resolve_store() that
 * returned it, which knows the store. */
static char hidden_message[PATH_MAX + 256];

/* Store @store (a daemon's path of it) is not that daemon's here: say so, for wfs_ctl_store_error(). */
static int hidden(const char *store)
{
	wfs_mounts_hidden_message(store, "this command", hidden_message, sizeof(hidden_message));
	return WFS_MOUNTS_EHIDDEN;
}

int wfs_ctl_resolve_store(const char *path, char *out)
{
	char real[PATH_MAX], probe[PATH_MAX + 32], mnt[PATH_MAX];
	int ret;

	if (!realpath(path, real))
		return -errno;
	/* A directory below a weightfs mount point is never a store (the daemon refuses a store inside
	 * a mount): a file named catalog.db there is a user's. */
	if (wfs_mounts_below(real, probe, out) == 0)
		return -EMEDIUMTYPE;
	snprintf(probe, sizeof(probe), "%s/" WFS_STORE_CATALOG, real);
	if (access(probe, F_OK) < 0 && errno == ENOENT) {
		/* A store that lost its catalog is still one: fsck --repair restores it from the backup. */
		snprintf(probe, sizeof(probe), "%s/" WFS_STORE_CATALOG_BACKUP, real);
	}
	if (access(probe, F_OK) == 0) {
		snprintf(out, PATH_MAX, "%s", real);
	} else if (errno == EACCES) {
		return -EACCES; /* a store this user may not read (mode 0700), not "no store" */
	} else {
		ret = wfs_mounts_on(real, out);
		/* A mount point, or the daemon's path of a store it serves, seen from a mount namespace
		 * where that path names another directory (or none): every command would misread it. */
		if (ret == 0 && wfs_mounts_store_visible(real, out) == WFS_MOUNTS_EHIDDEN)
			return hidden(out);
		if (ret == -ENOENT && wfs_mounts_of(real, true, mnt) == 0 &&
		    wfs_mounts_store_visible(mnt, real) == WFS_MOUNTS_EHIDDEN) {
			snprintf(out, PATH_MAX, "%s", real);
			return hidden(out);
		}
		if (ret)
			return ret == -ENOENT ? -EMEDIUMTYPE : ret;
	}
	settle(out);
	return 0;
}

json_t *wfs_ctl_mount_stats(const char *mnt)
{
	char buf[8192];
	ssize_t n = getxattr(mnt, WFS_XATTR_STATS, buf, sizeof(buf));

	return n > 0 ? json_loadb(buf, (size_t)n, 0, NULL) : NULL;
}

const char *wfs_ctl_store_error(int err)
{
	if (err == -EMEDIUMTYPE)
		return "not a weightfs store (a directory with catalog.db) or the mount point of one";
	if (err == -EACCES) /* the store is private to its owner (mode 0700), mounted allow_other or not */
		return "Permission denied: the store belongs to another user (run as root or as the store's "
		       "owner)";
	if (err == WFS_MOUNTS_EHIDDEN && hidden_message[0])
		return hidden_message;
	return strerror(-err);
}

const char *wfs_ctl_catalog_error(const char *store, int err, char *out, size_t out_bytes)
{
	char db[PATH_MAX + 32], backup[PATH_MAX + 32], why[256];
	bool has_backup;

	if (err == WFS_MOUNTS_EHIDDEN)
		return NULL; /* nothing is missing: the store is elsewhere (wfs_ctl_store_error) */
	snprintf(db, sizeof(db), "%s/" WFS_STORE_CATALOG, store);
	snprintf(backup, sizeof(backup), "%s/" WFS_STORE_CATALOG_BACKUP, store);
	has_backup = access(backup, F_OK) == 0;
	if (access(db, F_OK) < 0 && errno == ENOENT) {
		if (has_backup)
			snprintf(out, out_bytes, WFS_STORE_CATALOG " is missing: weightfsctl fsck --repair %s restores "
				 "it from " WFS_STORE_CATALOG_BACKUP " (with the store unmounted)", store);
		else
			snprintf(out, out_bytes, WFS_STORE_CATALOG " is missing, and no " WFS_STORE_CATALOG_BACKUP
				 " is beside it: weightfsctl fsck %s says what is left", store);
		return out;
	}
	if (err != -EIO || wfs_catalog_diagnose(db, why, sizeof(why)) != 1)
		return NULL;
	if (has_backup)
		snprintf(out, out_bytes, "the catalog is damaged (SQLite: %s): weightfsctl fsck --repair %s "
			 "rebuilds it from " WFS_STORE_CATALOG_BACKUP " (with the store unmounted)", why, store);
	else
		snprintf(out, out_bytes, "the catalog is damaged (SQLite: %s), and no " WFS_STORE_CATALOG_BACKUP
			 " is beside it: weightfsctl fsck %s says what to do", why, store);
	return out;
}

const char *wfs_ctl_store_owner(const char *store, char *out, size_t out_bytes)
{
	char what[PATH_MAX + 16];
	int pid;

	if (wfs_store_owner(store, &pid, what, sizeof(what)) == 0)
		snprintf(out, out_bytes, "weightfs (pid %d%s%s)", pid, *what ? ", " : "", what);
	else
		snprintf(out, out_bytes, "another process");
	return out;
}

/* ---- --store -------------------------------------------------------------------------------- */

volatile sig_atomic_t wfs_ctl_interrupted;

static void on_signal(int sig)
{
	wfs_ctl_interrupted = sig;
}

void wfs_ctl_catch_signals(void)
{
	struct sigaction sa = {.sa_handler = on_signal};

	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
}

/* Where a private mount is, and what to show for it: set by wfs_ctl_target_open(). */
static char private_root[PATH_MAX], private_label[PATH_MAX];

const char *wfs_ctl_display(const char *path)
{
	static char bufs[2][2 * PATH_MAX + 2];
	static int next;
	size_t len = strlen(private_root);
	char *buf;

	if (!len || strncmp(path, private_root, len) != 0 || (path[len] != '/' && path[len] != '\0'))
		return path;
	buf = bufs[next];
	next ^= 1;
	snprintf(buf, sizeof(bufs[0]), "%s:%s", private_label, path[len] ? path + len + 1 : "/");
	return buf;
}

/* The last non-empty line of file @path into @out (@size bytes), for a daemon's error. */
static void last_line(const char *path, char *out, size_t size)
{
	char buf[4096];
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	char *end, *start;

	out[0] = '\0';
	if (fd < 0)
		return;
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	close(fd);
	if (n <= 0)
		return;
	buf[n] = '\0';
	end = buf + n;
	while (end > buf && (end[-1] == '\n' || end[-1] == ' '))
		*--end = '\0';
	start = strrchr(buf, '\n');
	start = start ? start + 1 : buf;
	n = (ssize_t)strlen(start) < (ssize_t)size ? (ssize_t)strlen(start) : (ssize_t)size - 1;
	memcpy(out, start, (size_t)n);
	out[n] = '\0';
}

/* The weightfs daemon binary: next to this program, or "weightfs" on $PATH. */
static void daemon_path(char *out)
{
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

	if (n > 0) {
		char *slash;

		self[n] = '\0';
		slash = strrchr(self, '/');
		if (slash) {
			*slash = '\0';
			if (snprintf(out, PATH_MAX, "%s/weightfs", self) < PATH_MAX && access(out, X_OK) == 0)
				return;
		}
	}
	snprintf(out, PATH_MAX, "weightfs");
}

static int wait_ms(pid_t pid, int *status, int ms)
{
	for (int waited = 0;; waited += 20) {
		pid_t r = waitpid(pid, status, WNOHANG);

		if (r == pid)
			return 0;
		if (r < 0 && errno != EINTR)
			return -errno;
		if (waited >= ms)
			return -ETIMEDOUT;
		usleep(20000);
	}
}

int wfs_ctl_target_open(const char *cmd, const char *arg, struct wfs_ctl_target *t)
{
	char store[PATH_MAX], mnt[PATH_MAX], log[PATH_MAX], daemon[PATH_MAX], line[512], probe[PATH_MAX];
	const char *base = getenv("TMPDIR");
	struct stat st_dir, st_mnt;
	DIR *d;
	struct dirent *e;
	bool empty = true;
	int status;

	memset(t, 0, sizeof(*t));
	if (!realpath(arg, store) || stat(store, &st_dir) < 0) {
		fprintf(stderr, "weightfsctl %s: --store %s: %s\n", cmd, arg, strerror(errno));
		return 1;
	}
	if (!S_ISDIR(st_dir.st_mode)) {
		fprintf(stderr, "weightfsctl %s: --store %s: not a directory\n", cmd, arg);
		return 1;
	}
	if (wfs_mounts_of(store, true, t->root) == 0)
		return 0; /* a live daemon serves it: import through its mount */
	d = opendir(store);
	while (d && (e = readdir(d)) != NULL)
		if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
			empty = false;
	if (d)
		closedir(d);
	if (wfs_tf_path(probe, store, "catalog.db") == 0 && access(probe, F_OK) < 0 && !empty) {
		fprintf(stderr, "weightfsctl %s: --store %s: not a weightfs store (no catalog.db, not empty)\n",
			cmd, arg);
		return 1;
	}
	snprintf(t->tmpdir, sizeof(t->tmpdir), "%s/weightfsctl-%s.XXXXXX", base && *base ? base : "/tmp", cmd);
	if (!mkdtemp(t->tmpdir)) {
		fprintf(stderr, "weightfsctl %s: cannot make a mount point under %s: %s\n", cmd,
			base && *base ? base : "/tmp", strerror(errno));
		t->tmpdir[0] = '\0';
		return 1;
	}
	wfs_tf_path(mnt, t->tmpdir, "mnt");
	wfs_tf_path(log, t->tmpdir, "weightfs.log");
	if (mkdir(mnt, 0700) < 0 || stat(mnt, &st_dir) < 0) {
		fprintf(stderr, "weightfsctl %s: %s: %s\n", cmd, mnt, strerror(errno));
		return 1;
	}
	daemon_path(daemon);
	t->daemon = fork();
	if (t->daemon < 0) {
		fprintf(stderr, "weightfsctl %s: fork: %s\n", cmd, strerror(errno));
		t->daemon = 0;
		return 1;
	}
	if (t->daemon == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600), null = open("/dev/null", O_RDONLY);

		setpgid(0, 0); /* the terminal's ^C is ours to handle: we unmount, the daemon then exits */
		if (fd < 0 || null < 0 || dup2(null, 0) < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
			_exit(127);
		execlp(daemon, "weightfs", store, mnt, "-f", (char *)NULL);
		fprintf(stderr, "weightfsctl: cannot run %s: %s\n", daemon, strerror(errno));
		_exit(127);
	}
	for (int waited = 0;; waited += 20) {
		if (waitpid(t->daemon, &status, WNOHANG) == t->daemon) {
			t->daemon = 0;
			last_line(log, line, sizeof(line));
			fprintf(stderr, "weightfsctl %s: --store %s: the weightfs daemon did not mount it: %s\n", cmd,
				arg, *line ? line : "it exited");
			return 1;
		}
		if (stat(mnt, &st_mnt) == 0 && st_mnt.st_dev != st_dir.st_dev)
			break;
		if (waited >= MOUNT_WAIT_MS || wfs_ctl_interrupted) {
			kill(t->daemon, SIGTERM);
			wait_ms(t->daemon, &status, MOUNT_WAIT_MS);
			t->daemon = 0;
			fprintf(stderr, "weightfsctl %s: --store %s: %s\n", cmd, arg,
				wfs_ctl_interrupted ? "interrupted" : "not mounted after 10 s");
			return 1;
		}
		usleep(20000);
	}
	snprintf(t->root, sizeof(t->root), "%s", mnt);
	snprintf(private_root, sizeof(private_root), "%s", mnt);
	snprintf(private_label, sizeof(private_label), "%s", arg);
	return 0;
}

int wfs_ctl_target_close(const char *cmd, struct wfs_ctl_target *t)
{
	char log[PATH_MAX], mnt[PATH_MAX], line[512];
	int status = 0, ret = 0;

	if (!t->tmpdir[0])
		return 0;
	wfs_tf_path(mnt, t->tmpdir, "mnt");
	wfs_tf_path(log, t->tmpdir, "weightfs.log");
	if (t->daemon) {
		pid_t pid = fork();

		if (pid == 0) {
			int null = open("/dev/null", O_WRONLY);

			if (null >= 0)
				dup2(null, 2);
			execlp("fusermount3", "fusermount3", "-u", mnt, (char *)NULL);
			_exit(127);
		}
		if (pid < 0 || wait_ms(pid, &status, MOUNT_WAIT_MS) < 0 || !WIFEXITED(status) ||
		    WEXITSTATUS(status) != 0) {
			if (umount2(mnt, 0) < 0 && errno != EINVAL) {
				fprintf(stderr, "weightfsctl %s: cannot unmount %s: %s (fusermount3 -u %s)\n", cmd, mnt,
					strerror(errno), mnt);
				return 1;
			}
		}
		if (wait_ms(t->daemon, &status, MOUNT_WAIT_MS) < 0) {
			kill(t->daemon, SIGKILL);
			wait_ms(t->daemon, &status, MOUNT_WAIT_MS);
			ret = 1;
		} else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
			ret = 1;
		}
		if (ret) {
			last_line(log, line, sizeof(line));
			fprintf(stderr, "weightfsctl %s: the weightfs daemon failed at unmount: %s (log: %s)\n", cmd,
				*line ? line : "no message", log);
			return 1; /* keep the log */
		}
		t->daemon = 0;
	}
	unlink(log);
	rmdir(mnt);
	rmdir(t->tmpdir);
	t->tmpdir[0] = '\0';
	return 0;
}

int wfs_ctl_target_dir(const struct wfs_ctl_target *t, const char *dir, char *out)
{
	if (!t) {
		snprintf(out, PATH_MAX, "%s", dir);
		return 0;
	}
	for (const char *p = dir; (p = strstr(p, "..")) != NULL; p += 2)
		if ((p == dir || p[-1] == '/') && (p[2] == '/' || p[2] == '\0'))
			return -EINVAL;
	while (*dir == '/')
		dir++;
	if (strcmp(dir, ".") == 0)
		dir = "";
	return wfs_tf_path(out, t->root, dir);
}

/* ---- import and export: the library's callbacks --------------------------------------------- */

void wfs_ctl_tf_progress(void *ctx, const struct wfs_tf_progress *lp)
{
	struct wfs_ctl_tf_ui *ui = ctx;
	const int width = 24;
	double frac;
	int fill;
	char bar[32];

	if (!ui->progress.tty)
		return;
	frac = lp->bytes_total ? (double)lp->bytes_done / (double)lp->bytes_total
			       : (lp->tensors_total ? (double)lp->tensors_done / (double)lp->tensors_total : 1.0);
	fill = (int)(frac * width);
	for (int i = 0; i < width; i++)
		bar[i] = i < fill ? '#' : '.';
	bar[width] = '\0';
	wfs_ctl_progress_show(&ui->progress,
			      (lp->tensors_done == 0 && lp->bytes_done == 0) || lp->tensors_done == lp->tensors_total,
			      "%s [%s] %zu/%zu tensors, %.1f/%.1f MiB (%.0f%%)", ui->verb, bar, lp->tensors_done,
			      lp->tensors_total, (double)lp->bytes_done / 1048576.0, (double)lp->bytes_total / 1048576.0,
			      100.0 * frac);
}

void wfs_ctl_tf_error(void *ctx, const char *path, const char *message)
{
	struct wfs_ctl_tf_ui *ui = ctx;

	wfs_ctl_progress_clear(&ui->progress);
	if (path)
		fprintf(stderr, "weightfsctl %s: %s: %s\n", ui->verb, wfs_ctl_display(path), message);
	else
		fprintf(stderr, "weightfsctl %s: %s\n", ui->verb, message);
}
