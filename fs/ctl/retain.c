/* SPDX-License-Identifier: Apache-2.0 */
/*
 * weightfsctl retain: show or record a store's retention budget (lib/catalog.h,
 * wfs_catalog_retain_get): how many bytes of objects no name uses every mount of it keeps for reuse.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "catalog.h"
#include "ctl.h"
#include "gc.h"
#include "store.h"
#include "weightfs.h"

static void retain_usage(FILE *out)
{
	fprintf(out, "usage: weightfsctl retain [--json] STORE [SIZE]\n\n"
		     "Show the store's retention budget, or record SIZE bytes (K, M, G, T, P suffixes; 0: keep\n"
		     "nothing) as the new one. Every mount of the store keeps up to that much of the objects\n"
		     "no name uses (a trainer's weights after it removed them), least recently released out\n"
		     "first, so a later run writing the same weights stores nothing new: a plain remount,\n"
		     "mount -t, fstab and weightfsctl's own private mounts alike. weightfs -o retain=SIZE\n"
		     "records it too. What it keeps gives way to writes on a store that fills up; besides\n"
		     "that, only weightfsctl gc and a mount over the budget (logged at warning level)\n"
		     "remove objects the store keeps. Recording needs the store unmounted (a mount's\n"
		     "budget is read when it mounts).\n\n"
		     "  --json        machine-readable: {\"store\", \"retain_bytes\"}\n\n"
		     "exit status: 0 done, 1 failed, 2 usage error\n");
}

int wfs_ctl_retain(int argc, char **argv)
{
	bool json = false;
	const struct wfs_ctl_opt opts[] = {
		WFS_CTL_OPT_FLAG("json", 'j', &json),
		WFS_CTL_OPT_END,
	};
	const struct wfs_ctl_cmd cmd = {"retain", retain_usage, opts, 1, 2};
	char store[PATH_MAX], db[PATH_MAX + 16], what[PATH_MAX], why[PATH_MAX + 512];
	struct wfs_catalog *c = NULL;
	uint64_t bytes = 0, was = 0;
	bool set;
	int ret, pid;

	ret = wfs_ctl_parse(&cmd, argc, argv);
	if (ret != WFS_CTL_GO_ON)
		return ret;
	set = optind + 1 < argc;
	if (set && wfs_parse_size(argv[optind + 1], &bytes)) {
		fprintf(stderr, "weightfsctl retain: %s: not a size (e.g. 20G; units K, M, G, T, P)\n",
			argv[optind + 1]);
		return 2;
	}
	ret = wfs_ctl_resolve_store(argv[optind], store);
	if (ret) {
		fprintf(stderr, "weightfsctl retain: %s: %s\n", argv[optind], wfs_ctl_store_error(ret));
		return 1;
	}
	/* Not through wfs_store_open(): taking the store's lock and closing it would erase the mark a
	 * killed daemon left (wfs_store_unclean), which the next mount's recovery needs. */
	if (set && wfs_store_owner(store, &pid, what, sizeof(what)) == 0) {
		fprintf(stderr, "weightfsctl retain: %s: in use by weightfs (pid %d%s%s): a mount reads the "
			"budget when it mounts; unmount it and run this again, or mount it again with -o retain=%s "
			"(which records it; mount -o remount is not supported)\n", store, pid, *what ? ", " : "", what, argv[optind + 1]);
		return 1;
	}
	snprintf(db, sizeof(db), "%s/" WFS_STORE_CATALOG, store);
	ret = wfs_catalog_open(db, set ? 0 : WFS_CATALOG_READONLY, 0, 0, &c);
	if (ret == 0)
		ret = wfs_catalog_retain_get(c, &was);
	if (ret == 0 && set && was != bytes)
		ret = wfs_catalog_retain_set(c, bytes);
	wfs_catalog_close(c);
	if (ret && wfs_ctl_catalog_error(store, ret, why, sizeof(why))) {
		fprintf(stderr, "weightfsctl retain: %s: %s\n", store, why);
		return 1;
	}
	if (ret) {
		fprintf(stderr, "weightfsctl retain: %s: %s the retention budget: %s\n", store,
			set ? "cannot record" : "cannot read", strerror(-ret));
		return 1;
	}
	if (!set)
		bytes = was;
	if (json)
		return wfs_ctl_json_print(json_pack("{s:o, s:I}", "store", wfs_ctl_json_string(store),
						    "retain_bytes", (json_int_t)bytes),
					  0);
	if (set)
		printf("retain: %s: %llu bytes (%.1f MiB; was %llu bytes) of objects no name uses are kept by "
		       "every mount\n", store, (unsigned long long)bytes, (double)bytes / 1048576.0,
		       (unsigned long long)was);
	else
		printf("retain: %s: %llu bytes (%.1f MiB) of objects no name uses are kept by every mount\n",
		       store, (unsigned long long)bytes, (double)bytes / 1048576.0);
	return 0;
}
