/*
 * lock — fs->lock, the daemon's one big lock, with a record of how long it is held and where.
 *
 * Every handler takes fs->lock for its catalog and in-memory work, so one holder that waits for
 * the disk (a catalog commit throttled behind writers' dirty pages, a directory read after the
 * kernel dropped its dentries) stalls every open and lookup behind it: the four-writer benchmark
 * saw an open + mmap of a sealed file wait 200+ ms. The lock records the longest hold since the
 * mount with the functions and lines that took and released it, and counts holds over WFS_LOCK_SLOW_MS, which
 * user.weightfs.stats reports ("lock" in its JSON; weightfsctl stat). The cost is two
 * clock_gettime(CLOCK_MONOTONIC) calls per hold (vDSO, tens of ns).
 *
 * A hold is measured from the lock's acquisition (wfs_lock, or the return of a condition wait) to
 * its release (wfs_unlock, or the start of a condition wait): time spent waiting on a condition
 * variable is not a hold. Use these functions for every acquisition of a struct wfs_lock; a raw
 * pthread call on .mutex would make the next release measure a hold that did not happen.
 */
#ifndef WFS_CORE_LOCK_H
#define WFS_CORE_LOCK_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

#define WFS_LOCK_SLOW_MS 10 /* a hold this long is counted: the open latency goal of issue 10 */

struct wfs_lock {
	pthread_mutex_t mutex;
	/* The holder's (written and read with the mutex held): */
	struct timespec since;  /* CLOCK_MONOTONIC of the acquisition */
	const char *site;       /* __func__ of the acquisition (a string literal) */
	int line;
	/* Since wfs_lock_init(), with the mutex held: */
	uint64_t held_max_ns;   /* the longest hold */
	const char *max_site;   /* where it was taken (NULL: none yet) */
	int max_line;
	const char *max_end_site; /* where it ended: a release or a condition wait */
	int max_end_line;
	uint64_t slow;          /* holds of WFS_LOCK_SLOW_MS or more */
	uint64_t slow_ns;       /* their total duration */
};

/* Returns 0 or -errno of pthread_mutex_init. */
int wfs_lock_init(struct wfs_lock *l);
void wfs_lock_destroy(struct wfs_lock *l);

/* Acquire @l, noting the caller as the holder. */
#define wfs_lock(l) wfs_lock_at((l), __func__, __LINE__)
void wfs_lock_at(struct wfs_lock *l, const char *site, int line);
/* Release @l, recording the hold. */
#define wfs_unlock(l) wfs_unlock_at((l), __func__, __LINE__)
void wfs_unlock_at(struct wfs_lock *l, const char *site, int line);
/* pthread_cond_wait() on @c with @l held; the hold before it is recorded, a new one starts after. */
#define wfs_lock_wait(c, l) wfs_lock_wait_at((c), (l), __func__, __LINE__)
void wfs_lock_wait_at(pthread_cond_t *c, struct wfs_lock *l, const char *site, int line);
/* pthread_cond_timedwait() likewise, until CLOCK_REALTIME @deadline; returns its result (ETIMEDOUT). */
#define wfs_lock_timedwait(c, l, deadline) wfs_lock_timedwait_at((c), (l), (deadline), __func__, __LINE__)
int wfs_lock_timedwait_at(pthread_cond_t *c, struct wfs_lock *l, const struct timespec *deadline,
			  const char *site, int line);

#endif
