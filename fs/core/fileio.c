/* SPDX-License-Identifier: Apache-2.0 */
/* fileio.h: what a writable handle does to its file — write, fallocate, copy_file_range, truncate. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "claim.h"
#include "daemon.h"
#include "fault.h"
#include "fileio.h"
#include "inode.h"
#include "object.h"
#include "openmode.h"
#include "seal.h"
#include "version.h"
#include "writer.h"

uint32_t wfs_fileio_mode_killpriv(uint32_t mode, gid_t gid, const struct wfs_caller *c)
{
	if (S_ISDIR(mode))
		return mode;
	mode &= ~(uint32_t)S_ISUID;
	if ((mode & S_ISGID) && ((mode & S_IXGRP) || (c->uid != 0 && !wfs_writer_in_group(c->tid, c->gid, gid))))
		mode &= ~(uint32_t)S_ISGID;
	return mode;
}

bool wfs_fileio_killpriv(struct wfs_fs *fs, uint64_t ino, const struct wfs_caller *c)
{
	struct wfs_attr a, set = {0}, out;

	if (wfs_catalog_getattr(fs->catalog, ino, &a))
		return false;
	set.mode = wfs_fileio_mode_killpriv(a.mode, a.gid, c);
	return set.mode != a.mode && wfs_catalog_setattr(fs->catalog, ino, &set, WFS_ATTR_MODE, &out) == 0;
}

/*
 * A daemon-served write by a user other than root clears the bits (fileio.h): the kernel leaves that
 * to the daemon on direct I/O, and libfuse does not pass its FUSE_WRITE_KILL_SUIDGID on. Once per
 * handle, at its first write. Returns true when the mode changed (the kernel's cached attributes
 * are stale).
 */
static bool drop_privs(struct wfs_fs *fs, struct wfs_handle *h, const struct wfs_caller *c)
{
	if (h->privs_dropped)
		return false;
	h->privs_dropped = true;
	return c->uid != 0 && wfs_fileio_killpriv(fs, h->inode->ino, c);
}

/*
 * (L) May a write that ends at byte @end go on in version @v whose bytes a full store made it drop
 * (hashed only, in case the content is stored already)? Not past the largest stored object: no
 * stored content is that long, so the close would fail with ENOSPC anyway, and a stream (cat, dd)
 * would be accepted without end. Returns 0 or -ENOSPC.
 */
static int dropped_may_grow(struct wfs_fs *fs, struct wfs_version *v, uint64_t end)
{
	if (!wfs_version_dropped(v))
		return 0;
	if (!fs->largest_known && wfs_catalog_object_max_bytes(fs->catalog, &fs->largest_object) == 0)
		fs->largest_known = true;
	return fs->largest_known && end > fs->largest_object ? -ENOSPC : 0;
}

ssize_t wfs_fileio_write(struct wfs_fs *fs, struct wfs_handle *h, const struct wfs_caller *c, const void *buf,
		       size_t len, off_t off, bool *mode_changed)
{
	pid_t tid = c->tid;
	struct wfs_version *v;
	bool split = false;
	ssize_t n;
	int ret;

	*mode_changed = false;
	if (!h->writable)
		return -EBADF;
	wfs_lock(&fs->lock);
	*mode_changed = drop_privs(fs, h, c);
	wfs_object_make_room(fs, len); /* retained objects give way to these bytes */
	do {
		v = wfs_seal_writer(fs, h->inode, false, &ret);
		if (v && (ret = dropped_may_grow(fs, v, (uint64_t)off + len)) != 0) {
			wfs_seal_join(h, v);
			wfs_version_fail(v, ret); /* close(2) says ENOSPC too */
			wfs_version_put(v);
			wfs_unlock(&fs->lock);
			return ret;
		}
		if (v) {
			split = split || wfs_openmode_write_begin(fs, h, len);
			wfs_seal_join(h, v); /* also after close: a shared mapping's writeback */
			if (tid) {
				h->writer_tid = tid; /* 0: writeback, which names no thread */
				if (h->inode->writer == v)
					h->inode->attr_told = h->inode->attr_mixed = false; /* inode.h: the kernel drops them */
			}
		}
		wfs_unlock(&fs->lock);
		if (!v) {
			wfs_openmode_write_end(fs, h, len, split);
			return ret;
		}
		/* An append's offset is the kernel's i_size, which an O_TRUNC open by another process
		 * shrinks only after the daemon truncated the version: written there, it would leave a
		 * hole of zeros no writer wrote. The version's end is where it goes on ext4. (A mapping's
		 * writeback, tid 0, writes its pages where they are.) */
		n = wfs_version_write(v, buf, len, h->append && tid ? WFS_VERSION_AT_END : off);
		wfs_version_put(v);
		wfs_delay("fileio.write"); /* test-only: a slow write(2), its requests far apart */
		if (n == -EAGAIN)
			wfs_lock(&fs->lock);
	} while (n == -EAGAIN);
	wfs_openmode_write_end(fs, h, len, split);
	return n;
}

int wfs_fileio_fallocate(struct wfs_fs *fs, struct wfs_handle *h, pid_t tid, int mode, off_t off, off_t len)
{
	struct wfs_inode *in = h->inode;
	struct wfs_version *v;
	struct wfs_attr a;
	uint64_t size;
	int ret;

	if (!h->writable)
		return -EBADF;
	if (mode != (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE) && (mode & ~FALLOC_FL_KEEP_SIZE))
		return -EOPNOTSUPP;
	if (off < 0 || len <= 0)
		return -EINVAL;
	do {
		wfs_lock(&fs->lock);
		wfs_object_make_room(fs, (uint64_t)len);
		ret = 0;
		if (!(mode & FALLOC_FL_KEEP_SIZE)) {
			size = in->writer ? wfs_version_size(in->writer) : 0;
			if (!in->writer && (ret = wfs_catalog_getattr(fs->catalog, in->ino, &a)) == 0)
				size = a.size;
			if (ret == 0 && (uint64_t)off + (uint64_t)len > size)
				ret = wfs_seal_fits(fs, in->ino, (uint64_t)off + (uint64_t)len, NULL, NULL, 0, false,
						    "fallocate refused");
		}
		v = ret ? NULL : wfs_seal_writer(fs, in, false, &ret);
		if (v) {
			wfs_seal_join(h, v); /* sealed at this handle's close */
			if (tid)
				h->writer_tid = tid;
		}
		wfs_unlock(&fs->lock);
		if (!v)
			return ret;
		ret = wfs_version_fallocate(v, mode, (uint64_t)off, (uint64_t)len);
		wfs_version_put(v);
	} while (ret == -EAGAIN);
	return ret;
}

/*
 * (L) Is version @v of @in due for its end: still the inode's version, no writer counted, and no seal
 * holding it yet? A seal drops fs->lock while it hashes and publishes; a writer that joined a
 * version in that time (before wfs_version_seal_begin() existed) sealed it a second time.
 */
static bool seal_due(const struct wfs_inode *in, struct wfs_version *v)
{
	return in->writer == v && wfs_version_writers(v) == 0 && !wfs_version_frozen(v);
}

/* The most one copy_file_range reply reports: its count travels in 32 bits. */
#define COPY_RANGE_MAX ((size_t)1 << 30) /* bytes */

/*
 * copy_file_range(2) of a whole sealed file onto an empty one (what cp does): the destination
 * claims the source's object, so no byte moves; each name keeps its own attributes and xattrs.
 * The caller has the source open for reading, which is all a claim by digest would prove. Returns
 * the bytes the destination now holds (> 0), or 0 when this is not such a copy.
 */
static ssize_t copy_by_claim(struct wfs_fs *fs, struct wfs_inode *src, off_t off_in, struct wfs_inode *dst,
			     off_t off_out, size_t len)
{
	struct wfs_digest d;
	struct wfs_attr a;

	/* A source its writer just closed (cp right after writing it) is sealed at its release, which
	 * may still be on its way: wait for that seal (wfs_openmode_wait_release(); fs->lock dropped
	 * meanwhile, both inodes stay: the caller holds them open). */
	if (src->writer && wfs_openmode_writers_closed(src))
		wfs_openmode_wait_release(fs, src->ino);
	d = src->digest;
	if (off_in != 0 || off_out != 0 || !src->sealed || src->writer || src == dst ||
	    wfs_catalog_getattr(fs->catalog, src->ino, &a) || a.size == 0 || len < a.size)
		return 0;
	/* Written through passthrough (cp's O_TRUNC open): the claim fills that version's file; not
	 * waited for as readers, which would count the copier's own writable handle (500 ms, then a
	 * false ETXTBSY). */
	if (!wfs_openmode_on_version(dst) && wfs_openmode_wait_readers(fs, dst))
		return 0;
	if (wfs_claim_inode(fs, dst, &d))
		return 0; /* not empty, being read, or the object did not check: copy the bytes */
	return (ssize_t)a.size;
}

/*
 * A range whose bytes the destination already holds: both sealed (nothing being written) as the
 * same object, at the same offset. The rest of a claimed copy past COPY_RANGE_MAX lands here.
 * Returns the bytes "copied" (> 0), or 0.
 */
static ssize_t copy_same_object(struct wfs_fs *fs, struct wfs_inode *src, off_t off_in, struct wfs_inode *dst,
				off_t off_out, size_t len)
{
	struct wfs_attr a;

	if (off_in != off_out || !src->sealed || !dst->sealed || src->writer || dst->writer ||
	    !wfs_digest_equal(&src->digest, &dst->digest) || wfs_catalog_getattr(fs->catalog, src->ino, &a) ||
	    (uint64_t)off_in >= a.size)
		return 0;
	return (ssize_t)(len < a.size - (uint64_t)off_in ? len : a.size - (uint64_t)off_in);
}

ssize_t wfs_fileio_copy_range(struct wfs_fs *fs, struct wfs_handle *hin, off_t off_in, struct wfs_handle *hout,
			    off_t off_out, size_t len, const struct wfs_caller *c)
{
	pid_t tid = c->tid;
	size_t chunk = 1u << 20, done = 0;
	bool mode_changed;
	ssize_t n;
	char *buf;

	if (!hout->writable)
		return -EBADF;
	if (len > COPY_RANGE_MAX)
		len = COPY_RANGE_MAX;
	wfs_lock(&fs->lock);
	n = copy_by_claim(fs, hin->inode, off_in, hout->inode, off_out, len);
	if (n == 0)
		n = copy_same_object(fs, hin->inode, off_in, hout->inode, off_out, len);
	wfs_unlock(&fs->lock);
	if (n > 0)
		return n > (ssize_t)len ? (ssize_t)len : n;
	/* Partial ranges, a destination with bytes: read and write through the version. */
	buf = malloc(chunk);
	if (!buf)
		return -ENOMEM;
	while (done < len) {
		size_t want = len - done < chunk ? len - done : chunk;
		ssize_t r = wfs_openmode_read(fs, hin, tid, buf, want, off_in + (off_t)done), w = 0;

		if (r <= 0) {
			n = r;
			break;
		}
		while (w < r) {
			n = wfs_fileio_write(fs, hout, c, buf + w, (size_t)(r - w),
					   off_out + (off_t)done + w, &mode_changed);
			if (n <= 0)
				break;
			w += n;
		}
		if (n < 0)
			break;
		done += (size_t)w;
		if (r < (ssize_t)want)
			break;
	}
	free(buf);
	return done ? (ssize_t)done : n;
}

/* A new version of @size bytes, sealed now unless a writer is open. */
static int set_size(struct wfs_fs *fs, struct wfs_inode *in, struct wfs_handle *h, uint64_t size,
		    struct wfs_news *news)
{
	struct wfs_version *v;
	int ret;

	/* Through a descriptor the version is sealed at its close or release, perhaps where nobody
	 * hears a refusal (a mapping filled after close): hold the size to dtype/shape now. Empty is
	 * the state before the bytes are written, as for a new file. */
	if (h && size != 0) {
		ret = wfs_seal_fits(fs, in->ino, size, NULL, NULL, 0, false, "ftruncate refused");
		if (ret)
			return ret;
	}
	for (;;) {
		v = wfs_seal_writer(fs, in, size == 0, &ret);
		if (!v)
			return ret;
		ret = size == 0 ? 0 : wfs_version_truncate(v, size);
		if (ret != -EAGAIN)
			break;
		wfs_version_put(v);
	}
	if (ret == 0 && h && h->writable)
		wfs_seal_join(h, v); /* sealed at this handle's close */
	if (seal_due(in, v)) {
		int r = wfs_seal(fs, in, true);

		if (r)
			wfs_seal_writer_gone(fs, in, false, news);
		if (ret == 0)
			ret = r;
	}
	wfs_version_put(v);
	return ret;
}

int wfs_fileio_truncate(struct wfs_fs *fs, uint64_t ino, struct wfs_handle *h, uint64_t size, pid_t tid,
		      struct wfs_news *news)
{
	struct wfs_inode *in;
	struct wfs_attr a;
	bool counted = false;
	int ret;

	ret = wfs_inode_get_file(fs, ino, true, &a, &in);
	if (ret)
		return ret;
	/* The waits drop fs->lock: pinned, as a lookup need not keep it (wfs_inode_pin()). */
	wfs_inode_pin(in);
	if (!h) {
		/* As a writable open does (open_pinned()): a seal on its way (a writer's release, a
		 * mapping gone) or running ends first, so that the move below finds the file sealed and
		 * its readers on the sealed object: they keep it, the name moves. Decided during the
		 * seal, the truncate stayed (a writer), then went on beside those readers. */
		wfs_openmode_wait_release(fs, ino);
		ret = wfs_catalog_getattr(fs->catalog, ino, &a);
	}
	if (ret == 0 && in->io.replaced) /* a stale name: the kernel looks it up again */
		ret = wfs_openmode_stale_writer(fs, in, tid);
	else if (ret == 0 && !h)
		ret = wfs_openmode_move(fs, in, a.nlink, tid, news);
	if (ret == 1)
		ret = -ESTALE; /* truncate(2) retries on the name's new inode */
	if (ret == 0 && !h) {
		/* From its move decision to its seal a truncate by path counts as a writer, as a writable
		 * open does (a descriptor's is counted already): the waits and the base check below drop
		 * fs->lock while the inode may have no version, and another writer's open that found
		 * none, no writer and a reader moved the names to a new inode; this truncate went on in
		 * the old one, which no name reaches, and returned 0. */
		in->io.nwritable++;
		counted = true;
	}
	/* Readers sharing a passthrough writer's file see the change as they would on any file. */
	if (ret == 0 && !wfs_openmode_on_version(in))
		ret = wfs_openmode_wait_readers(fs, in);
	if (ret == 0)
		ret = set_size(fs, in, h, size, news);
	if (counted)
		in->io.nwritable--;
	wfs_inode_unpin(fs, in);
	return ret;
}
