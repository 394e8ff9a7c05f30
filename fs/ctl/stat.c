/* SPDX-License-Identifier: Apache-2.0 */
/*
 * weightfsctl stat: the totals of a store (its catalog), of a mount (and what its daemon knows), or
 * of a subtree below a mount point (read through the mount); --json, or --prometheus for a store.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <jansson.h>

#include "cache.h"
#include "catalog.h"
#include "ctl.h"
#include "store.h"
#include "mounts.h"
#include "weightfs.h"

/* Totals of a subtree of a mount, read through the mount (stat and user.weightfs.digest). */
struct subtree_stats {
	uint64_t names, directories, symlinks, logical_bytes, unsealed_files, special_files;
	uint64_t objects, object_bytes; /* distinct digests below it, and the size of each once */
	struct digest_size {
		char hex[33];
		uint64_t bytes;
	} *digests;
	size_t ndigests, cap;
	int error; /* the first -errno met (that entry is skipped), @error_path its path */
	char error_path[PATH_MAX];
	uint64_t skipped; /* entries that could not be read (du(1) goes on too) */
};

/* Entry @path could not be read (@err, -errno): skipped and counted; the first is kept to tell. */
static void skip(struct subtree_stats *t, const char *path, int err)
{
	t->skipped++;
	if (!t->error) {
		t->error = err;
		snprintf(t->error_path, sizeof(t->error_path), "%s", path);
	}
}

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
		if (n < 0 && errno != ENODATA)
			skip(t, path, -errno);
		else
			t->unsealed_files++;
		return;
	}
	if (t->ndigests == t->cap) {
		size_t cap = t->cap ? 2 * t->cap : 256;
		struct digest_size *d = realloc(t->digests, cap * sizeof(*d));

		if (!d) {
			skip(t, path, -ENOMEM);
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
		skip(t, path, -errno);
		return;
	}
	subtree_add(t, path, &st);
	if (!S_ISDIR(st.st_mode))
		return;
	d = opendir(path);
	if (!d) {
		skip(t, path, -errno);
		return;
	}
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (len + 1 + strlen(e->d_name) >= PATH_MAX) {
			skip(t, path, -ENAMETOOLONG); /* (the directory's path: the entry's does not fit) */
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
	/* As du(1): the totals of what could be read, each skipped entry counted, exit status 1. */
	if (t.skipped)
		fprintf(stderr, "weightfsctl stat: %s: %llu entries could not be read and are left out (first: "
			"%s: %s)\n", arg, (unsigned long long)t.skipped, t.error_path, strerror(-t.error));
	ratio = t.object_bytes ? (double)t.logical_bytes / (double)t.object_bytes : 1.0;
	if (json) {
		int ret = wfs_ctl_json_print(
			json_pack("{s:o, s:o, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o}",
				  "store", wfs_ctl_json_string(store), "mountpoint", wfs_ctl_json_string(mnt),
				  "subtree", wfs_ctl_json_string(real), "names", (json_int_t)t.names,
				  "directories", (json_int_t)t.directories, "symlinks", (json_int_t)t.symlinks,
				  "logical_bytes", (json_int_t)t.logical_bytes, "objects", (json_int_t)t.objects,
				  "object_bytes", (json_int_t)t.object_bytes, "unsealed_files", (json_int_t)t.unsealed_files,
				  "special_files", (json_int_t)t.special_files, "skipped", (json_int_t)t.skipped,
				  "dedup_ratio", wfs_ctl_json_fixed(ratio, 4)),
			0);

		return ret ? ret : t.skipped ? 1 : 0;
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
	if (t.skipped)
		printf("skipped:            %llu entries that could not be read (see the message above)\n",
		       (unsigned long long)t.skipped);
	return t.skipped ? 1 : 0;
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
		     "Print the names, directories, logical bytes (the sum of file sizes, what ls -l of the\n"
		     "mount shows; du shows allocated blocks instead: each name's object, holes left out),\n"
		     "objects, physical bytes (the sum of object sizes, each content once; on disk: du of\n"
		     "STORE/objects) and the dedup ratio (logical / physical bytes).\n"
		     "Reads the catalog only: safe next to a running daemon. Given a MOUNTPOINT, it also\n"
		     "shows what the daemon serving it knows (the mount root's user.weightfs.stats\n"
		     "attribute): objects verified this run, passthrough on/off, claims, new object bytes.\n"
		     "Given a directory (or file) below a mount point, it prints the same totals for that\n"
		     "subtree, read through the mount (stat and user.weightfs.digest of each name): its\n"
		     "objects are the distinct contents below it. --prometheus prints a store's totals,\n"
		     "its resident bytes and the daemon's counters for node_exporter's textfile collector.\n");
}

/*
 * The daemon's view, from the user.weightfs.stats attribute of the mount root (fs/ops.c writes it)
 * of store @store, if a daemon has it mounted. NULL when none answers. The caller json_decref()s it.
 */
static json_t *daemon_stats(const char *store)
{
	char mnt[PATH_MAX];

	return wfs_mounts_of(store, true, mnt) ? NULL : wfs_ctl_mount_stats(mnt);
}

static uint64_t json_u64(const json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	return json_is_integer(v) ? (uint64_t)json_integer_value(v) : 0;
}

/* The FUSE requests since the mount, by opcode, most first ("requests" of the daemon's stats). */
static void print_requests(const json_t *r)
{
	struct req {
		const char *name;
		uint64_t n;
	} v[64];
	size_t n = 0, total = 0;
	const char *key;
	json_t *val;

	if (!json_is_object(r) || json_object_size(r) == 0)
		return;
	json_object_foreach((json_t *)r, key, val) {
		if (n < sizeof(v) / sizeof(v[0]) && json_is_integer(val)) {
			v[n].name = key;
			v[n].n = (uint64_t)json_integer_value(val);
			total += v[n++].n;
		}
	}
	for (size_t i = 1; i < n; i++) /* insertion sort: a few dozen opcodes */
		for (size_t j = i; j > 0 && v[j].n > v[j - 1].n; j--) {
			struct req t = v[j];

			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	printf("FUSE requests:      %zu since mount:", total);
	for (size_t i = 0; i < n; i++)
		printf("%s %s %llu", i ? "," : "", v[i].name, (unsigned long long)v[i].n);
	printf("\n");
}

static void print_daemon_stats(const json_t *d)
{
	const json_t *k = json_object_get(d, "since_mount");
	const char *version = json_string_value(json_object_get(d, "server_version"));

	printf("verified:           %llu objects checked this run, %llu not yet (checked at first open)\n",
	       (unsigned long long)json_u64(d, "objects_verified"),
	       (unsigned long long)json_u64(d, "objects_unverified"));
	if (json_u64(d, "server_pid"))
		printf("server:             pid %llu%s%s%s", (unsigned long long)json_u64(d, "server_pid"),
		       version ? " (weightfs " : "", version ? version : "", version ? ")" : "");
	if (json_u64(d, "holder_pid"))
		printf(", under holder pid %llu; %llu takeovers and %llu upgrades since mount (a server that "
		       "died or was upgraded was replaced)\n", (unsigned long long)json_u64(d, "holder_pid"),
		       (unsigned long long)json_u64(d, "takeovers"), (unsigned long long)json_u64(d, "upgrades"));
	else if (json_u64(d, "holder_lost_pid"))
		printf("; its holder pid %llu died: no holder now (a crash leaves the mount dead; unmount and "
		       "mount again for one)\n", (unsigned long long)json_u64(d, "holder_lost_pid"));
	else if (json_u64(d, "server_pid"))
		printf("; no holder (a crash leaves the mount dead)\n");
	printf("passthrough:        %s\n", json_is_true(json_object_get(d, "passthrough"))
						  ? "on (reads served by the kernel)" : "off (reads served by the daemon)");
	printf("direct path:        %s\n", json_is_true(json_object_get(d, "direct"))
						  ? "served (weightfs.open_object: the object file, any kernel)"
						  : "not served (clients read the mounted files)");
	printf("since mount:        %llu seals (%llu new objects of %llu bytes; %llu dedup hits), "
	       "%llu claims sealed, %llu missed\n",
	       (unsigned long long)json_u64(k, "seals"), (unsigned long long)json_u64(k, "objects_published"),
	       (unsigned long long)json_u64(k, "bytes_published"), (unsigned long long)json_u64(k, "dedup_hits"),
	       (unsigned long long)json_u64(k, "claims"), (unsigned long long)json_u64(k, "claim_misses"));
	printf("opens since mount:  %llu read-only through passthrough, %llu by the daemon (writes, or reads "
	       "without passthrough)\n",
	       (unsigned long long)json_u64(k, "opens_passthrough"), (unsigned long long)json_u64(k, "opens_daemon"));
	printf("tensor writes:      %llu through passthrough (%llu sealed from a copy: the file was still "
	       "writable at its release; %llu sealed on their writer's declared digest, %llu of those "
	       "checked since)\n",
	       (unsigned long long)json_u64(k, "opens_passthrough_write"),
	       (unsigned long long)json_u64(k, "published_copies"),
	       (unsigned long long)json_u64(k, "seals_declared"),
	       (unsigned long long)json_u64(k, "checks_after_seal"));
	printf("durability:         %llu seals durable at close (fsync'd, or large with sync=close), %llu "
	       "group syncs for the others (%llu of them object by object), %llu waiting for the next\n",
	       (unsigned long long)json_u64(k, "seals_synced"), (unsigned long long)json_u64(k, "group_syncs"),
	       (unsigned long long)json_u64(k, "group_syncs_by_file"),
	       (unsigned long long)json_u64(k, "seals_awaiting_sync"));
	printf("direct since mount: %llu object descriptors handed out\n",
	       (unsigned long long)json_u64(k, "opens_direct"));
	print_requests(json_object_get(k, "requests"));
	if (json_is_object(json_object_get(d, "lock"))) { /* fs/core/lock.h; 10 ms: WFS_LOCK_SLOW_MS */
		const json_t *l = json_object_get(d, "lock");
		const char *at = json_string_value(json_object_get(l, "held_max_at"));

		printf("daemon lock:        held %.0f ms in %llu holds since this server started; longest hold "
		       "%.1f ms (%s), %llu holds of 10 ms or more "
		       "(%.0f ms in all); lent %llu times to catalog work (commits, these totals; longest "
		       "%.1f ms), %llu opens, releases and stats of sealed files served meanwhile\n",
		       json_number_value(json_object_get(l, "held_ms")), (unsigned long long)json_u64(l, "holds"),
		       json_number_value(json_object_get(l, "held_max_ms")),
		       at ? at : "?",
		       (unsigned long long)json_u64(l, "holds_slow"), json_number_value(json_object_get(l, "holds_slow_ms")),
		       (unsigned long long)json_u64(l, "lends"), json_number_value(json_object_get(l, "lent_max_ms")),
		       (unsigned long long)json_u64(l, "light_holds"));
	}
	if (json_is_object(json_object_get(d, "receive"))) { /* fs/receive.h */
		const json_t *r = json_object_get(d, "receive");

		if (json_is_true(json_object_get(r, "installed")))
			printf("request threads:    %llu requests found while polling (-o spin=%llu us), %llu after "
			       "sleeping; %llu hand-overs before heavy requests, %llu take-overs of a stuck "
			       "leader\n",
			       (unsigned long long)json_u64(r, "taken_spinning"), (unsigned long long)json_u64(r, "spin_us"),
			       (unsigned long long)json_u64(r, "taken_sleeping"),
			       (unsigned long long)json_u64(r, "handovers"), (unsigned long long)json_u64(r, "takeovers"));
		else
			printf("request threads:    libfuse's own receive path\n");
	}
}

/*
 * Resident bytes of every object file below @dir (STORE/objects), per node, into @r. Returns false
 * when this user cannot measure them (the store is private to the mounting user, or mincore would
 * not tell it the truth): then no resident numbers are reported rather than zeros.
 */
static bool store_residency(const char *dir, struct wfs_cache_residency *r)
{
	char path[PATH_MAX + 64];
	struct dirent *e, *f;
	DIR *d = opendir(dir), *sub;
	bool known = true;

	if (!d)
		return false;
	while ((e = readdir(d)) != NULL) {
		if (strlen(e->d_name) != 2)
			continue;
		if (snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) >= (int)sizeof(path)) {
			known = false; /* a store path this long cannot be measured */
			continue;
		}
		sub = opendir(path);
		if (!sub)
			continue;
		while ((f = readdir(sub)) != NULL) {
			struct stat st;
			int fd;

			if (f->d_name[0] == '.')
				continue;
			fd = openat(dirfd(sub), f->d_name, O_RDONLY | O_CLOEXEC);
			if (fd < 0)
				continue;
			if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
			    wfs_cache_residency_fd(fd, (uint64_t)st.st_size, true, r) == -EACCES)
				known = false;
			close(fd);
		}
		closedir(sub);
	}
	closedir(d);
	return known;
}

/* One metric line; @labels is the label set without braces (the store). */
static void metric(const char *name, const char *help, const char *type, const char *labels, double v)
{
	printf("# HELP weightfs_%s %s\n# TYPE weightfs_%s %s\nweightfs_%s{%s} %.17g\n", name, help, name, type,
	       name, labels, v);
}

/*
 * stat --prometheus: store @store's catalog totals @st, the disk usage of its objects (@disk_bytes;
 * WFS_CACHE_UNKNOWN: not measurable by this user, left out), the page cache of its object files (left
 * out when this user cannot measure it, never reported as 0) and the daemon's JSON @daemon (NULL: none
 * serves it) in the Prometheus text format. Returns the exit status.
 */
static int stat_prometheus(const char *store, const struct wfs_catalog_stats *st, uint64_t disk_bytes,
			   uint64_t quarantine_files, uint64_t quarantine_bytes, uint64_t retain, const json_t *daemon)
{
	struct wfs_cache_residency r;
	char labels[PATH_MAX + 16], objects[PATH_MAX + 16];
	bool resident_known;
	const char *key;
	json_t *v, *since, *ms;

	memset(&r, 0, sizeof(r));
	snprintf(objects, sizeof(objects), "%s/objects", store);
	resident_known = store_residency(objects, &r);
	/* Label values escape \ and " (the exposition format); a store path rarely has either. */
	{
		size_t k = 0;

		k += (size_t)snprintf(labels, sizeof(labels), "store=\"");
		for (const char *p = store; *p && k + 3 < sizeof(labels); p++) {
			if (*p == '\\' || *p == '"')
				labels[k++] = '\\';
			labels[k++] = *p == '\n' ? ' ' : *p;
		}
		snprintf(labels + k, sizeof(labels) - k, "\"");
	}
	metric("names", "Names of regular files.", "gauge", labels, (double)st->names);
	metric("directories", "Directories, the root included.", "gauge", labels, (double)st->directories);
	metric("logical_bytes", "Sum of the file sizes of all names.", "gauge", labels, (double)st->logical_bytes);
	metric("objects", "Referenced objects (distinct contents).", "gauge", labels, (double)st->objects);
	metric("physical_bytes", "Sum of the sizes of referenced objects.", "gauge", labels,
	       (double)st->object_bytes);
	if (disk_bytes != WFS_CACHE_UNKNOWN) /* another user of a private store: not measured, not 0 */
		metric("objects_disk_bytes", "Disk usage of STORE/objects.", "gauge", labels, (double)disk_bytes);
	metric("dedup_ratio", "Logical bytes / physical bytes.", "gauge", labels,
	       st->object_bytes ? (double)st->logical_bytes / (double)st->object_bytes : 1.0);
	metric("unreferenced_objects", "Objects no name uses (kept within the retention budget).", "gauge", labels,
	       (double)st->unreferenced_objects);
	metric("unreferenced_bytes", "Bytes of the objects no name uses.", "gauge", labels,
	       (double)st->unreferenced_bytes);
	metric("retain_bytes", "The store's retention budget: bytes of objects no name uses that every mount "
	       "keeps (weightfsctl retain).", "gauge", labels, (double)retain);
	metric("quarantined_objects", "Objects that failed verification (their names fail with EIO).", "gauge",
	       labels, (double)st->quarantined_objects);
	metric("quarantine_files", "Damaged copies in STORE/quarantine/, until gc --quarantine removes them "
	       "(also after their content was written again).", "gauge", labels, (double)quarantine_files);
	metric("quarantine_bytes", "Bytes of the damaged copies in STORE/quarantine/.", "gauge", labels,
	       (double)quarantine_bytes);
	metric("unsealed_files", "Files being written or never sealed.", "gauge", labels, (double)st->unsealed_files);
	if (resident_known) {
		metric("resident_bytes", "Page cache of the store's object files (mincore).", "gauge", labels,
		       (double)r.resident_bytes);
		printf("# HELP weightfs_node_resident_bytes Page cache of the store's object files per NUMA node.\n"
		       "# TYPE weightfs_node_resident_bytes gauge\n");
		for (int n = 0; n <= wfs_cache_max_node() && n < WFS_CACHE_MAX_NODES; n++)
			printf("weightfs_node_resident_bytes{%s,node=\"%d\"} %llu\n", labels, n,
			       (unsigned long long)r.node_bytes[n]);
	}
	metric("daemon_up", "1 when a daemon serves the store (its user.weightfs.stats answered).", "gauge",
	       labels, daemon ? 1 : 0);
	if (!daemon)
		return 0;
	metric("passthrough", "1 when reads go through kernel FUSE passthrough.", "gauge", labels,
	       json_is_true(json_object_get(daemon, "passthrough")) ? 1 : 0);
	metric("objects_verified", "Objects whose digest this server checked.", "gauge", labels,
	       (double)json_u64(daemon, "objects_verified"));
	metric("objects_unverified", "Objects this server has not checked yet (checked at first open).", "gauge",
	       labels, (double)json_u64(daemon, "objects_unverified"));
	/* Every counter since mount (seals, claims, claim_misses, ...), as the daemon names it; under a
	 * holder they go on across takeovers (fs/takeover.h, wfs_takeover_counters). */
	since = json_object_get(daemon, "since_mount");
	json_object_foreach(since, key, v) {
		char name[128], help[192];

		if (!json_is_integer(v) || key[strspn(key, "abcdefghijklmnopqrstuvwxyz_0123456789")] != '\0')
			continue;
		if (strcmp(key, "seals_awaiting_sync") == 0) { /* a level, not a count */
			metric(key, "Seals committed whose objects wait for the next group sync.", "gauge",
			       labels, (double)json_integer_value(v));
			continue;
		}
		snprintf(name, sizeof(name), "%s_total", key);
		snprintf(help, sizeof(help), "Daemon counter %s since mount.", key);
		metric(name, help, "counter", labels, (double)json_integer_value(v));
	}
	{ /* the daemon lock (fs/core/lock.h): this server's, a successor starts them again */
		const json_t *l = json_object_get(daemon, "lock");

		if (json_is_object(l)) {
			metric("lock_held_max_seconds", "Longest hold of the daemon lock since this server started.",
			       "gauge", labels, json_number_value(json_object_get(l, "held_max_ms")) / 1e3);
			metric("lock_held_seconds_total", "Time the daemon lock was held since this server started.",
			       "counter", labels, json_number_value(json_object_get(l, "held_ms")) / 1e3);
			metric("lock_holds_slow_total", "Holds of the daemon lock of 10 ms or more since this server "
			       "started.", "counter", labels, (double)json_u64(l, "holds_slow"));
			metric("lock_lends_total", "Times the daemon lock was lent to catalog work since this "
			       "server started.", "counter", labels, (double)json_u64(l, "lends"));
		}
	}
	{ /* the request threads (fs/receive.h): this server's */
		const json_t *rx = json_object_get(daemon, "receive");

		if (json_is_object(rx)) {
			metric("requests_taken_spinning_total", "FUSE requests a polling request thread found, "
			       "since this server started.", "counter", labels, (double)json_u64(rx, "taken_spinning"));
			metric("requests_taken_sleeping_total", "FUSE requests that woke a request thread, since "
			       "this server started.", "counter", labels, (double)json_u64(rx, "taken_sleeping"));
			metric("request_takeovers_total", "Leading request threads replaced while stuck on a "
			       "request, since this server started.", "counter", labels,
			       (double)json_u64(rx, "takeovers"));
		}
	}
	ms = json_object_get(since, "request_ms");
	since = json_object_get(since, "requests");
	if (json_object_size(since)) {
		printf("# HELP weightfs_fuse_requests_total FUSE requests since mount, by opcode.\n"
		       "# TYPE weightfs_fuse_requests_total counter\n");
		json_object_foreach(since, key, v)
			printf("weightfs_fuse_requests_total{%s,opcode=\"%s\"} %llu\n", labels, key,
			       (unsigned long long)json_integer_value(v));
	}
	if (json_object_size(ms)) {
		printf("# HELP weightfs_fuse_request_seconds_total Time in the daemon's handlers since mount, "
		       "by opcode.\n# TYPE weightfs_fuse_request_seconds_total counter\n");
		json_object_foreach(ms, key, v)
			printf("weightfs_fuse_request_seconds_total{%s,opcode=\"%s\"} %.6f\n", labels, key,
			       json_number_value(v) / 1e3);
	}
	return 0;
}

/*
 * The damaged copies in STORE/quarantine/ into *@files and *@bytes (st_size): on disk until gc
 * --quarantine removes them, also after their content was written again (and no object is
 * quarantined any more). Counted by wfs_store_quarantine_clear() without removing anything. Returns
 * false when the store cannot be read (another user's private store: the daemon counts them).
 */
static bool quarantine_on_disk(const char *store, uint64_t *files, uint64_t *bytes)
{
	struct wfs_store *s = NULL;
	int ret = wfs_store_open(store, WFS_STORE_READONLY, &s);

	if (ret == 0)
		ret = wfs_store_quarantine_clear(s, true, files, bytes);
	wfs_store_close(s);
	return ret == 0;
}

int wfs_ctl_stat(int argc, char **argv)
{
	bool json = false, prometheus = false, from_daemon = false, catalog_lost = false, hidden;
	const struct wfs_ctl_opt opts[] = {
		WFS_CTL_OPT_FLAG("json", 'j', &json),
		WFS_CTL_OPT_FLAG("prometheus", 0, &prometheus),
		WFS_CTL_OPT_END,
	};
	const struct wfs_ctl_cmd cmd = {"stat", stat_usage, opts, 1, 1};
	struct wfs_catalog_stats st;
	struct wfs_catalog *c = NULL;
	json_t *daemon;
	char store[PATH_MAX], db[PATH_MAX + 16], why[PATH_MAX + 512];
	uint64_t du = WFS_CACHE_UNKNOWN, retain = 0, qfiles = 0, qbytes = 0;
	double ratio;
	int ret, fd;

	ret = wfs_ctl_parse(&cmd, argc, argv);
	if (ret != WFS_CTL_GO_ON)
		return ret;
	if (json && prometheus) {
		fprintf(stderr, "weightfsctl stat: --json and --prometheus: choose one\n");
		return 2;
	}
	ret = wfs_ctl_resolve_store(argv[optind], store);
	if (ret == -EMEDIUMTYPE) {
		char real[PATH_MAX], mnt[PATH_MAX];

		if (realpath(argv[optind], real) && wfs_mounts_below(real, mnt, store) == 0) {
			if (!prometheus)
				return stat_subtree(argv[optind], real, mnt, store, json);
			fprintf(stderr, "weightfsctl stat: %s: --prometheus prints a store's totals: give the "
				"store or its mount point (%s), not a directory below it\n", argv[optind], mnt);
			return 1;
		}
	}
	/* A mount whose store this mount namespace does not see: the daemon's totals are all there is. */
	hidden = ret == WFS_MOUNTS_EHIDDEN;
	if (ret && !hidden) {
		fprintf(stderr, "weightfsctl stat: %s: %s\n", argv[optind], wfs_ctl_store_error(ret));
		return 1;
	}
	snprintf(db, sizeof(db), "%s/" WFS_STORE_CATALOG, store);
	if (!hidden) {
		ret = wfs_catalog_open(db, WFS_CATALOG_READONLY, 0, 0, &c);
		if (ret == 0)
			ret = wfs_catalog_stats(c, &st);
		if (ret == 0)
			ret = wfs_catalog_retain_get(c, &retain);
		wfs_catalog_close(c);
		if (ret && access(db, R_OK) < 0)
			ret = -errno; /* SQLite says only "cannot open" for a store this user cannot enter */
	}
	daemon = daemon_stats(store);
	if (hidden && !daemon) {
		fprintf(stderr, "weightfsctl stat: %s: %s\n", argv[optind], wfs_ctl_store_error(ret));
		return 1;
	}
	if (!daemon) {
		char mnt[PATH_MAX];

		if (wfs_mounts_of(store, false, mnt) == 0 && wfs_mounts_of(store, true, mnt) != 0)
			fprintf(stderr, "weightfsctl stat: %s is mounted on %s, but its daemon does not answer "
				"(it died): the catalog's totals only; unmount it: fusermount3 -u %s\n",
				store, mnt, mnt);
	}
	if (ret && ret != -EACCES && wfs_ctl_catalog_error(store, ret, why, sizeof(why))) {
		/* Missing or damaged: say so, whatever a daemon still serving it can tell. */
		fprintf(stderr, "weightfsctl stat: %s: %s\n", store, why);
		if (!daemon)
			return 1;
		catalog_lost = true;
	}
	if (ret && daemon) {
		/* Another user of a mount: the store is private, but the daemon tells its totals (as it
		 * does for a catalog removed under it). */
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
		qfiles = json_u64(daemon, "quarantine_files");
		qbytes = json_u64(daemon, "quarantine_bytes");
		ret = 0;
	} else if (ret == 0 && !quarantine_on_disk(store, &qfiles, &qbytes) && daemon) {
		qfiles = json_u64(daemon, "quarantine_files");
		qbytes = json_u64(daemon, "quarantine_bytes");
	}
	if (ret) {
		fprintf(stderr, "weightfsctl stat: %s: cannot read catalog: %s\n", db, strerror(-ret));
		json_decref(daemon);
		return 1;
	}
	/* The disk use of objects/, or WFS_CACHE_UNKNOWN: never 0 for what this user cannot measure
	 * (another user of a private store, whose totals come from the daemon). */
	snprintf(db, sizeof(db), "%s/objects", store);
	fd = hidden ? -1 : open(db, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0)
		du = disk_usage(fd);
	else if (!hidden && errno == ENOENT)
		du = 0; /* no objects/: nothing on disk (fsck says it is missing) */
	ratio = st.object_bytes ? (double)st.logical_bytes / (double)st.object_bytes : 1.0;
	if (prometheus) {
		ret = stat_prometheus(store, &st, du, qfiles, qbytes, retain, daemon);
		json_decref(daemon);
		return ret ? ret : catalog_lost;
	}
	if (json) {
		json_t *o = json_pack("{s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o, "
				      "s:o?}",
				      "store", wfs_ctl_json_string(store), "names", (json_int_t)st.names,
				      "directories", (json_int_t)st.directories, "symlinks", (json_int_t)st.symlinks,
				      "logical_bytes", (json_int_t)st.logical_bytes, "objects", (json_int_t)st.objects,
				      "object_bytes", (json_int_t)st.object_bytes, "objects_disk_bytes",
				      du == WFS_CACHE_UNKNOWN ? json_null() : json_integer((json_int_t)du),
				      "unreferenced_objects", (json_int_t)st.unreferenced_objects,
				      "unreferenced_bytes", (json_int_t)st.unreferenced_bytes,
				      "retain_bytes", (json_int_t)retain, "quarantined_objects", (json_int_t)st.quarantined_objects,
				      "quarantine_files", (json_int_t)qfiles, "quarantine_bytes", (json_int_t)qbytes,
				      "unsealed_files", (json_int_t)st.unsealed_files,
				      "special_files", (json_int_t)st.special_files,
				      "dedup_ratio", wfs_ctl_json_fixed(ratio, 4), "daemon", daemon);

		/* false: the totals are the daemon's, its store not being visible here */
		if (o)
			json_object_set_new(o, "store_visible", json_boolean(!hidden));
		return catalog_lost | wfs_ctl_json_print(o, 0);
	}
	printf("store:              %s%s\n", store,
	       hidden ? " (not visible from this mount namespace: totals from the daemon; bind-mount the "
			"store into the container at the same path to read it here)"
	       : catalog_lost ? " (" WFS_STORE_CATALOG " missing: totals from the daemon)"
	       : from_daemon ? " (private to the mounting user: totals from the daemon)" : "");
	printf("names:              %llu\n", (unsigned long long)st.names);
	printf("directories:        %llu\n", (unsigned long long)st.directories);
	if (st.special_files)
		printf("special files:      %llu (FIFOs, sockets, device nodes)\n",
		       (unsigned long long)st.special_files);
	printf("logical bytes:      %llu (%.1f MiB)\n", (unsigned long long)st.logical_bytes,
	       (double)st.logical_bytes / 1048576.0);
	printf("objects:            %llu\n", (unsigned long long)st.objects);
	printf("physical bytes:     %llu (%.1f MiB); ", (unsigned long long)st.object_bytes,
	       (double)st.object_bytes / 1048576.0);
	if (du == WFS_CACHE_UNKNOWN)
		printf("on disk unknown\n");
	else
		printf("on disk %.1f MiB\n", (double)du / 1048576.0);
	if (st.unreferenced_objects || retain)
		printf("unreferenced:       %llu objects, %llu bytes (kept for reuse: the store keeps up to "
		       "%llu bytes, weightfsctl retain)\n", (unsigned long long)st.unreferenced_objects,
		       (unsigned long long)st.unreferenced_bytes, (unsigned long long)retain);
	if (st.quarantined_objects)
		printf("quarantined:        %llu objects (their names fail with EIO until rewritten)\n",
		       (unsigned long long)st.quarantined_objects);
	if (qfiles)
		printf("quarantine/:        %llu damaged copies, %llu bytes on disk (weightfsctl gc --quarantine "
		       "removes them)\n", (unsigned long long)qfiles, (unsigned long long)qbytes);
	if (st.unsealed_files)
		printf("unsealed files:     %llu (being written, or left by a crash)\n",
		       (unsigned long long)st.unsealed_files);
	printf("dedup ratio:        %.2fx\n", ratio);
	if (daemon)
		print_daemon_stats(daemon);
	json_decref(daemon);
	return catalog_lost ? 1 : 0;
}

