/* SPDX-License-Identifier: Apache-2.0 */
/*
 * commit — the committer thread: when the daemon's catalog changes are committed (lib/catalog.h,
 * wfs_catalog_batch), the group sync of seals, and closing removed objects outside fs->lock.
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
 * Batching changes no durability: commits were never synced except at seals (-o sync) and fsync.
 * What it changes is a daemon killed (SIGKILL, OOM): changes of the last interval that no seal or
 * fsync committed are gone after the remount, as after a power loss on ext4 before its journal commit.
 *
 * The group sync (-o sync=group, the default; enum wfs_sync_mode). A file whose writer called
 * fsync(2) (with -o sync=close, also one of WFS_SYNC_CLOSE_MIN or more) is durable when close(2)
 * returns: its object's fdatasync, link and directory fsync, its commit, the WAL's fdatasync. Any
 * other is sealed and committed at close(2) as well, but its object is published without a sync and
 * becomes durable with the next group sync: one syncfs(2) of the store (or, while only a few large
 * seals wait, each object's own fdatasync: wfs_commit_sync) for every such seal of the last WFS_SYNC_INTERVAL_MS, by the committer thread (or sooner: at any
 * fsync(2), a large seal, unmount). With a flush per small file (and a commit per change) the
 * demo's write phase took 19x a plain directory's on the 2-core test machine; now 6x. Order: every WAL sync and checkpoint of the daemon comes after a syncfs
 * that began once the seals it counts were committed (wfs_commit_sync), so what the daemon syncs
 * refers to synced objects — except seals committed while that syncfs runs, and WAL pages the
 * kernel writes back on its own. What a power loss costs: the files sealed in its last interval
 * (and those its syncfs was still writing back) may be lost (their commits can reach the disk before their objects: their names then
 * fail their first open's check with EIO, and fsck lists them).
 */
#ifndef WFS_CORE_COMMIT_H
#define WFS_CORE_COMMIT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "digest.h"

struct wfs_fs;

#define WFS_COMMIT_INTERVAL_MS 10 /* a batch's age at its commit; the create benchmark's batches
				   * hold about 50 creates on the 2-core test machine */
#define WFS_SYNC_INTERVAL_MS 1000 /* the most a seal's durability waits after its close(2) (ext4
				   * commits its journal every 5 s). At 200 ms, four writers of 512 MiB
				   * each ran at 0.57x native on the H200 machine: each syncfs wrote back
				   * the others' pages while they were still writing; at 1 s, 1.08x */
#define WFS_SYNC_CLOSE_MIN (64ull << 20) /* bytes: from this size close(2) waits for the disk; a
				   * flush (2-3 ms on the test disks) is then under 5% of writing the file */
#define WFS_BACKUP_INTERVAL_S 600 /* the most a catalog backup lags its changes while mounted (a
				   * crash loses the names made since, if the catalog is damaged too) */
#define WFS_SYNC_FILES_MAX 16 /* a group sync for at most this many seals, each of WFS_SYNC_CLOSE_MIN
			       * or more, syncs their objects one by one instead of the whole filesystem */

/* -o sync=...: when a seal's object and commit are durable (struct wfs_fs's opt.sync). */
enum wfs_sync_mode {
	WFS_SYNC_NONE = 0,  /* -o sync=none, nosync: never synced (scratch stores, tests) */
	WFS_SYNC_GROUP = 1, /* -o sync=group (default): by the group sync, within WFS_SYNC_INTERVAL_MS of
			     * close(2); at close(2) when the writer called fsync(2) */
	WFS_SYNC_CLOSE = 2, /* -o sync=close, sync: also at close(2) for WFS_SYNC_CLOSE_MIN or more */
};

/* The committer's state, in struct wfs_fs (all (L)). */
struct wfs_commit {
	pthread_t thread;
	pthread_cond_t due;  /* a batch has its first change, or the committer is to stop */
	bool started, stop;
	bool idle;           /* the committer waits on @due without a timeout: only then is it
			      * woken for new work (commit.c's cue()); always to stop */
	int *closing;             /* descriptors of removed objects, closed outside fs->lock */
	size_t nclosing, closing_cap;
	uint64_t closing_bytes;   /* what their closes will free (their allocations), until closed */
	uint64_t counted, synced; /* seals committed with their objects unsynced since the mount, and
				   * how many of the first ones a group sync covered (syncs may overlap:
				   * each covers those it saw); wfs_commit_waiting() is the difference */
	struct wfs_unsynced_large {
		struct wfs_digest digest;
		uint64_t seq;     /* its seal's number among those counted */
	} large[WFS_SYNC_FILES_MAX]; /* the objects of the unsynced seals while every one of them is
				      * of WFS_SYNC_CLOSE_MIN or more (and there is room), in order */
	size_t nlarge;
	uint64_t checkpoints;     /* of the WAL into catalog.db, since the mount (checkpoint_lent) */
	struct timespec unsynced_since; /* CLOCK_REALTIME of the first of them */
	uint64_t backup_commits;        /* the catalog's commit count at the last backup */
	struct timespec backup_at;      /* CLOCK_MONOTONIC of the last backup (or of the start) */
};

/* (L) Seals whose objects no group sync has covered yet. */
static inline uint64_t wfs_commit_waiting(const struct wfs_commit *c)
{
	return c->counted - c->synced;
}

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
 * (L, an ordinary hold) Commit the open batch now: before a caller is told its change is kept.
 * fs->lock is lent out during the COMMIT (lock.h): ordinary acquisitions wait for it as before,
 * light ones (a read-only open or release of a sealed file through passthrough) go on; the caller
 * finds the rest of fs as it left it. Returns 0 or the commit's -errno (wfs_catalog_commit: -ENOSPC,
 * -EIO, -EBUSY), logged here.
 */
int wfs_commit_now(struct wfs_fs *fs);
/*
 * Copy the committed catalog to STORE/WFS_STORE_CATALOG_BACKUP (wfs_catalog_backup; synced unless
 * -o sync=none), what weightfsctl fsck --repair rebuilds the names from when the catalog is damaged.
 * The committer runs it every WFS_BACKUP_INTERVAL_S while changes come, and the daemon at unmount.
 * Call without fs->lock: it reads through a connection of its own. Returns 0 or -errno (logged).
 */
int wfs_commit_backup(struct wfs_fs *fs);
/*
 * (L) Close @fd (wfs_store_object_unlink_open: a removed object) on the committer thread, without
 * fs->lock: that close frees the file's space, a filesystem's work that grows with the file (its
 * extents; discards where the store is mounted with discard). Closed at once when no committer
 * runs, or when the list cannot grow. Until it is closed, its allocation counts in
 * fs->commit.closing_bytes: space the store has, as far as a decision to keep or remove another
 * object goes (object.c: a burst of rm's on a full store would otherwise all read it full).
 */
void wfs_commit_close_later(struct wfs_fs *fs, int fd);
/*
 * (L) Must a seal of @size bytes be durable before close(2) returns? When a writer asked (@asked:
 * fsync(2)), when no committer runs to sync it later, and with -o sync=close when @size is
 * WFS_SYNC_CLOSE_MIN or more. Never with -o sync=none.
 */
bool wfs_commit_sync_at_close(struct wfs_fs *fs, uint64_t size, bool asked);
/*
 * (L) A seal was committed with its object @d (@size bytes) published but not synced (-o
 * sync=group, no fsync): count it for the next group sync.
 */
void wfs_commit_unsynced(struct wfs_fs *fs, const struct wfs_digest *d, uint64_t size);
/*
 * Make every commit so far durable, in order: the group sync first when seals are waiting for it
 * (their objects), then the WAL (wfs_catalog_wal_sync). The objects: when every seal waiting is of
 * WFS_SYNC_CLOSE_MIN or more and there are at most WFS_SYNC_FILES_MAX of them, each by itself
 * (wfs_store_object_sync), so that files still being written and other programs' files on the same
 * filesystem are not written back with them; else one syncfs(2) of the store (wfs_store_sync), which
 * covers the WAL too. Call without fs->lock, after wfs_commit_now() under it; any thread. Returns 0
 * or -EIO (another -errno of syncfs/fdatasync); the seals stay counted on failure, for the next try.
 */
int wfs_commit_sync(struct wfs_fs *fs);

#endif
