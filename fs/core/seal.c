/* SPDX-License-Identifier: Apache-2.0 */
/* seal.h: a name's write path — versions started, written, sealed, claimed, abandoned. */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "commit.h"
#include "daemon.h"
#include "dtype.h"
#include "fault.h"
#include "inode.h"
#include "log.h"
#include "object.h"
#include "seal.h"
#include "version.h"
#include "weightfs.h"
#include "writer.h"

struct wfs_version *wfs_seal_writer(struct wfs_fs *fs, struct wfs_inode *in, bool truncate, int *err)
{
	bool base_checked = false;
	struct wfs_version *v;
	int ret;

	for (;;) {
		v = in->writer;
		if (!v && !truncate && in->sealed && !base_checked) {
			/* A new version starts as a copy of the sealed bytes: they must be right. */
			struct wfs_object *o = wfs_object_pin(fs, &in->digest);

			ret = o ? wfs_check_object(fs, o, 0) : -ENOMEM; /* may drop fs->lock */
			if (o)
				wfs_object_unpin(fs, o);
			if (ret) {
				*err = ret;
				return NULL;
			}
			base_checked = true;
			continue; /* another writer may have started meanwhile */
		}
		if (!v)
			break;
		if (!wfs_version_frozen(v)) {
			wfs_version_get(v);
			if (truncate) {
				ret = wfs_version_truncate(v, 0);
				if (ret == -EAGAIN) {
					wfs_version_put(v);
					continue;
				}
				if (ret) {
					wfs_version_put(v);
					*err = ret;
					return NULL;
				}
			}
			return v;
		}
		wfs_lock_wait(&fs->seal_done, &fs->lock);
	}

	v = wfs_version_new(fs->store, err);
	if (!v)
		return NULL;
	in->writer = v; /* the inode's reference */
	in->attr_told = true; /* what the kernel cached before, until a write drops it */
	in->io.cache_valid = false;
	wfs_version_get(v); /* the caller's */
	if (truncate || !in->sealed)
		return v;

	/* A copy of the sealed bytes: other users of @in wait on the version lock, not on fs->lock. */
	ret = wfs_version_copy_base(v, &in->digest, &fs->lock);
	if (ret) {
		*err = ret;
		assert(in->writer == v); /* a frozen version is replaced only by its seal or discard */
		in->writer = NULL;
		wfs_version_put(v);
		wfs_version_put(v);
		pthread_cond_broadcast(&fs->seal_done);
		return NULL;
	}
	return v;
}

void wfs_seal_join(struct wfs_handle *h, struct wfs_version *v)
{
	if (h->writing == v)
		return;
	wfs_version_get(v);
	wfs_version_writer_add(v);
	if (h->writing) {
		/* The version it wrote was sealed or dropped meanwhile; it no longer counts there. */
		wfs_version_writer_drop(h->writing);
		wfs_version_put(h->writing);
	}
	h->writing = v;
}

static void log_seal_error(struct wfs_inode *in, int err)
{
	wfs_log(err == -ENOSPC || err == -EDQUOT ? WFS_LOG_WARN : WFS_LOG_ERR,
		"inode %llu (find MNT -inum %llu): seal failed: %s; %s", (unsigned long long)in->ino,
		(unsigned long long)in->ino, strerror(-err),
		in->sealed ? "the name keeps its previous content" : "the new name is removed");
}

int wfs_seal(struct wfs_fs *fs, struct wfs_inode *in, bool reported)
{
	struct wfs_version *v = in->writer;
	struct wfs_object *o = NULL;
	struct wfs_attr old;
	struct wfs_digest d;
	struct timespec mtime;
	bool existed = false, unwritten, unchanged, kernel, told, durable = false, asked, alone, stored = false;
	bool publishing = false, trusted = false, linked;
	struct stat linked_st;
	uint64_t size = 0;
	int ret;

	assert(v);
	wfs_version_get(v);
	kernel = wfs_version_kernel_written(v);
	asked = wfs_version_durable_asked(v);
	told = wfs_version_error_told(v); /* a failure reported already: not logged again */
	wfs_unlock(&fs->lock);
	ret = wfs_version_freeze(v, &d, &size, &unwritten);
	unchanged = wfs_version_unchanged(v);
	if (ret == 0 && wfs_version_declared_wrong(v))
		wfs_log(WFS_LOG_WARN, "inode %llu: its writer declared a digest its bytes do not have: "
			"sealed with the digest of the bytes", (unsigned long long)in->ino);
	wfs_crashpoint("seal.after-digest");

	wfs_lock(&fs->lock);
	/* A size that does not fit the dtype/shape attributes is refused where close(2) can say so,
	 * before anything is published. At release nobody hears the error: refusing would lose the
	 * bytes, so they are sealed and the mismatch is logged. Empty and never written is the state
	 * before the bytes (a file created, its xattrs set, closed by a client that writes it next). */
	if (ret == 0 && !unwritten && wfs_seal_fits(fs, in->ino, size, NULL, NULL, 0,
					reported ? "seal refused" : "sealed at release all the same") &&
	    reported)
		ret = -EINVAL;
	if (ret == 0) {
		/* Waits for the disk at close(2), or joins the next group sync (commit.h)? */
		durable = wfs_commit_sync_at_close(fs, size, asked);
		o = wfs_object_pin(fs, &d); /* keeps the object from being deleted until committed */
		if (!o)
			ret = -ENOMEM;
	}
	if (ret == 0 && !unchanged) {
		/* One seal of a content at a time asks "stored already?" and links its copy, so that
		 * none dedups onto a copy that another publishes on its writer's declared digest,
		 * unread, between this one's question and its link. */
		while (wfs_object_publishing(o))
			wfs_lock_wait(&fs->seal_done, &fs->lock);
		wfs_object_set_publishing(o, true);
		publishing = true;
		/* Asked without fs->lock: after the kernel dropped its dentries this is a read of
		 * objects/ab/ from a disk busy with writers' data (80-240 ms seen under the lock). The
		 * answer holds until the publish: the object is pinned, no other seal links it. */
		wfs_unlock(&fs->lock);
		stored = wfs_store_object_exists(fs->store, &d);
		wfs_lock(&fs->lock);
		/* A dedup hit hands the name the stored copy: it must hold these bytes. A bad one is
		 * quarantined here, which leaves the way free to publish ours — the store heals. */
		if (stored && wfs_check_object(fs, o, 0) != 0)
			stored = wfs_store_object_exists(fs->store, &d); /* quarantined: gone */
	}
	wfs_unlock(&fs->lock);

	if (ret == 0)
		ret = wfs_version_publish(v, &d, stored, fs->opt.dedup_verify, durable, &existed);
	else
		wfs_version_discard(v);
	/* A copy this seal hashed is good (one published on a declaration is not until the checker
	 * says so): its file's identity, taken before fs->lock (pinned, and no other seal links it). */
	linked = publishing && ret == 0 && !existed && !wfs_version_trusted(v) &&
		 wfs_store_object_stat(fs->store, &d, &linked_st) == 0;

	wfs_crashpoint("seal.before-commit");
	wfs_lock(&fs->lock);
	if (publishing) {
		/* Linked (or found stored): the next seal of this content may ask. */
		if (linked)
			wfs_check_mark_good(fs, &d, &linked_st);
		wfs_object_set_publishing(o, false);
		publishing = false;
		pthread_cond_broadcast(&fs->seal_done);
	}
	/* A seal that a caller waits for and that is to be durable (large, or fsync'd) is committed at
	 * once and alone (the batch before it first), so a failed commit fails this seal and nothing
	 * else. The others join the batch, like a rename: committed within WFS_COMMIT_INTERVAL_MS. */
	alone = (reported || kernel) && (durable || asked);
	if (ret == 0 && alone)
		ret = wfs_commit_now(fs);
	if (ret == 0) {
		/* cp -a and tar set the times on the open file before closing it: keep them. */
		if (!wfs_version_mtime(v, &mtime))
			clock_gettime(CLOCK_REALTIME, &mtime);
		/* Made durable below without fs->lock (the WAL's fdatasync). */
		/* Published on its writer's word: the catalog says so until it is checked, so that a
		 * restart checks it too, whatever -o verify says (check.h). */
		trusted = !existed && wfs_version_trusted(v);
		ret = wfs_catalog_set_content(fs->catalog, in->ino, &d, size, &mtime,
					      trusted ? WFS_CONTENT_DECLARED : 0, &old, NULL);
		if (ret == 0 && alone && (ret = wfs_commit_now(fs)) != 0)
			wfs_catalog_rollback(fs->catalog);
	}
	if (ret == 0)
		wfs_crashpoint("seal.after-commit");
	if (ret == 0) {
		if (!durable && !existed && fs->opt.sync)
			wfs_commit_unsynced(fs, &d, size); /* its object, published unsynced: the group sync's */
		in->sealed = true;
		in->digest = d;
		fs->counters.seals++;
		fs->counters.published_copies += wfs_version_published_copy(v);
		if (existed) {
			fs->counters.dedup_hits++;
		} else {
			if (trusted) {
				/* Published on its writer's word: read and checked before any open uses it. */
				fs->counters.seals_declared++;
				wfs_check_soon(fs, &d);
			}
			fs->counters.objects_published++;
			fs->counters.bytes_published += size;
			if (size > fs->largest_object)
				fs->largest_object = size;
		}
	} else if (!told) {
		log_seal_error(in, ret);
	}
	assert(in->writer == v);
	in->writer = NULL;
	in->io.cache_valid = false;
	wfs_version_put(v); /* the inode's reference */
	wfs_version_put(v); /* ours */
	pthread_cond_broadcast(&fs->seal_done);
	if (o && ret == 0)
		wfs_object_unpin_named(fs, o); /* @in's content now */
	else if (o)
		wfs_object_unpin(fs, o); /* deletes the object again if the commit failed */
	if (ret == 0 && old.sealed && !wfs_digest_equal(&old.digest, &d))
		wfs_object_maybe_delete(fs, &old.digest);
	/*
	 * Durable before close(2) or truncate(2) returns where a caller waits and the file is large or
	 * was fsync'd (-o sync; a small one waits for the group sync, commit.h): the WAL's fdatasync,
	 * with fs->lock dropped, so that other opens, lookups and seals do not queue behind the disk
	 * (an open beside four sealing writers waited 200 ms for their syncs under the lock). A seal
	 * at release has no caller waiting: it becomes durable with the next sync — except a tensor
	 * written through passthrough, whose seal is always at release: synced there, moments after
	 * its close(2).
	 */
	if (ret == 0 && durable && (reported || kernel)) {
		wfs_unlock(&fs->lock);
		ret = wfs_commit_sync(fs); /* the group sync first, when small seals wait for it */
		wfs_lock(&fs->lock);
		fs->counters.seals_synced += ret == 0;
		if (ret)
			wfs_log(WFS_LOG_ERR, "inode %llu: the seal's commit could not be made durable: %s",
				(unsigned long long)in->ino, strerror(-ret));
	}
	return ret;
}

void wfs_seal_abandon(struct wfs_fs *fs, struct wfs_inode *in)
{
	struct wfs_version *v = in->writer;

	wfs_version_discard(v);
	in->writer = NULL;
	in->io.cache_valid = false;
	wfs_version_put(v);
	pthread_cond_broadcast(&fs->seal_done);
}

int wfs_seal_empty(struct wfs_fs *fs, struct wfs_inode *in)
{
	struct wfs_version *v;
	int ret;

	v = wfs_seal_writer(fs, in, true, &ret);
	if (!v)
		return ret;
	ret = wfs_seal(fs, in, true);
	wfs_version_put(v);
	return ret;
}

/*
 * @in's version was just dropped unsealed (its writer was killed, or the seal failed). A name that
 * was never sealed is removed now — a restarted writer checking "exists, with the right size" must
 * not find a name that fails every open with EIO — and so, when its writer was @killed, is a tensor
 * file that never held its bytes (sealed empty while its dtype and shape declare more: made and
 * declared, then written by the writer that is gone; weightfs.offload's temporary names,
 * lib/tensorfile.h; a close that refused the size leaves it as it was). A name that was sealed
 * with content shows that content again, the kernel's cached size included. @news collects what to
 * tell the kernel.
 */
static void writer_gone(struct wfs_fs *fs, struct wfs_inode *in, bool killed, struct wfs_news *news)
{
	struct wfs_attr a;
	uint64_t declared;
	int ret;

	news->ino = in->ino;
	news->inval = true;
	if (in->writer)
		return;
	if (in->sealed && (!killed || wfs_catalog_getattr(fs->catalog, in->ino, &a) || a.size != 0 ||
			   wfs_seal_declared_size(fs, in->ino, &declared) || declared == 0))
		return;
	ret = wfs_catalog_unlink_unsealed(fs->catalog, in->ino, in->sealed, wfs_news_name, news);
	if (ret)
		wfs_log(WFS_LOG_ERR, "inode %llu: removing the never-sealed name failed: %s (removed at the "
			"next mount)", (unsigned long long)in->ino, strerror(-ret));
	else if (news->n)
		wfs_log(WFS_LOG_INFO, "inode %llu: %s and its writer is gone: name removed",
			(unsigned long long)in->ino, in->sealed ? "a tensor file that never held its bytes" : "never sealed");
}

/*
 * A close that would seal a size that does not make the dtype/shape is refused (EINVAL, returned
 * here) but ends nothing: the open file may have other descriptors (a dup, a shell's copy) that
 * complete the tensor. A later close that finds the size right seals it; the release drops it if
 * its size is still the refused one (the name keeps what it had, as a lone refused close always did).
 */
static int refuse_short(struct wfs_fs *fs, struct wfs_inode *in, struct wfs_version *v)
{
	int ret = wfs_seal_fits(fs, in->ino, wfs_version_size(v), NULL, NULL, 0, "seal refused");

	if (ret)
		wfs_version_refuse(v);
	return ret;
}

int wfs_seal_leave(struct wfs_fs *fs, struct wfs_handle *h, bool at_release, int sig,
		   struct wfs_news *news)
{
	struct wfs_version *v = h->writing;
	struct wfs_inode *in = h->inode;
	bool last;
	int ret = 0;

	if (!v)
		return 0;
	last = in->writer == v && wfs_version_writers(v) == 1;
	if (!last) {
		/* Another writer goes on: only the last one's end decides. This one's close returned
		 * 0 (its flush ended its writing: it wrote) unless it was killed: what it wrote is kept,
		 * whatever becomes of the others (ext4 keeps it too). */
		if (!sig && !at_release && in->writer == v)
			wfs_version_finish(v);
		sig = 0;
	} else if (sig && wfs_version_finished(v)) {
		wfs_log(WFS_LOG_WARN, "inode %llu: its last writer was killed by signal %d, after another "
			"writer's close(2) returned: sealed with what both wrote", (unsigned long long)in->ino,
			sig);
		sig = 0;
	}
	if (last && !sig && !at_release && (ret = refuse_short(fs, in, v)) != 0)
		return ret;
	h->writing = NULL;
	if (wfs_version_writer_drop(v) == 0 && in->writer == v && at_release && wfs_version_refused(v)) {
		wfs_log(WFS_LOG_INFO, "inode %llu: released with the size its close refused: nothing "
			"sealed%s", (unsigned long long)in->ino,
			in->sealed ? ", the name keeps its previous content" : "");
		wfs_seal_abandon(fs, in);
		writer_gone(fs, in, false, news);
	} else if (wfs_version_writers(v) == 0 && in->writer == v) {
		if (sig) {
			if (!wfs_version_error_told(v)) /* else logged at its close (check_close) */
				wfs_log(WFS_LOG_WARN, "inode %llu: writer killed by signal %d before it "
					"finished: nothing sealed%s", (unsigned long long)in->ino, sig,
					in->sealed ? ", the name keeps its previous content" : "");
			wfs_seal_abandon(fs, in);
			writer_gone(fs, in, true, news);
		} else {
			bool told = wfs_version_error_told(v);

			/* in->attr_told after the seal: a GETATTR while its commit lent fs->lock counts. */
			ret = wfs_seal(fs, in, !at_release);
			if (ret) {
				/* -EINTR: a passthrough writer killed at its close (check_close) */
				writer_gone(fs, in, ret == -EINTR, news);
			} else if (news && in->attr_told) {
				/* A stat while it was written may have cached a ctime (and, with a
				 * writable mapping, an mtime) the seal moved: the kernel asks again.
				 * Not after a write(2) with nothing told since (inode.h): the next
				 * open's permission check would cost a GETATTR for nothing. */
				news->ino = in->ino;
				news->inval_attr = true;
			}
			if (told && at_release)
				ret = 0; /* reported at the close, or logged when the writer was killed */
		}
	}
	wfs_version_put(v);
	return ret;
}

int wfs_seal_check_close(struct wfs_fs *fs, struct wfs_handle *h, int sig)
{
	struct wfs_version *v = h->writing;
	struct wfs_inode *in = h->inode;
	int ret;

	if (sig && (wfs_version_writers(v) > 1 || wfs_version_finished(v)))
		return 0; /* others write on, or one finished: the last one's release decides (leave) */
	if (sig) {
		wfs_log(WFS_LOG_WARN, "inode %llu: writer killed by signal %d before it finished: "
			"nothing sealed%s", (unsigned long long)in->ino, sig,
			in->sealed ? ", the name keeps its previous content" : "");
		wfs_version_fail(v, -EINTR); /* the release drops it */
		return 0;
	}
	ret = refuse_short(fs, in, v); /* close(2) hears it; the version stays (refuse_short) */
	/* close(2) returns 0: the writing is done, whatever becomes of its writer before the seal at
	 * the release (a kill right after close must not drop the tensor; the release asks no /proc),
	 * or of another writer of the same file (wfs_version_finish). */
	if (ret == 0) {
		h->writer_tid = 0;
		wfs_version_finish(v);
	}
	return ret;
}

/*
 * A write by an unprivileged user clears the set-user-ID bit, and the set-group-ID bit of a
 * group-executable file, as every local filesystem does (should_remove_suid()). Writable opens are
 * direct I/O, where the kernel leaves that to the daemon, and libfuse does not pass the kernel's
 * FUSE_WRITE_KILL_SUIDGID: uid 0 stands for CAP_FSETID. Once per handle, at its first write.
 * Returns true when the mode changed (the kernel's cached attributes are stale).
 */
static bool drop_privs(struct wfs_fs *fs, struct wfs_handle *h, uid_t uid)
{
	struct wfs_attr a, set = {0}, out;
	uint32_t kill;

	if (h->privs_dropped)
		return false;
	h->privs_dropped = true;
	if (uid == 0 || wfs_catalog_getattr(fs->catalog, h->inode->ino, &a))
		return false;
	kill = (a.mode & S_ISUID) | ((a.mode & (S_ISGID | S_IXGRP)) == (S_ISGID | S_IXGRP) ? S_ISGID : 0);
	if (!kill)
		return false;
	set.mode = a.mode & ~kill;
	return wfs_catalog_setattr(fs->catalog, h->inode->ino, &set, WFS_ATTR_MODE, &out) == 0;
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

ssize_t wfs_seal_write(struct wfs_fs *fs, struct wfs_handle *h, uid_t uid, pid_t tid, const void *buf,
		       size_t len, off_t off, bool *mode_changed)
{
	struct wfs_version *v;
	ssize_t n;
	int ret;

	*mode_changed = false;
	if (!h->writable)
		return -EBADF;
	wfs_lock(&fs->lock);
	*mode_changed = drop_privs(fs, h, uid);
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
			wfs_seal_join(h, v); /* also after close: a shared mapping's writeback */
			if (tid) {
				h->writer_tid = tid; /* 0: writeback, which names no thread */
				if (h->inode->writer == v)
					h->inode->attr_told = false; /* inode.h: the kernel drops them */
			}
		}
		wfs_unlock(&fs->lock);
		if (!v)
			return ret;
		n = wfs_version_write(v, buf, len, off);
		wfs_version_put(v);
		if (n == -EAGAIN)
			wfs_lock(&fs->lock);
	} while (n == -EAGAIN);
	return n;
}

int wfs_seal_fallocate(struct wfs_fs *fs, struct wfs_handle *h, pid_t tid, int mode, off_t off, off_t len)
{
	struct wfs_inode *in = h->inode;
	struct wfs_version *v;
	struct wfs_attr a;
	uint64_t size;
	int ret;

	if (!h->writable)
		return -EBADF;
	if (mode & ~FALLOC_FL_KEEP_SIZE)
		return -EOPNOTSUPP;
	if (off < 0 || len <= 0)
		return -EINVAL;
	do {
		wfs_lock(&fs->lock);
		ret = 0;
		if (!(mode & FALLOC_FL_KEEP_SIZE)) {
			size = in->writer ? wfs_version_size(in->writer) : 0;
			if (!in->writer && (ret = wfs_catalog_getattr(fs->catalog, in->ino, &a)) == 0)
				size = a.size;
			if (ret == 0 && (uint64_t)off + (uint64_t)len > size)
				ret = wfs_seal_fits(fs, in->ino, (uint64_t)off + (uint64_t)len, NULL, NULL, 0,
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
 * May a claim replace what @in holds now? Only nothing: no content, no bytes written, and no reader
 * holding the current (empty) object as its passthrough backing file. With @freeze, an empty
 * version being written is frozen (writes wait for the claim, then go to a new version) and
 * *@frozen says so. Waits for a seal in progress.
 */
static int claim_target_empty(struct wfs_fs *fs, struct wfs_inode *in, bool freeze, bool *frozen)
{
	struct wfs_version *v;
	struct wfs_attr a;
	int ret;

	/* A seal in progress (an empty file's is at its release, after close(2) returned): wait. */
	while ((v = in->writer) != NULL && wfs_version_frozen(v))
		wfs_lock_wait(&fs->seal_done, &fs->lock);
	if (in->io.npassthrough > 0)
		return -ETXTBSY;
	if (v) {
		/* The bytes being written are what the file holds now, whatever was sealed before. */
		ret = wfs_version_claim_freeze(v, freeze);
		if (ret == 0 && freeze)
			*frozen = true;
		return ret;
	}
	ret = wfs_catalog_getattr(fs->catalog, in->ino, &a);
	if (ret)
		return ret;
	if (!S_ISREG(a.mode))
		return -EINVAL;
	return a.size ? -EEXIST : 0;
}

/* wfs_seal_claim() on the inode's entry. */
static int claim(struct wfs_fs *fs, struct wfs_inode *in, const struct wfs_digest *d)
{
	struct wfs_attr old;
	struct wfs_object *o;
	struct timespec mtime;
	bool frozen = false;
	struct stat st;
	int ret;

	ret = claim_target_empty(fs, in, false, NULL); /* fail early, before reading the object */
	if (ret)
		return ret;
	o = wfs_object_pin(fs, d); /* from here on the object cannot be deleted under us */
	if (!o)
		return -ENOMEM;
	ret = wfs_store_object_stat(fs->store, d, &st); /* absent: the common miss, not worth a log */
	if (ret == 0)
		ret = wfs_check_plausible(fs, o, &st); /* a stat, not a read: the first open checks it */
	if (ret == -ENOENT || ret == -EIO)
		ret = -ENODATA;
	if (ret == -ENODATA)
		fs->counters.claim_misses++;
	if (ret == 0) /* again, freezing an empty version: fs->lock may have been dropped, and a write
		       * must not land between this check and the commit */
		ret = claim_target_empty(fs, in, true, &frozen);
	if (ret == 0)
		ret = wfs_seal_fits(fs, in->ino, (uint64_t)st.st_size, NULL, NULL, 0, "claim refused");
	if (ret == 0) {
		clock_gettime(CLOCK_REALTIME, &mtime);
		/* Not synced: the object is durable already, and the claimed name becomes durable with
		 * the next synced commit, like a rename (trainers claim a temp name, then rename it). */
		ret = wfs_catalog_set_content(fs->catalog, in->ino, d, (uint64_t)st.st_size, &mtime, 0,
					      &old, NULL);
	}
	if (ret == 0) {
		if (in->writer)
			wfs_seal_abandon(fs, in); /* empty and unwritten: nothing is lost */
		in->sealed = true;
		in->digest = *d;
		in->io.cache_valid = false;
		fs->counters.claims++;
	} else if (frozen) {
		/* The one frozen above (fs->lock held since): as it was; writers waiting go on with it. */
		wfs_version_thaw(in->writer);
		pthread_cond_broadcast(&fs->seal_done);
	}
	wfs_object_unpin(fs, o);
	if (ret == 0 && old.sealed && !wfs_digest_equal(&old.digest, d))
		wfs_object_maybe_delete(fs, &old.digest); /* the empty object, when no other name has it */
	return ret;
}

bool wfs_seal_writing(struct wfs_fs *fs, uint64_t ino)
{
	struct wfs_inode *in = wfs_inode_find(fs, ino);

	return in && in->writer && !wfs_version_frozen(in->writer);
}

int wfs_seal_declare(struct wfs_fs *fs, uint64_t ino, const struct wfs_digest *d)
{
	struct wfs_inode *in = wfs_inode_find(fs, ino);

	if (!in || !in->writer)
		return 0;
	if (!fs->opt.verify)
		return 1; /* taken, and not used: nothing would check the bytes, so the seal hashes them */
	return wfs_version_declare(in->writer, d) == 0 ? 1 : 0;
}

int wfs_seal_claim(struct wfs_fs *fs, uint64_t ino, const struct wfs_digest *d)
{
	struct wfs_inode *in;
	struct wfs_attr a;
	int ret;

	ret = wfs_catalog_getattr(fs->catalog, ino, &a);
	if (ret == 0 && !S_ISREG(a.mode))
		ret = -EINVAL;
	if (ret)
		return ret;
	in = wfs_inode_get(fs, &a);
	if (!in)
		return -ENOMEM;
	ret = wfs_openmode_wait_readers(fs, in);
	if (ret == 0)
		ret = claim(fs, in, d);
	wfs_inode_maybe_free(fs, in);
	return ret;
}

int wfs_seal_claim_new(struct wfs_fs *fs, uint64_t parent, const char *name, uint32_t mode, uint32_t uid,
		       uint32_t gid, const struct wfs_digest *d, const struct stat *st,
		       const struct wfs_catalog_xattr *xattrs, size_t nxattrs, struct wfs_attr *out)
{
	struct wfs_object *o = wfs_object_pin(fs, d); /* the object cannot be deleted under us */
	int ret;

	if (!o)
		return -ENOMEM;
	ret = wfs_check_plausible(fs, o, st);
	if (ret == -ENOENT || ret == -EIO) {
		ret = -ENODATA;
		fs->counters.claim_misses++;
	}
	if (ret == 0)
		ret = wfs_catalog_create_sealed(fs->catalog, parent, name, mode, uid, gid, d,
						(uint64_t)st->st_size, xattrs, nxattrs, out);
	if (ret == 0)
		fs->counters.claims++;
	wfs_object_unpin(fs, o);
	return ret;
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
	struct wfs_digest d = src->digest;
	struct wfs_attr a;

	if (off_in != 0 || off_out != 0 || !src->sealed || src->writer || src == dst ||
	    wfs_catalog_getattr(fs->catalog, src->ino, &a) || a.size == 0 || len < a.size)
		return 0;
	/* Written through passthrough (cp onto a tensor: its O_TRUNC open took that path): the kernel
	 * writes that version's file, which a claim cannot replace; and waiting for passthrough
	 * readers would count the copier's own writable handle (500 ms, then a false ETXTBSY). */
	if (wfs_openmode_on_version(dst))
		return 0;
	if (wfs_openmode_wait_readers(fs, dst) || claim(fs, dst, &d))
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

ssize_t wfs_seal_copy_range(struct wfs_fs *fs, struct wfs_handle *hin, off_t off_in, struct wfs_handle *hout,
			    off_t off_out, size_t len, uid_t uid, pid_t tid)
{
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
			n = wfs_seal_write(fs, hout, uid, tid, buf + w, (size_t)(r - w),
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
		ret = wfs_seal_fits(fs, in->ino, size, NULL, NULL, 0, "ftruncate refused");
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
	if (wfs_version_writers(v) == 0 && in->writer == v) {
		int r = wfs_seal(fs, in, true);

		if (r)
			writer_gone(fs, in, false, news);
		if (ret == 0)
			ret = r;
	}
	wfs_version_put(v);
	return ret;
}

int wfs_seal_truncate(struct wfs_fs *fs, uint64_t ino, struct wfs_handle *h, uint64_t size,
		      struct wfs_news *news)
{
	struct wfs_inode *in;
	struct wfs_attr a;
	int ret;

	ret = wfs_inode_get_file(fs, ino, true, &a, &in);
	if (ret)
		return ret;
	if (in->io.replaced)
		return -ESTALE; /* a stale name: the kernel looks it up again */
	ret = h ? 0 : wfs_openmode_move(fs, in, a.nlink, news);
	if (ret == 1)
		return -ESTALE; /* truncate(2) retries on the name's new inode */
	/* Readers sharing a passthrough writer's file see the change as they would on any file. */
	if (ret == 0 && !wfs_openmode_on_version(in))
		ret = wfs_openmode_wait_readers(fs, in);
	if (ret == 0)
		ret = set_size(fs, in, h, size, news);
	if (ret)
		wfs_inode_maybe_free(fs, in);
	return ret;
}

void wfs_seal_set_mtime(struct wfs_fs *fs, uint64_t ino, const struct timespec *mtime)
{
	struct wfs_inode *in = wfs_inode_find(fs, ino);

	if (in && in->writer)
		wfs_version_set_mtime(in->writer, mtime);
}

void wfs_seal_wait_release(struct wfs_fs *fs, uint64_t ino)
{
	struct wfs_inode *in = wfs_inode_find(fs, ino);
	struct timespec deadline = wfs_deadline_in(100);
	bool long_wait = false;

	/*
	 * Up to 100 ms for the release to come; a seal already running (FROZEN: a tensor written
	 * through passthrough is hashed at its release) is waited for to its end, up to a minute. A
	 * release that does not come (a writable mapping kept after close) is not waited for: the
	 * caller answers with what the name holds now.
	 */
	while (in && in->writer && wfs_openmode_writers_closed(in)) {
		if (wfs_version_frozen(in->writer) && !long_wait) {
			deadline = wfs_deadline_in(60 * 1000);
			long_wait = true;
		}
		if (wfs_lock_timedwait(&fs->seal_done, &fs->lock, &deadline) == ETIMEDOUT)
			return;
		in = wfs_inode_find(fs, ino);
	}
	/* A release tells the kernel after it lets go of fs->lock (a dropped version's size, which the
	 * kernel took from the writes): an open answered before that, even one that found the release
	 * done, would read with the kernel's stale size. */
	while (fs->releases_telling)
		if (wfs_lock_timedwait(&fs->seal_done, &fs->lock, &deadline) == ETIMEDOUT)
			break;
}

/* The tensor that inode @ino's dtype and shape attributes declare (fits()). */
struct declared {
	char dtype_buf[WFS_SEAL_DTYPE_MAX + 1], shape_buf[WFS_SEAL_SHAPE_MAX + 1];
	const char *dtype, *shape;
	size_t dtype_len, shape_len;
	uint64_t elements;
	int bytes;                  /* per element */
};

/*
 * Read @ino's dtype and shape, with attribute @name taken as @value (@len bytes) when @name is not
 * NULL. Returns 0 when both are set and valid, else -ENODATA (not set, longer than any valid value,
 * or stored before validation existed: nothing to hold the size to).
 */
static int read_declared(struct wfs_fs *fs, uint64_t ino, const char *name, const char *value, size_t len,
			 struct declared *t)
{
	t->dtype = t->dtype_buf;
	t->shape = t->shape_buf;
	if (name && strcmp(name, WFS_XATTR_DTYPE) == 0) {
		t->dtype = value;
		t->dtype_len = len;
	} else if (wfs_catalog_xattr_get(fs->catalog, ino, WFS_XATTR_DTYPE, t->dtype_buf, sizeof(t->dtype_buf),
					 &t->dtype_len)) {
		return -ENODATA;
	}
	if (name && strcmp(name, WFS_XATTR_SHAPE) == 0) {
		t->shape = value;
		t->shape_len = len;
	} else if (wfs_catalog_xattr_get(fs->catalog, ino, WFS_XATTR_SHAPE, t->shape_buf, sizeof(t->shape_buf),
					 &t->shape_len)) {
		return -ENODATA;
	}
	t->bytes = wfs_dtype_size(t->dtype, t->dtype_len);
	if (t->bytes < 0 || wfs_shape_elements(t->shape, t->shape_len, &t->elements) < 0)
		return -ENODATA;
	return 0;
}

int wfs_seal_declared_size(struct wfs_fs *fs, uint64_t ino, uint64_t *bytes)
{
	struct declared t;
	int ret = read_declared(fs, ino, NULL, NULL, 0, &t);

	if (ret)
		return ret;
	return wfs_tensor_bytes(t.dtype, t.dtype_len, t.shape, t.shape_len, bytes) ? -ENODATA : 0;
}

int wfs_seal_fits(struct wfs_fs *fs, uint64_t ino, uint64_t size, const char *name, const char *value,
		  size_t len, const char *what)
{
	struct declared t;
	uint64_t bytes;
	int ret;

	if (size == 0 || read_declared(fs, ino, name, value, len, &t))
		return 0; /* empty fits every declaration: a tensor before its bytes, or emptied (`: > f`) */
	ret = wfs_tensor_bytes(t.dtype, t.dtype_len, t.shape, t.shape_len, &bytes);
	if (ret == 0 && bytes == size)
		return 0;
	/* A file shorter than its declaration at a close: most often the writer's own error (ENOSPC from
	 * a write(2), which it heard), not the shape. (With @name, a new declaration is what is wrong.) */
	wfs_log(WFS_LOG_WARN, "inode %llu (find MNT -inum %llu): %s: shape %.*s x %.*s (%d bytes) "
		"does not make the file's %llu bytes%s", (unsigned long long)ino, (unsigned long long)ino, what,
		(int)(t.shape_len < 96 ? t.shape_len : 96), t.shape, (int)t.dtype_len, t.dtype, t.bytes,
		(unsigned long long)size,
		!name && ret == 0 && size < bytes ? " (cut short: a write that failed, ENOSPC for one, a writer that "
					   "stopped early, or other bytes written over the tensor)" : "");
	return -EINVAL;
}

int wfs_seal_check_xattr(struct wfs_fs *fs, uint64_t ino, const char *name, const char *value, size_t len)
{
	bool is_dtype = strcmp(name, WFS_XATTR_DTYPE) == 0;
	uint64_t elements;
	struct wfs_attr a;
	int ret;

	wfs_seal_wait_release(fs, ino); /* judge the file as close(2) left it */
	/* Longer values cannot be valid, and wfs_seal_fits() reads them back into buffers this big. */
	if (len > (is_dtype ? WFS_SEAL_DTYPE_MAX : WFS_SEAL_SHAPE_MAX) ||
	    (is_dtype ? wfs_dtype_size(value, len) < 0 : wfs_shape_elements(value, len, &elements) < 0)) {
		wfs_log(WFS_LOG_WARN, "inode %llu: %s=\"%.*s\" refused: %s", (unsigned long long)ino, name,
			(int)(len < 64 ? len : 64), value,
			is_dtype ? "not a safetensors dtype (BF16, F16, F32, I8, U8, BOOL, F8_E4M3, ...)"
				 : "not a shape like [4096,1024]");
		return -EINVAL;
	}
	ret = wfs_catalog_getattr(fs->catalog, ino, &a);
	/* A file being written is held to its attributes when it is sealed; so is an empty one, which
	 * tar (mknod, attributes, then the bytes) and a digest claim fill only after this. */
	if (ret || !a.sealed || !S_ISREG(a.mode) || a.size == 0)
		return ret;
	return wfs_seal_fits(fs, ino, a.size, name, value, len,
			     is_dtype ? WFS_XATTR_DTYPE " refused" : WFS_XATTR_SHAPE " refused");
}
