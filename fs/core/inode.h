/* SPDX-License-Identifier: Apache-2.0 */
/*
 * inode — the in-memory inodes: one per inode number the kernel holds a lookup on or has open.
 *
 * An entry is created by the first lookup, create or open of an inode (wfs_inode_get()) and freed
 * when the kernel has forgotten every lookup, no handle is open and no version is being written
 * (wfs_inode_maybe_free()); an inode that has lost its last name is then dropped from the catalog
 * and its object released (wfs_inode_maybe_drop()). The catalog stays the truth for names and
 * attributes; an entry holds what only the running daemon knows.
 *
 * The fields are grouped by the state machine that owns them; only the owner writes them, others
 * read under fs->lock:
 *   inode.c     ino, nlookup
 *   openmode.c  io: open counts, passthrough or daemon-served, the kernel page cache (openmode.h)
 *   seal.c      writer, sealed, digest: what the name holds and the version being written (seal.h)
 * All functions run with fs->lock held; none drops it.
 */
#ifndef WFS_CORE_INODE_H
#define WFS_CORE_INODE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "catalog.h"
#include "digest.h"
#include "map.h"
#include "openmode.h"

struct wfs_fs;
struct wfs_version;

struct wfs_inode {
	struct wfs_map_node node;    /* key: ino */
	uint64_t ino;
	uint64_t nlookup;            /* (L) the kernel's lookup count (inode.c) */
	/* (L) Requests that hold this entry across a drop of fs->lock (an open's waits, a truncate's):
	 * it is not freed under them (wfs_inode_pin()). A lookup is not enough to keep it: a successor
	 * counts none of the lookups the kernel got from a dead server (docs/design.md, "Takeover"). */
	unsigned pins;
	struct wfs_iomode io;        /* (L) open handles and how they are served (openmode.c) */
	struct wfs_version *writer;  /* (L) version being written, or NULL (seal.c; holds a reference) */
	/* (L) @writer is being filled with the sealed bytes it starts from (a rewrite's copy,
	 * wfs_seal_writer(), fs->lock dropped and the version's lock held): callers that would change
	 * it under fs->lock (a truncate) wait on fs->seal_done instead of on its lock, which held
	 * every other request waiting for fs->lock as long as the copy took. */
	bool writer_filling;
	/* (L) The kernel may hold attributes of @writer that its seal will change (a ctime): set when
	 * the version starts and when attributes are told while it is written (an entry or a GETATTR
	 * reply), cleared by each write(2) the daemon serves (the kernel drops its size and times after
	 * a WRITE, and a reply to a GETATTR sent before it is discarded: fuse_write_update_attr()). The
	 * seal invalidates the kernel's attributes only when it is set (seal.c). */
	bool attr_told;
	/* (L) With @attr_told: the kernel may hold attributes other than @told — two tells with no write
	 * between them differed, or it held the name's before the version started. Else the seal needs
	 * no invalidation when what it gives the name is @told (closing.c): the trainer's create, write,
	 * close, rename, then open + fstat while the seal runs. */
	bool attr_mixed;
	struct wfs_told {
		uint64_t size;
		uint64_t blocks;     /* st_blocks */
		struct timespec mtime, ctime;
	} told;                      /* (L) what the last tell while written said */
	bool sealed;                 /* (L) the catalog's content: sealed as object @digest (seal.c) */
	struct wfs_object *expecting; /* (L) a claim of this file missed: the object its writer is
				      * expected to write, pinned (object.h; claim.c sets it, the next
				      * seal of content, the writer's end or the inode's end ends it) */
	struct wfs_digest digest;
	/* (L) The catalog's row of this inode as last read, kept until the catalog says it changed
	 * (wfs_catalog_watch_inodes): GETATTR answered from memory, also while fs->lock is lent. */
	bool attr_valid;
	uint64_t attr_epoch;         /* fs->attr_epoch when read: a rollback since makes it stale */
	struct wfs_attr attr;
	/* (L, light holds too) The 512-byte blocks object @blocks_of's file takes on disk (st_blocks:
	 * a sparse object's holes are not counted), once stat'ed: objects never change
	 * (wfs_inode_object_blocks()). */
	bool blocks_known;
	uint64_t blocks;
	struct wfs_digest blocks_of;
};

/* (L) Keep @a, just read from the catalog, as the attributes of its inode if the daemon holds it. */
void wfs_inode_attr_note(struct wfs_fs *fs, const struct wfs_attr *a);
/* (L, light holds too) @in's attributes as last read into *@out, if the catalog has not changed them
 * since; false when they must be read again. */
bool wfs_inode_attr(const struct wfs_fs *fs, const struct wfs_inode *in, struct wfs_attr *out);
/*
 * The catalog's word (wfs_catalog_watch_inodes, @ctx the struct wfs_fs): inode @ino's row changed
 * ((L): forget its attributes), or with @ino 0 a rollback may have undone changes (any thread:
 * every kept attribute is stale).
 */
void wfs_inode_attr_changed(void *ctx, uint64_t ino);

/* The entry of inode @ino, or NULL when the daemon holds none. */
struct wfs_inode *wfs_inode_find(struct wfs_fs *fs, uint64_t ino);
/* The entry for @attr->ino, created with zero counts and @attr's content when absent. NULL: ENOMEM. */
struct wfs_inode *wfs_inode_get(struct wfs_fs *fs, const struct wfs_attr *attr);
/*
 * (L) The entry of file @ino for an open or a change of its bytes: its catalog attributes into
 * *@attr, then wfs_inode_get(). Returns 0 with *@out, -EISDIR (a directory), -EINVAL (with
 * @regular_only, a symlink or special file), -ENOENT, -ENOMEM, or another -errno of the catalog.
 */
int wfs_inode_get_file(struct wfs_fs *fs, uint64_t ino, bool regular_only, struct wfs_attr *attr,
		       struct wfs_inode **out);
/*
 * (L) Attributes @st of @in are told to the kernel (an entry or GETATTR reply) while @in->writer is
 * written: note them for the seal (@attr_told, @attr_mixed, @told).
 */
void wfs_inode_tell(struct wfs_inode *in, const struct stat *st);
/*
 * (L) Can the kernel hold a size, mtime, ctime or st_blocks of @in other than the ones @in's
 * attributes now have (wfs_inode_attr(): what its seal just gave it; true when they are not at
 * hand)? Then the seal invalidates the kernel's attributes.
 */
bool wfs_inode_told_other(struct wfs_fs *fs, struct wfs_inode *in);
/*
 * (L, light holds too) The 512-byte blocks object @d's file takes on disk (st_blocks: a sparse
 * object's holes are not counted), kept in @in (may be NULL) since objects never change: one
 * fstatat(2) the first time. -1 when it cannot be stat'ed (a missing object).
 */
int64_t wfs_inode_object_blocks(struct wfs_fs *fs, struct wfs_inode *in, const struct wfs_digest *d);
/* Count one kernel lookup of @in (an entry reply: lookup, create, mkdir, link, readdirplus). */
void wfs_inode_lookup(struct wfs_inode *in);
/*
 * The kernel forgot @nlookup lookups of inode @ino (FORGET). More than it holds is logged and
 * clamped. Frees the entry when nothing uses it any more. After a takeover, an inode numbered up to
 * fs->held_before may have lookups a dead server counted: a FORGET of more than this server counted
 * is the kernel forgetting it whole, and it is dropped then if it has no name.
 */
void wfs_inode_forget(struct wfs_fs *fs, uint64_t ino, uint64_t nlookup);
/* Free @in if unused (no lookups, handles, writer or pins); drop it from the catalog if unlinked. */
void wfs_inode_maybe_free(struct wfs_fs *fs, struct wfs_inode *in);
/*
 * Keep @in while the caller may drop fs->lock (an open waiting for releases, a seal's copy);
 * wfs_inode_unpin() lets it go, and frees it if nothing else holds it (wfs_inode_maybe_free()).
 */
void wfs_inode_pin(struct wfs_inode *in);
void wfs_inode_unpin(struct wfs_fs *fs, struct wfs_inode *in);
/*
 * Catalog side: drop inode @ino if it has no name and nothing in the kernel refers to it, releasing
 * its object. A failed drop is left for wfs_catalog_recover() at the next mount, and so is an inode
 * numbered up to fs->held_before (a dead server's lookups of it are not counted here).
 */
void wfs_inode_maybe_drop(struct wfs_fs *fs, uint64_t ino);
/* At exit: free every entry, dropping versions being written (unsealed, gone at next mount). */
void wfs_inodes_release(struct wfs_fs *fs);

#endif
