/* SPDX-License-Identifier: Apache-2.0 */
/* mapped.h: files whose writable mapping outlived their last close, sealed once it goes. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "inode.h"
#include "log.h"
#include "mapped.h"
#include "seal.h"
#include "version.h"

int wfs_mapped_add(struct wfs_fs *fs, struct wfs_inode *in)
{
	struct wfs_mapped *m = &fs->mapped;

	for (size_t i = 0; i < m->n; i++)
		if (m->inos[i] == in->ino)
			return 0;
	if (m->n == m->cap) {
		size_t cap = m->cap ? 2 * m->cap : 16;
		uint64_t *p = realloc(m->inos, cap * sizeof(*p));

		if (!p)
			return -ENOMEM;
		m->inos = p;
		m->cap = cap;
	}
	m->inos[m->n++] = in->ino;
	pthread_cond_signal(&m->due);
	wfs_log(WFS_LOG_DEBUG, "inode %llu: closed while a writable mapping of it stays: sealed when it goes",
		(unsigned long long)in->ino);
	return 0;
}

/* Seal @in, noted here and no longer noted, its mapping gone (or the unmount's copy asked for). */
static void seal_noted(struct wfs_fs *fs, struct wfs_inode *in)
{
	int ret = wfs_seal(fs, in, false);

	if (ret)
		WFS_LOG_LIMITED(WFS_LOG_ERR, "inode %llu: seal after its mapping went failed: %s",
				(unsigned long long)in->ino, strerror(-ret));
}

/*
 * Seal the noted inodes whose mapping has gone (@all: every one, as a copy). An inode whose version
 * is no longer waiting (another writer joined it: that writer's close seals it; or it was dropped)
 * is forgotten. Drops fs->lock while sealing.
 */
static void seal_unmapped(struct wfs_fs *fs, bool all)
{
	struct wfs_mapped *m = &fs->mapped;
	size_t i = 0;

	while (i < m->n) {
		struct wfs_inode *in = wfs_inode_find(fs, m->inos[i]);
		struct wfs_version *v = in ? in->writer : NULL;

		if (v && wfs_version_writers(v) == 0 && !wfs_version_frozen(v) && !all && wfs_version_mapped(v)) {
			i++;
			continue;
		}
		m->inos[i] = m->inos[--m->n];
		if (!v || wfs_version_writers(v) > 0 || wfs_version_frozen(v))
			continue;
		if (all) {
			wfs_version_copy_if_mapped(v);
			wfs_log(WFS_LOG_WARN, "inode %llu: still mapped for writing at the unmount: sealed with its "
				"bytes as they are now", (unsigned long long)in->ino);
		}
		seal_noted(fs, in); /* drops fs->lock: the list may change meanwhile */
		wfs_inode_maybe_free(fs, in);
		i = 0;
	}
}

void wfs_mapped_settle(struct wfs_fs *fs, struct wfs_inode *in)
{
	struct wfs_mapped *m = &fs->mapped;
	struct wfs_version *v = in->writer;
	struct timespec deadline;
	size_t i;

	if (!v || in->io.nwritable > 0 || wfs_version_writers(v) > 0)
		return;
	wfs_inode_pin(in);
	if (wfs_version_frozen(v)) {
		/* Being sealed (the poll's seal): what the name holds is what that seal gives. */
		wfs_version_get(v); /* compared below: not freed and made again at the same address */
		deadline = wfs_deadline_in(60 * 1000);
		while (in->writer == v && wfs_version_frozen(v) &&
		       wfs_lock_timedwait(&fs->seal_done, &fs->lock, &deadline) != ETIMEDOUT)
			;
		wfs_version_put(v);
	} else {
		for (i = 0; i < m->n && m->inos[i] != in->ino; i++)
			;
		if (i < m->n && !wfs_version_mapped(v)) {
			m->inos[i] = m->inos[--m->n];
			seal_noted(fs, in);
		}
	}
	wfs_inode_unpin(fs, in);
}

static void *watcher(void *arg)
{
	struct wfs_fs *fs = arg;
	struct wfs_mapped *m = &fs->mapped;

	wfs_lock(&fs->lock);
	while (!m->stop) {
		if (m->n == 0) {
			wfs_lock_wait(&m->due, &fs->lock);
			continue;
		}
		struct timespec deadline = wfs_deadline_in(WFS_MAPPED_POLL_MS);

		while (!m->stop && wfs_lock_timedwait(&m->due, &fs->lock, &deadline) != ETIMEDOUT)
			;
		if (!m->stop)
			seal_unmapped(fs, false);
	}
	wfs_unlock(&fs->lock);
	return NULL;
}

int wfs_mapped_start(struct wfs_fs *fs)
{
	struct wfs_mapped *m = &fs->mapped;
	int ret;

	wfs_lock(&fs->lock);
	m->stop = false;
	ret = -pthread_create(&m->thread, NULL, watcher, fs);
	m->started = ret == 0;
	wfs_unlock(&fs->lock);
	if (ret)
		wfs_log(WFS_LOG_WARN, "no mapped-file thread (%s): files closed while mapped for writing are "
			"sealed at the unmount", strerror(-ret));
	return ret;
}

void wfs_mapped_stop(struct wfs_fs *fs)
{
	struct wfs_mapped *m = &fs->mapped;

	wfs_lock(&fs->lock);
	m->stop = true;
	pthread_cond_signal(&m->due);
	wfs_unlock(&fs->lock);
	if (m->started)
		pthread_join(m->thread, NULL);
	m->started = false;
	wfs_lock(&fs->lock);
	seal_unmapped(fs, true);
	free(m->inos);
	m->inos = NULL;
	m->n = m->cap = 0;
	wfs_unlock(&fs->lock);
}
