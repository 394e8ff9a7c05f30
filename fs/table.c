/*
 * In-memory inode and object tables (daemon.h). Every function here runs with fs->lock held.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon.h"
#include "fault.h"
#include "gc.h"
#include "log.h"

static uint64_t digest_key(const struct wfs_digest *d)
{
	uint64_t k;

	memcpy(&k, d->bytes, sizeof(k));
	return k;
}

struct wfs_inode *wfs_inode_find(struct wfs_fs *fs, uint64_t ino)
{
	struct wfs_map_node *n = wfs_map_first(&fs->inodes, ino);

	return n ? (struct wfs_inode *)n : NULL;
}

struct wfs_inode *wfs_inode_get(struct wfs_fs *fs, const struct wfs_attr *attr)
{
	struct wfs_inode *in = wfs_inode_find(fs, attr->ino);

	if (in)
		return in;
	in = calloc(1, sizeof(*in));
	if (!in)
		return NULL;
	in->ino = attr->ino;
	in->node.key = attr->ino;
	in->sealed = attr->sealed;
	in->digest = attr->digest;
	if (wfs_map_insert(&fs->inodes, &in->node)) {
		free(in);
		return NULL;
	}
	return in;
}

void wfs_inode_maybe_drop(struct wfs_fs *fs, fuse_req_t req, uint64_t ino)
{
	struct wfs_attr a, old;

	(void)req;
	if (wfs_inode_find(fs, ino))
		return; /* the kernel or a handle still refers to it */
	if (wfs_catalog_getattr(fs->catalog, ino, &a) || a.nlink != 0)
		return;
	if (wfs_catalog_inode_drop(fs->catalog, ino, &old))
		return; /* left for wfs_catalog_recover() at next mount */
	if (old.sealed)
		wfs_object_maybe_delete(fs, &old.digest);
}

void wfs_inode_maybe_free(struct wfs_fs *fs, fuse_req_t req, struct wfs_inode *in)
{
	uint64_t ino = in->ino;

	if (in->nlookup || in->nopen || in->writer)
		return;
	wfs_map_remove(&fs->inodes, &in->node);
	free(in);
	wfs_inode_maybe_drop(fs, req, ino);
}

static struct wfs_object *object_find(struct wfs_fs *fs, const struct wfs_digest *d)
{
	uint64_t key = digest_key(d);

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
		o->node.key = digest_key(d);
		if (wfs_map_insert(&fs->objects, &o->node)) {
			free(o);
			return NULL;
		}
	}
	o->pins++;
	return o;
}

void wfs_object_unpin(struct wfs_fs *fs, fuse_req_t req, struct wfs_object *o)
{
	struct wfs_digest d = o->digest;

	if (--o->pins)
		return;
	if (o->backing_id && req)
		fuse_passthrough_close(req, o->backing_id);
	if (o->fd >= 0)
		close(o->fd);
	wfs_map_remove(&fs->objects, &o->node);
	free(o);
	wfs_object_maybe_delete(fs, &d);
}

static bool object_in_use(void *ctx, const struct wfs_digest *d)
{
	return object_find(ctx, d) != NULL;
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
	if (fs->opt.retain && ret == 0) { /* a file without a row (a commit failed) is not kept */
		/*
		 * Keep unreferenced objects up to the budget, dropping the least recently released.
		 * Collecting reads every unreferenced row, so it runs only when the bytes released
		 * since the last collection could have crossed the budget: fs->retained is the kept
		 * bytes then plus every release since (reuse is not subtracted: an overestimate).
		 */
		fs->retained += bytes;
		if (fs->retained <= fs->opt.retain)
			return;
		ret = wfs_gc_collect(fs->store, fs->catalog, fs->opt.retain, false, object_in_use, fs, &gc);
		if (ret)
			wfs_log(WFS_LOG_WARN, "retention: %s", strerror(-ret));
		else
			fs->retained = gc.bytes_kept;
		return;
	}
	if (ret == 0 && wfs_catalog_object_delete(fs->catalog, d))
		return;
	wfs_crashpoint("delete.after-row"); /* leaves an orphan file, which fsck --repair removes */
	ret = wfs_store_object_remove(fs->store, d);
	if (ret && ret != -ENOENT) {
		char hex[WFS_DIGEST_HEX_CHARS + 1];

		wfs_digest_to_hex(d, hex);
		wfs_log(WFS_LOG_WARN, "object %s: cannot remove: %s", hex, strerror(-ret));
	}
}

int wfs_object_open_fd(struct wfs_fs *fs, struct wfs_object *o)
{
	int fd;

	if (o->fd >= 0)
		return 0;
	fd = wfs_store_object_open(fs->store, &o->digest, 0);
	if (fd < 0) {
		char hex[WFS_DIGEST_HEX_CHARS + 1];

		wfs_digest_to_hex(&o->digest, hex);
		wfs_log(WFS_LOG_ERR, "object %s: cannot open: %s", hex, strerror(-fd));
		return fd == -ENOENT ? -EIO : fd; /* a name whose object is missing is an I/O error */
	}
	o->fd = fd;
	return 0;
}

void wfs_tables_release(struct wfs_fs *fs)
{
	struct wfs_map_node *n;

	while (fs->handles) {
		struct wfs_handle *h = fs->handles;

		fs->handles = h->next;
		if (h->writing)
			wfs_version_put(h->writing);
		free(h);
	}
	while ((n = wfs_map_any(&fs->inodes)) != NULL) {
		struct wfs_inode *in = (struct wfs_inode *)n;

		wfs_map_remove(&fs->inodes, n);
		if (in->writer)
			wfs_version_put(in->writer); /* unsealed: never published, gone at next mount */
		free(in);
	}
	while ((n = wfs_map_any(&fs->objects)) != NULL) {
		struct wfs_object *o = (struct wfs_object *)n;

		wfs_map_remove(&fs->objects, n);
		if (o->fd >= 0)
			close(o->fd);
		free(o);
	}
	while ((n = wfs_map_any(&fs->checks)) != NULL) {
		wfs_map_remove(&fs->checks, n);
		free(n);
	}
	wfs_map_release(&fs->inodes);
	wfs_map_release(&fs->objects);
	wfs_map_release(&fs->checks);
}
