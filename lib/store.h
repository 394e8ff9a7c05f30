/* SPDX-License-Identifier: Apache-2.0 */
/*
 * store — the object store on the backing filesystem.
 *
 * Layout of a store directory STORE:
 *   STORE/objects/ab/<30 hex>   one immutable, read-only (0444) file per distinct content, named by the
 *                               XXH3-128 digest of its bytes (see digest.h); `xxhsum -H2` on an object
 *                               prints its own name.
 *   STORE/tmp/                  files being written (O_TMPFILE where the filesystem has it, so a crash
 *                               leaves nothing behind; named leftovers are removed by wfs_store_open()).
 *   STORE/quarantine/<32 hex>   objects whose bytes no longer hash to their name, moved aside for
 *                               inspection; writing the same content again stores a good copy.
 *   STORE/catalog.db            the namespace (catalog.h); not touched by this module.
 *   STORE/catalog.db.backup     a whole copy of it (wfs_catalog_backup), for fsck --repair.
 *   STORE/lock                  flock()ed by the one process that owns the store read-write, which
 *                               writes its pid and what it does there (a daemon: its mount point),
 *                               and empties it at its wfs_store_close(): left filled, it names an
 *                               owner that was killed or crashed (wfs_store_unclean()).
 *
 * A store is private to its owner: a new one is made 0700 (its subdirectories 0700 too), so other
 * users reach its objects only through a mount, under each file's own mode. A store is laid out only
 * in a missing or empty directory (lost+found aside), or with WFS_STORE_INIT: a wrong or swapped path
 * must not turn a directory that holds other things into a store.
 *
 * Publishing (wfs_store_publish) runs in this order, so an object is durable before anything can
 * reference it:  bytes written to a tmp file → digest → fdatasync → fchmod 0444 → link() into
 * objects/ (EEXIST: the content is already stored, the tmp file is dropped) → fsync of the object's
 * directory. Only then may the caller commit a catalog transaction that points a name at the object.
 *
 * Invariants:
 *  1. An object file's bytes hash to its name. Nothing in this module ever opens one for writing.
 *  2. A file appears under objects/ only complete (link() of a finished file is atomic).
 *
 * Thread-safety: after wfs_store_open() returns, all functions may be called from any thread.
 */
#ifndef WFS_STORE_H
#define WFS_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "digest.h"

struct wfs_store;

enum wfs_store_flags {
	WFS_STORE_CREATE = 1 << 0,   /* lay out a store in a missing or empty directory (made 0700) */
	WFS_STORE_NOSYNC = 1 << 1,   /* skip fdatasync/fsync when publishing (tests, scratch stores) */
	WFS_STORE_READONLY = 1 << 2, /* inspection only: no lock taken, tmp/ not cleaned, no publishing */
	WFS_STORE_INIT = 1 << 3,     /* CREATE, also in a directory that holds other files (an
					explicit `weightfsctl init`) */
};

/*
 * Open the store at @path. Unless WFS_STORE_READONLY, takes an exclusive flock on STORE/lock (waiting
 * up to 5 s for a process that is letting go of it, such as a daemon just unmounted; not at all for a
 * daemon that serves a mount of the store: WFS_STORE_MOUNTED_ON), records the caller's pid there, and
 * removes leftovers in STORE/tmp/. With WFS_STORE_CREATE, a missing directory (its parent must
 * exist) is made 0700 and an empty one is chmod()ed 0700 before the layout is made; a store keeps its
 * mode. On success *@out owns the store; free it with wfs_store_close().
 * Errors: -ENOENT (no store there and no WFS_STORE_CREATE, or a missing parent), -ENOTDIR,
 * -ENOTEMPTY (WFS_STORE_CREATE on a directory that holds files but no store; WFS_STORE_INIT lays it
 * out anyway), -ENODEV (WFS_STORE_CREATE of a new store where the fstab mounts a filesystem that is
 * not mounted now: wfs_mounts_fstab_absent(); WFS_STORE_INIT lays it out anyway), -EBUSY (another process holds the store: wfs_store_owner() says which), -ENOMEM, or
 * the -errno of a failed mkdir/open/chmod (-EACCES, -EROFS, ...).
 */
int wfs_store_open(const char *path, unsigned flags, struct wfs_store **out);
/*
 * Open the store at @path whose STORE/lock the caller inherited, flock()ed, as descriptor @lock_fd
 * (a daemon started from another binary by the mount's holder, fs/upgrade.h). As wfs_store_open()
 * with @flags (WFS_STORE_NOSYNC only), except that the lock is not taken anew (@lock_fd must be this
 * store's STORE/lock, same st_dev and st_ino, and its flock must be held), STORE/tmp/ is not
 * emptied (the files of writers still open live there) and the last owner's mark is not read (the
 * store is in use, not left). On success the store owns @lock_fd; on failure the caller still does.
 * Errors: as wfs_store_open(), and -EBADF when @lock_fd is not this store's lock.
 */
int wfs_store_open_inherited(const char *path, unsigned flags, int lock_fd, struct wfs_store **out);
void wfs_store_close(struct wfs_store *s);
/* STORE/lock's descriptor, flock()ed by this process's open file description; -1 when read-only. */
int wfs_store_lock_fd(const struct wfs_store *s);

/*
 * What a daemon records (wfs_store_set_owner) before its mount point, resolved: "mounted on MNT".
 * wfs_store_open() fails at once with -EBUSY when the owner that recorded it is alive and MNT is a
 * weightfs mount of the store in this mount namespace; it waits for any other owner (a daemon just
 * unmounted or lazily detached, one in another mount namespace, a holder between two servers).
 */
#define WFS_STORE_MOUNTED_ON "mounted on "
/*
 * Record in STORE/lock, next to the pid of the calling process (call it again after a fork), what the
 * owner does with the store: @what, one line (a daemon: WFS_STORE_MOUNTED_ON and its mount point), or
 * NULL. A hint for wfs_store_owner(); failures are ignored. No-op on a read-only store.
 */
void wfs_store_set_owner(struct wfs_store *s, const char *what);
/*
 * Who holds the store at @path read-write, as recorded by its holder: *@pid, and its one line into
 * @what (@what_bytes bytes, NUL-terminated, "" when none; @what may be NULL when @what_bytes is 0).
 * Takes no lock: call it after wfs_store_open() returned -EBUSY. Returns 0, -ENOENT (nothing recorded,
 * or the recorded process is gone: the lock is held by something that wrote no pid), or -errno.
 */
int wfs_store_owner(const char *path, int *pid, char *what, size_t what_bytes);

/*
 * Did the store's last read-write owner end without wfs_store_close() (SIGKILL, the OOM killer, a
 * crash, the machine going down)? wfs_store_open() reads STORE/lock before it records the caller.
 * Returns true with the pid that owner recorded in *@pid and its recorded line in @what (@what_bytes
 * bytes, NUL-terminated, "" when none; a daemon's "mounted on MNT"; @what may be NULL when
 * @what_bytes is 0); false when it closed the store, and for a new store. A WFS_STORE_READONLY open
 * reads the mark too, unless a process holds the store at that moment (then false: it is in use, not
 * left). Stores written before this check existed were never emptied: their first open says true
 * once.
 */
bool wfs_store_unclean(const struct wfs_store *s, int *pid, char *what, size_t what_bytes);

/*
 * The store that would hold a store made at @path (which need not exist; its parent must): the
 * nearest directory above @path, links resolved, that holds a catalog.db, into @store (PATH_MAX
 * bytes). That store's gc and fsck would take the inner store's files for their own, so weightfs and
 * weightfsctl init refuse such a path. Returns false when there is none, or when @path cannot be
 * resolved (the caller's own open reports that).
 */
bool wfs_store_enclosing(const char *path, char *store);

/*
 * Does a new store at @path (a missing or empty directory) belong on a disk that is absent? -ENODEV
 * when the fstab mounts a filesystem at or above @path that is not mounted now
 * (wfs_mounts_fstab_absent(), lib/mounts.h): its mount point into @dir and its source into @source
 * (PATH_MAX bytes each; either may be NULL). A store made there would land on the filesystem below,
 * where trainers fill the wrong disk and the real store's files look gone: wfs_store_open() refuses
 * to make one (WFS_STORE_CREATE), an explicit WFS_STORE_INIT makes it. 0 otherwise, also when it
 * cannot be told (@path and its parent unresolvable, no fstab, out of memory).
 */
int wfs_store_disk_absent(const char *path, char *dir, char *source);

/*
 * After wfs_store_open() of @path failed with -ENOENT: is it because the directory that would hold
 * the store does not exist (the store is made in an existing parent, never with its parents)? Then
 * that parent, as given (trailing slashes of @path dropped), goes into @parent (PATH_MAX bytes).
 */
bool wfs_store_parent_missing(const char *path, char *parent);

/*
 * Undo the making of a store at @path that the caller made a moment ago (wfs_store_open with
 * WFS_STORE_CREATE on a missing directory) and then could not use (a mount that failed): after
 * wfs_store_close(), its own files (catalog.db and its WAL, shared memory, reserve and backup, lock,
 * weightfs.log) and empty objects/ and tmp/ go, then the directory if nothing else is left. An
 * object or any other file keeps its directory and the store as it is. Best effort: nothing returned.
 */
void wfs_store_unmake(const char *path);

/* The path given to wfs_store_open(); owned by the store. */
const char *wfs_store_path(const struct wfs_store *s);
/*
 * fstat(2) of the store directory as it was opened (a path mounted over since does not change it)
 * into *@st: its st_dev and st_ino identify the store to processes that reach it by another path or
 * from another mount namespace (lib/mounts.h). Returns 0 or -errno of fstat.
 */
int wfs_store_stat(const struct wfs_store *s, struct stat *st);

/* A file being written; becomes an object through wfs_store_publish(). */
struct wfs_tmpfile {
	int fd;        /* O_RDWR; owned by the tmpfile until wfs_store_tmp_discard()/publish */
	char name[32]; /* name under STORE/tmp/, or "" for an anonymous O_TMPFILE */
	bool keep_name; /* a publish closes @fd but leaves @name for the caller's discard: a successor
			 * may still adopt it until the publish is recorded (fs/core/keep.h) */
};

/* Create an empty tmp file. Returns 0, or -errno (-ENOSPC, -EMFILE, -EIO, ...). */
int wfs_store_tmp_create(struct wfs_store *s, struct wfs_tmpfile *t);
/*
 * A tmp file with a name under STORE/tmp (t->name), that another process of the store's owner can
 * open by it (a successor that adopts a writer: fs/core/keep.h). It stays until the tmp file is
 * discarded or published, or the store is opened again. Returns 0, or -errno (-EROFS, -ENOSPC, ...).
 */
int wfs_store_tmp_create_named(struct wfs_store *s, struct wfs_tmpfile *t);
/*
 * Open tmp file STORE/tmp/@name (made by wfs_store_tmp_create_named()) into @t, read-write, for a
 * process other than its maker. Returns 0, or -ENOENT, -errno.
 */
int wfs_store_tmp_open(struct wfs_store *s, const char *name, struct wfs_tmpfile *t);
/*
 * Remove every file in STORE/tmp but those @keep says true for (a successor under a holder keeps
 * the tmp files of the versions it adopted; the others are leftovers of its dead predecessor).
 * Errors are ignored: what stays is removed at the next open of the store.
 */
void wfs_store_tmp_sweep(struct wfs_store *s, bool (*keep)(const char *name, void *arg), void *arg);
/* Close and remove a tmp file that will not be published. Safe on t->fd == -1. */
void wfs_store_tmp_discard(struct wfs_store *s, struct wfs_tmpfile *t);

/*
 * Publish the tmp file @t, whose bytes hash to @digest, as an object. Always consumes @t (its fd is
 * closed and its name removed, success or not). *@existed is set to true when an object with that
 * digest was already stored (the new bytes are dropped). @durable: fdatasync the bytes before the
 * link and fsync the directory after it (unless the store is WFS_STORE_NOSYNC); without it the
 * caller makes the object durable later, with wfs_store_sync(), before anything that refers to it
 * is synced. Returns 0, or -errno from fdatasync/link/fsync
 * (-ENOSPC, -EIO, -EDQUOT, ...): then the caller must not reference the object. When only the final
 * directory fsync failed, the complete object stays linked (removing it could pull it from under a
 * concurrent publisher that found it stored); with no catalog row it is an orphan for fsck/gc.
 */
int wfs_store_publish(struct wfs_store *s, struct wfs_tmpfile *t, const struct wfs_digest *digest,
		      bool durable, bool *existed);
/*
 * Make every object published so far durable, with its link and directory: syncfs(2) of the store's
 * filesystem (one flush for a group of objects published without @durable; it writes back the
 * filesystem's other dirty data too). Returns 0, or -EIO/-ENOSPC (a writeback error since the last
 * call, syncfs(2) since Linux 5.8), -EROFS on a read-only store.
 */
int wfs_store_sync(struct wfs_store *s);

/*
 * Open object @d for reading (O_RDONLY | O_CLOEXEC | @extra_flags, e.g. O_DIRECT). Returns a descriptor
 * the caller owns, or -ENOENT (not stored), or another -errno.
 */
int wfs_store_object_open(struct wfs_store *s, const struct wfs_digest *d, int extra_flags);
/*
 * Make object @d durable by itself: fdatasync(2) of its file, then fsync(2) of its objects/ab
 * directory (its link). What syncfs(2) of the store (wfs_store_sync) does for every object at once,
 * without writing back the rest of the filesystem's dirty pages. Returns 0 (also with
 * WFS_STORE_NOSYNC), -ENOENT, or the -errno of open/fdatasync/fsync (-EIO).
 */
int wfs_store_object_sync(struct wfs_store *s, const struct wfs_digest *d);
/* Whether object @d is stored (its name exists under objects/). */
bool wfs_store_object_exists(struct wfs_store *s, const struct wfs_digest *d);
/* stat(2) of object @d. Returns 0, -ENOENT, or -errno. */
int wfs_store_object_stat(struct wfs_store *s, const struct wfs_digest *d, struct stat *st);
/* Remove object @d (its name; readers that have it open keep their bytes). Returns 0, -ENOENT, -errno. */
int wfs_store_object_remove(struct wfs_store *s, const struct wfs_digest *d);
/*
 * wfs_store_object_remove(), with the filesystem's work left for later: the name goes at once, and
 * the space is freed when the caller closes the returned descriptor (an O_PATH one the caller owns).
 * Freeing a large file's extents is work that grows with the file: a daemon removes under its lock
 * and closes after dropping it. Returns the descriptor,
 * or -ENOENT, -EROFS, another -errno (then nothing was removed).
 */
int wfs_store_object_unlink_open(struct wfs_store *s, const struct wfs_digest *d);
/*
 * Move object @d out of objects/ into STORE/quarantine/<hex> (replacing an earlier quarantined copy).
 * Returns 0, -ENOENT (not stored), or -errno.
 */
int wfs_store_object_quarantine(struct wfs_store *s, const struct wfs_digest *d);
/*
 * The files of STORE/quarantine/ (damaged copies kept for inspection): counted into *@files and
 * *@bytes (st_size), and removed unless @dry_run (with it, the count alone: what stat reports, on a
 * read-only store too; a copy stays on disk after its content was written again, until removed).
 * Their names stay broken (EIO) until the content is
 * written again, as before; only the inspection copies go. Returns 0 (also when there is no
 * quarantine/), -EROFS (a read-only store, unless @dry_run), or -errno of reading or unlinking.
 */
int wfs_store_quarantine_clear(struct wfs_store *s, bool dry_run, uint64_t *files, uint64_t *bytes);
/* Path of object @d relative to STORE/objects/ ("ab/<30 hex>"), into @buf (at least 34 bytes). */
void wfs_store_object_name(const struct wfs_digest *d, char buf[34]);

/*
 * One entry of STORE/objects as wfs_store_walk() finds it. An object is a regular file
 * objects/ab/<30 hex digits> whose 32 lower-case hex digits (ab first) are its digest. Anything else
 * there is a stray: a top-level entry that is not a two-character directory (@sub is its name,
 * @name ""), or an entry of one whose name is not the rest of a digest or that is not a regular file.
 */
struct wfs_store_entry {
	const char *sub;          /* the entry of objects/ ("ab"); valid during the call only */
	const char *name;         /* the entry of objects/@sub ("" for a top-level stray) */
	bool object;              /* a regular file named by its digest: @digest and @st are set */
	struct wfs_digest digest; /* (object) */
	struct stat st;           /* (object) fstatat(AT_SYMLINK_NOFOLLOW) of the file */
};
/*
 * Call @fn(@ctx, entry) for every entry of STORE/objects and of its subdirectories, in directory
 * order; a nonzero return from @fn stops the walk and is returned. A two-character subdirectory that
 * cannot be read is skipped. Does not change the store. Returns 0, -errno of opening objects/, or
 * @fn's value.
 */
int wfs_store_walk(struct wfs_store *s, int (*fn)(void *ctx, const struct wfs_store_entry *e), void *ctx);

/* statvfs(2) of the filesystem holding the store. Returns 0 or -errno. */
int wfs_store_statfs(struct wfs_store *s, struct statvfs *st);

#endif
