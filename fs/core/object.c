/* SPDX-License-Identifier: Apache-2.0 */
/* object.h: objects in use by open handles and seals. Every function runs with fs->lock held. */
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "commit.h"
#include "daemon.h"
#include "fault.h"
#include "gc.h"
#include "log.h"
#include "object.h"

struct wfs_object {
	struct wfs_map_node node; /* key: wfs_map_digest_key() */
	struct wfs_digest digest;
	unsigned pins;  /* (L) open handles using it + seals publishing it + checks and claims */
	int fd;         /* (L) O_RDONLY, for daemon-served reads; -1 until needed */
	int backing_id; /* (L) passthrough backing id, 0 when not registered */
	bool publishing; /* (L) a seal of this content is deciding whether it is stored, and linking it */
	bool deferred;   /* (L) on fs->objects_deferred: its last pin dropped while fs->lock was lent */
	struct wfs_object *next_deferred;
	uint64_t expected_by;           /* (L) inode whose claim of this content missed and whose
					 * writer is expected to write it (wfs_object_expect), or 0 */
	struct timespec expected_until; /* (L) CLOCK_REALTIME: claims wait no longer than this */
};

static atomic_bool warned_passthrough;

static struct wfs_object *object_find(struct wfs_fs *fs, const struct wfs_digest *d)
{
	uint64_t key = wfs_map_digest_key(d);

	for (struct wfs_map_node *n = wfs_map_first(&fs->objects, key); n; n = wfs_map_next(n, key)) {
		struct wfs_object *o = (struct wfs_object *)n;

		if (wfs_digest_equal(&o->digest, d))
			return o;
	}
	return NULL;
}

struct wfs_object *wfs_object_pin(struct wfs_fs *fs, const struct wfs_digest *d)
{
	struct wfs_object *o = object_find(fs, d);

	if (!o) {
		o = calloc(1, sizeof(*o));
		if (!o)
			return NULL;
		o->digest = *d;
		o->fd = -1;
		o->node.key = wfs_map_digest_key(d);
		if (wfs_map_insert(&fs->objects, &o->node)) {
			free(o);
			return NULL;
		}
	}
	o->pins++;
	return o;
}

void wfs_object_repin(struct wfs_object *o)
{
	assert(o->pins > 0);
	o->pins++;
}

bool wfs_object_publishing(const struct wfs_object *o)
{
	return o->publishing;
}

void wfs_object_set_publishing(struct wfs_object *o, bool publishing)
{
	o->publishing = publishing;
}

void wfs_object_expect(struct wfs_object *o, uint64_t ino, long ms)
{
	o->expected_by = ino;
	o->expected_until = wfs_deadline_in(ms);
}

bool wfs_object_expected_elsewhere(const struct wfs_object *o, uint64_t ino, struct timespec *until)
{
	struct timespec now;

	if (!o->expected_by || o->expected_by == ino)
		return false;
	clock_gettime(CLOCK_REALTIME, &now);
	if (now.tv_sec > o->expected_until.tv_sec ||
	    (now.tv_sec == o->expected_until.tv_sec && now.tv_nsec >= o->expected_until.tv_nsec))
		return false;
	*until = o->expected_until;
	return true;
}

void wfs_object_expect_end(struct wfs_fs *fs, struct wfs_object **o)
{
	if (!*o)
		return;
	(*o)->expected_by = 0;
	wfs_object_unpin(fs, *o);
	*o = NULL;
	pthread_cond_broadcast(&fs->seal_done); /* claims waiting for it look again */
}

const struct wfs_digest *wfs_object_digest(const struct wfs_object *o)
{
	return &o->digest;
}

/* The last pin of @o dropped: close, release, free, and (with @ask) delete the object if nothing
 * refers to it. */
static void last_unpin(struct wfs_fs *fs, struct wfs_object *o, bool ask)
{
	struct wfs_digest d = o->digest;

	if (o->backing_id && fs->kernel.backing_close)
		fs->kernel.backing_close(fs->kernel.ctx, o->backing_id);
	if (o->fd >= 0)
		close(o->fd);
	wfs_map_remove(&fs->objects, &o->node);
	free(o);
	if (ask)
		wfs_object_maybe_delete(fs, &d);
}

void wfs_object_unpin_named(struct wfs_fs *fs, struct wfs_object *o)
{
	assert(o->pins > 0 && !wfs_lock_is_lent(&fs->lock));
	if (--o->pins == 0 && !o->deferred)
		last_unpin(fs, o, false);
}

void wfs_object_unpin(struct wfs_fs *fs, struct wfs_object *o)
{
	assert(o->pins > 0);
	if (--o->pins)
		return;
	if (wfs_lock_is_lent(&fs->lock)) {
		/* A light hold (lock.h): whether a name still refers to the object is the catalog's to
		 * say, and the catalog is the lender's. The entry stays, unpinned, until it returns. */
		if (!o->deferred) {
			o->deferred = true;
			o->next_deferred = fs->objects_deferred;
			fs->objects_deferred = o;
		}
		return;
	}
	last_unpin(fs, o, true);
}

void wfs_object_unpin_deferred(struct wfs_fs *fs)
{
	struct wfs_object *o;

	while ((o = fs->objects_deferred) != NULL) {
		fs->objects_deferred = o->next_deferred;
		o->deferred = false;
		if (o->pins == 0)
			last_unpin(fs, o, true);
	}
}

bool wfs_object_in_use(struct wfs_fs *fs, const struct wfs_digest *d)
{
	return object_find(fs, d) != NULL;
}

static bool object_in_use(void *ctx, const struct wfs_digest *d)
{
	return wfs_object_in_use(ctx, d);
}

void wfs_object_log_collected(const struct wfs_fs *fs, const struct wfs_gc_report *gc)
{
	WFS_LOG_LIMITED(WFS_LOG_INFO, "retention: objects no name uses exceeded the store's budget of %llu "
			"bytes: removed %llu objects (%llu bytes), least recently released first; kept %llu "
			"objects (%llu bytes)", (unsigned long long)fs->opt.retain,
			(unsigned long long)gc->objects_removed, (unsigned long long)gc->bytes_removed,
			(unsigned long long)gc->objects_kept, (unsigned long long)gc->bytes_kept);
}

/* Bytes free on the store's filesystem, root's reserve included (the daemon writes as root), with
 * what removed objects' queued closes will free (commit.h), or UINT64_MAX when statvfs(2) fails
 * (nothing is removed for a number not known). fs->lock held. */
static uint64_t store_free(struct wfs_fs *fs)
{
	struct statvfs sv;

	if (wfs_store_statfs(fs->store, &sv) != 0)
		return UINT64_MAX;
	return (uint64_t)sv.f_bfree * sv.f_frsize + fs->commit.closing_bytes;
}

uint64_t wfs_object_make_room(struct wfs_fs *fs, uint64_t bytes)
{
	struct wfs_gc_report gc;
	uint64_t free_bytes, want;
	char why[160];
	int ret;

	if (!fs->opt.retain || fs->retained_none)
		return 0;
	free_bytes = store_free(fs);
	want = bytes > UINT64_MAX - WFS_RETAIN_FREE_MIN ? UINT64_MAX : bytes + WFS_RETAIN_FREE_MIN;
	if (free_bytes >= want)
		return 0;
	ret = wfs_gc_evict(fs->store, fs->catalog, want == UINT64_MAX ? UINT64_MAX : want - free_bytes,
			   object_in_use, fs, &gc);
	if (ret) {
		WFS_LOG_LIMITED(WFS_LOG_WARN, "retention: cannot remove retained objects to make room: %s",
				strerror(-ret));
		return 0;
	}
	fs->retained = gc.bytes_kept;
	fs->retained_none = gc.objects_kept == 0;
	if (!gc.objects_removed)
		return 0;
	/* Not "full": what retention wants free is a margin, WFS_RETAIN_FREE_MIN, over the write at
	 * hand (a trial read "the store is full (68021248 bytes free)"). */
	if (bytes == UINT64_MAX)
		snprintf(why, sizeof(why), "a write failed with ENOSPC");
	else
		snprintf(why, sizeof(why), "%llu bytes free on the store's filesystem, under the %llu retention "
			 "keeps free for writes (%llu MiB%s)", (unsigned long long)free_bytes, (unsigned long long)want,
			 (unsigned long long)(WFS_RETAIN_FREE_MIN >> 20), bytes ? " and the write at hand" : "");
	WFS_LOG_LIMITED(WFS_LOG_WARN, "retention: %s: removed %llu retained objects (%llu bytes), least recently "
			"released first, to make room for writes; kept %llu objects (%llu bytes)", why,
			(unsigned long long)gc.objects_removed, (unsigned long long)gc.bytes_removed,
			(unsigned long long)gc.objects_kept, (unsigned long long)gc.bytes_kept);
	return gc.bytes_removed;
}

int wfs_object_collect(struct wfs_fs *fs, uint64_t retain, struct wfs_gc_report *r)
{
	int ret = wfs_gc_collect(fs->store, fs->catalog, retain, false, object_in_use, fs, r);

	if (ret)
		return ret;
	fs->retained = r->bytes_kept;
	fs->retained_none = r->objects_kept == 0;
	wfs_log(WFS_LOG_INFO, "gc: removed %llu objects no name uses (%llu bytes), least recently released "
		"first; kept %llu objects (%llu bytes; asked to keep up to %llu bytes)",
		(unsigned long long)r->objects_removed, (unsigned long long)r->bytes_removed,
		(unsigned long long)r->objects_kept, (unsigned long long)r->bytes_kept, (unsigned long long)retain);
	return 0;
}

void wfs_object_maybe_delete(struct wfs_fs *fs, const struct wfs_digest *d)
{
	struct wfs_gc_report gc;
	uint64_t refs, bytes = 0;
	int ret;

	if (object_find(fs, d))
		return; /* pinned: open somewhere, or being published */
	ret = wfs_catalog_object_get(fs->catalog, d, &refs, &bytes);
	if (ret == 0 && refs > 0)
		return;
	if (ret && ret != -ENOENT)
		return;
	/* A file without a row (a commit failed) is not kept, nor is anything on a store with too
	 * little room left for writes: an rm there frees space, as on any filesystem. */
	if (fs->opt.retain && ret == 0 && store_free(fs) >= WFS_RETAIN_FREE_MIN) {
		/*
		 * Keep unreferenced objects up to the budget, dropping the least recently released.
		 * Collecting reads every unreferenced row, so it runs only when the bytes released
		 * since the last collection could have crossed the budget: fs->retained is the kept
		 * bytes then plus every release since (reuse is not subtracted: an overestimate).
		 */
		fs->retained += bytes;
		fs->retained_none = false;
		if (fs->retained <= fs->opt.retain)
			return;
		ret = wfs_gc_collect(fs->store, fs->catalog, fs->opt.retain, false, object_in_use, fs, &gc);
		if (ret) {
			WFS_LOG_LIMITED(WFS_LOG_WARN, "retention: %s", strerror(-ret));
			return;
		}
		fs->retained = gc.bytes_kept;
		if (gc.objects_removed)
			wfs_object_log_collected(fs, &gc);
		return;
	}
	if (ret == 0) {
		/* Its COMMIT (the batch's too) can wait for a disk full of writers' pages: 411 ms seen
		 * under a FORGET. fs->lock is lent meanwhile (lock.h): light holds need no catalog, and
		 * none can pin @d, which no name refers to. */
		wfs_fs_lend(fs);
		ret = wfs_catalog_object_delete(fs->catalog, d);
		wfs_fs_reclaim(fs);
		if (ret)
			return;
	}
	wfs_crashpoint("delete.after-row"); /* leaves an orphan file: the next start removes it */
	ret = wfs_store_object_unlink_open(fs->store, d);
	if (ret >= 0) {
		wfs_commit_close_later(fs, ret); /* freeing its space, outside fs->lock */
		ret = 0;
	}
	if (ret && ret != -ENOENT) {
		char hex[WFS_DIGEST_HEX_CHARS + 1];

		wfs_digest_to_hex(d, hex);
		WFS_LOG_LIMITED(WFS_LOG_WARN, "object %s: cannot remove: %s", hex, strerror(-ret));
	}
}

int wfs_object_fd(struct wfs_fs *fs, struct wfs_object *o)
{
	int fd;

	if (o->fd >= 0)
		return o->fd;
	fd = wfs_store_object_open(fs->store, &o->digest, 0);
	if (fd < 0) {
		char hex[WFS_DIGEST_HEX_CHARS + 1];

		wfs_digest_to_hex(&o->digest, hex);
		WFS_LOG_LIMITED(WFS_LOG_ERR, "object %s: cannot open: %s", hex, strerror(-fd));
		return fd == -ENOENT ? -EIO : fd; /* a name whose object is missing is an I/O error */
	}
	o->fd = fd;
	return fd;
}

int wfs_object_backing(struct wfs_fs *fs, struct wfs_object *o)
{
	int id, fd;

	if (o->backing_id)
		return o->backing_id;
	fd = wfs_object_fd(fs, o);
	if (fd < 0)
		return fd;
	id = fs->kernel.backing_open ? fs->kernel.backing_open(fs->kernel.ctx, fd) : -EOPNOTSUPP;
	if (id <= 0) {
		wfs_log_once(&warned_passthrough, WFS_LOG_WARN,
			     "passthrough open failed (needs CAP_SYS_ADMIN and kernel >= 6.9): "
			     "the daemon serves reads from now on");
		atomic_store(&fs->passthrough, false);
		return -EOPNOTSUPP;
	}
	o->backing_id = id;
	close(o->fd); /* the kernel holds the file now: open objects cost no descriptors here */
	o->fd = -1;
	return id;
}

void wfs_objects_release(struct wfs_fs *fs)
{
	struct wfs_map_node *n;

	while ((n = wfs_map_pop(&fs->objects)) != NULL) {
		struct wfs_object *o = (struct wfs_object *)n;

		if (o->fd >= 0)
			close(o->fd);
		free(o);
	}
	fs->objects_deferred = NULL; /* freed above: they were in the map */
	wfs_map_release(&fs->objects);
}
