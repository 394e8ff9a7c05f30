/* SPDX-License-Identifier: Apache-2.0 */
/* map.h: a chained hash table keyed on uint64. */
#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "map.h"

static size_t bucket(const struct wfs_map *m, uint64_t key)
{
	key ^= key >> 33;
	key *= 0xff51afd7ed558ccdULL; /* murmur3 finaliser: spreads sequential inode numbers */
	key ^= key >> 33;
	return (size_t)key & (m->nbuckets - 1);
}

void wfs_map_init(struct wfs_map *m)
{
	m->buckets = NULL;
	m->nbuckets = 0;
	m->count = 0;
	m->drained = 0;
}

void wfs_map_release(struct wfs_map *m)
{
	free(m->buckets);
	wfs_map_init(m);
}

struct wfs_map_node *wfs_map_first(const struct wfs_map *m, uint64_t key)
{
	struct wfs_map_node *n;

	if (!m->nbuckets)
		return NULL;
	for (n = m->buckets[bucket(m, key)]; n; n = n->next)
		if (n->key == key)
			return n;
	return NULL;
}

struct wfs_map_node *wfs_map_next(struct wfs_map_node *n, uint64_t key)
{
	for (n = n->next; n; n = n->next)
		if (n->key == key)
			return n;
	return NULL;
}

static int grow(struct wfs_map *m)
{
	size_t nb = m->nbuckets ? m->nbuckets * 2 : 1024;
	struct wfs_map_node **b = calloc(nb, sizeof(*b));
	struct wfs_map old = *m;

	if (!b)
		return -ENOMEM;
	m->buckets = b;
	m->nbuckets = nb;
	for (size_t i = 0; i < old.nbuckets; i++) {
		struct wfs_map_node *n = old.buckets[i], *next;

		for (; n; n = next) {
			size_t h = bucket(m, n->key);

			next = n->next;
			n->next = b[h];
			b[h] = n;
		}
	}
	free(old.buckets);
	return 0;
}

int wfs_map_insert(struct wfs_map *m, struct wfs_map_node *n)
{
	size_t h;

	if (m->count >= m->nbuckets) {
		int ret = grow(m);

		if (ret)
			return ret;
	}
	h = bucket(m, n->key);
	n->next = m->buckets[h];
	m->buckets[h] = n;
	m->drained = 0;
	m->count++;
	return 0;
}

void wfs_map_remove(struct wfs_map *m, struct wfs_map_node *n)
{
	struct wfs_map_node **p = &m->buckets[bucket(m, n->key)];

	for (; *p; p = &(*p)->next) {
		if (*p == n) {
			*p = n->next;
			m->count--;
			return;
		}
	}
	assert(!"wfs_map_remove: not in the map");
}

struct wfs_map_node *wfs_map_pop(struct wfs_map *m)
{
	/* Buckets before m->drained are empty (nothing was inserted since): each is looked at once,
	 * so emptying the table is linear, not a scan from bucket 0 per entry. */
	for (size_t i = m->drained; i < m->nbuckets; i++) {
		struct wfs_map_node *n = m->buckets[i];

		if (n) {
			m->buckets[i] = n->next;
			m->count--;
			m->drained = i;
			return n;
		}
	}
	m->drained = m->nbuckets;
	return NULL;
}

uint64_t wfs_map_digest_key(const struct wfs_digest *d)
{
	uint64_t k;

	memcpy(&k, d->bytes, sizeof(k));
	return k;
}
