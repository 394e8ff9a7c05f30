/* SPDX-License-Identifier: Apache-2.0 */
/*
 * weightfsctl gc: remove the objects no name uses (lib/gc.h): itself from a store that is not
 * mounted, through the daemon (user.weightfs.gc on its mount root) from one that is.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/xattr.h>

#include <jansson.h>

#include "ctl.h"
#include "gc.h"
#include "mounts.h"
#include "weightfs.h"

static void gc_usage(FILE *out)
{
	fprintf(out, "usage: weightfsctl gc [--retain SIZE] [--quarantine] [--dry-run] [--json] STORE\n\n"
		     "Remove objects no name uses, least recently released first, until those left take\n"
		     "at most SIZE bytes (default 0: remove them all, whatever budget the store keeps for its\n"
		     "mounts: weightfsctl retain), and object files the catalog does not list (orphans a\n"
		     "crash left). On a mounted store its daemon removes them, skipping those in use; orphans\n"
		     "then wait for an offline gc or the next start after a crash, and --quarantine needs the\n"
		     "store unmounted.\n\n"
		     "  --retain SIZE keep the most recently released unused objects, up to SIZE bytes (e.g. 20G)\n"
		     "  --quarantine  also remove STORE/quarantine/: the damaged copies a failed check moved\n"
		     "                aside for inspection (their names fail with EIO until the content is\n"
		     "                written again, with or without them)\n"
		     "  --dry-run     remove nothing: say what would go (the store is opened read-only)\n"
		     "  --json        machine-readable report\n\n"
		     "exit status: 0 done, 1 failed, 2 usage error\n");
}

/*
 * The store at @store is mounted: ask its daemon (setxattr user.weightfs.gc on the mount root) to
 * remove the objects no name uses beyond @retain bytes, and read what it did into @r. Returns 0,
 * -EBUSY (no live mount found: the daemon died), or -errno of the request.
 */
static int gc_online(const char *store, uint64_t retain, struct wfs_gc_report *r)
{
	char mnt[PATH_MAX], value[32], buf[512];
	json_t *o;
	ssize_t n;

	if (wfs_mounts_of(store, true, mnt))
		return -EBUSY;
	snprintf(value, sizeof(value), "%" PRIu64, retain);
	if (setxattr(mnt, WFS_XATTR_GC, value, strlen(value), 0) < 0)
		return errno == EOPNOTSUPP || errno == ENODATA ? -ENOTSUP : -errno;
	n = getxattr(mnt, WFS_XATTR_GC, buf, sizeof(buf));
	if (n <= 0 || !(o = json_loadb(buf, (size_t)n, 0, NULL)))
		return n < 0 ? -errno : -EIO;
	memset(r, 0, sizeof(*r));
	r->objects_removed = (uint64_t)json_integer_value(json_object_get(o, "objects_removed"));
	r->bytes_removed = (uint64_t)json_integer_value(json_object_get(o, "bytes_removed"));
	r->objects_kept = (uint64_t)json_integer_value(json_object_get(o, "objects_kept"));
	r->bytes_kept = (uint64_t)json_integer_value(json_object_get(o, "bytes_kept"));
	json_decref(o);
	return 0;
}

int wfs_ctl_gc(int argc, char **argv)
{
	uint64_t retain = 0, qfiles = 0, qbytes = 0;
	bool dry_run = false, json = false, quarantine = false, online = false;
	const struct wfs_ctl_opt opts[] = {
		WFS_CTL_OPT_SIZE("retain", 'r', &retain, "not a size (e.g. 20G)"),
		WFS_CTL_OPT_FLAG("dry-run", 'n', &dry_run),
		WFS_CTL_OPT_FLAG("quarantine", 'q', &quarantine),
		WFS_CTL_OPT_FLAG("json", 'j', &json),
		WFS_CTL_OPT_END,
	};
	const struct wfs_ctl_cmd cmd = {"gc", gc_usage, opts, 1, 1};
	struct wfs_gc_report r;
	char store[PATH_MAX] = "", owner[PATH_MAX + 64], why[PATH_MAX + 512];
	int ret;

	ret = wfs_ctl_parse(&cmd, argc, argv);
	if (ret != WFS_CTL_GO_ON)
		return ret;
	ret = wfs_ctl_resolve_store(argv[optind], store);
	if (ret == 0)
		ret = wfs_gc(store, retain, dry_run, &r);
	if (ret == -EBUSY && quarantine) {
		fprintf(stderr, "weightfsctl gc: %s: --quarantine: the store is in use by %s: unmount it first "
			"(its daemon may be moving a damaged copy there)\n", argv[optind],
			wfs_ctl_store_owner(store, owner, sizeof(owner)));
		return 1;
	}
	if (ret == -EBUSY) {
		ret = gc_online(store, retain, &r);
		online = ret == 0;
	}
	if (ret == 0 && quarantine)
		ret = wfs_gc_quarantine(store, dry_run, &qfiles, &qbytes);
	if (ret == -EBUSY) {
		/* Held, and no mount of it here answers: a daemon that died, one a lazy unmount detached,
		 * or one in another mount namespace. */
		fprintf(stderr, "weightfsctl gc: %s: in use by %s, and no mount of it here answers (its daemon "
			"died, or a lazy unmount detached it): unmount it first\n", argv[optind],
			wfs_ctl_store_owner(store, owner, sizeof(owner)));
		return 1;
	}
	if (ret && *store && wfs_ctl_catalog_error(store, ret, why, sizeof(why))) {
		fprintf(stderr, "weightfsctl gc: %s: %s\n", store, why);
		return 1;
	}
	if (ret) {
		fprintf(stderr, "weightfsctl gc: %s: %s\n", argv[optind],
			ret == -ENOTSUP ? "mounted by a weightfs too old to collect online: unmount it first"
			: ret == -EPERM ? "mounted by another user: only that user or root may collect online"
					: wfs_ctl_store_error(ret));
		return 1;
	}
	if (json)
		return wfs_ctl_json_print(json_pack("{s:o, s:b, s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "store",
						    wfs_ctl_json_string(store), "dry_run", dry_run, "online", online,
						    "objects_removed",
						    (json_int_t)r.objects_removed, "bytes_removed",
						    (json_int_t)r.bytes_removed, "objects_kept", (json_int_t)r.objects_kept,
						    "bytes_kept", (json_int_t)r.bytes_kept, "orphans_removed",
						    (json_int_t)r.orphans_removed, "orphan_bytes_removed",
						    (json_int_t)r.orphan_bytes_removed, "quarantined_removed",
						    (json_int_t)qfiles, "quarantined_bytes_removed", (json_int_t)qbytes),
					  0);
	printf("gc: %s: %s %llu unreferenced objects (%.1f MiB); kept %llu (%.1f MiB)%s\n", store,
	       dry_run ? "would remove" : "removed", (unsigned long long)r.objects_removed,
	       (double)r.bytes_removed / 1048576.0, (unsigned long long)r.objects_kept,
	       (double)r.bytes_kept / 1048576.0, online ? " (by its daemon: mounted)" : "");
	if (r.orphans_removed)
		printf("gc: %s: %s %llu orphan object files the catalog does not list (%.1f MiB)\n", store,
		       dry_run ? "would remove" : "removed", (unsigned long long)r.orphans_removed,
		       (double)r.orphan_bytes_removed / 1048576.0);
	if (quarantine)
		printf("gc: %s: %s %llu quarantined copies (%.1f MiB)\n", store, dry_run ? "would remove" : "removed",
		       (unsigned long long)qfiles, (double)qbytes / 1048576.0);
	return 0;
}
