/* SPDX-License-Identifier: Apache-2.0 */
/* lock.h: fs->lock with its hold times. */
#include <assert.h>
#include <errno.h>

#include "lock.h"

int wfs_lock_init(struct wfs_lock *l)
{
	int ret;

	*l = (struct wfs_lock){0};
	ret = pthread_mutex_init(&l->mutex, NULL);
	if (ret == 0 && (ret = pthread_cond_init(&l->returned, NULL)) != 0)
		pthread_mutex_destroy(&l->mutex);
	return -ret;
}

void wfs_lock_destroy(struct wfs_lock *l)
{
	pthread_cond_destroy(&l->returned);
	pthread_mutex_destroy(&l->mutex);
}

static uint64_t ns_since(const struct timespec *t)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (uint64_t)(now.tv_sec - t->tv_sec) * 1000000000u + (uint64_t)now.tv_nsec - (uint64_t)t->tv_nsec;
}

/* (held) The hold starts now, at @site:@line. */
static void hold_begin(struct wfs_lock *l, const char *site, int line)
{
	clock_gettime(CLOCK_MONOTONIC, &l->since);
	l->site = site;
	l->line = line;
}

/* (held) The hold ends now, at @site:@line: record it. */
static void hold_end(struct wfs_lock *l, const char *site, int line)
{
	uint64_t ns = ns_since(&l->since);

	l->holds++;
	l->held_ns += ns;
	if (ns > l->held_max_ns) {
		l->held_max_ns = ns;
		l->max_site = l->site;
		l->max_line = l->line;
		l->max_end_site = site;
		l->max_end_line = line;
	}
	if (ns >= (uint64_t)WFS_LOCK_SLOW_MS * 1000000u) {
		l->slow++;
		l->slow_ns += ns;
	}
}

/* (mutex held) Wait until the lock is not lent. */
static void wait_returned(struct wfs_lock *l)
{
	if (l->lent)
		wfs_lock_long_work(l);
	while (l->lent)
		pthread_cond_wait(&l->returned, &l->mutex);
}

void wfs_lock_at(struct wfs_lock *l, const char *site, int line)
{
	pthread_mutex_lock(&l->mutex);
	wait_returned(l);
	hold_begin(l, site, line);
}

bool wfs_lock_light_at(struct wfs_lock *l, const char *site, int line)
{
	pthread_mutex_lock(&l->mutex);
	l->light = l->lent;
	l->light_holds += l->light;
	hold_begin(l, site, line);
	return l->light;
}

void wfs_lock_lend_at(struct wfs_lock *l, const char *site, int line)
{
	assert(!l->lent && !l->light);
	l->lent = true;
	clock_gettime(CLOCK_MONOTONIC, &l->lent_since);
	hold_end(l, site, line);
	pthread_mutex_unlock(&l->mutex);
}

void wfs_lock_reclaim_at(struct wfs_lock *l, const char *site, int line)
{
	uint64_t ns;

	pthread_mutex_lock(&l->mutex);
	assert(l->lent);
	l->lent = false;
	ns = ns_since(&l->lent_since);
	l->lends++;
	l->lent_ns += ns;
	if (ns > l->lent_max_ns)
		l->lent_max_ns = ns;
	pthread_cond_broadcast(&l->returned);
	hold_begin(l, site, line);
}

void wfs_lock_ordinary_at(struct wfs_lock *l, const char *site, int line)
{
	if (!l->light)
		return;
	hold_end(l, site, line);
	l->light = false;
	wait_returned(l);
	hold_begin(l, site, line);
}

void wfs_unlock_at(struct wfs_lock *l, const char *site, int line)
{
	hold_end(l, site, line);
	l->light = false;
	pthread_mutex_unlock(&l->mutex);
}

void wfs_lock_wait_at(pthread_cond_t *c, struct wfs_lock *l, const char *site, int line)
{
	assert(!l->light);
	wfs_lock_long_work(l);
	hold_end(l, site, line);
	pthread_cond_wait(c, &l->mutex);
	wait_returned(l);
	hold_begin(l, site, line);
}

int wfs_lock_timedwait_at(pthread_cond_t *c, struct wfs_lock *l, const struct timespec *deadline,
			  const char *site, int line)
{
	int ret;

	assert(!l->light);
	wfs_lock_long_work(l);
	hold_end(l, site, line);
	ret = pthread_cond_timedwait(c, &l->mutex, deadline);
	wait_returned(l);
	hold_begin(l, site, line);
	return ret;
}
