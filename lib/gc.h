/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gc — remove objects no name refers to.
 *
 * An object becomes unreferenced when its last name is unlinked, renamed over or rewritten. It can
 * be kept for a while (a retention budget, in bytes) so that a later run writing the same weights
 * needs no new bytes on disk; beyond the budget, the least recently released objects go first.
 * The daemon applies the same policy online, with the store's budget (wfs_catalog_retain_get(): set
 * by -o retain=SIZE, weightfsctl init --retain and weightfsctl retain), and skips objects still open.
 */
#ifndef WFS_GC_H
#define WFS_GC_H

#include <stdbool.h>
#include <stdint.h>

#include "catalog.h"
#include "store.h"

struct wfs_gc_report {
	uint64_t objects_removed, bytes_removed; /* (with dry_run: would be removed) */
	uint64_t objects_kept, bytes_kept;       /* unreferenced objects left within the budget or in use */
	uint64_t orphans_removed, orphan_bytes_removed; /* object files the catalog did not list
							  * (wfs_gc_orphans; with dry_run: would go) */
};

/*
 * Remove unreferenced objects, least recently released first, until those left take at most
 * @retain bytes. Objects for which @in_use returns true (may be NULL) are kept and do not count
 * against the budget (@retain 0 removes them all, empty ones included). With @dry_run nothing is
 * removed. Catalog row first, then the file: a crash in between leaves an orphan file (its bytes
 * match its name) that wfs_gc_orphans() removes. Returns 0 or -errno.
 */
int wfs_gc_collect(struct wfs_store *s, struct wfs_catalog *c, uint64_t retain, bool dry_run,
		   bool (*in_use)(void *ctx, const struct wfs_digest *d), void *ctx, struct wfs_gc_report *r);

/*
 * Retained objects give way to writes: remove unreferenced objects for which @in_use (may be NULL)
 * returns false, least recently released first, until @bytes of them are removed (UINT64_MAX: all)
 * or none is left; whatever budget the store keeps. Removes as wfs_gc_collect() does; @r says what
 * went and what is left. Returns 0 or -errno.
 */
int wfs_gc_evict(struct wfs_store *s, struct wfs_catalog *c, uint64_t bytes,
		 bool (*in_use)(void *ctx, const struct wfs_digest *d), void *ctx, struct wfs_gc_report *r);

/*
 * Remove the object files under STORE/objects that the catalog does not list: orphans, left by a
 * crash between an object's link() and the catalog commit that would have named it, or between
 * wfs_gc_collect()'s row delete and its unlink (docs/integrity.md). Their count and bytes
 * (st_size) go into @r's orphans_* fields (the others are not touched). Only while no seal can be
 * in flight: offline, or at a daemon's start before it serves requests (it runs this when the last
 * owner did not close the store). With @dry_run nothing is removed. Strays (not named by a digest)
 * are left to fsck. Returns 0, or -errno of reading objects/ or the catalog, or of an unlink.
 */
int wfs_gc_orphans(struct wfs_store *s, struct wfs_catalog *c, bool dry_run, struct wfs_gc_report *r);

/* Offline gc of the store at @path: -EBUSY while a daemon has it mounted (a @dry_run only reads and
 * runs anyway); otherwise wfs_gc_collect(), then wfs_gc_orphans(). */
int wfs_gc(const char *path, uint64_t retain, bool dry_run, struct wfs_gc_report *r);
/* Offline, the store at @path: remove STORE/quarantine/ (wfs_store_quarantine_clear(): its file
 * count and bytes into *@files, *@bytes). -EBUSY while a daemon has it mounted (a @dry_run runs). */
int wfs_gc_quarantine(const char *path, bool dry_run, uint64_t *files, uint64_t *bytes);

/* Parse a size like "0", "4096", "512M", "20G", "1.5T" into bytes: decimal digits (a fraction
 * allowed), then K (or k), M, G, T or P, binary units, optionally followed by "iB" or "B". Returns 0,
 * or -EINVAL (anything else: hex, exponents, signs, spaces, lower-case m/g/t/p). */
int wfs_parse_size(const char *text, uint64_t *bytes);

#endif
