/*
 * weightfsctl cache drop|load|status PATH...: the host page cache of weightfs names, through their
 * object files (lib/cache.h). And weightfsctl stat --prometheus, which reports the store's resident
 * bytes the same way.
 */
#include <errno.h>
#include <numa.h>
#include <getopt.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cache.h"
#include "catalog.h"
#include "cmd.h"

static void cache_usage(FILE *out)
{
	fprintf(out,
		"usage: weightfsctl cache drop PATH... [--json]\n"
		"       weightfsctl cache load PATH... [--numa-node N | --device N] [--bind] [--threads N] [--json]\n"
		"       weightfsctl cache status PATH... [--json]\n\n"
		"PATH is a file or directory (a rank's tree) on a weightfs mount. Its pages are the page cache\n"
		"of its object files (passthrough), shared by every name with the same content, so this acts\n"
		"on the objects in the store (root or the mounting user: the store is private to its owner).\n"
		"  drop    free the page cache of every object below PATH (posix_fadvise DONTNEED); pages a\n"
		"          process has mapped stay (the kernel never drops mapped pages); the other names of a\n"
		"          shared object lose their cached copy too (there is only one).\n"
		"  load    read every object into the page cache on threads bound to NUMA node N (memory\n"
		"          policy preferred, --bind: only that node), or the node of CUDA device N; by default\n"
		"          unbound. Pages already cached stay where they are (drop first to move them).\n"
		"  status  resident bytes per PATH, summed over distinct objects (shared content counts\n"
		"          once), and per NUMA node; a closing total over all PATHs. `fincore FILE` on an\n"
		"          object file gives the same count for one file.\n");
}

static void human(char *buf, size_t len, uint64_t bytes)
{
	if (bytes >= (1ull << 30))
		snprintf(buf, len, "%.2f GiB", (double)bytes / (double)(1ull << 30));
	else
		snprintf(buf, len, "%.1f MiB", (double)bytes / 1048576.0);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static json_t *residency_json(const struct wfs_cache_residency *r)
{
	json_t *o = json_object(), *nodes = json_object();
	char key[16];

	json_object_set_new(o, "bytes", json_integer((json_int_t)r->bytes));
	json_object_set_new(o, "resident_bytes", json_integer((json_int_t)r->resident_bytes));
	for (int n = 0; n <= wfs_cache_max_node() && n < WFS_CACHE_MAX_NODES; n++) {
		snprintf(key, sizeof(key), "%d", n);
		json_object_set_new(nodes, key, json_integer((json_int_t)r->node_bytes[n]));
	}
	json_object_set_new(o, "node_resident_bytes", nodes);
	json_object_set_new(o, "unknown_node_bytes", json_integer((json_int_t)r->unknown_node_bytes));
	return o;
}

static void print_residency(const char *label, const struct wfs_cache_group *g, size_t objects,
			    const struct wfs_cache_residency *r)
{
	char a[32], b[32], c[32];

	human(a, sizeof(a), r->resident_bytes);
	human(b, sizeof(b), r->bytes);
	if (g)
		printf("%s: %llu files, %llu objects, %s of %s resident (%.0f%%)", label,
		       (unsigned long long)g->files, (unsigned long long)objects, a, b,
		       r->bytes ? 100.0 * (double)r->resident_bytes / (double)r->bytes : 0.0);
	else
		printf("%s: %llu objects, %s of %s resident (%.0f%%)", label, (unsigned long long)objects, a, b,
		       r->bytes ? 100.0 * (double)r->resident_bytes / (double)r->bytes : 0.0);
	for (int n = 0; n <= wfs_cache_max_node() && n < WFS_CACHE_MAX_NODES; n++) {
		human(c, sizeof(c), r->node_bytes[n]);
		printf("; node %d: %s", n, c);
	}
	if (r->unknown_node_bytes) {
		human(c, sizeof(c), r->unknown_node_bytes);
		printf("; node unknown: %s", c);
	}
	if (g && g->unsealed)
		printf(" (%llu unsealed files skipped)", (unsigned long long)g->unsealed);
	printf("\n");
}

static int do_status(struct wfs_cache_set *set, bool json)
{
	struct wfs_cache_residency r;
	json_t *arr = json ? json_array() : NULL;
	int ret = 0;

	for (size_t i = 0; i < wfs_cache_set_groups(set); i++) {
		const struct wfs_cache_group *g = wfs_cache_set_group(set, i);
		int e = wfs_cache_status(set, i, true, &r);

		if (e == -EACCES) {
			fprintf(stderr, "weightfsctl cache status: %s: residency cannot be measured as this user (the "
				"kernel shows another user's files as all resident); ask as the mounting user or "
				"root\n", g->path);
			if (arr)
				json_decref(arr);
			return 1;
		}
		ret = ret ? ret : e;
		if (json) {
			json_t *o = residency_json(&r);

			json_object_set_new(o, "path", json_string(g->path));
			json_object_set_new(o, "files", json_integer((json_int_t)g->files));
			json_object_set_new(o, "unsealed_files", json_integer((json_int_t)g->unsealed));
			json_object_set_new(o, "objects", json_integer((json_int_t)g->objects));
			json_array_append_new(arr, o);
		} else {
			print_residency(g->path, g, g->objects, &r);
		}
	}
	{
		int e = wfs_cache_status(set, SIZE_MAX, true, &r);

		ret = ret ? ret : e;
	}
	if (json) {
		json_t *top = json_object(), *total = residency_json(&r);

		json_object_set_new(total, "objects", json_integer((json_int_t)wfs_cache_set_objects(set)));
		json_object_set_new(top, "paths", arr);
		json_object_set_new(top, "total", total);
		json_dumpf(top, stdout, JSON_COMPACT);
		printf("\n");
		json_decref(top);
	} else if (wfs_cache_set_groups(set) > 1) {
		print_residency("total (distinct objects)", NULL, wfs_cache_set_objects(set), &r);
	}
	if (ret)
		fprintf(stderr, "weightfsctl cache status: some objects could not be measured: %s\n",
			strerror(-ret));
	return ret ? 1 : 0;
}

static int do_drop(struct wfs_cache_set *set, bool json)
{
	uint64_t before = 0, after = 0;
	double t0 = now_s(), dt;
	char a[32], b[32];
	int ret = wfs_cache_drop(set, &before, &after);

	dt = now_s() - t0;
	if (ret) {
		fprintf(stderr, "weightfsctl cache drop: posix_fadvise: %s\n", strerror(-ret));
		return 1;
	}
	if (json && after == WFS_CACHE_UNKNOWN) {
		printf("{\"objects\": %zu, \"resident_bytes_before\": null, \"resident_bytes_after\": null, "
		       "\"seconds\": %.3f}\n", wfs_cache_set_objects(set), dt);
		return 0;
	}
	if (json) {
		printf("{\"objects\": %zu, \"resident_bytes_before\": %llu, \"resident_bytes_after\": %llu, "
		       "\"seconds\": %.3f}\n",
		       wfs_cache_set_objects(set), (unsigned long long)before, (unsigned long long)after, dt);
		return 0;
	}
	if (after == WFS_CACHE_UNKNOWN) {
		printf("drop: %zu objects dropped (%.3f s); how much was resident cannot be measured as this user "
		       "(the kernel shows another user's files as all resident: ask as the mounting user)\n",
		       wfs_cache_set_objects(set), dt);
		return 0;
	}
	human(a, sizeof(a), before);
	human(b, sizeof(b), after);
	printf("drop: %zu objects: %s resident before, %s after (%.3f s)%s\n", wfs_cache_set_objects(set), a, b,
	       dt, after ? "; what stays is mapped by some process (the kernel does not drop mapped pages)"
			 : "");
	return 0;
}

static int do_load(struct wfs_cache_set *set, int node, enum wfs_cache_policy policy, unsigned threads,
		   bool json)
{
	struct wfs_cache_load *l = NULL;
	bool tty = isatty(STDERR_FILENO) && !json;
	double t0 = now_s(), dt;
	uint64_t done = 0, total = 0;
	char msg[256], a[32];
	int ret;

	ret = wfs_cache_load_start(set, node, policy, threads, &l);
	if (ret == -EINVAL) {
		fprintf(stderr, "weightfsctl cache load: no NUMA node %d here (nodes 0-%d)\n", node,
			numa_available() < 0 ? 0 : numa_max_node());
		return 1;
	}
	if (ret) {
		fprintf(stderr, "weightfsctl cache load: %s\n",
			ret == -ENOSYS ? "NUMA is not available here" : strerror(-ret));
		return 1;
	}
	while (!wfs_cache_load_poll(l, &done, &total)) {
		if (tty) {
			human(a, sizeof(a), done);
			fprintf(stderr, "\rload: %s of %.1f MiB (%.0f%%)   ", a, (double)total / 1048576.0,
				total ? 100.0 * (double)done / (double)total : 100.0);
		}
		usleep(100000);
	}
	ret = wfs_cache_load_wait(l, msg, sizeof(msg));
	wfs_cache_load_poll(l, &done, &total);
	wfs_cache_load_free(l);
	dt = now_s() - t0;
	if (tty)
		fprintf(stderr, "\r\033[K");
	if (ret) {
		fprintf(stderr, "weightfsctl cache load: object %s\n", msg);
		return 1;
	}
	if (json) {
		printf("{\"objects\": %zu, \"bytes\": %llu, \"seconds\": %.3f, \"numa_node\": %d, \"policy\": \"%s\"}\n",
		       wfs_cache_set_objects(set), (unsigned long long)done, dt, node,
		       node < 0 ? "none" : policy == WFS_CACHE_BIND ? "bind" : "preferred");
		return 0;
	}
	human(a, sizeof(a), done);
	printf("load: %zu objects, %s read in %.2f s (%.0f MiB/s)", wfs_cache_set_objects(set), a, dt,
	       dt > 0 ? (double)done / 1048576.0 / dt : 0.0);
	if (node >= 0)
		printf(", pages allocated on NUMA node %d (%s)\n", node, policy == WFS_CACHE_BIND ? "bind" : "preferred");
	else
		printf(", unbound\n");
	return 0;
}

static int parse_int(const char *s, int lo, int *out)
{
	char *end;
	long v = strtol(s, &end, 10);

	if (!*s || *end || v < lo || v > 4095)
		return -EINVAL;
	*out = (int)v;
	return 0;
}

int wfs_cmd_cache(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"json", no_argument, NULL, 'j'},
		{"numa-node", required_argument, NULL, 'n'},
		{"device", required_argument, NULL, 'd'},
		{"bind", no_argument, NULL, 'b'},
		{"threads", required_argument, NULL, 't'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	enum wfs_cache_policy policy = WFS_CACHE_PREFERRED;
	struct wfs_cache_set *set = NULL;
	int opt, node = -1, device = -1, threads = 0, ret;
	bool json = false;
	const char *verb;
	char err[PATH_MAX + 256];

	if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
		cache_usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	verb = argv[1];
	if (strcmp(verb, "drop") && strcmp(verb, "load") && strcmp(verb, "status")) {
		fprintf(stderr, "weightfsctl cache: unknown action '%s' (drop, load or status)\n", verb);
		return 2;
	}
	argc--, argv++;
	while ((opt = getopt_long(argc, argv, "jn:d:bt:h", longopts, NULL)) != -1) {
		switch (opt) {
		case 'j':
			json = true;
			break;
		case 'n':
			if (parse_int(optarg, 0, &node)) {
				fprintf(stderr, "weightfsctl cache: --numa-node %s: not a node number\n", optarg);
				return 2;
			}
			break;
		case 'd':
			if (parse_int(optarg, 0, &device)) {
				fprintf(stderr, "weightfsctl cache: --device %s: not a device number\n", optarg);
				return 2;
			}
			break;
		case 'b':
			policy = WFS_CACHE_BIND;
			break;
		case 't':
			if (parse_int(optarg, 1, &threads)) {
				fprintf(stderr, "weightfsctl cache: --threads %s: not a thread count\n", optarg);
				return 2;
			}
			break;
		case 'h':
			cache_usage(stdout);
			return 0;
		default:
			cache_usage(stderr);
			return 2;
		}
	}
	if (optind >= argc) {
		cache_usage(stderr);
		return 2;
	}
	if (strcmp(verb, "load") && (node >= 0 || device >= 0 || threads || policy == WFS_CACHE_BIND)) {
		fprintf(stderr, "weightfsctl cache %s: --numa-node, --device, --bind and --threads are for load\n", verb);
		return 2;
	}
	if (node >= 0 && device >= 0) {
		fprintf(stderr, "weightfsctl cache load: --numa-node and --device: give one\n");
		return 2;
	}
	if (device >= 0) {
		node = wfs_cache_numa_node_of_device(device);
		if (node == -ENODEV) {
			fprintf(stderr, "weightfsctl cache load: --device %d: no such CUDA device (or built without "
				"CUDA): give --numa-node\n", device);
			return 1;
		}
		if (node < 0)
			fprintf(stderr, "weightfsctl cache load: CUDA device %d reports no NUMA node: loading unbound\n",
				device);
	}
	if (wfs_cache_set_new(&set)) {
		fprintf(stderr, "weightfsctl cache: out of memory\n");
		return 1;
	}
	for (int i = optind; i < argc; i++) {
		ret = wfs_cache_set_add(set, argv[i], err, sizeof(err));
		if (ret) {
			fprintf(stderr, "weightfsctl cache %s: %s\n", verb, ret == -ENOMEM ? "out of memory" : err);
			wfs_cache_set_free(set);
			return 1;
		}
	}
	if (strcmp(verb, "status") == 0)
		ret = do_status(set, json);
	else if (strcmp(verb, "drop") == 0)
		ret = do_drop(set, json);
	else
		ret = do_load(set, node, policy, (unsigned)threads, json);
	wfs_cache_set_free(set);
	return ret;
}

/* ---- weightfsctl stat --prometheus -------------------------------------------------------------- */

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
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
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

static uint64_t ju64(const json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	return json_is_integer(v) ? (uint64_t)json_integer_value(v) : 0;
}

int wfs_cmd_stat_prometheus(const char *store, const struct wfs_catalog_stats *st, uint64_t disk_bytes,
			    const json_t *daemon)
{
	struct wfs_cache_residency r;
	char labels[PATH_MAX + 16], objects[PATH_MAX + 16];
	bool resident_known;
	const char *key;
	json_t *v, *since;

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
	metric("unreferenced_objects", "Objects no name uses (kept by -o retain).", "gauge", labels,
	       (double)st->unreferenced_objects);
	metric("quarantined_objects", "Objects that failed verification (their names fail with EIO).", "gauge",
	       labels, (double)st->quarantined_objects);
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
	metric("objects_verified", "Objects whose digest was checked since mount.", "gauge", labels,
	       (double)ju64(daemon, "objects_verified"));
	metric("objects_unverified", "Objects not checked yet since mount (checked at first open).", "gauge",
	       labels, (double)ju64(daemon, "objects_unverified"));
	/* Every counter since mount (seals, claims, claim_misses, ...), as the daemon names it. */
	since = json_object_get(daemon, "since_mount");
	json_object_foreach(since, key, v) {
		char name[128], help[192];

		if (!json_is_integer(v) || key[strspn(key, "abcdefghijklmnopqrstuvwxyz_0123456789")] != '\0')
			continue;
		snprintf(name, sizeof(name), "%s_total", key);
		snprintf(help, sizeof(help), "Daemon counter %s since mount.", key);
		metric(name, help, "counter", labels, (double)json_integer_value(v));
	}
	return 0;
}
