/* SPDX-License-Identifier: Apache-2.0 */
/*
 * keep — where the versions being written leave their bytes for a successor (docs/design.md,
 * "Takeover: writers in flight").
 *
 * Under -o holder a server may be killed while files are open for writing. Their bytes must outlive
 * it, and a successor must find them, so that the writer's next write, fsync or close goes on as
 * if nothing happened. So every version of a server under a holder has a record in an area of
 * shared memory that the holder maps before its first fork (takeover.c gives it here):
 *   - a version of up to WFS_VERSION_MEM_MAX bytes keeps them in its record's slot of the area (the
 *     memory it would have had from malloc: no syscall, no tmp inode), not in the process's heap;
 *   - a larger one, a copy of a sealed file and one written through the kernel (passthrough) keep
 *     them in a named tmp file under STORE/tmp (wfs_store_tmp_create_named()), whose name is in
 *     the record; the holder keeps the store lock, so nothing removes it between two servers;
 *   - the record has the inode number and the size (one relaxed store per change of size).
 * A successor reads every record (wfs_keep_each()) before it serves, and adopts the live ones
 * (version.h, wfs_version_adopt()). A record is:
 *
 *     wfs_keep_new()          bytes in place (new, or a copy of its base done)     wfs_keep_end()
 *   ───────────────▶ FILLING ─────────────────────────────────────────────▶ LIVE ──────────────▶ free
 *                      │                                                    │
 *                      └────────────── a write error, bytes dropped ────────┴──▶ LOST (wfs_keep_lost)
 *
 * FILLING (a copy of the sealed bytes in progress) is never adopted: the request that started it
 * is resent and starts it again. LOST says that the bytes are not all kept (a write failed, a full
 * store left only their digest): its writers get EIO from a successor, never a seal of part of them.
 * When every record is in use, a version is kept nowhere (wfs_keep_new() returns -1) and the area
 * counts it: a successor then cannot tell a writer's version from none and refuses every writer it
 * finds no record for (EIO, logged).
 *
 * Without an area (no holder, check_core) every function is a cheap no-op and wfs_keep_new() -1.
 * Thread-safety: any thread; a record is written by the one version that owns it (under its lock).
 */
#ifndef WFS_CORE_KEEP_H
#define WFS_CORE_KEEP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WFS_KEEP_RECORDS 512u /* versions kept at once: 512 slots of WFS_VERSION_MEM_MAX, 512 MiB of
			       * address space, only the pages written cost memory */

enum wfs_keep_state { WFS_KEEP_FREE, WFS_KEEP_FILLING, WFS_KEEP_LIVE, WFS_KEEP_LOST };

/* What a successor reads of one record. */
struct wfs_keep_record {
	unsigned index;          /* for wfs_keep_mem() and wfs_keep_end() */
	enum wfs_keep_state state;
	uint64_t ino;            /* the inode whose writer it is */
	uint64_t size;           /* bytes, for one whose bytes are in memory */
	bool in_memory;          /* in the slot (wfs_keep_mem()), else in STORE/tmp/@tmp_name */
	bool kernel;             /* written through the kernel (passthrough): its size is the file's */
	char tmp_name[32];
};

/* Bytes of shared memory the area takes (page-aligned). */
size_t wfs_keep_area_bytes(void);
/*
 * Use @area (wfs_keep_area_bytes() bytes of MAP_SHARED memory, zero-filled when new) from now on.
 * @fresh: the holder made it now (zeroed); else a successor inherits what a dead server left.
 * NULL: no area from now on (tests).
 */
void wfs_keep_attach(void *area, bool fresh);
bool wfs_keep_on(void);

/* A new record (FILLING) for a version of inode @ino; its index, or -1 (no area, or all in use). */
int wfs_keep_new(uint64_t ino);
/* The WFS_VERSION_MEM_MAX bytes of record @k's slot (for its in-memory bytes). */
char *wfs_keep_mem(int k);
/* Record @k: bytes in its slot, @size of them valid; LIVE. */
void wfs_keep_in_memory(int k, uint64_t size);
/* Record @k: bytes in STORE/tmp/@name (not ""), LIVE; @kernel: written through the kernel. */
void wfs_keep_in_file(int k, const char *name, bool kernel);
/* Record @k's size in bytes changed (one relaxed store; -1 is a no-op). */
void wfs_keep_size(int k, uint64_t size);
/* Record @k cannot be adopted any more (LOST); -1 is a no-op. */
void wfs_keep_lost(int k);
/* Record @k is free again (its version is published or discarded); -1 is a no-op. */
void wfs_keep_end(int k);
/* Versions that found every record in use since the area was made. */
uint64_t wfs_keep_overflows(void);
/*
 * Successor, before any thread: call @fn for every record that is not free. Returns the count.
 */
size_t wfs_keep_each(void (*fn)(const struct wfs_keep_record *r, void *arg), void *arg);

#endif
