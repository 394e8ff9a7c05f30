/* SPDX-License-Identifier: Apache-2.0 */
/*
 * weightfsctl cache drop|load|status PATH...: the host page cache of weightfs names, through their
 * object files (lib/cache.h).
 */
#include <errno.h>
#include <limits.h>
#include <numa.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "cache.h"
#include "ctl.h"
#include "mounts.h"

static void cache_usage(FILE *out)
{
	fprintf(out,
		"usage: weightfsctl cache drop PATH... [--json]\n"
		"       weightfsctl cache load PATH... [--numa-node N | --device N] [--bind] [--threads N] [--json]\n"
		"       weightfsctl cache status PATH... [--json]\n\n"
		"PATH is a file or directory (a rank's tree) on a weightfs mount. Its pages are the page cache\n"
		"of its object files (passthrough), shared by every name with the same content, so this acts\n"
		"on the objects in the store (root or the mounting user: the store is private to its owner).\n"
		"Files and directories below PATH that you cannot read are skipped and counted, and so are\n"
		"damaged files (they read EIO until written again; exit status 1): the rest is acted on.\n"
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

/*
 * Without passthrough (-o passthrough=off, a kernel before 6.9, a daemon without CAP_SYS_ADMIN) the
 * pages readers use are each mounted file's own, one copy per name, and the daemon drops the
 * object's behind its reads: status counts, and load fills, the object files only. Says so once
 * per mount on stderr (drop frees the names' pages too: lib/cache.c).
 */
static void warn_without_passthrough(const char *verb, int n, char **paths)
{
	char said[PATH_MAX] = "";

	for (int i = 0; i < n; i++) {
		char real[PATH_MAX], mnt[PATH_MAX], store[PATH_MAX];
		json_t *stats;

		if (!realpath(paths[i], real) || wfs_mounts_below(real, mnt, store) || strcmp(mnt, said) == 0)
			continue;
		snprintf(said, sizeof(said), "%s", mnt);
		stats = wfs_ctl_mount_stats(mnt);
		if (stats && json_is_false(json_object_get(stats, "passthrough")))
			fprintf(stderr,
				"weightfsctl cache %s: %s serves reads without passthrough: readers use each "
				"name's own page cache there, which %s; `cache drop` frees it\n",
				verb, mnt, strcmp(verb, "status") == 0 ? "this count leaves out (fincore on the names counts it)"
								       : "this load does not fill (read the names instead)");
		json_decref(stats);
	}
}

static void human(char *buf, size_t len, uint64_t bytes)
{
	if (bytes >= (1ull << 30))
		snprintf(buf, len, "%.2f GiB", (double)bytes / (double)(1ull << 30));
	else
		snprintf(buf, len, "%.1f MiB", (double)bytes / 1048576.0);
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
	if (g && g->unreadable)
		printf(" (%llu files you cannot read skipped)", (unsigned long long)g->unreadable);
	if (g && g->unreadable_dirs)
		printf(" (%llu directories you cannot read skipped)", (unsigned long long)g->unreadable_dirs);
	if (g && g->damaged)
		printf(" (%llu damaged files skipped)", (unsigned long long)g->damaged);
	printf("\n");
}

/*
 * Files and directories skipped over all groups: those the caller cannot read (not its to act on),
 * and damaged files (their digest reads EIO: no object to act on, the work is partial).
 */
struct skipped {
	uint64_t files, dirs, damaged;
};

static struct skipped skipped_of(const struct wfs_cache_set *set)
{
	struct skipped u = { 0, 0, 0 };

	for (size_t i = 0; i < wfs_cache_set_groups(set); i++) {
		u.files += wfs_cache_set_group(set, i)->unreadable;
		u.dirs += wfs_cache_set_group(set, i)->unreadable_dirs;
		u.damaged += wfs_cache_set_group(set, i)->damaged;
	}
	return u;
}

/* "; N files you cannot read skipped; M directories ...; K damaged ..." (parts not 0) into @buf. */
static void skipped_note(char *buf, size_t len, struct skipped u)
{
	size_t n = 0;

	buf[0] = '\0';
	if (u.files)
		n += (size_t)snprintf(buf + n, len - n, "; %llu files you cannot read skipped",
				      (unsigned long long)u.files);
	if (u.dirs && n < len)
		n += (size_t)snprintf(buf + n, len - n, "; %llu directories you cannot read skipped",
				      (unsigned long long)u.dirs);
	if (u.damaged && n < len)
		snprintf(buf + n, len - n, "; %llu damaged files skipped", (unsigned long long)u.damaged);
}

/*
 * The end of a command that acted on the rest: with damaged files skipped, one line on stderr that
 * says what they are and what heals them, and exit status 1 (the work is partial, as stat's is).
 * Returns the exit status: @ret when no file was damaged.
 */
static int damaged_end(const char *verb, uint64_t damaged, int ret)
{
	if (!damaged)
		return ret;
	fprintf(stderr,
		"weightfsctl cache %s: %llu damaged files skipped (they read EIO: their content failed its "
		"check; write them again; weightfsctl fsck names them), the rest done\n",
		verb, (unsigned long long)damaged);
	return 1;
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

			json_object_set_new(o, "path", wfs_ctl_json_string(g->path));
			json_object_set_new(o, "files", json_integer((json_int_t)g->files));
			json_object_set_new(o, "unsealed_files", json_integer((json_int_t)g->unsealed));
			json_object_set_new(o, "unreadable_files", json_integer((json_int_t)g->unreadable));
			json_object_set_new(o, "unreadable_dirs", json_integer((json_int_t)g->unreadable_dirs));
			json_object_set_new(o, "damaged_files", json_integer((json_int_t)g->damaged));
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
		if (wfs_ctl_json_print(top, JSON_COMPACT))
			return 1;
	} else if (wfs_cache_set_groups(set) > 1) {
		print_residency("total (distinct objects)", NULL, wfs_cache_set_objects(set), &r);
	}
	if (ret)
		fprintf(stderr, "weightfsctl cache status: some objects could not be measured: %s\n",
			strerror(-ret));
	return damaged_end("status", skipped_of(set).damaged, ret ? 1 : 0);
}

static int do_drop(struct wfs_cache_set *set, bool json)
{
	struct skipped skipped_n = skipped_of(set);
	uint64_t before = 0, after = 0;
	double t0 = wfs_ctl_now(), dt;
	char a[32], b[32], skipped[128];
	int ret = wfs_cache_drop(set, &before, &after);

	dt = wfs_ctl_now() - t0;
	if (ret) {
		fprintf(stderr, "weightfsctl cache drop: posix_fadvise: %s\n", strerror(-ret));
		return 1;
	}
	if (json) {
		bool known = after != WFS_CACHE_UNKNOWN;

		return damaged_end("drop",
				   skipped_n.damaged,
				   wfs_ctl_json_print(json_pack("{s:I, s:o, s:o, s:o, s:I, s:I, s:I}", "objects",
								(json_int_t)wfs_cache_set_objects(set), "resident_bytes_before",
								known ? json_integer((json_int_t)before) : json_null(),
								"resident_bytes_after",
								known ? json_integer((json_int_t)after) : json_null(), "seconds",
								wfs_ctl_json_fixed(dt, 3), "unreadable_files",
								(json_int_t)skipped_n.files, "unreadable_dirs",
								(json_int_t)skipped_n.dirs, "damaged_files",
								(json_int_t)skipped_n.damaged),
						      0));
	}
	skipped_note(skipped, sizeof(skipped), skipped_n);
	if (after == WFS_CACHE_UNKNOWN) {
		printf("drop: %zu objects dropped (%.3f s); how much was resident cannot be measured as this user "
		       "(the kernel shows another user's files as all resident: ask as the mounting user)%s\n",
		       wfs_cache_set_objects(set), dt, skipped);
		return damaged_end("drop", skipped_n.damaged, 0);
	}
	human(a, sizeof(a), before);
	human(b, sizeof(b), after);
	printf("drop: %zu objects: %s resident before, %s after (%.3f s)%s%s\n", wfs_cache_set_objects(set), a,
	       b, dt, after ? "; what stays is mapped by some process (the kernel does not drop mapped pages)"
			    : "", skipped);
	return damaged_end("drop", skipped_n.damaged, 0);
}

static int do_load(struct wfs_cache_set *set, int node, enum wfs_cache_policy policy, unsigned threads,
		   bool json)
{
	struct skipped skipped_n = skipped_of(set);
	struct wfs_cache_load *l = NULL;
	struct wfs_ctl_progress progress;
	double t0 = wfs_ctl_now(), dt;
	uint64_t done = 0, total = 0;
	char msg[256], a[32], skipped[128];
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
	wfs_ctl_progress_init(&progress, !json);
	while (!wfs_cache_load_poll(l, &done, &total)) {
		human(a, sizeof(a), done);
		wfs_ctl_progress_show(&progress, false, "load: %s of %.1f MiB (%.0f%%)", a, (double)total / 1048576.0,
				      total ? 100.0 * (double)done / (double)total : 100.0);
		usleep(100000);
	}
	ret = wfs_cache_load_wait(l, msg, sizeof(msg));
	wfs_cache_load_poll(l, &done, &total);
	wfs_cache_load_free(l);
	dt = wfs_ctl_now() - t0;
	wfs_ctl_progress_clear(&progress);
	if (ret) {
		fprintf(stderr, "weightfsctl cache load: object %s\n", msg);
		return 1;
	}
	if (json)
		return damaged_end("load", skipped_n.damaged,
				   wfs_ctl_json_print(json_pack("{s:I, s:I, s:o, s:i, s:s, s:I, s:I, s:I}", "objects",
								(json_int_t)wfs_cache_set_objects(set), "bytes",
								(json_int_t)done, "seconds", wfs_ctl_json_fixed(dt, 3),
								"numa_node", node, "policy",
								node < 0 ? "none"
								: policy == WFS_CACHE_BIND ? "bind"
											   : "preferred",
								"unreadable_files", (json_int_t)skipped_n.files,
								"unreadable_dirs", (json_int_t)skipped_n.dirs,
								"damaged_files", (json_int_t)skipped_n.damaged),
						      0));
	human(a, sizeof(a), done);
	skipped_note(skipped, sizeof(skipped), skipped_n);
	printf("load: %zu objects, %s read in %.2f s (%.0f MiB/s)", wfs_cache_set_objects(set), a, dt,
	       dt > 0 ? (double)done / 1048576.0 / dt : 0.0);
	if (node >= 0)
		printf(", pages allocated on NUMA node %d (%s)%s\n", node, policy == WFS_CACHE_BIND ? "bind" : "preferred",
		       skipped);
	else
		printf(", unbound%s\n", skipped);
	return damaged_end("load", skipped_n.damaged, 0);
}

int wfs_ctl_cache(int argc, char **argv)
{
	long node = -1, device = -1, threads = 0;
	bool json = false, bind = false;
	const struct wfs_ctl_opt opts[] = {
		WFS_CTL_OPT_FLAG("json", 'j', &json),
		WFS_CTL_OPT_LONG("numa-node", 'n', &node, 0, 4095, "not a node number"),
		WFS_CTL_OPT_LONG("device", 'd', &device, 0, 4095, "not a device number"),
		WFS_CTL_OPT_FLAG("bind", 'b', &bind),
		WFS_CTL_OPT_LONG("threads", 't', &threads, 1, 4095, "not a thread count"),
		WFS_CTL_OPT_END,
	};
	const struct wfs_ctl_cmd cmd = {"cache", cache_usage, opts, 1, -1};
	enum wfs_cache_policy policy;
	struct wfs_cache_set *set = NULL;
	const char *verb;
	char err[PATH_MAX + 256];
	int ret;

	if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
		cache_usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	verb = argv[1];
	if (strcmp(verb, "drop") && strcmp(verb, "load") && strcmp(verb, "status")) {
		fprintf(stderr, "weightfsctl cache: unknown action '%s' (drop, load or status)\n", verb);
		return 2;
	}
	argc--, argv++; /* the verb's options and PATHs */
	ret = wfs_ctl_parse(&cmd, argc, argv);
	if (ret != WFS_CTL_GO_ON)
		return ret;
	policy = bind ? WFS_CACHE_BIND : WFS_CACHE_PREFERRED;
	if (strcmp(verb, "load") && (node >= 0 || device >= 0 || threads || bind)) {
		fprintf(stderr, "weightfsctl cache %s: --numa-node, --device, --bind and --threads are for load\n", verb);
		return 2;
	}
	if (node >= 0 && device >= 0) {
		fprintf(stderr, "weightfsctl cache load: --numa-node and --device: give one\n");
		return 2;
	}
	if (bind && node < 0 && device < 0) {
		fprintf(stderr, "weightfsctl cache load: --bind needs --numa-node N or --device N (the node "
			"to bind to)\n");
		return 2;
	}
	if (device >= 0) {
		node = wfs_cache_numa_node_of_device((int)device);
		if (node == -ENODEV) {
			fprintf(stderr, "weightfsctl cache load: --device %ld: no such CUDA device (or no CUDA runtime, "
				"or built without CUDA): give --numa-node\n", device);
			return 1;
		}
		if (node < 0)
			fprintf(stderr, "weightfsctl cache load: CUDA device %ld reports no NUMA node: loading unbound\n",
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
	if (strcmp(verb, "drop") != 0)
		warn_without_passthrough(verb, argc - optind, argv + optind);
	if (strcmp(verb, "status") == 0)
		ret = do_status(set, json);
	else if (strcmp(verb, "drop") == 0)
		ret = do_drop(set, json);
	else
		ret = do_load(set, (int)node, policy, (unsigned)threads, json);
	wfs_cache_set_free(set);
	return ret;
}
