/* lock.h: fs->lock with its hold times. */
#include <errno.h>

#include "lock.h"

int wfs_lock_init(struct wfs_lock *l)
{
	*l = (struct wfs_lock){0};
	return -pthread_mutex_init(&l->mutex, NULL);
}

void wfs_lock_destroy(struct wfs_lock *l)
{
	pthread_mutex_destroy(&l->mutex);
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
	struct timespec now;
	uint64_t ns;

	clock_gettime(CLOCK_MONOTONIC, &now);
	ns = (uint64_t)(now.tv_sec - l->since.tv_sec) * 1000000000u + (uint64_t)now.tv_nsec -
	     (uint64_t)l->since.tv_nsec;
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

void wfs_lock_at(struct wfs_lock *l, const char *site, int line)
{
	pthread_mutex_lock(&l->mutex);
	hold_begin(l, site, line);
}

void wfs_unlock_at(struct wfs_lock *l, const char *site, int line)
{
	hold_end(l, site, line);
	pthread_mutex_unlock(&l->mutex);
}

void wfs_lock_wait_at(pthread_cond_t *c, struct wfs_lock *l, const char *site, int line)
{
	hold_end(l, site, line);
	pthread_cond_wait(c, &l->mutex);
	hold_begin(l, site, line);
}

int wfs_lock_timedwait_at(pthread_cond_t *c, struct wfs_lock *l, const struct timespec *deadline,
			  const char *site, int line)
{
	int ret;

	hold_end(l, site, line);
	ret = pthread_cond_timedwait(c, &l->mutex, deadline);
	hold_begin(l, site, line);
	return ret;
}
