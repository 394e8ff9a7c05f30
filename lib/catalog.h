/* SPDX-License-Identifier: Apache-2.0 */
/*
 * catalog — the namespace and object metadata of a store, in SQLite (STORE/catalog.db, WAL mode).
 *
 * Identifier spaces:
 *   ino     inode number, 1 = root (FUSE_ROOT_ID). Never reused (AUTOINCREMENT), so inode numbers are
 *           stable across remounts and a stale kernel reference can never alias a new file.
 *   dentry  (parent ino, name) → ino, with a 64-bit id that orders readdir and serves as its cookie.
 *   digest  an object's XXH3-128 digest (digest.h); the object's bytes live in the store (store.h).
 *
 * Tables: inodes (attributes, object digest of a sealed regular file, symlink target), dentries,
 * xattrs (ino, name) → value, objects (digest, bytes, refcount).
 *
 * Invariants (kept by this module, in the same transaction as the change that affects them):
 *  1. objects.refcount = number of inode rows whose digest is that object. SQL triggers maintain it,
 *     so no code path can forget it.
 *  2. A regular file's digest changes only in wfs_catalog_set_content() (or is set at its creation,
 *     wfs_catalog_create_sealed()): from the catalog's point of view a file is either sealed (digest
 *     set, size = object bytes) or being created (digest NULL).
 *     Inodes still being created when the daemon died are removed by wfs_catalog_recover().
 *  3. inodes.nlink counts dentries (plus 2 + subdirectories for a directory). An inode with nlink 0
 *     lives on only while the kernel or an open file still refers to it; the daemon then calls
 *     wfs_catalog_inode_drop(). wfs_catalog_recover() drops those left over by a crash.
 *
 * Errors: every function returns 0 or a negative errno. SQLite results map to errno at this edge:
 * SQLITE_FULL → -ENOSPC, SQLITE_IOERR/CORRUPT → -EIO, SQLITE_NOMEM → -ENOMEM, SQLITE_BUSY/LOCKED →
 * -EBUSY, SQLITE_READONLY → -EROFS; the SQLite message is logged once per failure.
 *
 * A full filesystem: a read-write handle keeps 8 MiB allocated in catalog.db-reserve while there is
 * room. wfs_catalog_unlink(), _unlink_unsealed(), _rename(), _xattr_remove(), _inode_drop() and
 * _object_delete() — what an operator runs to make room — try once more when their commit fails
 * with -ENOSPC, so they work on a filesystem with 0 bytes free: after a checkpoint of the WAL
 * (wfs_catalog_checkpoint) that copies every frame, so that the retry reuses the WAL's blocks, or
 * else with the reserve released (and the checkpoint tried again in its room). A long run of them
 * goes on as long as the WAL can be checkpointed, whichever thread's checkpoints fall behind.
 *
 * Thread-safety: a catalog handle is used by one thread at a time (the daemon serialises namespace
 * operations under its own lock). Out parameters are written only on success.
 */
#ifndef WFS_CATALOG_H
#define WFS_CATALOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "digest.h"

#define WFS_ROOT_INO 1

struct wfs_catalog;

/* Attributes of an inode, as stored. Sizes in bytes, times as struct timespec (ns resolution). */
struct wfs_attr {
	uint64_t ino;
	uint32_t mode; /* S_IFMT type bits | permission bits */
	uint32_t uid, gid;
	uint32_t nlink;
	uint64_t size;   /* regular file: object bytes; symlink: target length; directory: 0 */
	uint64_t parent; /* directory: its parent's ino (root: itself); otherwise 0 */
	struct timespec atime, mtime, ctime;
	bool sealed;              /* regular file whose bytes are object @digest */
	struct wfs_digest digest; /* valid when @sealed */
	uint64_t rdev;            /* character or block device: its device number (makedev()); else 0 */
};

enum wfs_catalog_flags {
	WFS_CATALOG_CREATE = 1 << 0,   /* create the database and the root directory when missing */
	/* open read-only (inspection tools, next to a running daemon), making no file: a missing
	 * catalog is -ENOENT before SQLite is asked; one without a "-wal" beside it (no writer has it
	 * open) is opened immutable, so no -wal or -shm is made; one with a "-wal" (a daemon serving
	 * it, or one killed) is read with that WAL. A schema-1 catalog is still upgraded in place. */
	WFS_CATALOG_READONLY = 1 << 1,
};

/*
 * Open (and with WFS_CATALOG_CREATE create) the catalog at @path. The root directory is created
 * owned by @root_uid/@root_gid with mode 0755. Returns 0 with *@out owning the handle, or -ENOENT,
 * -EIO (not a weightfs catalog, or a newer schema), -ENOMEM, -EACCES, ...
 */
int wfs_catalog_open(const char *path, unsigned flags, uint32_t root_uid, uint32_t root_gid,
		     struct wfs_catalog **out);
void wfs_catalog_close(struct wfs_catalog *c);
/*
 * Backups: a copy of the catalog kept beside it (WFS_STORE_CATALOG_BACKUP), so that a damaged
 * catalog can be rebuilt (weightfsctl fsck --repair) with the names as they were at the copy.
 *
 * wfs_catalog_backup: copy what is committed in @c's database (the open batch is not) into @dest
 * with SQLite's online backup API, from a read connection of its own (so any thread may call it
 * beside the handle's other calls: a daemon runs it without its lock), into "@dest.tmp", then
 * fsync (with @durable), SQLite's quick_check of the copy, and rename(2) over @dest: @dest is always a
 * whole copy that passed the check (a damaged catalog never replaces a good backup: -EIO). Returns
 * 0, -ENOSPC, -EIO, -EBUSY, -ENOMEM, or the -errno of open/fsync/rename.
 */
int wfs_catalog_backup(struct wfs_catalog *c, const char *dest, bool durable);
/*
 * The database file at @c's path is not the one @c has open (removed or replaced while in use, by
 * hand): write what @c has committed (the open batch is not) to the path again, from @c's own
 * connection (SQLite's backup API, rollback journal mode, synced), and log it. Call with no other
 * use of @c, before wfs_catalog_close() (which then checkpoints into the removed file and deletes the
 * WAL, the removed file's). Returns 0 (the file is @c's), 1 (written again), or -errno (logged).
 */
int wfs_catalog_rescue(struct wfs_catalog *c);
/*
 * Replace the catalog at @path (damaged: no handle may be open on it) with the backup @backup.
 * @backup is checked first (wfs_catalog_diagnose). Then @path, @path-wal and @path-shm are renamed
 * aside, kept for inspection, as "@path.damaged-<unix seconds>" (with the same suffixes; that name
 * into @aside, PATH_MAX bytes), and the backup is copied to @path (SQLite's backup API) and synced.
 * Returns 0, -ENOENT (no backup), -EIO (the backup is damaged too: nothing changed), or the -errno
 * of a rename or of SQLite.
 */
int wfs_catalog_restore(const char *backup, const char *path, char *aside);

/*
 * Is the catalog at @path damaged? Opens it read-only on a connection of its own (no handle needed:
 * for when wfs_catalog_open() itself fails) and runs SQLite's quick_check. Returns 0 (intact; @what
 * "ok"), 1 (damaged: SQLite's first complaint, e.g. "database disk image is malformed", into @what,
 * @what_bytes bytes, NUL-terminated), or -ENOENT (no such file), -EACCES, -EBUSY, -ENOMEM (cannot
 * tell).
 */
int wfs_catalog_diagnose(const char *path, char *what, size_t what_bytes);

/* What wfs_catalog_recover() removed. */
struct wfs_recovery {
	uint64_t unsealed_removed; /* names of files that were still being created */
	uint64_t orphans_removed;  /* other inodes with no name left (unlinked while open) */
	uint64_t declared_empty_removed; /* temporary names sealed empty that declare bytes (below) */
};
/*
 * Crash recovery at mount: enforce invariants 2 and 3, and remove the temporary names of the
 * tensor-file protocol (WFS_TMP_PREFIX, lib/tensorfile.h) that are sealed with no bytes while their
 * dtype × shape declare some (wfs_catalog_declared_bytes): a large tensor's name is closed empty
 * after its attributes are set and reopened for writing, so a daemon killed during the write left
 * one (never a finished tensor: those are renamed after a seal with their bytes). Other names that
 * declare bytes and hold none are left: a placeholder may be meant. One transaction. Returns 0 or
 * -errno.
 */
int wfs_catalog_recover(struct wfs_catalog *c, struct wfs_recovery *report);
/*
 * Recovery for a successor that takes a live mount over from a server that died (docs/design.md,
 * "Takeover"): the names of regular files never sealed go, as at a mount (invariant 2: the bytes
 * their writers sent died with that server), into *@unsealed_removed; inodes without a name stay
 * (the kernel may still hold them: the next mount's wfs_catalog_recover() drops them). New inodes
 * are numbered above @ino_floor and above every inode the catalog has, since the dead server may
 * have told the kernel numbers whose creation it never committed; *@held_max gets the larger of
 * the two: the highest number the kernel may hold. The @nkeep inodes at @keep keep their names:
 * their versions being written are adopted (fs/core/keep.h). One transaction. Returns 0, -ENOMEM
 * or -errno.
 */
int wfs_catalog_takeover(struct wfs_catalog *c, uint64_t ino_floor, const uint64_t *keep, size_t nkeep,
			 uint64_t *unsealed_removed,
			 uint64_t *held_max);

int wfs_catalog_getattr(struct wfs_catalog *c, uint64_t ino, struct wfs_attr *out);
/* Look @name up in directory @parent. -ENOENT, -ENOTDIR. */
int wfs_catalog_lookup(struct wfs_catalog *c, uint64_t parent, const char *name, struct wfs_attr *out);

/*
 * Create @name in @parent with type and permissions @mode (S_IFREG, S_IFDIR or S_IFLNK), owner
 * @uid/@gid, all times now. Symlinks take their @target (NUL-terminated; NULL otherwise). A regular
 * file starts unsealed (invariant 2). Errors: -EEXIST, -ENOENT (@parent gone), -ENOTDIR, -EINVAL.
 */
int wfs_catalog_create(struct wfs_catalog *c, uint64_t parent, const char *name, uint32_t mode,
		       uint32_t uid, uint32_t gid, const char *target, struct wfs_attr *out);
/*
 * wfs_catalog_create() for every file type (that one refuses the others with -EINVAL, as it always
 * has): @mode may also be S_IFIFO, S_IFSOCK, S_IFCHR or S_IFBLK.
 * These special files are names and attributes only — no object, no digest, size 0, never "unsealed"
 * (recover, check and gc leave them be); the kernel gives them their semantics. @rdev is the device
 * number of a character or block device (makedev()), 0 for every other type (else -EINVAL).
 * Errors as wfs_catalog_create().
 */
int wfs_catalog_mknod(struct wfs_catalog *c, uint64_t parent, const char *name, uint32_t mode,
		      uint64_t rdev, uint32_t uid, uint32_t gid, const char *target, struct wfs_attr *out);
/* A stored attribute for wfs_catalog_create_sealed(): @name NUL-terminated, @value @len bytes. */
struct wfs_catalog_xattr {
	const char *name;
	const void *value;
	size_t len;
};
/*
 * A new regular file @name in @parent that is sealed from the start: what wfs_catalog_create(),
 * wfs_catalog_xattr_set() for each of @xattrs (@nxattrs of them) and wfs_catalog_set_content() do,
 * in one transaction (one savepoint in a batch) and about a third of their statements. For digest
 * claims of new names (user.weightfs.claims): invariant 2 holds, since no one ever sees the file
 * unsealed. Owner @uid/@gid, permissions @mode (must be S_IFREG), all times now; the object row of
 * @digest (@size bytes) is added if new, its file must already be in the store. *@out gets the new
 * inode's attributes. Errors: -EEXIST (@name exists), -ENOENT (@parent gone), -ENOTDIR, -EINVAL
 * (not S_IFREG, an attribute named twice), -ENOSPC, -EIO.
 */
int wfs_catalog_create_sealed(struct wfs_catalog *c, uint64_t parent, const char *name, uint32_t mode,
			      uint32_t uid, uint32_t gid, const struct wfs_digest *digest, uint64_t size,
			      const struct wfs_catalog_xattr *xattrs, size_t nxattrs, struct wfs_attr *out);
/* Hard link: new dentry @newparent/@newname → @ino (not a directory). -EEXIST, -EPERM, -ENOENT. */
int wfs_catalog_link(struct wfs_catalog *c, uint64_t ino, uint64_t newparent, const char *newname,
		     struct wfs_attr *out);
/*
 * Remove dentry @parent/@name. @dir selects rmdir semantics (-ENOTDIR if not a directory, -ENOTEMPTY)
 * versus unlink (-EISDIR). Decrements nlink; *@ino gets the inode it named, so the caller can drop it
 * once unreferenced (invariant 3).
 */
int wfs_catalog_unlink(struct wfs_catalog *c, uint64_t parent, const char *name, bool dir,
		       uint64_t *ino);
/*
 * Remove every name of regular file @ino if it was never sealed — its writer was killed, or its first
 * seal failed — so that nothing a restarted writer can see is broken: what wfs_catalog_recover() does
 * at the next mount, for one inode, now. One transaction. After the commit, @fn (may be NULL) gets
 * each removed (parent ino, name) so the caller can tell the kernel; the name is valid only during the
 * call. The inode itself stays (nlink 0) for wfs_catalog_inode_drop() once nothing refers to it.
 * With @empty_too, also when @ino is sealed with no bytes (a tensor file made and declared, whose
 * writer was killed before its bytes were sealed: the caller decides that). Returns 0 — also when
 * @ino is sealed (with bytes, or at all without @empty_too), not a regular file, or gone (nothing
 * changes) — or -ENOMEM, or an -errno of the catalog (nothing changed).
 */
typedef void (*wfs_catalog_name_fn)(void *ctx, uint64_t parent, const char *name);
int wfs_catalog_unlink_unsealed(struct wfs_catalog *c, uint64_t ino, bool empty_too, wfs_catalog_name_fn fn,
				void *ctx);
/*
 * Each name (dentry) of inode @ino to @fn as (parent ino, name), the name valid only during the call;
 * none when it has no name (unlinked, or no such inode). A read, no transaction of its own. Returns
 * 0, -ENOMEM (some names may have been given), or an -errno of the catalog.
 */
int wfs_catalog_names(struct wfs_catalog *c, uint64_t ino, wfs_catalog_name_fn fn, void *ctx);
/*
 * Give the names of regular file @ino (all its hard links together) a new inode: same attributes
 * (ctime now) and link count, xattrs and content (the refcount of its object grows by one), a new
 * inode number. @ino keeps its row with nlink 0, for the readers that still have it open, until
 * wfs_catalog_inode_drop(). This is how a writer opens a file that readers hold: they keep the old
 * inode and its bytes, the names move on, still one inode between them. One transaction. *@out gets
 * the new inode's attributes; after the commit @fn (may be NULL) gets each name's (parent ino, name),
 * valid during the call. Errors: -EINVAL (not a regular file), -ENOENT (no such inode, or no name
 * left: unlinked while open), -ENOMEM, or an -errno of the catalog (nothing changed).
 */
int wfs_catalog_inode_replace(struct wfs_catalog *c, uint64_t ino, wfs_catalog_name_fn fn, void *ctx,
			      struct wfs_attr *out);
/*
 * rename(2) / renameat2(2) with @flags RENAME_NOREPLACE or RENAME_EXCHANGE (other flags: -EINVAL).
 * When a name was replaced, *@replaced gets its inode (nlink already decremented), else 0.
 * Errors: -ENOENT, -EEXIST (NOREPLACE), -ENOTDIR, -EISDIR, -ENOTEMPTY, -EINVAL (directory into its
 * own subtree).
 */
int wfs_catalog_rename(struct wfs_catalog *c, uint64_t parent, const char *name, uint64_t newparent,
		       const char *newname, unsigned flags, uint64_t *replaced);

enum wfs_attr_valid {
	WFS_ATTR_MODE = 1 << 0, /* permission bits only; the type never changes */
	WFS_ATTR_UID = 1 << 1,
	WFS_ATTR_GID = 1 << 2,
	WFS_ATTR_ATIME = 1 << 3,
	WFS_ATTR_MTIME = 1 << 4,
	WFS_ATTR_CTIME = 1 << 5,
};
/* Change the attributes named in @valid to those in @in; ctime becomes now unless given. */
int wfs_catalog_setattr(struct wfs_catalog *c, uint64_t ino, const struct wfs_attr *in,
			unsigned valid, struct wfs_attr *out);

/* wfs_catalog_set_content()'s @flags. */
enum wfs_content_flags {
	WFS_CONTENT_DURABLE = 1 << 0,  /* the commit is synced to disk before returning */
	WFS_CONTENT_DECLARED = 1 << 1, /* a new object row starts as WFS_OBJECT_DECLARED (its bytes were
					* published on their writer's declared digest, unread) */
};
/*
 * Seal: point regular file @ino at object @digest of @size bytes (adding the object row if new, or
 * making a quarantined row OK again: the object file is published again), set mtime to @mtime (what
 * the writer set with utimes(2), else the seal's time) and ctime to @changed (the time of the bytes'
 * last change), or to the name's ctime where that is later, or to now when @changed is NULL. @flags:
 * enum wfs_content_flags. The object file must already be published (store.h). *@old gets the previous
 * content, if any (old->sealed false otherwise) so the caller can release it; *@out the attributes
 * after (@out may be NULL: not read back). -ENOENT, -EISDIR, -ENOSPC, -EIO.
 */
int wfs_catalog_set_content(struct wfs_catalog *c, uint64_t ino, const struct wfs_digest *digest,
			    uint64_t size, const struct timespec *mtime, const struct timespec *changed,
			    unsigned flags, struct wfs_attr *old, struct wfs_attr *out);

/* Target of symlink @ino into @buf (NUL-terminated, truncated to @size - 1). -EINVAL if not a link. */
int wfs_catalog_readlink(struct wfs_catalog *c, uint64_t ino, char *buf, size_t size);

/*
 * Directory entries of @dir after @cookie (0 = from the start), in a stable order, with their
 * attributes. @fn gets each entry and the cookie to resume after it, and returns non-zero to stop.
 * "." and ".." are not included. -ENOTDIR, -ENOENT.
 */
typedef int (*wfs_catalog_dirent_fn)(void *ctx, const char *name, const struct wfs_attr *attr,
				     uint64_t next_cookie);
int wfs_catalog_readdir(struct wfs_catalog *c, uint64_t dir, uint64_t cookie, wfs_catalog_dirent_fn fn,
			void *ctx);

/*
 * Extended attributes. get: copies the value into @buf when @size >= its length, writes the length to
 * *@len; -ENODATA when absent, -ERANGE when @size is too small (and non-zero). set: @flags 0,
 * XATTR_CREATE (-EEXIST) or XATTR_REPLACE (-ENODATA). list: NUL-separated names, same size protocol.
 */
int wfs_catalog_xattr_get(struct wfs_catalog *c, uint64_t ino, const char *name, void *buf,
			  size_t size, size_t *len);
int wfs_catalog_xattr_set(struct wfs_catalog *c, uint64_t ino, const char *name, const void *value,
			  size_t len, int flags);
int wfs_catalog_xattr_list(struct wfs_catalog *c, uint64_t ino, char *buf, size_t size, size_t *len);
int wfs_catalog_xattr_remove(struct wfs_catalog *c, uint64_t ino, const char *name);

/*
 * Delete inode @ino, which must have nlink 0 (-EBUSY otherwise), with its xattrs. *@old gets its
 * attributes so the caller can release its object. -ENOENT when already gone.
 */
int wfs_catalog_inode_drop(struct wfs_catalog *c, uint64_t ino, struct wfs_attr *old);

/*
 * The bytes the user.weightfs.dtype and user.weightfs.shape attributes of @ino declare (elements ×
 * dtype bytes) into *@bytes. Returns 0, -ENODATA (either attribute missing, or one that does not
 * parse: lib/dtype.h), or another -errno of the catalog.
 */
int wfs_catalog_declared_bytes(struct wfs_catalog *c, uint64_t ino, uint64_t *bytes);

/* Reference count of object @d (invariant 1). -ENOENT if the catalog has no such object. */
int wfs_catalog_object_refcount(struct wfs_catalog *c, const struct wfs_digest *d, uint64_t *refcount);
/*
 * Reference count and size in bytes (@bytes may be NULL) of object @d. Returns 0, -ENOENT if not
 * cataloged, or another -errno of the catalog (SQLite error mapped as for every call here).
 */
int wfs_catalog_object_get(struct wfs_catalog *c, const struct wfs_digest *d, uint64_t *refcount,
			   uint64_t *bytes);
/*
 * The size in bytes of the largest cataloged object (0 for none): no content longer than that is
 * stored. One scan of the objects table; for the rare full store (seal.c). Returns 0 or -errno.
 */
int wfs_catalog_object_max_bytes(struct wfs_catalog *c, uint64_t *bytes);
/* Object states (objects.state). */
enum wfs_object_state {
	WFS_OBJECT_OK = 0,
	WFS_OBJECT_QUARANTINED = 1, /* its bytes did not match its digest; moved to STORE/quarantine */
	WFS_OBJECT_DECLARED = 2,    /* published on the digest its writer declared, not read since: the
				     * daemon checks it before any use, even with -o verify=none */
};
/* Set object @d's state. -ENOENT if the catalog has no such object. */
int wfs_catalog_object_set_state(struct wfs_catalog *c, const struct wfs_digest *d,
				 enum wfs_object_state state);
/*
 * Add object @d of @bytes bytes, whose file is in the store, as an unreferenced object (released
 * now): an object file found without a row after the catalog was rebuilt from a backup (its names,
 * made after the backup, are lost), kept for reuse within the retention budget. Returns 0 (also
 * when a row exists: nothing changes), or an -errno of the catalog.
 */
int wfs_catalog_object_adopt(struct wfs_catalog *c, const struct wfs_digest *d, uint64_t bytes);
/*
 * Forget object @d; only when unreferenced (-EBUSY otherwise). The caller removes the file after: in
 * a batch (wfs_catalog_batch) the batch is committed first, so a crash never leaves a row, or a name,
 * whose file is gone.
 */
int wfs_catalog_object_delete(struct wfs_catalog *c, const struct wfs_digest *d);
/*
 * Objects with refcount 0, least recently released first (for retention and cleanup): @fn gets each
 * digest and its bytes; non-zero return stops. Do not modify the catalog from @fn.
 */
int wfs_catalog_unreferenced(struct wfs_catalog *c,
			     int (*fn)(void *ctx, const struct wfs_digest *d, uint64_t bytes), void *ctx);

/*
 * Paths of names, for reports (fsck): a name's path is its dentries from the root joined by '/',
 * starting with '/' ("/rank0/model.embed.weight"), as the mount shows it below its mount point.
 * @fn gets each path (valid during the call), the directory that holds the name (its last
 * component) and the inode it names; a non-zero return stops (and
 * is returned). A name whose directory chain does not reach the root (a dangling dentry on the way,
 * which wfs_catalog_check() counts) is not told. Do not modify the catalog from @fn.
 */
typedef int (*wfs_catalog_path_fn)(void *ctx, const char *path, uint64_t parent, uint64_t ino);
/* Every name of every inode whose content is object @d. Returns 0, @fn's value, or -errno. */
int wfs_catalog_object_paths(struct wfs_catalog *c, const struct wfs_digest *d, wfs_catalog_path_fn fn,
			     void *ctx);
/* Every name that starts with @prefix (compared bytewise, e.g. WFS_TMP_PREFIX), in any directory.
 * Returns 0, @fn's value, or -errno. */
int wfs_catalog_prefixed_paths(struct wfs_catalog *c, const char *prefix, wfs_catalog_path_fn fn, void *ctx);
/* Every name of a regular file that was never sealed (no digest): being written, or a seal that
 * failed after close(2) returned (its reads are EIO). Returns 0, @fn's value, or -errno. */
int wfs_catalog_unsealed_paths(struct wfs_catalog *c, wfs_catalog_path_fn fn, void *ctx);

/* One row of the objects table. */
struct wfs_object_row {
	struct wfs_digest digest;
	uint64_t bytes;
	uint64_t refcount;
	int state;        /* enum wfs_object_state */
	int64_t released; /* unix seconds when the last reference went; 0 if never */
};
/* Every object row in digest order; @fn returns non-zero to stop. Do not modify the catalog from @fn. */
int wfs_catalog_objects(struct wfs_catalog *c, int (*fn)(void *ctx, const struct wfs_object_row *row),
			void *ctx);

/* What wfs_catalog_check() found (and, with repair, fixed). */
struct wfs_catalog_check {
	bool integrity_ok;            /* SQLite's PRAGMA integrity_check passed */
	uint64_t refcounts_wrong;     /* objects whose refcount differs from the inodes naming them */
	uint64_t digests_without_row; /* inodes naming an object the objects table lacks */
	uint64_t dangling_dentries;   /* dentries naming an inode that does not exist */
	uint64_t nlink_wrong;         /* non-directories whose nlink differs from their dentries */
	uint64_t unsealed;            /* regular files never sealed (removed at the next mount) */
};
/*
 * Check the catalog's own invariants (catalog.h, 1-3); with @repair, fix them in one transaction:
 * refcounts recomputed, missing object rows added (size from the inode), dangling dentries removed,
 * nlink recounted. Unsealed files are only counted. -EROFS when @repair on a read-only handle.
 */
int wfs_catalog_check(struct wfs_catalog *c, bool repair, struct wfs_catalog_check *out);

/*
 * The store's retention budget, in bytes: how much of the objects no name uses every mount of the
 * store keeps for reuse (beyond it, the least recently released go first; lib/gc.h). It belongs to
 * the store, not to one mount, so it is recorded here (meta 'retain_bytes'): set by `weightfsctl
 * init --retain`, `weightfsctl retain` and `weightfs -o retain=`, read by every mount (a plain
 * remount, mount(8), fstab, weightfsctl's private mounts). get: *@bytes is 0 when none was ever
 * recorded (a store made before the budget was recorded: its mounts keep nothing unless told).
 * set: one transaction (joins the open batch on a batching handle). Returns 0, -EROFS (set on a
 * read-only handle), or another -errno of the catalog (-EIO, -EBUSY, -ENOSPC).
 */
int wfs_catalog_retain_get(struct wfs_catalog *c, uint64_t *bytes);
int wfs_catalog_retain_set(struct wfs_catalog *c, uint64_t bytes);

/* Totals for the stat command. Bytes are logical file sizes or object sizes, not disk blocks. */
struct wfs_catalog_stats {
	uint64_t names;          /* dentries naming regular files */
	uint64_t directories;    /* directories, root included */
	uint64_t symlinks;
	uint64_t logical_bytes;  /* sum over names of their file size */
	uint64_t objects;        /* referenced objects */
	uint64_t object_bytes;   /* sum of referenced objects' sizes */
	uint64_t unreferenced_objects;
	uint64_t unreferenced_bytes;
	uint64_t quarantined_objects; /* state quarantined: their names fail with EIO until rewritten */
	uint64_t unsealed_files;      /* regular files being written (or left by a crash) */
	uint64_t special_files;       /* dentries naming FIFOs, sockets and device nodes */
};
int wfs_catalog_stats(struct wfs_catalog *c, struct wfs_catalog_stats *out);

/*
 * Make every commit so far durable without holding up the handle: fdatasync of the WAL
 * (catalog.db-wal), which holds every commit since the last checkpoint (SQLite syncs the WAL header
 * itself when it starts reusing the file). Safe to call from any thread, concurrently with the
 * handle's other calls (it uses a descriptor of its own), so a daemon can commit under its lock and
 * wait for the disk after dropping it: seals, fsync(2). A batching handle's open batch is not in the
 * WAL yet: wfs_catalog_commit() first. Returns 0, or -EIO (or another -errno of fdatasync); 0 on a
 * read-only handle.
 */
int wfs_catalog_wal_sync(struct wfs_catalog *c);

/*
 * Batched commits, for a daemon that serialises its calls (off by default). With @on, each call that
 * changes the catalog runs as a savepoint of one open transaction, and wfs_catalog_commit() ends it:
 * a thousand creates share one commit's locks and WAL frames instead of paying for a thousand. Each
 * call stays all-or-nothing (its savepoint alone is rolled back on error) and calls apply in order,
 * so a crash keeps a prefix of them; what was not committed is lost if the process dies (no
 * durability is lost: without a sync, a commit was never durable on power loss either). Other
 * connections see the last commit. While the reserve is spent (a full filesystem, see above), each
 * call commits at once, so ENOSPC still fails the call that meets it. @first_pending (may be NULL),
 * called under the caller's serialisation, is told when a batch gets its first change, and when a
 * call that committed alone left a checkpoint due (wfs_catalog_checkpoint_due): the cue to schedule
 * a commit or a checkpoint. With @on false, the open batch is committed first. Returns 0, -EROFS (read-only
 * handle), or the commit's error (batching stays on).
 */
int wfs_catalog_batch(struct wfs_catalog *c, bool on, void (*first_pending)(void *ctx), void *ctx);
/*
 * The redo log: a batch whose changes outlive the process that made them, for a daemon whose death
 * must not lose a change it answered (a takeover, fs/takeover.h), without a commit per change.
 * With @area (@bytes of memory that outlives the process: a MAP_SHARED memfd another process maps;
 * 8-byte aligned, @bytes a multiple of 8 and at least WFS_CATALOG_REDO_MIN), each call of a
 * batching handle that changes the catalog appends to @area, before it returns, one record: the
 * statements it ran, with their bound values and what each changed, numbered in sequence. Each
 * commit of the batch records the number of its last record in the catalog (meta 'redo_seq') and
 * empties @area. A call that cannot be logged (@area full, a record that does not fit) commits the
 * batch before it returns, as every call did without a log. The open batch is committed first (it
 * has no records); @area NULL stops logging. Records cost about 0.1-0.3 us per statement (a memcpy
 * of its SQL text and values); the handle owns none of @area's memory. Returns 0, -EINVAL (@area's
 * size or alignment), -EROFS, or the commit's -errno.
 */
#define WFS_CATALOG_REDO_MIN (64u << 10) /* bytes */
int wfs_catalog_redo(struct wfs_catalog *c, void *area, size_t bytes);
/*
 * After the process that logged into @area (@bytes, as it was given to wfs_catalog_redo()) died:
 * apply the records it published and no commit of its holds, in order, in one transaction, before
 * anything else changes the catalog (the same committed state gives the same inode numbers). Each
 * statement must change as many rows, and insert the same rowid, as when it was logged. @area is
 * only read. Call on a handle that does not batch and has no log (-EBUSY). *@records gets how many
 * were applied (0 for an area never used, or all zeros). Returns 0, -EPROTO (the log is damaged,
 * of another format, has a gap, or a statement did something else: the catalog is not the one it
 * was logged against; logged, nothing applied), or an -errno of the catalog (nothing applied).
 */
int wfs_catalog_redo_replay(struct wfs_catalog *c, const void *area, size_t bytes, uint64_t *records);
/*
 * Tell @changed(@ctx, ino) of every change of an inode's row (what wfs_catalog_getattr() returns:
 * an INSERT, UPDATE or DELETE, seen through sqlite3_update_hook), from inside the call that makes
 * it, under the caller's serialisation; and @changed(@ctx, 0) when a transaction is rolled back
 * whole (sqlite3_rollback_hook: changes told before may be undone), which may come from the thread
 * of a COMMIT that fails. For a cache of attributes (the daemon's, inode.h): what was read after
 * the last word about an inode is what the catalog holds. @changed NULL: stop telling.
 */
void wfs_catalog_watch_inodes(struct wfs_catalog *c, void (*changed)(void *ctx, uint64_t ino), void *ctx);
/*
 * Commit the open batch (0 when there is none or batching is off). Returns 0, -ENOSPC (after a
 * second try with the reserve released), -EIO, -EBUSY; when SQLite itself rolled the batch back on
 * that error, its changes are lost and logged; otherwise the batch stays open for the next try.
 */
int wfs_catalog_commit(struct wfs_catalog *c);
/*
 * Where a commit's time goes, since the handle was opened (nanoseconds, monotonic clock): SQLite's
 * COMMIT (its WAL frames written), the WAL headroom refilled after it (zeros written past the last
 * frame, see wfs_catalog_batch), and the reserve allocated again. A daemon commits under its lock, so
 * a slow one stalls every request behind it: fs/core/lock.h finds the hold, this the part of it.
 * Read under the caller's serialisation.
 */
struct wfs_catalog_timing {
	uint64_t commits, commit_max_ns, commit_ns;       /* COMMIT statements */
	uint64_t refills, refill_max_ns, refill_ns;       /* headroom refills that wrote zeros */
	uint64_t reserve_fills, reserve_max_ns;           /* the reserve allocated again */
};
void wfs_catalog_timing(const struct wfs_catalog *c, struct wfs_catalog_timing *out);
/*
 * Is a checkpoint due? A batching handle does not checkpoint at its commits, and its WAL grows by
 * about 4 KiB per create and 20 KiB per unlink until a checkpoint has copied every frame into
 * catalog.db and the next transaction starts it over. DUE once the frames since that start reach
 * 4 MiB (checkpoint when it suits: after a group sync, commit.c); NOW at 16 MiB, or at 1 MiB while
 * the filesystem is too full for the WAL's headroom (each removal must not cost more log than it
 * frees). NONE below that, after a checkpoint that copied every frame (until the next commit), and
 * for a handle that does not batch (it checkpoints itself). Call it where the handle's calls are
 * serialised (the daemon: under fs->lock).
 */
enum wfs_checkpoint_need { WFS_CHECKPOINT_NONE, WFS_CHECKPOINT_DUE, WFS_CHECKPOINT_NOW };
enum wfs_checkpoint_need wfs_catalog_checkpoint_due(const struct wfs_catalog *c);
/*
 * Copy the committed changes from the WAL into catalog.db, with its syncs. Runs on a connection of
 * its own: safe to call from any one thread at a time beside the handle's other calls, so a daemon
 * checkpoints without holding its lock (a checkpoint's fsync under the lock stalled every open
 * behind four writers' flushes). A PASSIVE checkpoint: it copies what no reader still needs and never
 * waits for writers. The WAL is only reused from its start when the checkpoint copied every frame and
 * the handle began no transaction meanwhile: a daemon lends its lock for it (commit.c), so that
 * catalog changes wait and opens go on. Returns 0, -EBUSY, -EIO, -ENOSPC (the WAL keeps the changes).
 */
int wfs_catalog_checkpoint(struct wfs_catalog *c);
/* Drop the open batch, every change in it (commit first what must be kept). 0 when none is open. */
void wfs_catalog_rollback(struct wfs_catalog *c);
/* Changes in the open batch, not committed yet (0 when batching is off). */
uint64_t wfs_catalog_pending(const struct wfs_catalog *c);

/* Make every committed change durable (WAL checkpoint with sync). For fsync/fsyncdir/unmount. */
int wfs_catalog_sync(struct wfs_catalog *c);

#endif
