/*
 * Versions: the bytes of a name while they are being written, and their seal into an object.
 *
 * States of a version, all under its lock:
 *   open    writes and reads allowed;
 *   frozen  digest computed, publish in progress: writes get -EAGAIN, reads still served;
 *   done    published or discarded: reads and writes get -EAGAIN.
 * A caller that gets -EAGAIN waits for the seal (fs->sealed) and starts over from the inode.
 *
 * Where the bytes are: a version up to VERSION_MEM_MAX bytes lives in memory, so a small file whose
 * content is already stored (the common case when ranks and restarts write the same weights) never
 * creates a tmp inode at all; creating and deleting tens of thousands of inodes is what a
 * filesystem's allocator is slowest at. A version that grows past it moves to a tmp file.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon.h"
#include "dtype.h"
#include "fault.h"
#include "log.h"
#include "weightfs.h"

#define VERSION_MEM_MAX (1u << 20) /* bytes; one FUSE write request */

void wfs_version_get(struct wfs_version *v)
{
	__atomic_add_fetch(&v->refs, 1, __ATOMIC_RELAXED);
}

void wfs_version_put(struct wfs_version *v)
{
	if (__atomic_sub_fetch(&v->refs, 1, __ATOMIC_ACQ_REL))
		return;
	if (v->tmp.fd >= 0)
		close(v->tmp.fd); /* tmp name, if any, is removed by the seal or discard that owned it */
	free(v->mem);
	wfs_hasher_release(&v->hasher);
	pthread_mutex_destroy(&v->lock);
	free(v);
}

/* Copy @len bytes at @off of @src to the same offset of @dst. Returns 0 or -errno. */
static int copy_range(int src, int dst, off_t off, off_t len)
{
	loff_t in_off = off, out_off = off;

	while (len > 0) {
		ssize_t n = copy_file_range(src, &in_off, dst, &out_off, (size_t)len, 0);

		if (n < 0 && (errno == EXDEV || errno == EOPNOTSUPP || errno == ENOSYS || errno == EINVAL)) {
			char buf[1 << 16];

			n = pread(src, buf, sizeof(buf) < (size_t)len ? sizeof(buf) : (size_t)len, in_off);
			if (n > 0 && pwrite(dst, buf, (size_t)n, out_off) != n)
				n = -1;
			if (n > 0) {
				in_off += n;
				out_off += n;
			}
		}
		if (n < 0)
			return errno ? -errno : -EIO;
		if (n == 0)
			return -EIO; /* the object is shorter than it was a moment ago */
		len -= n;
	}
	return 0;
}

/*
 * Copy all of object @d into the empty tmp file @fd: data, not holes. A reflink (FICLONE: XFS, btrfs)
 * shares the extents and copies nothing; otherwise only the data extents (SEEK_DATA/SEEK_HOLE) are
 * copied, so a sparse tensor's new version costs what it holds, not its logical size. Returns the
 * object's size in bytes, or -errno.
 */
static int64_t copy_object(struct wfs_fs *fs, const struct wfs_digest *d, int fd)
{
	int src = wfs_store_object_open(fs->store, d, 0);
	struct stat st;
	off_t data = 0, hole;
	int64_t ret = 0;

	if (src < 0)
		return src == -ENOENT ? -EIO : src;
	if (fstat(src, &st) < 0) {
		ret = -errno;
		goto out;
	}
	if (ioctl(fd, FICLONE, src) == 0) {
		ret = st.st_size;
		goto out;
	}
	while (data < st.st_size) {
		data = lseek(src, data, SEEK_DATA);
		if (data < 0 && errno == ENXIO)
			break; /* only a hole is left */
		hole = data < 0 ? st.st_size : lseek(src, data, SEEK_HOLE);
		if (data < 0 || hole < 0) { /* no SEEK_DATA here: all of it is data */
			data = 0;
			hole = st.st_size;
		}
		ret = copy_range(src, fd, data, hole - data);
		if (ret)
			goto out;
		data = hole;
	}
	ret = ftruncate(fd, st.st_size) < 0 ? -errno : st.st_size; /* a trailing hole */
out:
	close(src);
	return ret;
}

static struct wfs_version *version_new(int *err)
{
	struct wfs_version *v = calloc(1, sizeof(*v));

	if (!v) {
		*err = -ENOMEM;
		return NULL;
	}
	pthread_mutex_init(&v->lock, NULL);
	v->refs = 1;
	v->in_order = true;
	v->tmp.fd = -1;
	*err = wfs_hasher_init(&v->hasher);
	if (*err) {
		wfs_version_put(v);
		return NULL;
	}
	return v;
}

struct wfs_version *wfs_version_writer(struct wfs_fs *fs, fuse_req_t req, struct wfs_inode *in, bool truncate,
				       int *err)
{
	bool base_checked = false;
	struct wfs_version *v;
	int64_t copied;

	for (;;) {
		v = in->writer;
		if (!v && !truncate && in->sealed && !base_checked) {
			/* A new version starts as a copy of the sealed bytes: they must be right. */
			struct wfs_object *o = wfs_object_pin(fs, &in->digest);
			int ret = o ? wfs_verify_object(fs, o) : -ENOMEM; /* may drop fs->lock */

			if (o)
				wfs_object_unpin(fs, req, o);
			if (ret) {
				*err = ret;
				return NULL;
			}
			base_checked = true;
			continue; /* another writer may have started meanwhile */
		}
		if (!v)
			break;
		if (!__atomic_load_n(&v->frozen, __ATOMIC_ACQUIRE)) {
			wfs_version_get(v);
			if (truncate) {
				int ret = wfs_version_truncate(fs, v, 0);

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
		pthread_cond_wait(&fs->sealed, &fs->lock);
	}

	v = version_new(err);
	if (!v)
		return NULL;
	in->writer = v; /* the inode's reference */
	in->cache_valid = false;
	wfs_version_get(v); /* the caller's */
	if (truncate || !in->sealed)
		return v;

	/* A copy of the sealed bytes: other users of @in wait on the version lock, not on fs->lock. */
	v->has_base = true;
	v->base = in->digest;
	v->in_order = false;
	pthread_mutex_lock(&v->lock);
	pthread_mutex_unlock(&fs->lock);
	copied = wfs_store_tmp_create(fs->store, &v->tmp);
	if (copied == 0)
		copied = copy_object(fs, &v->base, v->tmp.fd);
	if (copied < 0) {
		/* Users that found it meanwhile get -EAGAIN and start over. */
		v->frozen = true;
		v->done = true;
		wfs_store_tmp_discard(fs->store, &v->tmp);
	} else {
		v->size = (uint64_t)copied;
	}
	pthread_mutex_unlock(&v->lock);
	pthread_mutex_lock(&fs->lock);
	if (copied < 0) {
		*err = (int)copied;
		in->writer = NULL;
		wfs_version_put(v);
		wfs_version_put(v);
		pthread_cond_broadcast(&fs->sealed);
		return NULL;
	}
	return v;
}

/* Move the in-memory bytes to a tmp file (version lock held). Returns 0 or -errno. */
static int spill(struct wfs_fs *fs, struct wfs_version *v)
{
	size_t done = 0;
	int ret;

	ret = wfs_store_tmp_create(fs->store, &v->tmp);
	if (ret)
		return ret;
	while (done < v->size) {
		ssize_t n = pwrite(v->tmp.fd, v->mem + done, v->size - done, (off_t)done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			ret = n < 0 ? -errno : -EIO;
			wfs_store_tmp_discard(fs->store, &v->tmp);
			return ret;
		}
		done += (size_t)n;
	}
	free(v->mem);
	v->mem = NULL;
	v->mem_cap = 0;
	return 0;
}

/* Make the in-memory version hold @size bytes, zero-filled beyond the old size. */
static int mem_resize(struct wfs_version *v, size_t size)
{
	if (size > v->mem_cap) {
		size_t cap = v->mem_cap ? v->mem_cap : 4096;
		char *p;

		while (cap < size)
			cap *= 2;
		p = realloc(v->mem, cap);
		if (!p)
			return -ENOMEM;
		v->mem = p;
		v->mem_cap = cap;
	}
	if (size > v->size)
		memset(v->mem + v->size, 0, size - v->size);
	return 0;
}

static ssize_t write_locked(struct wfs_fs *fs, struct wfs_version *v, const void *buf, size_t len,
			    off_t off)
{
	uint64_t end = (uint64_t)off + len;
	size_t done = 0;
	int ret;

	if (len == 0)
		return 0;
	if (v->tmp.fd < 0 && end <= VERSION_MEM_MAX) {
		ret = mem_resize(v, end > v->size ? (size_t)end : v->size);
		if (ret)
			return ret;
		memcpy(v->mem + off, buf, len);
		return (ssize_t)len;
	}
	if (v->tmp.fd < 0) {
		ret = spill(fs, v);
		if (ret)
			return ret;
	}
	ret = wfs_fault("version.pwrite");
	if (ret)
		return ret;
	while (done < len) {
		ssize_t n = pwrite(v->tmp.fd, (const char *)buf + done, len - done, off + (off_t)done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		done += (size_t)n;
	}
	wfs_crashpoint("version.after-pwrite");
	return (ssize_t)len;
}

/*
 * A full store filesystem need not stop a write whose content is already stored (a restart writing
 * the same weights again, another rank): when a write that extends the hashed prefix of a version
 * with no base fails with ENOSPC, the bytes so far are dropped and later writes, in order, are only
 * hashed. At the seal the digest is known: stored already, the name gets that object (no space was
 * needed); otherwise close(2) fails with ENOSPC and nothing is left. Reads of such a version fail
 * with EIO (its bytes are gone). Version lock held. Returns true when @v now keeps hashing.
 */
static bool keep_hashing(struct wfs_fs *fs, struct wfs_version *v, ssize_t err, off_t off)
{
	if ((err != -ENOSPC && err != -EDQUOT) || !v->in_order || v->has_base || (uint64_t)off != v->hasher.bytes)
		return false;
	wfs_store_tmp_discard(fs->store, &v->tmp); /* give the space back: these bytes are not needed */
	free(v->mem);
	v->mem = NULL;
	v->mem_cap = 0;
	v->hash_only = true;
	return true;
}

ssize_t wfs_version_write(struct wfs_fs *fs, struct wfs_version *v, const void *buf, size_t len,
			  off_t off)
{
	ssize_t ret;

	pthread_mutex_lock(&v->lock);
	if (v->frozen || v->done) {
		ret = -EAGAIN;
		goto out;
	}
	if (v->hash_only)
		ret = v->in_order && (uint64_t)off == v->hasher.bytes ? (ssize_t)len : -ENOSPC;
	else
		ret = write_locked(fs, v, buf, len, off);
	if (ret < 0 && keep_hashing(fs, v, ret, off))
		ret = (ssize_t)len;
	if (ret < 0) {
		if (!v->error)
			v->error = (int)ret;
		goto out;
	}
	/* Hash in place when the write extends the hashed prefix; otherwise rehash at seal. */
	if (v->in_order && (uint64_t)off == v->hasher.bytes)
		wfs_hasher_update(&v->hasher, buf, len);
	else
		v->in_order = false;
	if ((uint64_t)off + len > v->size)
		v->size = (uint64_t)off + len;
	v->modified = true;
	v->written = true;
	v->mtime_set = false; /* a write after utimes moves mtime again */
out:
	pthread_mutex_unlock(&v->lock);
	return ret;
}

ssize_t wfs_version_read(struct wfs_version *v, void *buf, size_t len, off_t off)
{
	ssize_t ret;

	pthread_mutex_lock(&v->lock);
	if (v->done) {
		ret = -EAGAIN;
	} else if (v->hash_only) {
		ret = -EIO; /* the store filled up: only the digest of these bytes was kept */
	} else if ((uint64_t)off >= v->size) {
		ret = 0;
	} else {
		if ((uint64_t)off + len > v->size)
			len = (size_t)(v->size - (uint64_t)off);
		if (v->tmp.fd < 0) {
			memcpy(buf, v->mem + off, len);
			ret = (ssize_t)len;
		} else {
			ret = pread(v->tmp.fd, buf, len, off);
			if (ret < 0)
				ret = -errno;
		}
	}
	pthread_mutex_unlock(&v->lock);
	return ret;
}

/*
 * May @v's size change now (version lock held)? 0, -EAGAIN (being sealed or done: start over from
 * the inode), or -ENOSPC (only its digest is kept, keep_hashing(): only writes in order go on).
 */
static int changeable(const struct wfs_version *v)
{
	if (v->frozen || v->done)
		return -EAGAIN;
	return v->hash_only ? -ENOSPC : 0;
}

int wfs_version_truncate(struct wfs_fs *fs, struct wfs_version *v, uint64_t size)
{
	int ret = 0;

	pthread_mutex_lock(&v->lock);
	ret = changeable(v);
	if (ret)
		goto out;
	if (v->tmp.fd < 0 && size > VERSION_MEM_MAX)
		ret = spill(fs, v);
	if (ret)
		goto out;
	if (v->tmp.fd < 0)
		ret = mem_resize(v, (size_t)size);
	else if (ftruncate(v->tmp.fd, (off_t)size) < 0)
		ret = -errno;
	if (ret)
		goto out;
	if (size == 0) {
		wfs_hasher_reset(&v->hasher);
		v->in_order = true;
	} else if (size < v->hasher.bytes) {
		v->in_order = false;
	}
	v->size = size;
	v->modified = true;
out:
	pthread_mutex_unlock(&v->lock);
	return ret;
}

int wfs_version_fallocate(struct wfs_fs *fs, struct wfs_version *v, int mode, uint64_t off, uint64_t len)
{
	uint64_t end = off + len;
	int ret = 0;

	if (mode & ~FALLOC_FL_KEEP_SIZE)
		return -EOPNOTSUPP;
	if (len == 0 || end < off || end > (uint64_t)INT64_MAX)
		return -EINVAL;
	pthread_mutex_lock(&v->lock);
	ret = changeable(v);
	if (ret)
		goto out;
	if (v->tmp.fd < 0 && end > VERSION_MEM_MAX)
		ret = spill(fs, v);
	if (ret)
		goto out;
	if (v->tmp.fd < 0) {
		/* Memory is the reservation: mem_resize() zero-fills from the old size up. */
		size_t keep = (size_t)v->size;

		ret = mem_resize(v, (size_t)end > keep ? (size_t)end : keep);
		if (ret)
			goto out;
	} else if (fallocate(v->tmp.fd, mode, (off_t)off, (off_t)len) < 0) {
		ret = -errno;
		if (ret == -EOPNOTSUPP && mode == 0) /* a tmp filesystem without fallocate */
			ret = -posix_fallocate(v->tmp.fd, (off_t)off, (off_t)len);
		if (ret)
			goto out;
	}
	if (end > v->size) {
		if (mode & FALLOC_FL_KEEP_SIZE) {
			v->reserved_past_eof = v->tmp.fd >= 0;
		} else {
			v->size = end; /* zeros: the hashed prefix stays, the seal hashes the rest */
			v->modified = true;
		}
	}
out:
	pthread_mutex_unlock(&v->lock);
	return ret;
}

uint64_t wfs_version_size(struct wfs_version *v)
{
	uint64_t size;

	pthread_mutex_lock(&v->lock);
	size = v->size;
	pthread_mutex_unlock(&v->lock);
	return size;
}

/* Digest of the version's bytes (version lock held). Returns 0 or -errno. */
static int version_digest(struct wfs_version *v, struct wfs_digest *d)
{
	uint64_t bytes;
	int ret;

	if (v->has_base && !v->modified) {
		*d = v->base;
		return 0;
	}
	if (v->in_order && v->hasher.bytes == v->size) {
		wfs_hasher_digest(&v->hasher, d);
		return 0;
	}
	if (v->tmp.fd < 0) {
		wfs_digest_buf(v->mem, v->size, d);
		return 0;
	}
	ret = wfs_digest_fd(v->tmp.fd, d, &bytes);
	if (ret == 0 && bytes != v->size)
		ret = -EIO;
	return ret;
}

/*
 * -o dedup_verify=bytes: before dropping a version whose digest is already stored, compare the bytes.
 * XXH3 is not collision-resistant; this is for stores whose writers are not all trusted, or the
 * cautious. Version lock held. Returns 0 when equal, -EIO (logged) when not, or -errno.
 */
static int compare_stored(struct wfs_fs *fs, struct wfs_version *v, const struct wfs_digest *d)
{
	enum { CHUNK = 1 << 20 };
	char *a = NULL, *b = NULL, hex[WFS_DIGEST_HEX_CHARS + 1];
	uint64_t off = 0;
	int fd, ret = 0;

	fd = wfs_store_object_open(fs->store, d, 0);
	if (fd < 0)
		return fd;
	a = malloc(CHUNK);
	b = malloc(CHUNK);
	if (!a || !b) {
		ret = -ENOMEM;
		goto out;
	}
	while (ret == 0 && off <= v->size) {
		size_t want = v->size - off < CHUNK ? (size_t)(v->size - off) : CHUNK;
		ssize_t n = pread(fd, b, want + 1, (off_t)off); /* +1: the stored copy must end here too */
		ssize_t m = (ssize_t)want;

		if (v->tmp.fd < 0)
			memcpy(a, v->mem + off, want);
		else
			m = pread(v->tmp.fd, a, want, (off_t)off);
		if (n < 0 || m < 0)
			ret = -errno;
		else if ((size_t)n != want || (size_t)m != want || memcmp(a, b, want) != 0)
			ret = -EILSEQ;
		if (want == 0)
			break;
		off += want;
	}
	if (ret == -EILSEQ) {
		wfs_digest_to_hex(d, hex);
		wfs_log(WFS_LOG_ERR, "object %s: same digest, different bytes (an XXH3 collision): refusing to "
			"store them under that digest", hex);
		ret = -EIO;
	}
out:
	free(a);
	free(b);
	close(fd);
	return ret;
}

static void log_seal_error(struct wfs_inode *in, int err)
{
	wfs_log(err == -ENOSPC || err == -EDQUOT ? WFS_LOG_WARN : WFS_LOG_ERR,
		"inode %llu (find MNT -inum %llu): seal failed: %s; %s", (unsigned long long)in->ino,
		(unsigned long long)in->ino, strerror(-err),
		in->sealed ? "the name keeps its previous content"
			   : "the new name is removed");
}

int wfs_version_seal(struct wfs_fs *fs, fuse_req_t req, struct wfs_inode *in, bool reported)
{
	struct wfs_version *v = in->writer;
	struct wfs_object *o = NULL;
	struct wfs_attr old, now;
	struct wfs_digest d;
	struct timespec mtime;
	bool existed = false, unwritten;
	uint64_t size = 0;
	int ret;

	wfs_version_get(v);
	pthread_mutex_unlock(&fs->lock);

	pthread_mutex_lock(&v->lock);
	ret = v->error;
	if (ret == 0)
		ret = version_digest(v, &d);
	size = v->size;
	unwritten = size == 0 && !v->written;
	v->frozen = true;
	pthread_mutex_unlock(&v->lock);
	wfs_crashpoint("seal.after-digest");

	pthread_mutex_lock(&fs->lock);
	/* A size that does not fit the dtype/shape attributes is refused where close(2) can say so,
	 * before anything is published. At release nobody hears the error: refusing would lose the
	 * bytes, so they are sealed and the mismatch is logged. Empty and never written is the state
	 * before the bytes (a file created, its xattrs set, closed by a client that writes it next). */
	if (ret == 0 && !unwritten && wfs_tensor_fits(fs, in->ino, size, NULL, NULL, 0,
					reported ? "seal refused" : "sealed at release all the same") &&
	    reported)
		ret = -EINVAL;
	if (ret == 0) {
		o = wfs_object_pin(fs, &d); /* keeps the object from being deleted until committed */
		if (!o)
			ret = -ENOMEM;
	}
	/* A dedup hit hands the name the stored copy: it must hold these bytes. A bad one is
	 * quarantined here, which leaves the way free to publish ours — the store heals. */
	if (ret == 0 && !(v->has_base && !v->modified) && wfs_store_object_exists(fs->store, &d))
		wfs_verify_object(fs, o);
	pthread_mutex_unlock(&fs->lock);

	pthread_mutex_lock(&v->lock);
	if (ret == 0 && ((v->has_base && !v->modified) || wfs_store_object_exists(fs->store, &d))) {
		existed = true; /* already stored: this copy is not needed */
		if (fs->opt.dedup_verify && !(v->has_base && !v->modified))
			ret = v->hash_only ? -ENOSPC : compare_stored(fs, v, &d);
	} else if (ret == 0 && v->hash_only) {
		ret = -ENOSPC; /* new content, and no room was left to keep it */
	} else if (ret == 0 && v->tmp.fd < 0)
		ret = spill(fs, v);
	/* Blocks reserved past the end would stay with the object: ftruncate frees them. */
	if (ret == 0 && !existed && v->reserved_past_eof && ftruncate(v->tmp.fd, (off_t)v->size) < 0)
		ret = -errno;
	if (ret == 0 && !existed)
		ret = wfs_store_publish(fs->store, &v->tmp, &d, &existed);
	wfs_store_tmp_discard(fs->store, &v->tmp);
	free(v->mem);
	v->mem = NULL;
	v->done = true;
	pthread_mutex_unlock(&v->lock);

	wfs_crashpoint("seal.before-commit");
	pthread_mutex_lock(&fs->lock);
	if (ret == 0) {
		/* cp -a and tar set the times on the open file before closing it: keep them. */
		if (v->mtime_set)
			mtime = v->mtime;
		else
			clock_gettime(CLOCK_REALTIME, &mtime);
		/* Committed here, made durable below without fs->lock (the WAL's fdatasync). */
		ret = wfs_catalog_set_content(fs->catalog, in->ino, &d, size, &mtime, false, &old, &now);
	}
	if (ret == 0)
		wfs_crashpoint("seal.after-commit");
	if (ret == 0) {
		in->sealed = true;
		in->digest = d;
		fs->counters.seals++;
		if (existed) {
			fs->counters.dedup_hits++;
		} else {
			wfs_verify_mark_good(fs, &d); /* its bytes are the ones hashed above */
			fs->counters.objects_published++;
			fs->counters.bytes_published += size;
		}
	} else {
		log_seal_error(in, ret);
	}
	in->writer = NULL;
	in->cache_valid = false;
	wfs_version_put(v); /* the inode's reference */
	wfs_version_put(v); /* ours */
	pthread_cond_broadcast(&fs->sealed);
	if (o)
		wfs_object_unpin(fs, req, o); /* deletes the object again if the commit failed */
	if (ret == 0 && old.sealed && !wfs_digest_equal(&old.digest, &d))
		wfs_object_maybe_delete(fs, &old.digest);
	/*
	 * Durable before close(2) or truncate(2) returns where a caller waits (-o sync): the WAL's
	 * fdatasync, with fs->lock dropped, so that other opens, lookups and seals do not queue behind
	 * the disk (an open beside four sealing writers waited 200 ms for their syncs under the lock).
	 * A seal at release has no caller waiting: it becomes durable with the next sync, and an
	 * empty file's create costs no disk flush.
	 */
	if (ret == 0 && fs->opt.sync && reported) {
		pthread_mutex_unlock(&fs->lock);
		ret = wfs_catalog_wal_sync(fs->catalog);
		pthread_mutex_lock(&fs->lock);
		if (ret)
			wfs_log(WFS_LOG_ERR, "inode %llu: the seal's commit could not be made durable: %s",
				(unsigned long long)in->ino, strerror(-ret));
	}
	return ret;
}

int wfs_tensor_fits(struct wfs_fs *fs, uint64_t ino, uint64_t size, const char *name, const char *value,
		    size_t len, const char *what)
{
	char dtype_buf[64], shape_buf[1024];
	const char *dtype = dtype_buf, *shape = shape_buf;
	size_t dtype_len, shape_len;
	uint64_t elements;
	int bytes;

	if (name && strcmp(name, WFS_XATTR_DTYPE) == 0) {
		dtype = value;
		dtype_len = len;
	} else if (wfs_catalog_xattr_get(fs->catalog, ino, WFS_XATTR_DTYPE, dtype_buf, sizeof(dtype_buf),
					 &dtype_len)) {
		return 0; /* not set (or longer than any valid value): nothing to hold the size to */
	}
	if (name && strcmp(name, WFS_XATTR_SHAPE) == 0) {
		shape = value;
		shape_len = len;
	} else if (wfs_catalog_xattr_get(fs->catalog, ino, WFS_XATTR_SHAPE, shape_buf, sizeof(shape_buf),
					 &shape_len)) {
		return 0;
	}
	bytes = wfs_dtype_size(dtype, dtype_len);
	if (bytes < 0 || wfs_shape_elements(shape, shape_len, &elements) < 0)
		return 0; /* stored before validation existed */
	if (elements <= size / (uint64_t)bytes && elements * (uint64_t)bytes == size)
		return 0;
	wfs_log(WFS_LOG_WARN, "inode %llu (find MNT -inum %llu): %s: shape %.*s x %.*s (%d bytes) "
		"does not make the file's %llu bytes", (unsigned long long)ino, (unsigned long long)ino, what,
		(int)(shape_len < 96 ? shape_len : 96), shape, (int)dtype_len, dtype, bytes,
		(unsigned long long)size);
	return -EINVAL;
}

void wfs_version_abandon(struct wfs_fs *fs, struct wfs_inode *in)
{
	struct wfs_version *v = in->writer;

	pthread_mutex_lock(&v->lock);
	v->frozen = true;
	v->done = true;
	wfs_store_tmp_discard(fs->store, &v->tmp);
	free(v->mem);
	v->mem = NULL;
	pthread_mutex_unlock(&v->lock);
	in->writer = NULL;
	in->cache_valid = false;
	wfs_version_put(v);
	pthread_cond_broadcast(&fs->sealed);
}

/*
 * May a claim replace what @in holds now? Only nothing: no content, no bytes written, and no reader
 * holding the current (empty) object as its passthrough backing file. With @freeze, an empty
 * version being written is frozen (writes wait for the claim, then go to a new version) and
 * *@frozen says so. fs->lock held; waits for a seal in progress.
 */
static int claim_target_empty(struct wfs_fs *fs, struct wfs_inode *in, bool freeze, bool *frozen)
{
	struct wfs_version *v;
	struct wfs_attr a;
	int ret;

	/* A seal in progress (an empty file's is at its release, after close(2) returned): wait. */
	while ((v = in->writer) != NULL && __atomic_load_n(&v->frozen, __ATOMIC_ACQUIRE))
		pthread_cond_wait(&fs->sealed, &fs->lock);
	if (in->npassthrough > 0)
		return -ETXTBSY;
	if (v) {
		/* The bytes being written are what the file holds now, whatever was sealed before. */
		pthread_mutex_lock(&v->lock);
		ret = v->written || v->size ? -EEXIST : 0;
		if (ret == 0 && freeze) {
			v->frozen = true;
			*frozen = true;
		}
		pthread_mutex_unlock(&v->lock);
		return ret;
	}
	ret = wfs_catalog_getattr(fs->catalog, in->ino, &a);
	if (ret)
		return ret;
	if (!S_ISREG(a.mode))
		return -EINVAL;
	return a.size ? -EEXIST : 0;
}

int wfs_version_claim(struct wfs_fs *fs, fuse_req_t req, struct wfs_inode *in, const struct wfs_digest *d)
{
	struct wfs_attr old, now;
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
		ret = wfs_verify_plausible(fs, o, &st); /* a stat, not a read: the first open checks it */
	if (ret == -ENOENT || ret == -EIO)
		ret = -ENODATA;
	if (ret == -ENODATA)
		fs->counters.claim_misses++;
	if (ret == 0) /* again, freezing an empty version: fs->lock may have been dropped, and a write
		       * must not land between this check and the commit */
		ret = claim_target_empty(fs, in, true, &frozen);
	if (ret == 0)
		ret = wfs_tensor_fits(fs, in->ino, (uint64_t)st.st_size, NULL, NULL, 0, "claim refused");
	if (ret == 0) {
		clock_gettime(CLOCK_REALTIME, &mtime);
		/* Not synced: the object is durable already, and the claimed name becomes durable with
		 * the next synced commit, like a rename (trainers claim a temp name, then rename it). */
		ret = wfs_catalog_set_content(fs->catalog, in->ino, d, (uint64_t)st.st_size, &mtime, false,
					      &old, &now);
	}
	if (ret == 0) {
		if (in->writer)
			wfs_version_abandon(fs, in); /* empty and unwritten: nothing is lost */
		in->sealed = true;
		in->digest = *d;
		in->cache_valid = false;
		fs->counters.claims++;
	} else if (frozen) {
		struct wfs_version *v = in->writer; /* the one frozen above: fs->lock held since */

		pthread_mutex_lock(&v->lock);
		v->frozen = false; /* as it was; writers waiting on fs->sealed go on with it */
		pthread_mutex_unlock(&v->lock);
		pthread_cond_broadcast(&fs->sealed);
	}
	wfs_object_unpin(fs, req, o);
	if (ret == 0 && old.sealed && !wfs_digest_equal(&old.digest, d))
		wfs_object_maybe_delete(fs, &old.digest); /* the empty object, when no other name has it */
	return ret;
}
