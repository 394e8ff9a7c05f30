/* SPDX-License-Identifier: Apache-2.0 */
/*
 * version — the bytes of a name while they are being written, up to the moment they become an object.
 *
 * States, under the version's own lock:
 *
 *        wfs_version_new()                 wfs_version_freeze()             wfs_version_publish()
 *   ───────────────────────▶   OPEN   ─────────────────────────▶  FROZEN  ─────────────────────────▶  DONE
 *                       write, read,          digest computed;       ▲  │ reads still served;        published or
 *                       truncate, fallocate   writes get -EAGAIN     │  │ writes wait                discarded:
 *                              │                                     │  │                            reads and
 *                              │         wfs_version_thaw() (a claim │  │ wfs_version_discard()      writes get
 *                              │         that failed) ───────────────┘  └──────────────────────────▶ -EAGAIN
 *                              └────────────────── wfs_version_discard() ──────────────────────────▶
 *
 * A seal takes the version under fs->lock (wfs_version_seal_begin()) before it drops that lock to
 * freeze it: from then on it counts as FROZEN for writes and for writers that would join it.
 * A caller that gets -EAGAIN waits for the seal (fs->seal_done, seal.h) and starts over from the inode.
 *
 * Where the bytes are: a version up to WFS_VERSION_MEM_MAX bytes lives in memory, so a small file
 * whose content is already stored (the common case when ranks and restarts write the same weights)
 * never creates a tmp inode at all; creating and deleting tens of thousands of inodes is what a
 * filesystem's allocator is slowest at. A version that grows past it moves to a tmp file in the store.
 * Writes that extend the hashed prefix are hashed as they arrive; any other write makes the seal
 * hash the whole version again.
 *
 * A version is reference-counted (wfs_version_get()/put(): atomic, any lock); the struct is private.
 * Every function but the writer count takes the version's lock itself, and may be called with
 * fs->lock held (it comes first in the lock order); the write path calls the I/O ones without it,
 * so that other inodes do not wait for this one's disk. What the handlers ask under fs->lock while
 * a seal may hold the version lock for its hashing and fdatasync — wfs_version_size(),
 * _frozen(), _has_data(), _kernel_written(), _set_mtime(), _declare(), _trusted(),
 * _declared_wrong() — does not take it.
 */
#ifndef WFS_CORE_VERSION_H
#define WFS_CORE_VERSION_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

#include "digest.h"
#include "lock.h"
#include "store.h"

#define WFS_VERSION_MEM_MAX (1u << 20) /* bytes kept in memory before a tmp file: one FUSE write */

struct wfs_version; /* private to version.c */

/*
 * A new, empty OPEN version whose tmp file (when it needs one) goes to @store (borrowed: it must
 * outlive the version). One reference, the caller's. Returns NULL with *@err set (-ENOMEM).
 */
struct wfs_version *wfs_version_new(struct wfs_store *store, int *err);
void wfs_version_get(struct wfs_version *v);
/* Drop a reference; the last one frees the version (its tmp file, if any, was discarded by then). */
void wfs_version_put(struct wfs_version *v);

/*
 * Fill the new, empty version @v with a copy of object @base (its sealed bytes, for a rewrite):
 * copy_file_range or a reflink, data extents only (a sparse object costs what it holds). Called with
 * @outer held (fs->lock); takes @v's lock, drops @outer while copying, then retakes @outer, so that
 * other users of the inode wait for the copy (on the version lock, or for a caller under fs->lock,
 * on struct wfs_inode's writer_filling), not on fs->lock. On failure @v is DONE (users
 * that found it meanwhile get -EAGAIN). Returns 0, or -EIO (the object is missing or shorter than
 * its size said), -ENOSPC, -ENOMEM or another -errno of the store.
 */
int wfs_version_copy_base(struct wfs_version *v, const struct wfs_digest *base, struct wfs_lock *outer);

/* wfs_version_write()'s offset for a write at the version's end, wherever it is then (O_APPEND). */
#define WFS_VERSION_AT_END ((off_t)-1)

/*
 * Write @len bytes at byte offset @off, or at the end (@off WFS_VERSION_AT_END, taken under the
 * version lock: an append lands after every write and truncation before it). Returns @len, -EAGAIN when the version is FROZEN or DONE
 * (start over with the inode's current version), or another -errno (-ENOSPC, -EIO, -ENOMEM), which is
 * also kept for the seal to fail with. On -ENOSPC of a version written in order from an empty start,
 * the bytes are dropped and later in-order writes are only hashed (hash-only): the seal succeeds if
 * the digest's object is stored already, and fails with -ENOSPC otherwise.
 */
ssize_t wfs_version_write(struct wfs_version *v, const void *buf, size_t len, off_t off);
/* Read up to @len bytes at @off. Returns bytes read (0 at or past the end), -EAGAIN once DONE,
 * -EIO for a hash-only version (its bytes were not kept), or -errno of the tmp file. */
ssize_t wfs_version_read(struct wfs_version *v, void *buf, size_t len, off_t off);
/* Set the size to @size bytes (zero-filled when growing). Returns 0, -EAGAIN, -ENOSPC (hash-only:
 * only writes in order go on), or -errno. */
int wfs_version_truncate(struct wfs_version *v, uint64_t size);
/*
 * fallocate(2): reserve bytes [@off, @off + @len) of the backing store, so that a full store fails
 * here rather than at the seal. @mode 0 extends the size (zeros) when @off + @len is past it;
 * FALLOC_FL_KEEP_SIZE reserves without changing it (the reservation past the end is trimmed before
 * the object is published). Beyond WFS_VERSION_MEM_MAX the version moves to its tmp file first.
 * FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE makes the bytes of the range inside the version zeros,
 * the size unchanged, and frees their blocks in the tmp file (data extents: a sparse object, as
 * on ext4). Errors: -EOPNOTSUPP (any other mode: zero, collapse or insert range; a punch without
 * KEEP_SIZE; a tmp filesystem that cannot punch), -EINVAL (@len 0 or past the largest file),
 * -ENOSPC, -EIO, -ENOMEM, -EAGAIN (being sealed, FROZEN or DONE).
 */
int wfs_version_fallocate(struct wfs_version *v, int mode, uint64_t off, uint64_t len);
/* The size in bytes. */
uint64_t wfs_version_size(struct wfs_version *v);
/* utimes(2) after the last write: the seal keeps @mtime instead of the time of the seal. */
void wfs_version_set_mtime(struct wfs_version *v, const struct timespec *mtime);
/* Which times wfs_version_stat() gave (none: the seal takes its own time for it). */
enum {
	WFS_VERSION_MTIME = 1 << 0,
	WFS_VERSION_CTIME = 1 << 1,
};
/*
 * What stat(2) shows of @v while it is written, and what its seal records, with at most one
 * fstat(2) of the file the kernel writes it through (passthrough). Sets in @st:
 *   - st_size: wfs_version_size();
 *   - st_blocks (512-byte blocks): the allocation of the file it is written into, by the kernel
 *     or the daemon (holes are not counted: a truncate(2) to 5 GiB takes none, as on ext4); else
 *     (in memory, or a seal hashing it) the size rounded up to 4 KiB (what most object files of
 *     a dense file take: the seal tells the kernel again when its object's differ, inode.h);
 *   - st_mtim, the mtime the seal gives @v's content: the one set by wfs_version_set_mtime() and
 *     not moved by a write since; else the time of the last write, truncate or growth (the
 *     daemon's, or the kernel-written file's mtime). Left as it was when none of these happened;
 *   - st_ctim, the time of @v's last change, the ctime its seal gives the name: the latest of its
 *     last write, truncate or growth through the daemon, its last utimes(2) (the call's own time,
 *     as ext4's ctime) and the kernel-written file's mtime. Raised to it only where it is later
 *     (a rename's ctime on the name stays); left as it was when none of these happened.
 * Returns which of the times it had (WFS_VERSION_MTIME, WFS_VERSION_CTIME). Other fields are
 * untouched. Never fails: without the kernel's file, the daemon's record. Any lock but the
 * version's note lock may be held; without the version lock, as wfs_version_size().
 */
unsigned wfs_version_stat(struct wfs_version *v, struct stat *st);
/*
 * Did anything change @v's bytes or times since it started: a write, truncate or growth through the
 * daemon, a utimes(2), or (written through the kernel) its file's mtime moved? A version that a
 * writable open started as a copy of its base and nobody touched — a writable shared mapping only
 * read, as torch.from_file(shared=True) makes — is not sealed (seal.c). Call it on a FROZEN version.
 */
bool wfs_version_touched(struct wfs_version *v);
/* A copy of its base that nothing touched yet (wfs_version_touched()), on an OPEN version too. */
bool wfs_version_untouched_copy(struct wfs_version *v);
/* Is @d the digest of the object @v started as a copy of (the bytes came back unchanged)? */
bool wfs_version_same_as_base(struct wfs_version *v, const struct wfs_digest *d);
/* Being sealed, FROZEN or DONE: a writer must wait and start over. Lock-free. */
bool wfs_version_frozen(struct wfs_version *v);
/*
 * (fs->lock held) A seal takes @v: from now on writes get -EAGAIN and wfs_version_frozen() is true,
 * so that no writer joins or writes between the last writer's leave and the freeze, which the seal
 * makes after it drops fs->lock (a second seal of the same version aborted the daemon). Returns
 * false, changing nothing, when @v is being sealed already or FROZEN (a claim holds it, or DONE).
 */
bool wfs_version_seal_begin(struct wfs_version *v);
/* A seal that took @v with wfs_version_seal_begin() gives it back unsealed (wfs_version_freeze()'s -EBUSY). */
void wfs_version_seal_cancel(struct wfs_version *v);
/*
 * Written through the kernel: is its file still open for writing by anyone but the daemon (a shared
 * writable mapping that outlived its descriptor's close)? One read-lease try (settle(), version.c).
 */
bool wfs_version_mapped(struct wfs_version *v);
/* From now on a seal of @v does not wait for a writable mapping: it publishes a copy (an unmount). */
void wfs_version_copy_if_mapped(struct wfs_version *v);
/*
 * Have data been written to @v (not only created, truncated or fallocated)? A lone one-byte write
 * past the end of an empty version is not data: numpy.memmap(mode='w+') sizes a new file that way
 * before it fills a mapping of it, and closes its descriptor meanwhile (writer.h). Written through
 * the kernel (passthrough), where the daemon sees no write: the file's size and allocated blocks
 * say it (empty, or one block of a larger file, is not data).
 */
bool wfs_version_has_data(struct wfs_version *v);

/*
 * OPEN → FROZEN: the digest of the bytes into *@d, the size into *@size, and whether the version was
 * never written and is empty (*@unwritten: the state of a file created and closed before its bytes).
 * Returns 0, or the first write error kept (-ENOSPC, -EIO, ...), or -errno of rehashing the tmp file;
 * frozen either way. Except -EBUSY: written through the kernel, and its file is still open for
 * writing (a shared writable mapping whose descriptor was closed: the kernel maps the backing file
 * itself, and the FUSE file goes at close); @v stays OPEN, to be sealed once the mapping goes
 * (mapped.h), unless wfs_version_copy_if_mapped() asked for a copy of the bytes as they are.
 */
int wfs_version_freeze(struct wfs_version *v, struct wfs_digest *d, uint64_t *size, bool *unwritten);
/*
 * The writer's word for the digest of the bytes it writes (setxattr user.weightfs.digest while
 * writing; seal.h). The freeze takes it instead of reading the tmp file to hash it when the
 * kernel wrote the bytes (passthrough: the daemon saw none of them), object @d is not stored yet
 * and only one writable handle ever wrote @v; wfs_version_trusted()
 * then says so, and the object must be checked before its first read (check.h). Otherwise the
 * bytes are hashed as before, and wfs_version_declared_wrong() says whether they differ from @d.
 * Returns 0 or -EAGAIN (FROZEN or DONE: too late for this version).
 */
int wfs_version_declare(struct wfs_version *v, const struct wfs_digest *d);
/* Was @v frozen (and published, when it was new content) with its declared digest, unhashed? */
bool wfs_version_trusted(struct wfs_version *v);
/* Did the freeze hash @v's bytes and find them other than the declared digest? */
bool wfs_version_declared_wrong(struct wfs_version *v);
/* Is the FROZEN version the unchanged copy of its base object (its digest is the base's)? */
bool wfs_version_unchanged(struct wfs_version *v);
/*
 * FROZEN → DONE: make object @d (the digest wfs_version_freeze() gave) hold these bytes. @stored:
 * the caller's answer to "is @d in the store?" (wfs_store_object_exists(), asked where no other
 * publish of @d could come between: seal.c). When the store has it already (or the version is its
 * unchanged base), nothing is written and *@existed is set; with @dedup_verify the bytes are
 * compared first (-EIO, logged, on an XXH3 collision; -ENOSPC for a hash-only version, whose bytes
 * are gone); a trusted version is hashed first (-EIO, logged, when its bytes are not the declared
 * digest: the name keeps nothing it did not write). Otherwise the tmp file is published under @d
 * (with @durable: fdatasync unless the store is NOSYNC, link, directory sync; without: the link
 * only, made durable by a later wfs_store_sync()); a link that finds @d there after all counts as
 * stored. The bytes are released either way.
 * Returns 0, -ENOSPC (hash-only and new content), or -errno of the store.
 */
int wfs_version_publish(struct wfs_version *v, const struct wfs_digest *d, bool stored, bool dedup_verify,
			bool durable, bool *existed);
/* → DONE without publishing: the bytes are released. */
void wfs_version_discard(struct wfs_version *v);
/*
 * Under a holder (keep.h), a published version keeps its bytes (its named tmp file or memory slot)
 * and its record past wfs_version_publish(), so that a successor of a server killed before the
 * catalog recorded the seal can seal it again. Call this once the catalog change is made (in the
 * batch, whose redo log a successor replays): they go now. Also done at the last reference; a
 * no-op without a holder or when already done.
 */
void wfs_version_let_go(struct wfs_version *v);
/*
 * Before wfs_version_discard() of a failed seal: bytes the kernel wrote (passthrough) stay allocated
 * while its backing file is open, past the discard; free their blocks now, so that a full store has
 * room for what follows (the removal of a never-sealed name). Opens that share the backing file read
 * the file as it then is: empty (the name they opened reads EIO from the next open on).
 */
void wfs_version_free_kernel_bytes(struct wfs_version *v);
/*
 * For a digest claim: -EEXIST when @v has bytes (data written, or a size above 0), else 0; with
 * @freeze the empty version is FROZEN too, so that no write lands before the claim commits (or is
 * thawed).
 */
int wfs_version_claim_freeze(struct wfs_version *v, bool freeze);
/*
 * A claim of object @d (@size bytes, read from descriptor @src) on @v, which the kernel writes
 * (passthrough) and which is empty: the kernel reads and writes @v's file, so the object's bytes are
 * put there (a reflink where the store's filesystem shares extents, else a copy), and @v counts as
 * an unchanged copy of @d — its seal keeps the claimed content unless the file is written after this.
 * Version lock taken; call without fs->lock (a copy). Returns 0, -EINVAL (not written by the
 * kernel), or -errno of the copy (@v is then empty again).
 */
int wfs_version_claim_fill(struct wfs_version *v, int src, uint64_t size, const struct wfs_digest *d);
/* FROZEN → OPEN, for a claim that failed after wfs_version_claim_freeze(@v, true). */
void wfs_version_thaw(struct wfs_version *v);

/*
 * Bytes written through the kernel (passthrough, openmode.c): make @v's bytes live in its tmp file
 * and reserve @reserve bytes there (fallocate KEEP_SIZE, trimmed before publishing), so that a full
 * store fails here and the daemon path, which can keep hashing, is used instead. From then on the
 * size is the file's and the seal rehashes the file; before hashing it makes sure nothing can write
 * the file any more (a read lease), else it publishes a copy (docs/integrity.md). Returns a
 * read-only descriptor of the tmp file (owned by @v, valid until it is freed) to register as the
 * backing file: the kernel opens each passthrough open's own file from it with that open's flags,
 * and a registered read-write one would count as a writer until the id is released, so the lease
 * would never be granted. Or -ENOSPC/-EDQUOT, -EAGAIN (FROZEN or DONE), another -errno.
 */
int wfs_version_kernel_backing(struct wfs_version *v, uint64_t reserve);
/* Was @v written through the kernel (its seal needs the lease check, and is synced at release)? */
bool wfs_version_kernel_written(struct wfs_version *v);
/*
 * A writer called fsync(2) or fdatasync(2) on @v: its seal makes it durable before close(2) returns,
 * whatever its size (seal.c, WFS_SYNC_CLOSE_MIN). Lock-free; any thread.
 */
/*
 * fsync(2) of a writer of @v: bytes the kernel wrote (passthrough) into @v's file are made durable
 * now, through a descriptor of the daemon's, which hears their writeback errors. Takes the version
 * lock only to copy the descriptor; call without fs->lock. Returns 0 (nothing to sync elsewhere
 * too), or -errno of fdatasync(2) (-EIO, -ENOSPC).
 */
int wfs_version_datasync_kernel(struct wfs_version *v);
void wfs_version_ask_durable(struct wfs_version *v);
bool wfs_version_durable_asked(struct wfs_version *v);
/* Did the seal find the writers' file still open for writing, and publish a copy of it? */
bool wfs_version_published_copy(struct wfs_version *v);
/* Make the seal of @v fail with @err (-errno), unless an error is kept already; the caller has
 * reported it (logged, or returned to close(2)), so the seal does not log it again. */
void wfs_version_fail(struct wfs_version *v, int err);
/* The error @v's seal will fail with (a write's, or wfs_version_fail()'s), or 0. Version lock taken. */
int wfs_version_failed(struct wfs_version *v);
/* Is the error the seal of @v will fail with one that wfs_version_fail() set? */
bool wfs_version_error_told(struct wfs_version *v);

struct wfs_keep_record;
/*
 * Under a holder (keep.h): give the new, empty version @v of inode @ino a record that a successor
 * finds, its bytes in the record's slot (or, with @base_follows, in the named tmp file that
 * wfs_version_copy_base() makes next; adopted only once that copy is done). Without a free record
 * (or a holder) nothing changes: the version lives in this process only.
 */
void wfs_version_keep(struct wfs_version *v, uint64_t ino, bool base_follows);
/*
 * Successor: the OPEN version a dead server left in record @r (LIVE), its bytes where they were
 * (the record's slot, or its named tmp file, reopened), to be hashed whole at its seal. One
 * reference, the caller's; the record is its own from now on. Returns NULL with *@err: -EIO (the
 * record is not LIVE: its bytes are not all there), -ENOENT (its tmp file is gone), -ENOMEM, -errno.
 */
struct wfs_version *wfs_version_adopt(struct wfs_store *store, const struct wfs_keep_record *r, int *err);

/*
 * Writer count (fs->lock held): writable handles that wrote to (or truncated) @v since their last
 * flush. The last one to leave seals the version (seal.c). Each add also counts as a join, for
 * wfs_version_declare().
 */
void wfs_version_writer_add(struct wfs_version *v);
/* One writer less; returns how many are left. */
unsigned wfs_version_writer_drop(struct wfs_version *v);
unsigned wfs_version_writers(const struct wfs_version *v);
/*
 * (fs->lock held) A close(2) refused @v's size (it does not make the dtype/shape: seal.c) and told
 * its caller, while the open file may have other descriptors (a dup) that complete the tensor: note
 * the size @v has now. wfs_version_refused(): is that still its size (nothing written since that
 * changed it)? Then its release drops it: the close that ended it heard why.
 */
void wfs_version_refuse(struct wfs_version *v);
bool wfs_version_refused(struct wfs_version *v);
/*
 * (fs->lock held) A writer of @v that wrote data ended its writing cleanly (its close(2) returned 0,
 * after an fsync(2) maybe): @v holds finished bytes, so the last writer's end seals it even if a
 * signal kills that one, another writer of the same file (seal.c). wfs_version_finished(): did that
 * happen?
 */
void wfs_version_finish(struct wfs_version *v);
bool wfs_version_finished(const struct wfs_version *v);
/*
 * Bytes of @v that a full store made it drop, keeping only their digest (keep_hashing in version.c:
 * the seal may still find that content stored): 0 while every byte written is kept (the common
 * answer, without a lock); else takes @v's lock. Any thread.
 */
uint64_t wfs_version_dropped(struct wfs_version *v);

#endif
