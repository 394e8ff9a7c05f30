/* SPDX-License-Identifier: Apache-2.0 */
/*
 * filelock — flock(2) and POSIX record locks (fcntl F_SETLK/F_SETLKW/F_GETLK, lockf, OFD locks), kept
 * by the daemon so that they follow a file across a version move.
 *
 * The kernel keeps locks per kernel inode. A writer beside readers moves a file's names to a new
 * inode (openmode.h, wfs_openmode_move()): the readers keep the old one, so kernel locks taken
 * through the readers' descriptors would not exclude the writer's. So the mount asks the kernel to
 * send every lock request here (FUSE_CAP_POSIX_LOCKS, FUSE_CAP_FLOCK_LOCKS), and locks are kept per
 * *lock identity*: an inode's own number, except that an inode a name moved to shares the identity
 * of the inode it replaced (wfs_filelock_moved(); chains resolve to the first). Rules, as ext4's:
 *   - flock locks and POSIX locks do not interact;
 *   - flock: one lock per owner (the kernel's owner is the open file description); LOCK_SH locks
 *     share, LOCK_EX excludes every other owner's; a conversion drops the old lock first (also when
 *     the new one then has to wait or fails), as Linux does;
 *   - POSIX: byte ranges per owner (a process's file table, or the open file description of an OFD
 *     lock); a read lock excludes other owners' write locks on overlapping bytes, a write lock every
 *     other owner's lock; an owner's new lock replaces its own on the same bytes (ranges split and
 *     merge); a request is all or nothing;
 *   - blocked requests wait in a FIFO per identity, granted as soon as they conflict with nothing
 *     held (not ahead of nothing: a later request that fits goes first, as in the kernel);
 *   - unlocks the kernel asks for implicitly: an owner's POSIX locks at each close(2) of a
 *     descriptor of the file (FLUSH, wfs_filelock_drop_owner()), every lock taken through an open
 *     file description at its RELEASE (wfs_filelock_drop_handle(): flock and OFD locks, and the POSIX
 *     locks of a descriptor that sent no FLUSH, see wfs_filelock_flush_wanted()).
 * No deadlock detection (EDEADLK): a cycle of F_SETLKW waits until a signal interrupts one of them.
 *
 * A wait holds no thread: a blocked request is queued with the caller's request pointer (struct
 * wfs_filelock_wait, allocated by the caller) and the handler returns; the request that unblocks it
 * hands it back granted (the @granted lists below), and the caller answers it then. An interrupt
 * cancels it (wfs_filelock_cancel()). At most WFS_FILELOCK_WAITERS_MAX wait at once (-ENOLCK after).
 *
 * The table is the daemon's memory only: a successor (takeover.h) starts with none, so locks held
 * through a dead server's descriptors are gone (docs/posix.md).
 *
 * Thread-safety: every function takes the table's own mutex and never fs->lock; a caller may hold
 * fs->lock (order: fs->lock before this one). No function calls out while holding it.
 */
#ifndef WFS_CORE_FILELOCK_H
#define WFS_CORE_FILELOCK_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define WFS_FILELOCK_EOF INT64_MAX    /* a POSIX range's end: to the end of the file, however long */
#define WFS_FILELOCK_WAITERS_MAX 4096 /* blocked requests at once (each costs one small allocation) */
#define WFS_FILELOCK_QUEUED 1         /* wfs_filelock_set(): the request waits */

/* A lock request, or a lock held (wfs_filelock_test()'s answer). */
struct wfs_filelock_req {
	uint64_t owner;  /* the kernel's lock owner (fuse_file_info.lock_owner) */
	uint64_t fh;     /* the open file description it came through (the FUSE file handle) */
	pid_t pid;       /* the process that asked (reported by F_GETLK) */
	short type;      /* F_RDLCK (flock LOCK_SH), F_WRLCK (LOCK_EX), F_UNLCK */
	bool flock;      /* a flock(2) lock (whole file) rather than a POSIX record lock */
	off_t start;     /* POSIX: first byte, >= 0 */
	off_t end;       /* POSIX: last byte (inclusive), or WFS_FILELOCK_EOF */
};

/* A blocked request. The caller allocates it and owns it except while it is queued (state below). */
struct wfs_filelock_wait {
	struct wfs_filelock_req rq; /* (set by the caller) */
	void *req;                  /* (set by the caller) its request, to answer once granted */
	int state;                  /* 0 until queued, 1 queued, 2 out of the queue (granted or cancelled) */
	bool interrupted;           /* cancelled before it was queued: wfs_filelock_set() says -EINTR */
	uint64_t id;                /* the identity it waits on (while queued) */
	struct wfs_filelock_wait *next; /* in its queue; then in a @granted list */
};

struct wfs_filelock_file; /* the locks and waiters of one identity (private) */
struct wfs_filelock_alias; /* inode -> identity of a moved inode (private) */

#define WFS_FILELOCK_BUCKETS 256
struct wfs_filelocks {
	pthread_mutex_t mu;
	struct wfs_filelock_file *files[WFS_FILELOCK_BUCKETS];
	struct wfs_filelock_alias *aliases[WFS_FILELOCK_BUCKETS];
	unsigned nwaiting;          /* queued requests */
	uint64_t granted_waits;     /* since the mount: blocked requests granted */
	uint64_t conflicts;         /* requests that found a conflicting lock */
};

/* An empty table. Returns 0 or -errno (pthread). */
int wfs_filelocks_init(struct wfs_filelocks *t);
/*
 * At exit, after the session: free every lock, identity and queued request; the queued ones are
 * returned in *@left (each ->req still unanswered; the kernel ended the connection) for the caller
 * to free. Then destroys the mutex.
 */
void wfs_filelocks_release(struct wfs_filelocks *t, struct wfs_filelock_wait **left);

/*
 * Inode @to now has the names of inode @from (a version move): @to shares @from's lock identity
 * from now on. Locks held on @to already (none: it is new) are not merged.
 * Returns 0 or -ENOMEM (then the two stay apart; logged by the caller).
 */
int wfs_filelock_moved(struct wfs_filelocks *t, uint64_t from, uint64_t to);
/* The lock identity of inode @ino (@ino itself unless a name moved to it). */
uint64_t wfs_filelock_identity(struct wfs_filelocks *t, uint64_t ino);

/*
 * F_GETLK: the first POSIX lock of another owner held on @ino's identity that conflicts with @rq
 * (rq->type F_RDLCK or F_WRLCK). Returns 1 with it in *@held (owner, pid, type, start, end), or 0
 * (*@held untouched), or -EINVAL (a bad type or range).
 */
int wfs_filelock_test(struct wfs_filelocks *t, uint64_t ino, const struct wfs_filelock_req *rq,
		      struct wfs_filelock_req *held);
/*
 * Set, change or drop (F_UNLCK) the lock @rq on @ino's identity. When it conflicts: with @w NULL,
 * -EAGAIN (flock's EWOULDBLOCK) and nothing changes (but a flock conversion's old lock is dropped);
 * with @w (F_SETLKW, flock without LOCK_NB; w->rq a copy of *@rq), @w is queued and
 * WFS_FILELOCK_QUEUED returned: the table owns @w until it comes back through a @granted list or
 * wfs_filelock_cancel(). Requests that a change unblocks are granted and appended to *@granted
 * (state 2; the caller answers each ->req with success and frees it).
 * Returns 0 (done), WFS_FILELOCK_QUEUED, or
 *   -EAGAIN   conflict and no @w,
 *   -EINTR    @w was cancelled before it could be queued (wfs_filelock_cancel() returned false),
 *   -ENOLCK   WFS_FILELOCK_WAITERS_MAX requests wait already,
 *   -EINVAL   a bad type or range,
 *   -ENOMEM.
 */
int wfs_filelock_set(struct wfs_filelocks *t, uint64_t ino, const struct wfs_filelock_req *rq,
		     struct wfs_filelock_wait *w, struct wfs_filelock_wait **granted);
/*
 * An interrupt of the request that @w is for. Returns true when @w was queued: it is out of the
 * queue now and the caller's again (answer EINTR, free it). False when it is not queued: not yet
 * (marked, so that wfs_filelock_set() returns -EINTR instead of queueing it), or no more (granted:
 * whoever took it from the queue answers it).
 */
bool wfs_filelock_cancel(struct wfs_filelocks *t, struct wfs_filelock_wait *w);
/*
 * The locks of owner @owner on @ino's identity go: its POSIX locks (@flock false) at a FLUSH (a
 * close(2)) with that lock owner, its flock lock (@flock true) at a RELEASE that asks for it
 * (FUSE_RELEASE_FLOCK_UNLOCK). @granted: as wfs_filelock_set().
 */
void wfs_filelock_drop_owner(struct wfs_filelocks *t, uint64_t ino, uint64_t owner, bool flock,
			     struct wfs_filelock_wait **granted);
/* RELEASE of handle @fh of @ino: every lock taken through it goes (flock, OFD, and POSIX locks of a
 * descriptor without FLUSH). @granted: as wfs_filelock_set(). */
void wfs_filelock_drop_handle(struct wfs_filelocks *t, uint64_t ino, uint64_t fh,
			      struct wfs_filelock_wait **granted);
/*
 * Must a new open of @ino send FLUSH at each close(2)? A read-only passthrough open is answered
 * with FOPEN_NOFLUSH (openmode.h) unless a POSIX lock was ever asked on @ino's identity since the
 * mount: the kernel drops a process's POSIX locks only through FLUSH. (A descriptor opened before
 * the first lock request keeps FOPEN_NOFLUSH: its POSIX locks go at its RELEASE.)
 */
bool wfs_filelock_flush_wanted(struct wfs_filelocks *t, uint64_t ino);

#endif
