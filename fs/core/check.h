/* SPDX-License-Identifier: Apache-2.0 */
/*
 * check — a name never returns bytes that differ from its digest.
 *
 * The first open of an object after the daemon starts reads it and checks its XXH3-128 digest before
 * the open succeeds (that read also warms the page cache the opener is about to map, on the opener's
 * NUMA node). Later opens trust the check while the object file is the same file: inode, size, mtime
 * and ctime, which any write or `touch -r` moves and no user can set back. A mismatch moves the
 * object to STORE/quarantine, logs one line, and fails every open of every name with that content
 * with EIO, until the same content is written again: the seal publishes a good copy, marks it
 * checked here (wfs_check_mark_good()) and its catalog row OK.
 *
 * Objects published under a digest their writer declared (seal.h) are the other unread kind: the
 * checker thread reads them soon after their seal (wfs_check_soon()).
 *
 * One entry per digest checked this run, private to check.c. Two openers of one unchecked object:
 * the second waits for the first's check (fs->check_done) instead of reading it again.
 * All functions run with fs->lock held; those that read bytes drop it meanwhile (said below).
 */
#ifndef WFS_CORE_CHECK_H
#define WFS_CORE_CHECK_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "digest.h"

struct wfs_fs;
struct wfs_object;

/* The checker thread's state, in struct wfs_fs (all (L)): objects to check soon, oldest first. */
struct wfs_checker {
	pthread_t thread;
	pthread_cond_t due;         /* an object was queued, or the checker is to stop */
	bool started, stop;
	struct wfs_digest *queue;
	size_t n, cap;
};

/*
 * Make sure object @o (pinned by the caller) holds the bytes its digest names, reading it once per
 * daemon run (and again if the object file changes); with -o verify=none, 0 at once, unless the
 * object was published on a declared digest and not read since (then it is read: wfs_check_soon()),
 * the catalog does not list it (a seal killed between its link and its commit: read too), or a
 * check this run found it damaged (-EIO). A read is
 * placed on thread @tid's NUMA node (its memory policy preferred there while reading), so the page
 * cache it fills lands where the opener will map it; @tid 0: anywhere. May drop fs->lock while
 * reading. On a mismatch the object is quarantined, one line is logged, and this and every later call
 * return -EIO until the same content is written again. Returns 0, -EIO, or another -errno.
 */
int wfs_check_object(struct wfs_fs *fs, struct wfs_object *o, pid_t tid);
/*
 * Is object @d known good without a read or the catalog: checked (or published from bytes this
 * daemon hashed) this run, not being checked, not published on a declared digest unread, and its
 * file still the one checked (a stat)? For a light hold of a lent fs->lock (lock.h), where
 * wfs_check_object() may not run; false sends the caller to it. fs->lock held.
 */
bool wfs_check_known_good(struct wfs_fs *fs, const struct wfs_digest *d);
/*
 * Has a check this run found object @d damaged (quarantined, missing, or the same damaged file),
 * with no good copy published since? No read: what the daemon knows. fs->lock held.
 */
bool wfs_check_damaged(struct wfs_fs *fs, const struct wfs_digest *d);
/*
 * Is pinned object @o (whose file @st describes) plausibly intact, without reading it? Yes when its
 * size is the cataloged one and no check this run found it damaged; otherwise it is checked now, as
 * by wfs_check_object() (may drop fs->lock). For digest claims: the first open of the claimed name
 * reads and checks the object anyway (-o verify=open), so a claim costs a stat, not a read.
 * Returns 0, -EIO (damaged), or another -errno.
 */
int wfs_check_plausible(struct wfs_fs *fs, struct wfs_object *o, const struct stat *st);
/* Record object @d, just published by this daemon from bytes it hashed itself, as checked (with any
 * -o verify: the record also tells wfs_check_object() that the object is known). @st: the object
 * file's stat, which the caller took after the link (wfs_store_object_stat(), without fs->lock: a
 * path lookup in objects/). */
void wfs_check_mark_good(struct wfs_fs *fs, const struct wfs_digest *d, const struct stat *st);
/*
 * Referenced, not quarantined objects whose bytes this daemon run has checked (*@verified: by a first
 * open, a dedup hit, a claim, or because it published them) and has not (*@unverified). One pass
 * over the catalog's objects. Returns 0 or -errno of the catalog.
 */
int wfs_check_count(struct wfs_fs *fs, uint64_t *verified, uint64_t *unverified);
/*
 * Check object @d's bytes now, whatever an earlier check found (an online fsck saw it damaged),
 * with -o verify=none too: quarantined and logged on a mismatch, as at a first open. May drop
 * fs->lock. Returns 0 (intact), -EIO (damaged, or gone since it was stored: its names fail with EIO
 * until rewritten), -ENODATA (no such object), or another -errno.
 */
int wfs_check_recheck(struct wfs_fs *fs, const struct wfs_digest *d);
/*
 * Object @d was published on its writer's word (a declared digest, seal.h; catalog state
 * WFS_OBJECT_DECLARED until a check reads it, then OK): queue it for the checker thread, which reads and checks it as a first open would (quarantined and logged on a mismatch), so
 * that the first open usually finds it checked; an open that comes first checks it itself, or waits
 * for the checker's read (fs->check_done). Without a checker (not started, or the queue cannot grow)
 * the first open checks it. fs->lock held.
 */
void wfs_check_soon(struct wfs_fs *fs, const struct wfs_digest *d);
/*
 * Start the checker thread (niced: it reads what the writers just wrote, from the page cache, while
 * they go on) and queue the objects an earlier run published on a declared digest and did not check
 * (catalog state WFS_OBJECT_DECLARED). Call before the session loop, fs->lock not held. Returns 0
 * or -errno (then objects queued by wfs_check_soon() are checked by their first open).
 */
int wfs_check_start(struct wfs_fs *fs);
/* Stop the checker after the check it is doing; objects still queued are checked by their first open
 * after the next mount. Idempotent; fs->lock not held. */
void wfs_check_stop(struct wfs_fs *fs);
/* At exit: free every entry. */
void wfs_checks_release(struct wfs_fs *fs);

#endif
