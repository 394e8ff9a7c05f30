/* SPDX-License-Identifier: Apache-2.0 */
/* takeover.h: the state a server leaves for its successor, and the successor's side of a takeover. */
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "inode.h"
#include "keep.h"
#include "clock.h"
#include "log.h"
#include "openmode.h"
#include "ops.h"
#include "seal.h"
#include "store.h"
#include "upgrade.h"
#include "version.h"
#include "takeover.h"

#define REGION_MAGIC 0x57465354u /* "WFST" */
#define REGION_LAYOUT 6u /* 3: writable handles and the versions they write (keep.h); 4: the
			  * catalog's redo log; 5: a handle's flags (O_APPEND, not yet answered) and the
			  * request it answers; 6: as many backing ids as handles */
#define REDO_BYTES ((size_t)4 << 20) /* the catalog's redo log (wfs_catalog_redo): a batch of 1,024
				      * creates takes about 1 MiB; only the pages written cost memory */
#define INIT_MAX 512               /* bytes of INIT request or reply kept (both are ~100) */
#define HANDLES_CAP 65536u         /* handles open at once (3/4 of it: linear probing) */
#define IDS_CAP HANDLES_CAP        /* backing ids registered at once (one per file open through
				    * passthrough: as many as handles; 3/4 of it, as handles) */
#define FH_EPOCH_SHIFT 48
#define FH_PTR_MASK ((1ull << 47) - 1)

#ifndef FUSE_HAS_RESEND
#define FUSE_HAS_RESEND (1ull << 39)
#endif
#ifndef FUSE_UNIQUE_RESEND
#define FUSE_UNIQUE_RESEND (1ull << 63)
#endif
#define NOTIFY_RESEND 7 /* FUSE_NOTIFY_RESEND, Linux 6.9 (FUSE 7.40) */

/* The kernel's passthrough ioctls on /dev/fuse (as in ops.c). */
#define DEV_IOC_BACKING_CLOSE _IOW(229, 2, uint32_t)

/*
 * The shared region. The holder writes takeovers and died_ns; the running server everything else
 * (one server runs at a time; a successor starts after its predecessor is reaped). The tables are
 * under @lock, a mutex of the running server's, initialised again by each: a dead server may have
 * held it, or died half-way through an update, which is why a successor rebuilds both tables.
 */
struct id_slot {
	int32_t id;        /* 0: empty */
	uint64_t dev, ino; /* the registered file */
};
struct handle_slot {
	uint64_t fh;       /* 0: empty */
	int32_t id;        /* its backing id, 0: none (a daemon-served writer) */
	uint32_t flags;    /* SLOT_*: how a successor adopts it */
	uint64_t ino;      /* a writable handle's inode, for a successor that adopts it */
	uint64_t unique;   /* the OPEN or CREATE whose reply gives the kernel @fh (its unique as the
			    * kernel first sent it; a resend keeps it) */
};
#define SLOT_APPEND 1u     /* opened with O_APPEND: its writes land at the version's end (fileio.c) */
#define SLOT_UNANSWERED 2u /* its reply is not known to have reached the kernel */
#define SLOT_REPLYING 4u   /* ... and was being written: the kernel may have it */
#define SLOT_PASSTHROUGH 8u /* opened through passthrough (@id is cleared at a writer's release,
			    * which a successor may adopt still: in the mode its readers share) */
#define SLOT_CLOSED 16u    /* a writer: a close(2) of it was answered (wfs_takeover_handle_flushed) */
#define SLOT_FINISHED 32u  /* ... which said its bytes are done */
#define SLOT_ENDED 64u     /* ... which ended its writing */
struct region {
	uint32_t magic, layout;
	_Atomic uint32_t epoch;
	_Atomic int32_t holder_pid, server_pid;
	_Atomic uint64_t takeovers;
	_Atomic uint64_t ino_told;
	_Atomic uint64_t died_ns;
	_Atomic uint64_t last_pause_ns, worst_pause_ns;
	_Atomic uint32_t init_state;       /* 0 none, 1 request saved, 2 its reply saved too */
	_Atomic uint64_t handles_dropped;  /* handle entries left out (table full): ids may leak */
	_Atomic int32_t serving_pid;       /* the successor answers (its replay matched); 0 after a death */
	_Atomic uint64_t serving_ns;
	_Atomic uint64_t gate_ns;          /* a drain for an upgrade stopped answering (0: a death) */
	_Atomic uint32_t writers_closed;   /* the drain's (wfs_takeover_note_drain) */
	_Atomic uint32_t writers_lost;     /* the drain's writers still open, then the successor's
					    * writers it could not adopt (wfs_takeover_adopt) */
	_Atomic uint64_t upgrades;
	uint64_t catalog_dev, catalog_ino; /* the store's catalog.db as the first server found it */
	uint32_t init_in_len, init_out_len;
	uint64_t init_unique;
	unsigned char init_in[INIT_MAX], init_out[INIT_MAX];
	pthread_mutex_t lock;
	struct id_slot ids[IDS_CAP];
	struct handle_slot handles[HANDLES_CAP];
	/* The counters since the mount (daemon.h), written by the running server. In the tail of the
	 * last page, which layout 4 left unused, so the memfd's size and the layout stay: a successor
	 * of a build before them reads zeros, and one of such a build ignores them. */
	union {
		struct wfs_counters c;
		uint64_t reserve[32]; /* cppcheck-suppress unusedStructMember ; room to append counters */
	} counters;
	struct wfs_ops_tally requests[64]; /* FUSE requests by opcode (ops.h) */
	/* The successor's writers adopted (wfs_takeover_adopt), in the last page's tail as the
	 * counters are: a build before it leaves it as it is and ignores it. */
	_Atomic uint32_t writers_adopted;
};
_Static_assert(sizeof(struct wfs_counters) <= sizeof(uint64_t[32]), "counters outgrew their reserve");
_Static_assert(WFS_REQ_COUNT <= 64, "opcodes outgrew their reserve");
_Static_assert((offsetof(struct region, counters) + 4095) / 4096 == (sizeof(struct region) + 4095) / 4096,
	       "the counters must fit the region's last page: another memfd size refuses takeovers between builds");

/* An id a dead server registered, kept until nothing uses it: this server's private tables, by id
 * and by file, under R->lock (map.h; the entries are malloc'd here, the maps own none). */
struct inherited {
	struct wfs_map_node by_id;   /* key: @id */
	struct wfs_map_node by_file; /* key: file_key(@dev, @ino) */
	int32_t id;
	uint64_t dev, ino;
	uint64_t stale;  /* handles of dead servers that use it */
	uint64_t users;  /* this server's registrations of it (object.c's: 0 or 1) */
};

static struct region *R;
static int region_fd = -1;
static _Atomic int32_t holder_lost; /* the holder that died under this server, or 0 */

/* Handles of dead servers this one adopted, by the dead server's fh (the map's key) → this server's
 * handle; looked up only for a dead server's fh. Added before the session starts, removed at their
 * release, under adopted_lock; entries are malloc'd here (map.h: the map owns none). */
struct adopted {
	struct wfs_map_node node; /* first: a node is its entry */
	void *h;
};
static struct wfs_map adopted;
static atomic_size_t adopted_live; /* adopted.count, read without the lock */
static pthread_mutex_t adopted_lock = PTHREAD_MUTEX_INITIALIZER;

/* adopted_lock held: the entry for the dead server's @fh, or NULL. */
static struct adopted *adopted_find(uint64_t fh)
{
	return (struct adopted *)wfs_map_first(&adopted, fh);
}

/* Before the session starts: a new entry for @fh (its h NULL), or NULL (no memory: not adopted). */
static struct adopted *adopted_add(uint64_t fh)
{
	struct adopted *e = calloc(1, sizeof(*e));

	if (e) {
		e->node.key = fh;
		if (wfs_map_insert(&adopted, &e->node) < 0) {
			free(e);
			e = NULL;
		}
	}
	return e;
}

/* adopted_lock held, or before the session starts: remove and free @e. */
static void adopted_drop(struct adopted *e)
{
	wfs_map_remove(&adopted, &e->node);
	free(e);
}

/*
 * Handles of dead servers whose open or create reply is not known to have reached the kernel
 * (SLOT_UNANSWERED), listed before the session starts. The kernel resends a request it got no
 * reply to, and that resend takes the handle over (wfs_takeover_claim()); once every resent
 * request has been answered, those left are settled (wfs_takeover_orphan_next()). Under
 * adopted_lock; unanswered_live: entries left, read without it.
 */
struct unanswered {
	uint64_t fh, ino, unique;
	bool replying; /* its reply was being written: the kernel may have the handle */
	bool claimed;  /* its resent request took it over */
};
static struct unanswered *unanswered;
static size_t nunanswered;
static atomic_size_t unanswered_live;
static atomic_bool orphans_due; /* the resend is over: settle what no resend claimed */

/* The memfd: the region, the catalog's redo log, then the area where versions keep their bytes
 * (keep.h). */
static size_t region_bytes(void)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);

	return (sizeof(struct region) + page - 1) / page * page;
}

static size_t memfd_bytes(void)
{
	return region_bytes() + REDO_BYTES + wfs_keep_area_bytes();
}
static uint64_t fh_tag = 1ull << FH_EPOCH_SHIFT; /* this server's epoch, in place */
static bool successor;
static int dev_fd = -1;
static struct wfs_map inh_by_id, inh_by_file; /* struct inherited, under R->lock */
static atomic_size_t ninh; /* their count: written under R->lock; read without it by the fast path */
static unsigned ids_used, handles_used; /* R->lock: the tables' entries (id_put(), handle_put()) */
static bool ids_full_told; /* R->lock */
atomic_bool wfs_takeover_watching;
static enum { REPLAY_NONE, REPLAY_WAITING, REPLAY_SWALLOWED, REPLAY_DIFFERS } replay;

int wfs_takeover_create(pid_t holder_pid)
{
	int fd = memfd_create("weightfs-takeover", MFD_CLOEXEC);
	void *p;

	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)memfd_bytes()) < 0) {
		int err = -errno;

		close(fd);
		return err;
	}
	p = mmap(NULL, memfd_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
	if (p == MAP_FAILED) {
		int err = -errno;

		close(fd);
		return err;
	}
	R = p;
	wfs_keep_attach((char *)p + region_bytes() + REDO_BYTES, true);
	region_fd = fd; /* kept for a server started from another binary (an upgrade) */
	R->magic = REGION_MAGIC;
	R->layout = REGION_LAYOUT;
	atomic_store(&R->holder_pid, holder_pid);
	return 0;
}

bool wfs_takeover_on(void)
{
	return R != NULL;
}

void *wfs_takeover_redo_area(size_t *bytes)
{
	*bytes = R ? REDO_BYTES : 0;
	return R ? (char *)R + region_bytes() : NULL;
}

int wfs_takeover_region_fd(void)
{
	return region_fd;
}

int wfs_takeover_attach(int fd)
{
	struct region *p;
	struct stat st;

	if (fstat(fd, &st) < 0)
		return -errno;
	if (st.st_size != (off_t)memfd_bytes()) {
		wfs_log(WFS_LOG_ERR, "takeover: the holder's shared region has %lld bytes, this build's %zu: "
			"another layout, this build cannot take the mount over", (long long)st.st_size,
			memfd_bytes());
		return -EPROTO;
	}
	p = mmap(NULL, memfd_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
	if (p == MAP_FAILED)
		return -errno;
	if (p->magic != REGION_MAGIC || p->layout != REGION_LAYOUT) {
		wfs_log(WFS_LOG_ERR, "takeover: the holder's shared region has magic 0x%x layout %u, this build "
			"expects 0x%x layout %u: it cannot take the mount over", p->magic, p->layout, REGION_MAGIC,
			REGION_LAYOUT);
		munmap(p, memfd_bytes());
		return -EPROTO;
	}
	fcntl(fd, F_SETFD, FD_CLOEXEC);
	R = p;
	wfs_keep_attach((char *)p + region_bytes() + REDO_BYTES, false);
	region_fd = fd;
	return 0;
}

bool wfs_takeover_server_died(uint64_t died_ns)
{
	if (!R)
		return false;
	atomic_store(&R->died_ns, died_ns);
	atomic_store(&R->server_pid, 0);
	atomic_store(&R->serving_pid, 0);
	return atomic_load(&R->init_state) == 2;
}

static unsigned home(uint64_t key, unsigned cap)
{
	return (unsigned)((key * 0x9E3779B97F4A7C15ull) >> 40) & (cap - 1);
}

/* Linear probing; removal shifts back the entries after the hole (no tombstones). R->lock held. */
static bool handle_put(const struct handle_slot *hs)
{
	unsigned i = home(hs->fh, HANDLES_CAP);

	/* At most 3/4 full: every probe (handle_find(), handle_take()) meets an empty slot and ends. */
	for (unsigned n = 0; n < HANDLES_CAP; n++, i = (i + 1) & (HANDLES_CAP - 1)) {
		if (R->handles[i].fh == 0 && handles_used >= HANDLES_CAP / 4 * 3)
			return false;
		if (R->handles[i].fh == hs->fh || R->handles[i].fh == 0) {
			handles_used += R->handles[i].fh == 0;
			/* Everything before the fh: a server killed in between left no entry. */
			R->handles[i].id = hs->id;
			R->handles[i].flags = hs->flags;
			R->handles[i].ino = hs->ino;
			R->handles[i].unique = hs->unique;
			R->handles[i].fh = hs->fh;
			return true;
		}
	}
	return false;
}

static int handle_take(uint64_t fh)
{
	unsigned i = home(fh, HANDLES_CAP), j;
	int id;

	while (R->handles[i].fh != fh) {
		if (R->handles[i].fh == 0)
			return 0;
		i = (i + 1) & (HANDLES_CAP - 1);
	}
	id = R->handles[i].id;
	R->handles[i].fh = 0;
	handles_used--;
	for (j = (i + 1) & (HANDLES_CAP - 1); R->handles[j].fh; j = (j + 1) & (HANDLES_CAP - 1)) {
		unsigned k = home(R->handles[j].fh, HANDLES_CAP);

		/* Move it back into the hole unless its home lies cyclically in (i, j]. */
		if ((j > i && (k <= i || k > j)) || (j < i && k <= i && k > j)) {
			R->handles[i] = R->handles[j];
			R->handles[j].fh = 0;
			i = j;
		}
	}
	return id;
}

/* R->lock held: the slot of @fh, or NULL. */
static struct handle_slot *handle_find(uint64_t fh)
{
	for (unsigned i = home(fh, HANDLES_CAP); R->handles[i].fh; i = (i + 1) & (HANDLES_CAP - 1))
		if (R->handles[i].fh == fh)
			return &R->handles[i];
	return NULL;
}

/* R->lock held. Fills at most 3/4 of the table (as handle_put()), so that every probe, id_drop()'s
 * included, meets an empty slot and ends. False when full: a successor will not know @id. */
static bool id_put(int32_t id, uint64_t dev, uint64_t ino)
{
	unsigned i = home((uint64_t)id, IDS_CAP);

	if (ids_used >= IDS_CAP / 4 * 3)
		return false;
	for (unsigned n = 0; n < IDS_CAP; n++, i = (i + 1) & (IDS_CAP - 1)) {
		if (R->ids[i].id == id || R->ids[i].id == 0) {
			ids_used += R->ids[i].id == 0;
			R->ids[i].dev = dev;
			R->ids[i].ino = ino;
			R->ids[i].id = id;
			return true;
		}
	}
	return false;
}

static void id_drop(int32_t id)
{
	unsigned i = home((uint64_t)id, IDS_CAP), j;

	while (R->ids[i].id != id) {
		if (R->ids[i].id == 0)
			return;
		i = (i + 1) & (IDS_CAP - 1);
	}
	R->ids[i].id = 0;
	ids_used--;
	for (j = (i + 1) & (IDS_CAP - 1); R->ids[j].id; j = (j + 1) & (IDS_CAP - 1)) {
		unsigned k = home((uint64_t)R->ids[j].id, IDS_CAP);

		if ((j > i && (k <= i || k > j)) || (j < i && k <= i && k > j)) {
			R->ids[i] = R->ids[j];
			R->ids[j].id = 0;
			i = j;
		}
	}
}

static void backing_release(int id)
{
	uint32_t backing_id = (uint32_t)id;

	if (dev_fd >= 0 && ioctl(dev_fd, DEV_IOC_BACKING_CLOSE, &backing_id) < 0)
		wfs_log(WFS_LOG_WARN, "passthrough backing id %d (a dead server's): cannot release: %s", id,
			strerror(errno));
}

#define INHERITED_OF(node, member) \
	((struct inherited *)(void *)((char *)(node) - offsetof(struct inherited, member)))

static uint64_t file_key(uint64_t dev, uint64_t ino)
{
	return ino ^ (dev * 0x9E3779B97F4A7C15ull);
}

/* R->lock held: the inherited entry of @id, or NULL. */
static struct inherited *inherited_find(int32_t id)
{
	struct wfs_map_node *n = wfs_map_first(&inh_by_id, (uint64_t)id);

	return n ? INHERITED_OF(n, by_id) : NULL;
}

/* R->lock held: the inherited entry of the file @dev:@ino, or NULL. */
static struct inherited *inherited_of_file(uint64_t dev, uint64_t ino)
{
	uint64_t key = file_key(dev, ino);

	for (struct wfs_map_node *n = wfs_map_first(&inh_by_file, key); n; n = wfs_map_next(n, key)) {
		struct inherited *x = INHERITED_OF(n, by_file);

		if (x->dev == dev && x->ino == ino)
			return x;
	}
	return NULL;
}

/* R->lock held (or before any thread starts): add @x to both maps. 0 or -ENOMEM. */
static int inherited_add(struct inherited *x)
{
	x->by_id.key = (uint64_t)x->id;
	x->by_file.key = file_key(x->dev, x->ino);
	if (wfs_map_insert(&inh_by_id, &x->by_id) < 0)
		return -ENOMEM;
	if (wfs_map_insert(&inh_by_file, &x->by_file) < 0) {
		wfs_map_remove(&inh_by_id, &x->by_id);
		return -ENOMEM;
	}
	atomic_store(&ninh, inh_by_id.count);
	return 0;
}

/* R->lock held: forget @x (its id is the caller's to release) and free it. */
static void inherited_forget(struct inherited *x)
{
	id_drop(x->id);
	wfs_map_remove(&inh_by_id, &x->by_id);
	wfs_map_remove(&inh_by_file, &x->by_file);
	atomic_store(&ninh, inh_by_id.count);
	free(x);
}

/*
 * Successor: rebuild both tables from what the dead server left (entries may be duplicated or
 * out of place if it died during an update) and list the ids it registered, with the handles of
 * dead servers that use each. Ids no handle uses are released at once. Before any thread starts.
 */
static void inherit(void)
{
	struct handle_slot *hs = malloc(sizeof(R->handles));
	struct id_slot *is = malloc(sizeof(R->ids));
	size_t nh = 0, ni = 0, unused = 0, lost = 0;
	bool dropped = atomic_load(&R->handles_dropped) > 0;

	ids_used = handles_used = 0;
	if (!hs || !is) {
		free(hs);
		free(is);
		wfs_log(WFS_LOG_WARN, "takeover: no memory to inherit the dead server's backing ids: they stay "
			"registered until unmount");
		memset(R->handles, 0, sizeof(R->handles));
		memset(R->ids, 0, sizeof(R->ids));
		return;
	}
	for (unsigned i = 0; i < HANDLES_CAP; i++)
		if (R->handles[i].fh)
			hs[nh++] = R->handles[i];
	for (unsigned i = 0; i < IDS_CAP; i++)
		if (R->ids[i].id > 0)
			is[ni++] = R->ids[i];
	memset(R->handles, 0, sizeof(R->handles));
	memset(R->ids, 0, sizeof(R->ids));
	for (size_t i = 0; i < nh; i++)
		handle_put(&hs[i]); /* a duplicate fh overwrites itself */
	for (size_t i = 0; i < ni; i++) {
		struct inherited *x;

		if (inherited_find(is[i].id))
			continue; /* a duplicate */
		x = calloc(1, sizeof(*x));
		if (x)
			*x = (struct inherited){.id = is[i].id, .dev = is[i].dev, .ino = is[i].ino};
		if (!x || inherited_add(x) < 0) {
			free(x);
			lost++;
			continue;
		}
		id_put(x->id, x->dev, x->ino);
	}
	for (unsigned k = 0; k < HANDLES_CAP; k++) { /* each id's users among the dead servers' handles */
		struct inherited *x = R->handles[k].fh && R->handles[k].id > 0 ? inherited_find(R->handles[k].id)
									       : NULL;

		if (x)
			x->stale++;
	}
	for (size_t i = 0; i < ni; i++) {
		struct inherited *x = inherited_find(is[i].id);

		/* An adopted writer (wfs_takeover_adopt()) that registers this file again counts as a
		 * user. With handle entries left out, an id may be used by one of those: kept. */
		if (x && x->stale == 0 && !dropped) {
			backing_release(x->id); /* no open file of the kernel uses it: safe to let go */
			inherited_forget(x);
			unused++;
		}
	}
	if (lost)
		wfs_log(WFS_LOG_WARN, "takeover: no memory to inherit %zu backing ids: they stay registered "
			"until unmount", lost);
	wfs_log(WFS_LOG_INFO, "takeover: inherited %zu passthrough backing ids still used by %zu open "
		"files, released %zu unused ones", (size_t)ninh, nh, unused);
	free(hs);
	free(is);
}

void wfs_takeover_server_start(int devfd)
{
	uint32_t epoch;

	dev_fd = devfd;
	if (!R)
		return;
	epoch = atomic_fetch_add(&R->epoch, 1) + 1;
	fh_tag = (uint64_t)(epoch % 0xffffu + 1) << FH_EPOCH_SHIFT; /* never 0, consecutive ones differ */
	atomic_store(&R->server_pid, (int32_t)getpid());
	pthread_mutex_init(&R->lock, NULL);
	successor = epoch > 1;
	if (successor) {
		atomic_fetch_add(&R->takeovers, 1);
		inherit();
	} else {
		atomic_store(&wfs_takeover_watching, true); /* save the INIT and its reply */
	}
}

int wfs_takeover_check_store(const char *catalog_path)
{
	struct stat st;

	if (!R)
		return 0;
	if (stat(catalog_path, &st) < 0) {
		int err = errno;

		wfs_log(WFS_LOG_ERR, "takeover: %s: %s", catalog_path, strerror(err));
		return err == ENOENT ? -ESTALE : -err;
	}
	if (!successor) {
		R->catalog_dev = (uint64_t)st.st_dev;
		R->catalog_ino = (uint64_t)st.st_ino;
		return 0;
	}
	if (R->catalog_dev == (uint64_t)st.st_dev && R->catalog_ino == (uint64_t)st.st_ino)
		return 0;
	wfs_log(WFS_LOG_ERR, "takeover: %s is not the catalog this mount was served from (device %llu inode "
		"%llu then, %llu %llu now): the kernel's node ids would name another store's files",
		catalog_path, (unsigned long long)R->catalog_dev, (unsigned long long)R->catalog_ino,
		(unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
	return -ESTALE;
}

bool wfs_takeover_successor(void)
{
	return successor;
}

bool wfs_takeover_init_answered(void)
{
	return R && atomic_load(&R->init_state) == 2;
}

uint64_t wfs_takeover_fh(const void *h, bool writable)
{
	return ((uint64_t)(uintptr_t)h & FH_PTR_MASK) | fh_tag | (writable ? 1u : 0u);
}

void *wfs_takeover_fh_handle(uint64_t fh)
{
	if ((fh & ~FH_PTR_MASK) != fh_tag || fh == 0) {
		struct adopted *e;
		void *h = NULL;

		if (atomic_load_explicit(&adopted_live, memory_order_acquire) == 0)
			return NULL;
		pthread_mutex_lock(&adopted_lock);
		e = adopted_find(fh);
		if (e)
			h = e->h;
		pthread_mutex_unlock(&adopted_lock);
		return h;
	}
	return (void *)(uintptr_t)(fh & FH_PTR_MASK & ~(uint64_t)1);
}

bool wfs_takeover_fh_writable(uint64_t fh)
{
	return fh & 1;
}

void wfs_takeover_note_read(const void *buf, size_t n)
{
	const struct fuse_in_header *in = buf;

	if (!R || n < sizeof(*in) || in->opcode != FUSE_INIT || replay != REPLAY_NONE)
		return;
	if (n > INIT_MAX) {
		wfs_log(WFS_LOG_WARN, "takeover: an INIT of %zu bytes cannot be kept: no successor can take "
			"this mount over", n);
		atomic_store(&wfs_takeover_watching, false);
		return;
	}
	memcpy(R->init_in, buf, n);
	R->init_in_len = (uint32_t)n;
	R->init_unique = in->unique;
	atomic_store(&R->init_state, 1);
}

bool wfs_takeover_note_write(const struct iovec *iov, int count, ssize_t *len)
{
	const struct fuse_out_header *out = iov[0].iov_base;
	unsigned char bytes[INIT_MAX];
	size_t n = 0;
	bool fits = true;

	if (!R || count < 1 || iov[0].iov_len < sizeof(*out) || atomic_load(&R->init_state) == 0 ||
	    out->unique != R->init_unique)
		return false;
	for (int i = 0; i < count; i++) {
		if (n + iov[i].iov_len > sizeof(bytes)) {
			fits = false;
			break;
		}
		memcpy(bytes + n, iov[i].iov_base, iov[i].iov_len);
		n += iov[i].iov_len;
	}
	if (replay == REPLAY_WAITING) {
		replay = fits && n == R->init_out_len && memcmp(bytes, R->init_out, n) == 0 ? REPLAY_SWALLOWED
											   : REPLAY_DIFFERS;
		*len = (ssize_t)n;
		atomic_store(&wfs_takeover_watching, false);
		return true;
	}
	if (fits && atomic_load(&R->init_state) == 1) {
		memcpy(R->init_out, bytes, n);
		R->init_out_len = (uint32_t)n;
		atomic_store(&R->init_state, 2); /* before the kernel has it: a successor can take over */
	}
	atomic_store(&wfs_takeover_watching, false);
	return false;
}

/* "flags 0x..., max_write N, ..." of an INIT reply, for the log. */
static void describe_init_out(const unsigned char *b, size_t n, char *s, size_t size)
{
	const struct fuse_init_out *o = (const void *)(b + sizeof(struct fuse_out_header));

	if (n < sizeof(struct fuse_out_header) + 24) {
		snprintf(s, size, "%zu bytes", n);
		return;
	}
	snprintf(s, size, "%zu bytes, error %d, %u.%u, flags 0x%x flags2 0x%x, max_write %u, max_pages %u",
		 n, ((const struct fuse_out_header *)(const void *)b)->error, o->major, o->minor, o->flags,
		 n >= sizeof(struct fuse_out_header) + sizeof(*o) ? o->flags2 : 0, o->max_write,
		 n >= sizeof(struct fuse_out_header) + sizeof(*o) ? (unsigned)o->max_pages : 0u);
}

int wfs_takeover_replay(struct fuse_session *se)
{
	const struct fuse_in_header *in;
	const struct fuse_init_in *arg;
	unsigned char copy[INIT_MAX];
	struct fuse_out_header resend = {.len = sizeof(resend), .error = NOTIFY_RESEND, .unique = 0};
	struct fuse_buf buf = {0};
	uint64_t flags = 0;
	uint64_t pause;

	if (!R || atomic_load(&R->init_state) != 2)
		return -ENODATA;
	memcpy(copy, R->init_in, R->init_in_len);
	in = (const void *)copy;
	arg = (const void *)(copy + sizeof(*in));
	if (R->init_in_len >= sizeof(*in) + offsetof(struct fuse_init_in, flags2) + sizeof(arg->flags2))
		flags = arg->flags | ((arg->flags & FUSE_INIT_EXT) ? (uint64_t)arg->flags2 << 32 : 0);
	buf.size = R->init_in_len;
	buf.mem = copy;
	buf.fd = -1;
	replay = REPLAY_WAITING;
	atomic_store(&wfs_takeover_watching, true);
	fuse_session_process_buf(se, &buf);
	atomic_store(&wfs_takeover_watching, false);
	if (replay != REPLAY_SWALLOWED) {
		char was[160], now[160];

		describe_init_out(R->init_out, R->init_out_len, was, sizeof(was));
		snprintf(now, sizeof(now), "%s", replay == REPLAY_DIFFERS ? "a different reply" : "no reply");
		wfs_log(WFS_LOG_ERR, "takeover refused: the kernel set this connection up with the INIT reply "
			"(%s), and this server would answer with %s (another build, or other options): it "
			"cannot serve the connection as the kernel knows it", was, now);
		return -EPROTO;
	}
	if (!(flags & FUSE_HAS_RESEND)) {
		wfs_log(WFS_LOG_WARN, "takeover: this kernel cannot resend requests (FUSE_NOTIFY_RESEND needs "
			"Linux 6.9): callers whose requests the dead server had read wait until they are killed; "
			"every other request is served");
	} else if (write(fuse_session_fd(se), &resend, sizeof(resend)) != (ssize_t)sizeof(resend)) {
		wfs_log(WFS_LOG_WARN, "takeover: FUSE_NOTIFY_RESEND failed (%s): callers whose requests the dead "
			"server had read wait until they are killed", strerror(errno));
	}
	pause = atomic_load(&R->died_ns) ? wfs_clock_ns() - atomic_load(&R->died_ns) : 0;
	atomic_store(&R->last_pause_ns, pause);
	if (pause > atomic_load(&R->worst_pause_ns))
		atomic_store(&R->worst_pause_ns, pause);
	/* The holder waits for this to call an upgrade done (upgrade.h); a death's successor says it too. */
	atomic_store(&R->serving_ns, wfs_clock_ns());
	atomic_store(&R->serving_pid, (int32_t)getpid());
	if (atomic_load(&R->holder_pid) > 0)
		kill(atomic_load(&R->holder_pid), SIGUSR2);
	return 0;
}

/* Is @flag (of fuse_init_out.flags) in the saved INIT reply? True when none is saved: the first server. */
static bool init_reply_has(uint32_t flag)
{
	const struct fuse_init_out *o;

	if (!R || atomic_load(&R->init_state) != 2 ||
	    R->init_out_len < sizeof(struct fuse_out_header) + offsetof(struct fuse_init_out, flags) + sizeof(o->flags))
		return true;
	o = (const void *)(R->init_out + sizeof(struct fuse_out_header));
	return (o->flags & flag) != 0;
}

bool wfs_takeover_locks_granted(bool flock)
{
	return init_reply_has(flock ? FUSE_FLOCK_LOCKS : FUSE_POSIX_LOCKS);
}

bool wfs_takeover_killpriv_granted(void)
{
	return init_reply_has(FUSE_HANDLE_KILLPRIV_V2);
}

void wfs_takeover_told_ino(uint64_t ino)
{
	uint64_t seen;

	if (!R)
		return;
	seen = atomic_load_explicit(&R->ino_told, memory_order_relaxed);
	while (ino > seen && !atomic_compare_exchange_weak(&R->ino_told, &seen, ino))
		;
}

uint64_t wfs_takeover_ino_floor(void)
{
	return R ? atomic_load(&R->ino_told) : 0;
}

int wfs_takeover_backing_inherited(int fd)
{
	struct inherited *x;
	struct stat st;
	int id = 0;

	if (!R || ninh == 0 || fstat(fd, &st) < 0)
		return 0;
	pthread_mutex_lock(&R->lock);
	x = inherited_of_file((uint64_t)st.st_dev, (uint64_t)st.st_ino);
	if (x) {
		x->users++;
		id = x->id;
	}
	pthread_mutex_unlock(&R->lock);
	return id;
}

void wfs_takeover_backing_opened(int id, int fd)
{
	struct stat st;

	if (!R || fstat(fd, &st) < 0)
		return;
	pthread_mutex_lock(&R->lock);
	if (!id_put(id, (uint64_t)st.st_dev, (uint64_t)st.st_ino) && !ids_full_told) {
		ids_full_told = true;
		wfs_log(WFS_LOG_WARN, "takeover: more than %u files open through passthrough: a successor "
			"will not know the backing ids of the others (they stay registered until unmount)",
			IDS_CAP / 4 * 3);
	}
	pthread_mutex_unlock(&R->lock);
}

/* R->lock held: forget inherited entry @x, and release its id, when nothing uses it. */
static void inherited_settle(struct inherited *x)
{
	if (x->stale || x->users)
		return;
	backing_release(x->id);
	inherited_forget(x);
}

bool wfs_takeover_backing_keep(int id)
{
	struct inherited *x;

	if (!R)
		return false;
	pthread_mutex_lock(&R->lock);
	x = inherited_find(id);
	if (x) {
		bool keep;

		if (x->users)
			x->users--;
		keep = x->stale > 0 || x->users > 0;
		if (!keep)
			inherited_forget(x); /* the caller releases it */
		pthread_mutex_unlock(&R->lock);
		return keep;
	}
	id_drop(id);
	pthread_mutex_unlock(&R->lock);
	return false;
}

void wfs_takeover_handle_opened(uint64_t fh, int id, uint64_t ino, uint64_t unique, bool append)
{
	struct handle_slot hs = {.fh = fh, .id = id > 0 ? id : 0, .ino = ino, .unique = unique,
				 .flags = SLOT_UNANSWERED | (append ? SLOT_APPEND : 0) |
					  (id > 0 ? SLOT_PASSTHROUGH : 0)};

	if (!R)
		return;
	pthread_mutex_lock(&R->lock);
	if (!handle_put(&hs) && atomic_fetch_add(&R->handles_dropped, 1) == 0)
		wfs_log(WFS_LOG_WARN, "takeover: more than %u files open: a successor may keep backing ids "
			"registered until unmount, and refuse opens of the files it did not see open (EIO)",
			HANDLES_CAP / 4 * 3);
	pthread_mutex_unlock(&R->lock);
}

/* Set @set and clear @clear in the flags of @fh's slot, if it has one. */
static void handle_flags(uint64_t fh, uint32_t set, uint32_t clear)
{
	struct handle_slot *hs;

	pthread_mutex_lock(&R->lock);
	hs = handle_find(fh);
	if (hs)
		hs->flags = (hs->flags | set) & ~clear;
	pthread_mutex_unlock(&R->lock);
}

void wfs_takeover_handle_replying(uint64_t fh)
{
	if (R)
		handle_flags(fh, SLOT_REPLYING, 0);
}

void wfs_takeover_handle_flushed(uint64_t fh, const struct wfs_adopted_writer *w)
{
	if (R && (fh & 1))
		handle_flags(fh, (w->closed ? SLOT_CLOSED : 0) | (w->finished ? SLOT_FINISHED : 0) |
				 (w->ended ? SLOT_ENDED : 0), 0);
}

void wfs_takeover_handle_answered(uint64_t fh)
{
	if (R)
		handle_flags(fh, 0, SLOT_UNANSWERED | SLOT_REPLYING);
}

void wfs_takeover_handle_released(uint64_t fh)
{
	int id;

	if (!R)
		return;
	pthread_mutex_lock(&R->lock);
	if (fh & 1) {
		/* A writer's entry stays until its release is done (wfs_takeover_release_done()): a
		 * server killed in between leaves it, with its version, to the successor. */
		unsigned i = home(fh, HANDLES_CAP);

		for (id = 0; R->handles[i].fh; i = (i + 1) & (HANDLES_CAP - 1))
			if (R->handles[i].fh == fh) {
				id = R->handles[i].id;
				R->handles[i].id = 0;
				break;
			}
	} else {
		id = handle_take(fh);
	}
	if (id > 0 && (fh & ~FH_PTR_MASK) != fh_tag) {
		struct inherited *x = inherited_find(id);

		if (x) {
			if (x->stale)
				x->stale--;
			inherited_settle(x);
		}
	}
	pthread_mutex_unlock(&R->lock);
}

void wfs_takeover_note_upgrade(void)
{
	if (!R)
		return;
	atomic_store(&R->writers_closed, 0);
	atomic_store(&R->writers_adopted, WFS_TAKEOVER_UNTOLD);
	atomic_store(&R->writers_lost, 0);
}

void wfs_takeover_note_drain(uint64_t gate_ns, uint32_t writers_closed, uint32_t writers_open)
{
	if (!R)
		return;
	atomic_store(&R->writers_closed, writers_closed);
	atomic_store(&R->writers_lost, writers_open); /* until a successor adopts them */
	atomic_store(&R->gate_ns, gate_ns);
	atomic_fetch_add(&R->upgrades, 1);
}

void wfs_takeover_serving(struct wfs_takeover_serving *out)
{
	*out = (struct wfs_takeover_serving){0};
	if (!R)
		return;
	out->pid = atomic_load(&R->serving_pid);
	out->since_ns = atomic_load(&R->serving_ns);
	out->gate_ns = atomic_load(&R->gate_ns);
	out->writers_closed = atomic_load(&R->writers_closed);
	out->writers_adopted = atomic_load(&R->writers_adopted);
	out->writers_lost = atomic_load(&R->writers_lost);
}

/* The holder @holder of @mnt is dead: say so once, and name it no more. */
static void holder_gone(pid_t holder, const char *mnt)
{
	int32_t was = (int32_t)holder;

	if (!atomic_compare_exchange_strong(&R->holder_pid, &was, 0))
		return;
	atomic_store(&holder_lost, (int32_t)holder);
	wfs_log(WFS_LOG_ERR, "holder pid %d of %s died (kill -9, the OOM killer or a crash: the kernel log says "
		"which); server pid %d serves on without one: a crash of it now leaves the mount dead (ENOTCONN "
		"until fusermount3 -u %s) and weightfsctl upgrade cannot reach it; unmount and mount again for a "
		"holder", (int)holder, mnt, (int)getpid(), mnt);
}

struct holder_watch {
	pid_t holder;
	int pidfd;
	char mnt[PATH_MAX]; /* a copy: main frees its string at exit, which the holder's may meet */
};

static void *holder_watch_main(void *arg)
{
	struct holder_watch *w = arg;
	struct pollfd p = {.fd = w->pidfd, .events = POLLIN};

	while (poll(&p, 1, -1) < 0 && errno == EINTR)
		;
	close(w->pidfd);
	holder_gone(w->holder, w->mnt);
	free(w);
	return NULL;
}

int wfs_takeover_watch_holder(const char *mountpoint)
{
	pid_t holder = R ? atomic_load(&R->holder_pid) : 0;
	struct holder_watch *w;
	pthread_t t;
	int fd, ret;

	if (holder <= 0)
		return 0;
	fd = (int)syscall(SYS_pidfd_open, holder, 0);
	/* The holder is this server's parent: a parent that is not it any more died already (and
	 * a pidfd opened before that check is of the holder, whose pid cannot be reused meanwhile). */
	if ((fd < 0 && errno == ESRCH) || getppid() != holder) {
		if (fd >= 0)
			close(fd);
		holder_gone(holder, mountpoint);
		return 0;
	}
	if (fd < 0)
		return -errno;
	w = malloc(sizeof(*w));
	if (!w) {
		close(fd);
		return -ENOMEM;
	}
	*w = (struct holder_watch){.holder = holder, .pidfd = fd};
	snprintf(w->mnt, sizeof(w->mnt), "%s", mountpoint);
	ret = pthread_create(&t, NULL, holder_watch_main, w);
	if (ret) {
		close(fd);
		free(w);
		return -ret;
	}
	pthread_detach(t);
	return 0;
}

struct wfs_counters *wfs_takeover_counters(void)
{
	return R ? &R->counters.c : NULL;
}

struct wfs_ops_tally *wfs_takeover_request_tallies(void)
{
	return R ? R->requests : NULL;
}

void wfs_takeover_info(struct wfs_takeover_info *out)
{
	*out = (struct wfs_takeover_info){.server_pid = getpid(), .epoch = 1};
	if (!R)
		return;
	out->holder_pid = atomic_load(&R->holder_pid);
	out->holder_lost_pid = atomic_load(&holder_lost);
	out->takeovers = atomic_load(&R->takeovers);
	out->epoch = atomic_load(&R->epoch);
	out->last_pause_ms = (double)atomic_load(&R->last_pause_ns) / 1e6;
	out->worst_pause_ms = (double)atomic_load(&R->worst_pause_ns) / 1e6;
	out->upgrades = atomic_load(&R->upgrades);
	pthread_mutex_lock(&R->lock);
	out->backing_inherited = ninh;
	pthread_mutex_unlock(&R->lock);
}

uint64_t wfs_takeover_handle_unique(uint64_t fh)
{
	struct handle_slot *hs;
	uint64_t unique = 0;

	if (!R || !(fh & 1))
		return 0;
	pthread_mutex_lock(&R->lock);
	hs = handle_find(fh);
	if (hs)
		unique = hs->unique;
	pthread_mutex_unlock(&R->lock);
	return unique;
}

void wfs_takeover_release_done(uint64_t fh, uint64_t unique)
{
	struct handle_slot *hs;
	struct adopted *e;
	uint64_t other = 0;

	if (!R)
		return;
	if (fh & 1) {
		pthread_mutex_lock(&R->lock);
		/* The handle was freed before this: a new one at the same address (the same fh) may
		 * have recorded its own slot meanwhile, which must stay (its open's request is another). */
		hs = handle_find(fh);
		if (hs && hs->unique == unique)
			handle_take(fh);
		else if (hs)
			other = hs->unique;
		pthread_mutex_unlock(&R->lock);
	}
	if (other) /* rare; tests/takeover/run-handles looks for it (WFS_DELAY release.freed) */
		wfs_log(WFS_LOG_DEBUG, "takeover: fh %#llx released (open %llu) after open %llu got the same "
			"fh: that writer's slot stays", (unsigned long long)fh, (unsigned long long)unique,
			(unsigned long long)other);
	if (atomic_load_explicit(&adopted_live, memory_order_acquire) == 0)
		return;
	pthread_mutex_lock(&adopted_lock);
	e = adopted_find(fh);
	if (e) {
		adopted_drop(e);
		atomic_store(&adopted_live, adopted.count);
	}
	pthread_mutex_unlock(&adopted_lock);
}

/* The inodes of live version records (keep.h), for wfs_catalog_takeover(). */
struct kept_list {
	uint64_t *ino;
	size_t n;
};

static void list_kept(const struct wfs_keep_record *r, void *arg)
{
	struct kept_list *l = arg;

	if (r->state == WFS_KEEP_LIVE && l->ino)
		l->ino[l->n++] = r->ino;
}

size_t wfs_takeover_kept_inodes(uint64_t **ino)
{
	struct kept_list l = {.ino = calloc(WFS_KEEP_RECORDS, sizeof(uint64_t))};

	wfs_keep_each(list_kept, &l);
	*ino = l.ino;
	return l.n;
}

/* wfs_takeover_adopt(): what it found, and the inodes whose writers get EIO. */
struct adoption {
	struct wfs_fs *fs;
	uint64_t lost[WFS_KEEP_RECORDS];
	size_t nlost;
	char (*names)[32]; /* tmp files adopted: the sweep keeps them */
	size_t nnames;
	uint64_t vino[WFS_KEEP_RECORDS]; /* inodes whose versions were adopted */
	size_t nvino;
	uint64_t versions, versions_lost;
};

static void adopt_version(const struct wfs_keep_record *r, void *arg)
{
	struct adoption *a = arg;
	int ret = r->state == WFS_KEEP_LIVE ? wfs_openmode_adopt_version(a->fs, r) : 0;

	if (r->state == WFS_KEEP_LIVE && ret == 0) {
		a->versions++;
		a->vino[a->nvino++] = r->ino;
		if (!r->in_memory)
			memcpy(a->names[a->nnames++], r->tmp_name, sizeof(a->names[0]));
		return;
	}
	/* FILLING: a copy of the sealed bytes the dead server had not finished; the request that
	 * started it comes again and starts it again. Anything else: the bytes are not all there. */
	if (r->state != WFS_KEEP_FILLING && ret != -ENOENT) {
		a->lost[a->nlost++] = r->ino;
		a->versions_lost++;
		wfs_log(WFS_LOG_ERR, "takeover: inode %llu: the version being written cannot be adopted (%s): "
			"its writers get EIO, its name keeps what it held", (unsigned long long)r->ino,
			r->state == WFS_KEEP_LOST ? "a write had failed, or a full store kept only its digest"
						  : strerror(-ret));
	}
	wfs_keep_end((int)r->index);
}

static bool adopted_name(const char *name, void *arg)
{
	const struct adoption *a = arg;

	for (size_t i = 0; i < a->nnames; i++)
		if (strcmp(a->names[i], name) == 0)
			return true;
	return false;
}

static bool dead_unanswered(const struct handle_slot *hs)
{
	return hs->fh && (hs->fh & ~FH_PTR_MASK) != fh_tag && (hs->flags & SLOT_UNANSWERED);
}

/*
 * Successor, before the session starts: list the dead servers' handles whose reply is not known to
 * have reached the kernel (struct unanswered).
 */
static void list_unanswered(void)
{
	size_t n = 0;

	for (unsigned i = 0; i < HANDLES_CAP; i++)
		n += dead_unanswered(&R->handles[i]);
	if (n == 0)
		return;
	unanswered = calloc(n, sizeof(*unanswered));
	if (!unanswered) {
		wfs_log(WFS_LOG_WARN, "takeover: no memory to list %zu handles the dead server had not answered: "
			"they stay open until unmount", n);
		return;
	}
	for (unsigned i = 0; i < HANDLES_CAP; i++) {
		const struct handle_slot *hs = &R->handles[i];

		if (dead_unanswered(hs))
			unanswered[nunanswered++] = (struct unanswered){
				.fh = hs->fh, .ino = hs->ino, .unique = hs->unique,
				.replying = hs->flags & SLOT_REPLYING};
	}
	atomic_store(&unanswered_live, nunanswered);
}

void *wfs_takeover_claim(uint64_t unique, uint64_t ino, uint64_t *fh)
{
	struct adopted *e;
	void *h = NULL;

	if (atomic_load_explicit(&unanswered_live, memory_order_acquire) == 0)
		return NULL;
	pthread_mutex_lock(&adopted_lock);
	for (size_t i = 0; i < nunanswered; i++) {
		struct unanswered *u = &unanswered[i];

		if (u->claimed || u->unique != unique || u->ino != ino || !(u->fh & 1))
			continue;
		e = adopted_find(u->fh);
		h = e ? e->h : NULL;
		if (h) { /* one not adopted (its writer gets EIO) is no answer: a later server's may be */
			u->claimed = true;
			*fh = u->fh;
			break;
		}
	}
	pthread_mutex_unlock(&adopted_lock);
	return h;
}

void wfs_takeover_resend_over(void)
{
	if (atomic_load_explicit(&unanswered_live, memory_order_acquire))
		atomic_store(&orphans_due, true);
}

bool wfs_takeover_orphans_due(void)
{
	return atomic_load_explicit(&orphans_due, memory_order_relaxed) && atomic_exchange(&orphans_due, false);
}

bool wfs_takeover_orphan_next(uint64_t *fh, uint64_t *ino)
{
	bool found = false;

	pthread_mutex_lock(&adopted_lock);
	while (!found && nunanswered > 0) {
		struct unanswered u = unanswered[--nunanswered];

		if (u.claimed)
			continue;
		if (u.replying) {
			/* Perhaps written: the kernel's requests on it, and its release, may come. */
			handle_flags(u.fh, 0, SLOT_UNANSWERED | SLOT_REPLYING);
			wfs_log(WFS_LOG_INFO, "takeover: inode %llu: the dead server was writing the reply that "
				"gave the kernel a handle, and the request did not come again: the handle stays the "
				"kernel's", (unsigned long long)u.ino);
			continue;
		}
		*fh = u.fh;
		*ino = u.ino;
		found = true;
		wfs_log(WFS_LOG_INFO, "takeover: inode %llu: the dead server made a handle for an open it never "
			"answered, and the kernel did not send that open again (its caller was killed): "
			"released", (unsigned long long)u.ino);
	}
	atomic_store_explicit(&unanswered_live, nunanswered, memory_order_release);
	pthread_mutex_unlock(&adopted_lock);
	return found;
}

/* R->lock held: this server's inode took dead server id @id as its backing file (one user of it). */
static void inherited_use(int32_t id)
{
	struct inherited *x = inherited_find(id);

	if (x)
		x->users++;
}

/*
 * wfs_takeover_adopt(), fs->lock held, after the writers: the dead servers' read-only handles
 * (wfs_openmode_adopt_reader()). Returns how many were adopted; *@lost: how many were not (the
 * kernel still uses them: their reads are answered as a dead handle's, stale_read() in ops.c).
 */
static uint64_t adopt_readers(struct wfs_fs *fs, uint64_t *lost)
{
	uint64_t n = 0;

	*lost = 0;
	for (unsigned i = 0; i < HANDLES_CAP; i++) {
		struct handle_slot hs = R->handles[i];
		struct wfs_handle *h = NULL;
		struct adopted *e;
		int ret;

		if (!hs.fh || (hs.fh & 1) || (hs.fh & ~FH_PTR_MASK) == fh_tag)
			continue;
		e = adopted_add(hs.fh);
		ret = e ? wfs_openmode_adopt_reader(fs, hs.ino, hs.id, &h) : -ENOMEM;
		if (ret < 0) {
			if (e)
				adopted_drop(e);
			if (ret != -ENOENT) /* its name and inode went: no open can conflict with it */
				wfs_log(WFS_LOG_WARN, "takeover: inode %llu: a reader open before the takeover "
					"cannot be adopted (%s): opens of it may fail with EIO until it closes",
					(unsigned long long)hs.ino, strerror(-ret));
			(*lost)++;
			continue;
		}
		if (ret == 1) {
			pthread_mutex_lock(&R->lock);
			inherited_use(hs.id);
			pthread_mutex_unlock(&R->lock);
		}
		e->h = h;
		n++;
	}
	return n;
}

int wfs_takeover_adopt(struct wfs_fs *fs)
{
	uint64_t handles = 0, handles_lost = 0, sealed = 0, readers, readers_lost;
	bool overflowed = wfs_keep_overflows() > 0;
	struct adoption *a;
	struct wfs_inode *in;

	if (!R || !successor)
		return 0;
	a = calloc(1, sizeof(*a));
	if (a)
		a->names = calloc(WFS_KEEP_RECORDS, sizeof(*a->names));
	if (!a || !a->names) {
		if (a)
			free(a->names);
		free(a);
		wfs_log(WFS_LOG_ERR, "takeover: no memory to adopt the dead server's writers: they get EIO");
		atomic_store(&R->writers_adopted, 0); /* writers_lost: the drain's count, all of them */
		return -ENOMEM;
	}
	a->fs = fs;
	list_unanswered();
	wfs_lock(&fs->lock);
	wfs_keep_each(adopt_version, a);
	for (unsigned i = 0; i < HANDLES_CAP; i++) {
		struct handle_slot hs = R->handles[i];
		struct wfs_adopted_writer w;
		struct wfs_handle *h = NULL;
		struct adopted *e;
		bool lost = false;
		int ret;

		if (!hs.fh || !(hs.fh & 1) || (hs.fh & ~FH_PTR_MASK) == fh_tag)
			continue;
		for (size_t k = 0; k < a->nlost; k++)
			lost |= a->lost[k] == hs.ino;
		in = wfs_inode_find(fs, hs.ino);
		/* A passthrough writer whose release had begun (its id cleared): the kernel let go of it,
		 * and with no version left it has nothing to write; its RELEASE comes again. */
		if (hs.id == 0 && (hs.flags & SLOT_PASSTHROUGH) && !(in && in->writer))
			continue;
		/* With versions kept nowhere (every record was in use), one without a record may be
		 * this inode's: only a writer of a sealed file with no version is sure to be whole. */
		if (overflowed && !(in && in->writer))
			lost = true;
		w = (struct wfs_adopted_writer){
			.passthrough = hs.id > 0 || (hs.flags & SLOT_PASSTHROUGH),
			.append = hs.flags & SLOT_APPEND,
			.closed = hs.flags & SLOT_CLOSED,
			.finished = hs.flags & SLOT_FINISHED,
			.ended = hs.flags & SLOT_ENDED,
		};
		e = lost ? NULL : adopted_add(hs.fh);
		ret = lost ? -EIO : e ? wfs_openmode_adopt(fs, hs.ino, &w, &h) : -ENOMEM;
		if (ret) {
			if (e)
				adopted_drop(e);
			handles_lost++;
			wfs_log(WFS_LOG_ERR, "takeover: inode %llu: a writer open before the takeover cannot be "
				"adopted (%s): its next write, fsync or close gets EIO", (unsigned long long)hs.ino,
				strerror(-ret));
			continue;
		}
		e->h = h;
		wfs_upgrade_writer_opened(); /* this server's writer now: an upgrade waits for it too */
		handles++;
	}
	readers = adopt_readers(fs, &readers_lost);
	/* A version whose every writer was released (a seal the dead server had begun): sealed now. */
	for (size_t i = 0; i < a->nvino; i++) {
		in = wfs_inode_find(fs, a->vino[i]);
		if (in && in->writer && wfs_version_writers(in->writer) == 0 && in->io.nwritable == 0) {
			sealed += wfs_seal(fs, in, false) == 0;
			wfs_inode_maybe_free(fs, in);
		}
	}
	wfs_unlock(&fs->lock);
	atomic_store(&adopted_live, adopted.count);
	/* For the holder's report of an upgrade: its drain counted these writers as still open. */
	atomic_store(&R->writers_adopted,
		     handles >= WFS_TAKEOVER_UNTOLD ? WFS_TAKEOVER_UNTOLD - 1 : (uint32_t)handles);
	atomic_store(&R->writers_lost, handles_lost > UINT32_MAX ? UINT32_MAX : (uint32_t)handles_lost);
	wfs_store_tmp_sweep(fs->store, adopted_name, a);
	if (a->versions || handles || handles_lost || a->versions_lost || readers || readers_lost)
		wfs_log(WFS_LOG_INFO, "takeover: adopted %llu versions being written and %llu writers open on "
			"them (%llu sealed at once: their writers were gone), and %llu readers; %llu versions "
			"and %llu writers lost (EIO), %llu readers not adopted", (unsigned long long)a->versions,
			(unsigned long long)handles, (unsigned long long)sealed, (unsigned long long)readers,
			(unsigned long long)a->versions_lost, (unsigned long long)handles_lost,
			(unsigned long long)readers_lost);
	free(a->names);
	free(a);
	return 0;
}
