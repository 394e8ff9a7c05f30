/* SPDX-License-Identifier: Apache-2.0 */
/* store.h: the object store on the backing filesystem. */
#include "store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "fault.h"
#include "log.h"
#include "mounts.h"
#include "weightfs.h"

struct wfs_store {
	char *path;
	unsigned flags;
	int dir_fd;     /* STORE */
	int objects_fd; /* STORE/objects */
	int tmp_fd;     /* STORE/tmp */
	int lock_fd;    /* STORE/lock, flock()ed; -1 when read-only */
	pid_t owner;    /* the process that holds the flock and recorded itself (0: none): its own
			 * clean wfs_store_close() empties STORE/lock; a forked child's does not */
	int unclean_pid; /* the last owner's pid, when it left STORE/lock filled (wfs_store_unclean) */
	char *unclean_what; /* ... and its recorded line */
};

static int open_subdir(int dir_fd, const char *name, bool create, int *out)
{
	int fd;

	if (create && mkdirat(dir_fd, name, 0700) < 0 && errno != EEXIST)
		return -errno;
	fd = openat(dir_fd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	*out = fd;
	return 0;
}

/* Remove @name under @dir_fd, a directory tree included. */
static void remove_tree_at(int dir_fd, const char *name)
{
	int fd;
	DIR *d;
	struct dirent *e;

	if (unlinkat(dir_fd, name, 0) == 0 || (errno != EISDIR && errno != EPERM))
		return;
	fd = openat(dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return;
	}
	while ((e = readdir(d)) != NULL)
		if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
			remove_tree_at(dirfd(d), e->d_name);
	closedir(d);
	unlinkat(dir_fd, name, AT_REMOVEDIR);
}

/* Remove everything in STORE/tmp: leftovers of writes that never reached publish. */
static int clean_tmp(struct wfs_store *s)
{
	int fd = dup(s->tmp_fd);
	DIR *d;
	struct dirent *e;

	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		int ret = -errno;

		close(fd);
		return ret;
	}
	rewinddir(d); /* a dup shares the file offset with tmp_fd */
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		remove_tree_at(s->tmp_fd, e->d_name);
	}
	closedir(d);
	return 0;
}

static bool trimmed(const char *path, char *buf);

int wfs_store_disk_absent(const char *path, char *dir, char *source)
{
	char where[PATH_MAX], name[PATH_MAX], parent[PATH_MAX], mdir[PATH_MAX], msource[PATH_MAX];

	if (!realpath(path, where)) {
		/* A store to be made: its parent resolved, then its own name. */
		char *slash, *base = name;

		if (!trimmed(path, name))
			return 0;
		slash = strrchr(name, '/');
		if (slash) {
			*slash = '\0';
			base = slash + 1;
		}
		if (!realpath(!slash ? "." : slash == name ? "/" : name, parent) ||
		    snprintf(where, sizeof(where), "%s/%s", strcmp(parent, "/") ? parent : "", base) >= (int)sizeof(where))
			return 0;
	}
	return wfs_mounts_fstab_absent(where, dir ? dir : mdir, source ? source : msource) == 0 ? -ENODEV : 0;
}

/*
 * What directory @dir_fd holds: 1 a store (objects/ or catalog.db), 0 nothing (empty, or only the
 * lost+found of a fresh filesystem), -ENOTEMPTY something else, or -errno reading it.
 */
static int classify_dir(int dir_fd)
{
	int fd = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int ret = 0;
	DIR *d;
	struct dirent *e;

	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		ret = -errno;
		close(fd);
		return ret;
	}
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
		    strcmp(e->d_name, "lost+found") == 0)
			continue;
		if (strcmp(e->d_name, WFS_STORE_OBJECTS) == 0 || strcmp(e->d_name, WFS_STORE_CATALOG) == 0) {
			ret = 1;
			break;
		}
		ret = -ENOTEMPTY;
	}
	closedir(d);
	return ret;
}

/*
 * Parse STORE/lock's text @buf (NUL-terminated; what write_owner() wrote): the pid into *@pid and
 * the line after it into @what (@what_bytes bytes, may be 0). Returns 0, or -ENOENT when it records
 * no process (empty: the last owner closed the store; or not a pid line).
 */
static int parse_owner(char *buf, int *pid, char *what, size_t what_bytes)
{
	char *nl = strchr(buf, '\n');
	long v;

	if (!nl)
		return -ENOENT;
	*nl = '\0';
	errno = 0;
	v = strtol(buf, NULL, 10);
	if (errno || v <= 0 || v > INT_MAX)
		return -ENOENT;
	*pid = (int)v;
	if (what_bytes) {
		char *end = strchr(nl + 1, '\n');

		if (end)
			*end = '\0';
		snprintf(what, what_bytes, "%s", nl + 1);
	}
	return 0;
}

/* Read STORE/lock (descriptor @fd) and parse it (parse_owner). Returns 0, -ENOENT or -errno. */
static int read_owner(int fd, int *pid, char *what, size_t what_bytes)
{
	char buf[PATH_MAX + 64];
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);

	if (n < 0)
		return -errno;
	buf[n] = '\0';
	return parse_owner(buf, pid, what, what_bytes);
}

/* Record this process as the store's owner in STORE/lock (wfs_store_owner() reads it). */
static void write_owner(struct wfs_store *s, const char *what)
{
	char line[PATH_MAX + 32];
	int n = snprintf(line, sizeof(line), "%d\n%s\n", (int)getpid(), what ? what : "");

	s->owner = getpid();
	if (n < 0 || (size_t)n >= sizeof(line) || ftruncate(s->lock_fd, 0) < 0)
		return;
	if (pwrite(s->lock_fd, line, (size_t)n, 0) < 0)
		return; /* only a hint for the next process that finds the store busy */
}

/*
 * Does the process that holds the flock on STORE/lock (descriptor @fd) of the store at @path serve
 * a mount of it: its record names a live pid and WFS_STORE_MOUNTED_ON MNT, and MNT is a weightfs mount
 * of this store now (/proc/self/mounts)? Such an owner lets go only at an unmount. One whose mount is
 * gone (unmounted, or detached by a lazy unmount) or whose pid is gone (a holder between two servers)
 * is leaving, or about to record itself: worth a wait.
 */
static bool owner_serves_mount(const char *path, int fd)
{
	char what[PATH_MAX + 16], real[PATH_MAX], store[PATH_MAX];
	const char *mnt;
	int pid;

	if (read_owner(fd, &pid, what, sizeof(what)) != 0 || (kill((pid_t)pid, 0) < 0 && errno == ESRCH))
		return false;
	if (strncmp(what, WFS_STORE_MOUNTED_ON, strlen(WFS_STORE_MOUNTED_ON)) != 0)
		return false;
	mnt = what + strlen(WFS_STORE_MOUNTED_ON);
	/* By identity, not by path: the store may be reached through a bind mount or a symlink. */
	return realpath(path, real) && wfs_mounts_on(mnt, store) == 0 && wfs_mounts_same_store(store, real);
}

/* wfs_store_open(), or with @inherited_lock >= 0 wfs_store_open_inherited(). */
static int store_open(const char *path, unsigned flags, int inherited_lock, struct wfs_store **out)
{
	bool create = flags & (WFS_STORE_CREATE | WFS_STORE_INIT);
	bool readonly = flags & WFS_STORE_READONLY;
	bool made = false;
	struct wfs_store *s;
	int ret;

	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->dir_fd = s->objects_fd = s->tmp_fd = s->lock_fd = -1;
	s->flags = flags;
	s->path = strdup(path);
	if (!s->path) {
		ret = -ENOMEM;
		goto fail;
	}
	if (create && !readonly && !(flags & WFS_STORE_INIT) && access(path, F_OK) < 0 && errno == ENOENT &&
	    (ret = wfs_store_disk_absent(path, NULL, NULL)) != 0)
		goto fail;
	if (create && !readonly) {
		if (mkdir(path, 0700) == 0)
			made = true;
		else if (errno != EEXIST) {
			ret = -errno;
			goto fail;
		}
	}
	s->dir_fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (s->dir_fd < 0) {
		ret = -errno;
		goto fail;
	}
	if (create && !readonly && !made) {
		/* A store is laid out only where nothing else lives (or on an explicit init): a mistyped
		 * or swapped path must not turn someone's directory into a store. */
		ret = classify_dir(s->dir_fd);
		if (ret < 0 && !(ret == -ENOTEMPTY && (flags & WFS_STORE_INIT)))
			goto fail;
		if (ret == 0 && !(flags & WFS_STORE_INIT) && (ret = wfs_store_disk_absent(path, NULL, NULL)) != 0)
			goto fail;
		/* A new store is private to its owner; an existing one keeps the mode it was given. */
		if (ret != 1 && fchmod(s->dir_fd, 0700) < 0) {
			ret = -errno;
			goto fail;
		}
	}
	/* The layout first: a directory that is not a store must be left exactly as it was. */
	ret = open_subdir(s->dir_fd, WFS_STORE_OBJECTS, create && !readonly, &s->objects_fd);
	if (ret)
		goto fail;
	ret = open_subdir(s->dir_fd, WFS_STORE_TMP, create && !readonly, &s->tmp_fd);
	if (ret)
		goto fail;
	if (!readonly && inherited_lock >= 0) {
		struct stat mine, theirs;

		if (fstatat(s->dir_fd, "lock", &mine, 0) < 0 || fstat(inherited_lock, &theirs) < 0 ||
		    mine.st_dev != theirs.st_dev || mine.st_ino != theirs.st_ino ||
		    flock(inherited_lock, LOCK_EX | LOCK_NB) < 0) {
			ret = -EBADF;
			goto fail;
		}
		s->lock_fd = inherited_lock;
		write_owner(s, NULL);
	} else if (!readonly) {
		s->lock_fd = openat(s->dir_fd, "lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (s->lock_fd < 0) {
			ret = -errno;
			goto fail;
		}
		/* A daemon that was just unmounted may take a moment to exit: wait up to 5 s for it. One
		 * that still serves its mount keeps the store until it is unmounted: busy at once. */
		for (int tries = 0;; tries++) {
			if (flock(s->lock_fd, LOCK_EX | LOCK_NB) == 0)
				break;
			ret = -errno;
			if (ret == -EWOULDBLOCK && (tries == 50 || owner_serves_mount(path, s->lock_fd)))
				ret = -EBUSY;
			if (ret != -EWOULDBLOCK)
				goto fail;
			usleep(100000);
		}
		{
			char what[PATH_MAX + 16];
			int pid;

			/* Filled: its last owner never reached wfs_store_close(). */
			if (read_owner(s->lock_fd, &pid, what, sizeof(what)) == 0) {
				s->unclean_pid = pid;
				s->unclean_what = strdup(what); /* NULL: the line is not told */
			}
		}
		write_owner(s, NULL);
		ret = clean_tmp(s);
		if (ret)
			goto fail;
	} else {
		/* Inspection (fsck) tells a killed owner's mark too, when no process holds the lock:
		 * a shared flock for a moment, on a descriptor of its own. */
		int fd = openat(s->dir_fd, "lock", O_RDONLY | O_CLOEXEC);
		char what[PATH_MAX + 16];
		int pid;

		if (fd >= 0 && flock(fd, LOCK_SH | LOCK_NB) == 0 && read_owner(fd, &pid, what, sizeof(what)) == 0) {
			s->unclean_pid = pid;
			s->unclean_what = strdup(what);
		}
		if (fd >= 0)
			close(fd);
	}
	*out = s;
	return 0;
fail:
	if (inherited_lock >= 0 && s->lock_fd == inherited_lock)
		s->lock_fd = -1; /* still the caller's */
	wfs_store_close(s);
	return ret;
}

int wfs_store_open(const char *path, unsigned flags, struct wfs_store **out)
{
	return store_open(path, flags, -1, out);
}

int wfs_store_open_inherited(const char *path, unsigned flags, int lock_fd, struct wfs_store **out)
{
	if (lock_fd < 0)
		return -EBADF;
	return store_open(path, flags & WFS_STORE_NOSYNC, lock_fd, out);
}

int wfs_store_lock_fd(const struct wfs_store *s)
{
	return s->lock_fd;
}

void wfs_store_set_owner(struct wfs_store *s, const char *what)
{
	if (s->lock_fd >= 0)
		write_owner(s, what);
}

int wfs_store_owner(const char *path, int *pid, char *what, size_t what_bytes)
{
	int fd, dir_fd, ret;

	dir_fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dir_fd < 0)
		return -errno;
	fd = openat(dir_fd, "lock", O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		close(dir_fd);
		return ret;
	}
	ret = read_owner(fd, pid, what, what_bytes);
	close(fd);
	close(dir_fd);
	/* A pid left by a holder that is gone (or a lock held by something that wrote none). */
	if (ret == 0 && kill((pid_t)*pid, 0) < 0 && errno == ESRCH)
		ret = -ENOENT;
	return ret;
}

/* @path without its trailing slashes ("new/" names "new") into @buf (PATH_MAX bytes); false when
 * it does not fit. */
static bool trimmed(const char *path, char *buf)
{
	size_t n = strlen(path);

	while (n > 1 && path[n - 1] == '/')
		n--;
	if (n >= PATH_MAX)
		return false;
	memcpy(buf, path, n);
	buf[n] = '\0';
	return true;
}

bool wfs_store_parent_missing(const char *path, char *parent)
{
	struct stat st;
	char *slash;

	if (!trimmed(path, parent))
		return false;
	slash = strrchr(parent, '/');
	if (!slash || slash == parent)
		return false; /* "new" or "/new": the parent is "." or "/" */
	*slash = '\0';
	return stat(parent, &st) < 0 && errno == ENOENT;
}

void wfs_store_unmake(const char *path)
{
	static const char *const files[] = {WFS_STORE_CATALOG "-wal", WFS_STORE_CATALOG "-shm",
					    WFS_STORE_CATALOG "-reserve", WFS_STORE_CATALOG, WFS_STORE_CATALOG_BACKUP,
					    "lock", WFS_STORE_LOG};
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0)
		return;
	/* Only a store with nothing in it: objects/ and tmp/ must go first (rmdir: empty only). */
	if ((unlinkat(fd, WFS_STORE_OBJECTS, AT_REMOVEDIR) == 0 || errno == ENOENT) &&
	    (unlinkat(fd, WFS_STORE_TMP, AT_REMOVEDIR) == 0 || errno == ENOENT)) {
		for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++)
			unlinkat(fd, files[i], 0);
		rmdir(path);
	}
	close(fd);
}

static bool is_store(const char *dir)
{
	char db[PATH_MAX + sizeof("/" WFS_STORE_CATALOG)];

	snprintf(db, sizeof(db), "%s/" WFS_STORE_CATALOG, dir);
	return access(db, F_OK) == 0;
}

bool wfs_store_enclosing(const char *path, char *store)
{
	char real[PATH_MAX], parent[PATH_MAX];
	char *slash;

	if (!trimmed(path, parent))
		return false;
	if (!realpath(parent, real)) {
		if (errno != ENOENT)
			return false;
		slash = strrchr(parent, '/'); /* not made yet: its parent is the first to ask */
		if (!slash)
			strcpy(parent, ".");
		else
			slash[slash == parent] = '\0';
		if (!realpath(parent, real))
			return false;
		if (is_store(real)) {
			strcpy(store, real);
			return true;
		}
	}
	while ((slash = strrchr(real, '/')) != NULL && real[1] != '\0') {
		slash[slash == real] = '\0';
		if (is_store(real)) {
			strcpy(store, real);
			return true;
		}
	}
	return false;
}

bool wfs_store_unclean(const struct wfs_store *s, int *pid, char *what, size_t what_bytes)
{
	if (!s->unclean_pid)
		return false;
	*pid = s->unclean_pid;
	if (what_bytes)
		snprintf(what, what_bytes, "%s", s->unclean_what ? s->unclean_what : "");
	return true;
}

void wfs_store_close(struct wfs_store *s)
{
	if (!s)
		return;
	if (s->tmp_fd >= 0)
		close(s->tmp_fd);
	if (s->objects_fd >= 0)
		close(s->objects_fd);
	/* Emptied before the flock goes: the next owner knows this one closed the store. */
	if (s->owner && s->owner == getpid() && ftruncate(s->lock_fd, 0) < 0)
		wfs_log(WFS_LOG_WARN, "%s/lock: cannot empty it (%s): the next mount will say this process "
			"did not close the store", s->path ? s->path : "store", strerror(errno));
	if (s->lock_fd >= 0)
		close(s->lock_fd); /* drops the flock */
	free(s->unclean_what);
	if (s->dir_fd >= 0)
		close(s->dir_fd);
	free(s->path);
	free(s);
}

const char *wfs_store_path(const struct wfs_store *s)
{
	return s->path;
}

int wfs_store_stat(const struct wfs_store *s, struct stat *st)
{
	return fstat(s->dir_fd, st) < 0 ? -errno : 0;
}

static int tmp_create_named(struct wfs_store *s, struct wfs_tmpfile *t);

int wfs_store_tmp_create(struct wfs_store *s, struct wfs_tmpfile *t)
{
	int fd;

	t->keep_name = false;
	if (s->flags & WFS_STORE_READONLY)
		return -EROFS;
	fd = wfs_fault("tmp.create");
	if (fd)
		return fd;
	fd = openat(s->tmp_fd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0644);
	if (fd >= 0) {
		t->fd = fd;
		t->name[0] = '\0';
		return 0;
	}
	if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)
		return -errno;
	/* No O_TMPFILE on this filesystem: a named file, removed at next open if we crash. */
	return tmp_create_named(s, t);
}

int wfs_store_tmp_create_named(struct wfs_store *s, struct wfs_tmpfile *t)
{
	int ret;

	t->keep_name = false;
	if (s->flags & WFS_STORE_READONLY)
		return -EROFS;
	ret = wfs_fault("tmp.create");
	return ret ? ret : tmp_create_named(s, t);
}

/* A tmp file named STORE/tmp/w.PID.RANDOM. Returns 0 or -errno. */
static int tmp_create_named(struct wfs_store *s, struct wfs_tmpfile *t)
{
	static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
	int fd;

	for (int attempt = 0; attempt < 100; attempt++) {
		uint64_t r = ((uint64_t)random() << 31) ^ (uint64_t)random();

		snprintf(t->name, sizeof(t->name), "w.%d.", (int)getpid());
		for (size_t i = strlen(t->name); i < 24; i++, r /= 36)
			t->name[i] = alphabet[r % 36];
		t->name[24] = '\0';
		fd = openat(s->tmp_fd, t->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		if (fd >= 0) {
			t->fd = fd;
			return 0;
		}
		if (errno != EEXIST)
			return -errno;
	}
	return -EEXIST;
}

int wfs_store_tmp_open(struct wfs_store *s, const char *name, struct wfs_tmpfile *t)
{
	int fd;

	t->keep_name = false;
	if (!name[0] || strchr(name, '/') || strlen(name) >= sizeof(t->name))
		return -EINVAL;
	fd = openat(s->tmp_fd, name, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	t->fd = fd;
	snprintf(t->name, sizeof(t->name), "%s", name);
	return 0;
}

void wfs_store_tmp_sweep(struct wfs_store *s, bool (*keep)(const char *name, void *arg), void *arg)
{
	int fd = dup(s->tmp_fd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *e;

	if (!d) {
		if (fd >= 0)
			close(fd);
		return;
	}
	rewinddir(d); /* a dup shares the file offset: an earlier walk of tmp_fd left it at the end */
	while ((e = readdir(d)) != NULL)
		if (e->d_name[0] != '.' && !keep(e->d_name, arg))
			remove_tree_at(s->tmp_fd, e->d_name);
	closedir(d);
}

void wfs_store_tmp_discard(struct wfs_store *s, struct wfs_tmpfile *t)
{
	if (t->fd >= 0)
		close(t->fd);
	t->fd = -1;
	if (t->name[0])
		unlinkat(s->tmp_fd, t->name, 0);
	t->name[0] = '\0';
}

void wfs_store_object_name(const struct wfs_digest *d, char buf[34])
{
	char hex[WFS_DIGEST_HEX_CHARS + 1];

	wfs_digest_to_hex(d, hex);
	buf[0] = hex[0];
	buf[1] = hex[1];
	buf[2] = '/';
	memcpy(buf + 3, hex + 2, WFS_DIGEST_HEX_CHARS - 2 + 1);
}

/* Link the finished tmp file under objects/ab/<rest>. Returns 0, 1 when already stored, or -errno. */
static int link_object(struct wfs_store *s, struct wfs_tmpfile *t, const char *name)
{
	char subdir[3] = {name[0], name[1], '\0'};
	char proc[32];
	int ret;

	for (int attempt = 0; attempt < 2; attempt++) {
		if (t->name[0])
			ret = linkat(s->tmp_fd, t->name, s->objects_fd, name, 0);
		else {
			snprintf(proc, sizeof(proc), "/proc/self/fd/%d", t->fd);
			ret = linkat(AT_FDCWD, proc, s->objects_fd, name, AT_SYMLINK_FOLLOW);
		}
		if (ret == 0)
			return 0;
		if (errno == EEXIST)
			return 1;
		if (errno != ENOENT || attempt > 0)
			return -errno;
		/* First object under this prefix: make objects/ab and make it durable. */
		if (mkdirat(s->objects_fd, subdir, 0700) < 0 && errno != EEXIST)
			return -errno;
		if (!(s->flags & WFS_STORE_NOSYNC) && fsync(s->objects_fd) < 0)
			return -errno;
	}
	return -ENOENT;
}

static int fsync_subdir(struct wfs_store *s, const char *name)
{
	char subdir[3] = {name[0], name[1], '\0'};
	int fd, ret = 0;

	fd = openat(s->objects_fd, subdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fsync(fd) < 0)
		ret = -errno;
	close(fd);
	return ret;
}

/* Is @hex a digest spelled the way the store names objects (lower case)? */
static bool canonical_hex(const char *hex, struct wfs_digest *d)
{
	char again[WFS_DIGEST_HEX_CHARS + 1];

	if (wfs_digest_from_hex(hex, d))
		return false;
	wfs_digest_to_hex(d, again);
	return strcmp(again, hex) == 0;
}

/* The entries of objects/@sub (open as @sub_fd, closed here) for wfs_store_walk(). */
static int walk_sub(int sub_fd, const char *sub, int (*fn)(void *ctx, const struct wfs_store_entry *e),
		    void *ctx)
{
	DIR *d = fdopendir(sub_fd);
	struct dirent *g;
	int ret = 0;

	if (!d) {
		close(sub_fd);
		return 0; /* unreadable: skipped */
	}
	while (ret == 0 && (g = readdir(d)) != NULL) {
		struct wfs_store_entry e = {.sub = sub, .name = g->d_name};
		char hex[WFS_DIGEST_HEX_CHARS + 1];

		if (strcmp(g->d_name, ".") == 0 || strcmp(g->d_name, "..") == 0)
			continue;
		if (strlen(g->d_name) == WFS_DIGEST_HEX_CHARS - 2) {
			memcpy(hex, sub, 2);
			memcpy(hex + 2, g->d_name, WFS_DIGEST_HEX_CHARS - 2 + 1);
			e.object = canonical_hex(hex, &e.digest) &&
				   fstatat(sub_fd, g->d_name, &e.st, AT_SYMLINK_NOFOLLOW) == 0 &&
				   S_ISREG(e.st.st_mode);
		}
		ret = fn(ctx, &e);
	}
	closedir(d);
	return ret;
}

int wfs_store_walk(struct wfs_store *s, int (*fn)(void *ctx, const struct wfs_store_entry *e), void *ctx)
{
	int top_fd = openat(s->objects_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *top = top_fd >= 0 ? fdopendir(top_fd) : NULL;
	struct dirent *e;
	int ret = 0;

	if (!top) {
		ret = -errno;
		if (top_fd >= 0)
			close(top_fd);
		return ret;
	}
	while (ret == 0 && (e = readdir(top)) != NULL) {
		int sub_fd;

		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		sub_fd = strlen(e->d_name) == 2
				 ? openat(top_fd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
				 : -1;
		if (sub_fd < 0) {
			struct wfs_store_entry stray = {.sub = e->d_name, .name = ""};

			ret = fn(ctx, &stray);
		} else {
			ret = walk_sub(sub_fd, e->d_name, fn, ctx);
		}
	}
	closedir(top);
	return ret;
}

int wfs_store_sync(struct wfs_store *s)
{
	if (s->flags & WFS_STORE_READONLY)
		return -EROFS;
	return syncfs(s->dir_fd) < 0 ? -errno : 0;
}

int wfs_store_publish(struct wfs_store *s, struct wfs_tmpfile *t, const struct wfs_digest *digest,
		      bool durable, bool *existed)
{
	bool sync = durable && !(s->flags & WFS_STORE_NOSYNC);
	char name[34];
	int ret;

	*existed = false;
	if (s->flags & WFS_STORE_READONLY) {
		ret = -EROFS;
		goto out;
	}
	wfs_store_object_name(digest, name);
	/* Already stored: no need to make this copy durable. Without a sync the link's EEXIST says
	 * the same for one system call less (a seal asked already: seal.c). */
	if (sync && wfs_store_object_exists(s, digest)) {
		*existed = true;
		ret = 0;
		goto out;
	}
	ret = wfs_fault("publish.fdatasync");
	if (ret == 0 && sync && fdatasync(t->fd) < 0)
		ret = -errno;
	if (ret)
		goto out;
	wfs_crashpoint("publish.after-fdatasync");
	if (fchmod(t->fd, 0444) < 0) {
		ret = -errno;
		goto out;
	}
	ret = wfs_fault("publish.link");
	if (ret == 0)
		ret = link_object(s, t, name);
	if (ret < 0)
		goto out;
	wfs_crashpoint("publish.after-link");
	if (ret == 1) {
		*existed = true;
		ret = 0;
		goto out;
	}
	if (sync)
		ret = fsync_subdir(s, name);
out:
	if (t->keep_name && t->name[0]) {
		close(t->fd);
		t->fd = -1;
	} else {
		wfs_store_tmp_discard(s, t);
	}
	return ret;
}

int wfs_store_object_sync(struct wfs_store *s, const struct wfs_digest *d)
{
	char name[34];
	int fd, ret = 0;

	if (s->flags & WFS_STORE_NOSYNC)
		return 0;
	wfs_store_object_name(d, name);
	fd = openat(s->objects_fd, name, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fdatasync(fd) < 0)
		ret = -errno;
	close(fd);
	return ret ? ret : fsync_subdir(s, name);
}

int wfs_store_object_open(struct wfs_store *s, const struct wfs_digest *d, int extra_flags)
{
	char name[34];
	int fd;

	wfs_store_object_name(d, name);
	fd = openat(s->objects_fd, name, O_RDONLY | O_CLOEXEC | extra_flags);
	return fd < 0 ? -errno : fd;
}

bool wfs_store_object_exists(struct wfs_store *s, const struct wfs_digest *d)
{
	char name[34];

	wfs_store_object_name(d, name);
	return faccessat(s->objects_fd, name, F_OK, AT_EACCESS) == 0;
}

int wfs_store_object_stat(struct wfs_store *s, const struct wfs_digest *d, struct stat *st)
{
	char name[34];

	wfs_store_object_name(d, name);
	return fstatat(s->objects_fd, name, st, 0) < 0 ? -errno : 0;
}

int wfs_store_object_remove(struct wfs_store *s, const struct wfs_digest *d)
{
	char name[34];

	if (s->flags & WFS_STORE_READONLY)
		return -EROFS;
	wfs_store_object_name(d, name);
	return unlinkat(s->objects_fd, name, 0) < 0 ? -errno : 0;
}

int wfs_store_object_unlink_open(struct wfs_store *s, const struct wfs_digest *d)
{
	char name[34];
	int fd;

	if (s->flags & WFS_STORE_READONLY)
		return -EROFS;
	wfs_store_object_name(d, name);
	fd = openat(s->objects_fd, name, O_PATH | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (unlinkat(s->objects_fd, name, 0) < 0) {
		int ret = -errno;

		close(fd);
		return ret;
	}
	return fd;
}

int wfs_store_object_quarantine(struct wfs_store *s, const struct wfs_digest *d)
{
	char name[34], hex[WFS_DIGEST_HEX_CHARS + 1];
	int qfd, ret = 0;

	if (s->flags & WFS_STORE_READONLY)
		return -EROFS;
	ret = open_subdir(s->dir_fd, WFS_STORE_QUARANTINE, true, &qfd);
	if (ret)
		return ret;
	wfs_store_object_name(d, name);
	wfs_digest_to_hex(d, hex);
	if (renameat(s->objects_fd, name, qfd, hex) < 0)
		ret = -errno;
	close(qfd);
	return ret;
}

int wfs_store_quarantine_clear(struct wfs_store *s, bool dry_run, uint64_t *files, uint64_t *bytes)
{
	struct dirent *e;
	struct stat st;
	int qfd, ret;
	DIR *d;

	*files = *bytes = 0;
	if (!dry_run && (s->flags & WFS_STORE_READONLY))
		return -EROFS;
	ret = open_subdir(s->dir_fd, WFS_STORE_QUARANTINE, false, &qfd);
	if (ret)
		return ret == -ENOENT ? 0 : ret;
	d = fdopendir(qfd);
	if (!d) {
		ret = -errno;
		close(qfd);
		return ret;
	}
	while (ret == 0 && (errno = 0, e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (fstatat(qfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
			continue; /* gone meanwhile, or not ours */
		if (!dry_run && unlinkat(qfd, e->d_name, 0) < 0) {
			ret = -errno;
			break;
		}
		(*files)++;
		*bytes += (uint64_t)st.st_size;
	}
	if (ret == 0 && errno)
		ret = -errno;
	closedir(d);
	return ret;
}

int wfs_store_statfs(struct wfs_store *s, struct statvfs *st)
{
	return fstatvfs(s->dir_fd, st) < 0 ? -errno : 0;
}
