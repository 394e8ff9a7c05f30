/*
 * weightfsctl import / export: the command line around lib/st_import.h and lib/st_export.h, which
 * hold the formats, the checks and the tensor-file write protocol (lib/tensorfile.h). Here: options,
 * one progress line on a terminal, one line per error, JSON or text summaries, and --store.
 *
 * --store STORE: a store that is not mounted is mounted privately for the command: the weightfs
 * daemon next to this binary runs in the foreground on a temporary mount point and is unmounted at
 * the end. Going through the daemon, rather than lib/store and lib/catalog directly, keeps one
 * implementation of sealing, dedup, xattr validation and durability, and the daemon's lock on the
 * store keeps this command from racing another writer. A store already mounted is used through
 * its mount. Paths under a private mount are shown as STORE:path.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cmd.h"
#include "st_export.h"
#include "st_import.h"
#include "weightfs.h"

#define MOUNT_WAIT_MS 10000 /* how long the private daemon has to mount, or to exit */

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
	interrupted = sig;
}

/* SIGINT/SIGTERM/SIGHUP stop the copy at the next chunk, so temporary files and mounts are cleaned. */
static void catch_signals(void)
{
	struct sigaction sa = {.sa_handler = on_signal};

	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
}
/* ---- progress on a terminal -------------------------------------------------------------------- */

struct progress {
	const char *verb;
	bool tty;
	bool shown;
	size_t tensors_done, tensors_total;
	uint64_t bytes_done, bytes_total;
	struct timespec last;
};

static void progress_show(struct progress *p, bool force)
{
	struct timespec now;
	const int width = 24;
	double frac;
	int fill;
	char bar[32];

	if (!p->tty)
		return;
	clock_gettime(CLOCK_MONOTONIC, &now);
	if (!force && (now.tv_sec - p->last.tv_sec) * 1000 + (now.tv_nsec - p->last.tv_nsec) / 1000000 < 100)
		return;
	p->last = now;
	frac = p->bytes_total ? (double)p->bytes_done / (double)p->bytes_total
			      : (p->tensors_total ? (double)p->tensors_done / (double)p->tensors_total : 1.0);
	fill = (int)(frac * width);
	for (int i = 0; i < width; i++)
		bar[i] = i < fill ? '#' : '.';
	bar[width] = '\0';
	fprintf(stderr, "\r%s [%s] %zu/%zu tensors, %.1f/%.1f MiB (%.0f%%)\033[K", p->verb, bar, p->tensors_done,
		p->tensors_total, (double)p->bytes_done / 1048576.0, (double)p->bytes_total / 1048576.0,
		100.0 * frac);
	p->shown = true;
}

static void progress_clear(struct progress *p)
{
	if (p->shown)
		fputs("\r\033[K", stderr);
	p->shown = false;
}
/* ---- paths and stores --------------------------------------------------------------------------- */

/*
 * Paths under a private mount are shown as "STORE:path/in/store", not as the temporary mount point:
 * set by store_open(). disp() returns one of two rotating buffers (this command is one thread).
 */
static char private_root[PATH_MAX], private_label[PATH_MAX];

static const char *disp(const char *path)
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

/* Is @path on a fuse.weightfs mount (the mount with the longest prefix of its real path)? */
/* The library's progress callback: shown at most every 100 ms, always at the start and the end. */
static void on_progress(void *ctx, const struct wfs_tf_progress *lp)
{
	struct progress *p = ctx;

	p->tensors_done = lp->tensors_done;
	p->tensors_total = lp->tensors_total;
	p->bytes_done = lp->bytes_done;
	p->bytes_total = lp->bytes_total;
	progress_show(p, (lp->tensors_done == 0 && lp->bytes_done == 0) || lp->tensors_done == lp->tensors_total);
}

/* The library's error callback: one line, "weightfsctl VERB: PATH: reason". */
static void on_error(void *ctx, const char *path, const char *message)
{
	struct progress *p = ctx;

	progress_clear(p);
	if (path)
		fprintf(stderr, "weightfsctl %s: %s: %s\n", p->verb, disp(path), message);
	else
		fprintf(stderr, "weightfsctl %s: %s\n", p->verb, message);
}

/* A store mounted or mounted for this command; @root is where its namespace starts. */
struct target_store {
	char root[PATH_MAX];
	char tmpdir[PATH_MAX]; /* private mount: holds mnt/ and weightfs.log; "" otherwise */
	pid_t daemon;          /* private mount's daemon, or 0 */
};

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

/*
 * Make store @arg's namespace reachable at t->root: its existing mount, or a private one. @cmd names
 * the command in messages. Returns 0 or 1 (the error printed).
 */
static int store_open(const char *cmd, const char *arg, struct target_store *t)
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
	if (wfs_cmd_mount_of(store, t->root) == 0)
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
		if (waited >= MOUNT_WAIT_MS || interrupted) {
			kill(t->daemon, SIGTERM);
			wait_ms(t->daemon, &status, MOUNT_WAIT_MS);
			t->daemon = 0;
			fprintf(stderr, "weightfsctl %s: --store %s: %s\n", cmd, arg,
				interrupted ? "interrupted" : "not mounted after 10 s");
			return 1;
		}
		usleep(20000);
	}
	snprintf(t->root, sizeof(t->root), "%s", mnt);
	snprintf(private_root, sizeof(private_root), "%s", mnt);
	snprintf(private_label, sizeof(private_label), "%s", arg);
	return 0;
}

/* Undo store_open(): unmount a private mount and wait for its daemon. Returns 0 or 1 (printed). */
static int store_close(const char *cmd, struct target_store *t)
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

/*
 * The directory @dir names, below t->root when a store was given ("/" or "." being its root; a ".."
 * component would leave the store: -EINVAL). Returns 0, -EINVAL or -ENAMETOOLONG.
 */
static int resolve_dir(const struct target_store *t, bool have_store, const char *dir, char *out)
{
	if (!have_store) {
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

/* Print @obj (a JSON summary; consumed) on stdout. */
static void print_json(json_t *obj)
{
	char *text = obj ? json_dumps(obj, JSON_PRESERVE_ORDER) : NULL; /* one line, like stat --json */

	if (text)
		printf("%s\n", text);
	free(text);
	json_decref(obj);
}
/* ---- import ------------------------------------------------------------------------------------- */

static void import_usage(FILE *out)
{
	fprintf(out,
		"usage: weightfsctl import [--force] [--json] CHECKPOINT DIR\n"
		"       weightfsctl import --store STORE [--force] [--json] CHECKPOINT [DIR]\n\n"
		"Write each tensor of a safetensors checkpoint as a file DIR/<tensor name> with its\n"
		"user.weightfs.dtype and user.weightfs.shape xattrs; '/' in a name makes directories.\n"
		"CHECKPOINT is a .safetensors file, or a sharded checkpoint's index (NAME.json: its\n"
		"weight_map names the shards, every one is imported and checked against the map).\n"
		"The checkpoint's __metadata__ goes into DIR's " WFS_XATTR_ST_META " xattr\n"
		"(an index's metadata into " WFS_XATTR_ST_INDEX "). Every header is checked before\n"
		"anything is written; a malformed one is refused with its byte offset and the reason.\n"
		"Identical tensors are stored once. DIR is made when missing.\n\n"
		"  --store STORE  import into the store's namespace, DIR being a path in it (default: its\n"
		"                 root); an unmounted store is mounted privately for the import\n"
		"  --force        replace tensors that already exist in DIR, and DIR's metadata\n"
		"  --json         print a JSON summary\n\n"
		"Each tensor appears under its name only complete and with its xattrs; tensors written\n"
		"before an error stay. Progress is shown on a terminal.\n\n"
		"exit status: 0 imported, 1 malformed checkpoint or failed import, 2 usage error\n");
}

int wfs_cmd_import(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"store", required_argument, NULL, 's'}, {"force", no_argument, NULL, 'f'},
		{"json", no_argument, NULL, 'j'},        {"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct progress progress = {.verb = "import", .tty = isatty(STDERR_FILENO)};
	struct wfs_st_import_options opt = {
		.stop = &interrupted, .progress = on_progress, .error = on_error, .ctx = &progress,
	};
	struct wfs_st_import *im = NULL;
	struct wfs_st_import_summary sum = {0};
	struct target_store ts = {0};
	const char *store = NULL, *dir_arg, *checkpoint;
	char dir[PATH_MAX];
	bool json = false;
	int c, ret = 1;

	while ((c = getopt_long(argc, argv, "s:fjh", longopts, NULL)) != -1) {
		switch (c) {
		case 's':
			store = optarg;
			break;
		case 'f':
			opt.force = true;
			break;
		case 'j':
			json = true;
			break;
		case 'h':
			import_usage(stdout);
			return 0;
		default:
			import_usage(stderr);
			return 2;
		}
	}
	if (argc - optind != 2 && !(store && argc - optind == 1)) {
		import_usage(stderr);
		return 2;
	}
	checkpoint = argv[optind];
	dir_arg = argc - optind == 2 ? argv[optind + 1] : ".";
	catch_signals();
	if (wfs_st_import_open(checkpoint, &opt, &im))
		goto out;
	if (store && store_open("import", store, &ts))
		goto out;
	if ((c = resolve_dir(&ts, store != NULL, dir_arg, dir)) != 0) {
		fprintf(stderr, "weightfsctl import: %s: %s\n", dir_arg,
			c == -EINVAL ? "'..' would leave the store" : strerror(-c));
		goto out;
	}
	ret = wfs_st_import_run(im, dir) ? 1 : 0;
	progress_clear(&progress);
	wfs_st_import_summary(im, &sum);
	if (interrupted) {
		fprintf(stderr, "weightfsctl import: interrupted; %zu of %zu tensors imported\n", sum.tensors_done,
			sum.tensors);
		ret = 1;
	}
out:
	if (store_close("import", &ts))
		ret = 1;
	if (ret == 0 && json) {
		print_json(json_pack("{s:s, s:s, s:s?, s:I, s:I, s:I, s:I, s:b, s:b}", "checkpoint", checkpoint,
				     "dir", dir_arg, "store", store, "shards", (json_int_t)sum.shards, "tensors",
				     (json_int_t)sum.tensors, "bytes", (json_int_t)sum.bytes, "replaced",
				     (json_int_t)sum.replaced, "metadata", sum.metadata, "index_metadata",
				     sum.index_metadata));
	} else if (ret == 0) {
		printf("import: %zu tensors (%.1f MiB) from %s into %s%s%s\n", sum.tensors,
		       (double)sum.bytes / 1048576.0, checkpoint, store ? store : "", store ? ":" : "", dir_arg);
	}
	wfs_st_import_free(im);
	return ret;
}

/* ---- export ------------------------------------------------------------------------------------- */

static void export_usage(FILE *out)
{
	fprintf(out,
		"usage: weightfsctl export [--force] [--raw-ok] [--json] DIR OUT\n"
		"       weightfsctl export --store STORE [--force] [--raw-ok] [--json] DIR OUT\n\n"
		"Write every regular file below DIR as one tensor of the safetensors file OUT, named by its\n"
		"path relative to DIR, with the dtype and shape of its user.weightfs.dtype and\n"
		"user.weightfs.shape xattrs (its size must match them); anything below DIR that is not a\n"
		"regular file or a directory is an error. DIR's " WFS_XATTR_ST_META "\n"
		"xattr, if any, becomes the header's __metadata__. Tensors are laid out as the reference\n"
		"implementation does (largest dtype first, then by name), so the output depends only on\n"
		"the tensors, and a checkpoint that import wrote exports byte-identical.\n\n"
		"  --store STORE  DIR is a path in the store's namespace; an unmounted store is mounted\n"
		"                 privately for the export\n"
		"  --force        replace OUT when it exists\n"
		"  --raw-ok       export a file without dtype/shape xattrs as U8 [bytes] (default: error)\n"
		"  --json         print a JSON summary\n\n"
		"OUT is written to a temporary file next to it, synced and renamed, so it is either the\n"
		"old file or the complete new one. Progress is shown on a terminal.\n\n"
		"exit status: 0 exported, 1 failed, 2 usage error\n");
}

int wfs_cmd_export(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"store", required_argument, NULL, 's'}, {"force", no_argument, NULL, 'f'},
		{"raw-ok", no_argument, NULL, 'r'},      {"json", no_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},        {NULL, 0, NULL, 0},
	};
	struct progress progress = {.verb = "export", .tty = isatty(STDERR_FILENO)};
	struct wfs_st_export_options opt = {
		.stop = &interrupted, .progress = on_progress, .error = on_error, .ctx = &progress,
	};
	struct wfs_st_export_summary sum = {0};
	struct target_store ts = {0};
	const char *store = NULL, *out_arg;
	char dir[PATH_MAX];
	struct stat st;
	bool json = false;
	int c, ret = 1;

	while ((c = getopt_long(argc, argv, "s:frjh", longopts, NULL)) != -1) {
		switch (c) {
		case 's':
			store = optarg;
			break;
		case 'f':
			opt.force = true;
			break;
		case 'r':
			opt.raw_ok = true;
			break;
		case 'j':
			json = true;
			break;
		case 'h':
			export_usage(stdout);
			return 0;
		default:
			export_usage(stderr);
			return 2;
		}
	}
	if (argc - optind != 2) {
		export_usage(stderr);
		return 2;
	}
	out_arg = argv[optind + 1];
	catch_signals();
	if (stat(out_arg, &st) == 0) { /* before a private mount is made for nothing */
		if (!opt.force) {
			fprintf(stderr, "weightfsctl export: %s: exists (--force replaces it)\n", out_arg);
			return 1;
		}
		if (!S_ISREG(st.st_mode)) {
			fprintf(stderr, "weightfsctl export: %s: exists and is not a regular file\n", out_arg);
			return 1;
		}
	}
	if (store && store_open("export", store, &ts))
		goto out;
	if ((c = resolve_dir(&ts, store != NULL, argv[optind], dir)) != 0) {
		fprintf(stderr, "weightfsctl export: %s: %s\n", argv[optind],
			c == -EINVAL ? "'..' would leave the store" : strerror(-c));
		goto out;
	}
	ret = wfs_st_export(dir, out_arg, &opt, &sum) ? 1 : 0;
	if (interrupted) {
		fprintf(stderr, "weightfsctl export: interrupted; %s left as it was\n", out_arg);
		ret = 1;
	}
out:
	progress_clear(&progress);
	if (store_close("export", &ts))
		ret = 1;
	if (ret == 0 && json)
		print_json(json_pack("{s:s, s:s?, s:s, s:I, s:I, s:I, s:I, s:b, s:I}", "dir", argv[optind], "store",
				     store, "out", out_arg, "tensors", (json_int_t)sum.tensors, "header_bytes",
				     (json_int_t)sum.header_bytes, "data_bytes", (json_int_t)sum.data_bytes,
				     "file_bytes", (json_int_t)sum.file_bytes, "metadata", sum.metadata, "raw_files",
				     (json_int_t)sum.raw_files));
	else if (ret == 0)
		printf("export: %zu tensors (%.1f MiB) from %s%s%s into %s (%llu bytes)\n", sum.tensors,
		       (double)sum.data_bytes / 1048576.0, store ? store : "", store ? ":" : "", argv[optind],
		       out_arg, (unsigned long long)sum.file_bytes);
	return ret;
}
