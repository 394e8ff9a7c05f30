/* SPDX-License-Identifier: Apache-2.0 */
/*
 * daemon — the state the weightfs daemon shares between its threads, and who owns each part.
 *
 * Read docs/design.md first: it draws the version and open-mode state machines and follows one write
 * and one open through the functions below. The core (fs/core/) holds no libfuse call; the handlers
 * (fs/ops.c, fs/xattr.c) parse a request, call the core, reply once.
 *
 * Owners, one state machine each, their structs private unless a handler needs a field:
 *   inode.[ch]     in-memory inodes the kernel knows: lookup counts, open counts (struct wfs_inode)
 *   openmode.[ch]  the kernel's open-mode rule (passthrough or daemon-served) and open handles
 *                  (struct wfs_handle); a writer beside readers (the name moves to a new inode)
 *   object.[ch]    objects in use: pins, the read descriptor, the passthrough backing id (private)
 *   check.[ch]     an object's bytes against its digest; quarantine; the checker thread (private)
 *   version.[ch]   the bytes of one version being written: memory or tmp file, hashing (private)
 *   seal.[ch]      a name's write path: starting versions, counting writers, seal, claim, abandon
 *   writer.[ch]    whose close(2) ends the writing (read from /proc)
 *   kernel.[ch]    what the core asks of the kernel (backing files, news)
 *   commit.[ch]    when the catalog's batched changes are committed (the committer thread)
 *   map.[ch]       the hash table under the in-memory tables
 *   filelock.[ch]  flock and POSIX locks per lock identity, which a moved inode shares (own mutex)
 *
 * Locking. fs->lock protects the catalog handle, the four tables (inodes, objects, checks, handles)
 * and every field marked (L) in any core header. A version's own lock protects its bytes and state
 * (version.c) and serialises I/O on its tmp file. Order: fs->lock before a version lock; never take
 * fs->lock while holding a version lock. Functions documented "may drop fs->lock" do so only to wait
 * or to read or copy bytes; their callers revalidate what they looked at before the call.
 *
 * Condition variables, all used with fs->lock, each broadcast when its condition may have changed:
 *   seal_done   an inode's version was sealed, abandoned or unfrozen (in->writer changed, or is
 *               writable again): writers waiting for a seal, readers of a version, claims
 *   released    an inode's last passthrough or last cached handle was released: opens and changes
 *               waiting for closing readers (openmode.c)
 *   check_done  an object check finished: openers waiting for the same object's check (check.c)
 *   commit.due  the catalog's batch got its first change, or the committer is to stop (commit.c)
 *   checker.due an object was queued for the checker thread, or it is to stop (check.c)
 */
#ifndef WFS_CORE_DAEMON_H
#define WFS_CORE_DAEMON_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

#include "catalog.h"
#include "check.h"
#include "commit.h"
#include "digest.h"
#include "filelock.h"
#include "kernel.h"
#include "lock.h"
#include "map.h"
#include "mapped.h"
#include "openmode.h"
#include "store.h"

struct fuse_session;
struct wfs_direct;

/* -o passthrough_writes=: which writable opens the kernel serves through passthrough (openmode.h). */
enum wfs_writes {
	WFS_WRITES_OFF,     /* none: the daemon serves every write */
	WFS_WRITES_TENSORS, /* declared tensors of WFS_PASSTHROUGH_WRITE_MIN bytes or more */
	WFS_WRITES_ALL,     /* ... and every create or open with O_TRUNC */
};

struct wfs_options {
	char *store;
	char *mountpoint;     /* as given until the command line is parsed, then resolved */
	int passthrough;      /* -1 auto, 0 off */
	int passthrough_writes; /* what is written through passthrough when it is on: enum wfs_writes */
	int verify;           /* check each object's digest on its first open (default 1) */
	int dedup_verify;     /* compare bytes with the stored copy on a dedup hit (default 0) */
	char *retain_text;    /* -o retain=SIZE as given */
	uint64_t retain;      /* bytes of unreferenced objects kept for reuse (0: delete at once): the
			       * store's budget (catalog.h), which -o retain records */
	char *readahead_text; /* -o readahead=SIZE as given */
	int64_t readahead;    /* its bytes; -1: not given, READAHEAD_DEFAULT (ops.c) */
	int sync;             /* enum wfs_sync_mode: when seals become durable (commit.h) */
	double timeout;       /* entry and attribute cache timeout, seconds */
	char *spin_text;      /* -o spin=US as given */
	unsigned spin_us;     /* how long a request thread polls /dev/fuse before it sleeps (receive.h) */
	int holder;           /* -o holder (default without -f), noholder: a holder process keeps the
			       * connection (fs/holder.h) */
	int foreground, debug, show_help, show_version;
	unsigned max_threads;
};

/* What this daemon did since it mounted; shown by user.weightfs.stats on the mount root. */
/*
 * Counters since the mount. Under a holder they live in its shared region (takeover.h,
 * wfs_takeover_counters()): a successor goes on counting where a dead server stopped. A successor
 * of another build (an upgrade) reads them by position, so fields are only ever appended.
 */
struct wfs_counters {
	uint64_t seals;             /* versions sealed into a name */
	uint64_t objects_published; /* of those, objects new to the store */
	uint64_t bytes_published;   /* bytes of the new objects: what the store wrote */
	uint64_t dedup_hits;        /* seals whose content was already stored: copy dropped */
	uint64_t claims;            /* user.weightfs.claim that sealed a name with no bytes sent */
	uint64_t claim_misses;      /* claims refused with ENODATA: the object is not stored */
	uint64_t verify_failures;   /* objects whose bytes did not match their digest (quarantined) */
	uint64_t moved_from_readers; /* writable opens and truncates of a file readers held: its
				      * name moved to a new inode (openmode.c, wfs_openmode_move) */
	uint64_t opens_passthrough; /* read-only opens served by the kernel from the backing file */
	uint64_t opens_lent;        /* of those, opened while the catalog committed (lock.h, lent) */
	uint64_t opens_daemon;      /* opens served by the daemon (writable, or passthrough off) */
	uint64_t opens_direct;      /* object descriptors handed out by the direct path (direct.c) */
	uint64_t opens_passthrough_write; /* writable opens through passthrough: tensors (openmode.c) */
	uint64_t published_copies;  /* of their seals, those that found the file still writable and
				     * published a copy (version.c, settle) */
	uint64_t seals_synced;      /* seals durable before their close(2) returned: large or fsync'd
				     * (-o sync; commit.h) */
	uint64_t group_syncs;       /* group syncs of seals not synced at close (commit.c) */
	uint64_t group_syncs_by_file; /* ... of those, made object by object (a few large seals) */
	uint64_t seals_declared;    /* new objects published under their writer's declared digest,
				     * checked after the seal (seal.h, wfs_seal_declare) */
	uint64_t checks_after_seal; /* of those, checked by the checker thread (check.c) */
	_Atomic uint64_t checks_placed; /* object checks read on the opener's NUMA node (check.c; atomic:
					 * added without fs->lock) */
};

struct wfs_fs {
	struct wfs_options opt;
	struct wfs_store *store;
	struct wfs_catalog *catalog;  /* (L) */
	struct wfs_commit commit;     /* (L) the committer of the catalog's batch (commit.c) */
	struct wfs_checker checker;   /* (L) objects to check soon, and the thread that does (check.c) */
	struct wfs_mapped mapped;     /* (L) files closed while mapped for writing (mapped.c) */
	struct wfs_kernel kernel;     /* set before the session loop starts (kernel.h) */
	struct fuse_session *se;      /* the handlers' session; the core never uses it */
	struct wfs_lock lock;         /* fs->lock, with its hold times (lock.h) */
	pthread_cond_t seal_done;     /* see the legend above */
	pthread_cond_t released;
	pthread_cond_t check_done;
	struct wfs_map inodes;        /* (L) struct wfs_inode by number (inode.c) */
	struct wfs_map objects;       /* (L) objects in use by digest (object.c) */
	struct wfs_object *objects_deferred; /* (L) unpinned while fs->lock was lent (object.c) */
	_Atomic uint64_t attr_epoch;  /* bumped when a catalog rollback makes kept attributes stale (inode.h) */
	struct wfs_map checks;        /* (L) checks done this run by digest (check.c) */
	struct wfs_handle *handles;   /* (L) open handles (openmode.c): the kernel sends no release for
				       * those still open at unmount; freed at exit */
	struct wfs_handle *handle_recycled; /* (L) test-only: the last freed handle, kept for the next
				       * one made (WFS_FAULT=handle.recycle, openmode.c) */
	struct wfs_moved_ring moved;  /* (L) inodes a name just moved to for a writer (openmode.c) */
	struct wfs_filelocks filelocks; /* flock and POSIX locks (filelock.h; its own mutex, after fs->lock) */
	unsigned claims_waiting;      /* (L) claims waiting for another file's writer (claim.c) */
	unsigned releases_telling;    /* (L) releases whose news the kernel has not been told yet: an
				       * open waiting for a release waits for those too (seal.h,
				       * wfs_openmode_wait_release; broadcast on seal_done) */
	uint64_t largest_object;      /* (L) bytes of the largest stored object, once asked (seal.c: a
				       * full store's writes beyond it cannot be of stored content) */
	bool largest_known;           /* (L) */
	atomic_bool passthrough;      /* negotiated and still working */
	atomic_bool readahead_pending; /* set at INIT: the next request sets the mount's readahead */
	bool direct_writes;           /* writable opens are direct I/O (set once by init, before any open) */
	struct wfs_counters *counters; /* (L) since the mount: &own_counters (wfs_fs_init), or the
					* holder's region's, set before the session loop (weightfs.c) */
	struct wfs_counters own_counters;
	bool killpriv_v2;             /* the kernel leaves clearing set-user-ID and set-group-ID bits to the
				       * daemon (FUSE_HANDLE_KILLPRIV_V2: fileio.h; set once by init) */
	uint64_t retained;            /* (L) -o retain: unreferenced bytes, at least (object.c); counted
				       * by every server before it serves (weightfs.c) */
	bool retained_none;           /* (L) a removal to make room found nothing left to remove, and
				       * nothing was retained since (object.c, wfs_object_make_room) */
	uint64_t held_before;         /* after a takeover (fs/takeover.h): inodes numbered up to this one
				       * may be held by the kernel through a dead server's replies, their
				       * lookups uncounted here; set before the session loop (inode.c) */
	struct wfs_direct *direct;    /* the direct path's socket and threads (direct.c), or NULL; set
				       * before the session loop starts, cleared after it ends */
};

/*
 * Initialise @fs's locks and tables. The caller sets opt, store, catalog and kernel (all borrowed:
 * wfs_fs_release() does not close them). Returns 0 or -errno (pthread initialisation).
 */
int wfs_fs_init(struct wfs_fs *fs);
/*
 * Free every table (after the session ended: the kernel forgets nothing at unmount) and destroy the
 * locks. Versions still being written are dropped unsealed: never published, gone at next mount.
 */
void wfs_fs_release(struct wfs_fs *fs);
/*
 * (ordinary hold of fs->lock) Lend fs->lock out (lock.h) for catalog work that may wait for the disk:
 * a COMMIT (commit.c), the totals of user.weightfs.stats (xattr.c). Until wfs_fs_reclaim() the
 * caller touches only fs->catalog; ordinary acquisitions wait, light ones (a read-only open, release
 * or getattr of a sealed file) go on.
 */
void wfs_fs_lend(struct wfs_fs *fs);
/* Take fs->lock back after wfs_fs_lend(), finishing the last unpins deferred meanwhile (object.h). */
void wfs_fs_reclaim(struct wfs_fs *fs);
/*
 * The CLOCK_REALTIME time @ms milliseconds from now: the deadline of a pthread_cond_timedwait() on
 * one of the condition variables above (their default clock).
 */
struct timespec wfs_deadline_in(long ms);

#endif
