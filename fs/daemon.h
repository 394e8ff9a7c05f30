/*
 * The weightfs daemon: shared state of the FUSE filesystem and the in-memory tables behind it.
 *
 * What lives where:
 *   catalog (SQLite)  names, attributes, xattrs, which object a sealed file is — the truth on disk.
 *   wfs_inode         per inode the kernel knows: its lookup count, open handles, and the version
 *                     being written, if any. Created on first lookup/create, freed when the kernel
 *                     has forgotten it and no handle is open.
 *   wfs_object        per object in use by open handles: the descriptor read without passthrough and
 *                     the passthrough backing id, shared by every open of every name with that content.
 *   wfs_version       bytes being written to a name: in memory while small, else a tmp file in
 *                     the store; hashed as they are written when writes come in order. Sealed into an object when the last writable handle
 *                     is flushed (close(2)) or released.
 *
 * Kernel passthrough rules this follows (fs/fuse/iomode.c): all passthrough opens of an inode must
 * share one backing file, and while any exist every new open must be passthrough too; an inode open
 * in cached mode (daemon-served) refuses passthrough opens. So writable opens are always daemon-served
 * (which is also what makes sealed objects immutable: no kernel write path reaches an object file), a
 * read-only open of a sealed file is passthrough unless a cached open exists, and a writable open of
 * an inode with passthrough readers fails with ETXTBSY.
 *
 * Locking: fs->lock protects the catalog handle, both tables and every field marked (L).
 * version->lock protects the fields marked (V) and serialises I/O on the tmp file.
 * Order: fs->lock before version->lock; never take fs->lock while holding a version lock.
 */
#ifndef WFS_DAEMON_H
#define WFS_DAEMON_H

#define FUSE_USE_VERSION 317
#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "catalog.h"
#include "digest.h"
#include "dtype.h"
#include "store.h"

struct wfs_map_node {
	struct wfs_map_node *next;
	uint64_t key;
};

/* Chained hash table keyed on uint64; entries embed a wfs_map_node. Not thread-safe (fs->lock). */
struct wfs_map {
	struct wfs_map_node **buckets;
	size_t nbuckets; /* power of two */
	size_t count;
};

struct wfs_version {
	pthread_mutex_t lock;
	unsigned refs;             /* (L) inode->writer counts one, each user in flight one */
	struct wfs_tmpfile tmp;    /* (V) backing tmp file, fd -1 while the bytes fit in @mem */
	char *mem;                 /* (V) small versions live here: no tmp inode churn for dedup hits */
	size_t mem_cap;            /* (V) bytes allocated at @mem */
	bool done;                 /* (V) published or discarded: nothing more to read or write */
	uint64_t size;             /* (V) bytes */
	struct wfs_hasher hasher;  /* (V) digest of bytes [0, hashed) when @in_order */
	bool in_order;             /* (V) every write so far extended the hashed prefix */
	bool hash_only;            /* (V) the store filled up: bytes hashed, not kept; sealed only if
				    * their content is already stored (version.c, keep_hashing) */
	int error;                 /* (V) first write error (-errno); sealing fails with it */
	bool modified;             /* (V) changed since it was started */
	bool written;              /* (V) data written (not only created or truncated) */
	bool mtime_set;            /* (V) utimes after the last write: the seal keeps @mtime */
	struct timespec mtime;
	bool has_base;             /* (V) started as a copy of object @base */
	struct wfs_digest base;
	bool frozen;               /* (V) being sealed: writes wait, then go to a new version */
	bool reserved_past_eof;    /* (V) fallocate(KEEP_SIZE) beyond @size: trimmed before publishing */
	unsigned writers;          /* (L) writable handles not yet flushed */
};

struct wfs_object {
	struct wfs_map_node node; /* key: first 8 bytes of the digest */
	struct wfs_digest digest;
	unsigned pins;  /* (L) open handles using it + seals publishing it */
	int fd;         /* (L) O_RDONLY, for daemon-served reads; -1 until needed */
	int backing_id; /* (L) passthrough backing id, 0 when not registered */
	bool verifying; /* (L) its digest is being checked; openers wait on fs->sealed */
};

/* An object whose bytes were checked against its digest since the daemon started (verify.c). */
struct wfs_check {
	struct wfs_map_node node; /* key: first 8 bytes of the digest */
	struct wfs_digest digest;
	bool bad;                 /* mismatch: quarantined, logged once */
	ino_t st_ino;             /* the object file as checked: a different file is checked again */
	off_t st_size;
	struct timespec st_mtim;
	struct timespec st_ctim;
};

struct wfs_inode {
	struct wfs_map_node node; /* key: ino */
	uint64_t ino;
	uint64_t nlookup;            /* (L) kernel lookup count */
	unsigned nopen;              /* (L) open handles */
	unsigned nwritable;          /* (L) of those, opened for writing */
	bool replaced;               /* (L) its name moved to a new inode for a writer while readers
				      * held this one (ops.c, move_from_readers): new opens get ESTALE
				      * and the kernel looks the name up again */
	unsigned ncached;            /* (L) open handles in cached (daemon-served) mode */
	unsigned ncached_closed;     /* (L) of those, closed (flush seen): their release is pending */
	unsigned npassthrough;       /* (L) open handles in passthrough mode */
	struct wfs_object *pt_object;/* (L) backing of the passthrough opens, when npassthrough > 0 */
	struct wfs_version *writer;  /* (L) version being written, or NULL */
	bool sealed;                 /* (L) catalog content: sealed as object @digest */
	struct wfs_digest digest;
	bool cache_valid;            /* (L) kernel page cache holds @cache_digest's bytes */
	struct wfs_digest cache_digest;
};

struct wfs_handle {
	struct wfs_inode *inode;
	struct wfs_object *object;   /* (L) pinned sealed object this handle reads, or NULL */
	struct wfs_version *writing; /* (L) referenced version counting this handle in ->writers:
				      * written to (or truncated) since the last flush */
	pid_t writer_tid;            /* (L) thread that last wrote through this handle */
	bool writable;               /* opened for writing: daemon-served, may start versions */
	bool passthrough;            /* reads and mmaps go to @object's backing file in the kernel */
	bool closed;                 /* (L) a flush (close(2) of a descriptor) has been seen */
	bool privs_dropped;          /* (L) set-user/group-ID bits checked at this handle's first write */
	struct wfs_handle *prev, *next; /* (L) on fs->handles */
};

struct wfs_options {
	char *store;
	char *mountpoint;
	int passthrough;      /* -1 auto, 0 off */
	int verify;           /* check each object's digest on its first open (default 1) */
	int dedup_verify;     /* compare bytes with the stored copy on a dedup hit (default 0) */
	char *retain_text;    /* -o retain=SIZE as given */
	uint64_t retain;      /* bytes of unreferenced objects kept for reuse (0: delete at once) */
	int sync;             /* fdatasync objects and sync seal commits */
	double timeout;       /* entry and attribute cache timeout, seconds */
	int foreground, debug, show_help, show_version;
	unsigned max_threads;
};


/* What this daemon did since it mounted; shown by user.weightfs.stats on the mount root. */
struct wfs_counters {
	uint64_t seals;             /* versions sealed into a name */
	uint64_t objects_published; /* of those, objects new to the store */
	uint64_t bytes_published;   /* bytes of the new objects: what the store wrote */
	uint64_t dedup_hits;        /* seals whose content was already stored: copy dropped */
	uint64_t claims;            /* user.weightfs.claim that sealed a name with no bytes sent */
	uint64_t claim_misses;      /* claims refused with ENODATA: the object is not stored */
	uint64_t verify_failures;   /* objects whose bytes did not match their digest (quarantined) */
	uint64_t moved_from_readers; /* writable opens and truncates of a file readers held: its
				      * name moved to a new inode (ops.c, move_from_readers) */
	uint64_t opens_passthrough; /* read-only opens served by the kernel from the object */
	uint64_t opens_daemon;      /* opens served by the daemon (writable, or passthrough off) */
	uint64_t opens_direct;      /* object descriptors handed out by the direct path (direct.c) */
};

struct wfs_fs {
	struct wfs_options opt;
	struct wfs_store *store;
	struct wfs_catalog *catalog;
	struct fuse_session *se;
	pthread_mutex_t lock;
	pthread_cond_t sealed;  /* broadcast when a seal finishes, or an inode's last passthrough
				 * or last cached handle is released */
	struct wfs_map inodes;  /* (L) */
	struct wfs_map objects; /* (L) */
	struct wfs_map checks;  /* (L) wfs_check entries */
	atomic_bool passthrough; /* negotiated and still working */
	atomic_uint_fast64_t checks_placed; /* object checks read on the opener's NUMA node (verify.c) */
	bool direct_writes;      /* writable opens are direct I/O (set once by init, before any open) */
	struct wfs_counters counters; /* (L) since this mount */
	uint64_t retained;      /* (L) -o retain: unreferenced bytes, at least (table.c) */
	struct wfs_handle *handles; /* (L) open handles: the kernel sends no release for those still
				     * open at unmount; freed at exit */
	struct wfs_moved {          /* (L) inodes a name just moved to for a writer (ops.c,
				     * move_from_readers): its retried open is on its way */
		uint64_t ino;
		struct timespec until; /* CLOCK_MONOTONIC */
	} moved[16];
	struct wfs_direct *direct;  /* the direct path's socket and threads (direct.c), or NULL; set
				     * before the session loop starts, cleared after it ends */
};

/* map.c */
void wfs_map_init(struct wfs_map *m);
void wfs_map_release(struct wfs_map *m);
struct wfs_map_node *wfs_map_first(const struct wfs_map *m, uint64_t key);
struct wfs_map_node *wfs_map_next(struct wfs_map_node *n, uint64_t key);
int wfs_map_insert(struct wfs_map *m, struct wfs_map_node *n);
void wfs_map_remove(struct wfs_map *m, struct wfs_map_node *n);
/* Some entry of @m, or NULL when empty (for tearing a table down). */
struct wfs_map_node *wfs_map_any(const struct wfs_map *m);

/* table.c — all with fs->lock held */
struct wfs_inode *wfs_inode_find(struct wfs_fs *fs, uint64_t ino);
/* The inode for @attr->ino, created with zero counts and @attr's content when absent. NULL: ENOMEM. */
struct wfs_inode *wfs_inode_get(struct wfs_fs *fs, const struct wfs_attr *attr);
/* Free @in if unused (no lookups, no handles, no writer); drop it from the catalog if unlinked. */
void wfs_inode_maybe_free(struct wfs_fs *fs, fuse_req_t req, struct wfs_inode *in);
/* Catalog-side: drop inode @ino if it has no name and nothing in the kernel refers to it. */
void wfs_inode_maybe_drop(struct wfs_fs *fs, fuse_req_t req, uint64_t ino);
/* Pin object @d (creating the table entry). NULL on ENOMEM. */
struct wfs_object *wfs_object_pin(struct wfs_fs *fs, const struct wfs_digest *d);
/* Unpin; on the last pin close its descriptor and backing id, and delete it if unreferenced. */
void wfs_object_unpin(struct wfs_fs *fs, fuse_req_t req, struct wfs_object *o);
/* Delete object @d from catalog and store when no name refers to it and nothing pins it. */
void wfs_object_maybe_delete(struct wfs_fs *fs, const struct wfs_digest *d);
/* Make sure @o has a read descriptor. Returns 0 or -errno. */
int wfs_object_open_fd(struct wfs_fs *fs, struct wfs_object *o);
/* At exit, after the session ended: free both tables (the kernel forgets nothing at unmount). */
void wfs_tables_release(struct wfs_fs *fs);

/* verify.c — with fs->lock held */
/*
 * Make sure object @o (pinned by the caller) holds the bytes its digest names, reading it once per
 * daemon run (and again if the object file changes). May drop fs->lock while reading. On a mismatch
 * the object is quarantined, one line is logged, and this and every later call return -EIO until the
 * same content is written again. Returns 0, -EIO, or another -errno.
 */
int wfs_verify_object(struct wfs_fs *fs, struct wfs_object *o);
/*
 * The same for a name that thread @tid is opening: a check that reads the object reads it on @tid's
 * NUMA node (its memory policy preferred there while reading), so the page cache it fills lands
 * where the opener will map it. @tid 0: anywhere. Same returns.
 */
int wfs_verify_object_for(struct wfs_fs *fs, struct wfs_object *o, pid_t tid);
/*
 * Is pinned object @o (whose file @st describes) plausibly intact, without reading it? Yes when its
 * size is the cataloged one and no check this run found it damaged; otherwise it is checked now, as
 * by wfs_verify_object() (may drop fs->lock). For digest claims: the first open of the claimed name
 * reads and checks the object anyway (-o verify=open), so a claim costs a stat, not a read.
 * Returns 0, -EIO (damaged), or another -errno.
 */
int wfs_verify_plausible(struct wfs_fs *fs, struct wfs_object *o, const struct stat *st);
/* Record object @d, just published by this daemon from bytes it hashed itself, as checked. */
void wfs_verify_mark_good(struct wfs_fs *fs, const struct wfs_digest *d);
/*
 * Referenced, not quarantined objects whose bytes this daemon run has checked (*@verified: by a first
 * open, a dedup hit, a claim, or because it published them) and has not (*@unverified). One pass
 * over the catalog's objects. Returns 0 or -errno of the catalog.
 */
int wfs_verify_count(struct wfs_fs *fs, uint64_t *verified, uint64_t *unverified);
/*
 * Check object @d's bytes now, whatever an earlier check found (an online fsck saw it damaged),
 * with -o verify=none too: quarantined and logged on a mismatch, as at a first open. May drop
 * fs->lock. Returns 0 (intact), -EIO (damaged, or gone since it was stored: its names fail with EIO
 * until rewritten), -ENODATA (no such object), or another -errno.
 */
int wfs_verify_recheck(struct wfs_fs *fs, fuse_req_t req, const struct wfs_digest *d);

/* version.c */
/*
 * The version being written of @in, started when there is none (fs->lock held; may drop and retake
 * it): empty when @truncate or when the name has no content yet, otherwise a copy of its sealed
 * object (copy_file_range, so filesystems that share extents copy nothing), made with only the
 * version lock held, after checking the sealed object (verify.c). Waits while a seal of @in is in
 * progress. Returns a referenced version
 * (wfs_version_put() it), or NULL with *@err set (-ENOSPC, -EIO, -ENOMEM, ...).
 */
struct wfs_version *wfs_version_writer(struct wfs_fs *fs, fuse_req_t req, struct wfs_inode *in, bool truncate,
				       int *err);
void wfs_version_get(struct wfs_version *v);
void wfs_version_put(struct wfs_version *v);
/*
 * Write @len bytes at @off. Returns bytes written, -EAGAIN when the version is being sealed (start
 * over with wfs_version_writer()), or another -errno, which is also kept for the seal to fail with.
 */
ssize_t wfs_version_write(struct wfs_fs *fs, struct wfs_version *v, const void *buf, size_t len,
			  off_t off);
/* Read up to @len bytes at @off. Returns bytes read, -EAGAIN once sealed, or -errno. */
ssize_t wfs_version_read(struct wfs_version *v, void *buf, size_t len, off_t off);
/* Set the size to @size bytes (zero-filled when growing). Returns 0, -EAGAIN, or -errno. */
int wfs_version_truncate(struct wfs_fs *fs, struct wfs_version *v, uint64_t size);
uint64_t wfs_version_size(struct wfs_version *v);
/*
 * fallocate(2) on the version: reserve bytes [@off, @off + @len) of its backing store, so that a
 * full store fails here rather than at the seal. @mode 0 extends the size (zeros) when @off + @len
 * is past it; FALLOC_FL_KEEP_SIZE reserves without changing it (the reservation past the end is
 * trimmed before the object is published). Beyond 1 MiB the version moves to its tmp file first.
 * Errors: -EOPNOTSUPP (any other mode bit: punch hole, zero/collapse/insert range), -EINVAL (@len 0
 * or past the largest file), -ENOSPC, -EIO, -ENOMEM, -EAGAIN (being sealed: start over with
 * wfs_version_writer()). Takes the version lock.
 */
int wfs_version_fallocate(struct wfs_fs *fs, struct wfs_version *v, int mode, uint64_t off, uint64_t len);
/*
 * Seal in->writer (fs->lock held on entry and on return; dropped while hashing and publishing):
 * digest, publish the object, point the inode at it. On failure the version is discarded and the
 * name keeps its previous content. @reported: the error reaches the writer (close(2), truncate(2));
 * only then is a size that does not fit the dtype/shape attributes refused (-EINVAL), otherwise it
 * is logged. Returns 0 or -errno (-ENOSPC, -EIO, -EINVAL, ...).
 */
int wfs_version_seal(struct wfs_fs *fs, fuse_req_t req, struct wfs_inode *in, bool reported);
/*
 * Do @size bytes make the tensor that inode @ino's dtype and shape attributes describe, with
 * attribute @name taken as @value (@len bytes) instead of its stored value when @name is not NULL
 * (fs->lock held)? 0 when they do or when the two are not both set; -EINVAL (logged, naming the
 * inode and @what, e.g. "seal refused") when elements × dtype bytes != @size.
 */
int wfs_tensor_fits(struct wfs_fs *fs, uint64_t ino, uint64_t size, const char *name, const char *value,
		    size_t len, const char *what);
/* Drop in->writer unsealed (fs->lock held): the name keeps its previous content, if any. */
void wfs_version_abandon(struct wfs_fs *fs, struct wfs_inode *in);
/*
 * Digest claim (setxattr user.weightfs.claim): seal the empty regular file @in as stored object @d,
 * without its bytes being written. An empty version being written (a file just created, or opened
 * with O_TRUNC) is dropped; its handles stay open and later writes start a new version. fs->lock
 * held (dropped while the object is verified, or while a seal of @in finishes). Returns 0, or
 *   -ENODATA  no intact object @d in the store (missing, quarantined, or failing its check),
 *   -EEXIST   the file has content, or bytes were written to it,
 *   -ETXTBSY  the file is open read-only through passthrough (its backing file is fixed),
 *   -EINVAL   not a regular file, or the object's size does not fit its dtype/shape attributes,
 *   -ENOMEM, or an -errno of the catalog (its commit failed: nothing changed).
 */
int wfs_version_claim(struct wfs_fs *fs, fuse_req_t req, struct wfs_inode *in, const struct wfs_digest *d);

/* ops.c */
extern const struct fuse_lowlevel_ops wfs_ops;

#endif
