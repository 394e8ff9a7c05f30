/* SPDX-License-Identifier: Apache-2.0 */
/* inode.h: the in-memory inodes and their lookup counts. Every function runs with fs->lock held. */
#include <assert.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "daemon.h"
#include "inode.h"
#include "log.h"
#include "object.h"
#include "store.h"
#include "version.h"

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

void wfs_inode_attr_note(struct wfs_fs *fs, const struct wfs_attr *a)
{
	struct wfs_inode *in = wfs_inode_find(fs, a->ino);

	if (!in)
		return;
	in->attr = *a;
	in->attr_valid = true;
	in->attr_epoch = atomic_load(&fs->attr_epoch);
}

bool wfs_inode_attr(const struct wfs_fs *fs, const struct wfs_inode *in, struct wfs_attr *out)
{
	if (!in->attr_valid || in->attr_epoch != atomic_load(&fs->attr_epoch))
		return false;
	*out = in->attr;
	return true;
}

void wfs_inode_attr_changed(void *ctx, uint64_t ino)
{
	struct wfs_fs *fs = ctx;
	struct wfs_inode *in;

	if (ino == 0) {
		atomic_fetch_add(&fs->attr_epoch, 1);
		return;
	}
	in = wfs_inode_find(fs, ino);
	if (in)
		in->attr_valid = false;
}

int wfs_inode_get_file(struct wfs_fs *fs, uint64_t ino, bool regular_only, struct wfs_attr *attr,
		       struct wfs_inode **out)
{
	int ret = wfs_catalog_getattr(fs->catalog, ino, attr);

	if (ret)
		return ret;
	if (S_ISDIR(attr->mode))
		return -EISDIR;
	if (regular_only && !S_ISREG(attr->mode))
		return -EINVAL;
	*out = wfs_inode_get(fs, attr);
	if (*out)
		wfs_inode_attr_note(fs, attr);
	return *out ? 0 : -ENOMEM;
}

static bool same_time(const struct timespec *a, const struct timespec *b)
{
	return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

static bool told_is(const struct wfs_told *t, uint64_t size, const struct timespec *mtime,
		    const struct timespec *ctime)
{
	return t->size == size && same_time(&t->mtime, mtime) && same_time(&t->ctime, ctime);
}

int64_t wfs_inode_object_blocks(struct wfs_fs *fs, struct wfs_inode *in, const struct wfs_digest *d)
{
	struct stat st;

	if (in && in->blocks_known && wfs_digest_equal(&in->blocks_of, d))
		return (int64_t)in->blocks;
	if (wfs_store_object_stat(fs->store, d, &st) != 0)
		return -1;
	if (in) {
		in->blocks_known = true;
		in->blocks = (uint64_t)st.st_blocks;
		in->blocks_of = *d;
	}
	return (int64_t)st.st_blocks;
}

void wfs_inode_tell(struct wfs_inode *in, const struct stat *st)
{
	/* Another size or mtime: written since, and a write drops what the kernel held before (a reply
	 * it sent for earlier is discarded: fuse_write_update_attr()). Only another ctime, from a
	 * rename or link meanwhile: two replies may reach the kernel in either order. */
	if (in->attr_told && in->told.size == (uint64_t)st->st_size && same_time(&in->told.mtime, &st->st_mtim) &&
	    !same_time(&in->told.ctime, &st->st_ctim))
		in->attr_mixed = true;
	in->told.size = (uint64_t)st->st_size;
	in->told.blocks = (uint64_t)st->st_blocks;
	in->told.mtime = st->st_mtim;
	in->told.ctime = st->st_ctim;
	in->attr_told = true;
}

bool wfs_inode_told_other(struct wfs_fs *fs, struct wfs_inode *in)
{
	struct wfs_attr a;

	if (!in->attr_told)
		return false;
	if (in->attr_mixed || !wfs_inode_attr(fs, in, &a) || !told_is(&in->told, a.size, &a.mtime, &a.ctime))
		return true;
	/* Blocks told from a version are its tmp file's, or its size rounded to 4 KiB (version.h):
	 * another count for the object (a sparse file written by the daemon) is news too. */
	return S_ISREG(a.mode) && a.sealed &&
	       wfs_inode_object_blocks(fs, in, &a.digest) != (int64_t)in->told.blocks;
}

void wfs_inode_lookup(struct wfs_inode *in)
{
	in->nlookup++;
}

/* Drop inode @ino from the catalog if it has no name and this daemon holds no entry for it. */
static void drop_unlinked(struct wfs_fs *fs, uint64_t ino)
{
	struct wfs_attr a, old;

	if (wfs_inode_find(fs, ino))
		return; /* the kernel or a handle still refers to it */
	if (wfs_catalog_getattr(fs->catalog, ino, &a) || a.nlink != 0)
		return;
	if (wfs_catalog_inode_drop(fs->catalog, ino, &old))
		return; /* left for wfs_catalog_recover() at next mount */
	if (old.sealed)
		wfs_object_maybe_delete(fs, &old.digest);
}

void wfs_inode_forget(struct wfs_fs *fs, uint64_t ino, uint64_t nlookup)
{
	struct wfs_inode *in = wfs_inode_find(fs, ino);
	bool inherited = ino <= fs->held_before;

	/* More than this server counted, of an inode a dead server told the kernel about: the kernel
	 * forgets its own count whole (the inode left its cache), so nothing refers to it now. */
	if (!in) {
		if (inherited)
			drop_unlinked(fs, ino);
		return;
	}
	if (in->nlookup < nlookup) {
		if (!inherited)
			wfs_log(WFS_LOG_ERR, "inode %llu: kernel forgot %llu lookups of %llu", (unsigned long long)ino,
				(unsigned long long)nlookup, (unsigned long long)in->nlookup);
		nlookup = in->nlookup;
	} else {
		inherited = false; /* perhaps not all of the kernel's count: keep the guard */
	}
	in->nlookup -= nlookup;
	wfs_inode_maybe_free(fs, in);
	if (inherited)
		drop_unlinked(fs, ino);
}

void wfs_inode_maybe_drop(struct wfs_fs *fs, uint64_t ino)
{
	/* After a takeover the kernel may hold it through a dead server's reply, uncounted here: it
	 * goes when the kernel forgets it (above), else at the next mount (wfs_catalog_recover). */
	if (ino <= fs->held_before)
		return;
	drop_unlinked(fs, ino);
}

void wfs_inode_maybe_free(struct wfs_fs *fs, struct wfs_inode *in)
{
	uint64_t ino = in->ino;

	if (in->nlookup || in->io.nopen || in->writer || in->pins)
		return;
	assert(in->io.ncached == 0 && in->io.npassthrough == 0 && in->io.nwritable == 0);
	wfs_object_expect_end(fs, &in->expecting);
	wfs_map_remove(&fs->inodes, &in->node);
	free(in);
	wfs_inode_maybe_drop(fs, ino);
}

void wfs_inode_pin(struct wfs_inode *in)
{
	in->pins++;
}

void wfs_inode_unpin(struct wfs_fs *fs, struct wfs_inode *in)
{
	assert(in->pins > 0);
	in->pins--;
	wfs_inode_maybe_free(fs, in);
}

void wfs_inodes_release(struct wfs_fs *fs)
{
	struct wfs_map_node *n;

	while ((n = wfs_map_pop(&fs->inodes)) != NULL) {
		struct wfs_inode *in = (struct wfs_inode *)n;

		if (in->writer)
			wfs_version_put(in->writer); /* unsealed: never published, gone at next mount */
		if (in->io.pt_version)
			wfs_version_put(in->io.pt_version); /* openmode's: its passthrough opens never closed */
		free(in);
	}
	wfs_map_release(&fs->inodes);
}
