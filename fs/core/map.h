/* SPDX-License-Identifier: Apache-2.0 */
/*
 * map — a chained hash table keyed on uint64, for the daemon's in-memory tables (inodes by number,
 * objects and checks by the first 8 bytes of their digest). Entries embed a wfs_map_node and are
 * owned by the table's owner, never by the map: removing an entry does not free it.
 *
 * Not thread-safe: every map of the daemon is protected by fs->lock (daemon.h).
 */
#ifndef WFS_CORE_MAP_H
#define WFS_CORE_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "digest.h"

struct wfs_map_node {
	struct wfs_map_node *next;
	uint64_t key;
};

struct wfs_map {
	struct wfs_map_node **buckets;
	size_t nbuckets; /* a power of two, or 0 before the first insert */
	size_t count;    /* entries */
	size_t drained;  /* wfs_map_pop(): buckets before this one are empty */
};

/* An empty map (allocates nothing). */
void wfs_map_init(struct wfs_map *m);
/* Free the bucket array; the entries, if any are left, are the caller's. */
void wfs_map_release(struct wfs_map *m);
/* The first entry with @key, or NULL. */
struct wfs_map_node *wfs_map_first(const struct wfs_map *m, uint64_t key);
/* The entry after @n with the same @key (keys collide), or NULL. */
struct wfs_map_node *wfs_map_next(struct wfs_map_node *n, uint64_t key);
/* Add @n (n->key set). Returns 0 or -ENOMEM (growing the bucket array). */
int wfs_map_insert(struct wfs_map *m, struct wfs_map_node *n);
/* Remove @n, which must be in @m. */
void wfs_map_remove(struct wfs_map *m, struct wfs_map_node *n);
/* Remove and return some entry of @m, or NULL when empty: for tearing a table down, in time linear
 * in the table's size over all calls (an insert starts the scan over). */
struct wfs_map_node *wfs_map_pop(struct wfs_map *m);
/* The key of digest-keyed tables: the digest's first 8 bytes (uniformly distributed already). */
uint64_t wfs_map_digest_key(const struct wfs_digest *d);

#endif
