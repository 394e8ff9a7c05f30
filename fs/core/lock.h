/* SPDX-License-Identifier: Apache-2.0 */
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
 *
 * Lending. A holder that is about to wait for the disk on behalf of what the lock protects (the
 * catalog's COMMIT, commit.c) lends the lock out (wfs_lock_lend): it releases the mutex, and until
 * it takes the lock back (wfs_lock_reclaim) every ordinary acquisition waits as if the lock were
 * still held, so what the lender was in the middle of stays its own. Only light acquisitions
 * (wfs_lock_light) get the mutex meanwhile, and they are told the lock is lent: they may then only
 * do work that the lender cannot be in the middle of, and must not wait (the read-only open and
 * release of a sealed file through passthrough, openmode.h: in-memory state and the kernel's
 * backing files, no catalog). A light acquisition that finds the lock not lent is an ordinary hold.
 *
 * Long work. A thread about to sleep on a condition with the lock (wfs_lock_wait, _timedwait, an
 * ordinary acquisition that waits for a lender), or about to work long on something the lock guards
 * (wfs_lock_long_work: hash or copy a file's bytes), runs the lock's long hook first. The daemon
 * sets it to wfs_receive_hand_over() (fs/receive.h): a request thread that leads the reading of
 * /dev/fuse passes that on, so that the requests behind it do not wait for it. Unit tests leave it
 * NULL.
 */
#ifndef WFS_CORE_LOCK_H
#define WFS_CORE_LOCK_H

#include <pthread.h>
#include <stdbool.h>
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
	uint64_t holds, held_ns; /* holds, and their total duration: the daemon's serialized time */
	uint64_t slow;          /* holds of WFS_LOCK_SLOW_MS or more */
	uint64_t slow_ns;       /* their total duration */
	/* Lending (with the mutex held): */
	bool lent;              /* lent out: ordinary acquisitions wait for wfs_lock_reclaim() */
	bool light;             /* the current hold is light and the lock is lent */
	pthread_cond_t returned; /* broadcast by wfs_lock_reclaim() */
	struct timespec lent_since;
	uint64_t lends, lent_max_ns, lent_ns; /* lends since wfs_lock_init(), the longest, in all */
	uint64_t light_holds;   /* light holds that found the lock lent */
	/* Set before any thread other than the initialising one uses the lock; NULL: none. */
	void (*long_hook)(void);
};

/* Returns 0 or -errno of pthread_mutex_init or pthread_cond_init. */
int wfs_lock_init(struct wfs_lock *l);
void wfs_lock_destroy(struct wfs_lock *l);

/* Acquire @l, noting the caller as the holder. */
#define wfs_lock(l) wfs_lock_at((l), __func__, __LINE__)
void wfs_lock_at(struct wfs_lock *l, const char *site, int line);
/*
 * Acquire @l lightly: without waiting for a lender. Returns true when the lock is lent (a light
 * hold: see above), false when this is an ordinary hold. Released with wfs_unlock().
 */
#define wfs_lock_light(l) wfs_lock_light_at((l), __func__, __LINE__)
bool wfs_lock_light_at(struct wfs_lock *l, const char *site, int line);
/*
 * (ordinary hold) Lend @l out and release its mutex; wfs_lock_reclaim() from the same thread ends
 * the lend. Meanwhile the lender touches only what it lent the lock for.
 */
#define wfs_lock_lend(l) wfs_lock_lend_at((l), __func__, __LINE__)
void wfs_lock_lend_at(struct wfs_lock *l, const char *site, int line);
/* Take @l back after wfs_lock_lend(): an ordinary hold again; waiting acquisitions go on after it. */
#define wfs_lock_reclaim(l) wfs_lock_reclaim_at((l), __func__, __LINE__)
void wfs_lock_reclaim_at(struct wfs_lock *l, const char *site, int line);
/*
 * (held) Make the hold ordinary: a light hold of a lent lock waits, the mutex released meanwhile,
 * until the lender takes the lock back, and goes on as an ordinary hold; other holds are ordinary.
 */
#define wfs_lock_ordinary(l) wfs_lock_ordinary_at((l), __func__, __LINE__)
void wfs_lock_ordinary_at(struct wfs_lock *l, const char *site, int line);
/* The caller is about to work long (hash or copy a file's bytes) for what @l guards: run its hook. */
static inline void wfs_lock_long_work(const struct wfs_lock *l)
{
	if (l->long_hook)
		l->long_hook();
}
/* Is @l lent out? (mutex held: true only for a light holder, which must then not touch the lender's state) */
static inline bool wfs_lock_is_lent(const struct wfs_lock *l)
{
	return l->lent;
}

/* Release @l, recording the hold. */
#define wfs_unlock(l) wfs_unlock_at((l), __func__, __LINE__)
void wfs_unlock_at(struct wfs_lock *l, const char *site, int line);
/*
 * pthread_cond_wait() on @c with @l held; the hold before it is recorded, a new one starts after,
 * once the lock is not lent (an ordinary hold). Not for a light hold of a lent lock.
 */
#define wfs_lock_wait(c, l) wfs_lock_wait_at((c), (l), __func__, __LINE__)
void wfs_lock_wait_at(pthread_cond_t *c, struct wfs_lock *l, const char *site, int line);
/* pthread_cond_timedwait() likewise, until CLOCK_REALTIME @deadline; returns its result (ETIMEDOUT). */
#define wfs_lock_timedwait(c, l, deadline) wfs_lock_timedwait_at((c), (l), (deadline), __func__, __LINE__)
int wfs_lock_timedwait_at(pthread_cond_t *c, struct wfs_lock *l, const struct timespec *deadline,
			  const char *site, int line);

#endif
