/* SPDX-License-Identifier: Apache-2.0 */
/*
 * weightfsctl gc: remove the objects no name uses from a store that is not mounted (lib/gc.h).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>

#include <jansson.h>

#include "ctl.h"
#include "gc.h"

static void gc_usage(FILE *out)
{
	fprintf(out, "usage: weightfsctl gc [--retain SIZE] [--quarantine] [--dry-run] [--json] STORE\n\n"
		     "Remove objects no name uses, least recently released first, until those left take\n"
		     "at most SIZE bytes (default 0: remove them all, whatever budget the store keeps for its\n"
		     "mounts: weightfsctl retain), and object files the catalog does not list (orphans a\n"
		     "crash left). The store must not be mounted (the daemon does the same online with the\n"
		     "store's budget, and removes orphans when it starts after a crash).\n\n"
		     "  --retain SIZE keep the most recently released unused objects, up to SIZE bytes (e.g. 20G)\n"
		     "  --quarantine  also remove STORE/quarantine/: the damaged copies a failed check moved\n"
		     "                aside for inspection (their names fail with EIO until the content is\n"
		     "                written again, with or without them)\n"
		     "  --dry-run     remove nothing: say what would go (the store is opened read-only)\n"
		     "  --json        machine-readable report\n\n"
		     "exit status: 0 done, 1 failed, 2 usage error\n");
}

int wfs_ctl_gc(int argc, char **argv)
{
	uint64_t retain = 0, qfiles = 0, qbytes = 0;
	bool dry_run = false, json = false, quarantine = false;
	const struct wfs_ctl_opt opts[] = {
		WFS_CTL_OPT_SIZE("retain", 'r', &retain, "not a size (e.g. 20G)"),
		WFS_CTL_OPT_FLAG("dry-run", 'n', &dry_run),
		WFS_CTL_OPT_FLAG("quarantine", 'q', &quarantine),
		WFS_CTL_OPT_FLAG("json", 'j', &json),
		WFS_CTL_OPT_END,
	};
	const struct wfs_ctl_cmd cmd = {"gc", gc_usage, opts, 1, 1};
	struct wfs_gc_report r;
	char store[PATH_MAX];
	int ret;

	ret = wfs_ctl_parse(&cmd, argc, argv);
	if (ret != WFS_CTL_GO_ON)
		return ret;
	ret = wfs_ctl_resolve_store(argv[optind], store);
	if (ret == 0)
		ret = wfs_gc(store, retain, dry_run, &r);
	if (ret == 0 && quarantine)
		ret = wfs_gc_quarantine(store, dry_run, &qfiles, &qbytes);
	if (ret) {
		fprintf(stderr, "weightfsctl gc: %s: %s\n", argv[optind],
			ret == -EBUSY ? "mounted: unmount it first (its mount keeps the store's budget: weightfsctl retain)"
				      : wfs_ctl_store_error(ret));
		return 1;
	}
	if (json)
		return wfs_ctl_json_print(json_pack("{s:o, s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "store",
						    wfs_ctl_json_string(store), "dry_run", dry_run, "objects_removed",
						    (json_int_t)r.objects_removed, "bytes_removed",
						    (json_int_t)r.bytes_removed, "objects_kept", (json_int_t)r.objects_kept,
						    "bytes_kept", (json_int_t)r.bytes_kept, "orphans_removed",
						    (json_int_t)r.orphans_removed, "orphan_bytes_removed",
						    (json_int_t)r.orphan_bytes_removed, "quarantined_removed",
						    (json_int_t)qfiles, "quarantined_bytes_removed", (json_int_t)qbytes),
					  0);
	printf("gc: %s: %s %llu unreferenced objects (%.1f MiB); kept %llu (%.1f MiB)\n", store,
	       dry_run ? "would remove" : "removed", (unsigned long long)r.objects_removed,
	       (double)r.bytes_removed / 1048576.0, (unsigned long long)r.objects_kept,
	       (double)r.bytes_kept / 1048576.0);
	if (r.orphans_removed)
		printf("gc: %s: %s %llu orphan object files the catalog does not list (%.1f MiB)\n", store,
		       dry_run ? "would remove" : "removed", (unsigned long long)r.orphans_removed,
		       (double)r.orphan_bytes_removed / 1048576.0);
	if (quarantine)
		printf("gc: %s: %s %llu quarantined copies (%.1f MiB)\n", store, dry_run ? "would remove" : "removed",
		       (unsigned long long)qfiles, (double)qbytes / 1048576.0);
	return 0;
}
