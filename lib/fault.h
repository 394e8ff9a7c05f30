/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fault — test-only crash points and I/O fault injection, off unless the environment asks.
 *
 *   WFS_CRASH_AT=NAME[:N]       the process kills itself (SIGKILL) the Nth time (default 1st) it
 *                               passes crash point NAME: a power cut at that instant, as seen by the
 *                               store (the kernel still completes writes already made).
 *   WFS_FAULT=NAME=ERRNO[:N]    the Nth call through fault point NAME fails with ERRNO (a name such
 *                               as EIO or ENOSPC, or a number); N = 0 fails every call.
 *   WFS_DELAY=NAME=MS[:N][,...] the Nth pass through delay point NAME sleeps MS milliseconds (N = 0,
 *                               the default: every pass): a slow disk where the daemon waits for it.
 *                               Up to four points, separated by commas.
 *
 * The points are named where they are used (e.g. "seal.after-link", "publish.fdatasync"); the
 * crash tests walk through all of them. Both read the environment once, at first use. Thread-safe.
 */
#ifndef WFS_FAULT_H
#define WFS_FAULT_H

/* Crash here if WFS_CRASH_AT names @point (and this is the chosen pass). */
void wfs_crashpoint(const char *point);
/* 0, or the -errno that WFS_FAULT injects at @point for this call. */
int wfs_fault(const char *point);
/* Sleep here as long as WFS_DELAY asks, if it names @point. */
void wfs_delay(const char *point);

#endif
