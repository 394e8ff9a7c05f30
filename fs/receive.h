/* SPDX-License-Identifier: Apache-2.0 */
/*
 * How the daemon's request threads take FUSE requests off /dev/fuse: a leader with followers, and a
 * leader that spins before it sleeps.
 *
 * libfuse's multi-threaded loop lets every idle thread block in read(2) of /dev/fuse. The kernel
 * hands each request to the thread that has slept longest (its wait queue is FIFO), so a chain of
 * requests from one caller (a create is LOOKUP, GETATTR, CREATE, FLUSH; an unlink GETATTR, UNLINK)
 * wakes a different, cold thread for every request, and each wake-up of a sleeping thread is a
 * cross-CPU interrupt — on a virtual machine a VM exit. Measured on the H200 test machine with a
 * create loop and an unlink loop (docs/design.md, "Request threads"): 215 us per create and
 * 115-129 us per unlink with libfuse's loop (a bare round trip 15-20 us); 87-97 and 45-49 us with
 * its single thread; 59-64 and 30-36 us with one thread that polls; 100-140 and 37-43 us with the
 * leader and followers below (10-11 us a round trip), which keep the threads for data and seals.
 *
 * Here one thread at a time, the leader, reads /dev/fuse; the others (followers) wait on a condition
 * variable. The leader polls the device without sleeping for -o spin=US (default
 * WFS_RECEIVE_SPIN_US) after each request, then sleeps in poll(2). A request it takes is either
 *   - light (a lookup, getattr, create, unlink, rename, xattr or directory request, a release: the
 *     metadata a chain is made of): the leader stays leader, answers it and comes back for the next
 *     one, on the same CPU with a warm cache, without any wake-up; or
 *   - heavy (read, write, flush/seal, fsync, open (it may verify an object), setattr (a truncate
 *     copies data), anything not listed as light): the leader hands leadership to a follower first
 *     (one futex wake, while it works), so requests keep flowing during it. A light request that
 *     finds it has heavy work to do (a release that seals data) hands over the same way
 *     (wfs_receive_hand_over()).
 * A light request that takes long anyway (a catalog commit it waits for) loses the leadership: a
 * follower that watches the leader takes it over within two WFS_RECEIVE_TAKEOVER_MS periods, so no
 * request waits longer than about 4 ms behind another (issue 10's probe: an open + mmap under 10 ms
 * while writers seal). Followers sleep without a timeout when the daemon is idle.
 */
#ifndef WFS_RECEIVE_H
#define WFS_RECEIVE_H

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 317 /* as fs/ops.h */
#endif
#include <fuse_lowlevel.h>
#include <stdbool.h>
#include <stdint.h>

#define WFS_RECEIVE_SPIN_US 50     /* spin this long after a request before sleeping */
#define WFS_RECEIVE_TAKEOVER_MS 2  /* a follower takes over a leader busy this long on a light request */

/* What the receive path did since the mount ("receive" in user.weightfs.stats). */
struct wfs_receive_stats {
	bool installed;           /* false: libfuse's own receive path (fuse_session_custom_io failed) */
	unsigned spin_us;         /* -o spin */
	uint64_t taken_spinning;  /* requests the leader found while it spun: no wake-up needed */
	uint64_t taken_sleeping;  /* requests that woke the leader from poll(2) */
	uint64_t handovers;       /* heavy requests (and errors) after which a follower took the lead */
	uint64_t takeovers;       /* leaders stuck on a light request, replaced by a follower */
};
void wfs_receive_stats(struct wfs_receive_stats *out);
/*
 * For a handler of a light request that is about to do heavy work (hash, write or sync data): when
 * this thread answers the request as the leader, a follower leads from now on, as after a heavy
 * request. Otherwise nothing. Any lock may be held (rx's own is taken last).
 */
void wfs_receive_hand_over(void);

/*
 * Did the kernel resend the request this thread is answering (FUSE_UNIQUE_RESEND: a server before
 * a takeover had read it, and may have done part or all of it; takeover.h)? false when libfuse's
 * own receive path is in use.
 */
bool wfs_receive_resent(void);
/*
 * The unique of the request this thread is answering, as the kernel first sent it (a resend keeps
 * it and adds FUSE_UNIQUE_RESEND, which this leaves out); 0 when libfuse's own receive path is in
 * use.
 */
uint64_t wfs_receive_unique(void);

/*
 * Which requests the request threads leave unanswered while a server drains for an upgrade
 * (upgrade.h). A request read from /dev/fuse and never answered stays in the kernel's queue of
 * requests being processed; the successor's FUSE_NOTIFY_RESEND (takeover.h) puts it back, so its
 * caller only waits. Only with this receive path installed (wfs_receive_stats().installed).
 */
enum wfs_receive_gate {
	WFS_RECEIVE_ALL = 0,     /* every request is answered (the normal state) */
	WFS_RECEIVE_NO_WRITERS,  /* CREATE, and OPEN for writing or with O_TRUNC, are left */
	WFS_RECEIVE_NONE,        /* every request is left but FORGET and BATCH_FORGET (no reply) */
};
/* Set the gate (any thread). Requests a thread had already taken are answered as before. */
void wfs_receive_gate(enum wfs_receive_gate gate);
/*
 * Requests being answered now: read by a request thread, which has not come back for the next one.
 * With the gate at WFS_RECEIVE_NONE, 0 means no request is in progress and none will start.
 * @left: requests left unanswered so far (may be NULL).
 */
unsigned wfs_receive_busy(uint64_t *left);

/*
 * Installs the receive path on @se (fuse_session_custom_io() on the session's own descriptor; call
 * after fuse_session_mount(), before the loop). @spin_us 0: the leader sleeps at once (no spinning;
 * the leader/follower hand-off stays). Returns 0, or -errno of fuse_session_custom_io() (-ENOMEM):
 * the session then keeps libfuse's own receive path, which works, only slower.
 */
int wfs_receive_install(struct fuse_session *se, unsigned spin_us);

#endif
