/* commit.h: the committer thread. */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "commit.h"
#include "daemon.h"
#include "log.h"

/* The catalog's cue (called under fs->lock): a batch has its first change. */
static void first_pending(void *ctx)
{
	struct wfs_fs *fs = ctx;

	pthread_cond_signal(&fs->commit.due);
}

int wfs_commit_now(struct wfs_fs *fs)
{
	int ret = wfs_catalog_commit(fs->catalog);

	if (ret)
		wfs_log(WFS_LOG_ERR, "catalog commit: %s", strerror(-ret));
	return ret;
}

static void *committer(void *arg)
{
	struct wfs_fs *fs = arg;

	pthread_mutex_lock(&fs->lock);
	while (!fs->commit.stop) {
		struct timespec deadline;
		int ret;

		if (!wfs_catalog_pending(fs->catalog)) {
			pthread_cond_wait(&fs->commit.due, &fs->lock);
			continue;
		}
		/* Let the batch grow for an interval; fs->lock is free meanwhile. */
		deadline = wfs_deadline_in(WFS_COMMIT_INTERVAL_MS);
		while (!fs->commit.stop &&
		       pthread_cond_timedwait(&fs->commit.due, &fs->lock, &deadline) != ETIMEDOUT)
			;
		if (wfs_commit_now(fs) == 0) {
			/* The WAL into catalog.db (and its fsync) without fs->lock, now and then. */
			pthread_mutex_unlock(&fs->lock);
			ret = wfs_catalog_checkpoint(fs->catalog);
			pthread_mutex_lock(&fs->lock);
			if (ret)
				wfs_log(WFS_LOG_WARN, "catalog checkpoint: %s", strerror(-ret));
		} else {
			/* Kept open (or lost, and logged): try again an interval later, not in a loop. */
			deadline = wfs_deadline_in(WFS_COMMIT_INTERVAL_MS);
			while (!fs->commit.stop &&
			       pthread_cond_timedwait(&fs->commit.due, &fs->lock, &deadline) != ETIMEDOUT)
				;
		}
	}
	pthread_mutex_unlock(&fs->lock);
	return NULL;
}

int wfs_commit_start(struct wfs_fs *fs)
{
	int ret = pthread_cond_init(&fs->commit.due, NULL);

	if (ret)
		return -ret;
	pthread_mutex_lock(&fs->lock);
	ret = wfs_catalog_batch(fs->catalog, true, first_pending, fs);
	fs->commit.stop = false;
	if (ret == 0 && (ret = -pthread_create(&fs->commit.thread, NULL, committer, fs)) != 0)
		wfs_catalog_batch(fs->catalog, false, NULL, NULL);
	fs->commit.started = ret == 0;
	pthread_mutex_unlock(&fs->lock);
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
	pthread_mutex_lock(&fs->lock);
	fs->commit.stop = true;
	pthread_cond_signal(&fs->commit.due);
	pthread_mutex_unlock(&fs->lock);
	pthread_join(fs->commit.thread, NULL);
	pthread_mutex_lock(&fs->lock);
	if (wfs_catalog_batch(fs->catalog, false, NULL, NULL))
		wfs_log(WFS_LOG_ERR, "catalog: the last changes could not be committed at unmount");
	fs->commit.started = false;
	pthread_mutex_unlock(&fs->lock);
	pthread_cond_destroy(&fs->commit.due);
}
