/* SPDX-License-Identifier: Apache-2.0 */
/*
 * clock — the one monotonic clock reading the daemon, the admin command and the library share.
 */
#ifndef WFS_CLOCK_H
#define WFS_CLOCK_H

#include <stdint.h>
#include <time.h>

/*
 * Nanoseconds on CLOCK_MONOTONIC (since an unspecified start, usually boot; never goes back, does
 * not count suspend): differences of two readings are elapsed times. A vDSO call, tens of ns.
 */
static inline uint64_t wfs_clock_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

#endif
