/*
 * weightfsctl — the weightfs admin command line: one binary, one subcommand per task.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <mntent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <jansson.h>

#include "cache.h"
#include "catalog.h"
#include "cmd.h"
#include "log.h"
#include "store.h"
#include "weightfs.h"

#define WFS_VERSION "0.1.0"

struct subcommand {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *summary;
};

static const struct subcommand subcommands[] = {
	{"init", wfs_cmd_init, "make a new, empty store (private to you) in a directory"},
	{"stat", wfs_cmd_stat, "names, bytes, objects and the dedup ratio of a store, mount or subtree"},
	{"fsck", wfs_cmd_fsck, "check every object's digest and the catalog; --repair what is safe"},
	{"gc", wfs_cmd_gc, "remove objects no name uses (beyond a retention budget)"},
	{"stage", wfs_cmd_stage, "copy files to a GPU through pinned buffers (and back), with a benchmark"},
	{"import", wfs_cmd_import, "write a safetensors checkpoint (or sharded index) as tensor files"},
	{"export", wfs_cmd_export, "write a directory of tensor files as one safetensors file"},
	{"cache", wfs_cmd_cache, "drop, load (on a NUMA node) or measure the page cache of names"},
};

static void usage(FILE *out)
{
	fprintf(out, "usage: weightfsctl COMMAND [ARGS]  (weightfsctl COMMAND --help for its options)\n\n"
		     "commands:\n");
	for (size_t i = 0; i < sizeof(subcommands) / sizeof(subcommands[0]); i++)
		fprintf(out, "  %-8s %s\n", subcommands[i].name, subcommands[i].summary);
	fprintf(out, "\nexit status: 0 success, 1 the work failed or found a problem, 2 usage error\n");
}

int wfs_cmd_resolve_store(const char *path, char *out)
{
	char real[PATH_MAX], probe[PATH_MAX + 16];
	struct mntent *m;
	FILE *f;
	int ret;

	if (!realpath(path, real))
		return -errno;
	snprintf(probe, sizeof(probe), "%s/" WFS_STORE_CATALOG, real);
	if (access(probe, F_OK) == 0) {
		snprintf(out, PATH_MAX, "%s", real);
		return 0;
	}
	ret = -EMEDIUMTYPE;
	f = setmntent("/proc/self/mounts", "r");
	if (!f)
		return -errno;
	while ((m = getmntent(f)) != NULL) {
		if (strcmp(m->mnt_type, "fuse.weightfs") == 0 && strcmp(m->mnt_dir, real) == 0) {
			snprintf(out, PATH_MAX, "%s", m->mnt_fsname);
			ret = 0;
		}
	}
	endmntent(f);
	return ret;
}

const char *wfs_cmd_store_error(int err)
{
	return err == -EMEDIUMTYPE ? "not a weightfs store (a directory with catalog.db) or the mount point "
				     "of one"
				   : strerror(-err);
}

/*
 * The fuse.weightfs mount that holds @real (a resolved path below its mount point): its mount point
 * into @mnt and store into @store (PATH_MAX bytes each). The innermost one; 0 or -ENOENT.
 */
static int mount_containing(const char *real, char *mnt, char *store)
{
	struct mntent *m;
	size_t best = 0;
	FILE *f = setmntent("/proc/self/mounts", "r");

	if (!f)
		return -errno;
	while ((m = getmntent(f)) != NULL) {
		size_t n = strlen(m->mnt_dir);

		if (strcmp(m->mnt_type, "fuse.weightfs") != 0 || n < best || strncmp(real, m->mnt_dir, n) != 0 ||
		    (real[n] != '/' && !(n == 1 && real[0] == '/')))
			continue;
		snprintf(mnt, PATH_MAX, "%s", m->mnt_dir);
		snprintf(store, PATH_MAX, "%s", m->mnt_fsname);
		best = n;
	}
	endmntent(f);
	return best ? 0 : -ENOENT;
}

/* Totals of a subtree of a mount, read through the mount (stat and user.weightfs.digest). */
struct subtree_stats {
	uint64_t names, directories, symlinks, logical_bytes, unsealed_files, special_files;
	uint64_t objects, object_bytes; /* distinct digests below it, and the size of each once */
	struct digest_size {
		char hex[33];
		uint64_t bytes;
	} *digests;
	size_t ndigests, cap;
	int error; /* the first -errno met (that entry is skipped) */
};

static void subtree_add(struct subtree_stats *t, const char *path, const struct stat *st)
{
	char hex[64];
	ssize_t n;

	if (S_ISDIR(st->st_mode)) {
		t->directories++;
		return;
	}
	if (S_ISLNK(st->st_mode)) {
		t->symlinks++;
		return;
	}
	if (!S_ISREG(st->st_mode)) {
		t->special_files++; /* FIFO, socket, device node: a name, no bytes, no object */
		return;
	}
	t->names++;
	t->logical_bytes += (uint64_t)st->st_size;
	n = lgetxattr(path, WFS_XATTR_DIGEST, hex, sizeof(hex) - 1);
	if (n != 32) {
		if (n < 0 && errno != ENODATA && !t->error)
			t->error = -errno;
		t->unsealed_files++;
		return;
	}
	if (t->ndigests == t->cap) {
		size_t cap = t->cap ? 2 * t->cap : 256;
		struct digest_size *d = realloc(t->digests, cap * sizeof(*d));

		if (!d) {
			t->error = t->error ? t->error : -ENOMEM;
			return;
		}
		t->digests = d;
		t->cap = cap;
	}
	memcpy(t->digests[t->ndigests].hex, hex, 32);
	t->digests[t->ndigests].hex[32] = '\0';
	t->digests[t->ndigests++].bytes = (uint64_t)st->st_size;
}

/* Walk @path (a buffer of PATH_MAX bytes, restored on return) and everything below it. */
static void subtree_walk(struct subtree_stats *t, char *path)
{
	size_t len = strlen(path);
	struct dirent *e;
	struct stat st;
	DIR *d;

	if (lstat(path, &st) < 0) {
		t->error = t->error ? t->error : -errno;
		return;
	}
	subtree_add(t, path, &st);
	if (!S_ISDIR(st.st_mode))
		return;
	d = opendir(path);
	if (!d) {
		t->error = t->error ? t->error : -errno;
		return;
	}
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (len + 1 + strlen(e->d_name) >= PATH_MAX) {
			t->error = t->error ? t->error : -ENAMETOOLONG;
			continue;
		}
		snprintf(path + len, PATH_MAX - len, "/%s", e->d_name);
		subtree_walk(t, path);
		path[len] = '\0';
	}
	closedir(d);
}

static int digest_cmp(const void *a, const void *b)
{
	return strcmp(((const struct digest_size *)a)->hex, ((const struct digest_size *)b)->hex);
}

/* weightfsctl stat of @real, a path below mount point @mnt of @store. Returns the exit status. */
static int stat_subtree(const char *arg, const char *real, const char *mnt, const char *store, bool json)
{
	struct subtree_stats t = {0};
	char path[PATH_MAX];
	double ratio;

	snprintf(path, sizeof(path), "%s", real);
	subtree_walk(&t, path);
	qsort(t.digests, t.ndigests, sizeof(*t.digests), digest_cmp);
	for (size_t i = 0; i < t.ndigests; i++)
		if (i == 0 || strcmp(t.digests[i].hex, t.digests[i - 1].hex) != 0) {
			t.objects++;
			t.object_bytes += t.digests[i].bytes;
		}
	free(t.digests);
	if (t.error) {
		fprintf(stderr, "weightfsctl stat: %s: cannot read all of it: %s\n", arg, strerror(-t.error));
		return 1;
	}
	ratio = t.object_bytes ? (double)t.logical_bytes / (double)t.object_bytes : 1.0;
	if (json) {
		printf("{\"store\": \"%s\", \"mountpoint\": \"%s\", \"subtree\": \"%s\", \"names\": %llu, "
		       "\"directories\": %llu, \"symlinks\": %llu, \"logical_bytes\": %llu, \"objects\": %llu, "
		       "\"object_bytes\": %llu, \"unsealed_files\": %llu, \"special_files\": %llu, "
		       "\"dedup_ratio\": %.4f}\n",
		       store, mnt, real, (unsigned long long)t.names, (unsigned long long)t.directories,
		       (unsigned long long)t.symlinks, (unsigned long long)t.logical_bytes,
		       (unsigned long long)t.objects, (unsigned long long)t.object_bytes,
		       (unsigned long long)t.unsealed_files, (unsigned long long)t.special_files, ratio);
		return 0;
	}
	printf("store:              %s (mounted on %s)\n", store, mnt);
	printf("subtree:            %s (read through the mount; weightfsctl stat %s for the store)\n", real,
	       mnt);
	printf("names:              %llu\n", (unsigned long long)t.names);
	printf("directories:        %llu\n", (unsigned long long)t.directories);
	if (t.special_files)
		printf("special files:      %llu (FIFOs, sockets, device nodes)\n",
		       (unsigned long long)t.special_files);
	printf("logical bytes:      %llu (%.1f MiB)\n", (unsigned long long)t.logical_bytes,
	       (double)t.logical_bytes / 1048576.0);
	printf("objects:            %llu (distinct contents below it; shared with names elsewhere too)\n",
	       (unsigned long long)t.objects);
	printf("physical bytes:     %llu (%.1f MiB)\n", (unsigned long long)t.object_bytes,
	       (double)t.object_bytes / 1048576.0);
	if (t.unsealed_files)
		printf("unsealed files:     %llu (being written, or never sealed)\n",
		       (unsigned long long)t.unsealed_files);
	printf("dedup ratio:        %.2fx\n", ratio);
	return 0;
}

/* Disk usage of every file below @dir_fd (st_blocks × 512), like du(1). */
static uint64_t disk_usage(int dir_fd)
{
	DIR *d = fdopendir(dir_fd);
	struct dirent *e;
	uint64_t total = 0;

	if (!d) {
		close(dir_fd);
		return 0;
	}
	while ((e = readdir(d)) != NULL) {
		struct stat st;

		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		total += (uint64_t)st.st_blocks * 512;
		if (S_ISDIR(st.st_mode)) {
			int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

			if (fd >= 0)
				total += disk_usage(fd);
		}
	}
	closedir(d);
	return total;
}

static void stat_usage(FILE *out)
{
	fprintf(out, "usage: weightfsctl stat [--json|--prometheus] STORE|MOUNTPOINT|MOUNTPOINT/DIR\n\n"
		     "Print the names, directories, logical bytes (the sum of file sizes, what ls and du\n"
		     "of the mount show), objects, physical bytes (object bytes; disk usage of\n"
		     "STORE/objects as du reports it) and the dedup ratio (logical / object bytes).\n"
		     "Reads the catalog only: safe next to a running daemon. Given a MOUNTPOINT, it also\n"
		     "shows what the daemon serving it knows (the mount root's user.weightfs.stats\n"
		     "attribute): objects verified this run, passthrough on/off, claims, bytes written.\n"
		     "Given a directory (or file) below a mount point, it prints the same totals for that\n"
		     "subtree, read through the mount (stat and user.weightfs.digest of each name): its\n"
		     "objects are the distinct contents below it. --prometheus prints a store's totals,\n"
		     "its resident bytes and the daemon's counters for node_exporter's textfile collector.\n");
}

int wfs_cmd_mount_of(const char *store, char *out)
{
	struct mntent *m;
	FILE *f = setmntent("/proc/self/mounts", "r");
	int ret = -ENOENT;

	if (!f)
		return -errno;
	while (ret && (m = getmntent(f)) != NULL) {
		struct statfs sf;

		/* A mount whose daemon died answers ENOTCONN. */
		if (strcmp(m->mnt_type, "fuse.weightfs") == 0 && strcmp(m->mnt_fsname, store) == 0 &&
		    statfs(m->mnt_dir, &sf) == 0) {
			snprintf(out, PATH_MAX, "%s", m->mnt_dir);
			ret = 0;
		}
	}
	endmntent(f);
	return ret;
}

/*
 * The daemon's view, from the user.weightfs.stats attribute of the mount root (fs/ops.c writes it)
 * of store @store, if a daemon has it mounted. NULL when none answers. The caller json_decref()s it.
 */
static json_t *daemon_stats(const char *store)
{
	char mnt[PATH_MAX], buf[8192];
	ssize_t n;

	if (wfs_cmd_mount_of(store, mnt))
		return NULL;
	n = getxattr(mnt, WFS_XATTR_STATS, buf, sizeof(buf));
	if (n <= 0)
		return NULL;
	return json_loadb(buf, (size_t)n, 0, NULL);
}

static uint64_t json_u64(const json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	return json_is_integer(v) ? (uint64_t)json_integer_value(v) : 0;
}

static void print_daemon_stats(const json_t *d)
{
	const json_t *k = json_object_get(d, "since_mount");

	printf("verified:           %llu objects checked this run, %llu not yet (checked at first open)\n",
	       (unsigned long long)json_u64(d, "objects_verified"),
	       (unsigned long long)json_u64(d, "objects_unverified"));
	printf("passthrough:        %s\n", json_is_true(json_object_get(d, "passthrough"))
						  ? "on (reads served by the kernel)" : "off (reads served by the daemon)");
	printf("direct path:        %s\n", json_is_true(json_object_get(d, "direct"))
						  ? "served (weightfs.open_object: the object file, any kernel)"
						  : "not served (clients read the mounted files)");
	printf("since mount:        %llu seals (%llu new objects, %llu bytes written; %llu dedup hits), "
	       "%llu claims sealed, %llu missed\n",
	       (unsigned long long)json_u64(k, "seals"), (unsigned long long)json_u64(k, "objects_published"),
	       (unsigned long long)json_u64(k, "bytes_published"), (unsigned long long)json_u64(k, "dedup_hits"),
	       (unsigned long long)json_u64(k, "claims"), (unsigned long long)json_u64(k, "claim_misses"));
	printf("opens since mount:  %llu read-only through passthrough, %llu by the daemon (writes, or reads "
	       "without passthrough)\n",
	       (unsigned long long)json_u64(k, "opens_passthrough"), (unsigned long long)json_u64(k, "opens_daemon"));
	printf("direct since mount: %llu object descriptors handed out\n",
	       (unsigned long long)json_u64(k, "opens_direct"));
}

int wfs_cmd_stat(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"json", no_argument, NULL, 'j'},
		{"prometheus", no_argument, NULL, 'p'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	bool prometheus = false;
	struct wfs_catalog_stats st;
	struct wfs_catalog *c = NULL;
	json_t *daemon;
	char store[PATH_MAX], db[PATH_MAX + 16];
	bool json = false, from_daemon = false;
	uint64_t du = 0;
	double ratio;
	int opt, ret, fd;

	while ((opt = getopt_long(argc, argv, "jh", longopts, NULL)) != -1) {
		switch (opt) {
		case 'j':
			json = true;
			break;
		case 'p':
			prometheus = true;
			break;
		case 'h':
			stat_usage(stdout);
			return 0;
		default:
			stat_usage(stderr);
			return 2;
		}
	}
	if (optind != argc - 1) {
		stat_usage(stderr);
		return 2;
	}
	ret = wfs_cmd_resolve_store(argv[optind], store);
	if (ret == -EMEDIUMTYPE) {
		char real[PATH_MAX], mnt[PATH_MAX];

		if (!prometheus && realpath(argv[optind], real) && mount_containing(real, mnt, store) == 0)
			return stat_subtree(argv[optind], real, mnt, store, json);
	}
	if (ret) {
		fprintf(stderr, "weightfsctl stat: %s: %s\n", argv[optind], wfs_cmd_store_error(ret));
		return 1;
	}
	snprintf(db, sizeof(db), "%s/" WFS_STORE_CATALOG, store);
	ret = wfs_catalog_open(db, WFS_CATALOG_READONLY, 0, 0, &c);
	if (ret == 0)
		ret = wfs_catalog_stats(c, &st);
	wfs_catalog_close(c);
	if (ret && access(db, R_OK) < 0)
		ret = -errno; /* SQLite says only "cannot open" for a store this user cannot enter */
	daemon = daemon_stats(store);
	if (ret && daemon) {
		/* Another user of a mount: the store is private, but the daemon tells its totals. */
		from_daemon = true;
		st = (struct wfs_catalog_stats){
			.names = json_u64(daemon, "names"), .directories = json_u64(daemon, "directories"),
			.symlinks = json_u64(daemon, "symlinks"), .logical_bytes = json_u64(daemon, "logical_bytes"),
			.objects = json_u64(daemon, "objects"), .object_bytes = json_u64(daemon, "physical_bytes"),
			.unreferenced_objects = json_u64(daemon, "retained_objects"),
			.unreferenced_bytes = json_u64(daemon, "retained_bytes"),
			.quarantined_objects = json_u64(daemon, "objects_quarantined"),
			.unsealed_files = json_u64(daemon, "unsealed_files"),
			.special_files = json_u64(daemon, "special_files"),
		};
		ret = 0;
	}
	if (ret) {
		fprintf(stderr, "weightfsctl stat: %s: cannot read catalog: %s\n", db, strerror(-ret));
		json_decref(daemon);
		return 1;
	}
	snprintf(db, sizeof(db), "%s/objects", store);
	fd = open(db, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0)
		du = disk_usage(fd);
	ratio = st.object_bytes ? (double)st.logical_bytes / (double)st.object_bytes : 1.0;
	if (prometheus) {
		ret = wfs_cmd_stat_prometheus(store, &st, from_daemon ? WFS_CACHE_UNKNOWN : du, daemon);
		json_decref(daemon);
		return ret;
	}
	if (json) {
		char *dtext = daemon ? json_dumps(daemon, JSON_COMPACT) : NULL;

		printf("{\"store\": \"%s\", \"names\": %llu, \"directories\": %llu, \"symlinks\": %llu, "
		       "\"logical_bytes\": %llu, \"objects\": %llu, \"object_bytes\": %llu, "
		       "\"objects_disk_bytes\": %llu, \"unreferenced_objects\": %llu, "
		       "\"unreferenced_bytes\": %llu, \"quarantined_objects\": %llu, \"unsealed_files\": %llu, "
		       "\"special_files\": %llu, \"dedup_ratio\": %.4f, \"daemon\": %s}\n",
		       store, (unsigned long long)st.names, (unsigned long long)st.directories,
		       (unsigned long long)st.symlinks, (unsigned long long)st.logical_bytes,
		       (unsigned long long)st.objects, (unsigned long long)st.object_bytes,
		       (unsigned long long)du, (unsigned long long)st.unreferenced_objects,
		       (unsigned long long)st.unreferenced_bytes, (unsigned long long)st.quarantined_objects,
		       (unsigned long long)st.unsealed_files, (unsigned long long)st.special_files, ratio,
		       dtext ? dtext : "null");
		free(dtext);
		json_decref(daemon);
		return 0;
	}
	printf("store:              %s%s\n", store,
	       from_daemon ? " (private to the mounting user: totals from the daemon, disk use unknown)" : "");
	printf("names:              %llu\n", (unsigned long long)st.names);
	printf("directories:        %llu\n", (unsigned long long)st.directories);
	if (st.special_files)
		printf("special files:      %llu (FIFOs, sockets, device nodes)\n",
		       (unsigned long long)st.special_files);
	printf("logical bytes:      %llu (%.1f MiB)\n", (unsigned long long)st.logical_bytes,
	       (double)st.logical_bytes / 1048576.0);
	printf("objects:            %llu\n", (unsigned long long)st.objects);
	printf("physical bytes:     %llu (%.1f MiB); on disk %.1f MiB\n", (unsigned long long)st.object_bytes,
	       (double)st.object_bytes / 1048576.0, (double)du / 1048576.0);
	if (st.unreferenced_objects)
		printf("unreferenced:       %llu objects, %llu bytes (kept for reuse, -o retain)\n",
		       (unsigned long long)st.unreferenced_objects, (unsigned long long)st.unreferenced_bytes);
	if (st.quarantined_objects)
		printf("quarantined:        %llu objects (their names fail with EIO until rewritten)\n",
		       (unsigned long long)st.quarantined_objects);
	if (st.unsealed_files)
		printf("unsealed files:     %llu (being written, or left by a crash)\n",
		       (unsigned long long)st.unsealed_files);
	printf("dedup ratio:        %.2fx\n", ratio);
	if (daemon)
		print_daemon_stats(daemon);
	json_decref(daemon);
	return 0;
}

/* Does directory @path exist and hold anything? */
static bool dir_has_entries(const char *path)
{
	struct dirent *e;
	bool found = false;
	DIR *d = opendir(path);

	if (!d)
		return false;
	while (!found && (e = readdir(d)) != NULL)
		found = strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
	closedir(d);
	return found;
}

static void init_usage(FILE *out)
{
	fprintf(out, "usage: weightfsctl init STORE\n\n"
		     "Make a new, empty weightfs store in directory STORE (created when missing; its parent\n"
		     "must exist): objects/, tmp/ and catalog.db, with STORE made 0700 so that only you (and\n"
		     "root) read it directly; others read through a mount, under each file's mode. STORE may\n"
		     "hold other files (left as they are): this is the way to make a store there, which\n"
		     "weightfs refuses to do by itself. A store already there is left as it is (exit 0).\n"
		     "Then mount it: weightfs STORE MOUNTPOINT.\n");
}

int wfs_cmd_init(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	char real[PATH_MAX], mnt[PATH_MAX], store[PATH_MAX], db[PATH_MAX + 16];
	struct wfs_catalog *c = NULL;
	struct wfs_store *s = NULL;
	struct stat st;
	int opt, ret;

	while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (opt) {
		case 'h':
			init_usage(stdout);
			return 0;
		default:
			init_usage(stderr);
			return 2;
		}
	}
	if (optind != argc - 1) {
		init_usage(stderr);
		return 2;
	}
	const char *path = argv[optind];

	if (realpath(path, real) && mount_containing(real, mnt, store) == 0) {
		fprintf(stderr, "weightfsctl init: %s: inside the weightfs mount %s (of %s): a store must live "
			"outside any mount of one\n", path, mnt, store);
		return 1;
	}
	snprintf(db, sizeof(db), "%s/" WFS_STORE_CATALOG, path);
	if (stat(path, &st) == 0 && S_ISDIR(st.st_mode) && access(db, F_OK) == 0) {
		printf("init: %s: already a weightfs store; left as it is\n", path);
		return 0;
	}
	snprintf(mnt, sizeof(mnt), "%s/objects", path);
	if (dir_has_entries(mnt)) {
		fprintf(stderr, "weightfsctl init: %s: objects/ holds objects but there is no catalog.db: not "
			"starting an empty namespace over them (restore catalog.db, or move objects/ away)\n",
			path);
		return 1;
	}
	umask(077); /* catalog.db and what else is made here: for the store's owner only */
	ret = wfs_store_open(path, WFS_STORE_INIT, &s);
	if (ret == 0)
		ret = wfs_catalog_open(db, WFS_CATALOG_CREATE, getuid(), getgid(), &c);
	wfs_catalog_close(c);
	wfs_store_close(s);
	if (ret) {
		fprintf(stderr, "weightfsctl init: %s: %s\n", path,
			ret == -EBUSY ? "in use by a weightfs process" : strerror(-ret));
		return 1;
	}
	printf("init: %s: a new weightfs store (mode 0700); mount it with: weightfs %s MOUNTPOINT\n", path,
	       path);
	return 0;
}

int main(int argc, char **argv)
{
	wfs_log_init("weightfsctl", false, WFS_LOG_WARN);
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
		usage(stdout);
		return 0;
	}
	if (strcmp(argv[1], "--version") == 0) {
		printf("weightfsctl %s\n", WFS_VERSION);
		return 0;
	}
	for (size_t i = 0; i < sizeof(subcommands) / sizeof(subcommands[0]); i++)
		if (strcmp(argv[1], subcommands[i].name) == 0)
			return subcommands[i].fn(argc - 1, argv + 1);
	fprintf(stderr, "weightfsctl: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
