/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fsck — check a store: every object's bytes against its digest, the catalog against the objects
 * directory, the catalog's own invariants; with repair, fix what is safe to fix.
 *
 * What is checked, and what repair does:
 *   corrupt      an object whose bytes do not hash to its name → moved to STORE/quarantine, catalog
 *                state quarantined (its names fail with EIO until the content is written again)
 *   missing      a catalog object with no file → names that use it fail with EIO; repair forgets
 *                the row when no name uses it
 *   orphan       an object file the catalog does not list → removed
 *   stray        a file under objects/ whose name is not a digest → moved to STORE/quarantine
 *   mode         an object file that is writable → made 0444
 *   catalog      refcounts, object rows, dentries, link counts (catalog.h) → recomputed
 *   tmp          leftovers in STORE/tmp (offline only) → removed
 *   quarantined  objects waiting in STORE/quarantine (reported, never removed)
 *
 * Offline (no daemon holds the store) everything can be checked and repaired. Online (a daemon
 * has it mounted) the check is read-only and may be rate-limited so it stays out of the trainer's
 * way; repair needs the store unmounted (-EBUSY).
 */
#ifndef WFS_FSCK_H
#define WFS_FSCK_H

#include <stdbool.h>
#include <stdint.h>

#include "catalog.h"

enum wfs_fsck_kind {
	WFS_FSCK_CORRUPT,
	WFS_FSCK_MISSING,
	WFS_FSCK_ORPHAN,
	WFS_FSCK_STRAY,
	WFS_FSCK_MODE,
	WFS_FSCK_CATALOG,
	WFS_FSCK_TMP,
	WFS_FSCK_QUARANTINED,
	WFS_FSCK_KINDS
};

/* Short lower-case name of @kind ("corrupt", "missing", ...). */
const char *wfs_fsck_kind_name(enum wfs_fsck_kind kind);

struct wfs_fsck_options {
	bool repair;
	uint64_t rate; /* bytes/s read from objects at most; 0 = as fast as the disk goes */
	/* Called for each finding: @what is a digest in hex or a path under STORE; @repaired tells
	 * whether repair fixed it. May be NULL. */
	void (*finding)(void *ctx, enum wfs_fsck_kind kind, const char *what, const char *detail,
			bool repaired);
	/* Called as objects are read: bytes and objects done so far, and the totals. May be NULL. */
	void (*progress)(void *ctx, uint64_t bytes_done, uint64_t bytes_total, uint64_t objects_done,
			 uint64_t objects_total);
	void *ctx;
};

struct wfs_fsck_report {
	bool online;                    /* a daemon held the store: read-only check */
	uint64_t objects_checked;       /* object files read and hashed */
	uint64_t bytes_checked;
	uint64_t found[WFS_FSCK_KINDS]; /* findings per kind */
	uint64_t repaired[WFS_FSCK_KINDS];
	struct wfs_catalog_check catalog;
};

/*
 * Check the store at @path. Returns 0 when the check ran (findings are in @report, which is filled
 * even on error as far as the check got), -EBUSY when repair was asked of a mounted store, or
 * another -errno when the store or catalog cannot be opened or read.
 */
int wfs_fsck(const char *path, const struct wfs_fsck_options *opt, struct wfs_fsck_report *report);

/* Problems found that are still there (quarantined objects are informational). */
uint64_t wfs_fsck_unrepaired(const struct wfs_fsck_report *report);

#endif
