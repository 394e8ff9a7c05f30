/* SPDX-License-Identifier: Apache-2.0 */
/*
 * takeover — what a server leaves for its successor on the same FUSE connection, and how the
 * successor takes the connection over (docs/design.md, "Takeover").
 *
 * With -o holder, the process that mounted keeps the /dev/fuse descriptor and forks the server
 * (holder.h); when a server dies, it forks the next one, which takes the connection over. The
 * kernel sends INIT once per connection and libfuse answers EIO to every request before an INIT,
 * and several things the kernel holds were told by the dead server. So, in a region of memory that
 * the holder maps (a memfd, MAP_SHARED) before its first fork and every server inherits:
 *   1. the first server saves the INIT request and its reply as read from and written to /dev/fuse
 *      (wfs_takeover_note_read(), wfs_takeover_note_write(), called by receive.c; the reply is
 *      saved before it is written);
 *   2. a successor replays that INIT through libfuse (wfs_takeover_replay()), swallows libfuse's
 *      reply and checks that it is, byte for byte, the one the kernel got (the kernel keeps the
 *      first reply's settings: a different one is refused), then sends FUSE_NOTIFY_RESEND, so the
 *      requests the dead server had read and not answered come again, their unique marked
 *      FUSE_UNIQUE_RESEND (wfs_receive_resent());
 *   3. each server has an epoch (1, 2, ...), carried in the top 16 bits of every file handle (fh)
 *      it gives the kernel: a handle of a dead server is recognised (wfs_takeover_fh_handle()
 *      returns NULL for it) and never dereferenced; bit 0 says whether it was opened for writing;
 *   4. passthrough backing ids belong to the connection, not to a server: each server records the
 *      ids it registers (with the st_dev and st_ino of the registered file) and which handle uses
 *      which id. A successor answers an open of the same file with the same id (the kernel refuses
 *      a second backing file for an inode that still has passthrough opens: EBUSY in
 *      fs/fuse/iomode.c, EIO to the caller), and releases an inherited id once the last handle of
 *      any server that used it is released and it uses it no more itself;
 *   5. the highest inode number any server told the kernel (wfs_takeover_told_ino()), so that a
 *      successor never gives a new inode a number the kernel may hold (wfs_catalog_takeover()).
 *   6. the catalog's redo log (wfs_takeover_redo_area()): the changes of the open batch, which a
 *      successor applies before it touches the catalog otherwise (wfs_catalog_redo_replay()), so
 *      that a change answered and not yet committed survives the server that answered it.
 *   7. for each handle in the table, the request it answers and whether that reply is known to
 *      have reached the kernel: the resend of an open or create the dead server never answered
 *      gets the handle it made (wfs_takeover_claim()), not a second one; one that no resend asks
 *      for and whose reply was never written is released (wfs_takeover_orphan_next()).
 * Nothing here is on the data path: passthrough reads and writes never reach the daemon; a request
 * costs one relaxed atomic load more in receive.c, a passthrough open and its release one entry in a
 * hash table under a mutex of its own.
 *
 * Without -o holder no region exists: every function is a cheap no-op, handles carry epoch 1.
 * Thread-safety: all functions may be called from any thread of a server once
 * wfs_takeover_server_start() returned. Lock order: fs->lock before this module's lock.
 */
#ifndef WFS_TAKEOVER_H
#define WFS_TAKEOVER_H

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 317 /* as fs/ops.h */
#endif
#include <fuse_lowlevel.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

/* A successor that cannot take the connection over exits with this status (holder.c gives up). */
#define WFS_TAKEOVER_REFUSED 75

/*
 * Holder: map the shared region (a memfd of about 6 MiB, and the address space of keep.h's area;
 * MAP_SHARED, so forks share it). Call
 * once, before the first fork, in the process that mounted. Returns 0, or -errno of memfd_create(2),
 * ftruncate(2) or mmap(2) (the mount then has no holder).
 */
int wfs_takeover_create(pid_t holder_pid);
/* Is the region mapped (this process runs under a holder)? */
bool wfs_takeover_on(void);
/*
 * Server under a holder: watch the holder (a thread blocked in poll(2) on a pidfd of it). The holder
 * outlives every server it forks, so its death under a live server is a kill -9, the OOM killer or
 * a crash: logged once at error level (with @mountpoint, which must outlive the process; how it died
 * only the kernel log says), and from then on wfs_takeover_info() names no holder but the one lost
 * (holder_lost_pid) and no signal goes to its pid, which the system may give another process.
 * The server serves on alone: its own crash now leaves the mount dead. Returns 0 (watching, or the
 * holder found dead already: logged), or -errno of pidfd_open(2) or pthread_create() (not watched).
 */
int wfs_takeover_watch_holder(const char *mountpoint);
/*
 * The region's area for the catalog's redo log (lib/catalog.h, wfs_catalog_redo: each server logs
 * its batch's changes there, a successor replays them), and its size into *@bytes; NULL (and 0)
 * without a region. Owned by this module, mapped for the process's life.
 */
void *wfs_takeover_redo_area(size_t *bytes);
/*
 * The memfd behind the region (close-on-exec; owned by this module), which the holder hands to a
 * server it starts from another binary (upgrade.h); -1 without a region.
 */
int wfs_takeover_region_fd(void);
/*
 * A server started from another binary by the holder (an upgrade; upgrade.h): map the region the
 * holder passed as descriptor @fd (this module owns it from here on). Call before
 * wfs_takeover_server_start(). Returns 0, -EPROTO when @fd is not a region of this build's layout
 * (size, magic and layout number: a build whose region differs cannot take over, logged), or -errno
 * of fstat(2) or mmap(2).
 */
int wfs_takeover_attach(int fd);

/*
 * Holder: a server died (reaped at CLOCK_MONOTONIC @died_ns); the next one forked is its successor.
 * Returns whether the connection can be taken over: false when the dead server never saved an INIT
 * reply (it died before the kernel's INIT was answered).
 */
bool wfs_takeover_server_died(uint64_t died_ns);

/*
 * A server starts (in the forked process, before any thread): takes the next epoch and records its
 * pid. A successor (wfs_takeover_successor()) rebuilds the tables the dead server may have left
 * half-written and inherits its backing ids. @devfd: the session's /dev/fuse descriptor (backing
 * ids are released through it).
 */
void wfs_takeover_server_start(int devfd);
/* Is this server a successor (another served the connection before it)? */
bool wfs_takeover_successor(void);
/* Under a holder: has the kernel's INIT got its reply (saved in the region, so a successor can take
 * the mount over)? False without a holder. */
bool wfs_takeover_init_answered(void);

/*
 * Successor, after receive.c's custom io is installed and before the session loop: replay the saved
 * INIT through @se, check libfuse's reply against the saved one, and ask the kernel to resend what
 * the dead server had read. Returns 0; -EPROTO when the replies differ (logged with both: this
 * build or its options would not serve the connection the kernel set up), -ENODATA when no INIT
 * was saved, -errno of fuse_session_process_buf. A kernel without FUSE_NOTIFY_RESEND (before Linux
 * 6.9) is not an error: logged, with what callers in flight see.
 */
int wfs_takeover_replay(struct fuse_session *se);
/*
 * For the INIT handler: may this server ask the kernel to send lock requests (@flock: flock(2),
 * else POSIX record locks; filelock.h)? True for the connection's first server; a successor asks
 * what the saved reply asked, so that its reply is the same (a server built before the daemon kept
 * locks did not: the kernel keeps those locks itself for the connection's life).
 */
bool wfs_takeover_locks_granted(bool flock);
/*
 * For the INIT handler: may this server ask for FUSE_HANDLE_KILLPRIV_V2 (ops.c, wfs_init())? True
 * for the connection's first server; a successor asks what the saved reply asked (a server built
 * before the daemon cleared set-user-ID bits itself did not: the kernel goes on clearing them).
 */
bool wfs_takeover_killpriv_granted(void);

/*
 * The store a server serves is the one the connection was set up for: the first server records
 * the catalog file at @catalog_path (st_dev, st_ino), a successor compares. Returns 0, or -ESTALE
 * (logged: another file is there now, or none) or -errno of stat(2). 0 without a holder.
 */
int wfs_takeover_check_store(const char *catalog_path);

/* Set while receive.c must show this module what it reads and writes (INIT capture or replay). */
extern atomic_bool wfs_takeover_watching;
/* receive.c: @n bytes read from /dev/fuse into @buf (a request). */
void wfs_takeover_note_read(const void *buf, size_t n);
/*
 * receive.c: a reply about to be written (@iov, @count entries). Returns true when it must not be
 * written (the reply to a replayed INIT), with the bytes it pretends to write in *@len.
 */
bool wfs_takeover_note_write(const struct iovec *iov, int count, ssize_t *len);

/* The fh for handle @h (16-byte aligned, below 2^47), @writable: opened for writing. */
uint64_t wfs_takeover_fh(const void *h, bool writable);
/* The handle in @fh, or one this server adopted for it, or NULL when a dead server made it and
 * nothing adopted it (stale). */
void *wfs_takeover_fh_handle(uint64_t fh);
/* Was handle @fh opened for writing (any epoch)? */
bool wfs_takeover_fh_writable(uint64_t fh);

/* ops.c: the kernel was told inode @ino (an entry reply). One atomic max. */
void wfs_takeover_told_ino(uint64_t ino);
/* Successor: the highest inode number a server before it told the kernel, 0 if none. */
uint64_t wfs_takeover_ino_floor(void);

/*
 * Backing ids (ops.c's struct wfs_kernel callbacks). wfs_takeover_backing_inherited: an id a dead
 * server registered for the file open as @fd (same st_dev and st_ino), now used by this server too,
 * or 0. wfs_takeover_backing_opened: this server registered @id for @fd. wfs_takeover_backing_keep:
 * this server is done with @id; true when it must stay registered (handles of a dead server still
 * use it), else the caller releases it.
 */
int wfs_takeover_backing_inherited(int fd);
void wfs_takeover_backing_opened(int id, int fd);
bool wfs_takeover_backing_keep(int id);
/*
 * Handles. wfs_takeover_handle_opened: @fh, of inode @ino, is the answer, with backing id @id, to
 * request @unique (wfs_receive_unique()): called before the reply is sent (@append: opened with
 * O_APPEND, which an adopted writer keeps). Until wfs_takeover_handle_answered(), called once the
 * reply was written, the handle is unanswered: a successor lets the request's resend take it
 * over (wfs_takeover_claim()), or releases it when none comes (wfs_takeover_orphan_next()).
 * wfs_takeover_handle_replying(), right before the reply is written, says the kernel may have it
 * from then on: a successor never releases such a handle itself. wfs_takeover_handle_released:
 * @fh was released (any epoch; for a dead server's handle, the id it used is released once
 * nothing uses it). Each takes this module's lock. Every handle is kept, daemon-served readers
 * too: a successor must answer later opens of an inode in the mode the kernel holds it in
 * (wfs_takeover_adopt()).
 */
void wfs_takeover_handle_opened(uint64_t fh, int id, uint64_t ino, uint64_t unique, bool append);
void wfs_takeover_handle_replying(uint64_t fh);
void wfs_takeover_handle_answered(uint64_t fh);
struct wfs_adopted_writer;
/*
 * A close(2) of writable handle @fh was answered, and left it in state @w (closed, finished, ended:
 * wfs_openmode_closed_state()): recorded before the FLUSH's reply, so that a successor that adopts
 * the handle counts it closed (openmode.h, wfs_openmode_adopt()). A no-op for a reader's fh.
 */
void wfs_takeover_handle_flushed(uint64_t fh, const struct wfs_adopted_writer *w);
void wfs_takeover_handle_released(uint64_t fh);
/*
 * After the core's release of @fh (request @unique: wfs_takeover_handle_unique()). A writable
 * handle (@fh of wfs_takeover_handle_opened(), with its inode @ino) stays in the table until then
 * (a server killed in between leaves the handle, and its version, to the successor, to which the
 * kernel resends that RELEASE: keep.h); a dead server's handle this server adopted is forgotten.
 */
void wfs_takeover_release_done(uint64_t fh, uint64_t unique);
/*
 * The request unique recorded with writable handle @fh's slot (wfs_takeover_handle_opened()), 0
 * when it has none. Read it while the handle lives and pass it to wfs_takeover_release_done(),
 * which runs after the handle is freed: the slot is removed only if it is still that open's, not a
 * slot that a new handle at the same address (the same fh) recorded in between (its writer would
 * be lost at the next takeover: EIO, and its version's file removed under its mappings).
 */
uint64_t wfs_takeover_handle_unique(uint64_t fh);
/* Successor: the inodes whose versions being written are kept (*@ino: malloc'd, the caller frees). */
size_t wfs_takeover_kept_inodes(uint64_t **ino);
struct wfs_fs;
/*
 * Successor, once the catalog is recovered and before the INIT replay: adopt the versions the dead
 * server kept and its writable handles on them, so that their writers go on (their fh then finds
 * a handle of this server: wfs_takeover_fh_handle()); a version whose writers were all released
 * is sealed now. What cannot be adopted is logged per inode and its writers get EIO. Then its
 * read-only handles (wfs_openmode_adopt_reader()): without them this server would answer an open
 * of an inode they hold through passthrough in another mode (a writer in place, a daemon-served
 * reader), which the kernel fails with EIO, or truncate a file they map. The tmp files nothing
 * adopted are removed. Returns 0 or -ENOMEM (nothing adopted: EIO to every writer).
 */
int wfs_takeover_adopt(struct wfs_fs *fs);

/*
 * Successor: a resent OPEN or CREATE (request @unique, as wfs_receive_unique() gives it) of inode
 * @ino, for which the dead server made a writable handle and never answered: the handle this
 * server adopted for it (wfs_takeover_adopt()), whose dead fh goes into *@fh for the
 * reply; NULL when there is none (the request then opens anew). The kernel never got that fh, so
 * answering with a second handle would leave a writer that nobody releases, and its file unsealed.
 * Thread-safe; the caller holds fs->lock (the handle's fields).
 */
void *wfs_takeover_claim(uint64_t unique, uint64_t ino, uint64_t *fh);
/*
 * Successor, from the receive path: every resent request has been read and answered (a request the
 * kernel queued after the resend has come, and none of the resent ones is still in a handler). Only
 * sets a flag (any lock may be held).
 */
void wfs_takeover_resend_over(void);
/*
 * Is it time to settle the unanswered handles no resend claimed? True once after
 * wfs_takeover_resend_over() (one relaxed load otherwise), for ops.c, which then calls
 * wfs_takeover_orphan_next() until false and releases each handle it gives, as the kernel's
 * RELEASE would have (seals included). A handle whose reply the dead server was writing
 * (wfs_takeover_handle_replying()) is never given: the kernel may have it, and then its requests
 * and its release will come; it stays, answered, as an adopted handle like the others.
 * Unanswered and not being written, the kernel never got it, and a request it did not resend it
 * never will: its caller was killed while the request waited to be resent, or the kernel cannot
 * resend (before Linux 6.9). Thread-safe; call without fs->lock.
 */
bool wfs_takeover_orphans_due(void);
bool wfs_takeover_orphan_next(uint64_t *fh, uint64_t *ino);

/*
 * Holder: an upgrade is asked. The writer counts of the last one (or of a takeover) are cleared, so
 * that servers of a build that does not record them leave no stale ones: writers_closed and
 * writers_lost to 0, writers_adopted to WFS_TAKEOVER_UNTOLD.
 */
void wfs_takeover_note_upgrade(void);
#define WFS_TAKEOVER_UNTOLD UINT32_MAX /* writers_adopted: the successor's build does not count them */
/*
 * A server that drains for an upgrade (upgrade.h) records, for the holder's report: @gate_ns
 * (CLOCK_MONOTONIC) when it stopped answering requests, the writers that closed while it waited
 * (@writers_closed) and those still open when it stopped (@writers_open). Those are lost (EIO)
 * unless the next server adopts them: wfs_takeover_adopt() then records how many it did and did not.
 */
void wfs_takeover_note_drain(uint64_t gate_ns, uint32_t writers_closed, uint32_t writers_open);
/*
 * Holder: the pid that answers the connection now (set by a successor once its INIT replay matched
 * and the resend was asked for, which then sends SIGUSR2 to the holder; 0: none since the last
 * death), when it started answering (CLOCK_MONOTONIC ns), and the writer counts of the last drain
 * and of the adoption that followed it.
 */
struct wfs_takeover_serving {
	pid_t pid;
	uint64_t since_ns;
	uint64_t gate_ns;        /* 0: the server before it did not drain (it died) */
	uint32_t writers_closed; /* released while the drain waited for them (sealed as always) */
	uint32_t writers_adopted; /* still open at the stop, adopted by the successor: they go on;
				   * WFS_TAKEOVER_UNTOLD from a successor of a build before it */
	uint32_t writers_lost;   /* still open at the stop, not adopted: their next write, fsync or
				  * close gets EIO; with writers_adopted untold, every writer still
				  * open at the stop (the drain's count) */
};
void wfs_takeover_serving(struct wfs_takeover_serving *out);

/*
 * The counters since the mount in the holder's region (daemon.h, struct wfs_counters): zeros when the
 * holder made it, what the last server counted for a successor. NULL without a region. A server
 * counts there from before its first request (weightfs.c), so they survive a takeover and an upgrade.
 */
struct wfs_counters;
struct wfs_counters *wfs_takeover_counters(void);
/* The same for the FUSE requests by opcode (ops.h, wfs_ops_requests: 64 tallies). */
struct wfs_ops_tally;
struct wfs_ops_tally *wfs_takeover_request_tallies(void);

/* What user.weightfs.stats shows. */
struct wfs_takeover_info {
	pid_t holder_pid;        /* 0 without -o holder, or once the holder died */
	pid_t holder_lost_pid;   /* the holder that died under this server, or 0 */
	pid_t server_pid;        /* this process */
	uint64_t takeovers;      /* successors started on this mount so far */
	uint32_t epoch;          /* this server's (1: the first) */
	double last_pause_ms;    /* from the holder reaping the dead server to the resend request */
	double worst_pause_ms;
	uint64_t backing_inherited; /* backing ids of dead servers still registered */
	uint64_t upgrades;       /* servers that drained and left for a successor (upgrade.h) */
};
void wfs_takeover_info(struct wfs_takeover_info *out);

#endif
