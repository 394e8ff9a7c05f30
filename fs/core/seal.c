/* SPDX-License-Identifier: Apache-2.0 */
/* seal.h: a name's versions — started, joined, sealed, abandoned; dtype/shape size rules. */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "check.h"
#include "commit.h"
#include "daemon.h"
#include "dtype.h"
#include "fault.h"
#include "inode.h"
#include "log.h"
#include "mapped.h"
#include "object.h"
#include "seal.h"
#include "version.h"
#include "weightfs.h"

struct wfs_version *wfs_seal_writer(struct wfs_fs *fs, struct wfs_inode *in, bool truncate, int *err)
{
	bool base_checked = false;
	struct wfs_version *v;
	int ret;

	for (;;) {
		v = in->writer;
		if (!v && !truncate && in->sealed && !base_checked) {
			/* A new version starts as a copy of the sealed bytes: they must be right. The check
			 * may drop fs->lock with no version here, and an open for writing (an O_TRUNC one
			 * through passthrough) may start one meanwhile: the loop joins that one, never
			 * replaces it, and its opener checks back under fs->lock that no seal took it before
			 * it registers its file (open_writer_passthrough()). Nor can such an open move the
			 * names away from this caller meanwhile: callers count as writers of @in (a writable
			 * handle, an open from its move decision, a truncate by path: wfs_fileio_truncate()). */
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
		if (in->writer_filling) {
			wfs_lock_wait(&fs->seal_done, &fs->lock);
			continue;
		}
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

	wfs_object_make_room(fs, 0); /* for its bytes (a rewrite's copy among them) */
	v = wfs_version_new(fs->store, err);
	if (!v)
		return NULL;
	in->writer = v; /* the inode's reference */
	wfs_version_keep(v, in->ino, !truncate && in->sealed); /* for a successor (keep.h) */
	in->attr_told = true; /* what the kernel cached before, until a write drops it */
	in->attr_mixed = in->nlookup > 0; /* a new file's first attributes are its create's reply */
	in->io.cache_valid = false;
	wfs_version_get(v); /* the caller's */
	if (truncate || !in->sealed)
		return v;

	/* A copy of the sealed bytes: other users of @in wait for it without fs->lock (writer_filling,
	 * the loop above; readers on the version lock). */
	in->writer_filling = true;
	ret = wfs_version_copy_base(v, &in->digest, &fs->lock);
	in->writer_filling = false;
	pthread_cond_broadcast(&fs->seal_done);
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

static void log_seal_error(struct wfs_inode *in, int err, bool reported)
{
	/* A full store fails every seal a trainer's loop makes, thousands a second, and the log file
	 * is on that full disk: a burst of lines, then a count (log.h). */
	static struct wfs_log_limit full = WFS_LOG_LIMIT_INIT;
	const char *what = in->sealed ? "the name keeps its previous content"
			   : reported || err == -ENOSPC ? "the new name is removed"
			   : "at its release, after close(2) returned: the new name reads EIO until it is "
			     "written again (weightfsctl stat counts it in unsealed_files)";

	if (err == -ENOSPC || err == -EDQUOT)
		wfs_log_limited(&full, WFS_LOG_WARN, "inode %llu (find MNT -inum %llu): seal failed: %s; %s",
				(unsigned long long)in->ino, (unsigned long long)in->ino, strerror(-err), what);
	else
		WFS_LOG_LIMITED(WFS_LOG_ERR, "inode %llu (find MNT -inum %llu): seal failed: %s; %s",
				(unsigned long long)in->ino, (unsigned long long)in->ino, strerror(-err), what);
}

int wfs_seal_store_filled(struct wfs_fs *fs)
{
	unsigned n = 0;

	for (struct wfs_handle *h = fs->handles; h; h = h->next) {
		struct wfs_version *v = h->writing;

		if (!h->passthrough || !v || !wfs_version_kernel_written(v) || wfs_version_frozen(v) ||
		    wfs_version_failed(v))
			continue;
		wfs_version_fail(v, -ENOSPC);
		n++;
	}
	if (n)
		WFS_LOG_LIMITED(WFS_LOG_WARN, "the store filled up while %u files were being written through the kernel: "
				"their writes may have failed with ENOSPC; none of them is sealed (their close(2) says "
				"ENOSPC)", n);
	/* Their writers will write again, needing room the daemon cannot know: every retained object
	 * gives way. */
	wfs_object_make_room(fs, UINT64_MAX);
	return n;
}

/*
 * f_bavail, not f_bfree: the kernel's writes can fail while f_bfree still counts blocks, ext4's
 * reserved clusters (up to 4,096 that not even root may write; f_bfree includes them, f_bavail leaves
 * them out with root's reserve). A new operator's 300 MiB ext4 store failed root's writes with f_bfree
 * at 5 MiB: a f_bfree test never found it full, and the cut-short file was sealed. Counting root's
 * reserve as used may fail a writer that fitted in it: its close(2) says ENOSPC, and nothing is lost.
 */
bool wfs_seal_store_full(struct wfs_fs *fs)
{
	struct statvfs sv;

	return wfs_store_statfs(fs->store, &sv) == 0 && (uint64_t)sv.f_bavail * sv.f_frsize < WFS_SEAL_FULL_BYTES;
}

int wfs_seal(struct wfs_fs *fs, struct wfs_inode *in, bool reported)
{
	struct wfs_version *v = in->writer;
	struct wfs_object *o = NULL;
	struct wfs_attr old, after;
	struct wfs_digest d;
	struct timespec mtime, changed;
	bool existed = false, unwritten, unchanged, kernel, told, durable = false, asked, alone, stored = false;
	bool publishing = false, trusted = false, linked, filled = false;
	struct stat linked_st;
	uint64_t size = 0;
	int ret;

	assert(v && wfs_version_writers(v) == 0);
	if (!wfs_version_seal_begin(v)) {
		/* Its callers seal only a version no seal holds (closing.c, fileio.c): never twice. */
		wfs_log(WFS_LOG_ERR, "inode %llu: a seal of a version already being sealed was skipped",
			(unsigned long long)in->ino);
		return 0;
	}
	wfs_version_get(v);
	kernel = wfs_version_kernel_written(v);
	asked = wfs_version_durable_asked(v);
	told = wfs_version_error_told(v); /* a failure reported already: not logged again */
	wfs_unlock(&fs->lock);
	wfs_delay("seal.before-freeze");
	ret = wfs_version_freeze(v, &d, &size, &unwritten);
	unchanged = wfs_version_unchanged(v);
	if (ret == 0 && kernel && !unchanged && wfs_seal_store_full(fs)) {
		WFS_LOG_LIMITED(WFS_LOG_WARN, "inode %llu: written through the kernel while the store filled up (under "
				"%d MiB free): its writes may have failed with ENOSPC, which its writer heard; not sealed",
				(unsigned long long)in->ino, WFS_SEAL_FULL_BYTES >> 20);
		ret = -ENOSPC;
		told = true;
		filled = true;
	}
	if (ret == 0 && wfs_version_declared_wrong(v))
		WFS_LOG_LIMITED(WFS_LOG_WARN, "inode %llu: its writer declared a digest its bytes do not have: "
				"sealed with the digest of the bytes", (unsigned long long)in->ino);
	wfs_crashpoint("seal.after-digest");
	wfs_delay("seal.after-digest"); /* test-only: a seal slow between its hash and its publish */

	wfs_lock(&fs->lock);
	if (filled)
		wfs_seal_store_filled(fs); /* the others being written now may have lost writes too */
	if (ret == -EBUSY && wfs_version_untouched_copy(v)) {
		/* A writable shared mapping of a sealed file that has written nothing, kept after its
		 * close (torch.from_file(shared=True), often for a whole run): the name keeps its content
		 * and its readers their passthrough, as for a writable open that writes nothing. What
		 * the mapping writes later stays in its copy (integrity.md). */
		wfs_version_put(v);
		wfs_seal_abandon(fs, in);
		return 0;
	}
	if (ret == -EBUSY) {
		/* Still written through a mapping that outlived its close (version.h): not sealed now,
		 * but when the mapping goes (mapped.h). Reads serve the version meanwhile. */
		wfs_version_seal_cancel(v);
		if (wfs_mapped_add(fs, in))
			wfs_log(WFS_LOG_ERR, "inode %llu: closed while mapped for writing, and no memory to "
				"note it: sealed at the next close or the unmount", (unsigned long long)in->ino);
		wfs_version_put(v);
		pthread_cond_broadcast(&fs->seal_done);
		return 0;
	}
	if (ret == 0 && wfs_version_same_as_base(v, &d) && !wfs_version_touched(v)) {
		/* Opened for writing and nothing written (a writable shared mapping that was only
		 * read, as torch.from_file(shared=True) makes of a tensor file): the name keeps its
		 * content and its times, as on ext4; no seal is counted. A copy whose bytes came back
		 * the same after writes is sealed as usual: its mtime moves, as ext4's would. (An
		 * unchanged copy's digest is its base's: wfs_version_unchanged() needs no asking.) */
		wfs_version_put(v);
		wfs_seal_abandon(fs, in);
		return 0;
	}
	/* A size that does not fit the dtype/shape attributes is refused where close(2) can say so,
	 * before anything is published. At release nobody hears the error: refusing would lose the
	 * bytes, so they are sealed and the mismatch is logged. Empty and never written is the state
	 * before the bytes (a file created, its xattrs set, closed by a client that writes it next). */
	if (ret == 0 && !unwritten && wfs_seal_fits(fs, in->ino, size, NULL, NULL, 0, true,
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

	if (ret == 0) {
		ret = wfs_version_publish(v, &d, stored, fs->opt.dedup_verify, durable, &existed);
	} else {
		wfs_version_free_kernel_bytes(v);
		wfs_version_discard(v);
	}
	/* A copy this seal hashed is good (one published on a declaration is not until the checker
	 * says so): its file's identity, taken once its tmp name is gone (below). */
	linked = publishing && ret == 0 && !existed && !wfs_version_trusted(v);

	wfs_crashpoint("seal.before-commit");
	wfs_delay("seal.before-commit"); /* test-only: a kill lands between the publish and the record */
	wfs_lock(&fs->lock);
	/* A seal that a caller waits for and that is to be durable (large, or fsync'd) is committed at
	 * once and alone (the batch before it first), so a failed commit fails this seal and nothing
	 * else. The others join the batch, like a rename: committed within WFS_COMMIT_INTERVAL_MS. */
	alone = (reported || kernel) && (durable || asked);
	if (ret == 0 && alone)
		ret = wfs_commit_now(fs);
	if (ret == 0) {
		/* cp -a and tar set the times on the open file before closing it: keep them. */
		struct stat vs = {0};
		unsigned have = wfs_version_stat(v, &vs);

		mtime = vs.st_mtim;
		if (!(have & WFS_VERSION_MTIME))
			clock_gettime(CLOCK_REALTIME, &mtime);
		changed = vs.st_ctim;
		bool have_changed = have & WFS_VERSION_CTIME;
		/* Made durable below without fs->lock (the WAL's fdatasync). */
		/* Published on its writer's word: the catalog says so until it is checked, so that a
		 * restart checks it too, whatever -o verify says (check.h). */
		trusted = !existed && wfs_version_trusted(v);
		ret = wfs_catalog_set_content(fs->catalog, in->ino, &d, size, &mtime, have_changed ? &changed : NULL,
					      trusted ? WFS_CONTENT_DECLARED : 0, &old, &after);
		if (ret == 0)
			wfs_inode_attr_note(fs, &after); /* what closing.c compares with what was told */
		if (ret == 0 && alone && (ret = wfs_commit_now(fs)) != 0)
			wfs_catalog_rollback(fs->catalog);
	}
	/* Recorded (committed, or in the batch a successor replays): a successor needs the bytes no
	 * more (version.h). Their tmp name goes before the object's identity is taken: the unlink
	 * moves the linked file's ctime. */
	if (ret == 0)
		wfs_version_let_go(v);
	if (publishing) {
		/* Linked (or found stored): the next seal of this content may ask. */
		if (ret == 0 && linked && wfs_store_object_stat(fs->store, &d, &linked_st) == 0)
			wfs_check_mark_good(fs, &d, &linked_st);
		wfs_object_set_publishing(o, false);
		pthread_cond_broadcast(&fs->seal_done);
	}
	if (ret == 0)
		wfs_crashpoint("seal.after-commit");
	if (ret == 0) {
		if (!durable && !existed && fs->opt.sync)
			wfs_commit_unsynced(fs, &d, size); /* its object, published unsynced: the group sync's */
		in->sealed = true;
		in->digest = d;
		if (size > 0) /* the bytes its claim missed (or others): claims waiting look again */
			wfs_object_expect_end(fs, &in->expecting);
		fs->counters->seals++;
		fs->counters->published_copies += wfs_version_published_copy(v);
		if (existed) {
			fs->counters->dedup_hits++;
		} else {
			if (trusted) {
				/* Published on its writer's word: read and checked before any open uses it. */
				fs->counters->seals_declared++;
				wfs_check_soon(fs, &d);
			}
			fs->counters->objects_published++;
			fs->counters->bytes_published += size;
			if (size > fs->largest_object)
				fs->largest_object = size;
		}
	} else if (!told) {
		log_seal_error(in, ret, reported);
	}
	if (ret == -ENOSPC || ret == -EDQUOT)
		wfs_object_make_room(fs, UINT64_MAX); /* a write lost to retained objects: its retry finds room */
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
		fs->counters->seals_synced += ret == 0;
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

/* Remove @in's names if it never held bytes: never sealed, or (@killed) a tensor file left empty. */
static void remove_unfilled(struct wfs_fs *fs, struct wfs_inode *in, bool killed, struct wfs_news *news)
{
	struct wfs_attr a;
	uint64_t declared;
	int ret;

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

void wfs_seal_writer_gone(struct wfs_fs *fs, struct wfs_inode *in, bool killed, struct wfs_news *news)
{
	news->ino = in->ino;
	news->inval = true;
	if (in->writer)
		return;
	wfs_object_expect_end(fs, &in->expecting); /* its bytes are not coming */
	remove_unfilled(fs, in, killed, news);
}

void wfs_seal_writer_doomed(struct wfs_fs *fs, struct wfs_inode *in, struct wfs_news *news)
{
	news->ino = in->ino;
	news->inval = true;
	wfs_object_expect_end(fs, &in->expecting);
	remove_unfilled(fs, in, true, news);
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

void wfs_seal_set_mtime(struct wfs_fs *fs, uint64_t ino, const struct timespec *mtime)
{
	struct wfs_inode *in = wfs_inode_find(fs, ino);

	if (in && in->writer)
		wfs_version_set_mtime(in->writer, mtime);
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
		  size_t len, bool written, const char *what)
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
	 * a write(2), which it heard), not the shape. */
	WFS_LOG_LIMITED(WFS_LOG_WARN, "inode %llu (find MNT -inum %llu): %s: shape %.*s x %.*s (%d bytes) "
			"does not make the file's %llu bytes%s", (unsigned long long)ino, (unsigned long long)ino, what,
			(int)(t.shape_len < 96 ? t.shape_len : 96), t.shape, (int)t.dtype_len, t.dtype, t.bytes,
			(unsigned long long)size,
			written && ret == 0 && size < bytes ? " (cut short: a write that failed, ENOSPC for one, a "
							      "writer that stopped early, or other bytes written over "
							      "the tensor)" : "");
	return -EINVAL;
}

int wfs_seal_check_xattr(struct wfs_fs *fs, uint64_t ino, const char *name, const char *value, size_t len)
{
	bool is_dtype = strcmp(name, WFS_XATTR_DTYPE) == 0;
	uint64_t elements;
	struct wfs_attr a;
	int ret;

	/* Longer values cannot be valid, and wfs_seal_fits() reads them back into buffers this big. */
	if (len > (is_dtype ? WFS_SEAL_DTYPE_MAX : WFS_SEAL_SHAPE_MAX) ||
	    (is_dtype ? wfs_dtype_size(value, len) < 0 : wfs_shape_elements(value, len, &elements) < 0)) {
		WFS_LOG_LIMITED(WFS_LOG_WARN, "inode %llu: %s=\"%.*s\" refused: %s", (unsigned long long)ino, name,
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
	return wfs_seal_fits(fs, ino, a.size, name, value, len, false,
			     is_dtype ? WFS_XATTR_DTYPE " refused" : WFS_XATTR_SHAPE " refused");
}
