/* SPDX-License-Identifier: Apache-2.0 */
/* keep.h: version records and their memory slots in an area a successor inherits. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "keep.h"
#include "version.h"

#define KEEP_MAGIC 0x5746534bu /* "WFSK" */
#define WORDS (WFS_KEEP_RECORDS / 64)
#define SMALL_KEPT ((size_t)64 << 10) /* a slot keeps up to this many bytes of pages when freed */

struct rec {
	_Atomic uint32_t state;
	_Atomic uint32_t in_memory, kernel;
	uint64_t ino;
	_Atomic uint64_t size;
	_Atomic uint64_t high;   /* the most bytes the slot held: what to give back at the end */
	char tmp_name[32];
};

struct head {
	uint32_t magic;
	_Atomic uint64_t used[WORDS]; /* bit set: record in use */
	_Atomic uint64_t overflows;
	_Atomic uint32_t hint;
	struct rec recs[WFS_KEEP_RECORDS];
};

static struct head *H;
static char *slots;

static size_t head_bytes(void)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);

	return (sizeof(struct head) + page - 1) / page * page;
}

size_t wfs_keep_area_bytes(void)
{
	return head_bytes() + (size_t)WFS_KEEP_RECORDS * WFS_VERSION_MEM_MAX;
}

void wfs_keep_attach(void *area, bool fresh)
{
	H = area;
	slots = area ? (char *)area + head_bytes() : NULL;
	if (!area)
		return;
	if (fresh)
		H->magic = KEEP_MAGIC;
}

bool wfs_keep_on(void)
{
	return H != NULL;
}

int wfs_keep_new(uint64_t ino)
{
	unsigned start;

	if (!H)
		return -1;
	start = atomic_fetch_add_explicit(&H->hint, 1, memory_order_relaxed);
	for (unsigned n = 0; n < WORDS; n++) {
		unsigned w = (start + n) % WORDS;
		uint64_t bits = atomic_load_explicit(&H->used[w], memory_order_relaxed);

		while (~bits) {
			unsigned b = (unsigned)__builtin_ctzll(~bits);

			if (atomic_compare_exchange_weak(&H->used[w], &bits, bits | (1ull << b))) {
				struct rec *r = &H->recs[w * 64 + b];

				r->ino = ino;
				r->tmp_name[0] = '\0';
				atomic_store_explicit(&r->size, 0, memory_order_relaxed);
				atomic_store_explicit(&r->in_memory, 0, memory_order_relaxed);
				atomic_store_explicit(&r->kernel, 0, memory_order_relaxed);
				atomic_store_explicit(&r->state, WFS_KEEP_FILLING, memory_order_release);
				return (int)(w * 64 + b);
			}
		}
	}
	atomic_fetch_add(&H->overflows, 1);
	return -1;
}

char *wfs_keep_mem(int k)
{
	return slots + (size_t)k * WFS_VERSION_MEM_MAX;
}

void wfs_keep_size(int k, uint64_t size)
{
	struct rec *r;

	if (k < 0)
		return;
	r = &H->recs[k];
	atomic_store_explicit(&r->size, size, memory_order_release);
	if (size > atomic_load_explicit(&r->high, memory_order_relaxed))
		atomic_store_explicit(&r->high, size, memory_order_relaxed);
}

void wfs_keep_in_memory(int k, uint64_t size)
{
	if (k < 0)
		return;
	wfs_keep_size(k, size);
	atomic_store(&H->recs[k].in_memory, 1);
	atomic_store(&H->recs[k].state, WFS_KEEP_LIVE);
}

void wfs_keep_in_file(int k, const char *name, bool kernel)
{
	struct rec *r;

	if (k < 0)
		return;
	r = &H->recs[k];
	/* The name before the flags that say it is where the bytes are: a kill in between leaves the
	 * slot's bytes, which are still whole (the caller copied them to the file first). */
	snprintf(r->tmp_name, sizeof(r->tmp_name), "%s", name);
	atomic_store(&r->kernel, kernel);
	atomic_store(&r->in_memory, 0);
	atomic_store(&r->state, name[0] ? WFS_KEEP_LIVE : WFS_KEEP_LOST);
}

void wfs_keep_lost(int k)
{
	if (k >= 0)
		atomic_store(&H->recs[k].state, WFS_KEEP_LOST);
}

void wfs_keep_end(int k)
{
	struct rec *r;
	uint64_t high;

	if (k < 0)
		return;
	r = &H->recs[k];
	high = atomic_exchange(&r->high, 0);
	/* A big version's pages go back to the system; a small one's stay for the next (as a heap). */
	if (high > SMALL_KEPT)
		madvise(wfs_keep_mem(k) + SMALL_KEPT, WFS_VERSION_MEM_MAX - SMALL_KEPT, MADV_REMOVE);
	atomic_store(&r->state, WFS_KEEP_FREE);
	atomic_fetch_and(&H->used[k / 64], ~(1ull << (k % 64)));
}

uint64_t wfs_keep_overflows(void)
{
	return H ? atomic_load(&H->overflows) : 0;
}

size_t wfs_keep_each(void (*fn)(const struct wfs_keep_record *r, void *arg), void *arg)
{
	size_t n = 0;

	if (!H)
		return 0;
	for (unsigned k = 0; k < WFS_KEEP_RECORDS; k++) {
		struct rec *r = &H->recs[k];
		struct wfs_keep_record out;

		if (!(atomic_load(&H->used[k / 64]) & (1ull << (k % 64))))
			continue;
		out = (struct wfs_keep_record){
			.index = k,
			.state = (enum wfs_keep_state)atomic_load(&r->state),
			.ino = r->ino,
			.size = atomic_load(&r->size),
			.in_memory = atomic_load(&r->in_memory),
			.kernel = atomic_load(&r->kernel),
		};
		if (out.state == WFS_KEEP_FREE)
			continue; /* claimed, not filled in yet: nothing the dead server used */
		memcpy(out.tmp_name, r->tmp_name, sizeof(out.tmp_name));
		out.tmp_name[sizeof(out.tmp_name) - 1] = '\0';
		fn(&out, arg);
		n++;
	}
	return n;
}
