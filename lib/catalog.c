/* SPDX-License-Identifier: Apache-2.0 */
/* catalog.h: the namespace and object metadata of a store, in SQLite. */
#include "catalog.h"
#include "clock.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "dtype.h"
#include "fault.h"
#include "log.h"
#include "weightfs.h"

/* 1: the first schema; 2: inodes.rdev (device number of a character or block device node). */
#define SCHEMA_VERSION 2

static const char schema_sql[] =
	"CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value) WITHOUT ROWID;"
	"CREATE TABLE IF NOT EXISTS inodes("
	"  ino INTEGER PRIMARY KEY AUTOINCREMENT,"
	"  mode INTEGER NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL,"
	"  nlink INTEGER NOT NULL, size INTEGER NOT NULL DEFAULT 0, parent INTEGER NOT NULL DEFAULT 0,"
	"  atime INTEGER NOT NULL, mtime INTEGER NOT NULL, ctime INTEGER NOT NULL,"
	"  digest BLOB, target TEXT, rdev INTEGER NOT NULL DEFAULT 0);"
	"CREATE INDEX IF NOT EXISTS inodes_nlink0 ON inodes(nlink) WHERE nlink = 0;"
	"CREATE INDEX IF NOT EXISTS inodes_digest ON inodes(digest) WHERE digest IS NOT NULL;"
	"CREATE TABLE IF NOT EXISTS dentries("
	"  id INTEGER PRIMARY KEY AUTOINCREMENT, parent INTEGER NOT NULL, name TEXT NOT NULL,"
	"  ino INTEGER NOT NULL, UNIQUE(parent, name));"
	"CREATE INDEX IF NOT EXISTS dentries_ino ON dentries(ino);"
	"CREATE TABLE IF NOT EXISTS xattrs(ino INTEGER NOT NULL, name TEXT NOT NULL, value BLOB NOT NULL,"
	"  PRIMARY KEY(ino, name)) WITHOUT ROWID;"
	"CREATE TABLE IF NOT EXISTS objects(digest BLOB PRIMARY KEY, size INTEGER NOT NULL,"
	"  refcount INTEGER NOT NULL DEFAULT 0, state INTEGER NOT NULL DEFAULT 0,"
	"  released INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;"
	"CREATE INDEX IF NOT EXISTS objects_unref ON objects(refcount) WHERE refcount = 0;"
	/* Invariant 1: objects.refcount follows inodes.digest in every transaction. */
	"CREATE TRIGGER IF NOT EXISTS inode_ref_insert AFTER INSERT ON inodes WHEN NEW.digest IS NOT NULL"
	"  BEGIN UPDATE objects SET refcount = refcount + 1 WHERE digest = NEW.digest; END;"
	/* released: when the last reference went (unix seconds), for least-recently-used retention. */
	"CREATE TRIGGER IF NOT EXISTS inode_ref_delete AFTER DELETE ON inodes WHEN OLD.digest IS NOT NULL"
	"  BEGIN UPDATE objects SET refcount = refcount - 1, released = unixepoch()"
	"  WHERE digest = OLD.digest; END;"
	"CREATE TRIGGER IF NOT EXISTS inode_ref_update AFTER UPDATE OF digest ON inodes"
	"  WHEN OLD.digest IS NOT NEW.digest BEGIN"
	"  UPDATE objects SET refcount = refcount - 1, released = unixepoch() WHERE digest = OLD.digest;"
	"  UPDATE objects SET refcount = refcount + 1 WHERE digest = NEW.digest; END;";

#define ATTR_COLS                                                                                  \
	"i.ino, i.mode, i.uid, i.gid, i.nlink, i.size, i.parent, i.atime, i.mtime, i.ctime, i.digest, i.rdev"

enum stmt_id {
	ST_GETATTR,
	ST_LOOKUP,
	ST_INSERT_INODE,
	ST_INSERT_SEALED,
	ST_INSERT_DENTRY,
	ST_DELETE_DENTRY,
	ST_NLINK_ADD,
	ST_DIR_HAS_ENTRY,
	ST_MOVE_DENTRY,
	ST_SET_DENTRY_INO,
	ST_SET_PARENT,
	ST_TOUCH_DIR,
	ST_SETATTR,
	ST_INSERT_OBJECT,
	ST_SET_CONTENT,
	ST_READLINK,
	ST_READDIR,
	ST_XATTR_GET,
	ST_XATTR_INSERT,
	ST_XATTR_UPDATE,
	ST_XATTR_LIST,
	ST_XATTR_DELETE,
	ST_XATTR_DELETE_ALL,
	ST_DELETE_INODE,
	ST_OBJECT_GET,
	ST_OBJECT_DELETE,
	ST_OBJECT_STATE,
	ST_UNREFERENCED,
	ST_BEGIN,
	ST_COMMIT,
	ST_ROLLBACK,
	ST_SAVEPOINT,
	ST_RELEASE,
	ST_ROLLBACK_TO,
	ST_REDO_SEQ,
	ST_COUNT
};

static const char *const stmt_sql[ST_COUNT] = {
	[ST_GETATTR] = "SELECT " ATTR_COLS " FROM inodes i WHERE i.ino = ?1",
	[ST_LOOKUP] = "SELECT " ATTR_COLS " FROM dentries d JOIN inodes i ON i.ino = d.ino"
		      " WHERE d.parent = ?1 AND d.name = ?2",
	[ST_INSERT_INODE] = "INSERT INTO inodes(mode, uid, gid, nlink, size, parent, atime, mtime, ctime,"
			    " target, rdev) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, ?7, ?8, ?9)",
	[ST_INSERT_SEALED] = "INSERT INTO inodes(mode, uid, gid, nlink, size, atime, mtime, ctime, digest)"
			     " VALUES(?1, ?2, ?3, 1, ?4, ?5, ?5, ?5, ?6)",
	[ST_INSERT_DENTRY] = "INSERT INTO dentries(parent, name, ino) VALUES(?1, ?2, ?3)",
	[ST_DELETE_DENTRY] = "DELETE FROM dentries WHERE parent = ?1 AND name = ?2",
	[ST_NLINK_ADD] = "UPDATE inodes SET nlink = nlink + ?2, ctime = ?3 WHERE ino = ?1",
	[ST_DIR_HAS_ENTRY] = "SELECT 1 FROM dentries WHERE parent = ?1 LIMIT 1",
	[ST_MOVE_DENTRY] = "UPDATE dentries SET parent = ?3, name = ?4 WHERE parent = ?1 AND name = ?2",
	[ST_SET_DENTRY_INO] = "UPDATE dentries SET ino = ?3 WHERE parent = ?1 AND name = ?2",
	[ST_SET_PARENT] = "UPDATE inodes SET parent = ?2, ctime = ?3 WHERE ino = ?1",
	[ST_TOUCH_DIR] = "UPDATE inodes SET mtime = ?2, ctime = ?2 WHERE ino = ?1",
	[ST_SETATTR] = "UPDATE inodes SET mode = ?2, uid = ?3, gid = ?4, atime = ?5, mtime = ?6, ctime = ?7"
		       " WHERE ino = ?1",
	/* A seal only commits once the object file is in objects/, so a quarantined object is good
	 * again; one published on a declared digest stays so until it is checked (a claim or a dedup
	 * onto it does not check it). */
	[ST_INSERT_OBJECT] = "INSERT INTO objects(digest, size, state) VALUES(?1, ?2, ?3)"
			     " ON CONFLICT(digest) DO UPDATE SET state ="
			     " CASE WHEN state = 2 AND ?3 = 0 THEN 2 ELSE ?3 END",
	[ST_SET_CONTENT] = "UPDATE inodes SET digest = ?2, size = ?3, mtime = ?4, ctime = ?5 WHERE ino = ?1",
	[ST_READLINK] = "SELECT mode, target FROM inodes WHERE ino = ?1",
	[ST_READDIR] = "SELECT d.id, d.name, " ATTR_COLS " FROM dentries d JOIN inodes i ON i.ino = d.ino"
		       " WHERE d.parent = ?1 AND d.id > ?2 ORDER BY d.id",
	[ST_XATTR_GET] = "SELECT value FROM xattrs WHERE ino = ?1 AND name = ?2",
	[ST_XATTR_INSERT] = "INSERT INTO xattrs(ino, name, value) VALUES(?1, ?2, ?3)",
	[ST_XATTR_UPDATE] = "UPDATE xattrs SET value = ?3 WHERE ino = ?1 AND name = ?2",
	[ST_XATTR_LIST] = "SELECT name FROM xattrs WHERE ino = ?1 ORDER BY name",
	[ST_XATTR_DELETE] = "DELETE FROM xattrs WHERE ino = ?1 AND name = ?2",
	[ST_XATTR_DELETE_ALL] = "DELETE FROM xattrs WHERE ino = ?1",
	[ST_DELETE_INODE] = "DELETE FROM inodes WHERE ino = ?1",
	[ST_OBJECT_GET] = "SELECT refcount, size FROM objects WHERE digest = ?1",
	[ST_OBJECT_DELETE] = "DELETE FROM objects WHERE digest = ?1 AND refcount = 0",
	[ST_OBJECT_STATE] = "UPDATE objects SET state = ?2 WHERE digest = ?1",
	[ST_UNREFERENCED] = "SELECT digest, size FROM objects WHERE refcount = 0 ORDER BY released, digest",
	[ST_BEGIN] = "BEGIN IMMEDIATE",
	[ST_COMMIT] = "COMMIT",
	[ST_ROLLBACK] = "ROLLBACK",
	[ST_SAVEPOINT] = "SAVEPOINT op",
	[ST_RELEASE] = "RELEASE op",
	[ST_ROLLBACK_TO] = "ROLLBACK TO op",
	[ST_REDO_SEQ] = "INSERT OR REPLACE INTO meta(key, value) VALUES('redo_seq', ?1)",
};

/*
 * The reserve: CATALOG_RESERVE bytes allocated beside catalog.db (catalog.db-reserve) while there is
 * room. On a full filesystem a commit cannot grow the WAL, so nothing could be deleted to make room;
 * an operation that frees space (unlink, rename, dropping an inode or an object) that fails with
 * ENOSPC checkpoints the WAL or releases the reserve, and runs once more (room_for_removal). The reserve is allocated again after a commit once
 * the filesystem has twice its size free. Measured: one unlink appends about 5 pages (20 KiB) to the
 * WAL, so 8 MiB covers a few hundred deletions before the space they free comes back.
 */
#define CATALOG_RESERVE (8u << 20) /* bytes */
#define WAL_HEADROOM (4u << 20)    /* bytes of zeros written past the WAL's last frame (batching) */
#define WAL_CHECKPOINT_BYTES (4u << 20) /* a batching handle's WAL is checkpointed past this, */
#define WAL_CHECKPOINT_FORCE (16u << 20) /* with a group sync made for it past this, */
#define WAL_CHECKPOINT_FULL (1u << 20)   /* and past this on a filesystem near full (no headroom) */
#define BATCH_MIN_FREE (2ull * CATALOG_RESERVE + 2 * WAL_HEADROOM) /* bytes free to batch at all */
#define BATCH_MAX 1024             /* calls in one batch at most: its frames stay far below that */

struct inode_watch {
	void (*changed)(void *ctx, uint64_t ino);
	void *ctx;
};

/*
 * The rows of the directories names are being made in, kept by the catalog that writes them: a
 * create or rename reads its directory's row three to five times (the kernel's GETATTR of it, the
 * lookup's "not a directory?", the owner of the new inode, the check that it is still linked) and
 * updates its times once. A slot holds one directory's row exactly as SQLite has it: forgotten when
 * SQLite's update hook reports any change of that row, changed in place by the two updates whose
 * result is known without reading (touch_dir(), nlink_add()), all forgotten when a transaction or
 * a call's savepoint is rolled back. Counted on the 2-core machine, a small tensor written under a
 * temp name and renamed read the directory's row 8 times (9 SELECTs by inode in all).
 */
#define DIR_SLOTS 64 /* directly mapped by inode number: a rank's directory each */

struct dir_slot {
	bool valid;
	struct wfs_attr attr;
};

/*
 * Regular files this connection made (wfs_catalog_mknod()) and gave no extended attribute since:
 * a seal asks for the dtype and shape of each file it closes (at the flush and at the seal), and a
 * file a trainer writes under a temp name has none. xattrs is a WITHOUT ROWID table, which SQLite's
 * update hook does not report, so every statement that writes it for an inode clears that inode
 * here (xattrs_written()); a rollback clears all.
 */
#define BARE_SLOTS 64 /* directly mapped by inode number */

/*
 * The redo log (wfs_catalog_redo). The area, in shared memory that outlives the process:
 *
 *   struct redo_head (64 bytes) | record | record | ...      (head.used bytes of records)
 *   record:    u32 bytes (the whole record, a multiple of 8) | u32 statements | u64 seq | statement...
 *   statement: u32 sql bytes | u16 parameters | u16 flags | i64 changes | i64 rowid | sql | parameter...
 *   parameter: u8 SQLite type | INTEGER: i64 | TEXT, BLOB: u32 bytes, bytes | NULL: nothing
 *
 * A record is one call of this API that changed the catalog in a batch: its write statements as it
 * stepped them (the SQL text of the prepared statement and the values bound to it), in order, with
 * what each did (rows changed; the rowid it inserted, 0 when it inserted none) for the replay to
 * check. Records are written past head.used and then published by one release store of head.used,
 * so a process killed mid-record leaves none of it. Every commit of the batch records the seq of
 * its last record in meta 'redo_seq' and then empties the area (head.base = that seq, then
 * head.used = 0), so a replay applies the records numbered above both (see replay). The area is
 * written by the handle's one thread at a time (the caller's serialisation), read only by a
 * successor after the writer died.
 */
#define REDO_MAGIC 0x57465244u /* "WFRD" */
#define REDO_FORMAT 1u
#define REDO_PARAMS 16 /* bound parameters a logged statement may have (the catalog's have 9 at most) */
#define REDO_EXEC 1u   /* statement flag: SQL text run whole by sqlite3_exec(), nothing bound */

struct redo_head {
	uint32_t magic, format;
	_Atomic uint64_t base; /* records numbered up to this one are committed or were dropped */
	_Atomic uint64_t used; /* bytes of records published after the head */
};
#define REDO_HEAD 64u /* bytes: records start here, past the head and room for it to grow */

_Static_assert(sizeof(struct redo_head) <= REDO_HEAD, "records start REDO_HEAD bytes into the area");

/* What a statement about to be stepped has bound (the values SQLite gives no way to read back). */
struct redo_param {
	int type; /* SQLITE_NULL (0: never bound), SQLITE_INTEGER, SQLITE_TEXT, SQLITE_BLOB */
	int64_t i;
	const void *p; /* TEXT or BLOB: the caller's bytes, SQLITE_STATIC (valid until the step) */
	int bytes;
};

struct redo {
	struct redo_head *head; /* the area; NULL: no log */
	size_t bytes;           /* the area's size, head included */
	uint64_t seq;           /* the last record published */
	uint64_t committed;     /* the seq in meta 'redo_seq' as of the last commit */
	bool in_call;           /* between a batched call's begin() and end() */
	bool unlogged;          /* a statement of the call could not be logged: it commits at its end */
	char *call;             /* the call's statements, encoded, until its end() publishes them */
	size_t call_bytes, call_cap;
	uint32_t call_statements;
	sqlite3_stmt *bound;    /* the statement whose bindings params[] shadows, NULL: none */
	bool bound_overflow;    /* a parameter past REDO_PARAMS was bound */
	struct redo_param params[REDO_PARAMS];
};

struct wfs_catalog {
	sqlite3 *db;
	sqlite3_stmt *stmt[ST_COUNT];
	bool readonly;
	int reserve_fd;    /* catalog.db-reserve, -1 when read-only or it could not be created */
	char *wal_path;    /* catalog.db-wal */
	pthread_mutex_t wal_lock; /* wal_fd is opened once, by the first wfs_catalog_wal_sync() */
	int wal_fd;        /* read-only descriptor of the WAL, for fdatasync; -1 until needed */
	bool reserve_used; /* released (or never allocated): allocate again when there is room */
	bool batch;        /* wfs_catalog_batch(): calls are savepoints of one open transaction */
	bool headroom;     /* the WAL has WAL_HEADROOM written past its last frame (wal_headroom) */
	uint64_t wal_frames; /* frames in the WAL after the last commit (batching: wal_frames_hook) */
	_Atomic bool wal_copied; /* a checkpoint copied all of them (wfs_catalog_checkpoint) */
	uint64_t page_size;  /* the database's page size, bytes (a WAL frame: 24 + this) */
	int wal_rw;        /* read-write descriptor of the WAL, for its headroom; -1 until needed */
	char *path;        /* catalog.db */
	dev_t st_dev;      /* the database file as opened (wfs_catalog_rescue), st_ino 0 when unknown */
	ino_t st_ino;
	bool rescued;      /* written again at @path: the WAL and shm files there are the removed one's */
	pthread_mutex_t checkpoint_lock; /* checkpoint_db: wfs_catalog_checkpoint() may run anywhere */
	sqlite3 *checkpoint_db; /* a connection of its own for checkpoints; NULL until needed */
	uint64_t pending;  /* calls in the open batch, not committed yet */
	struct wfs_catalog_timing timing; /* where commits spend their time */
	struct inode_watch watch; /* wfs_catalog_watch_inodes() */
	struct dir_slot dirs[DIR_SLOTS]; /* see struct dir_slot */
	uint64_t bare[BARE_SLOTS];       /* inode numbers, 0 for none: see BARE_SLOTS */
	void (*first_pending)(void *ctx); /* told when a batch gets its first call, or a checkpoint is due */
	void *first_pending_ctx;
	struct redo redo; /* wfs_catalog_redo() */
};

static atomic_bool sqlite_error_logged;

static int map_sqlite(struct wfs_catalog *c, int rc)
{
	switch (rc & 0xff) {
	case SQLITE_OK:
	case SQLITE_DONE:
	case SQLITE_ROW:
		return 0;
	case SQLITE_FULL:
		return -ENOSPC;
	case SQLITE_IOERR:
		/* A full filesystem can also fail an I/O call: growing the WAL's index (catalog.db-shm,
		 * SQLITE_IOERR_SHMSIZE: SQLite writes one byte into each new 4 KiB page of it), or a
		 * write whose errno SQLite keeps. Both are ENOSPC, so that room_for_removal() runs. */
		if (rc == SQLITE_IOERR_SHMSIZE || (c && c->db && sqlite3_system_errno(c->db) == ENOSPC))
			return -ENOSPC;
		break;
	case SQLITE_NOMEM:
		return -ENOMEM;
	case SQLITE_BUSY:
	case SQLITE_LOCKED:
		return -EBUSY;
	case SQLITE_READONLY:
		return -EROFS;
	case SQLITE_CONSTRAINT:
		return -EEXIST;
	case SQLITE_CANTOPEN:
		return -ENOENT;
	case SQLITE_PERM:
	case SQLITE_AUTH:
		return -EACCES;
	default:
		break;
	}
	wfs_log_once(&sqlite_error_logged, WFS_LOG_ERR, "catalog: %s (sqlite %d)",
		     c && c->db ? sqlite3_errmsg(c->db) : sqlite3_errstr(rc), rc);
	return -EIO;
}

/*
 * Binding. Every value bound in this file goes through these, so that a statement logged for a
 * redo (redo_note) carries its values: SQLite gives no way to read a bound value back. The shadow
 * holds one statement's bindings since it was last unbound (stmt(), a fresh prepare) or stepped by
 * step_done(): every statement here is bound in full before each step.
 */
static struct redo_param *redo_param(struct wfs_catalog *c, sqlite3_stmt *s, int i)
{
	if (!c->redo.head)
		return NULL;
	if (c->redo.bound != s) {
		memset(c->redo.params, 0, sizeof(c->redo.params));
		c->redo.bound = s;
		c->redo.bound_overflow = false;
	}
	if (i < 1 || i > REDO_PARAMS) {
		c->redo.bound_overflow = true;
		return NULL;
	}
	return &c->redo.params[i - 1];
}

static int bind_int64(struct wfs_catalog *c, sqlite3_stmt *s, int i, int64_t v)
{
	struct redo_param *p = redo_param(c, s, i);

	if (p)
		*p = (struct redo_param){.type = SQLITE_INTEGER, .i = v};
	return sqlite3_bind_int64(s, i, v);
}

static int bind_int(struct wfs_catalog *c, sqlite3_stmt *s, int i, int v)
{
	return bind_int64(c, s, i, v);
}

/* TEXT: @v NUL-terminated when @bytes < 0; NULL binds NULL (as SQLite does). */
static int bind_text(struct wfs_catalog *c, sqlite3_stmt *s, int i, const char *v, int bytes,
		     void (*destructor)(void *))
{
	struct redo_param *p = redo_param(c, s, i);

	if (p)
		*p = (struct redo_param){.type = v ? SQLITE_TEXT : SQLITE_NULL, .p = v,
					 .bytes = !v ? 0 : bytes < 0 ? (int)strlen(v) : bytes};
	return sqlite3_bind_text(s, i, v, bytes, destructor);
}

static int bind_blob(struct wfs_catalog *c, sqlite3_stmt *s, int i, const void *v, int bytes,
		     void (*destructor)(void *))
{
	struct redo_param *p = redo_param(c, s, i);

	if (p)
		*p = (struct redo_param){.type = v ? SQLITE_BLOB : SQLITE_NULL, .p = v, .bytes = v ? bytes : 0};
	return sqlite3_bind_blob(s, i, v, bytes, destructor);
}
#pragma GCC poison sqlite3_bind_int64 sqlite3_bind_int sqlite3_bind_text sqlite3_bind_blob

/* The cached statement @id, reset and unbound, ready for binding. */
static sqlite3_stmt *stmt(struct wfs_catalog *c, enum stmt_id id)
{
	sqlite3_stmt *s = c->stmt[id];

	sqlite3_reset(s);
	sqlite3_clear_bindings(s);
	if (c->redo.bound == s)
		c->redo.bound = NULL;
	return s;
}

/* Room for @bytes more in the call's record being built. */
static bool redo_room(struct wfs_catalog *c, size_t bytes)
{
	size_t cap = c->redo.call_cap ? c->redo.call_cap : 1024;
	char *p;

	if (c->redo.call_bytes + bytes <= c->redo.call_cap)
		return true;
	while (cap < c->redo.call_bytes + bytes)
		cap *= 2;
	if (!(p = realloc(c->redo.call, cap)))
		return false;
	c->redo.call = p;
	c->redo.call_cap = cap;
	return true;
}

static void redo_put(struct wfs_catalog *c, const void *v, size_t bytes)
{
	memcpy(c->redo.call + c->redo.call_bytes, v, bytes);
	c->redo.call_bytes += bytes;
}

/*
 * Statement @s (SQL @sql, @flags) just changed the catalog inside a batched call: add it, with the
 * values bound to it, what it changed and the rowid it inserted (@rowid_before: the connection's
 * last one before the step), to the call's record. One that cannot be added makes the call commit.
 */
static void redo_note(struct wfs_catalog *c, sqlite3_stmt *s, const char *sql, uint16_t flags,
		      int64_t rowid_before)
{
	int n = s ? sqlite3_bind_parameter_count(s) : 0;
	uint32_t sql_bytes = (uint32_t)strlen(sql);
	uint16_t nparams = (uint16_t)n;
	int64_t changes = sqlite3_changes64(c->db), rowid = sqlite3_last_insert_rowid(c->db);
	size_t need = 4 + 2 + 2 + 8 + 8 + sql_bytes;

	if (rowid == rowid_before)
		rowid = 0; /* inserted into no rowid table: nothing to check */
	if (n > REDO_PARAMS || (n > 0 && (c->redo.bound != s || c->redo.bound_overflow))) {
		c->redo.unlogged = true;
		return;
	}
	for (int i = 0; i < n; i++)
		need += 1 + (c->redo.params[i].type == SQLITE_INTEGER ? 8 :
			     c->redo.params[i].type == SQLITE_NULL ? 0 : 4 + (size_t)c->redo.params[i].bytes);
	if (!redo_room(c, need)) {
		c->redo.unlogged = true;
		return;
	}
	redo_put(c, &sql_bytes, 4);
	redo_put(c, &nparams, 2);
	redo_put(c, &flags, 2);
	redo_put(c, &changes, 8);
	redo_put(c, &rowid, 8);
	redo_put(c, sql, sql_bytes);
	for (int i = 0; i < n; i++) {
		const struct redo_param *p = &c->redo.params[i];
		uint8_t type = (uint8_t)(p->type ? p->type : SQLITE_NULL);
		uint32_t bytes = (uint32_t)p->bytes;

		redo_put(c, &type, 1);
		if (type == SQLITE_INTEGER) {
			redo_put(c, &p->i, 8);
		} else if (type != SQLITE_NULL) {
			redo_put(c, &bytes, 4);
			redo_put(c, p->p, bytes);
		}
	}
	c->redo.call_statements++;
}

/* Records up to the last published are committed, or dropped with their batch: none is replayed. */
static void redo_empty(struct wfs_catalog *c)
{
	if (!c->redo.head)
		return;
	/* In this order: a process killed between the two leaves records that a replay skips. */
	atomic_store_explicit(&c->redo.head->base, c->redo.seq, memory_order_release);
	atomic_store_explicit(&c->redo.head->used, 0, memory_order_release);
}

/*
 * A batched call's savepoint was released into the batch: publish its record (none when it changed
 * nothing). Returns false when the call must commit instead: a statement could not be logged, or
 * the area is full.
 */
static bool redo_publish(struct wfs_catalog *c)
{
	struct redo_head *h = c->redo.head;
	uint64_t used = atomic_load_explicit(&h->used, memory_order_relaxed), seq = c->redo.seq + 1;
	uint32_t bytes = (uint32_t)((16 + c->redo.call_bytes + 7) & ~(size_t)7);
	char *at;

	if (c->redo.unlogged)
		return false;
	if (c->redo.call_statements == 0)
		return true;
	if (bytes > c->redo.bytes - REDO_HEAD - used)
		return false; /* full: this commit empties it */
	at = (char *)h + REDO_HEAD + used;
	memcpy(at, &bytes, 4);
	memcpy(at + 4, &c->redo.call_statements, 4);
	memcpy(at + 8, &seq, 8);
	memcpy(at + 16, c->redo.call, c->redo.call_bytes);
	atomic_store_explicit(&h->used, used + bytes, memory_order_release);
	c->redo.seq = seq;
	return true;
}

/* Run a statement that returns no rows. A change inside a batched call is noted for the redo log. */
static int step_done(struct wfs_catalog *c, sqlite3_stmt *s)
{
	bool logged = c->redo.in_call && !sqlite3_stmt_readonly(s);
	int64_t rowid = logged ? sqlite3_last_insert_rowid(c->db) : 0;
	int rc = sqlite3_step(s);
	int ret = rc == SQLITE_DONE ? 0 : map_sqlite(c, rc);

	if (logged && (rc == SQLITE_DONE || rc == SQLITE_ROW))
		redo_note(c, s, sqlite3_sql(s), 0, rowid);
	if (c->redo.bound == s)
		c->redo.bound = NULL;
	sqlite3_reset(s);
	return rc == SQLITE_ROW ? 0 : ret;
}

static int64_t ts_to_ns(const struct timespec *ts)
{
	return (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec;
}

static struct timespec ns_to_ts(int64_t ns)
{
	struct timespec ts = {.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};

	if (ts.tv_nsec < 0) {
		ts.tv_nsec += 1000000000;
		ts.tv_sec -= 1;
	}
	return ts;
}

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ts_to_ns(&ts);
}

/* Count a phase of @ns into *@n, *@total (may be NULL) and *@max. */
static void timed(uint64_t ns, uint64_t *n, uint64_t *total, uint64_t *max)
{
	(*n)++;
	if (total)
		*total += ns;
	if (ns > *max)
		*max = ns;
}

void wfs_catalog_timing(const struct wfs_catalog *c, struct wfs_catalog_timing *out)
{
	*out = c->timing;
}

/* Fill @a from columns starting at @col (the ATTR_COLS order). */
static void row_to_attr(sqlite3_stmt *s, int col, struct wfs_attr *a)
{
	const void *digest;

	memset(a, 0, sizeof(*a));
	a->ino = (uint64_t)sqlite3_column_int64(s, col + 0);
	a->mode = (uint32_t)sqlite3_column_int64(s, col + 1);
	a->uid = (uint32_t)sqlite3_column_int64(s, col + 2);
	a->gid = (uint32_t)sqlite3_column_int64(s, col + 3);
	a->nlink = (uint32_t)sqlite3_column_int64(s, col + 4);
	a->size = (uint64_t)sqlite3_column_int64(s, col + 5);
	a->parent = (uint64_t)sqlite3_column_int64(s, col + 6);
	a->atime = ns_to_ts(sqlite3_column_int64(s, col + 7));
	a->mtime = ns_to_ts(sqlite3_column_int64(s, col + 8));
	a->ctime = ns_to_ts(sqlite3_column_int64(s, col + 9));
	digest = sqlite3_column_blob(s, col + 10);
	if (digest && sqlite3_column_bytes(s, col + 10) == WFS_DIGEST_BYTES) {
		a->sealed = true;
		memcpy(a->digest.bytes, digest, WFS_DIGEST_BYTES);
	}
	a->rdev = (uint64_t)sqlite3_column_int64(s, col + 11);
}

/* Run a statement that yields at most one ATTR_COLS row. -ENOENT when none. */
static int step_attr(struct wfs_catalog *c, sqlite3_stmt *s, struct wfs_attr *out)
{
	int rc = sqlite3_step(s), ret;

	if (rc == SQLITE_ROW) {
		row_to_attr(s, 0, out);
		ret = 0;
	} else {
		ret = rc == SQLITE_DONE ? -ENOENT : map_sqlite(c, rc);
	}
	sqlite3_reset(s);
	return ret;
}

/*
 * Start a call's transaction: its own, or in a batch a savepoint of the batch's transaction (opened
 * by the first call after a commit).
 */
static int begin(struct wfs_catalog *c)
{
	int ret;

	if (!c->batch)
		return step_done(c, stmt(c, ST_BEGIN));
	if (sqlite3_get_autocommit(c->db)) {
		ret = step_done(c, stmt(c, ST_BEGIN));
		if (ret)
			return ret;
	}
	ret = step_done(c, stmt(c, ST_SAVEPOINT));
	if (ret == 0 && c->redo.head) {
		c->redo.in_call = true;
		c->redo.unlogged = false;
		c->redo.call_bytes = 0;
		c->redo.call_statements = 0;
	}
	return ret;
}

/* Allocate the reserve when the filesystem has room for it twice over; else leave it for later. */
static void reserve_fill(struct wfs_catalog *c)
{
	struct statvfs sv;

	if (c->reserve_fd < 0 || fstatvfs(c->reserve_fd, &sv) < 0 ||
	    (uint64_t)sv.f_bavail * sv.f_frsize < 2ull * CATALOG_RESERVE)
		return;
	if (fallocate(c->reserve_fd, 0, 0, CATALOG_RESERVE) == 0 ||
	    (errno == EOPNOTSUPP && posix_fallocate(c->reserve_fd, 0, CATALOG_RESERVE) == 0)) {
		c->reserve_used = false;
		return;
	}
	if (ftruncate(c->reserve_fd, 0) < 0) /* a partial allocation would only eat the free space */
		WFS_LOG_LIMITED(WFS_LOG_WARN, "catalog reserve: %s", strerror(errno));
}

/*
 * An operation that frees space failed with ENOSPC: release the reserve so that its retry can commit.
 * Returns true when there was a reserve to release (retry), false otherwise.
 */
static bool reserve_release(struct wfs_catalog *c)
{
	if (c->reserve_fd < 0 || c->reserve_used)
		return false;
	c->reserve_used = true;
	if (ftruncate(c->reserve_fd, 0) < 0)
		return false;
	WFS_LOG_LIMITED(WFS_LOG_WARN, "the store's filesystem is full: catalog reserve (%u MiB) released so "
			"that files can be removed", CATALOG_RESERVE >> 20);
	return true;
}

/*
 * An operation that frees space failed with ENOSPC: make room for its retry. A removal grows the WAL
 * by more than a small object frees, so on a full filesystem removals go on only while the WAL is
 * reused: a checkpoint that copies every frame into catalog.db lets the next transaction start it
 * over in the blocks it has. The daemon's committer thread checkpoints beside the handlers, but
 * under load it falls behind a run of removals (3,000 from a full store failed with ENOSPC after
 * 862 of them), so the caller checkpoints here, itself. When that cannot copy every frame (catalog.db
 * must grow, and cannot), the reserve is released and the checkpoint tried again in its room.
 * Returns true when a retry may commit, false otherwise.
 */
static bool room_for_removal(struct wfs_catalog *c)
{
	bool released;

	if (c->readonly || !sqlite3_get_autocommit(c->db))
		return reserve_release(c); /* the WAL starts over only at a transaction's start */
	if (wfs_catalog_checkpoint(c) == 0 && atomic_load(&c->wal_copied))
		return true;
	released = reserve_release(c);
	if (released)
		(void)wfs_catalog_checkpoint(c); /* a partial one leaves the reserve's room to the WAL */
	return released;
}

/* The batch's transaction ended without a commit (SQLite rolls back on some errors by itself). */
static void batch_lost(struct wfs_catalog *c, int ret)
{
	if (c->pending)
		wfs_log(WFS_LOG_ERR, "catalog: %llu changes since the last commit are lost: %s",
			(unsigned long long)c->pending, strerror(-ret));
	c->pending = 0;
	redo_empty(c); /* their records must not come back at a replay */
}

static struct dir_slot *dir_slot(struct wfs_catalog *c, uint64_t ino)
{
	return &c->dirs[ino % DIR_SLOTS];
}

/* The kept row of directory @ino into *@out, if there is one. */
static bool dir_kept(struct wfs_catalog *c, uint64_t ino, struct wfs_attr *out)
{
	struct dir_slot *d = dir_slot(c, ino);

	if (!d->valid || d->attr.ino != ino)
		return false;
	*out = d->attr;
	return true;
}

static void dir_keep(struct wfs_catalog *c, const struct wfs_attr *a)
{
	if (S_ISDIR(a->mode))
		*dir_slot(c, a->ino) = (struct dir_slot){.valid = true, .attr = *a};
}

/* Forget what the catalog keeps (the directory rows, the bare files): a rollback may have undone
 * it, and hands inode numbers out again. */
static void kept_forget(struct wfs_catalog *c)
{
	for (size_t i = 0; i < DIR_SLOTS; i++)
		c->dirs[i].valid = false;
	memset(c->bare, 0, sizeof(c->bare));
}

/* Has regular file @ino no extended attribute (BARE_SLOTS)? false when not known. */
static bool is_bare(const struct wfs_catalog *c, uint64_t ino)
{
	return ino && c->bare[ino % BARE_SLOTS] == ino;
}

/* A statement wrote (or is about to write) extended attributes of @ino. */
static void xattrs_written(struct wfs_catalog *c, uint64_t ino)
{
	if (is_bare(c, ino))
		c->bare[ino % BARE_SLOTS] = 0;
}

static void update_hook(void *arg, int op, const char *dbname, const char *table, sqlite3_int64 rowid)
{
	struct wfs_catalog *c = arg;
	struct dir_slot *d;

	(void)op, (void)dbname;
	if (strcmp(table, "inodes") != 0)
		return;
	d = dir_slot(c, (uint64_t)rowid);
	if (d->attr.ino == (uint64_t)rowid)
		d->valid = false;
	if (c->watch.changed)
		c->watch.changed(c->watch.ctx, (uint64_t)rowid);
}

static void rollback_hook(void *arg)
{
	struct wfs_catalog *c = arg;

	kept_forget(c);
	if (c->watch.changed)
		c->watch.changed(c->watch.ctx, 0);
}

void wfs_catalog_watch_inodes(struct wfs_catalog *c, void (*changed)(void *ctx, uint64_t ino), void *ctx)
{
	c->watch.changed = changed;
	c->watch.ctx = ctx;
}

/* SQLite's word after each commit of a batching handle: the frames now in the WAL. */
static int wal_frames_hook(void *ctx, sqlite3 *db, const char *name, int frames)
{
	struct wfs_catalog *c = ctx;

	(void)db, (void)name;
	c->wal_frames = (uint64_t)frames;
	atomic_store(&c->wal_copied, false);
	return SQLITE_OK;
}

/*
 * Keep WAL_HEADROOM bytes of written zeros past the WAL's last frame, by extending the file (SQLite
 * reads frames only up to the last valid one, so a longer file changes nothing for it). SQLite rolls
 * a transaction back when its COMMIT meets a full filesystem, and a batch's changes were answered
 * before it: a batch is only kept open while its commit needs no free space. Written zeros, not
 * fallocate(2): every filesystem has them, and a commit over them changes no size and no extent.
 * Returns whether the headroom is in place.
 */
static bool wal_headroom(struct wfs_catalog *c)
{
	static const char zeros[64 << 10];
	struct statvfs sv;
	struct stat st;
	uint64_t used, want, t0;

	if (c->wal_rw < 0)
		c->wal_rw = open(c->wal_path, O_RDWR | O_CLOEXEC);
	if (c->wal_rw < 0 || fstat(c->wal_rw, &st) < 0 || st.st_size < 32)
		return false; /* no WAL yet (SQLite writes its header first) */
	/* Near full, not at all: a checkpoint cannot grow catalog.db then, so the WAL (and its index)
	 * would grow past any headroom, and a full filesystem must fail the call that meets it. */
	if (fstatvfs(c->wal_rw, &sv) < 0 || (uint64_t)sv.f_bavail * sv.f_frsize < BATCH_MIN_FREE)
		return false;
	used = 32 + c->wal_frames * (24 + c->page_size);
	if ((uint64_t)st.st_size >= used + WAL_HEADROOM / 2)
		return true;
	want = (used + WAL_HEADROOM + 4095) & ~(uint64_t)4095;
	t0 = wfs_clock_ns();

	for (uint64_t off = (uint64_t)st.st_size; off < want;) {
		size_t n = want - off < sizeof(zeros) ? (size_t)(want - off) : sizeof(zeros);
		ssize_t w = pwrite(c->wal_rw, zeros, n, (off_t)off);

		if (w <= 0)
			return false; /* ENOSPC: what was written stays, harmless */
		off += (uint64_t)w;
	}
	timed(wfs_clock_ns() - t0, &c->timing.refills, &c->timing.refill_ns, &c->timing.refill_max_ns);
	return true;
}

/*
 * Commit the open transaction. One that meets a full filesystem releases the reserve and runs once
 * more if SQLite kept the transaction. On failure the transaction stays open where SQLite kept it.
 */
static int commit(struct wfs_catalog *c)
{
	int ret = wfs_fault("catalog.commit");
	uint64_t t0 = wfs_clock_ns();

	if (ret == 0 && c->batch && c->redo.seq != c->redo.committed) {
		sqlite3_stmt *s = stmt(c, ST_REDO_SEQ); /* the last record this commit holds */

		bind_int64(c, s, 1, (int64_t)c->redo.seq);
		ret = step_done(c, s);
	}
	if (ret == 0) {
		ret = step_done(c, stmt(c, ST_COMMIT));
		timed(wfs_clock_ns() - t0, &c->timing.commits, &c->timing.commit_ns, &c->timing.commit_max_ns);
	}
	if (ret == -ENOSPC && c->batch && !sqlite3_get_autocommit(c->db) && reserve_release(c))
		ret = step_done(c, stmt(c, ST_COMMIT));
	if (ret == 0) {
		c->pending = 0;
		if (c->batch && c->redo.head) {
			c->redo.committed = c->redo.seq;
			redo_empty(c);
		}
		if (c->reserve_used) {
			t0 = wfs_clock_ns();
			reserve_fill(c);
			timed(wfs_clock_ns() - t0, &c->timing.reserve_fills, NULL, &c->timing.reserve_max_ns);
		}
		if (c->batch)
			c->headroom = wal_headroom(c);
	}
	return ret;
}

/*
 * End a call's transaction: commit when @ret is 0, roll back otherwise; returns the first error. In a
 * batch, the call's savepoint is released into the batch, or rolled back alone. The batch is
 * committed at once when it reaches BATCH_MAX calls, and after every call while the WAL has no
 * headroom (a full filesystem then fails the call that meets it, not a later commit).
 */
static int end(struct wfs_catalog *c, int ret)
{
	c->redo.in_call = false;
	if (c->batch) {
		bool logged;

		if (sqlite3_get_autocommit(c->db)) { /* SQLite rolled the whole batch back */
			kept_forget(c);
			batch_lost(c, ret ? ret : -EIO);
			return ret ? ret : -EIO;
		}
		if (ret) {
			step_done(c, stmt(c, ST_ROLLBACK_TO));
			step_done(c, stmt(c, ST_RELEASE));
			kept_forget(c); /* no hook tells what a savepoint's rollback undid */
			return ret;
		}
		ret = step_done(c, stmt(c, ST_RELEASE));
		if (ret)
			return ret;
		if (!c->headroom) {
			/* Alone in its batch (the headroom is known after each commit): committed now, and
			 * on failure rolled back, so the caller's error means "nothing changed". */
			ret = commit(c);
			if (ret && !sqlite3_get_autocommit(c->db))
				step_done(c, stmt(c, ST_ROLLBACK));
			c->pending = 0;
			if (c->first_pending && wfs_catalog_checkpoint_due(c) == WFS_CHECKPOINT_NOW)
				c->first_pending(c->first_pending_ctx); /* the WAL grows with each of them */
			return ret;
		}
		logged = !c->redo.head || redo_publish(c);
		if (c->pending++ == 0 && c->first_pending)
			c->first_pending(c->first_pending_ctx);
		/* Answered already: on failure the committer tries again. */
		if (c->pending >= BATCH_MAX || !logged)
			wfs_catalog_commit(c);
		return 0;
	}
	if (ret == 0) {
		ret = commit(c);
		if (ret == 0)
			return 0;
	}
	if (!sqlite3_get_autocommit(c->db))
		step_done(c, stmt(c, ST_ROLLBACK));
	return ret;
}

int wfs_catalog_batch(struct wfs_catalog *c, bool on, void (*first_pending)(void *ctx), void *ctx)
{
	int ret = on ? 0 : wfs_catalog_commit(c);

	if (ret)
		return ret;
	if (c->readonly)
		return on ? -EROFS : 0;
	/* Checkpoints, which sync catalog.db, run outside the batch: wfs_catalog_checkpoint(). */
	ret = map_sqlite(c, sqlite3_exec(c->db, on ? "PRAGMA wal_autocheckpoint=0" : "PRAGMA wal_autocheckpoint=1000",
					 NULL, NULL, NULL));
	if (ret)
		return ret;
	if (on)
		sqlite3_wal_hook(c->db, wal_frames_hook, c); /* the PRAGMA above removed SQLite's own */
	c->batch = on;
	c->headroom = false; /* until the first commit tells the WAL's frames (wal_frames_hook) */
	c->first_pending = on ? first_pending : NULL;
	c->first_pending_ctx = on ? ctx : NULL;
	return 0;
}


/* The integer value of meta row @key into *@out, 0 when the row is absent. 0 or -errno. */
static int meta_u64(struct wfs_catalog *c, const char *key, uint64_t *out)
{
	sqlite3_stmt *s;
	int rc = sqlite3_prepare_v2(c->db, "SELECT value FROM meta WHERE key = ?1", -1, &s, NULL);

	if (rc != SQLITE_OK)
		return map_sqlite(c, rc);
	bind_text(c, s, 1, key, -1, SQLITE_STATIC);
	rc = sqlite3_step(s);
	if (rc == SQLITE_ROW || rc == SQLITE_DONE) {
		*out = rc == SQLITE_ROW ? (uint64_t)sqlite3_column_int64(s, 0) : 0;
		rc = SQLITE_OK;
	}
	sqlite3_finalize(s);
	return map_sqlite(c, rc);
}

/* The seq of the last redo record committed (meta 'redo_seq'), 0 when none ever was. */
static int redo_committed(struct wfs_catalog *c, uint64_t *seq)
{
	return meta_u64(c, "redo_seq", seq);
}

int wfs_catalog_redo(struct wfs_catalog *c, void *area, size_t bytes)
{
	struct redo_head *h = area;
	uint64_t seq = 0;
	int ret;

	if (c->readonly)
		return -EROFS;
	if (area && (bytes < WFS_CATALOG_REDO_MIN || bytes % 8 || (uintptr_t)area % 8))
		return -EINVAL;
	ret = wfs_catalog_commit(c); /* what is pending has no record */
	if (ret == 0 && area)
		ret = redo_committed(c, &seq);
	if (ret)
		return ret;
	c->redo.head = NULL;
	c->redo.bound = NULL;
	if (!area)
		return 0;
	atomic_store(&h->used, 0);
	atomic_store(&h->base, seq);
	h->format = REDO_FORMAT;
	h->magic = REDO_MAGIC;
	c->redo.seq = c->redo.committed = seq;
	c->redo.bytes = bytes;
	c->redo.head = h;
	return 0;
}

/* Reading a record: @n bytes at *@at, within @tail. */
static bool redo_take(const char **at, const char *tail, void *v, size_t n)
{
	if ((size_t)(tail - *at) < n)
		return false;
	memcpy(v, *at, n);
	*at += n;
	return true;
}

/*
 * Apply one logged statement (at *@at, within @tail; *@at moves past it) and check that it did what
 * it did when it was logged. Returns 0, -EPROTO (damaged, or it did something else: logged), or
 * the statement's -errno.
 */
static int redo_apply(struct wfs_catalog *c, uint64_t seq, const char **at, const char *tail)
{
	uint32_t sql_bytes;
	uint16_t nparams, flags;
	int64_t changes, rowid;
	const char *sql;
	char *text = NULL;
	sqlite3_stmt *s = NULL;
	bool cached = false;
	int ret = -EPROTO;

	if (!redo_take(at, tail, &sql_bytes, 4) || !redo_take(at, tail, &nparams, 2) ||
	    !redo_take(at, tail, &flags, 2) || !redo_take(at, tail, &changes, 8) || !redo_take(at, tail, &rowid, 8) ||
	    (size_t)(tail - *at) < sql_bytes || nparams > REDO_PARAMS)
		goto out;
	sql = *at;
	*at += sql_bytes;
	if (!(text = strndup(sql, sql_bytes))) {
		ret = -ENOMEM;
		goto out;
	}
	if (flags & REDO_EXEC) {
		ret = map_sqlite(c, sqlite3_exec(c->db, text, NULL, NULL, NULL));
		goto out;
	}
	for (int i = 0; i < ST_COUNT && !cached; i++) {
		if (strcmp(stmt_sql[i], text) == 0) {
			s = stmt(c, (enum stmt_id)i);
			cached = true;
		}
	}
	if (!cached && (ret = map_sqlite(c, sqlite3_prepare_v2(c->db, text, -1, &s, NULL))) != 0)
		goto out;
	ret = -EPROTO;
	if (!s || sqlite3_bind_parameter_count(s) != nparams)
		goto out;
	for (int i = 1; i <= nparams; i++) {
		uint8_t type;
		int64_t v;
		uint32_t bytes;

		if (!redo_take(at, tail, &type, 1))
			goto out;
		if (type == SQLITE_INTEGER) {
			if (!redo_take(at, tail, &v, 8))
				goto out;
			bind_int64(c, s, i, v);
		} else if (type == SQLITE_TEXT || type == SQLITE_BLOB) {
			if (!redo_take(at, tail, &bytes, 4) || (size_t)(tail - *at) < bytes || bytes > INT_MAX)
				goto out;
			if (type == SQLITE_TEXT)
				bind_text(c, s, i, *at, (int)bytes, SQLITE_TRANSIENT);
			else
				bind_blob(c, s, i, bytes ? *at : "", (int)bytes, SQLITE_TRANSIENT);
			*at += bytes;
		} else if (type != SQLITE_NULL) {
			goto out;
		}
	}
	{
		ret = step_done(c, s);
		if (ret)
			goto out;
		if (sqlite3_changes64(c->db) != changes || (rowid && sqlite3_last_insert_rowid(c->db) != rowid)) {
			wfs_log(WFS_LOG_ERR, "catalog: redo record %llu: \"%s\" changed %lld rows (rowid %lld), "
				"%lld (rowid %lld) when it was logged: the catalog is not the one it was logged "
				"against", (unsigned long long)seq, text, (long long)sqlite3_changes64(c->db),
				(long long)sqlite3_last_insert_rowid(c->db), (long long)changes, (long long)rowid);
			ret = -EPROTO;
		}
	}
out:
	if (ret == -EPROTO && !text)
		wfs_log(WFS_LOG_ERR, "catalog: redo record %llu is damaged", (unsigned long long)seq);
	if (!cached)
		sqlite3_finalize(s);
	free(text);
	return ret;
}

int wfs_catalog_redo_replay(struct wfs_catalog *c, const void *area, size_t bytes, uint64_t *records)
{
	const struct redo_head *h = area;
	const char *at, *tail;
	uint64_t committed = 0, from, last, n = 0, used;
	int ret;

	if (c->batch || c->redo.head)
		return -EBUSY;
	if (!area || bytes < REDO_HEAD || h->magic != REDO_MAGIC) {
		*records = 0; /* never used */
		return 0;
	}
	used = atomic_load_explicit(&h->used, memory_order_acquire);
	if (h->format != REDO_FORMAT || used > bytes - REDO_HEAD) {
		wfs_log(WFS_LOG_ERR, "catalog: the redo log has format %u and %llu bytes, this build reads "
			"format %u in %zu", h->format, (unsigned long long)used, REDO_FORMAT, bytes - REDO_HEAD);
		return -EPROTO;
	}
	ret = redo_committed(c, &committed);
	if (ret)
		return ret;
	last = from = committed > atomic_load(&h->base) ? committed : atomic_load(&h->base);
	at = (const char *)h + REDO_HEAD;
	tail = at + used;
	ret = begin(c);
	while (ret == 0 && at < tail) {
		uint32_t rec_bytes, statements;
		uint64_t seq;
		const char *rec = at, *rec_end;

		if (!redo_take(&at, tail, &rec_bytes, 4) || !redo_take(&at, tail, &statements, 4) ||
		    !redo_take(&at, tail, &seq, 8) || rec_bytes < 16 || rec_bytes % 8 ||
		    (size_t)(tail - rec) < rec_bytes) {
			wfs_log(WFS_LOG_ERR, "catalog: the redo log is damaged after record %llu",
				(unsigned long long)last);
			ret = -EPROTO;
			break;
		}
		rec_end = rec + rec_bytes;
		if (seq > from) {
			if (seq != last + 1) {
				wfs_log(WFS_LOG_ERR, "catalog: redo record %llu follows %llu: the records between "
					"are missing", (unsigned long long)seq, (unsigned long long)last);
				ret = -EPROTO;
				break;
			}
			for (uint32_t i = 0; ret == 0 && i < statements; i++)
				ret = redo_apply(c, seq, &at, rec_end);
			last = seq;
			n++;
		}
		at = rec_end;
	}
	if (ret == 0 && n) {
		sqlite3_stmt *s = stmt(c, ST_REDO_SEQ);

		bind_int64(c, s, 1, (int64_t)last);
		ret = step_done(c, s);
	}
	ret = end(c, ret);
	if (ret == 0)
		*records = n;
	return ret;
}

int wfs_catalog_commit(struct wfs_catalog *c)
{
	int ret;

	if (!c->batch || sqlite3_get_autocommit(c->db))
		return 0;
	ret = commit(c);
	if (ret && sqlite3_get_autocommit(c->db))
		batch_lost(c, ret);
	return ret;
}

enum wfs_checkpoint_need wfs_catalog_checkpoint_due(const struct wfs_catalog *c)
{
	uint64_t bytes = c->wal_frames * (24 + (uint64_t)c->page_size);

	if (c->readonly || !c->batch || atomic_load(&c->wal_copied))
		return WFS_CHECKPOINT_NONE;
	if (!c->headroom)
		return bytes >= WAL_CHECKPOINT_FULL ? WFS_CHECKPOINT_NOW : WFS_CHECKPOINT_NONE;
	return bytes >= WAL_CHECKPOINT_FORCE ? WFS_CHECKPOINT_NOW :
	       bytes >= WAL_CHECKPOINT_BYTES ? WFS_CHECKPOINT_DUE : WFS_CHECKPOINT_NONE;
}

int wfs_catalog_checkpoint(struct wfs_catalog *c)
{
	int rc = SQLITE_OK, log = -1, copied = -1;

	if (c->readonly)
		return 0;
	pthread_mutex_lock(&c->checkpoint_lock);
	if (!c->checkpoint_db) {
		rc = sqlite3_open_v2(c->path, &c->checkpoint_db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX,
				     NULL);
		if (rc != SQLITE_OK) {
			sqlite3_close(c->checkpoint_db);
			c->checkpoint_db = NULL;
			goto out;
		}
		sqlite3_busy_timeout(c->checkpoint_db, 5000);
		/* A fresh connection knows the WAL only once it has read the database. */
		rc = sqlite3_exec(c->checkpoint_db, "PRAGMA journal_mode=WAL", NULL, NULL, NULL);
		if (rc != SQLITE_OK) {
			sqlite3_close(c->checkpoint_db);
			c->checkpoint_db = NULL;
			goto out;
		}
	}
	rc = sqlite3_wal_checkpoint_v2(c->checkpoint_db, NULL, SQLITE_CHECKPOINT_PASSIVE, &log, &copied);
	if (rc == SQLITE_OK && log >= 0 && copied == log)
		atomic_store(&c->wal_copied, true); /* until the next commit: nothing more to copy */
out:
	pthread_mutex_unlock(&c->checkpoint_lock);
	return map_sqlite(NULL, rc);
}

void wfs_catalog_rollback(struct wfs_catalog *c)
{
	if (!c->batch || sqlite3_get_autocommit(c->db))
		return;
	step_done(c, stmt(c, ST_ROLLBACK));
	c->pending = 0;
	redo_empty(c);
}

uint64_t wfs_catalog_pending(const struct wfs_catalog *c)
{
	return c->pending;
}

static int exec(struct wfs_catalog *c, const char *sql)
{
	int ret = map_sqlite(c, sqlite3_exec(c->db, sql, NULL, NULL, NULL));

	if (ret == 0 && c->redo.in_call && strncmp(sql, "PRAGMA", 6) != 0)
		redo_note(c, NULL, sql, REDO_EXEC, 0);
	return ret;
}

static int get_schema_version(struct wfs_catalog *c, int64_t *version)
{
	sqlite3_stmt *s;
	int rc;

	rc = sqlite3_prepare_v2(c->db, "SELECT value FROM meta WHERE key = 'schema_version'", -1, &s, NULL);
	/* No meta table yet: a new file. Any other error (a damaged schema page also fails the
	 * prepare with SQLITE_ERROR) is not "no catalog": fsck reported ENOENT for a damaged one. */
	if (rc == SQLITE_ERROR && strncmp(sqlite3_errmsg(c->db), "no such table", 13) == 0)
		return -ENOENT;
	if (rc != SQLITE_OK)
		return map_sqlite(c, rc == SQLITE_ERROR ? SQLITE_CORRUPT : rc);
	rc = sqlite3_step(s);
	*version = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
	sqlite3_finalize(s);
	/* No row: not made yet. A failed step (a damaged page) is damage, not "no catalog": -EIO, not
	 * logged, for the caller to tell (wfs_catalog_diagnose says how it is damaged). */
	if (rc == SQLITE_ROW || rc == SQLITE_DONE)
		return rc == SQLITE_ROW ? 0 : -ENOENT;
	if ((rc & 0xff) == SQLITE_CORRUPT || (rc & 0xff) == SQLITE_NOTADB || rc == SQLITE_ERROR)
		return -EIO;
	return map_sqlite(c, rc);
}

static int create_schema(struct wfs_catalog *c, uint32_t uid, uint32_t gid)
{
	char sql[512];
	int64_t t = now_ns();
	int ret;

	ret = exec(c, "BEGIN IMMEDIATE");
	if (ret)
		return ret;
	ret = exec(c, schema_sql);
	if (ret == 0) {
		snprintf(sql, sizeof(sql),
			 "INSERT OR IGNORE INTO meta(key, value) VALUES('schema_version', %d);"
			 "INSERT OR IGNORE INTO inodes(ino, mode, uid, gid, nlink, parent, atime, mtime, ctime)"
			 " VALUES(%d, %u, %u, %u, 2, %d, %lld, %lld, %lld);",
			 SCHEMA_VERSION, WFS_ROOT_INO, (unsigned)(S_IFDIR | 0755), uid, gid, WFS_ROOT_INO,
			 (long long)t, (long long)t, (long long)t);
		ret = exec(c, sql);
	}
	if (ret) {
		exec(c, "ROLLBACK");
		return ret;
	}
	return exec(c, "COMMIT");
}

/*
 * Bring a catalog of schema 1 to SCHEMA_VERSION in one transaction: an added column, so a daemon of
 * the old schema that still runs keeps working until it remounts. A read-only handle upgrades through
 * a short read-write connection of its own, so inspection tools still open a store that no new daemon
 * has mounted yet (where the catalog cannot be written, the version check then refuses it).
 */
static int migrate_schema(struct wfs_catalog *c, const char *path, int64_t *version)
{
	static const char sql[] = "BEGIN IMMEDIATE;"
				  "ALTER TABLE inodes ADD COLUMN rdev INTEGER NOT NULL DEFAULT 0;"
				  "UPDATE meta SET value = 2 WHERE key = 'schema_version';"
				  "COMMIT;";
	sqlite3 *db = c->db;
	int rc;

	if (*version != 1)
		return 0;
	if (c->readonly && sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL)) {
		sqlite3_close(db);
		return 0;
	}
	sqlite3_busy_timeout(db, 5000);
	rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
	if (rc != SQLITE_OK && !sqlite3_get_autocommit(db))
		sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
	if (db != c->db)
		sqlite3_close(db);
	if (rc != SQLITE_OK)
		return c->readonly ? 0 : map_sqlite(c, rc);
	*version = 2;
	wfs_log(WFS_LOG_INFO, "catalog %s: schema 1 upgraded to 2 (device numbers)", path);
	return 0;
}

/* Copy database @from (a path; or, with @from NULL, connection @src's) into a new file @to (removed
 * first) with SQLite's backup API, in rollback journal mode, and sync it with @durable. Returns 0 or
 * -errno. */
static int copy_database(const char *from, sqlite3 *src, const char *to, bool durable)
{
	sqlite3 *own = NULL, *dst = NULL;
	sqlite3_backup *b;
	int rc = SQLITE_OK, ret = 0, fd;

	unlink(to);
	if (from) {
		rc = sqlite3_open_v2(from, &own, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL);
		src = own;
		if (rc == SQLITE_OK)
			sqlite3_busy_timeout(src, 5000);
	}
	if (rc == SQLITE_OK)
		rc = sqlite3_open_v2(to, &dst, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
	if (rc == SQLITE_OK) {
		b = sqlite3_backup_init(dst, "main", src, "main");
		if (!b) {
			rc = sqlite3_errcode(dst);
		} else {
			rc = sqlite3_backup_step(b, -1); /* every page, from one read snapshot */
			sqlite3_backup_finish(b);
			rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
		}
	}
	/* The copy carries the source's WAL mode in its header: a file of its own instead, which a
	 * read-only open (wfs_catalog_diagnose) reads without making -wal and -shm beside it. */
	if (rc == SQLITE_OK)
		rc = sqlite3_exec(dst, "PRAGMA journal_mode=DELETE", NULL, NULL, NULL);
	if (rc != SQLITE_OK) {
		wfs_log(WFS_LOG_ERR, "catalog backup %s -> %s: %s", from ? from : "(open catalog)", to,
			dst && sqlite3_errcode(dst) != SQLITE_OK ? sqlite3_errmsg(dst)
			: src ? sqlite3_errmsg(src) : sqlite3_errstr(rc));
		ret = map_sqlite(NULL, rc == SQLITE_ERROR ? SQLITE_IOERR : rc);
	}
	sqlite3_close(dst); /* a WAL the copy opened is checkpointed and removed here */
	sqlite3_close(own);
	if (ret == 0 && durable) {
		fd = open(to, O_RDONLY | O_CLOEXEC);
		if (fd < 0 || fsync(fd) < 0)
			ret = -errno;
		if (fd >= 0)
			close(fd);
	}
	if (ret)
		unlink(to);
	return ret;
}

/* fsync(2) of the directory that holds @path. */
static int sync_parent(const char *path)
{
	char dir[PATH_MAX];
	char *slash;
	int fd, ret = 0;

	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (slash)
		*(slash == dir ? slash + 1 : slash) = '\0';
	else
		snprintf(dir, sizeof(dir), ".");
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || fsync(fd) < 0)
		ret = -errno;
	if (fd >= 0)
		close(fd);
	return ret;
}

int wfs_catalog_backup(struct wfs_catalog *c, const char *dest, bool durable)
{
	char tmp[PATH_MAX];
	int ret;

	if (snprintf(tmp, sizeof(tmp), "%s.tmp", dest) >= (int)sizeof(tmp))
		return -ENAMETOOLONG;
	ret = copy_database(c->path, NULL, tmp, durable);
	if (ret == 0) {
		char why[256];
		int check = wfs_catalog_diagnose(tmp, why, sizeof(why));

		/* A damaged catalog makes a damaged copy: keep the last good one instead. */
		if (check) {
			wfs_log(WFS_LOG_ERR, "catalog backup %s: the copy fails its check (%s): not kept", dest,
				check == 1 ? why : strerror(-check));
			unlink(tmp);
			return -EIO;
		}
	}
	if (ret == 0 && rename(tmp, dest) < 0) {
		ret = -errno;
		unlink(tmp);
	}
	if (ret == 0 && durable)
		ret = sync_parent(dest);
	return ret;
}

int wfs_catalog_rescue(struct wfs_catalog *c)
{
	char tmp[PATH_MAX];
	struct stat st;
	int ret;

	if (c->readonly || c->st_ino == 0 || c->rescued)
		return 0;
	if (stat(c->path, &st) == 0 ? st.st_dev == c->st_dev && st.st_ino == c->st_ino : errno != ENOENT)
		return 0; /* still its file, or not known to be gone (EACCES, EIO): nothing written over it */
	if (snprintf(tmp, sizeof(tmp), "%s.rescue", c->path) >= (int)sizeof(tmp))
		return -ENAMETOOLONG;
	ret = copy_database(NULL, c->db, tmp, true);
	if (ret == 0 && rename(tmp, c->path) < 0) {
		ret = -errno;
		unlink(tmp);
	}
	if (ret == 0)
		ret = sync_parent(c->path);
	if (ret == 0)
		c->rescued = true;
	wfs_log(ret ? WFS_LOG_ERR : WFS_LOG_WARN, "catalog %s was removed or replaced while in use: %s%s", c->path,
		ret ? "writing the names it held there again failed: " : "the names it held are written there again",
		ret ? strerror(-ret) : "");
	return ret ? ret : 1;
}

int wfs_catalog_restore(const char *backup, const char *path, char *aside)
{
	static const char *const suffixes[] = {"", "-wal", "-shm"};
	char why[256], from[PATH_MAX], to[PATH_MAX + 32];
	long now = (long)time(NULL);
	int ret = wfs_catalog_diagnose(backup, why, sizeof(why));

	if (ret == 1) {
		wfs_log(WFS_LOG_ERR, "catalog backup %s is damaged too: %s", backup, why);
		return -EIO;
	}
	if (ret)
		return ret;
	snprintf(aside, PATH_MAX, "%s.damaged-%ld", path, now);
	for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++) {
		snprintf(from, sizeof(from), "%s%s", path, suffixes[i]);
		snprintf(to, sizeof(to), "%s%s", aside, suffixes[i]);
		if (rename(from, to) < 0 && errno != ENOENT)
			return -errno;
	}
	ret = copy_database(backup, NULL, path, true);
	if (ret == 0)
		ret = sync_parent(path);
	return ret;
}

/*
 * Open the catalog at @path read-only, for an inspection that must make no file: the caller checks
 * first that it exists (SQLite is not asked about a missing one). With no "-wal" beside it no writer
 * has it open (a writer's WAL lives until its last handle closes, which checkpoints it into the file
 * and removes it), so the file is opened immutable (mode=ro&immutable=1): SQLite then neither looks
 * for a WAL nor makes -wal and -shm, which a plain read-only open of a WAL database does wherever it
 * may write the directory. With a "-wal" there (a daemon serving the store, or one killed before it
 * closed) the open is the usual read-only one, which reads that WAL through its -shm. A writer that
 * starts after an immutable open is not seen by it (an inspection of an unmounted store). Returns
 * SQLite's code; *@db is to be closed either way.
 */
static int open_readonly(const char *path, int flags, sqlite3 **db)
{
	static const char hex[] = "0123456789ABCDEF";
	char wal[PATH_MAX + 8], uri[3 * PATH_MAX + 64];
	size_t n = 0;

	*db = NULL;
	snprintf(wal, sizeof(wal), "%s-wal", path);
	if (access(wal, F_OK) == 0 || errno != ENOENT)
		return sqlite3_open_v2(path, db, flags | SQLITE_OPEN_READONLY, NULL);
	/* A URI: each byte outside RFC 3986's unreserved set and "/" percent-encoded. */
	n = (size_t)snprintf(uri, sizeof(uri), "file:");
	for (const unsigned char *p = (const unsigned char *)path; *p && n + 4 < sizeof(uri); p++) {
		if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
		    strchr("/-._~", *p)) {
			uri[n++] = (char)*p;
		} else {
			uri[n++] = '%';
			uri[n++] = hex[*p >> 4];
			uri[n++] = hex[*p & 15];
		}
	}
	snprintf(uri + n, sizeof(uri) - n, "?mode=ro&immutable=1");
	return sqlite3_open_v2(uri, db, flags | SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, NULL);
}

int wfs_catalog_diagnose(const char *path, char *what, size_t what_bytes)
{
	sqlite3 *db = NULL;
	sqlite3_stmt *s = NULL;
	int rc, ret = 0;

	snprintf(what, what_bytes, "ok");
	if (access(path, F_OK) < 0)
		return -errno;
	rc = open_readonly(path, SQLITE_OPEN_NOMUTEX, &db);
	if (rc == SQLITE_OK)
		rc = sqlite3_prepare_v2(db, "PRAGMA quick_check(1)", -1, &s, NULL);
	if (rc == SQLITE_OK) {
		rc = sqlite3_step(s);
		if (rc == SQLITE_ROW) {
			const char *text = (const char *)sqlite3_column_text(s, 0);

			if (text && strcmp(text, "ok") != 0) {
				/* "*** in database main ***\nPage 4: ...": its first line says no more */
				const char *line = strncmp(text, "***", 3) == 0 && strchr(text, '\n') ? strchr(text, '\n') + 1
													 : text;

				snprintf(what, what_bytes, "%.*s", (int)strcspn(line, "\n"), line);
				ret = 1;
			}
			rc = SQLITE_OK;
		}
	}
	if (rc != SQLITE_OK) {
		if ((rc & 0xff) == SQLITE_NOMEM)
			ret = -ENOMEM;
		else if ((rc & 0xff) == SQLITE_CANTOPEN || (rc & 0xff) == SQLITE_PERM)
			ret = -EACCES;
		else if ((rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED)
			ret = -EBUSY;
		else {
			snprintf(what, what_bytes, "%s", db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
			ret = 1;
		}
	}
	sqlite3_finalize(s);
	sqlite3_close(db);
	return ret;
}

int wfs_catalog_open(const char *path, unsigned flags, uint32_t root_uid, uint32_t root_gid,
		     struct wfs_catalog **out)
{
	bool readonly = flags & WFS_CATALOG_READONLY;
	int oflags = SQLITE_OPEN_NOMUTEX | (readonly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE);
	struct wfs_catalog *c;
	int64_t version = 0;
	int ret;

	if ((flags & WFS_CATALOG_CREATE) && !readonly)
		oflags |= SQLITE_OPEN_CREATE;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->readonly = readonly;
	c->reserve_fd = -1;
	c->wal_fd = -1;
	c->wal_rw = -1;
	pthread_mutex_init(&c->wal_lock, NULL);
	pthread_mutex_init(&c->checkpoint_lock, NULL);
	if (!(c->path = strdup(path))) {
		ret = -ENOMEM;
		goto fail;
	}
	if (asprintf(&c->wal_path, "%s-wal", path) < 0) {
		c->wal_path = NULL;
		ret = -ENOMEM;
		goto fail;
	}
	if (readonly && access(path, F_OK) < 0) {
		ret = -errno; /* an inspection of a missing catalog makes nothing, not even a -wal */
		goto fail;
	}
reopen:
	ret = readonly ? open_readonly(path, SQLITE_OPEN_NOMUTEX, &c->db) : sqlite3_open_v2(path, &c->db, oflags, NULL);
	if (ret != SQLITE_OK) {
		ret = map_sqlite(c, ret);
		goto fail;
	}
	sqlite3_busy_timeout(c->db, 5000);
	sqlite3_extended_result_codes(c->db, 1);
	{
		struct stat st;

		if (stat(path, &st) == 0) {
			c->st_dev = st.st_dev;
			c->st_ino = st.st_ino;
		}
	}
	sqlite3_update_hook(c->db, update_hook, c); /* the kept directory rows, and the watch */
	sqlite3_rollback_hook(c->db, rollback_hook, c);
	if (!readonly) {
		/* WAL: readers never block the writer; NORMAL: commits sync at checkpoints, except the
		 * seal commits, which wfs_catalog_set_content() syncs itself. temp_store=MEMORY: the
		 * statement journal of each call's savepoint in a batch stays in memory (by default
		 * SQLite spills it past 64 KiB to a temporary file, here in /var/tmp: about 14
		 * pwrite(2)s of 4 KiB per batch-claimed file, counted with strace). The page cache stays SQLite's 2 MiB: a larger
		 * one was not measured apart, and the daemon's resident memory has a goal (64 MiB). */
		ret = exec(c, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=OFF; "
			      "PRAGMA temp_store=MEMORY;");
		if (ret)
			goto fail;
	}
	ret = get_schema_version(c, &version);
	if (ret == -ENOENT && !readonly && (flags & WFS_CATALOG_CREATE)) {
		ret = create_schema(c, root_uid, root_gid);
		if (ret == 0)
			ret = get_schema_version(c, &version);
	}
	if (ret == 0 && version < SCHEMA_VERSION) {
		int64_t was = version;

		ret = migrate_schema(c, path, &version);
		if (ret == 0 && readonly && version != was) {
			/* Upgraded by a connection of its own: an immutable handle would not see it. */
			sqlite3_close(c->db);
			c->db = NULL;
			goto reopen;
		}
	}
	if (ret)
		goto fail;
	if (version != SCHEMA_VERSION) {
		wfs_log(WFS_LOG_ERR, "catalog %s: schema version %lld, this weightfs reads %d", path,
			(long long)version, SCHEMA_VERSION);
		ret = -EIO;
		goto fail;
	}
	{
		sqlite3_stmt *ps;

		c->page_size = 4096;
		if (sqlite3_prepare_v2(c->db, "PRAGMA page_size", -1, &ps, NULL) == SQLITE_OK &&
		    sqlite3_step(ps) == SQLITE_ROW)
			c->page_size = (uint64_t)sqlite3_column_int64(ps, 0);
		sqlite3_finalize(ps);
	}
	for (int i = 0; i < ST_COUNT; i++) {
		int rc = sqlite3_prepare_v3(c->db, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &c->stmt[i],
					    NULL);
		if (rc != SQLITE_OK) {
			wfs_log(WFS_LOG_ERR, "catalog %s: %s", path, sqlite3_errmsg(c->db));
			ret = -EIO;
			goto fail;
		}
	}
	if (!readonly) {
		char reserve[PATH_MAX];
		struct stat st;

		snprintf(reserve, sizeof(reserve), "%s-reserve", path);
		c->reserve_fd = open(reserve, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		c->reserve_used = c->reserve_fd >= 0 &&
				  (fstat(c->reserve_fd, &st) < 0 || st.st_blocks * 512 < CATALOG_RESERVE);
		if (c->reserve_used)
			reserve_fill(c);
	}
	*out = c;
	return 0;
fail:
	wfs_catalog_close(c);
	return ret;
}

void wfs_catalog_close(struct wfs_catalog *c)
{
	if (!c)
		return;
	if (c->batch && wfs_catalog_commit(c))
		wfs_log(WFS_LOG_ERR, "catalog: the last changes could not be committed at close");
	sqlite3_close(c->checkpoint_db); /* first: the handle's close is the last, which ends the WAL */
	pthread_mutex_destroy(&c->checkpoint_lock);
	for (int i = 0; i < ST_COUNT; i++)
		sqlite3_finalize(c->stmt[i]);
	sqlite3_close(c->db);
	if (c->rescued) {
		/* Left by another connection to the removed file, they would be replayed into the new
		 * one when it is next opened in WAL mode. */
		char shm[PATH_MAX];

		unlink(c->wal_path);
		if (snprintf(shm, sizeof(shm), "%s-shm", c->path) < (int)sizeof(shm))
			unlink(shm);
	}
	free(c->path);
	if (c->reserve_fd >= 0)
		close(c->reserve_fd);
	if (c->wal_fd >= 0)
		close(c->wal_fd);
	if (c->wal_rw >= 0)
		close(c->wal_rw);
	pthread_mutex_destroy(&c->wal_lock);
	free(c->wal_path);
	free(c->redo.call);
	free(c);
}

int wfs_catalog_wal_sync(struct wfs_catalog *c)
{
	int fd, ret = 0;

	if (c->readonly)
		return 0;
	pthread_mutex_lock(&c->wal_lock);
	if (c->wal_fd < 0) {
		c->wal_fd = open(c->wal_path, O_RDONLY | O_CLOEXEC);
		if (c->wal_fd < 0 && errno != ENOENT)
			ret = -errno;
	}
	fd = c->wal_fd;
	pthread_mutex_unlock(&c->wal_lock);
	if (ret == 0 && fd >= 0 && fdatasync(fd) < 0)
		ret = -errno;
	return ret; /* no WAL yet: nothing was committed to it */
}

/*
 * Inside wfs_catalog_recover()'s transaction: unlink the temporary names sealed empty whose
 * attributes declare bytes (their inodes' nlink drops; the caller then drops those at 0). Their
 * count into *@removed.
 */
static int recover_declared_empty(struct wfs_catalog *c, uint64_t *removed)
{
	struct cand {
		uint64_t parent, ino;
		char *name;
	} *v = NULL;
	size_t n = 0, cap = 0;
	char sql[512];
	sqlite3_stmt *s;
	int ret, rc;

	snprintf(sql, sizeof(sql),
		 "SELECT d.parent, d.name, i.ino FROM dentries d JOIN inodes i ON i.ino = d.ino"
		 " WHERE i.digest IS NOT NULL AND i.size = 0 AND (i.mode & %u) = %u"
		 " AND CAST(substr(CAST(d.name AS BLOB), 1, %zu) AS BLOB) = CAST('%s' AS BLOB)",
		 (unsigned)S_IFMT, (unsigned)S_IFREG, strlen(WFS_TMP_PREFIX), WFS_TMP_PREFIX);
	ret = map_sqlite(c, sqlite3_prepare_v2(c->db, sql, -1, &s, NULL));
	if (ret)
		return ret;
	while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
		if (n == cap) {
			struct cand *p = realloc(v, (cap = cap ? 2 * cap : 8) * sizeof(*p));

			if (!p) {
				ret = -ENOMEM;
				break;
			}
			v = p;
		}
		v[n].parent = (uint64_t)sqlite3_column_int64(s, 0);
		v[n].ino = (uint64_t)sqlite3_column_int64(s, 2);
		if (!(v[n].name = strdup((const char *)sqlite3_column_text(s, 1)))) {
			ret = -ENOMEM;
			break;
		}
		n++;
	}
	if (ret == 0 && rc != SQLITE_DONE)
		ret = map_sqlite(c, rc);
	sqlite3_finalize(s);
	for (size_t i = 0; ret == 0 && i < n; i++) {
		uint64_t declared;
		sqlite3_stmt *del;

		if (wfs_catalog_declared_bytes(c, v[i].ino, &declared) || declared == 0)
			continue;
		ret = map_sqlite(c, sqlite3_prepare_v2(c->db,
						       "DELETE FROM dentries WHERE parent = ?1 AND name = ?2;",
						       -1, &del, NULL));
		if (ret)
			break;
		bind_int64(c, del, 1, (int64_t)v[i].parent);
		bind_text(c, del, 2, v[i].name, -1, SQLITE_STATIC);
		ret = step_done(c, del);
		sqlite3_finalize(del);
		if (ret)
			break;
		ret = map_sqlite(c, sqlite3_prepare_v2(c->db, "UPDATE inodes SET nlink = nlink - 1 WHERE ino = ?1", -1,
						       &del, NULL));
		if (ret)
			break;
		bind_int64(c, del, 1, (int64_t)v[i].ino);
		ret = step_done(c, del);
		sqlite3_finalize(del);
		if (ret == 0)
			(*removed)++;
	}
	for (size_t i = 0; i < n; i++)
		free(v[i].name);
	free(v);
	return ret;
}

int wfs_catalog_declared_bytes(struct wfs_catalog *c, uint64_t ino, uint64_t *bytes)
{
	char dtype[32], shape[WFS_SHAPE_MAX_DIMS * 21 + 2];
	size_t dlen, slen;
	uint64_t elements;
	int size, ret;

	ret = wfs_catalog_xattr_get(c, ino, WFS_XATTR_DTYPE, dtype, sizeof(dtype), &dlen);
	if (ret == 0)
		ret = wfs_catalog_xattr_get(c, ino, WFS_XATTR_SHAPE, shape, sizeof(shape), &slen);
	if (ret == -ERANGE)
		return -ENODATA; /* too long to be a dtype or a shape */
	if (ret)
		return ret;
	size = wfs_dtype_size(dtype, dlen);
	if (size < 0 || wfs_shape_elements(shape, slen, &elements))
		return -ENODATA;
	*bytes = elements * (uint64_t)size;
	return 0;
}

/*
 * Inside a transaction: every name of a regular file never sealed goes and its inode gets nlink 0
 * (an orphan, for the caller to drop or keep). *@removed: the names removed. Returns 0 or -errno.
 */
static int drop_unsealed_names(struct wfs_catalog *c, const uint64_t *keep, size_t nkeep, uint64_t *removed)
{
	size_t cap = 512 + nkeep * 24;
	char *sql = malloc(cap), *not_in = malloc(32 + nkeep * 24);
	size_t at;
	int ret;

	if (!sql || !not_in) {
		free(sql);
		free(not_in);
		return -ENOMEM;
	}
	at = (size_t)sprintf(not_in, " AND ino NOT IN (0");
	for (size_t i = 0; i < nkeep; i++)
		at += (size_t)sprintf(not_in + at, ",%llu", (unsigned long long)keep[i]);
	sprintf(not_in + at, ")");
	snprintf(sql, cap,
		 "UPDATE inodes SET nlink = 0 WHERE digest IS NULL AND (mode & %u) = %u AND nlink > 0%s;"
		 "DELETE FROM dentries WHERE ino IN (SELECT ino FROM inodes WHERE digest IS NULL"
		 " AND (mode & %u) = %u%s);",
		 (unsigned)S_IFMT, (unsigned)S_IFREG, not_in, (unsigned)S_IFMT, (unsigned)S_IFREG, not_in);
	ret = exec(c, sql);
	free(sql);
	free(not_in);
	if (ret == 0)
		*removed = (uint64_t)sqlite3_changes(c->db); /* the DELETE's: names */
	return ret;
}

int wfs_catalog_recover(struct wfs_catalog *c, struct wfs_recovery *report)
{
	struct wfs_recovery r = {0};
	sqlite3_stmt *s;
	int ret;

	ret = begin(c);
	if (ret)
		return ret;
	/* Orphans first, before the unsealed files below join them at nlink 0. */
	ret = map_sqlite(c, sqlite3_prepare_v2(c->db, "SELECT count(*) FROM inodes WHERE nlink = 0", -1, &s,
					       NULL));
	if (ret == 0) {
		if (sqlite3_step(s) == SQLITE_ROW)
			r.orphans_removed = (uint64_t)sqlite3_column_int64(s, 0);
		sqlite3_finalize(s);
	}
	/* Invariant 2: names of regular files never sealed go, and their inodes become orphans... */
	/* cppcheck-suppress duplicateCondition ; one `if (ret == 0)` per step, as below */
	if (ret == 0)
		ret = drop_unsealed_names(c, NULL, 0, &r.unsealed_removed);
	if (ret == 0)
		ret = recover_declared_empty(c, &r.declared_empty_removed);
	/* ...then, invariant 3: every inode without a name goes, with its xattrs. */
	if (ret == 0)
		ret = exec(c, "DELETE FROM xattrs WHERE ino IN (SELECT ino FROM inodes WHERE nlink = 0);"
			      "DELETE FROM inodes WHERE nlink = 0;");
	ret = end(c, ret);
	if (ret == 0)
		*report = r;
	return ret;
}

int wfs_catalog_takeover(struct wfs_catalog *c, uint64_t ino_floor, const uint64_t *keep, size_t nkeep,
			 uint64_t *unsealed_removed, uint64_t *held_max)
{
	uint64_t removed = 0, top = 0;
	char sql[512];
	sqlite3_stmt *s;
	int ret;

	ret = begin(c);
	if (ret)
		return ret;
	ret = drop_unsealed_names(c, keep, nkeep, &removed);
	if (ret == 0) {
		ret = map_sqlite(c, sqlite3_prepare_v2(c->db, "SELECT max(ifnull((SELECT seq FROM sqlite_sequence"
						       " WHERE name = 'inodes'), 0), ifnull((SELECT max(ino)"
						       " FROM inodes), 0))", -1, &s, NULL));
	}
	if (ret == 0) {
		if (sqlite3_step(s) == SQLITE_ROW)
			top = (uint64_t)sqlite3_column_int64(s, 0);
		sqlite3_finalize(s);
	}
	if (ret == 0 && ino_floor > top) {
		/* AUTOINCREMENT takes the next number above sqlite_sequence's: raise it (the row exists
		 * once any inode was made, and the root is made with the catalog). */
		snprintf(sql, sizeof(sql), "UPDATE sqlite_sequence SET seq = %llu WHERE name = 'inodes';",
			 (unsigned long long)ino_floor);
		ret = exec(c, sql);
		top = ino_floor;
	}
	ret = end(c, ret);
	if (ret == 0) {
		*unsealed_removed = removed;
		*held_max = top;
	}
	return ret;
}

int wfs_catalog_getattr(struct wfs_catalog *c, uint64_t ino, struct wfs_attr *out)
{
	sqlite3_stmt *s;
	int ret;

	if (dir_kept(c, ino, out))
		return 0;
	s = stmt(c, ST_GETATTR);
	bind_int64(c, s, 1, (int64_t)ino);
	ret = step_attr(c, s, out);
	if (ret == 0)
		dir_keep(c, out);
	return ret;
}

static int get_dir(struct wfs_catalog *c, uint64_t ino, struct wfs_attr *dir)
{
	int ret = wfs_catalog_getattr(c, ino, dir);

	if (ret == 0 && !S_ISDIR(dir->mode))
		return -ENOTDIR;
	if (ret == 0 && dir->nlink == 0)
		return -ENOENT; /* removed directory: nothing may be created in it */
	return ret;
}

int wfs_catalog_lookup(struct wfs_catalog *c, uint64_t parent, const char *name, struct wfs_attr *out)
{
	sqlite3_stmt *s = stmt(c, ST_LOOKUP);
	int ret;

	bind_int64(c, s, 1, (int64_t)parent);
	bind_text(c, s, 2, name, -1, SQLITE_STATIC);
	ret = step_attr(c, s, out);
	if (ret == -ENOENT) {
		struct wfs_attr dir;
		int r = wfs_catalog_getattr(c, parent, &dir);

		if (r == 0 && !S_ISDIR(dir.mode))
			ret = -ENOTDIR;
	}
	return ret;
}

static int nlink_add(struct wfs_catalog *c, uint64_t ino, int delta, int64_t t)
{
	sqlite3_stmt *s = stmt(c, ST_NLINK_ADD);
	struct wfs_attr dir;
	bool kept = dir_kept(c, ino, &dir);
	int ret;

	bind_int64(c, s, 1, (int64_t)ino);
	bind_int(c, s, 2, delta);
	bind_int64(c, s, 3, t);
	ret = step_done(c, s); /* the update hook forgets the kept row... */
	if (ret == 0 && kept) { /* ...which is known without reading it */
		dir.nlink = (uint32_t)((int64_t)dir.nlink + delta);
		dir.ctime = ns_to_ts(t);
		dir_keep(c, &dir);
	}
	return ret;
}

static int touch_dir(struct wfs_catalog *c, uint64_t ino, int64_t t)
{
	sqlite3_stmt *s = stmt(c, ST_TOUCH_DIR);
	struct wfs_attr dir;
	bool kept = dir_kept(c, ino, &dir);
	int ret;

	bind_int64(c, s, 1, (int64_t)ino);
	bind_int64(c, s, 2, t);
	ret = step_done(c, s);
	if (ret == 0 && kept) {
		dir.mtime = dir.ctime = ns_to_ts(t);
		dir_keep(c, &dir);
	}
	return ret;
}

static int insert_dentry(struct wfs_catalog *c, uint64_t parent, const char *name, uint64_t ino)
{
	sqlite3_stmt *s = stmt(c, ST_INSERT_DENTRY);

	bind_int64(c, s, 1, (int64_t)parent);
	bind_text(c, s, 2, name, -1, SQLITE_STATIC);
	bind_int64(c, s, 3, (int64_t)ino);
	return step_done(c, s); /* UNIQUE(parent, name) → -EEXIST */
}

static int delete_dentry(struct wfs_catalog *c, uint64_t parent, const char *name)
{
	sqlite3_stmt *s = stmt(c, ST_DELETE_DENTRY);

	bind_int64(c, s, 1, (int64_t)parent);
	bind_text(c, s, 2, name, -1, SQLITE_STATIC);
	return step_done(c, s);
}

static int dir_is_empty(struct wfs_catalog *c, uint64_t ino, bool *empty)
{
	sqlite3_stmt *s = stmt(c, ST_DIR_HAS_ENTRY);
	int rc;

	bind_int64(c, s, 1, (int64_t)ino);
	rc = sqlite3_step(s);
	sqlite3_reset(s);
	if (rc != SQLITE_ROW && rc != SQLITE_DONE)
		return map_sqlite(c, rc);
	*empty = rc == SQLITE_DONE;
	return 0;
}

static bool is_special(uint32_t mode)
{
	return S_ISFIFO(mode) || S_ISSOCK(mode) || S_ISCHR(mode) || S_ISBLK(mode);
}

/* The object row of @digest (@size bytes), added if new; marked good (its file is in objects/). */
static int insert_object(struct wfs_catalog *c, const struct wfs_digest *digest, uint64_t size,
			 enum wfs_object_state state)
{
	sqlite3_stmt *s = stmt(c, ST_INSERT_OBJECT);

	bind_blob(c, s, 1, digest->bytes, WFS_DIGEST_BYTES, SQLITE_STATIC);
	bind_int64(c, s, 2, (int64_t)size);
	bind_int(c, s, 3, state);
	return step_done(c, s);
}

/*
 * Start a call that makes an entry in directory @parent: its transaction (begin()) and the check that
 * @parent is a directory still linked (get_dir()). Returns 0 with the transaction open, or -errno with
 * nothing left open: -ENOTDIR, -ENOENT, or the catalog's.
 */
static int begin_in_dir(struct wfs_catalog *c, uint64_t parent)
{
	struct wfs_attr dir;
	int ret = begin(c);

	if (ret)
		return ret;
	ret = get_dir(c, parent, &dir);
	return ret ? end(c, ret) : 0;
}

/* The attributes of an inode just inserted with these columns (all three times @t, in ns). */
static struct wfs_attr new_attr(uint64_t ino, uint32_t mode, uint32_t uid, uint32_t gid, uint32_t nlink,
				uint64_t size, uint64_t parent, int64_t t, const struct wfs_digest *digest,
				uint64_t rdev)
{
	struct wfs_attr a = {.ino = ino, .mode = mode, .uid = uid, .gid = gid, .nlink = nlink, .size = size,
			     .parent = parent, .sealed = digest != NULL, .rdev = rdev};

	if (digest)
		a.digest = *digest;
	a.atime = a.mtime = a.ctime = ns_to_ts(t);
	return a;
}

int wfs_catalog_create(struct wfs_catalog *c, uint64_t parent, const char *name, uint32_t mode,
		       uint32_t uid, uint32_t gid, const char *target, struct wfs_attr *out)
{
	if (is_special(mode))
		return -EINVAL; /* wfs_catalog_mknod() makes those */
	return wfs_catalog_mknod(c, parent, name, mode, 0, uid, gid, target, out);
}

int wfs_catalog_mknod(struct wfs_catalog *c, uint64_t parent, const char *name, uint32_t mode,
		      uint64_t rdev, uint32_t uid, uint32_t gid, const char *target, struct wfs_attr *out)
{
	bool is_dir = S_ISDIR(mode), is_link = S_ISLNK(mode);
	sqlite3_stmt *s;
	int64_t t = now_ns();
	uint64_t ino = 0;
	int ret;

	if (!S_ISREG(mode) && !is_dir && !is_link && !is_special(mode))
		return -EINVAL;
	if (is_link != (target != NULL))
		return -EINVAL;
	if (rdev && !S_ISCHR(mode) && !S_ISBLK(mode))
		return -EINVAL;
	ret = begin_in_dir(c, parent);
	if (ret)
		return ret;
	s = stmt(c, ST_INSERT_INODE);
	bind_int64(c, s, 1, mode);
	bind_int64(c, s, 2, uid);
	bind_int64(c, s, 3, gid);
	bind_int(c, s, 4, is_dir ? 2 : 1);
	bind_int64(c, s, 5, is_link ? (int64_t)strlen(target) : 0);
	bind_int64(c, s, 6, is_dir ? (int64_t)parent : 0);
	bind_int64(c, s, 7, t);
	if (is_link)
		bind_text(c, s, 8, target, -1, SQLITE_STATIC);
	bind_int64(c, s, 9, (int64_t)rdev);
	ret = step_done(c, s);
	if (ret)
		goto out;
	ino = (uint64_t)sqlite3_last_insert_rowid(c->db);
	ret = insert_dentry(c, parent, name, ino);
	if (ret == 0 && S_ISREG(mode))
		c->bare[ino % BARE_SLOTS] = ino; /* undone with the call if it fails: end() */
	if (ret == 0 && is_dir)
		ret = nlink_add(c, parent, 1, t);
	if (ret == 0)
		ret = touch_dir(c, parent, t);
out:
	ret = end(c, ret);
	if (ret == 0) /* what a getattr would read back: every column is one bound above */
		*out = new_attr(ino, mode, uid, gid, is_dir ? 2 : 1, is_link ? strlen(target) : 0,
				is_dir ? parent : 0, t, NULL, rdev);
	return ret;
}

int wfs_catalog_create_sealed(struct wfs_catalog *c, uint64_t parent, const char *name, uint32_t mode,
			      uint32_t uid, uint32_t gid, const struct wfs_digest *digest, uint64_t size,
			      const struct wfs_catalog_xattr *xattrs, size_t nxattrs, struct wfs_attr *out)
{
	sqlite3_stmt *s;
	int64_t t = now_ns();
	uint64_t ino = 0;
	int ret;

	if (!S_ISREG(mode))
		return -EINVAL;
	ret = begin_in_dir(c, parent);
	if (ret)
		return ret;
	ret = insert_object(c, digest, size, WFS_OBJECT_OK); /* first: the inode's trigger counts it */
	if (ret)
		goto out;
	s = stmt(c, ST_INSERT_SEALED);
	bind_int64(c, s, 1, mode);
	bind_int64(c, s, 2, uid);
	bind_int64(c, s, 3, gid);
	bind_int64(c, s, 4, (int64_t)size);
	bind_int64(c, s, 5, t);
	bind_blob(c, s, 6, digest->bytes, WFS_DIGEST_BYTES, SQLITE_STATIC);
	ret = step_done(c, s);
	if (ret)
		goto out;
	ino = (uint64_t)sqlite3_last_insert_rowid(c->db);
	ret = insert_dentry(c, parent, name, ino);
	if (nxattrs)
		xattrs_written(c, ino);
	for (size_t i = 0; ret == 0 && i < nxattrs; i++) {
		s = stmt(c, ST_XATTR_INSERT);
		bind_int64(c, s, 1, (int64_t)ino);
		bind_text(c, s, 2, xattrs[i].name, -1, SQLITE_STATIC);
		bind_blob(c, s, 3, xattrs[i].len ? xattrs[i].value : "", (int)xattrs[i].len, SQLITE_STATIC);
		ret = step_done(c, s);
		if (ret == -EEXIST)
			ret = -EINVAL; /* the same attribute twice in @xattrs */
	}
	if (ret == 0)
		ret = touch_dir(c, parent, t);
	if (ret == 0)
		ret = wfs_fault("catalog.set-content"); /* test-only: the seal's commit fails */
out:
	ret = end(c, ret);
	if (ret == 0) /* what a getattr would read back: every column is one bound above */
		*out = new_attr(ino, mode, uid, gid, 1, size, 0, t, digest, 0);
	return ret;
}

int wfs_catalog_link(struct wfs_catalog *c, uint64_t ino, uint64_t newparent, const char *newname,
		     struct wfs_attr *out)
{
	struct wfs_attr a, dir;
	int64_t t = now_ns();
	int ret;

	ret = begin(c);
	if (ret)
		return ret;
	ret = wfs_catalog_getattr(c, ino, &a);
	if (ret == 0 && S_ISDIR(a.mode))
		ret = -EPERM;
	if (ret == 0 && a.nlink == 0)
		ret = -ENOENT;
	if (ret == 0)
		ret = get_dir(c, newparent, &dir);
	if (ret == 0)
		ret = insert_dentry(c, newparent, newname, ino);
	if (ret == 0)
		ret = nlink_add(c, ino, 1, t);
	if (ret == 0)
		ret = touch_dir(c, newparent, t);
	if (ret == 0)
		ret = wfs_catalog_getattr(c, ino, out);
	return end(c, ret);
}

/* Remove dentry @parent/@name naming @victim; adjusts link counts. Inside a transaction. */
static int remove_name(struct wfs_catalog *c, uint64_t parent, const char *name,
		       const struct wfs_attr *victim, int64_t t)
{
	int ret = delete_dentry(c, parent, name);

	if (ret)
		return ret;
	if (S_ISDIR(victim->mode)) {
		ret = nlink_add(c, victim->ino, -(int)victim->nlink, t); /* "." and the name both go */
		if (ret == 0)
			ret = nlink_add(c, parent, -1, t);
	} else {
		ret = nlink_add(c, victim->ino, -1, t);
	}
	return ret;
}

static int unlink_once(struct wfs_catalog *c, uint64_t parent, const char *name, bool dir,
		       uint64_t *ino)
{
	struct wfs_attr a;
	int64_t t = now_ns();
	bool empty;
	int ret;

	ret = begin(c);
	if (ret)
		return ret;
	ret = wfs_catalog_lookup(c, parent, name, &a);
	if (ret)
		goto out;
	if (dir && !S_ISDIR(a.mode))
		ret = -ENOTDIR;
	else if (!dir && S_ISDIR(a.mode))
		ret = -EISDIR;
	if (ret == 0 && dir) {
		ret = dir_is_empty(c, a.ino, &empty);
		if (ret == 0 && !empty)
			ret = -ENOTEMPTY;
	}
	if (ret == 0)
		ret = remove_name(c, parent, name, &a, t);
	if (ret == 0)
		ret = touch_dir(c, parent, t);
out:
	ret = end(c, ret);
	if (ret == 0)
		*ino = a.ino;
	return ret;
}

/* Frees space: on a full filesystem, runs again with room made (room_for_removal). */
int wfs_catalog_unlink(struct wfs_catalog *c, uint64_t parent, const char *name, bool dir,
		       uint64_t *ino)
{
	int ret = unlink_once(c, parent, name, dir, ino);

	if (ret == -ENOSPC && room_for_removal(c))
		ret = unlink_once(c, parent, name, dir, ino);
	return ret;
}

/* The names (dentries) of one inode, read inside a transaction; handed to the caller's
 * wfs_catalog_name_fn after the commit (names_tell). */
struct names {
	struct name {
		uint64_t parent;
		char *name; /* malloc'ed */
	} *v;
	size_t n, cap;
};

/* Every dentry of @ino into @l (empty before). Returns 0, -ENOMEM, or an -errno of the catalog. */
static int names_of(struct wfs_catalog *c, uint64_t ino, struct names *l)
{
	sqlite3_stmt *s;
	int ret, rc = SQLITE_DONE;

	ret = map_sqlite(c, sqlite3_prepare_v2(c->db, "SELECT parent, name FROM dentries WHERE ino = ?1", -1, &s,
					       NULL));
	if (ret)
		return ret;
	bind_int64(c, s, 1, (int64_t)ino);
	while (ret == 0 && (rc = sqlite3_step(s)) == SQLITE_ROW) {
		if (l->n == l->cap) {
			size_t cap = l->cap ? 2 * l->cap : 4;
			struct name *p = realloc(l->v, cap * sizeof(*p));

			if (!p) {
				ret = -ENOMEM;
				break;
			}
			l->v = p;
			l->cap = cap;
		}
		l->v[l->n].parent = (uint64_t)sqlite3_column_int64(s, 0);
		l->v[l->n].name = strdup((const char *)sqlite3_column_text(s, 1));
		if (!l->v[l->n].name)
			ret = -ENOMEM;
		else
			l->n++;
	}
	if (ret == 0 && rc != SQLITE_DONE)
		ret = map_sqlite(c, rc);
	sqlite3_finalize(s);
	return ret;
}

/* After the transaction ended with @ret: each name to @fn (may be NULL) when it committed; @l freed. */
static void names_tell(struct names *l, int ret, wfs_catalog_name_fn fn, void *ctx)
{
	for (size_t i = 0; i < l->n; i++) {
		if (ret == 0 && fn)
			fn(ctx, l->v[i].parent, l->v[i].name);
		free(l->v[i].name);
	}
	free(l->v);
	*l = (struct names){0};
}

int wfs_catalog_names(struct wfs_catalog *c, uint64_t ino, wfs_catalog_name_fn fn, void *ctx)
{
	struct names l = {0};
	int ret = names_of(c, ino, &l);

	names_tell(&l, ret == -ENOMEM ? 0 : ret, fn, ctx);
	return ret;
}

static int unlink_unsealed_once(struct wfs_catalog *c, uint64_t ino, bool empty_too, wfs_catalog_name_fn fn,
				void *ctx)
{
	struct names names = {0};
	struct wfs_attr a;
	int64_t t = now_ns();
	int ret;

	ret = begin(c);
	if (ret)
		return ret;
	ret = wfs_catalog_getattr(c, ino, &a);
	if (ret == -ENOENT || (ret == 0 && ((a.sealed && !(empty_too && a.size == 0)) || !S_ISREG(a.mode)))) {
		ret = 0;
		goto out; /* sealed meanwhile (with bytes), or already gone: nothing to remove */
	}
	if (ret == 0)
		ret = names_of(c, ino, &names);
	for (size_t i = 0; ret == 0 && i < names.n; i++) {
		ret = remove_name(c, names.v[i].parent, names.v[i].name, &a, t);
		if (ret == 0)
			ret = touch_dir(c, names.v[i].parent, t);
		a.nlink--;
	}
out:
	ret = end(c, ret);
	names_tell(&names, ret, fn, ctx);
	return ret;
}

/* Frees space: on a full filesystem, runs again with room made (room_for_removal). */
int wfs_catalog_unlink_unsealed(struct wfs_catalog *c, uint64_t ino, bool empty_too, wfs_catalog_name_fn fn,
				void *ctx)
{
	int ret = unlink_unsealed_once(c, ino, empty_too, fn, ctx);

	if (ret == -ENOSPC && room_for_removal(c))
		ret = unlink_unsealed_once(c, ino, empty_too, fn, ctx);
	return ret;
}

/* Run @sql (no rows) with ?1 = @a and ?2 = @b bound. Inside a transaction. */
static int exec_ino2(struct wfs_catalog *c, const char *sql, uint64_t a, uint64_t b)
{
	sqlite3_stmt *s;
	int ret = map_sqlite(c, sqlite3_prepare_v2(c->db, sql, -1, &s, NULL));

	if (ret)
		return ret;
	bind_int64(c, s, 1, (int64_t)a);
	bind_int64(c, s, 2, (int64_t)b);
	ret = step_done(c, s);
	sqlite3_finalize(s);
	return ret;
}

int wfs_catalog_inode_replace(struct wfs_catalog *c, uint64_t ino, wfs_catalog_name_fn fn, void *ctx,
			      struct wfs_attr *out)
{
	struct names names = {0};
	struct wfs_attr a;
	uint64_t fresh, t = (uint64_t)now_ns();
	int ret;

	ret = begin(c);
	if (ret)
		return ret;
	ret = wfs_catalog_getattr(c, ino, &a);
	if (ret == 0 && !S_ISREG(a.mode))
		ret = -EINVAL;
	else if (ret == 0 && a.nlink == 0)
		ret = -ENOENT; /* no name left to move */
	if (ret == 0)
		ret = exec_ino2(c, "INSERT INTO inodes(mode, uid, gid, nlink, size, parent, atime, mtime, ctime,"
				" digest, target) SELECT mode, uid, gid, nlink, size, parent, atime, mtime, ?2, digest,"
				" target FROM inodes WHERE ino = ?1", ino, t);
	if (ret)
		goto out;
	fresh = (uint64_t)sqlite3_last_insert_rowid(c->db);
	ret = names_of(c, ino, &names);
	xattrs_written(c, fresh);
	if (ret == 0)
		ret = exec_ino2(c, "INSERT INTO xattrs(ino, name, value) SELECT ?2, name, value FROM xattrs"
			       " WHERE ino = ?1", ino, fresh);
	if (ret == 0)
		ret = exec_ino2(c, "UPDATE dentries SET ino = ?2 WHERE ino = ?1", ino, fresh);
	if (ret == 0)
		ret = exec_ino2(c, "UPDATE inodes SET nlink = 0, ctime = ?2 WHERE ino = ?1", ino, t);
	if (ret == 0)
		ret = wfs_catalog_getattr(c, fresh, out);
out:
	ret = end(c, ret);
	names_tell(&names, ret, fn, ctx);
	return ret;
}

/* Is @ino @ancestor or below it? Walks directory parents up to the root. */
static int is_within(struct wfs_catalog *c, uint64_t ino, uint64_t ancestor, bool *within)
{
	struct wfs_attr a;

	for (int depth = 0; depth < 4096; depth++) {
		if (ino == ancestor) {
			*within = true;
			return 0;
		}
		if (ino == WFS_ROOT_INO) {
			*within = false;
			return 0;
		}
		int ret = wfs_catalog_getattr(c, ino, &a);

		if (ret)
			return ret;
		ino = a.parent;
	}
	return -ELOOP;
}

static int move_dentry(struct wfs_catalog *c, uint64_t parent, const char *name, uint64_t newparent,
		       const char *newname)
{
	sqlite3_stmt *s = stmt(c, ST_MOVE_DENTRY);

	bind_int64(c, s, 1, (int64_t)parent);
	bind_text(c, s, 2, name, -1, SQLITE_STATIC);
	bind_int64(c, s, 3, (int64_t)newparent);
	bind_text(c, s, 4, newname, -1, SQLITE_STATIC);
	return step_done(c, s);
}

static int set_dentry_ino(struct wfs_catalog *c, uint64_t parent, const char *name, uint64_t ino)
{
	sqlite3_stmt *s = stmt(c, ST_SET_DENTRY_INO);

	bind_int64(c, s, 1, (int64_t)parent);
	bind_text(c, s, 2, name, -1, SQLITE_STATIC);
	bind_int64(c, s, 3, (int64_t)ino);
	return step_done(c, s);
}

/* A directory that moved to @newparent: its ".." changes, and both parents' link counts. */
static int reparent(struct wfs_catalog *c, const struct wfs_attr *a, uint64_t oldparent,
		    uint64_t newparent, int64_t t)
{
	sqlite3_stmt *s;
	int ret;

	if (!S_ISDIR(a->mode) || oldparent == newparent)
		return 0;
	s = stmt(c, ST_SET_PARENT);
	bind_int64(c, s, 1, (int64_t)a->ino);
	bind_int64(c, s, 2, (int64_t)newparent);
	bind_int64(c, s, 3, t);
	ret = step_done(c, s);
	if (ret == 0)
		ret = nlink_add(c, oldparent, -1, t);
	if (ret == 0)
		ret = nlink_add(c, newparent, 1, t);
	return ret;
}

static int rename_locked(struct wfs_catalog *c, uint64_t parent, const char *name, uint64_t newparent,
			 const char *newname, unsigned flags, uint64_t *replaced, int64_t t)
{
	struct wfs_attr src, dst, dir;
	bool have_dst, within, empty;
	int ret;

	ret = get_dir(c, newparent, &dir);
	if (ret)
		return ret;
	ret = wfs_catalog_lookup(c, parent, name, &src);
	if (ret)
		return ret;
	ret = wfs_catalog_lookup(c, newparent, newname, &dst);
	if (ret && ret != -ENOENT)
		return ret;
	have_dst = ret == 0;
	if (have_dst && dst.ino == src.ino)
		return 0; /* same file: rename(2) does nothing */
	if ((flags & RENAME_NOREPLACE) && have_dst)
		return -EEXIST;
	if ((flags & RENAME_EXCHANGE) && !have_dst)
		return -ENOENT;
	/* A directory may not move below itself (nor, when exchanging, may the other one). */
	if (S_ISDIR(src.mode)) {
		ret = is_within(c, newparent, src.ino, &within);
		if (ret == 0 && within)
			ret = -EINVAL;
		if (ret)
			return ret;
	}
	if ((flags & RENAME_EXCHANGE) && S_ISDIR(dst.mode)) {
		ret = is_within(c, parent, dst.ino, &within);
		if (ret == 0 && within)
			ret = -EINVAL;
		if (ret)
			return ret;
	}

	if (flags & RENAME_EXCHANGE) {
		ret = set_dentry_ino(c, parent, name, dst.ino);
		if (ret == 0)
			ret = set_dentry_ino(c, newparent, newname, src.ino);
		if (ret == 0)
			ret = reparent(c, &src, parent, newparent, t);
		if (ret == 0)
			ret = reparent(c, &dst, newparent, parent, t);
		if (ret == 0)
			ret = nlink_add(c, dst.ino, 0, t); /* ctime */
		*replaced = 0;
	} else {
		if (have_dst) {
			if (S_ISDIR(src.mode) && !S_ISDIR(dst.mode))
				return -ENOTDIR;
			if (!S_ISDIR(src.mode) && S_ISDIR(dst.mode))
				return -EISDIR;
			if (S_ISDIR(dst.mode)) {
				ret = dir_is_empty(c, dst.ino, &empty);
				if (ret == 0 && !empty)
					ret = -ENOTEMPTY;
				if (ret)
					return ret;
			}
			ret = remove_name(c, newparent, newname, &dst, t);
			if (ret)
				return ret;
		}
		ret = move_dentry(c, parent, name, newparent, newname);
		if (ret == 0)
			ret = reparent(c, &src, parent, newparent, t);
		*replaced = have_dst ? dst.ino : 0;
	}
	if (ret == 0)
		ret = nlink_add(c, src.ino, 0, t); /* ctime */
	if (ret == 0)
		ret = touch_dir(c, parent, t);
	if (ret == 0 && newparent != parent)
		ret = touch_dir(c, newparent, t);
	return ret;
}

static int rename_once(struct wfs_catalog *c, uint64_t parent, const char *name, uint64_t newparent,
		       const char *newname, unsigned flags, uint64_t *replaced)
{
	uint64_t victim = 0;
	int ret;

	if (flags & ~(unsigned)(RENAME_NOREPLACE | RENAME_EXCHANGE))
		return -EINVAL;
	if ((flags & RENAME_NOREPLACE) && (flags & RENAME_EXCHANGE))
		return -EINVAL;
	ret = begin(c);
	if (ret)
		return ret;
	ret = rename_locked(c, parent, name, newparent, newname, flags, &victim, now_ns());
	ret = end(c, ret);
	if (ret == 0)
		*replaced = victim;
	return ret;
}

/* Frees space: on a full filesystem, runs again with room made (room_for_removal). */
int wfs_catalog_rename(struct wfs_catalog *c, uint64_t parent, const char *name, uint64_t newparent,
		       const char *newname, unsigned flags, uint64_t *replaced)
{
	int ret = rename_once(c, parent, name, newparent, newname, flags, replaced);

	if (ret == -ENOSPC && room_for_removal(c))
		ret = rename_once(c, parent, name, newparent, newname, flags, replaced);
	return ret;
}

int wfs_catalog_setattr(struct wfs_catalog *c, uint64_t ino, const struct wfs_attr *in,
			unsigned valid, struct wfs_attr *out)
{
	struct wfs_attr a;
	sqlite3_stmt *s;
	int ret;

	ret = begin(c);
	if (ret)
		return ret;
	ret = wfs_catalog_getattr(c, ino, &a);
	if (ret)
		goto out;
	if (valid & WFS_ATTR_MODE)
		a.mode = (a.mode & S_IFMT) | (in->mode & 07777);
	if (valid & WFS_ATTR_UID)
		a.uid = in->uid;
	if (valid & WFS_ATTR_GID)
		a.gid = in->gid;
	if (valid & WFS_ATTR_ATIME)
		a.atime = in->atime;
	if (valid & WFS_ATTR_MTIME)
		a.mtime = in->mtime;
	if (valid & WFS_ATTR_CTIME)
		a.ctime = in->ctime;
	else
		a.ctime = ns_to_ts(now_ns());
	s = stmt(c, ST_SETATTR);
	bind_int64(c, s, 1, (int64_t)ino);
	bind_int64(c, s, 2, a.mode);
	bind_int64(c, s, 3, a.uid);
	bind_int64(c, s, 4, a.gid);
	bind_int64(c, s, 5, ts_to_ns(&a.atime));
	bind_int64(c, s, 6, ts_to_ns(&a.mtime));
	bind_int64(c, s, 7, ts_to_ns(&a.ctime));
	ret = step_done(c, s);
out:
	ret = end(c, ret);
	if (ret == 0)
		*out = a;
	return ret;
}

int wfs_catalog_set_content(struct wfs_catalog *c, uint64_t ino, const struct wfs_digest *digest,
			    uint64_t size, const struct timespec *mtime, const struct timespec *changed,
			    unsigned flags, struct wfs_attr *old, struct wfs_attr *out)
{
	bool durable = flags & WFS_CONTENT_DURABLE;
	struct wfs_attr before;
	sqlite3_stmt *s;
	int ret;

	if (durable) {
		ret = exec(c, "PRAGMA synchronous=FULL");
		if (ret)
			return ret;
	}
	ret = begin(c);
	if (ret)
		goto out_sync;
	ret = wfs_catalog_getattr(c, ino, &before);
	if (ret == 0 && !S_ISREG(before.mode))
		ret = -EISDIR;
	if (ret)
		goto out;
	ret = insert_object(c, digest, size,
			    (flags & WFS_CONTENT_DECLARED) ? WFS_OBJECT_DECLARED : WFS_OBJECT_OK);
	if (ret)
		goto out;
	s = stmt(c, ST_SET_CONTENT);
	bind_int64(c, s, 1, (int64_t)ino);
	bind_blob(c, s, 2, digest->bytes, WFS_DIGEST_BYTES, SQLITE_STATIC);
	bind_int64(c, s, 3, (int64_t)size);
	bind_int64(c, s, 4, ts_to_ns(mtime));
	/* ctime is the change's time, whatever mtime the writer set; never earlier than a rename's. */
	bind_int64(c, s, 5, changed ? (ts_to_ns(changed) > ts_to_ns(&before.ctime) ? ts_to_ns(changed)
							: ts_to_ns(&before.ctime)) : now_ns());
	ret = step_done(c, s);
	if (ret == 0 && out)
		ret = wfs_catalog_getattr(c, ino, out);
	if (ret == 0)
		ret = wfs_fault("catalog.set-content"); /* test-only: the seal's commit fails */
out:
	ret = end(c, ret);
	if (ret == 0)
		*old = before;
out_sync:
	if (durable)
		exec(c, "PRAGMA synchronous=NORMAL");
	return ret;
}

int wfs_catalog_readlink(struct wfs_catalog *c, uint64_t ino, char *buf, size_t size)
{
	sqlite3_stmt *s = stmt(c, ST_READLINK);
	int rc, ret = 0;

	bind_int64(c, s, 1, (int64_t)ino);
	rc = sqlite3_step(s);
	if (rc == SQLITE_ROW) {
		const char *target = (const char *)sqlite3_column_text(s, 1);

		if (!S_ISLNK((uint32_t)sqlite3_column_int64(s, 0)) || !target || size == 0)
			ret = -EINVAL;
		else
			snprintf(buf, size, "%s", target);
	} else {
		ret = rc == SQLITE_DONE ? -ENOENT : map_sqlite(c, rc);
	}
	sqlite3_reset(s);
	return ret;
}

int wfs_catalog_readdir(struct wfs_catalog *c, uint64_t dir, uint64_t cookie, wfs_catalog_dirent_fn fn,
			void *ctx)
{
	struct wfs_attr d, a;
	sqlite3_stmt *s;
	int rc, ret;

	ret = wfs_catalog_getattr(c, dir, &d);
	if (ret)
		return ret;
	if (!S_ISDIR(d.mode))
		return -ENOTDIR;
	/* The readdir statement is not shared: @fn may call other catalog functions. */
	rc = sqlite3_prepare_v2(c->db, stmt_sql[ST_READDIR], -1, &s, NULL);
	if (rc != SQLITE_OK)
		return map_sqlite(c, rc);
	bind_int64(c, s, 1, (int64_t)dir);
	bind_int64(c, s, 2, (int64_t)cookie);
	while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
		row_to_attr(s, 2, &a);
		if (fn(ctx, (const char *)sqlite3_column_text(s, 1), &a, (uint64_t)sqlite3_column_int64(s, 0)))
			break;
	}
	ret = rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : map_sqlite(c, rc);
	sqlite3_finalize(s);
	return ret;
}

int wfs_catalog_xattr_get(struct wfs_catalog *c, uint64_t ino, const char *name, void *buf,
			  size_t size, size_t *len)
{
	sqlite3_stmt *s;
	int rc, ret = 0;

	if (is_bare(c, ino))
		return -ENODATA;
	s = stmt(c, ST_XATTR_GET);
	bind_int64(c, s, 1, (int64_t)ino);
	bind_text(c, s, 2, name, -1, SQLITE_STATIC);
	rc = sqlite3_step(s);
	if (rc == SQLITE_ROW) {
		size_t n = (size_t)sqlite3_column_bytes(s, 0);

		if (size && n > size) {
			ret = -ERANGE;
		} else {
			if (size && n)
				memcpy(buf, sqlite3_column_blob(s, 0), n);
			*len = n;
		}
	} else {
		ret = rc == SQLITE_DONE ? -ENODATA : map_sqlite(c, rc);
	}
	sqlite3_reset(s);
	return ret;
}

int wfs_catalog_xattr_set(struct wfs_catalog *c, uint64_t ino, const char *name, const void *value,
			  size_t len, int flags)
{
	sqlite3_stmt *s;
	int ret;

	ret = begin(c);
	if (ret)
		return ret;
	xattrs_written(c, ino);
	s = stmt(c, (flags & XATTR_REPLACE) ? ST_XATTR_UPDATE : ST_XATTR_INSERT);
	bind_int64(c, s, 1, (int64_t)ino);
	bind_text(c, s, 2, name, -1, SQLITE_STATIC);
	bind_blob(c, s, 3, len ? value : "", (int)len, SQLITE_STATIC);
	ret = step_done(c, s);
	if (flags & XATTR_REPLACE) {
		if (ret == 0 && sqlite3_changes(c->db) == 0)
			ret = -ENODATA;
	} else if (ret == -EEXIST && !(flags & XATTR_CREATE)) {
		s = stmt(c, ST_XATTR_UPDATE);
		bind_int64(c, s, 1, (int64_t)ino);
		bind_text(c, s, 2, name, -1, SQLITE_STATIC);
		bind_blob(c, s, 3, len ? value : "", (int)len, SQLITE_STATIC);
		ret = step_done(c, s);
	}
	if (ret == 0)
		ret = nlink_add(c, ino, 0, now_ns()); /* ctime */
	return end(c, ret);
}

int wfs_catalog_xattr_list(struct wfs_catalog *c, uint64_t ino, char *buf, size_t size, size_t *len)
{
	sqlite3_stmt *s;
	size_t total = 0;
	int rc, ret = 0;

	if (is_bare(c, ino)) {
		*len = 0;
		return 0;
	}
	s = stmt(c, ST_XATTR_LIST);
	bind_int64(c, s, 1, (int64_t)ino);
	while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
		size_t n = (size_t)sqlite3_column_bytes(s, 0) + 1;

		if (size) {
			if (total + n > size) {
				ret = -ERANGE;
				break;
			}
			memcpy(buf + total, sqlite3_column_text(s, 0), n);
		}
		total += n;
	}
	if (ret == 0 && rc != SQLITE_DONE)
		ret = map_sqlite(c, rc);
	sqlite3_reset(s);
	if (ret == 0)
		*len = total;
	return ret;
}

static int xattr_remove_once(struct wfs_catalog *c, uint64_t ino, const char *name)
{
	sqlite3_stmt *s;
	int ret;

	ret = begin(c);
	if (ret)
		return ret;
	s = stmt(c, ST_XATTR_DELETE);
	bind_int64(c, s, 1, (int64_t)ino);
	bind_text(c, s, 2, name, -1, SQLITE_STATIC);
	ret = step_done(c, s);
	if (ret == 0 && sqlite3_changes(c->db) == 0)
		ret = -ENODATA;
	if (ret == 0)
		ret = nlink_add(c, ino, 0, now_ns()); /* ctime */
	return end(c, ret);
}

/* Frees space: on a full filesystem, runs again with room made (room_for_removal). */
int wfs_catalog_xattr_remove(struct wfs_catalog *c, uint64_t ino, const char *name)
{
	int ret = xattr_remove_once(c, ino, name);

	if (ret == -ENOSPC && room_for_removal(c))
		ret = xattr_remove_once(c, ino, name);
	return ret;
}

static int inode_drop_once(struct wfs_catalog *c, uint64_t ino, struct wfs_attr *old)
{
	struct wfs_attr a;
	sqlite3_stmt *s;
	int ret;

	ret = begin(c);
	if (ret)
		return ret;
	ret = wfs_catalog_getattr(c, ino, &a);
	if (ret == 0 && a.nlink != 0)
		ret = -EBUSY;
	if (ret)
		goto out;
	s = stmt(c, ST_XATTR_DELETE_ALL);
	bind_int64(c, s, 1, (int64_t)ino);
	ret = step_done(c, s);
	if (ret)
		goto out;
	s = stmt(c, ST_DELETE_INODE);
	bind_int64(c, s, 1, (int64_t)ino);
	ret = step_done(c, s);
out:
	ret = end(c, ret);
	if (ret == 0)
		*old = a;
	return ret;
}

/* Frees space: on a full filesystem, runs again with room made (room_for_removal). */
int wfs_catalog_inode_drop(struct wfs_catalog *c, uint64_t ino, struct wfs_attr *old)
{
	int ret = inode_drop_once(c, ino, old);

	if (ret == -ENOSPC && room_for_removal(c))
		ret = inode_drop_once(c, ino, old);
	return ret;
}

int wfs_catalog_object_refcount(struct wfs_catalog *c, const struct wfs_digest *d, uint64_t *refcount)
{
	return wfs_catalog_object_get(c, d, refcount, NULL);
}

int wfs_catalog_object_get(struct wfs_catalog *c, const struct wfs_digest *d, uint64_t *refcount,
			   uint64_t *bytes)
{
	sqlite3_stmt *s = stmt(c, ST_OBJECT_GET);
	int rc, ret = 0;

	bind_blob(c, s, 1, d->bytes, WFS_DIGEST_BYTES, SQLITE_STATIC);
	rc = sqlite3_step(s);
	if (rc == SQLITE_ROW) {
		*refcount = (uint64_t)sqlite3_column_int64(s, 0);
		if (bytes)
			*bytes = (uint64_t)sqlite3_column_int64(s, 1);
	} else
		ret = rc == SQLITE_DONE ? -ENOENT : map_sqlite(c, rc);
	sqlite3_reset(s);
	return ret;
}

int wfs_catalog_object_max_bytes(struct wfs_catalog *c, uint64_t *bytes)
{
	sqlite3_stmt *s;
	int rc;

	rc = sqlite3_prepare_v2(c->db, "SELECT COALESCE(MAX(size), 0) FROM objects", -1, &s, NULL);
	if (rc != SQLITE_OK)
		return map_sqlite(c, rc);
	rc = sqlite3_step(s);
	if (rc == SQLITE_ROW)
		*bytes = (uint64_t)sqlite3_column_int64(s, 0);
	sqlite3_finalize(s);
	return rc == SQLITE_ROW ? 0 : map_sqlite(c, rc);
}

int wfs_catalog_object_set_state(struct wfs_catalog *c, const struct wfs_digest *d,
				 enum wfs_object_state state)
{
	sqlite3_stmt *s;
	int ret = begin(c); /* a change like the others: it joins the batch, not a commit of its own */

	if (ret)
		return ret;
	s = stmt(c, ST_OBJECT_STATE);
	bind_blob(c, s, 1, d->bytes, WFS_DIGEST_BYTES, SQLITE_STATIC);
	bind_int(c, s, 2, state);
	ret = step_done(c, s);
	if (ret == 0 && sqlite3_changes(c->db) == 0)
		ret = -ENOENT;
	return end(c, ret);
}

static int object_delete_once(struct wfs_catalog *c, const struct wfs_digest *d)
{
	sqlite3_stmt *s = stmt(c, ST_OBJECT_DELETE);
	int ret;

	bind_blob(c, s, 1, d->bytes, WFS_DIGEST_BYTES, SQLITE_STATIC);
	ret = step_done(c, s);
	if (ret == 0 && sqlite3_changes(c->db) == 0) {
		uint64_t refs;

		ret = wfs_catalog_object_refcount(c, d, &refs);
		if (ret == 0)
			ret = -EBUSY;
	}
	return ret;
}

int wfs_catalog_object_adopt(struct wfs_catalog *c, const struct wfs_digest *d, uint64_t bytes)
{
	sqlite3_stmt *s;
	int ret = begin(c);

	if (ret)
		return ret;
	ret = map_sqlite(c, sqlite3_prepare_v2(c->db, "INSERT OR IGNORE INTO objects(digest, size, refcount, released)"
						   " VALUES(?1, ?2, 0, unixepoch())", -1, &s, NULL));
	if (ret == 0) {
		bind_blob(c, s, 1, d->bytes, WFS_DIGEST_BYTES, SQLITE_STATIC);
		bind_int64(c, s, 2, (int64_t)bytes);
		ret = step_done(c, s);
		sqlite3_finalize(s);
	}
	return end(c, ret);
}

/* Frees space: on a full filesystem, runs again with room made (room_for_removal). */
int wfs_catalog_object_delete(struct wfs_catalog *c, const struct wfs_digest *d)
{
	int ret = object_delete_once(c, d);

	if (ret == -ENOSPC && room_for_removal(c))
		ret = object_delete_once(c, d);
	if (ret == 0)
		ret = wfs_catalog_commit(c); /* the caller removes the file next: never before the row */
	return ret;
}

int wfs_catalog_unreferenced(struct wfs_catalog *c,
			     int (*fn)(void *ctx, const struct wfs_digest *d, uint64_t bytes), void *ctx)
{
	sqlite3_stmt *s = stmt(c, ST_UNREFERENCED);
	struct wfs_digest d;
	int rc, ret = 0;

	while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
		if (sqlite3_column_bytes(s, 0) != WFS_DIGEST_BYTES)
			continue;
		memcpy(d.bytes, sqlite3_column_blob(s, 0), WFS_DIGEST_BYTES);
		if (fn(ctx, &d, (uint64_t)sqlite3_column_int64(s, 1)))
			break;
	}
	if (rc != SQLITE_ROW && rc != SQLITE_DONE)
		ret = map_sqlite(c, rc);
	sqlite3_reset(s);
	return ret;
}

int wfs_catalog_objects(struct wfs_catalog *c, int (*fn)(void *ctx, const struct wfs_object_row *row),
			void *ctx)
{
	struct wfs_object_row row;
	sqlite3_stmt *s;
	int rc, ret;

	rc = sqlite3_prepare_v2(c->db, "SELECT digest, size, refcount, state, released FROM objects"
				       " ORDER BY digest", -1, &s, NULL);
	if (rc != SQLITE_OK)
		return map_sqlite(c, rc);
	while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
		if (sqlite3_column_bytes(s, 0) != WFS_DIGEST_BYTES)
			continue;
		memcpy(row.digest.bytes, sqlite3_column_blob(s, 0), WFS_DIGEST_BYTES);
		row.bytes = (uint64_t)sqlite3_column_int64(s, 1);
		row.refcount = (uint64_t)sqlite3_column_int64(s, 2);
		row.state = sqlite3_column_int(s, 3);
		row.released = sqlite3_column_int64(s, 4);
		if (fn(ctx, &row))
			break;
	}
	ret = rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : map_sqlite(c, rc);
	sqlite3_finalize(s);
	return ret;
}

static int query_u64(struct wfs_catalog *c, const char *sql, uint64_t *a, uint64_t *b);

int wfs_catalog_check(struct wfs_catalog *c, bool repair, struct wfs_catalog_check *out)
{
	struct wfs_catalog_check r = {0};
	char sql[512], *integrity = NULL;
	sqlite3_stmt *s;
	int ret;

	if (repair && c->readonly)
		return -EROFS;
	if (sqlite3_prepare_v2(c->db, "PRAGMA integrity_check", -1, &s, NULL) == SQLITE_OK) {
		if (sqlite3_step(s) == SQLITE_ROW)
			integrity = sqlite3_mprintf("%s", (const char *)sqlite3_column_text(s, 0));
		sqlite3_finalize(s);
	}
	r.integrity_ok = integrity && strcmp(integrity, "ok") == 0;
	if (!r.integrity_ok)
		wfs_log(WFS_LOG_ERR, "catalog: integrity check: %s", integrity ? integrity : "failed to run");
	sqlite3_free(integrity);

	ret = repair ? begin(c) : 0;
	if (ret)
		return ret;
	ret = query_u64(c, "SELECT count(*) FROM objects o WHERE refcount !="
			   " (SELECT count(*) FROM inodes i WHERE i.digest = o.digest)", &r.refcounts_wrong, NULL);
	if (ret == 0)
		ret = query_u64(c, "SELECT count(DISTINCT digest) FROM inodes i WHERE digest IS NOT NULL AND"
				   " NOT EXISTS (SELECT 1 FROM objects o WHERE o.digest = i.digest)",
				&r.digests_without_row, NULL);
	if (ret == 0)
		ret = query_u64(c, "SELECT count(*) FROM dentries d WHERE NOT EXISTS"
				   " (SELECT 1 FROM inodes i WHERE i.ino = d.ino)", &r.dangling_dentries, NULL);
	snprintf(sql, sizeof(sql),
		 "SELECT count(*) FROM inodes i WHERE (mode & %u) != %u AND nlink !="
		 " (SELECT count(*) FROM dentries d WHERE d.ino = i.ino)", (unsigned)S_IFMT, (unsigned)S_IFDIR);
	if (ret == 0)
		ret = query_u64(c, sql, &r.nlink_wrong, NULL);
	snprintf(sql, sizeof(sql), "SELECT count(*) FROM inodes WHERE digest IS NULL AND (mode & %u) = %u",
		 (unsigned)S_IFMT, (unsigned)S_IFREG);
	if (ret == 0)
		ret = query_u64(c, sql, &r.unsealed, NULL);
	if (repair && ret == 0) {
		/* Rows first, so the recount below covers them. */
		ret = exec(c, "INSERT INTO objects(digest, size) SELECT digest, max(size) FROM inodes i"
			      " WHERE digest IS NOT NULL AND NOT EXISTS"
			      " (SELECT 1 FROM objects o WHERE o.digest = i.digest) GROUP BY digest;"
			      "UPDATE objects SET refcount ="
			      " (SELECT count(*) FROM inodes i WHERE i.digest = objects.digest);"
			      "DELETE FROM dentries WHERE NOT EXISTS"
			      " (SELECT 1 FROM inodes i WHERE i.ino = dentries.ino);");
		snprintf(sql, sizeof(sql),
			 "UPDATE inodes SET nlink = (SELECT count(*) FROM dentries d WHERE d.ino = inodes.ino)"
			 " WHERE (mode & %u) != %u;", (unsigned)S_IFMT, (unsigned)S_IFDIR);
		if (ret == 0)
			ret = exec(c, sql);
	}
	if (repair)
		ret = end(c, ret);
	if (ret == 0)
		*out = r;
	return ret;
}

static int query_u64(struct wfs_catalog *c, const char *sql, uint64_t *a, uint64_t *b)
{
	sqlite3_stmt *s;
	int rc;

	rc = sqlite3_prepare_v2(c->db, sql, -1, &s, NULL);
	if (rc != SQLITE_OK)
		return map_sqlite(c, rc);
	rc = sqlite3_step(s);
	if (rc == SQLITE_ROW) {
		*a = (uint64_t)sqlite3_column_int64(s, 0);
		if (b)
			*b = (uint64_t)sqlite3_column_int64(s, 1);
	}
	sqlite3_finalize(s);
	return rc == SQLITE_ROW ? 0 : map_sqlite(c, rc);
}

/*
 * The names chosen by @where (a condition on dentry d and inode i; ?1 bound to @blob of @blob_bytes
 * bytes) with their paths: each chosen dentry's directory chain is followed up to the root (a
 * directory has one dentry), at most 4096 levels so that a cycle in a damaged catalog ends.
 */
static int paths_where(struct wfs_catalog *c, const char *where, const void *blob, int blob_bytes,
		       wfs_catalog_path_fn fn, void *ctx)
{
	char sql[1024];
	sqlite3_stmt *s;
	int ret, rc;

	snprintf(sql, sizeof(sql),
		 "WITH RECURSIVE up(ino, dir, parent, path, depth) AS ("
		 " SELECT d.ino, d.parent, d.parent, d.name, 0 FROM dentries d JOIN inodes i ON i.ino = d.ino"
		 " WHERE %s"
		 " UNION ALL"
		 " SELECT up.ino, up.dir, pd.parent, pd.name || '/' || up.path, up.depth + 1 FROM up"
		 " JOIN dentries pd ON pd.ino = up.parent WHERE up.parent != %d AND up.depth < 4096)"
		 " SELECT '/' || path, dir, ino FROM up WHERE parent = %d ORDER BY 1",
		 where, WFS_ROOT_INO, WFS_ROOT_INO);
	ret = map_sqlite(c, sqlite3_prepare_v2(c->db, sql, -1, &s, NULL));
	if (ret)
		return ret;
	bind_blob(c, s, 1, blob, blob_bytes, SQLITE_STATIC);
	while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
		ret = fn(ctx, (const char *)sqlite3_column_text(s, 0), (uint64_t)sqlite3_column_int64(s, 1),
			 (uint64_t)sqlite3_column_int64(s, 2));
		if (ret)
			break;
	}
	if (ret == 0 && rc != SQLITE_DONE)
		ret = map_sqlite(c, rc);
	sqlite3_finalize(s);
	return ret;
}

int wfs_catalog_object_paths(struct wfs_catalog *c, const struct wfs_digest *d, wfs_catalog_path_fn fn,
			     void *ctx)
{
	return paths_where(c, "i.digest = ?1", d->bytes, WFS_DIGEST_BYTES, fn, ctx);
}

int wfs_catalog_prefixed_paths(struct wfs_catalog *c, const char *prefix, wfs_catalog_path_fn fn, void *ctx)
{
	/* substr() and a blob comparison: bytewise, without LIKE's wildcards and case folding. */
	return paths_where(c, "CAST(substr(CAST(d.name AS BLOB), 1, length(CAST(?1 AS BLOB))) AS BLOB) = ?1",
			   prefix, (int)strlen(prefix), fn, ctx);
}

int wfs_catalog_unsealed_paths(struct wfs_catalog *c, wfs_catalog_path_fn fn, void *ctx)
{
	char mode[48];

	/* A regular file without a digest (?1 unused: paths_where binds one). */
	snprintf(mode, sizeof(mode), "(i.mode & %d) = %d AND i.digest IS NULL", S_IFMT, S_IFREG);
	return paths_where(c, mode, "", 0, fn, ctx);
}

int wfs_catalog_retain_get(struct wfs_catalog *c, uint64_t *bytes)
{
	return meta_u64(c, "retain_bytes", bytes);
}

int wfs_catalog_retain_set(struct wfs_catalog *c, uint64_t bytes)
{
	sqlite3_stmt *s;
	int ret, rc;

	if (c->readonly)
		return -EROFS;
	ret = begin(c);
	if (ret)
		return ret;
	rc = sqlite3_prepare_v2(c->db, "INSERT OR REPLACE INTO meta(key, value) VALUES('retain_bytes', ?)", -1, &s,
				NULL);
	if (rc == SQLITE_OK) {
		bind_int64(c, s, 1, (sqlite3_int64)bytes); /* up to 8 EiB: wfs_parse_size's range */
		ret = step_done(c, s);
		sqlite3_finalize(s);
	} else {
		ret = map_sqlite(c, rc);
	}
	return end(c, ret);
}

int wfs_catalog_stats(struct wfs_catalog *c, struct wfs_catalog_stats *out)
{
	struct wfs_catalog_stats st = {0};
	char sql[256];
	int ret;

	snprintf(sql, sizeof(sql),
		 "SELECT count(*), coalesce(sum(i.size), 0) FROM dentries d JOIN inodes i ON i.ino = d.ino"
		 " WHERE (i.mode & %u) = %u",
		 (unsigned)S_IFMT, (unsigned)S_IFREG);
	ret = query_u64(c, sql, &st.names, &st.logical_bytes);
	if (ret == 0) {
		snprintf(sql, sizeof(sql), "SELECT count(*) FROM inodes WHERE (mode & %u) = %u AND nlink > 0",
			 (unsigned)S_IFMT, (unsigned)S_IFDIR);
		ret = query_u64(c, sql, &st.directories, NULL);
	}
	if (ret == 0) {
		snprintf(sql, sizeof(sql), "SELECT count(*) FROM dentries d JOIN inodes i ON i.ino = d.ino"
			 " WHERE (i.mode & %u) = %u", (unsigned)S_IFMT, (unsigned)S_IFLNK);
		ret = query_u64(c, sql, &st.symlinks, NULL);
	}
	if (ret == 0)
		ret = query_u64(c, "SELECT count(*), coalesce(sum(size), 0) FROM objects WHERE refcount > 0",
				&st.objects, &st.object_bytes);
	if (ret == 0)
		ret = query_u64(c, "SELECT count(*), coalesce(sum(size), 0) FROM objects WHERE refcount = 0",
				&st.unreferenced_objects, &st.unreferenced_bytes);
	if (ret == 0)
		ret = query_u64(c, "SELECT count(*) FROM objects WHERE state = 1", &st.quarantined_objects, NULL);
	if (ret == 0) {
		snprintf(sql, sizeof(sql), "SELECT count(*) FROM inodes WHERE digest IS NULL AND (mode & %u) = %u"
			 " AND nlink > 0", (unsigned)S_IFMT, (unsigned)S_IFREG);
		ret = query_u64(c, sql, &st.unsealed_files, NULL);
	}
	if (ret == 0) {
		snprintf(sql, sizeof(sql), "SELECT count(*) FROM dentries d JOIN inodes i ON i.ino = d.ino"
			 " WHERE (i.mode & %u) IN (%u, %u, %u, %u)", (unsigned)S_IFMT, (unsigned)S_IFIFO,
			 (unsigned)S_IFSOCK, (unsigned)S_IFCHR, (unsigned)S_IFBLK);
		ret = query_u64(c, sql, &st.special_files, NULL);
	}
	if (ret == 0)
		*out = st;
	return ret;
}

int wfs_catalog_sync(struct wfs_catalog *c)
{
	int rc;

	if (c->readonly)
		return 0;
	rc = wfs_catalog_commit(c);
	if (rc)
		return rc;
	rc = sqlite3_wal_checkpoint_v2(c->db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
	return map_sqlite(c, rc);
}
