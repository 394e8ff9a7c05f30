/*
 * commit — when the daemon's catalog changes are committed (lib/catalog.h, wfs_catalog_batch).
 *
 * Creates, unlinks, renames, xattrs and claims are savepoints of one open SQLite transaction, and
 * the batch is committed:
 *   - WFS_COMMIT_INTERVAL_MS after its first change, by the committer thread (so a daemon killed
 *     loses at most that much of the namespace's latest changes, in order: a prefix survives);
 *   - at once where a caller is told its bytes are kept: a seal that close(2) or truncate(2) waits
 *     for (wfs_seal), fsync(2) and fsyncdir(2), unmount;
 *   - before an object's file is removed (wfs_catalog_object_delete).
 * A thousand creates then share one commit's file locks and WAL frames; before, each create paid for
 * two commits (its own and its empty seal's), about half of the daemon's time per create.
 *
 * Durability is unchanged: commits were never synced except at seals (-o sync) and fsync, and those
 * still are. What changes is a daemon killed (SIGKILL, OOM): changes of the last interval that no
 * seal or fsync committed are gone after the remount, as after a power loss on ext4 before its
 * journal commit.
 */
#ifndef WFS_CORE_COMMIT_H
#define WFS_CORE_COMMIT_H

#include <pthread.h>
#include <stdbool.h>

struct wfs_fs;

#define WFS_COMMIT_INTERVAL_MS 10 /* a batch's age at its commit; the create benchmark's batches
				   * hold about 50 creates on the 2-core test machine */

/* The committer's state, in struct wfs_fs (all (L)). */
struct wfs_commit {
	pthread_t thread;
	pthread_cond_t due;  /* a batch has its first change, or the committer is to stop */
	bool started, stop;
};

/*
 * Turn batching on for @fs->catalog and start the committer thread. Call with @fs initialised, its
 * catalog open, before the session loop; fs->lock not held. Returns 0 or -errno (the thread or the
 * condition variable; the catalog's -EROFS): then every change commits at once, as without batching.
 */
int wfs_commit_start(struct wfs_fs *fs);
/*
 * Stop the committer, commit what is pending and turn batching off. Idempotent; call after the
 * session loop ended, fs->lock not held, before the catalog is closed.
 */
void wfs_commit_stop(struct wfs_fs *fs);
/*
 * (L) Commit the open batch now: before a caller is told its change is kept. Returns 0 or the
 * commit's -errno (wfs_catalog_commit: -ENOSPC, -EIO, -EBUSY), logged here.
 */
int wfs_commit_now(struct wfs_fs *fs);

#endif
