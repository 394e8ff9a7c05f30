/* SPDX-License-Identifier: Apache-2.0 */
/* commit.h: the committer thread. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sys/stat.h>

#include "commit.h"
#include "daemon.h"
#include "fault.h"
#include "log.h"
#include "weightfs.h"

/*
 * (L) Wake the committer for new work, if it sleeps without a timeout (struct wfs_commit's @idle).
 * In its timed waits (a batch's interval, a retry) it looks at everything when it wakes by itself:
 * a wake there per seal cost the sealer a futex wake and the committer a contended fs->lock, 21 us
 * a seal on the 2-core VM (with fs->lock held), for nothing.
 */
static void cue(struct wfs_commit *c)
{
	if (c->idle)
		pthread_cond_signal(&c->due);
}

/* The catalog's cue (called under fs->lock): a batch has its first change, or a checkpoint is due. */
static void first_pending(void *ctx)
{
	struct wfs_fs *fs = ctx;

	cue(&fs->commit);
}

int wfs_commit_now(struct wfs_fs *fs)
{
	int ret;

	if (!wfs_catalog_pending(fs->catalog))
		return wfs_catalog_commit(fs->catalog); /* nothing to write: no disk to wait for */
	/* The COMMIT writes the WAL, which can wait for the disk behind writers' dirty pages (239 ms
	 * seen): fs->lock is lent meanwhile, so that read-only opens and releases of sealed files,
	 * which need no catalog, go on (lock.h). Everything else waits, as if the lock were held. */
	wfs_fs_lend(fs);
	wfs_delay("commit.lent"); /* test-only: a commit that waits for a slow disk */
	ret = wfs_catalog_commit(fs->catalog);
	wfs_fs_reclaim(fs);
	if (ret)
		wfs_log(WFS_LOG_ERR, "catalog commit: %s", strerror(-ret));
	return ret;
}

void wfs_commit_close_later(struct wfs_fs *fs, int fd)
{
	struct stat st;

	if (fs->commit.started && fs->commit.nclosing == fs->commit.closing_cap) {
		size_t cap = fs->commit.closing_cap ? 2 * fs->commit.closing_cap : 16;
		int *more = realloc(fs->commit.closing, cap * sizeof(*more));

		if (more) {
			fs->commit.closing = more;
			fs->commit.closing_cap = cap;
		}
	}
	if (!fs->commit.started || fs->commit.nclosing == fs->commit.closing_cap) {
		close(fd);
		return;
	}
	fs->commit.closing[fs->commit.nclosing++] = fd;
	if (fstat(fd, &st) == 0)
		fs->commit.closing_bytes += (uint64_t)st.st_blocks * 512;
	cue(&fs->commit);
}

/*
 * (L) Close the removed objects' descriptors, all those queued so far at once, with fs->lock dropped
 * meanwhile. One at a time, taking the lock back after each, the committer never got past this
 * while a burst of unlinks queued them faster (and so never checkpointed: the WAL grew to 196 MB
 * over 6,000 unlinks on the 2-core machine).
 */
static void close_removed(struct wfs_fs *fs)
{
	int *fds = fs->commit.closing;
	size_t n = fs->commit.nclosing;

	if (!n)
		return;
	uint64_t bytes = fs->commit.closing_bytes;

	fs->commit.closing = NULL;
	fs->commit.nclosing = fs->commit.closing_cap = 0;
	wfs_unlock(&fs->lock);
	for (size_t i = 0; i < n; i++)
		close(fds[i]);
	free(fds);
	wfs_lock(&fs->lock);
	fs->commit.closing_bytes -= bytes; /* freed (closes queued meanwhile added theirs) */
}

bool wfs_commit_sync_at_close(struct wfs_fs *fs, uint64_t size, bool asked)
{
	return fs->opt.sync != WFS_SYNC_NONE &&
	       (asked || !fs->commit.started || (fs->opt.sync == WFS_SYNC_CLOSE && size >= WFS_SYNC_CLOSE_MIN));
}

void wfs_commit_unsynced(struct wfs_fs *fs, const struct wfs_digest *d, uint64_t size)
{
	struct wfs_commit *c = &fs->commit;

	if (wfs_commit_waiting(c) == 0)
		clock_gettime(CLOCK_REALTIME, &c->unsynced_since);
	/* Kept only while every seal waiting is large (the one case synced file by file). */
	if (size >= WFS_SYNC_CLOSE_MIN && c->nlarge == wfs_commit_waiting(c) && c->nlarge < WFS_SYNC_FILES_MAX)
		c->large[c->nlarge++] = (struct wfs_unsynced_large){*d, c->counted + 1};
	c->counted++;
	cue(c);
}

int wfs_commit_sync(struct wfs_fs *fs)
{
	struct wfs_digest each[WFS_SYNC_FILES_MAX];
	struct wfs_commit *c = &fs->commit;
	uint64_t n, upto;
	size_t k = 0, kept = 0;
	int ret = 0;

	wfs_lock(&fs->lock);
	n = wfs_commit_waiting(c);
	upto = c->counted; /* what a sync that begins now covers */
	if (n > 0 && n == c->nlarge) {
		k = c->nlarge;
		for (size_t i = 0; i < k; i++)
			each[i] = c->large[i].digest;
	}
	wfs_unlock(&fs->lock);
	if (n == 0)
		return wfs_catalog_wal_sync(fs->catalog);
	if (k) {
		for (size_t i = 0; i < k && ret == 0; i++)
			if ((ret = wfs_store_object_sync(fs->store, &each[i])) == -ENOENT)
				ret = 0; /* collected meanwhile: nothing left to make durable */
		if (ret == 0)
			ret = wfs_catalog_wal_sync(fs->catalog);
	} else {
		ret = wfs_store_sync(fs->store); /* the objects, and the WAL written before it with them */
	}
	if (ret) {
		wfs_log(WFS_LOG_ERR, "group sync of %llu seals: %s", (unsigned long long)n, strerror(-ret));
		return ret;
	}
	wfs_lock(&fs->lock);
	if (c->synced < upto)
		c->synced = upto;
	/* Those covered go; any counted since stay, in order. */
	for (size_t i = 0; i < c->nlarge; i++)
		if (c->large[i].seq > c->synced)
			c->large[kept++] = c->large[i];
	c->nlarge = kept;
	if (c->nlarge != wfs_commit_waiting(c))
		c->nlarge = 0; /* not all large: syncfs until none waits */
	fs->counters->group_syncs++;
	fs->counters->group_syncs_by_file += k > 0;
	wfs_unlock(&fs->lock);
	return 0;
}

/* (L) Is the group sync due: seals waiting for it longer than WFS_SYNC_INTERVAL_MS? */
static bool sync_due(struct wfs_fs *fs)
{
	struct timespec now;
	long ms;

	if (!wfs_commit_waiting(&fs->commit))
		return false;
	clock_gettime(CLOCK_REALTIME, &now);
	ms = (now.tv_sec - fs->commit.unsynced_since.tv_sec) * 1000 +
	     (now.tv_nsec - fs->commit.unsynced_since.tv_nsec) / 1000000;
	return ms >= WFS_SYNC_INTERVAL_MS;
}

/*
 * (L) The WAL into catalog.db (catalog.h). A DUE one runs without fs->lock, beside the handlers: it
 * copies what was committed, but changes go on meanwhile, so the WAL starts over only if none came
 * (an idle moment). One that must (NOW: the WAL at 16 MiB, or a filesystem near full) then commits
 * the batch and copies what came meanwhile with fs->lock lent from there to its end (lock.h):
 * catalog changes wait, so no transaction begins before every frame is copied and the next one
 * starts the WAL over; opens and releases of sealed files go on. The first pass keeps the lent one
 * short: a few frames, and fsyncs with little left to write. After a failed or partial one, the
 * next try waits an interval.
 */
static void checkpoint(struct wfs_fs *fs, bool must)
{
	struct timespec deadline;
	int ret;

	/* The bulk of the copy (and its fsyncs' writeback) beside the handlers in any case. */
	wfs_unlock(&fs->lock);
	wfs_delay("commit.checkpoint"); /* test-only: a committer that falls behind (a loaded machine) */
	ret = wfs_catalog_checkpoint(fs->catalog);
	wfs_lock(&fs->lock);
	if (ret == 0 && must && (ret = wfs_commit_now(fs)) == 0) {
		wfs_fs_lend(fs);
		ret = wfs_catalog_checkpoint(fs->catalog);
		wfs_fs_reclaim(fs);
	}
	if (ret)
		wfs_log(WFS_LOG_WARN, "catalog checkpoint: %s", strerror(-ret));
	fs->commit.checkpoints++;
	if (ret == 0 && (!must || wfs_catalog_checkpoint_due(fs->catalog) == WFS_CHECKPOINT_NONE))
		return; /* every frame copied: the next transaction starts the WAL over */
	deadline = wfs_deadline_in(WFS_COMMIT_INTERVAL_MS);
	while (!fs->commit.stop && wfs_lock_timedwait(&fs->commit.due, &fs->lock, &deadline) != ETIMEDOUT)
		;
}

int wfs_commit_backup(struct wfs_fs *fs)
{
	char path[PATH_MAX];
	int ret;

	if (snprintf(path, sizeof(path), "%s/" WFS_STORE_CATALOG_BACKUP, fs->opt.store) >= (int)sizeof(path))
		return -ENAMETOOLONG;
	ret = wfs_catalog_backup(fs->catalog, path, fs->opt.sync != WFS_SYNC_NONE);
	if (ret)
		wfs_log(WFS_LOG_WARN, "catalog backup %s: %s (the last good one stays)", path, strerror(-ret));
	return ret;
}

/* (L) The periodic backup (wfs_commit_backup), when WFS_BACKUP_INTERVAL_S passed with changes. */
static void backup_if_due(struct wfs_fs *fs)
{
	struct wfs_catalog_timing t;
	struct timespec now;

	wfs_catalog_timing(fs->catalog, &t);
	clock_gettime(CLOCK_MONOTONIC, &now);
	if (t.commits == fs->commit.backup_commits || now.tv_sec - fs->commit.backup_at.tv_sec < WFS_BACKUP_INTERVAL_S)
		return;
	fs->commit.backup_commits = t.commits;
	fs->commit.backup_at = now;
	wfs_unlock(&fs->lock);
	wfs_commit_backup(fs);
	wfs_lock(&fs->lock);
}

static void *committer(void *arg)
{
	struct wfs_fs *fs = arg;

	wfs_lock(&fs->lock);
	while (!fs->commit.stop) {
		struct timespec deadline;
		int ret;

		close_removed(fs);
		if (!wfs_catalog_pending(fs->catalog) && !wfs_commit_waiting(&fs->commit) &&
		    wfs_catalog_checkpoint_due(fs->catalog) != WFS_CHECKPOINT_NOW) {
			if (!fs->commit.nclosing && !fs->commit.stop) {
				fs->commit.idle = true;
				wfs_lock_wait(&fs->commit.due, &fs->lock);
				fs->commit.idle = false;
			}
			continue;
		}
		/* Let the batch grow for an interval; fs->lock is free meanwhile. */
		deadline = wfs_deadline_in(WFS_COMMIT_INTERVAL_MS);
		while (!fs->commit.stop &&
		       wfs_lock_timedwait(&fs->commit.due, &fs->lock, &deadline) != ETIMEDOUT)
			;
		/* test-only: a batch older than the interval, fs->lock free (tests/takeover/run-redo) */
		wfs_unlock(&fs->lock);
		wfs_delay("commit.batch");
		wfs_lock(&fs->lock);
		if (wfs_commit_now(fs) == 0) {
			enum wfs_checkpoint_need need = wfs_catalog_checkpoint_due(fs->catalog);
			bool group = sync_due(fs) || (need == WFS_CHECKPOINT_NOW && wfs_commit_waiting(&fs->commit));

			/* The group sync without fs->lock; then, when the WAL is due (catalog.h), the WAL
			 * into catalog.db, which syncs it: only after the seals in it are durable (their
			 * objects synced by that group sync, made now if the WAL cannot wait for the next;
			 * seals committed while it ran are the exception design.md names). */
			wfs_unlock(&fs->lock);
			ret = group ? wfs_commit_sync(fs) : 0;
			wfs_lock(&fs->lock);
			if (ret == 0 && need != WFS_CHECKPOINT_NONE && (group || !wfs_commit_waiting(&fs->commit)))
				checkpoint(fs, need == WFS_CHECKPOINT_NOW);
			backup_if_due(fs);
		} else {
			/* Kept open (or lost, and logged): try again an interval later, not in a loop. */
			deadline = wfs_deadline_in(WFS_COMMIT_INTERVAL_MS);
			while (!fs->commit.stop &&
			       wfs_lock_timedwait(&fs->commit.due, &fs->lock, &deadline) != ETIMEDOUT)
				;
		}
	}
	wfs_unlock(&fs->lock);
	return NULL;
}

int wfs_commit_start(struct wfs_fs *fs)
{
	int ret = pthread_cond_init(&fs->commit.due, NULL);

	if (ret)
		return -ret;
	wfs_lock(&fs->lock);
	ret = wfs_catalog_batch(fs->catalog, true, first_pending, fs);
	fs->commit.stop = false;
	clock_gettime(CLOCK_MONOTONIC, &fs->commit.backup_at);
	if (ret == 0 && (ret = -pthread_create(&fs->commit.thread, NULL, committer, fs)) != 0)
		wfs_catalog_batch(fs->catalog, false, NULL, NULL);
	fs->commit.started = ret == 0;
	wfs_unlock(&fs->lock);
	if (ret) {
		pthread_cond_destroy(&fs->commit.due);
		wfs_log(WFS_LOG_WARN, "catalog: every change commits at once (batching: %s)", strerror(-ret));
	}
	return ret;
}

void wfs_commit_stop(struct wfs_fs *fs)
{
	if (!fs->commit.started)
		return;
	wfs_lock(&fs->lock);
	fs->commit.stop = true;
	pthread_cond_signal(&fs->commit.due);
	wfs_unlock(&fs->lock);
	pthread_join(fs->commit.thread, NULL);
	wfs_lock(&fs->lock);
	close_removed(fs);
	free(fs->commit.closing);
	fs->commit.closing = NULL;
	fs->commit.closing_cap = 0;
	if (wfs_catalog_batch(fs->catalog, false, NULL, NULL))
		wfs_log(WFS_LOG_ERR, "catalog: the last changes could not be committed at unmount");
	fs->commit.started = false;
	wfs_unlock(&fs->lock);
	wfs_commit_sync(fs); /* the group sync, before the unmount's checkpoint */
	pthread_cond_destroy(&fs->commit.due);
}
