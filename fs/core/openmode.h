/* SPDX-License-Identifier: Apache-2.0 */
/*
 * openmode — how the kernel serves each open of an inode, and the open handles.
 *
 * The kernel's rule (fs/fuse/iomode.c, Linux 6.9+): all passthrough opens of an inode share one
 * backing file, and while any exist every new open must be passthrough too; an inode open in cached
 * mode (daemon-served, through the FUSE page cache) refuses passthrough opens. So:
 *   - the first writable open of a file with no other open is passthrough on the tmp file of a new
 *     version (writes at the speed of the store's filesystem) when it replaces the file whole (a
 *     create or open with O_TRUNC, not O_DIRECT, -o passthrough_writes=all, room in the store) or
 *     its dtype and shape attributes declare at least WFS_PASSTHROUGH_WRITE_MIN bytes; later opens
 *     share that file until the last one closes, readers after the writers' close(2) without
 *     waiting for the seal. Other writable opens are daemon-served. Objects stay immutable: the
 *     version is sealed at the last writer's release, and only once no descriptor or mapping can
 *     write its file (version.h, wfs_version_kernel_backing(); mapped.h);
 *   - a read-only open of a sealed file is passthrough, on the object's backing file, unless a
 *     daemon-served open of the inode exists; a read-only open of a file being written is
 *     daemon-served, from the version, with direct I/O (a read short of a truncated version would
 *     leave zero-filled pages in the page cache);
 *   - a change to a file that readers hold through passthrough (a writable open, truncate, claim)
 *     cannot go on in place: its names (all its hard links) move to a new inode
 *     (wfs_openmode_move()); a file with no name left (unlinked while open, reopened through
 *     /proc/PID/fd) waits up to 500 ms for closing readers and then fails with ETXTBSY.
 *
 * Per inode (struct wfs_iomode, in struct wfs_inode):
 *
 *             read-only open: passthrough on,         writable open; or read-only with
 *             no cached open, name not just moved     passthrough off, a writer, or cached opens
 *                 │                                       │
 *   ┌────────┐    ▼     ┌──────────────────────┐          ▼     ┌──────────────────────┐
 *   │ CLOSED │ ───────▶ │ PASSTHROUGH          │     (CLOSED ──▶) │ CACHED               │
 *   │        │          │ npassthrough > 0     │                  │ ncached > 0          │
 *   └────────┘          │ read-only: same      │                  │ read-only: cached;   │
 *       ▲               │ backing file;        │                  │ page cache kept while│
 *       │               │ writable: move the   │                  │ it holds the content │
 *       │               │ name, or ETXTBSY     │                  │ (keep_cache)         │
 *       │               └──────────┬───────────┘                  └──────────┬───────────┘
 *       └──────── last release (broadcast fs->released) ◀────────────────────┘
 *
 * close(2) returns before the kernel's RELEASE arrives, so an open that follows a close may still see
 * the closing handle counted; opens wait for such releases briefly (fs->released) before deciding.
 * All functions run with fs->lock held; those that wait drop it meanwhile (said below).
 */
#ifndef WFS_CORE_OPENMODE_H
#define WFS_CORE_OPENMODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "digest.h"

struct wfs_fs;
struct wfs_inode;

/* Bytes of the largest WRITE request (the INIT reply's max_write, wfs_init()). */
#define WFS_WRITE_MAX ((size_t)1 << 20)

/* Free bytes (f_bavail) a store needs for a create or O_TRUNC open to be written through the kernel
 * (openmode.c). */
#define WFS_PASSTHROUGH_WRITE_ROOM ((uint64_t)64 << 20)
struct wfs_news;
struct wfs_object;
struct wfs_version;

/* The open-mode state of one inode (in struct wfs_inode; all (L), written by openmode.c only). */
struct wfs_iomode {
	unsigned nopen;               /* open handles */
	unsigned nwritable;           /* of those, opened for writing */
	unsigned ncached;             /* open handles in cached (daemon-served) mode */
	unsigned ncached_closed;      /* of those, closed (flush seen): their release is pending */
	unsigned npassthrough;        /* open handles in passthrough mode */
	unsigned nwritable_closed;    /* writable handles closed (flush seen): their release is pending */
	unsigned nwritable_ended;     /* of those, handles whose close(2) ended their writing (its
				       * version sealed or left: wfs_handle.ended) */
	int pt_backing;               /* the backing id every passthrough open shares, when npassthrough > 0 */
	struct wfs_object *pt_object; /* ... owned by this object (a sealed file read), or */
	struct wfs_version *pt_version; /* ... by openmode, on this referenced version's tmp file (a
				       * tensor written through passthrough; released at the last close) */
	bool pt_inherited;            /* ... or a dead server's (takeover.h): the file it registered,
				       * which its readers still hold and this server may not be able to
				       * name; read-only opens share it, released at the last close */
	unsigned nwrite_going_on;     /* handles whose write(2) may go on in their next WRITE request
				       * (wfs_handle.write_going_on) */
	unsigned nsplit_in_flight;    /* WRITE requests of such write(2)s in the daemon now */
	struct timespec split_wait_until; /* CLOCK_REALTIME: the last of those ended 200 ms before */
	bool replaced;                /* its name moved to a new inode for a writer while readers held
				       * this one: writers get ESTALE and the kernel looks the name up again */
	uint64_t moved_to;            /* ... that inode, when @replaced */
	bool cache_valid;             /* the kernel page cache holds @cache_digest's bytes */
	struct wfs_digest cache_digest;
};

/* One open file (the FUSE file handle). Fields (L); the owner of each is named. */
struct wfs_handle {
	struct wfs_inode *inode;
	struct wfs_object *object;    /* pinned sealed object this handle reads, or NULL (openmode.c) */
	struct wfs_version *writing;  /* referenced version counting this handle as a writer: written
				       * to (or truncated) since the last flush (seal.c) */
	pid_t writer_tid;             /* thread that last wrote through this handle, 0: none named one
				       * (writeback of a mapping names no thread) (seal.c) */
	pid_t opener_tid;             /* thread that created it or opened it for writing, 0: unknown */
	bool writable;                /* opened for writing: daemon-served, may start versions */
	bool passthrough;             /* reads and mmaps go to @object's backing file in the kernel */
	bool append;                  /* opened with O_APPEND: its write(2)s land at the version's end
				       * (fileio.c), not at the kernel's idea of it */
	bool closed;                  /* a flush (close(2) of a descriptor) has been seen */
	bool ended;                   /* writable, and a flush ended its writing of a daemon-served
				       * version (sealed it or left it): only its release is to come */
	bool write_going_on;          /* its last WRITE filled a whole request: the write(2) that sent
				       * it may go on in the next (wfs_openmode_write_begin()) */
	bool privs_dropped;           /* set-user/group-ID bits checked at this handle's first write (seal.c) */
	struct wfs_handle *prev, *next; /* on fs->handles */
};

/* Inodes a name just moved to for a writer, whose retried open is on its way (wfs_openmode_move()). */
struct wfs_moved_ring {
	struct wfs_moved {
		uint64_t ino;
		struct timespec until; /* CLOCK_MONOTONIC */
		pid_t retrying[4];     /* threads whose retry is on its way (their own pass), 0: free */
		unsigned passes;       /* retries of threads not named (no room, or no thread known) */
	} slot[16];
};

/* What the kernel is told about a new open (the FUSE open reply's fields). */
struct wfs_open_reply {
	int backing_id;   /* > 0: passthrough on this backing file; 0: daemon-served */
	bool keep_cache;  /* daemon-served: the inode's page cache still holds this content */
	bool direct_io;   /* writes go to the daemon without the FUSE page cache (fs->direct_writes) */
	bool noflush;     /* FOPEN_NOFLUSH: close(2) sends no FLUSH (a read-only passthrough open, whose
			   * flush has nothing to do: one round trip less per close, two for a process
			   * that dup()s the descriptor as Python's mmap does) */
};

/*
 * open(2) of inode @ino by thread @tid: @writable for O_WRONLY/O_RDWR/O_TRUNC, @truncate for O_TRUNC
 * (the new version is empty). Decides the mode, checks a read's object (check.h, on @tid's NUMA
 * node) and returns a new handle in *@h with what to reply in *@r. May drop fs->lock (object check,
 * waiting for releases). @news gets a moved name. Returns 0, or
 *   -ESTALE   a writer reached an inode whose name moved (or moves now) to a new inode: the VFS
 *             looks the name up again and retries,
 *   -ETXTBSY  a writer of a file with no name left (unlinked while open) that readers hold through
 *             passthrough,
 *   -EISDIR, -EIO (never sealed, or the object failed its check), -ENOMEM, -errno of the catalog.
 */
int wfs_openmode_open(struct wfs_fs *fs, uint64_t ino, bool writable, int flags, pid_t tid,
		      struct wfs_handle **h, struct wfs_open_reply *r, struct wfs_news *news);
/*
 * The read-only open of inode @ino under a light hold of a lent fs->lock (lock.h), while the catalog
 * commits: only a sealed inode known in memory whose object this run knows good (check.h), served
 * through passthrough (noflush set). Returns 0 with the handle in *@h and the reply in *@r, or
 * -EAGAIN when the open needs more (the catalog, a check, a wait): then take fs->lock and call
 * wfs_openmode_open().
 */
int wfs_openmode_open_lent(struct wfs_fs *fs, uint64_t ino, struct wfs_handle **h, struct wfs_open_reply *r);
/*
 * The open of inode @in that thread @tid just created (CREATE, open(2) flags @flags): a writer with a
 * new, empty version, sealed at its end even with no write. With O_TRUNC (a program that replaces the
 * file whole) and -o passthrough_writes=all, written through passthrough like a tensor's reopen
 * (open_writer_passthrough()) — not with O_DIRECT: the kernel keeps the backing file's O_DIRECT when
 * fcntl(F_SETFL) clears the flag (dd oflag=direct's last block), so such a writer stays
 * daemon-served. Returns 0 or -errno (-ENOMEM, -ENOSPC); on failure nothing is left open.
 */
int wfs_openmode_create(struct wfs_fs *fs, struct wfs_inode *in, int flags, pid_t tid, struct wfs_handle **h,
			struct wfs_open_reply *r);
/*
 * A daemon-served read of @len bytes at @off through @h by thread @tid, into @buf (the caller's,
 * @len bytes): from the version being written, else from the inode's current object (pinned by @h).
 * Takes and drops fs->lock itself: call it without. Returns bytes read (0 at or past the end), or
 * -EIO (never sealed, or damaged), -ENOMEM, -errno.
 */
ssize_t wfs_openmode_read(struct wfs_fs *fs, struct wfs_handle *h, pid_t tid, void *buf, size_t len,
			  off_t off);
/*
 * Where a daemon-served read through @h by thread @tid gets its bytes, for a caller that sends them
 * without copying them in (splice): 0 and *@fd, a read-only descriptor of the inode's current
 * object (checked; a duplicate the caller closes, valid past the handle's release; call
 * wfs_openmode_read_done() after reading it); or 1, *@fd -1: the version being written, read with
 * wfs_openmode_read(). Takes and drops fs->lock itself. Returns 0, 1, or -EIO (never sealed, or
 * damaged), -ENOMEM, -EMFILE, -errno.
 */
int wfs_openmode_read_object(struct wfs_fs *fs, struct wfs_handle *h, pid_t tid, int *fd);
/*
 * After bytes [@off, @off + @len) of object descriptor @fd were handed to the kernel for a FUSE
 * inode's page cache: without passthrough, the object's own cached copy of them is dropped
 * (posix_fadvise DONTNEED), so a daemon-served file costs one page-cache copy, not two. With
 * passthrough, nothing: the object's pages are the ones its readers share.
 */
void wfs_openmode_read_done(struct wfs_fs *fs, int fd, off_t off, size_t len);
/*
 * close(2) of a descriptor of @h by thread @tid (FLUSH): seals the version when this close ends its
 * writing (writer.h). Returns 0 or the seal's -errno (close(2) returns it). @news: see seal.h.
 * Not sent for a read-only passthrough handle (noflush in its open reply), unless the file had
 * POSIX locks asked before its open (filelock.h, wfs_filelock_flush_wanted()).
 */
int wfs_openmode_flush(struct wfs_fs *fs, struct wfs_handle *h, pid_t tid, struct wfs_news *news);
/* (L) After a flush of writable handle @h: what a successor that adopts it must know (its closed,
 * finished and ended fields of struct wfs_adopted_writer; the others are not set). */
struct wfs_adopted_writer wfs_openmode_closed_state(const struct wfs_handle *h);
/*
 * A write(2) of more than WFS_WRITE_MAX bytes (or of about as many from a buffer not page-aligned)
 * reaches a daemon-served handle as several WRITE requests, sent one after another while the kernel holds the inode lock. That lock keeps each write(2) whole
 * against truncate(2) and other write(2)s, but not against the truncation an O_TRUNC open asks of
 * the daemon: landing between two requests, it would leave zeros that no writer wrote before the
 * rest. So a request that fills a whole one (within a page of WFS_WRITE_MAX: a misaligned buffer's
 * is a page short) marks @h as maybe in the middle of a write(2), until a shorter request of @h has
 * been written or @h is closed; an O_TRUNC open of its inode waits while a request of a marked
 * handle is in the daemon, and up to 200 ms after the last one ended for the next one to come.
 *
 * wfs_openmode_write_begin() (fs->lock held) is called before the bytes of a WRITE of @len bytes
 * are written, and returns whether it counted the request; wfs_openmode_write_end() after, with
 * that answer (takes fs->lock when it did).
 */
bool wfs_openmode_write_begin(struct wfs_fs *fs, struct wfs_handle *h, size_t len);
void wfs_openmode_write_end(struct wfs_fs *fs, struct wfs_handle *h, size_t len, bool counted);
/*
 * The kernel's RELEASE of @h by thread @tid: writes after the last flush are sealed (errors logged:
 * the kernel drops them), the counts dropped, the object unpinned, @h freed.
 */
void wfs_openmode_release(struct wfs_fs *fs, struct wfs_handle *h, pid_t tid, struct wfs_news *news);
/* Would the release of @h seal bytes (hash, publish, perhaps sync them): a tensor written through
 * passthrough, or a version of one byte or more left after the last flush? An empty file's seal
 * (created and closed) is not that. fs->lock held. */
bool wfs_openmode_release_seals_data(struct wfs_handle *h);
/* Could a flush of @h seal bytes: a daemon-served writer (the kernel's passthrough writers seal at
 * their release)? fs->lock held. */
bool wfs_openmode_flush_seals_data(const struct wfs_handle *h);
/*
 * The RELEASE of @h under a light hold of a lent fs->lock (lock.h): done (0) when @h is a read-only
 * passthrough handle on an object and its inode stays in memory (a last unpin of the object waits
 * for the lender, object.h); -EAGAIN otherwise: take fs->lock and call wfs_openmode_release().
 */
int wfs_openmode_release_lent(struct wfs_fs *fs, struct wfs_handle *h);
/*
 * A writer beside readers: a writable open or a truncate of sealed file @in (@nlink names, from the
 * catalog) while readers hold it moves its names, all hard links together, to a new inode with the
 * same attributes, xattrs and content (wfs_catalog_inode_replace); the readers keep the old inode and
 * its object. Files with no name left, files already being written or with writers, and the writer's
 * own retry (noted for a second for thread @tid, the caller's) stay. A file with no name left that
 * passthrough readers hold is reached through a stale name (one a dead server moved without telling
 * the kernel, or unlinked since the lookup): 1 once, so that the VFS looks the name up again, and
 * the retry that reaches it again (a reopen through /proc/PID/fd) goes on.
 * Returns 1 (moved, or stale: reply ESTALE, then send @news), 0 (go on in place) or -errno of the
 * catalog.
 */
int wfs_openmode_move(struct wfs_fs *fs, struct wfs_inode *in, uint32_t nlink, pid_t tid, struct wfs_news *news);
/*
 * (L) A lookup, by thread @tid, of a name whose inode is *@a. When @tid is a writer whose open got
 * ESTALE within the last second (the VFS's one retry walks the path again, LOOKUP_REVAL) and the
 * name now reaches another inode that the open would move from its readers (a rename or link over
 * the name came in between), the names move now and *@a becomes the new inode: the retry opens
 * that one in place instead of being moved again, which gave open(2) and truncate(2) ESTALE
 * (rewrite_readers.py on 16 cores: 1-2 in 15 s, every one of them traced to such a rename). When it
 * reaches another inode with nothing to move (nobody has it open, or it is being written), that
 * inode is noted for the retry: readers that open it before the retry's open are daemon-served,
 * and the retry opens it in place (once its writer closed and a reader opened it, the retry's open
 * moved it, ESTALE again). Returns 0, or -errno of the catalog.
 */
int wfs_openmode_lookup(struct wfs_fs *fs, struct wfs_attr *a, pid_t tid, struct wfs_news *news);
/*
 * A writer reached @in, whose name moved to a new inode (in->io.replaced): it gets ESTALE, and its
 * retry on the name's inode now (the last of the moves that @in's name made, as far as they are
 * known in memory) goes ahead in place like the mover's own retry, instead of being moved again by
 * readers that opened the new inode meanwhile: the VFS retries only once, and a second ESTALE
 * reached open(2) or truncate(2) (four '>>' loops beside readers: 4 to 10 in 10 s). @tid: the
 * caller's thread, whose retry it is. Returns -ESTALE.
 */
int wfs_openmode_stale_writer(struct wfs_fs *fs, struct wfs_inode *in, pid_t tid);
/*
 * A change to @in's content in place: wait up to 500 ms for passthrough readers that are closing,
 * then -ETXTBSY (logged once) if some remain. May drop fs->lock. Returns 0 or -ETXTBSY.
 */
int wfs_openmode_wait_readers(struct wfs_fs *fs, struct wfs_inode *in);
/* Has every writable handle of @in been closed (their releases pending), with at least one open? */
bool wfs_openmode_writers_closed(const struct wfs_inode *in);
/* Is @in's passthrough backing file the tmp file of the version being written (seal.c: such a
 * version may change size in place, beside the readers that share that file)? */
bool wfs_openmode_on_version(const struct wfs_inode *in);
/*
 * (L) At exit, after a session that the kernel ended (an unmount: the kernel allows one only with
 * no file open, and a lazy one ends the connection once the last file is closed): release every
 * handle that was closed (a FLUSH seen) but whose RELEASE never came, as wfs_openmode_release()
 * would have, seals included. The kernel sends RELEASE after close(2) returns, in the background,
 * and at an unmount it aborts the connection with the requests the daemon has not read yet: a file
 * created and closed just before an unmount (its empty version sealed at the release) was lost,
 * its never-sealed name removed by the next mount's recovery. Not after a SIGTERM: a handle closed
 * once may still be open in another descriptor (a shell's redirection), its writer not done.
 */
void wfs_openmode_release_closed(struct wfs_fs *fs);
/* How long (ms) a writable open, or a digest asked for, waits for the release of a writer whose
 * close(2) ended its writing (openmode.c): it is on its way, unless a process that inherited the
 * descriptor still holds it. */
#define WFS_FINISHED_RELEASE_WAIT_MS 1000
/*
 * A file closed with nothing written (touch, or created and given attributes only) is sealed at its
 * release, which close(2) does not wait for; so is a tensor written through passthrough. When every
 * writable handle of inode @ino has been closed, give the release up to 100 ms to come (up to
 * WFS_FINISHED_RELEASE_WAIT_MS when the kernel wrote the file and its last close(2) said the bytes
 * are done: that release is on its way, or a process that inherited the descriptor still holds
 * it), and a seal that has started up to a minute to end (a digest asked for right after the close
 * must find it), and the release's news to reach the kernel (fs->releases_telling); a release held
 * back by a mapping is not waited for, but a version left to its mapping that has gone is sealed
 * now (wfs_mapped_settle()). May drop fs->lock.
 */
void wfs_openmode_wait_release(struct wfs_fs *fs, uint64_t ino);

struct wfs_keep_record;
/*
 * (L) Successor under a holder, before it serves (takeover.h): make the version a dead server left
 * in record @r (keep.h) the writer of its inode again. Returns 0, -EEXIST (the inode has a writer
 * already), -ENOENT (no such file any more), or wfs_version_adopt()'s errors.
 */
int wfs_openmode_adopt_version(struct wfs_fs *fs, const struct wfs_keep_record *r);
/* What a dead server's table says of one of its writable handles (takeover.h), for its adoption. */
struct wfs_adopted_writer {
	bool passthrough; /* the kernel writes the version's file itself */
	bool append;      /* opened with O_APPEND (h->append) */
	bool closed;      /* a close(2) of it was answered (h->closed) */
	bool finished;    /* ... and said its bytes are done (a passthrough FINISH: closing.h) */
	bool ended;       /* ... and ended its writing (h->ended: sealed, or left to other writers) */
};
/*
 * (L) Successor: a new handle in *@h for writable handle @w of a dead server on inode @ino, which the
 * kernel keeps using; it writes the inode's adopted version (a writer of it, sealed at its close or
 * release as the dead server would have), or, when none, starts a new one at its next write. A
 * passthrough one takes over the dead server's backing id. One that was closed counts so (an open
 * that comes before its RELEASE waits for the seal that release makes, as after a live close,
 * instead of joining the version and truncating it under its readers). Returns 0, -EIO (the inode
 * was being written and no version was adopted, or a passthrough writer's version was not written
 * through the kernel: never adopted, so that nothing seals a part of what its writer sent),
 * -ENOENT, -ENOMEM, -errno of the catalog.
 */
int wfs_openmode_adopt(struct wfs_fs *fs, uint64_t ino, const struct wfs_adopted_writer *w, struct wfs_handle **h);
/*
 * (L) Successor: a new handle in *@h for a read-only handle of a dead server on inode @ino, which the
 * kernel keeps using, so that this server decides later opens of the inode as the kernel sees it
 * (fs/fuse/iomode.c fails an open whose mode conflicts with the inode's other opens with EIO). With
 * @backing_id > 0 the kernel reads it through passthrough on the dead server's backing file (an
 * object's, or a version's tmp file the dead server may have sealed or removed since): the inode's
 * read-only opens share that id while any passthrough open lasts, and its writable opens move its
 * names away (struct wfs_iomode). With 0 it is daemon-served (its reads are answered as any
 * handle's). Call after wfs_openmode_adopt() has adopted every writer. Returns 1 when the inode took
 * @backing_id as its own now (the caller counts the inode as one user of that id, which
 * fs->kernel.backing_close() gives back at its last passthrough release), 0 when it had it already
 * (another handle of the same id, or an adopted passthrough writer's version), -EBUSY (the inode is
 * held in another mode or on another backing file: a record left half-written by a death), -ENOENT,
 * -ENOMEM, -errno of the catalog.
 */
int wfs_openmode_adopt_reader(struct wfs_fs *fs, uint64_t ino, int backing_id, struct wfs_handle **h);

/*
 * (L) The open reply that gives the kernel adopted handle @h (wfs_openmode_adopt()) as if it were
 * opened now: a resent open whose handle the dead server made and never answered (takeover.h).
 */
void wfs_openmode_adopted_reply(const struct wfs_fs *fs, const struct wfs_handle *h, struct wfs_open_reply *r);

/* At exit: free every handle still open (the kernel sends no release for them at unmount). */
void wfs_handles_release(struct wfs_fs *fs);

#endif
