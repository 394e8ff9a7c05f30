/* SPDX-License-Identifier: Apache-2.0 */
/* daemon.h: the shared state's set-up and teardown. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "check.h"
#include "daemon.h"
#include "inode.h"
#include "object.h"
#include "openmode.h"

int wfs_fs_init(struct wfs_fs *fs)
{
	int ret = -wfs_lock_init(&fs->lock);

	if (ret == 0)
		ret = pthread_cond_init(&fs->seal_done, NULL);
	if (ret == 0)
		ret = pthread_cond_init(&fs->released, NULL);
	if (ret == 0)
		ret = pthread_cond_init(&fs->check_done, NULL);
	if (ret == 0)
		ret = pthread_cond_init(&fs->mapped.due, NULL);
	if (ret == 0)
		ret = -wfs_filelocks_init(&fs->filelocks);
	wfs_map_init(&fs->inodes);
	wfs_map_init(&fs->objects);
	wfs_map_init(&fs->checks);
	fs->handles = NULL;
	fs->handle_recycled = NULL;
	fs->objects_deferred = NULL;
	fs->counters = &fs->own_counters;
	return -ret;
}

void wfs_fs_release(struct wfs_fs *fs)
{
	struct wfs_filelock_wait *left, *next;

	wfs_filelocks_release(&fs->filelocks, &left);
	for (; left; left = next) { /* requests the ended session will never hear of */
		next = left->next;
		free(left);
	}
	wfs_handles_release(fs);
	wfs_inodes_release(fs);
	wfs_objects_release(fs);
	wfs_checks_release(fs);
	free(fs->mapped.inos);
	pthread_cond_destroy(&fs->mapped.due);
	pthread_cond_destroy(&fs->check_done);
	pthread_cond_destroy(&fs->released);
	pthread_cond_destroy(&fs->seal_done);
	wfs_lock_destroy(&fs->lock);
}

void wfs_fs_lend(struct wfs_fs *fs)
{
	wfs_lock_lend(&fs->lock);
}

void wfs_fs_reclaim(struct wfs_fs *fs)
{
	wfs_lock_reclaim(&fs->lock);
	wfs_object_unpin_deferred(fs);
}

struct timespec wfs_deadline_in(long ms)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	t.tv_nsec += ms * 1000 * 1000;
	t.tv_sec += t.tv_nsec / 1000000000;
	t.tv_nsec %= 1000000000;
	return t;
}
