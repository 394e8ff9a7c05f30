/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fsck — check a store: every object's bytes against its digest, the catalog against the objects
 * directory, the catalog's own invariants; with repair, fix what is safe to fix.
 *
 * What is checked, and what repair does:
 *   corrupt      an object whose bytes do not hash to its name → moved to STORE/quarantine, catalog
 *                state quarantined (its names fail with EIO until the content is written again:
 *                repaired only when no name uses it, else left, as the next check finds it missing)
 *   missing      a catalog object with no file → names that use it fail with EIO; repair forgets
 *                the row when no name uses it
 *   orphan       an object file the catalog does not list → removed
 *   stray        a file under objects/ whose name is not a digest → moved to STORE/quarantine
 *   mode         an object file that is writable → made 0444
 *   catalog      refcounts, object rows, dentries, link counts (catalog.h) → recomputed
 *   tmp          leftovers in STORE/tmp (offline only) → removed
 *   quarantined  objects waiting in STORE/quarantine (reported, never removed)
 *   unclean      the store's last owner never closed it (killed, crashed, a power loss; offline
 *                only) → the mount's crash recovery runs now (wfs_catalog_recover)
 *   tmpname      a temporary name of the tensor-file protocol (WFS_TMP_PREFIX, lib/tensorfile.h)
 *                left in the namespace by a writer that never renamed it into place (offline only)
 *                → removed
 *   unsealed     a regular file never sealed: its seal failed after close(2) returned (a file
 *                written through passthrough is sealed at its release), so it reads EIO; or a
 *                writer's when its daemon stopped; online also every file being written. Reported,
 *                not counted as a problem (wfs_fsck_unrepaired()), as the next mount's recovery
 *                removes it → removed
 *
 * Every finding about an object whose names fail (corrupt, missing, quarantined) comes with the
 * paths of the names that use it, so an operator knows what to write again.
 *
 * A damaged catalog (catalog.db missing beside objects, failing to open, or failing SQLite's check)
 * is one catalog finding that says so and what to do; the names are then unknown, so the objects
 * are only checked against their digests (none is an orphan) and nothing is repaired. With repair
 * and a backup (STORE/catalog.db.backup, wfs_catalog_backup) the catalog is rebuilt from it
 * instead (wfs_catalog_restore; the damaged files kept as catalog.db.damaged-<seconds>), one
 * catalog finding, repaired, and the check goes on against it; an object file it does not list
 * (written after the backup) is adopted as an unreferenced object (wfs_catalog_object_adopt), not
 * removed.
 *
 * A store without its objects/ directory (the catalog, or its backup, still there) is checked, not
 * repaired: one missing finding for objects/ and one per object the catalog lists, with its names.
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
	WFS_FSCK_UNCLEAN,
	WFS_FSCK_TMPNAME,
	WFS_FSCK_UNSEALED,
	WFS_FSCK_KINDS
};

/* Short lower-case name of @kind ("corrupt", "missing", ...). */
const char *wfs_fsck_kind_name(enum wfs_fsck_kind kind);

struct wfs_fsck_options {
	bool repair;
	uint64_t rate; /* bytes/s read from objects at most; 0 = as fast as the disk goes */
	/* Called for each finding: @what is a digest in hex, a path under STORE, or (tmpname) the
	 * name's path from the namespace's root; @names are the paths ("/dir/name", below the mount
	 * point) of the names that use the object, @nnames of them (at most WFS_FSCK_NAMES_MAX; the
	 * detail gives the count), valid during the call; @repaired tells whether repair fixed it.
	 * May be NULL. */
	void (*finding)(void *ctx, enum wfs_fsck_kind kind, const char *what, const char *detail,
			const char *const *names, size_t nnames, bool repaired);
	/* Called as objects are read: bytes and objects done so far, and the totals. May be NULL. */
	void (*progress)(void *ctx, uint64_t bytes_done, uint64_t bytes_total, uint64_t objects_done,
			 uint64_t objects_total);
	void *ctx;
};

#define WFS_FSCK_NAMES_MAX 1000 /* names told per finding */

struct wfs_fsck_report {
	bool online;                    /* a daemon held the store: read-only check */
	bool unclean;                   /* offline: the last owner did not close the store */
	int unclean_pid;                /* ... its pid, and what it recorded ("mounted on MNT") */
	char unclean_what[256];
	bool catalog_damaged;           /* the names could not be read or trusted */
	bool objects_lost;              /* STORE/objects/ is missing: every object with it (one missing
					   finding, "objects/", then one per object); nothing repaired */
	uint64_t objects_checked;       /* object files read and hashed */
	uint64_t bytes_checked;
	uint64_t found[WFS_FSCK_KINDS]; /* findings per kind */
	uint64_t repaired[WFS_FSCK_KINDS]; /* of those, fixed: the next check finds them no more */
	uint64_t quarantined_now;       /* corrupt objects repair moved to STORE/quarantine (repaired
					   or not: their names may still fail) */
	struct wfs_catalog_check catalog;
};

/*
 * Check the store at @path. Returns 0 when the check ran (findings are in @report, which is filled
 * even on error as far as the check got; a damaged catalog is a finding), -EBUSY when repair was
 * asked of a mounted store, -ENOENT/-ENOTDIR (no store there), -ENOMEM, -EACCES, or another -errno
 * of reading the store.
 */
int wfs_fsck(const char *path, const struct wfs_fsck_options *opt, struct wfs_fsck_report *report);

/*
 * Problems found that are still there, as a check right after would count them (quarantined objects
 * and unsealed files are informational).
 */
uint64_t wfs_fsck_unrepaired(const struct wfs_fsck_report *report);

#endif
