/*
 * weightfsctl import / export: safetensors checkpoints into and out of a directory of tensor files
 * (lib/safetensors.h has the format and the layout export writes).
 *
 * import CHECKPOINT DIR: one file per tensor, named by its key ("model.layers.0.q_proj.weight", or
 * "a/b" as file b in directory a), with user.weightfs.dtype and user.weightfs.shape set; the
 * checkpoint's "__metadata__" goes into the user.weightfs.safetensors.metadata xattr of DIR (its JSON
 * object, canonical), a sharded checkpoint's index "metadata" into user.weightfs.safetensors.index.
 * Every header (all shards, and the index against them) is checked before the first byte is
 * written. Each tensor is written to DIR/<parent>/.wfs-import.<pid>.<n> with its xattrs set first,
 * closed (on weightfs the close seals the bytes, holds their size to the xattrs and reports seal
 * errors), and only then renamed to its name: a crash or an error never leaves a half-written tensor, or one without its xattrs, under a
 * tensor's name. Identical tensors are stored once by weightfs' content-addressed store.
 *
 * export DIR OUT: every regular file below DIR is a tensor named by its path relative to DIR; the
 * file is written to a temporary name next to OUT, synced, and renamed over OUT.
 *
 * Exporting what import wrote gives the imported file back, byte for byte, when that file has the
 * layout of lib/safetensors.h (any file export wrote; the reference writer's with at most one
 * metadata entry).
 *
 * --store STORE: a store that is not mounted is mounted privately for the command: the weightfs
 * daemon next to this binary runs in the foreground on a temporary mount point and is unmounted at
 * the end. Going through the daemon, rather than lib/store and lib/catalog directly, keeps one
 * implementation of sealing, dedup, xattr validation and durability, and the daemon's lock on the
 * store keeps this command from racing another writer. A store already mounted is used through
 * its mount.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <mntent.h>
#include <signal.h>
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
#include <dirent.h>
#include <unistd.h>

#include "cmd.h"
#include "dtype.h"
#include "safetensors.h"

#define META_XATTR "user.weightfs.safetensors.metadata"
#define INDEX_XATTR "user.weightfs.safetensors.index"
#define TMP_PREFIX ".wfs-import."
#define COPY_CHUNK (8u << 20)      /* bytes per copy_file_range call: progress moves at this grain */
#define RW_CHUNK (1u << 20)        /* bytes per read/write when copy_file_range cannot be used */
#define INDEX_MAX (256ull << 20)   /* largest index file read */
#define MOUNT_WAIT_MS 10000        /* how long the private daemon has to mount, or to exit */

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

/* ---- copying bytes ---------------------------------------------------------------------------------- */

struct copier {
	bool no_cfr; /* copy_file_range refused once (across filesystems, FUSE): read/write from now on */
	char *buf;   /* RW_CHUNK bytes, allocated on first use */
	struct progress *progress;
};

/*
 * Copy @bytes bytes from @in at @in_off to @out at @out_off (in order: weightfs hashes a file as it
 * is written). Returns 0, -EINTR (a signal asked us to stop), -ENODATA (@in ended early), or -errno.
 */
static int copy_range(struct copier *c, int in, uint64_t in_off, int out, uint64_t out_off, uint64_t bytes)
{
	while (bytes > 0) {
		size_t want = bytes < COPY_CHUNK ? (size_t)bytes : COPY_CHUNK;
		ssize_t n = -1;

		if (interrupted)
			return -EINTR;
		if (!c->no_cfr) {
			loff_t i = (loff_t)in_off, o = (loff_t)out_off;

			n = copy_file_range(in, &i, out, &o, want, 0);
			if (n < 0 && errno != EINTR && errno != ENOSPC && errno != EDQUOT && errno != EIO)
				c->no_cfr = true; /* EXDEV, EOPNOTSUPP, EINVAL, ...: not for these files */
			else if (n < 0 && errno != EINTR)
				return -errno;
		}
		if (c->no_cfr) {
			ssize_t w, done = 0;

			if (!c->buf && !(c->buf = malloc(RW_CHUNK)))
				return -ENOMEM;
			n = pread(in, c->buf, want < RW_CHUNK ? want : RW_CHUNK, (off_t)in_off);
			if (n < 0 && errno != EINTR)
				return -errno;
			while (n > 0 && done < n) {
				w = pwrite(out, c->buf + done, (size_t)(n - done), (off_t)(out_off + (uint64_t)done));
				if (w < 0 && errno == EINTR) {
					if (interrupted)
						return -EINTR;
					continue;
				}
				if (w < 0)
					return -errno;
				done += w;
			}
		}
		if (n == 0)
			return -ENODATA;
		if (n < 0)
			continue; /* EINTR: the loop head checks for a stop */
		in_off += (uint64_t)n;
		out_off += (uint64_t)n;
		bytes -= (uint64_t)n;
		if (c->progress) {
			c->progress->bytes_done += (uint64_t)n;
			progress_show(c->progress, false);
		}
	}
	return 0;
}

/* ---- paths and stores --------------------------------------------------------------------------- */

/* @s for a message: at most 80 bytes, control characters as '?'. */
static const char *printable(const char *s, char buf[96])
{
	size_t i = 0;

	for (; s[i] && i < 80; i++)
		buf[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
	while (s[i] && i > 0 && ((unsigned char)s[i] & 0xc0) == 0x80)
		i--; /* cut on a UTF-8 character boundary */
	snprintf(buf + i, 96 - i, "%s", s[i] ? "..." : "");
	return buf;
}

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
static bool on_weightfs(const char *path)
{
	char real[PATH_MAX];
	FILE *f;
	struct mntent *m;
	size_t best = 0;
	bool weightfs = false;

	if (!realpath(path, real) || !(f = setmntent("/proc/self/mounts", "r")))
		return false;
	while ((m = getmntent(f)) != NULL) {
		size_t len = strlen(m->mnt_dir);

		if (strncmp(real, m->mnt_dir, len) != 0 || (real[len] != '/' && real[len] != '\0' && len > 1))
			continue;
		if (len >= best) {
			best = len;
			weightfs = strcmp(m->mnt_type, "fuse.weightfs") == 0;
		}
	}
	endmntent(f);
	return weightfs;
}

/* "@a/@b" into @out (PATH_MAX bytes). Returns 0 or -ENAMETOOLONG. */
static int join(char *out, const char *a, const char *b)
{
	int n = snprintf(out, PATH_MAX, "%s%s%s", a, *a && a[strlen(a) - 1] != '/' ? "/" : "", b);

	return n < 0 || n >= PATH_MAX ? -ENAMETOOLONG : 0;
}

/* mkdir -p @path (absolute or relative). Returns 0 or -errno. */
static int mkdir_p(const char *path)
{
	char buf[PATH_MAX];
	size_t len = strlen(path);

	if (len >= sizeof(buf))
		return -ENAMETOOLONG;
	memcpy(buf, path, len + 1);
	for (char *p = buf + 1;; p++) {
		if (*p == '/' || *p == '\0') {
			char c = *p;
			struct stat st;

			*p = '\0';
			if (mkdir(buf, 0755) < 0 && errno != EEXIST)
				return -errno;
			if (stat(buf, &st) < 0)
				return -errno;
			if (!S_ISDIR(st.st_mode))
				return -ENOTDIR;
			*p = c;
			if (!c)
				return 0;
		}
	}
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
	if (join(probe, store, "catalog.db") == 0 && access(probe, F_OK) < 0 && !empty) {
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
	join(mnt, t->tmpdir, "mnt");
	join(log, t->tmpdir, "weightfs.log");
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
	join(mnt, t->tmpdir, "mnt");
	join(log, t->tmpdir, "weightfs.log");
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
	return join(out, t->root, dir);
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

struct shard {
	char *path;                /* as opened */
	const char *name;          /* as the index names it (NULL for a single file) */
	int fd;
	struct wfs_st_file *st;
};

struct item {
	const struct wfs_st_tensor *t;
	struct shard *shard;
};

static int item_by_name(const void *a, const void *b)
{
	return strcmp(((const struct item *)a)->t->name, ((const struct item *)b)->t->name);
}

static int item_by_file(const void *a, const void *b)
{
	const struct item *x = a, *y = b;

	if (x->shard != y->shard)
		return x->shard < y->shard ? -1 : 1;
	return x->t->begin < y->t->begin ? -1 : x->t->begin > y->t->begin ? 1 : strcmp(x->t->name, y->t->name);
}

struct import {
	const char *checkpoint;
	char dir[PATH_MAX];
	bool force, json;
	bool on_weightfs; /* else a plain directory: each file is fdatasync()ed before its rename */
	struct wfs_st_index *index;
	struct shard *shards;
	size_t nshards;
	struct item *items; /* every tensor of every shard */
	size_t nitems;
	struct wfs_st_file *meta; /* the shards' __metadata__, merged */
	uint64_t bytes;
	size_t replaced;
	struct progress progress;
	struct copier copier;
};

static int read_small_file(const char *path, char **out, size_t *len)
{
	struct stat st;
	char *buf;
	size_t got = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC), ret = 0;

	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size > INDEX_MAX) {
		ret = st.st_size > 0 && (uint64_t)st.st_size > INDEX_MAX ? -EFBIG : -errno;
		close(fd);
		return ret;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		close(fd);
		return -ENOMEM;
	}
	while (got < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			ret = n < 0 ? -errno : -EIO;
			break;
		}
		got += (size_t)n;
	}
	close(fd);
	if (ret) {
		free(buf);
		return ret;
	}
	buf[got] = '\0';
	*out = buf;
	*len = got;
	return 0;
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);

	return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Open and parse every shard (one, for a single file). Returns 0 or 1 (printed). */
static int import_read_headers(struct import *im)
{
	char err[WFS_ST_ERR_MAX];
	int ret;

	if (ends_with(im->checkpoint, ".json")) {
		char *text = NULL, *dir, *slash;
		size_t len = 0;

		ret = read_small_file(im->checkpoint, &text, &len);
		if (ret) {
			fprintf(stderr, "weightfsctl import: %s: %s\n", im->checkpoint,
				ret == -EFBIG ? "index file over 256 MiB" : strerror(-ret));
			return 1;
		}
		ret = wfs_st_index_parse(text, len, &im->index, err, sizeof(err));
		free(text);
		if (ret) {
			fprintf(stderr, "weightfsctl import: %s: %s\n", im->checkpoint,
				ret == -ENOMEM ? strerror(ENOMEM) : err);
			return 1;
		}
		im->shards = calloc(im->index->nshards + 1, sizeof(*im->shards));
		dir = strdup(im->checkpoint);
		if (!im->shards || !dir) {
			free(dir);
			fprintf(stderr, "weightfsctl import: %s\n", strerror(ENOMEM));
			return 1;
		}
		slash = strrchr(dir, '/');
		if (slash)
			slash[1] = '\0';
		else
			dir[0] = '\0';
		for (size_t i = 0; i < im->index->nshards; i++) {
			struct shard *s = &im->shards[im->nshards++];
			size_t n = strlen(dir) + strlen(im->index->shards[i]) + 1;

			s->fd = -1;
			s->name = im->index->shards[i];
			s->path = malloc(n);
			if (!s->path) {
				free(dir);
				fprintf(stderr, "weightfsctl import: %s\n", strerror(ENOMEM));
				return 1;
			}
			snprintf(s->path, n, "%s%s", dir, s->name);
		}
		free(dir);
	} else {
		im->shards = calloc(1, sizeof(*im->shards));
		if (!im->shards || !(im->shards[0].path = strdup(im->checkpoint))) {
			fprintf(stderr, "weightfsctl import: %s\n", strerror(ENOMEM));
			return 1;
		}
		im->shards[0].fd = -1;
		im->nshards = 1;
	}
	for (size_t i = 0; i < im->nshards; i++) {
		struct shard *s = &im->shards[i];

		s->fd = open(s->path, O_RDONLY | O_CLOEXEC);
		if (s->fd < 0) {
			fprintf(stderr, "weightfsctl import: %s: %s\n", s->path, strerror(errno));
			return 1;
		}
		ret = wfs_st_read_fd(s->fd, &s->st, err, sizeof(err));
		if (ret) {
			fprintf(stderr, "weightfsctl import: %s: %s\n", s->path, err);
			return 1;
		}
	}
	return 0;
}

/* Gather all tensors, check them against the index and as file names, merge metadata. 0 or 1. */
static int import_plan(struct import *im)
{
	char err[WFS_ST_ERR_MAX], b[96], b2[96];
	size_t n = 0;

	for (size_t i = 0; i < im->nshards; i++)
		n += im->shards[i].st->ntensors;
	im->items = calloc(n + 1, sizeof(*im->items));
	im->meta = wfs_st_new();
	if (!im->items || !im->meta) {
		fprintf(stderr, "weightfsctl import: %s\n", strerror(ENOMEM));
		return 1;
	}
	for (size_t i = 0; i < im->nshards; i++) {
		struct shard *s = &im->shards[i];

		for (size_t j = 0; j < s->st->ntensors; j++) {
			const struct wfs_st_tensor *t = &s->st->tensors[j];
			const char *mapped = im->index ? wfs_st_index_shard(im->index, t->name) : NULL;

			if (im->index && !mapped) {
				fprintf(stderr, "weightfsctl import: %s: tensor '%s' is not in the index's weight_map\n",
					s->path, printable(t->name, b));
				return 1;
			}
			if (im->index && strcmp(mapped, s->name) != 0) {
				fprintf(stderr, "weightfsctl import: %s: tensor '%s' is in %s, but the index maps it to %s\n",
					im->checkpoint, printable(t->name, b), s->name, mapped);
				return 1;
			}
			im->items[im->nitems].t = t;
			im->items[im->nitems++].shard = s;
			im->bytes += t->end - t->begin;
		}
		for (size_t j = 0; j < s->st->nmeta; j++) {
			const struct wfs_st_meta *m = &s->st->meta[j];

			for (size_t k = 0; k < im->meta->nmeta; k++) {
				if (strcmp(im->meta->meta[k].key, m->key) == 0 &&
				    strcmp(im->meta->meta[k].value, m->value) != 0) {
					fprintf(stderr, "weightfsctl import: %s: __metadata__ '%s' differs from an earlier "
						"shard's\n", s->path, printable(m->key, b));
					return 1;
				}
			}
			if (wfs_st_set_meta(im->meta, m->key, m->value)) {
				fprintf(stderr, "weightfsctl import: %s\n", strerror(ENOMEM));
				return 1;
			}
		}
		if (s->st->has_metadata)
			im->meta->has_metadata = true;
	}
	qsort(im->items, im->nitems, sizeof(*im->items), item_by_name);
	if (im->index && im->nitems != im->index->nentries) {
		for (size_t i = 0; i < im->index->nentries; i++) {
			struct wfs_st_tensor key = {.name = im->index->entries[i].name};
			struct item k = {.t = &key};

			if (!bsearch(&k, im->items, im->nitems, sizeof(*im->items), item_by_name)) {
				fprintf(stderr, "weightfsctl import: %s: tensor '%s' is not in %s, where the index maps it\n",
					im->checkpoint, printable(key.name, b), im->index->entries[i].shard);
				return 1;
			}
		}
	}
	for (size_t i = 0; i < im->nitems; i++) {
		const char *name = im->items[i].t->name;

		if (i && strcmp(im->items[i - 1].t->name, name) == 0) {
			fprintf(stderr, "weightfsctl import: %s: tensor '%s' is in two shards\n", im->checkpoint,
				printable(name, b));
			return 1;
		}
		if (wfs_st_name_check(name, err, sizeof(err))) {
			fprintf(stderr, "weightfsctl import: %s: %s\n", im->items[i].shard->path, err);
			return 1;
		}
		/* "a" and "a/b" cannot both be tensors: "a" would be a file and a directory. */
		for (const char *slash = strchr(name, '/'); slash; slash = strchr(slash + 1, '/')) {
			char prefix[PATH_MAX];
			struct wfs_st_tensor key = {.name = prefix};
			struct item k = {.t = &key};

			snprintf(prefix, sizeof(prefix), "%.*s", (int)(slash - name), name);
			if (bsearch(&k, im->items, im->nitems, sizeof(*im->items), item_by_name)) {
				fprintf(stderr, "weightfsctl import: %s: tensor '%s' is also a directory of tensor '%s'\n",
					im->checkpoint, printable(prefix, b), printable(name, b2));
				return 1;
			}
		}
	}
	return 0;
}

/*
 * Before writing anything: refuse names that exist in DIR (unless @force), a tensor whose name is a
 * directory there, a parent that is a file, and metadata that differs from DIR's (unless @force).
 */
static int import_check_targets(struct import *im)
{
	char path[PATH_MAX], b[96];
	struct stat st;

	for (size_t i = 0; i < im->nitems; i++) {
		const char *name = im->items[i].t->name;

		for (const char *slash = strchr(name, '/'); slash; slash = strchr(slash + 1, '/')) {
			char prefix[PATH_MAX];

			snprintf(prefix, sizeof(prefix), "%.*s", (int)(slash - name), name);
			if (join(path, im->dir, prefix) == 0 && stat(path, &st) == 0 && !S_ISDIR(st.st_mode)) {
				fprintf(stderr, "weightfsctl import: %s: a file, but tensor '%s' needs it to be a directory\n",
					disp(path), printable(name, b));
				return 1;
			}
		}
		if (join(path, im->dir, name)) {
			fprintf(stderr, "weightfsctl import: %s/%s: %s\n", disp(im->dir), printable(name, b),
				strerror(ENAMETOOLONG));
			return 1;
		}
		if (lstat(path, &st) < 0)
			continue;
		if (S_ISDIR(st.st_mode)) {
			fprintf(stderr, "weightfsctl import: %s: a directory, where tensor '%s' goes\n", disp(path),
				printable(name, b));
			return 1;
		}
		if (!im->force) {
			fprintf(stderr, "weightfsctl import: %s: exists (--force replaces it)\n", disp(path));
			return 1;
		}
		im->replaced++;
	}
	if (im->meta->has_metadata && !im->force) {
		char *want, have[65536];
		size_t len;
		ssize_t n = lgetxattr(im->dir, META_XATTR, have, sizeof(have));

		if (n >= 0) {
			if (wfs_st_meta_json(im->meta, &want, &len)) {
				fprintf(stderr, "weightfsctl import: %s\n", strerror(ENOMEM));
				return 1;
			}
			if ((size_t)n != len || memcmp(have, want, len) != 0) {
				free(want);
				fprintf(stderr, "weightfsctl import: %s: holds other safetensors metadata (%s; "
					"--force replaces it)\n", disp(im->dir), META_XATTR);
				return 1;
			}
			free(want);
		}
	}
	return 0;
}

/* Set xattr @name = @value (@len bytes) on @fd (file @path, for the message), with one clear message.
 * 0 or 1. */
static int set_xattr(int fd, const char *path, const char *name, const void *value, size_t len)
{
	if (fsetxattr(fd, name, value, len, 0) == 0)
		return 0;
	if (errno == ENOTSUP)
		fprintf(stderr, "weightfsctl import: %s: cannot set %s: the filesystem keeps no user xattrs, "
			"so dtype and shape would be lost (import into a weightfs mount)\n", disp(path), name);
	else if (errno == E2BIG || errno == ERANGE || errno == ENOSPC)
		fprintf(stderr, "weightfsctl import: %s: cannot set %s: %zu bytes is over the filesystem's xattr "
			"size limit (%s)\n", disp(path), name, len, strerror(errno));
	else
		fprintf(stderr, "weightfsctl import: %s: cannot set %s: %s\n", disp(path), name, strerror(errno));
	return 1;
}

/* Write tensor @it: tmp file, xattrs, bytes, close (the seal, held to the xattrs), rename. 0 or 1
 * (printed). */
static int import_one(struct import *im, const struct item *it, unsigned long seq)
{
	const struct wfs_st_tensor *t = it->t;
	char final[PATH_MAX], tmp[PATH_MAX], parent[PATH_MAX], tmpname[64], shape[WFS_ST_MAX_DIMS * 21 + 2];
	char b[96];
	const char *slash = strrchr(t->name, '/');
	uint64_t data_start = 8 + it->shard->st->header_bytes;
	int fd, ret = 0;

	snprintf(parent, sizeof(parent), "%s", im->dir);
	if (slash) {
		char sub[PATH_MAX];

		snprintf(sub, sizeof(sub), "%.*s", (int)(slash - t->name), t->name);
		if (join(parent, im->dir, sub) || (ret = mkdir_p(parent)) != 0) {
			fprintf(stderr, "weightfsctl import: %s: cannot make the directory: %s\n", disp(parent),
				strerror(ret ? -ret : ENAMETOOLONG));
			return 1;
		}
	}
	snprintf(tmpname, sizeof(tmpname), TMP_PREFIX "%ld.%lu", (long)getpid(), seq);
	if (join(final, im->dir, t->name) || join(tmp, parent, tmpname)) {
		fprintf(stderr, "weightfsctl import: %s/%s: %s\n", disp(im->dir), printable(t->name, b),
			strerror(ENAMETOOLONG));
		return 1;
	}
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0) {
		fprintf(stderr, "weightfsctl import: %s: %s\n", disp(tmp), strerror(errno));
		return 1;
	}
	wfs_st_shape_format(t->shape, t->ndim, shape, sizeof(shape));
	if (set_xattr(fd, tmp, SHAPE_XATTR, shape, strlen(shape)) ||
	    set_xattr(fd, tmp, DTYPE_XATTR, t->dtype, strlen(t->dtype))) {
		close(fd);
		unlink(tmp);
		return 1;
	}
	ret = copy_range(&im->copier, it->shard->fd, data_start + t->begin, fd, 0, t->end - t->begin);
	if (ret == 0 && !im->on_weightfs && fdatasync(fd) < 0)
		ret = -errno;
	if (close(fd) < 0 && ret == 0)
		ret = -errno; /* on weightfs: the seal's error (ENOSPC, EIO) */
	if (ret) {
		unlink(tmp);
		if (ret == -EINTR)
			return 1; /* reported once by the caller */
		if (ret == -ENODATA)
			fprintf(stderr, "weightfsctl import: %s: ended inside tensor '%s' (the file got shorter)\n",
				it->shard->path, printable(t->name, b));
		else
			fprintf(stderr, "weightfsctl import: %s: %s\n", disp(final), strerror(-ret));
		return 1;
	}
	if (rename(tmp, final) < 0) {
		fprintf(stderr, "weightfsctl import: %s: cannot rename %s into place: %s\n", disp(final), tmpname,
			strerror(errno));
		unlink(tmp);
		return 1;
	}
	return 0;
}

static int import_run(struct import *im)
{
	char *text;
	size_t len;
	int fd;

	int ret = mkdir_p(im->dir);

	if (ret) {
		fprintf(stderr, "weightfsctl import: %s: cannot make the directory: %s\n", disp(im->dir),
			strerror(-ret));
		return 1;
	}
	im->on_weightfs = on_weightfs(im->dir);
	if (import_check_targets(im))
		return 1;
	/* In file order: each shard is read front to back. */
	qsort(im->items, im->nitems, sizeof(*im->items), item_by_file);
	im->progress.tensors_total = im->nitems;
	im->progress.bytes_total = im->bytes;
	im->copier.progress = &im->progress;
	progress_show(&im->progress, true);
	for (size_t i = 0; i < im->nitems; i++) {
		if (import_one(im, &im->items[i], (unsigned long)i))
			return 1;
		im->progress.tensors_done++;
		progress_show(&im->progress, i + 1 == im->nitems);
	}
	progress_clear(&im->progress);
	fd = open(im->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "weightfsctl import: %s: %s\n", disp(im->dir), strerror(errno));
		return 1;
	}
	if (im->meta->has_metadata) {
		int bad;

		if (wfs_st_meta_json(im->meta, &text, &len)) {
			fprintf(stderr, "weightfsctl import: %s\n", strerror(ENOMEM));
			close(fd);
			return 1;
		}
		bad = set_xattr(fd, im->dir, META_XATTR, text, len);
		free(text);
		if (bad) {
			close(fd);
			return 1;
		}
	}
	if (im->index && im->index->metadata &&
	    set_xattr(fd, im->dir, INDEX_XATTR, im->index->metadata, strlen(im->index->metadata))) {
		close(fd);
		return 1;
	}
	/* On weightfs, fsync of a directory makes the namespace (the renames) durable. */
	if (fsync(fd) < 0 && errno != EINVAL && errno != ENOSYS) {
		fprintf(stderr, "weightfsctl import: %s: fsync: %s\n", disp(im->dir), strerror(errno));
		close(fd);
		return 1;
	}
	close(fd);
	return 0;
}

static void import_free(struct import *im)
{
	for (size_t i = 0; i < im->nshards; i++) {
		if (im->shards[i].fd >= 0)
			close(im->shards[i].fd);
		free(im->shards[i].path);
		wfs_st_free(im->shards[i].st);
	}
	free(im->shards);
	free(im->items);
	wfs_st_free(im->meta);
	wfs_st_index_free(im->index);
	free(im->copier.buf);
}

static void import_usage(FILE *out)
{
	fprintf(out,
		"usage: weightfsctl import [--force] [--json] CHECKPOINT DIR\n"
		"       weightfsctl import --store STORE [--force] [--json] CHECKPOINT [DIR]\n\n"
		"Write each tensor of a safetensors checkpoint as a file DIR/<tensor name> with its\n"
		"user.weightfs.dtype and user.weightfs.shape xattrs; '/' in a name makes directories.\n"
		"CHECKPOINT is a .safetensors file, or a sharded checkpoint's index (NAME.json: its\n"
		"weight_map names the shards, every one is imported and checked against the map).\n"
		"The checkpoint's __metadata__ goes into DIR's " META_XATTR " xattr\n"
		"(an index's metadata into " INDEX_XATTR "). Every header is checked before\n"
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
	struct import im = {.progress = {.verb = "import", .tty = isatty(STDERR_FILENO)}};
	struct target_store ts = {0};
	const char *store = NULL, *dir_arg;
	int c, ret = 1;

	while ((c = getopt_long(argc, argv, "s:fjh", longopts, NULL)) != -1) {
		switch (c) {
		case 's':
			store = optarg;
			break;
		case 'f':
			im.force = true;
			break;
		case 'j':
			im.json = true;
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
	im.checkpoint = argv[optind];
	dir_arg = argc - optind == 2 ? argv[optind + 1] : ".";
	catch_signals();
	if (import_read_headers(&im) || import_plan(&im))
		goto out;
	if (store && store_open("import", store, &ts))
		goto out;
	if ((c = resolve_dir(&ts, store != NULL, dir_arg, im.dir)) != 0) {
		fprintf(stderr, "weightfsctl import: %s: %s\n", dir_arg,
			c == -EINVAL ? "'..' would leave the store" : strerror(-c));
		goto out;
	}
	ret = import_run(&im);
	progress_clear(&im.progress);
	if (interrupted) {
		fprintf(stderr, "weightfsctl import: interrupted; %zu of %zu tensors imported\n",
			im.progress.tensors_done, im.nitems);
		ret = 1;
	}
out:
	if (store_close("import", &ts))
		ret = 1;
	if (ret == 0 && im.json) {
		print_json(json_pack("{s:s, s:s, s:s?, s:I, s:I, s:I, s:I, s:b, s:b}", "checkpoint", im.checkpoint,
				     "dir", dir_arg, "store", store, "shards",
				     (json_int_t)im.nshards, "tensors", (json_int_t)im.nitems, "bytes",
				     (json_int_t)im.bytes, "replaced", (json_int_t)im.replaced, "metadata",
				     im.meta->has_metadata, "index_metadata", im.index && im.index->metadata));
	} else if (ret == 0) {
		printf("import: %zu tensors (%.1f MiB) from %s into %s%s%s\n", im.nitems,
		       (double)im.bytes / 1048576.0, im.checkpoint, store ? store : "",
		       store ? ":" : "", dir_arg);
	}
	import_free(&im);
	return ret;
}

/* ---- export ------------------------------------------------------------------------------------- */

struct export {
	char dir[PATH_MAX];
	const char *out;
	bool force, raw_ok, json;
	struct stat out_st;      /* OUT as it was (to leave it out of the walk), when @out_exists */
	bool out_exists;
	struct wfs_st_file *st;
	size_t raw;              /* files exported as U8 [bytes] (--raw-ok) */
	struct progress progress;
	struct copier copier;
};

/* Read xattr @name of @path into @buf (@size bytes, NUL-terminated). Length, -ENODATA, or -errno. */
static ssize_t get_xattr(const char *path, const char *name, char *buf, size_t size)
{
	ssize_t n = lgetxattr(path, name, buf, size - 1);

	if (n < 0)
		return errno == ENOTSUP ? -ENODATA : -errno;
	buf[n] = '\0';
	return n;
}

/* Add file @path (tensor @rel, @bytes long) from its xattrs. 0 or 1 (printed). */
static int export_add(struct export *ex, const char *path, const char *rel, uint64_t bytes)
{
	char dtype[64], shape_text[2048], err[WFS_ST_ERR_MAX];
	uint64_t shape[WFS_ST_MAX_DIMS], want;
	unsigned ndim = 0;
	ssize_t nd, ns;
	int ret;

	if (wfs_st_name_check(rel, err, sizeof(err))) {
		fprintf(stderr, "weightfsctl export: %s: cannot be a tensor name: %s\n", disp(path), err);
		return 1;
	}
	nd = get_xattr(path, DTYPE_XATTR, dtype, sizeof(dtype));
	ns = get_xattr(path, SHAPE_XATTR, shape_text, sizeof(shape_text));
	if ((nd < 0 && nd != -ENODATA) || (ns < 0 && ns != -ENODATA)) {
		fprintf(stderr, "weightfsctl export: %s: cannot read its xattrs: %s\n", disp(path),
			strerror((int)-(nd < 0 && nd != -ENODATA ? nd : ns)));
		return 1;
	}
	if (nd == -ENODATA && ns == -ENODATA && ex->raw_ok) {
		snprintf(dtype, sizeof(dtype), "U8");
		shape[0] = bytes;
		ndim = 1;
		ex->raw++;
	} else if (nd == -ENODATA || ns == -ENODATA) {
		fprintf(stderr, "weightfsctl export: %s: no %s xattr%s\n", disp(path),
			nd == -ENODATA && ns == -ENODATA ? DTYPE_XATTR "/" SHAPE_XATTR
			: nd == -ENODATA ? DTYPE_XATTR : SHAPE_XATTR,
			nd == -ENODATA && ns == -ENODATA ? "s: not a tensor (--raw-ok exports it as U8 [bytes])" : "");
		return 1;
	} else if (wfs_st_shape_parse(shape_text, (size_t)ns, shape, &ndim)) {
		fprintf(stderr, "weightfsctl export: %s: %s \"%.64s\" is not a shape like [4096,1024]\n", disp(path),
			SHAPE_XATTR, shape_text);
		return 1;
	}
	ret = wfs_st_add_tensor(ex->st, rel, dtype, ndim, shape);
	if (ret == -ENOMEM) {
		fprintf(stderr, "weightfsctl export: %s\n", strerror(ENOMEM));
		return 1;
	}
	if (ret) {
		fprintf(stderr, "weightfsctl export: %s: %s \"%.20s\" with shape %.64s is not a tensor safetensors "
			"can hold\n", disp(path), DTYPE_XATTR, dtype, shape_text);
		return 1;
	}
	want = ex->st->tensors[ex->st->ntensors - 1].dtype_bytes;
	for (unsigned d = 0; d < ndim; d++)
		want *= shape[d];
	if (want != bytes) {
		fprintf(stderr, "weightfsctl export: %s: %llu bytes, but %s x %s is %llu bytes\n", disp(path),
			(unsigned long long)bytes, dtype, ndim ? shape_text : "[]", (unsigned long long)want);
		return 1;
	}
	return 0;
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Walk directory @path (tensor names below it start with @rel), sorted. 0 or 1 (printed). */
static int export_walk(struct export *ex, const char *path, const char *rel)
{
	DIR *d = opendir(path);
	struct dirent *e;
	char **names = NULL, sub[PATH_MAX], subrel[PATH_MAX];
	size_t n = 0, cap = 0;
	int ret = 0;

	if (!d) {
		fprintf(stderr, "weightfsctl export: %s: %s\n", disp(path), strerror(errno));
		return 1;
	}
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (n == cap) {
			char **grown = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof(*names));

			if (!grown) {
				ret = -ENOMEM;
				break;
			}
			names = grown;
		}
		if (!(names[n] = strdup(e->d_name))) {
			ret = -ENOMEM;
			break;
		}
		n++;
	}
	closedir(d);
	if (ret) {
		fprintf(stderr, "weightfsctl export: %s\n", strerror(-ret));
		ret = 1;
		goto out;
	}
	if (n)
		qsort(names, n, sizeof(*names), name_cmp);
	for (size_t i = 0; i < n && !ret; i++) {
		struct stat st;

		if (join(sub, path, names[i]) || (*rel ? join(subrel, rel, names[i]) : 0)) {
			fprintf(stderr, "weightfsctl export: %s/%s: %s\n", disp(path), names[i], strerror(ENAMETOOLONG));
			ret = 1;
			break;
		}
		if (!*rel)
			snprintf(subrel, sizeof(subrel), "%s", names[i]);
		if (lstat(sub, &st) < 0) {
			fprintf(stderr, "weightfsctl export: %s: %s\n", disp(sub), strerror(errno));
			ret = 1;
		} else if (S_ISDIR(st.st_mode)) {
			ret = export_walk(ex, sub, subrel);
		} else if (!S_ISREG(st.st_mode)) {
			fprintf(stderr, "weightfsctl export: %s: not a regular file or a directory\n", disp(sub));
			ret = 1;
		} else if (!(ex->out_exists && st.st_dev == ex->out_st.st_dev && st.st_ino == ex->out_st.st_ino)) {
			ret = export_add(ex, sub, subrel, (uint64_t)st.st_size);
		}
	}
out:
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	return ret;
}

static int write_all_at(int fd, const char *buf, size_t len, uint64_t off)
{
	while (len > 0) {
		ssize_t n = pwrite(fd, buf, len, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		buf += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

/* Header, then every tensor's bytes, into a temp file renamed to OUT. 0 or 1 (printed). */
static int export_write(struct export *ex)
{
	char tmp[PATH_MAX], outdir[PATH_MAX], err[WFS_ST_ERR_MAX], *header = NULL;
	const char *base = strrchr(ex->out, '/');
	size_t header_len;
	int fd = -1, ret;

	ret = wfs_st_layout(ex->st, err, sizeof(err));
	if (ret == 0)
		ret = wfs_st_encode(ex->st, &header, &header_len);
	if (ret) {
		fprintf(stderr, "weightfsctl export: %s: %s\n", disp(ex->dir),
			ret == -EFBIG ? "the header would be over 100 MB" : ret == -ENOMEM ? strerror(ENOMEM) : err);
		return 1;
	}
	snprintf(outdir, sizeof(outdir), "%.*s", base ? (int)(base - ex->out + 1) : 0, ex->out);
	if (snprintf(tmp, sizeof(tmp), "%s.%.180s.wfs-export.XXXXXX", outdir, base ? base + 1 : ex->out) >=
	    (int)sizeof(tmp)) {
		fprintf(stderr, "weightfsctl export: %s: %s\n", ex->out, strerror(ENAMETOOLONG));
		free(header);
		return 1;
	}
	fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "weightfsctl export: %s: cannot create a temporary file: %s\n", tmp, strerror(errno));
		free(header);
		return 1;
	}
	fchmod(fd, 0644);
	ret = write_all_at(fd, header, header_len, 0);
	if (ret)
		fprintf(stderr, "weightfsctl export: %s: %s\n", tmp, strerror(-ret));
	ex->progress.tensors_total = ex->st->ntensors;
	ex->progress.bytes_total = ex->st->data_bytes;
	ex->copier.progress = &ex->progress;
	progress_show(&ex->progress, true);
	for (size_t i = 0; i < ex->st->ntensors && ret == 0; i++) {
		const struct wfs_st_tensor *t = &ex->st->tensors[i];
		char path[PATH_MAX];
		struct stat st;
		int in;

		join(path, ex->dir, t->name); /* fitted when the walk found it */
		in = open(path, O_RDONLY | O_CLOEXEC);
		if (in < 0 || fstat(in, &st) < 0) {
			ret = -errno;
			fprintf(stderr, "weightfsctl export: %s: %s\n", disp(path), strerror(-ret));
		} else if ((uint64_t)st.st_size != t->end - t->begin) {
			ret = -ESTALE;
			fprintf(stderr, "weightfsctl export: %s: changed while exporting (%llu bytes, was %llu)\n", disp(path),
				(unsigned long long)st.st_size, (unsigned long long)(t->end - t->begin));
		} else {
			ret = copy_range(&ex->copier, in, 0, fd, header_len + t->begin, t->end - t->begin);
			if (ret && ret != -EINTR)
				fprintf(stderr, "weightfsctl export: %s: %s\n", disp(path),
					ret == -ENODATA ? "changed while exporting (got shorter)" : strerror(-ret));
		}
		if (in >= 0)
			close(in);
		ex->progress.tensors_done++;
		progress_show(&ex->progress, i + 1 == ex->st->ntensors);
	}
	progress_clear(&ex->progress);
	free(header);
	if (ret) { /* reported above */
		close(fd);
		unlink(tmp);
		return 1;
	}
	if (fsync(fd) < 0)
		ret = -errno;
	if (close(fd) < 0 && ret == 0)
		ret = -errno;
	if (ret) {
		fprintf(stderr, "weightfsctl export: %s: %s\n", tmp, strerror(-ret));
		unlink(tmp);
		return 1;
	}
	if (ex->force) {
		ret = rename(tmp, ex->out) < 0 ? -errno : 0;
	} else {
		ret = renameat2(AT_FDCWD, tmp, AT_FDCWD, ex->out, RENAME_NOREPLACE) < 0 ? -errno : 0;
		if (ret == -EINVAL || ret == -ENOSYS) /* the filesystem cannot: link() fails on EEXIST too */
			ret = link(tmp, ex->out) < 0 ? -errno : unlink(tmp) < 0 ? -errno : 0;
	}
	if (ret) {
		fprintf(stderr, "weightfsctl export: %s: %s\n", ex->out,
			ret == -EEXIST ? "exists (--force replaces it)" : strerror(-ret));
		unlink(tmp);
		return 1;
	}
	fd = open(*outdir ? outdir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
	return 0;
}

static void export_usage(FILE *out)
{
	fprintf(out,
		"usage: weightfsctl export [--force] [--raw-ok] [--json] DIR OUT\n"
		"       weightfsctl export --store STORE [--force] [--raw-ok] [--json] DIR OUT\n\n"
		"Write every regular file below DIR as one tensor of the safetensors file OUT, named by its\n"
		"path relative to DIR, with the dtype and shape of its user.weightfs.dtype and\n"
		"user.weightfs.shape xattrs (its size must match them); anything below DIR that is not a\n"
		"regular file or a directory is an error. DIR's " META_XATTR "\n"
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
	struct export ex = {.progress = {.verb = "export", .tty = isatty(STDERR_FILENO)}};
	struct target_store ts = {0};
	const char *store = NULL;
	char meta[65536], err[WFS_ST_ERR_MAX];
	ssize_t n;
	struct stat st;
	int c, ret = 1;

	while ((c = getopt_long(argc, argv, "s:frjh", longopts, NULL)) != -1) {
		switch (c) {
		case 's':
			store = optarg;
			break;
		case 'f':
			ex.force = true;
			break;
		case 'r':
			ex.raw_ok = true;
			break;
		case 'j':
			ex.json = true;
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
	ex.out = argv[optind + 1];
	catch_signals();
	ex.out_exists = stat(ex.out, &ex.out_st) == 0;
	if (ex.out_exists && !ex.force) {
		fprintf(stderr, "weightfsctl export: %s: exists (--force replaces it)\n", ex.out);
		return 1;
	}
	if (ex.out_exists && !S_ISREG(ex.out_st.st_mode)) {
		fprintf(stderr, "weightfsctl export: %s: exists and is not a regular file\n", ex.out);
		return 1;
	}
	ex.st = wfs_st_new();
	if (!ex.st) {
		fprintf(stderr, "weightfsctl export: %s\n", strerror(ENOMEM));
		return 1;
	}
	if (store && store_open("export", store, &ts))
		goto out;
	if ((c = resolve_dir(&ts, store != NULL, argv[optind], ex.dir)) != 0) {
		fprintf(stderr, "weightfsctl export: %s: %s\n", argv[optind],
			c == -EINVAL ? "'..' would leave the store" : strerror(-c));
		goto out;
	}
	if (stat(ex.dir, &st) < 0) {
		fprintf(stderr, "weightfsctl export: %s: %s\n", disp(ex.dir), strerror(errno));
		goto out;
	}
	if (!S_ISDIR(st.st_mode)) {
		fprintf(stderr, "weightfsctl export: %s: not a directory\n", disp(ex.dir));
		goto out;
	}
	n = get_xattr(ex.dir, META_XATTR, meta, sizeof(meta));
	if (n < 0 && n != -ENODATA) {
		fprintf(stderr, "weightfsctl export: %s: cannot read %s: %s\n", disp(ex.dir), META_XATTR,
			strerror((int)-n));
		goto out;
	}
	if (n >= 0 && (c = wfs_st_meta_parse(ex.st, meta, (size_t)n, err, sizeof(err))) != 0) {
		fprintf(stderr, "weightfsctl export: %s: %s: %s\n", disp(ex.dir), META_XATTR,
			c == -ENOMEM ? strerror(ENOMEM) : err);
		goto out;
	}
	ret = export_walk(&ex, ex.dir, "");
	if (ret == 0)
		ret = export_write(&ex);
	if (interrupted) {
		fprintf(stderr, "weightfsctl export: interrupted; %s left as it was\n", ex.out);
		ret = 1;
	}
out:
	progress_clear(&ex.progress);
	if (store_close("export", &ts))
		ret = 1;
	if (ret == 0 && ex.json)
		print_json(json_pack("{s:s, s:s?, s:s, s:I, s:I, s:I, s:I, s:b, s:I}", "dir", argv[optind], "store",
				     store, "out", ex.out, "tensors", (json_int_t)ex.st->ntensors, "header_bytes",
				     (json_int_t)(8 + ex.st->header_bytes), "data_bytes",
				     (json_int_t)ex.st->data_bytes, "file_bytes",
				     (json_int_t)(8 + ex.st->header_bytes + ex.st->data_bytes), "metadata",
				     ex.st->has_metadata, "raw_files", (json_int_t)ex.raw));
	else if (ret == 0)
		printf("export: %zu tensors (%.1f MiB) from %s%s%s into %s (%llu bytes)\n", ex.st->ntensors,
		       (double)ex.st->data_bytes / 1048576.0, store ? store : "", store ? ":" : "", argv[optind],
		       ex.out, (unsigned long long)(8 + ex.st->header_bytes + ex.st->data_bytes));
	free(ex.copier.buf);
	wfs_st_free(ex.st);
	return ret;
}
