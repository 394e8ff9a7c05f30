/* SPDX-License-Identifier: Apache-2.0 */
/*
 * object — the objects open handles and seals are using: one entry per digest in use, shared by every
 * open of every name with that content.
 *
 * An entry lives while it is pinned (open handles reading it, a seal publishing it, a check or a
 * claim looking at it). A pinned object is never deleted from the store, so a caller may open its
 * file without fs->lock. An entry holds, while needed:
 *   - an O_RDONLY descriptor, for daemon-served reads (opened on first use, kept until the last unpin);
 *   - a passthrough backing id, registered with the kernel (kernel.h) on the first passthrough open
 *     and released at the last unpin; the descriptor is closed right after registering, since the
 *     kernel holds the file from then on.
 * When the last pin drops and no name refers to the digest any more, the object is deleted from the
 * store and catalog, or kept for reuse up to -o retain (wfs_object_maybe_delete()).
 *
 * All functions run with fs->lock held; none drops it. wfs_object_pin(), _repin(), _unpin(),
 * _digest(), _fd() and _backing() touch no catalog, so a light hold of a lent fs->lock may call them
 * (lock.h).
 */
#ifndef WFS_CORE_OBJECT_H
#define WFS_CORE_OBJECT_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "digest.h"

struct wfs_fs;
struct wfs_object; /* private to object.c */

/* Pin object @d, creating its entry. Returns the entry, or NULL (ENOMEM). */
struct wfs_object *wfs_object_pin(struct wfs_fs *fs, const struct wfs_digest *d);
/* One more pin on @o, which the caller has pinned already (a second handle sharing a backing file). */
void wfs_object_repin(struct wfs_object *o);
/*
 * Drop a pin. On the last one the descriptor is closed, the backing id released, the entry freed, and
 * the object deleted when nothing refers to it (wfs_object_maybe_delete()). Under a light hold of a
 * lent fs->lock (lock.h) that last step waits, the entry kept unpinned (and still in use for
 * wfs_object_in_use()), until the lender calls wfs_object_unpin_deferred().
 */
void wfs_object_unpin(struct wfs_fs *fs, struct wfs_object *o);
/*
 * (ordinary hold) Drop a pin of @o, which a name refers to in the catalog as this daemon sees it (a
 * seal has just set it as a name's content): as wfs_object_unpin() without asking the catalog
 * whether to delete it. That question (a SELECT of the object's row) was one statement in 22 of a
 * small tensor's write.
 */
void wfs_object_unpin_named(struct wfs_fs *fs, struct wfs_object *o);
/* (ordinary hold) Finish the last unpins deferred while fs->lock was lent. */
void wfs_object_unpin_deferred(struct wfs_fs *fs);
/*
 * Is a seal of @o's content between its "stored already?" and its link (seal.c)? Seals of one
 * content take that step one at a time, so that none dedups onto a copy another is publishing
 * unread (a declared digest, seal.h). Set by that seal, which holds a pin meanwhile.
 */
bool wfs_object_publishing(const struct wfs_object *o);
void wfs_object_set_publishing(struct wfs_object *o, bool publishing);
/*
 * Expected objects. When a claim of content @o misses (it is not stored), the claiming file's writer
 * is about to write it (weightfs.offload writes on a miss): ranks that offload the same tensor at
 * once should wait for that one seal instead of each writing the bytes (claim.c).
 *
 * wfs_object_expect(): @o (whose pin the caller hands over to the expectation) is expected from the
 * writer of inode @ino for at most @ms milliseconds. wfs_object_expected_elsewhere(): is it
 * expected from another inode than @ino, not past its time (then *@until is that time)?
 * wfs_object_expect_end(): the expecting inode sealed content, lost its writer or went away: the
 * expectation and its pin end, *@o becomes NULL, and waiting claims look again (fs->seal_done).
 * A NULL *@o is nothing to end.
 */
void wfs_object_expect(struct wfs_object *o, uint64_t ino, long ms);
bool wfs_object_expected_elsewhere(const struct wfs_object *o, uint64_t ino, struct timespec *until);
void wfs_object_expect_end(struct wfs_fs *fs, struct wfs_object **o);
/* The digest @o is the object of. */
const struct wfs_digest *wfs_object_digest(const struct wfs_object *o);
/*
 * A read descriptor of @o (O_RDONLY, owned by the entry: valid while the caller holds its pin, even
 * without fs->lock). Returns it (>= 0), -EIO when the object file is missing (logged: a name whose
 * object is gone is an I/O error), or another -errno.
 */
int wfs_object_fd(struct wfs_fs *fs, struct wfs_object *o);
/*
 * @o's passthrough backing id, registered now if it has none. Returns the id (> 0), an -errno of
 * wfs_object_fd(), or -EOPNOTSUPP when the kernel refuses (logged once; fs->passthrough is cleared
 * and the daemon serves reads from then on).
 */
int wfs_object_backing(struct wfs_fs *fs, struct wfs_object *o);
/* Is object @d pinned by anyone (so it must not be deleted)? */
bool wfs_object_in_use(struct wfs_fs *fs, const struct wfs_digest *d);
/*
 * Delete object @d from catalog and store when no name refers to it and nothing pins it, or keep it
 * as retained (-o retain), collecting the least recently released beyond the budget; on a store
 * with under WFS_RETAIN_FREE_MIN bytes free it is not kept (retained objects give way to writes:
 * wfs_object_make_room()). Errors are logged: an object file left behind is an orphan, which an
 * offline gc or fsck --repair removes (and the daemon's next start, after a crash).
 */
void wfs_object_maybe_delete(struct wfs_fs *fs, const struct wfs_digest *d);
/*
 * Retained objects are a cache: they give way to writes. Remove retained objects that nothing pins,
 * least recently released first, until the store's filesystem has @bytes plus WFS_RETAIN_FREE_MIN
 * free (counted by their bytes: the space of one still open elsewhere comes back at its close), or
 * none is left. @bytes UINT64_MAX removes every one: after a write the kernel failed with ENOSPC,
 * whose retry needs room the daemon cannot know. (ordinary hold of fs->lock) A no-op without a retention budget, when nothing is
 * retained, and on a store with that much free: one fstatvfs(2). Logged at warning level with the
 * bytes free, the bytes wanted free and the counts (WFS_LOG_LIMITED, log.h: every write on a nearly
 * full store can remove some). Returns the bytes removed.
 */
#define WFS_RETAIN_FREE_MIN ((uint64_t)64 << 20)
uint64_t wfs_object_make_room(struct wfs_fs *fs, uint64_t bytes);
struct wfs_gc_report;
/*
 * weightfsctl gc on a mounted store (user.weightfs.gc): remove objects no name uses and nothing pins,
 * least recently released first, until those left take at most @retain bytes (0: all of them), as
 * wfs_gc_collect() does offline; orphan files are left to an offline gc. Logged. Returns 0 (@r
 * filled) or -errno of the catalog or of an unlink.
 */
int wfs_object_collect(struct wfs_fs *fs, uint64_t retain, struct wfs_gc_report *r);
/*
 * Log, at info level, what a collection by the retention budget (fs->opt.retain, the store's:
 * catalog.h) removed, from @gc (wfs_gc_collect()'s report, objects_removed > 0): the objects and
 * bytes removed, least recently released first, and those kept. Only gc and this collection delete
 * objects the store keeps, so each time is on the record: a line, or a count of lines left out
 * (WFS_LOG_LIMITED, log.h; a rewrite workload past its budget collects at every release, 364
 * warning lines in 30 s in a trial). Needs no lock.
 */
void wfs_object_log_collected(const struct wfs_fs *fs, const struct wfs_gc_report *gc);
/* At exit: free every entry, closing descriptors (backing ids go with the session). */
void wfs_objects_release(struct wfs_fs *fs);

#endif
