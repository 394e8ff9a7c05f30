/*
 * weightfsctl fsck / gc: check and clean a store (lib/fsck.h, lib/gc.h).
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "cmd.h"
#include "fsck.h"
#include "gc.h"
#include "weightfs.h"

struct fsck_ui {
	char mnt[PATH_MAX]; /* where a daemon serves the store, or "" */
	bool tty;      /* progress on stderr */
	bool json;
	bool first;    /* no JSON finding printed yet */
	time_t last;   /* last progress line */
	bool progress_shown;
};

static void clear_progress(struct fsck_ui *ui)
{
	if (ui->progress_shown) {
		fputs("\r\033[K", stderr);
		ui->progress_shown = false;
	}
}

static void on_finding(void *ctx, enum wfs_fsck_kind kind, const char *what, const char *detail,
		       bool repaired)
{
	struct fsck_ui *ui = ctx;
	char note[96] = "";

	clear_progress(ui);
	if (kind == WFS_FSCK_CORRUPT && ui->mnt[0]) {
		/* Online: the daemon may have checked this object before it was damaged and still
		 * trust it. Have it check the bytes again, which quarantines them. */
		int r = setxattr(ui->mnt, WFS_XATTR_RECHECK, what, strlen(what), 0) == 0 ? 0 : errno;

		snprintf(note, sizeof(note), r == EIO ? " [the daemon quarantined it]"
						     : r == 0 ? " [the daemon reads it intact now]" : "");
	}
	if (ui->json) {
		printf("%s\n    {\"kind\": \"%s\", \"what\": \"%s\", \"detail\": \"%s\", \"repaired\": %s}",
		       ui->first ? "" : ",", wfs_fsck_kind_name(kind), what, detail, repaired ? "true" : "false");
		ui->first = false;
		return;
	}
	printf("%-11s %s: %s%s%s\n", wfs_fsck_kind_name(kind), what, detail, repaired ? " [repaired]" : "", note);
}

static void on_progress(void *ctx, uint64_t bytes_done, uint64_t bytes_total, uint64_t objects_done,
			uint64_t objects_total)
{
	struct fsck_ui *ui = ctx;
	time_t now = time(NULL);

	if (!ui->tty || (now == ui->last && objects_done != objects_total))
		return;
	ui->last = now;
	fprintf(stderr, "\rfsck: %llu/%llu objects, %.1f/%.1f MiB (%.0f%%)", (unsigned long long)objects_done,
		(unsigned long long)objects_total, (double)bytes_done / 1048576.0,
		(double)bytes_total / 1048576.0,
		bytes_total ? 100.0 * (double)bytes_done / (double)bytes_total : 100.0);
	ui->progress_shown = true;
}

static void fsck_usage(FILE *out)
{
	fprintf(out,
		"usage: weightfsctl fsck [--repair] [--rate BYTES/S] [--json] STORE|MOUNTPOINT\n\n"
		"Read every object and check its bytes against its digest; check the catalog against the\n"
		"objects directory (missing objects, orphan files, stray files, writable objects) and its own\n"
		"invariants (refcounts, link counts, names without inodes); list tmp leftovers and\n"
		"quarantined objects.\n\n"
		"  --repair        fix what is safe: quarantine corrupt objects, remove orphans and tmp\n"
		"                  leftovers, recount refcounts and links (needs the store unmounted)\n"
		"  --rate BYTES/S  read objects at most this fast (e.g. 200M), to stay out of a trainer's way\n"
		"                  when the store is mounted\n"
		"  --json          machine-readable report\n\n"
		"With the store mounted the check is read-only (an online scrub). Progress is shown on a\n"
		"terminal.\n\n"
		"exit status: 0 no problem (or all repaired), 1 problems remain or the check failed,\n"
		"2 usage error\n");
}

int wfs_cmd_fsck(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"repair", no_argument, NULL, 'r'}, {"rate", required_argument, NULL, 'R'},
		{"json", no_argument, NULL, 'j'},   {"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct fsck_ui ui = {.tty = isatty(STDERR_FILENO), .first = true};
	struct wfs_fsck_options opt = {.finding = on_finding, .progress = on_progress, .ctx = &ui};
	struct wfs_fsck_report r;
	char store[PATH_MAX];
	uint64_t left;
	int c, ret;

	while ((c = getopt_long(argc, argv, "rR:jh", longopts, NULL)) != -1) {
		switch (c) {
		case 'r':
			opt.repair = true;
			break;
		case 'R':
			if (wfs_parse_size(optarg, &opt.rate)) {
				fprintf(stderr, "weightfsctl fsck: --rate %s: not a size (e.g. 200M)\n", optarg);
				return 2;
			}
			break;
		case 'j':
			ui.json = true;
			break;
		case 'h':
			fsck_usage(stdout);
			return 0;
		default:
			fsck_usage(stderr);
			return 2;
		}
	}
	if (optind != argc - 1) {
		fsck_usage(stderr);
		return 2;
	}
	ret = wfs_cmd_resolve_store(argv[optind], store);
	if (ret) {
		fprintf(stderr, "weightfsctl fsck: %s: %s%s\n", argv[optind], wfs_cmd_store_error(ret),
			ret == -EMEDIUMTYPE ? " (not a directory below it)" : "");
		return 1;
	}
	if (!opt.repair && wfs_cmd_mount_of(store, ui.mnt))
		ui.mnt[0] = '\0';
	if (ui.json)
		printf("{\"store\": \"%s\", \"findings\": [", store);
	ret = wfs_fsck(store, &opt, &r);
	clear_progress(&ui);
	if (ret) {
		if (ui.json)
			printf("\n  ]}\n");
		fprintf(stderr, "weightfsctl fsck: %s: %s\n", store,
			ret == -EBUSY ? "mounted: unmount it to repair (a check without --repair runs online)"
				      : strerror(-ret));
		return 1;
	}
	left = wfs_fsck_unrepaired(&r);
	if (ui.json) {
		printf("\n  ], \"online\": %s, \"objects_checked\": %llu, \"bytes_checked\": %llu, "
		       "\"problems_left\": %llu}\n",
		       r.online ? "true" : "false", (unsigned long long)r.objects_checked,
		       (unsigned long long)r.bytes_checked, (unsigned long long)left);
	} else {
		uint64_t found = 0, fixed = 0;

		for (int k = 0; k < WFS_FSCK_KINDS; k++) {
			if (k == WFS_FSCK_QUARANTINED)
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
		printf("\n");
	}
	return left ? 1 : 0;
}

static void gc_usage(FILE *out)
{
	fprintf(out, "usage: weightfsctl gc [--retain SIZE] [--dry-run] [--json] STORE\n\n"
		     "Remove objects no name uses, least recently released first, until those left take\n"
		     "at most SIZE bytes (default 0: remove them all). The store must not be mounted (the\n"
		     "daemon does the same online with -o retain=SIZE).\n\n"
		     "exit status: 0 done, 1 failed, 2 usage error\n");
}

int wfs_cmd_gc(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"retain", required_argument, NULL, 'r'}, {"dry-run", no_argument, NULL, 'n'},
		{"json", no_argument, NULL, 'j'},         {"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct wfs_gc_report r;
	uint64_t retain = 0;
	bool dry_run = false, json = false;
	char store[PATH_MAX];
	int c, ret;

	while ((c = getopt_long(argc, argv, "r:njh", longopts, NULL)) != -1) {
		switch (c) {
		case 'r':
			if (wfs_parse_size(optarg, &retain)) {
				fprintf(stderr, "weightfsctl gc: --retain %s: not a size (e.g. 20G)\n", optarg);
				return 2;
			}
			break;
		case 'n':
			dry_run = true;
			break;
		case 'j':
			json = true;
			break;
		case 'h':
			gc_usage(stdout);
			return 0;
		default:
			gc_usage(stderr);
			return 2;
		}
	}
	if (optind != argc - 1) {
		gc_usage(stderr);
		return 2;
	}
	ret = wfs_cmd_resolve_store(argv[optind], store);
	if (ret == 0)
		ret = wfs_gc(store, retain, dry_run, &r);
	if (ret) {
		fprintf(stderr, "weightfsctl gc: %s: %s\n", argv[optind],
			ret == -EBUSY ? "mounted: unmount it first (or mount with -o retain=SIZE)"
				      : wfs_cmd_store_error(ret));
		return 1;
	}
	if (json)
		printf("{\"store\": \"%s\", \"dry_run\": %s, \"objects_removed\": %llu, \"bytes_removed\": %llu, "
		       "\"objects_kept\": %llu, \"bytes_kept\": %llu}\n",
		       store, dry_run ? "true" : "false", (unsigned long long)r.objects_removed,
		       (unsigned long long)r.bytes_removed, (unsigned long long)r.objects_kept,
		       (unsigned long long)r.bytes_kept);
	else
		printf("gc: %s: %s %llu unreferenced objects (%.1f MiB); kept %llu (%.1f MiB)\n", store,
		       dry_run ? "would remove" : "removed", (unsigned long long)r.objects_removed,
		       (double)r.bytes_removed / 1048576.0, (unsigned long long)r.objects_kept,
		       (double)r.bytes_kept / 1048576.0);
	return 0;
}
