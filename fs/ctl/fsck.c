/* SPDX-License-Identifier: Apache-2.0 */
/*
 * weightfsctl fsck: check a store, and repair what is safe (lib/fsck.h).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <jansson.h>

#include "ctl.h"
#include "fsck.h"
#include "mounts.h"
#include "weightfs.h"

struct fsck_ui {
	char mnt[PATH_MAX]; /* where a daemon serves the store, or "" */
	json_t *findings;   /* --json: the findings so far; NULL: print them as text */
	struct wfs_ctl_progress progress;
};

static void on_finding(void *ctx, enum wfs_fsck_kind kind, const char *what, const char *detail,
		       const char *const *names, size_t nnames, bool repaired)
{
	struct fsck_ui *ui = ctx;
	char note[96] = "";

	wfs_ctl_progress_clear(&ui->progress);
	if (kind == WFS_FSCK_CORRUPT && ui->mnt[0]) {
		/* Online: the daemon may have checked this object before it was damaged and still
		 * trust it. Have it check the bytes again, which quarantines them. */
		int r = setxattr(ui->mnt, WFS_XATTR_RECHECK, what, strlen(what), 0) == 0 ? 0 : errno;

		snprintf(note, sizeof(note), r == EIO ? " [the daemon quarantined it]"
						     : r == 0 ? " [the daemon reads it intact now]" : "");
	}
	if (ui->findings) {
		json_t *list = json_array();

		for (size_t i = 0; list && i < nnames; i++)
			json_array_append_new(list, wfs_ctl_json_string(names[i]));
		json_array_append_new(ui->findings,
				      json_pack("{s:s, s:o, s:o, s:o, s:b}", "kind", wfs_fsck_kind_name(kind), "what",
						wfs_ctl_json_string(what), "detail", wfs_ctl_json_string(detail), "names",
						list, "repaired", repaired));
		return;
	}
	printf("%-11s %s: %s%s%s\n", wfs_fsck_kind_name(kind), what, detail, repaired ? " [repaired]" : "", note);
	/* Each name that uses the object, below the mount point: what to write again. */
	for (size_t i = 0; i < nnames; i++)
		printf("%-11s %s%s\n", "", ui->mnt[0] ? ui->mnt : "", names[i]);
}

static void on_progress(void *ctx, uint64_t bytes_done, uint64_t bytes_total, uint64_t objects_done,
			uint64_t objects_total)
{
	struct fsck_ui *ui = ctx;

	wfs_ctl_progress_show(&ui->progress, objects_done == objects_total,
			      "fsck: %llu/%llu objects, %.1f/%.1f MiB (%.0f%%)", (unsigned long long)objects_done,
			      (unsigned long long)objects_total, (double)bytes_done / 1048576.0,
			      (double)bytes_total / 1048576.0,
			      bytes_total ? 100.0 * (double)bytes_done / (double)bytes_total : 100.0);
}

/*
 * What is left and why, after the summary: objects whose names fail (corrupt, missing, quarantined:
 * only writing their content again heals them, repair cannot) and the rest (see the findings).
 */
static void print_left(const struct wfs_fsck_report *r, uint64_t left)
{
	uint64_t unclean = r->found[WFS_FSCK_UNCLEAN] - r->repaired[WFS_FSCK_UNCLEAN];
	uint64_t content = r->found[WFS_FSCK_CORRUPT] - r->repaired[WFS_FSCK_CORRUPT] + r->found[WFS_FSCK_MISSING] -
			   r->repaired[WFS_FSCK_MISSING] - (r->objects_lost ? 1 : 0); /* objects/: no object */

	if (r->quarantined_now)
		printf("fsck: %llu damaged objects moved to quarantine/ now\n", (unsigned long long)r->quarantined_now);
	if (content)
		printf("fsck: left: %llu objects whose names fail with EIO (damaged or missing content, listed "
		       "above with their names): only writing the content again heals them; --repair cannot\n",
		       (unsigned long long)content);
	if (unclean)
		printf("fsck: left: the store was not closed by its last owner (a crash): the next mount, or "
		       "fsck --repair, runs its recovery\n");
	if (left > content + unclean)
		printf("fsck: left: %llu other problems (see the findings above)%s\n",
		       (unsigned long long)(left - content - unclean),
		       r->online ? "; --repair needs the store unmounted" : "");
}

static void fsck_usage(FILE *out)
{
	fprintf(out,
		"usage: weightfsctl fsck [--repair] [--rate BYTES/S] [--json] STORE|MOUNTPOINT\n\n"
		"Read every object and check its bytes against its digest; check the catalog against the\n"
		"objects directory (missing objects, orphan files, stray files, writable objects) and its own\n"
		"invariants (refcounts, link counts, names without inodes); list tmp leftovers,\n"
		"quarantined objects and temporary names (.wfs-tmp-*) an interrupted write left; say\n"
		"whether the store was closed cleanly. Each damaged, missing or quarantined object is\n"
		"listed with the names that use it (paths below the mount point): what to write again.\n"
		"A damaged catalog is reported as such, with what to do.\n\n"
		"  --repair        fix what is safe: quarantine corrupt objects, remove orphans, tmp\n"
		"                  leftovers and temporary names, recount refcounts and links, run the\n"
		"                  crash recovery of a store not closed cleanly (needs it unmounted)\n"
		"  --rate BYTES/S  read objects at most this fast (e.g. 200M), to stay out of a trainer's way\n"
		"                  when the store is mounted (0, the default: as fast as the disk reads)\n"
		"  --json          machine-readable report\n\n"
		"With the store mounted the check is read-only (an online scrub). Progress is shown on a\n"
		"terminal.\n\n"
		"exit status: 0 no problem (or all repaired), 1 problems remain or the check failed,\n"
		"2 usage error. A name whose content is damaged or missing is a problem that remains\n"
		"after --repair (which moves damaged objects aside) until the content is written again.\n");
}

int wfs_ctl_fsck(int argc, char **argv)
{
	struct fsck_ui ui = {.findings = NULL};
	struct wfs_fsck_options opt = {.finding = on_finding, .progress = on_progress, .ctx = &ui};
	bool json = false;
	const struct wfs_ctl_opt opts[] = {
		WFS_CTL_OPT_FLAG("repair", 'r', &opt.repair),
		WFS_CTL_OPT_SIZE("rate", 'R', &opt.rate, "not a size (e.g. 200M)"),
		WFS_CTL_OPT_FLAG("json", 'j', &json),
		WFS_CTL_OPT_END,
	};
	const struct wfs_ctl_cmd cmd = {"fsck", fsck_usage, opts, 1, 1};
	struct wfs_fsck_report r;
	char store[PATH_MAX];
	json_t *out = NULL;
	uint64_t left;
	int ret;

	ret = wfs_ctl_parse(&cmd, argc, argv);
	if (ret != WFS_CTL_GO_ON)
		return ret;
	ret = wfs_ctl_resolve_store(argv[optind], store);
	if (ret) {
		fprintf(stderr, "weightfsctl fsck: %s: %s%s\n", argv[optind], wfs_ctl_store_error(ret),
			ret == -EMEDIUMTYPE ? " (not a directory below it)" : "");
		return 1;
	}
	if (!opt.repair && wfs_mounts_of(store, true, ui.mnt))
		ui.mnt[0] = '\0';
	if (json) {
		out = json_pack("{s:o, s:[]}", "store", wfs_ctl_json_string(store), "findings");
		if (!out)
			return wfs_ctl_json_print(NULL, 0);
		ui.findings = json_object_get(out, "findings");
	}
	wfs_ctl_progress_init(&ui.progress, true);
	ret = wfs_fsck(store, &opt, &r);
	wfs_ctl_progress_clear(&ui.progress);
	if (ret) {
		/* No document on stdout, as every --json on an error: a reader would take the findings
		 * so far (none, say, for a store this user may not read) for the store's. */
		json_decref(out);
		fprintf(stderr, "weightfsctl fsck: %s: %s\n", store,
			ret == -EBUSY ? "mounted: unmount it to repair (a check without --repair runs online)"
				      : wfs_ctl_store_error(ret));
		return 1;
	}
	left = wfs_fsck_unrepaired(&r);
	if (out) {
		json_object_set_new(out, "online", json_boolean(r.online));
		json_object_set_new(out, "state", json_string(r.online ? "mounted" : r.unclean ? "unclean" : "clean"));
		json_object_set_new(out, "catalog_damaged", json_boolean(r.catalog_damaged));
		json_object_set_new(out, "objects_lost", json_boolean(r.objects_lost));
		json_object_set_new(out, "objects_checked", json_integer((json_int_t)r.objects_checked));
		json_object_set_new(out, "bytes_checked", json_integer((json_int_t)r.bytes_checked));
		json_object_set_new(out, "quarantined_now", json_integer((json_int_t)r.quarantined_now));
		json_object_set_new(out, "problems_left", json_integer((json_int_t)left));
		wfs_ctl_json_print(out, 0);
	} else {
		uint64_t found = 0, fixed = 0;

		/* The store's state: an unclean one is a finding of its own, above. */
		if (!r.online && !r.unclean && !r.objects_lost)
			printf("%-11s %s: closed by its last owner\n", "clean", "lock");
		for (int k = 0; k < WFS_FSCK_KINDS; k++) {
			if (k == WFS_FSCK_QUARANTINED || k == WFS_FSCK_UNSEALED)
				continue;
			found += r.found[k];
			fixed += r.repaired[k];
		}
		printf("fsck: %s%s: %llu objects (%.1f MiB) checked; %llu problems, %llu repaired, %llu left",
		       store, r.online ? " (mounted: read-only check)" : "", (unsigned long long)r.objects_checked,
		       (double)r.bytes_checked / 1048576.0, (unsigned long long)found, (unsigned long long)fixed,
		       (unsigned long long)left);
		if (r.found[WFS_FSCK_QUARANTINED])
			printf("; %llu in quarantine", (unsigned long long)r.found[WFS_FSCK_QUARANTINED]);
		if (r.online && r.found[WFS_FSCK_UNSEALED])
			printf("; %llu unsealed (being written, or failed after close)",
			       (unsigned long long)r.found[WFS_FSCK_UNSEALED]);
		printf("\n");
		print_left(&r, left);
	}
	return left ? 1 : 0;
}
