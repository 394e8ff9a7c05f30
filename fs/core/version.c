/* SPDX-License-Identifier: Apache-2.0 */
/* version.h: the bytes of a version being written (states drawn there). */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fault.h"
#include "keep.h"
#include "log.h"
#include "version.h"

struct wfs_version {
	pthread_mutex_t lock;
	unsigned refs;             /* atomic: the inode's writer reference, each user in flight one */
	unsigned writers;          /* (L) writable handles counting as its writers (seal.c) */
	bool refused;              /* (L) a close refused its size, @refused_size (wfs_version_refuse) */
	uint64_t refused_size;
	bool finished;             /* (L) a writer's close ended its writing cleanly (wfs_version_finish) */
	struct wfs_store *store;   /* borrowed: where the tmp file and the object go */
	struct wfs_tmpfile tmp;    /* (V) backing tmp file, fd -1 while the bytes fit in @mem */
	char *mem;                 /* (V) small versions live here: no tmp inode churn for dedup hits */
	size_t mem_cap;            /* (V) bytes allocated at @mem */
	int keep;                  /* (V) its record for a successor (keep.h), -1: none */
	bool mem_kept;             /* (V) @mem is the record's slot, not the heap's */
	bool frozen;               /* (V) FROZEN or DONE: writes wait, then go to a new version */
	bool sealing;              /* a seal owns it (wfs_version_seal_begin(), under fs->lock): writes
				    * and new writers wait from then on, before the freeze; atomic */
	bool done;                 /* (V) DONE: published or discarded, nothing more to read or write */
	uint64_t size;             /* (V) bytes; stored atomically (set_size()): wfs_version_size()
				    * reads it without the lock, which a seal holds while it hashes */
	struct wfs_hasher hasher;  /* (V) digest of bytes [0, hashed) when @in_order */
	bool in_order;             /* (V) every write so far extended the hashed prefix */
	bool hash_only;            /* (V) the store filled up: bytes hashed, not kept (keep_hashing);
				    * set once, read without the lock by wfs_version_dropped() */
	int error;                 /* (V) first write error (-errno); sealing fails with it */
	bool error_told;           /* (V) @error came from wfs_version_fail(): the caller reported it */
	bool modified;             /* (V) changed since it was started */
	bool written;              /* (V) data written (not only created or truncated); atomic */
	bool only_extended;        /* (V) the one write so far was a single byte past the end of an empty
				    * version (how numpy.memmap sizes a file before it maps it); atomic */
	pthread_mutex_t note_lock;  /* what handlers note for the seal under fs->lock, which must not wait
				    * for a seal's I/O (the version lock): @mtime_set, @mtime, @has_declared,
				    * @declared. Innermost: nothing is taken while it is held */
	bool mtime_set;            /* utimes after the last write: the seal keeps @mtime */
	struct timespec mtime;
	bool set_at_set;           /* a utimes was applied, last at @set_at (its own time: a change) */
	struct timespec set_at;    /* CLOCK_REALTIME */
	bool changed_set;          /* written, truncated or grown through the daemon, last at @changed */
	struct timespec changed;   /* CLOCK_REALTIME */
	bool has_base;             /* (V) started as a copy of object @base */
	struct wfs_digest base;
	uint64_t claim_size;       /* (V) bytes a claim put into the kernel-written file (claim_fill) */
	bool reserved_past_eof;    /* (V) fallocate(KEEP_SIZE) beyond @size: trimmed before publishing */
	bool kernel_writes;        /* (V) written through the kernel (passthrough) into @tmp: its size
				    * and bytes are the file's, rehashed at the seal; atomic */
	bool kernel;               /* set once with @kernel_writes, never cleared; atomic */
	bool durable_asked;        /* a writer called fsync(2): its seal waits for the disk; atomic */
	int size_fd;               /* O_RDONLY on the kernel-written file, for its size without the
				    * lock; -1 when none. Closed when the version is freed */
	struct timespec kernel_from; /* (V) the kernel-written file's mtime when the kernel got it:
				    * one that has not moved since was not written (wfs_version_touched) */
	bool copied_to_publish;    /* (V) the writers' file was still open for writing at the seal:
				    * a copy of it was published (settle()) */
	bool copy_if_mapped;       /* (V) a seal publishes a copy rather than wait for a writable
				    * mapping to go (wfs_version_copy_if_mapped()) */
	unsigned joins;            /* writable handles that joined as writers, ever; atomic */
	bool has_declared;         /* (note_lock) its writer declared the digest of its bytes */
	struct wfs_digest declared;
	bool trusted;              /* (V) FROZEN with the declared digest, its bytes not hashed; atomic */
	bool kept_past_publish;    /* (V) DONE, its bytes and record kept for a successor until the seal
				    * is recorded (wfs_version_let_go()) */
	bool declared_wrong;       /* (V) the bytes hashed at the freeze are not the declared digest;
				    * atomic */
};

/*
 * A new descriptor (@flags: O_RDONLY, O_WRONLY or O_RDWR) of the file open at @fd, an O_TMPFILE
 * included, through /proc/self/fd. Returns it (close-on-exec), or -errno.
 */
static int open_again(int fd, int flags)
{
	char proc[32];
	int again;

	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	again = open(proc, flags | O_CLOEXEC);
	return again < 0 ? -errno : again;
}

/* Let go of the in-memory bytes (version lock held, or the last reference). */
static void mem_free(struct wfs_version *v)
{
	if (!v->mem_kept)
		free(v->mem);
	v->mem = NULL;
	v->mem_cap = 0;
	v->mem_kept = false;
}

void wfs_version_get(struct wfs_version *v)
{
	__atomic_add_fetch(&v->refs, 1, __ATOMIC_RELAXED);
}

void wfs_version_put(struct wfs_version *v)
{
	unsigned left = __atomic_sub_fetch(&v->refs, 1, __ATOMIC_ACQ_REL);

	assert(left != (unsigned)-1);
	if (left)
		return;
	wfs_store_tmp_discard(v->store, &v->tmp); /* a named one (keep.h) too: nothing adopts it now */
	if (v->size_fd >= 0)
		close(v->size_fd);
	mem_free(v);
	wfs_keep_end(v->keep);
	wfs_hasher_release(&v->hasher);
	pthread_mutex_destroy(&v->note_lock);
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
static int64_t copy_object(struct wfs_store *store, const struct wfs_digest *d, int fd)
{
	int src = wfs_store_object_open(store, d, 0);
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

/* (version lock) Bytes or size changed through the daemon now: the time the seal and a stat give. */
static void note_changed(struct wfs_version *v)
{
	pthread_mutex_lock(&v->note_lock);
	v->mtime_set = false;
	clock_gettime(CLOCK_REALTIME, &v->changed);
	v->changed_set = true;
	pthread_mutex_unlock(&v->note_lock);
}

static void set_size(struct wfs_version *v, uint64_t size)
{
	__atomic_store_n(&v->size, size, __ATOMIC_RELEASE);
	wfs_keep_size(v->keep, size);
}

struct wfs_version *wfs_version_new(struct wfs_store *store, int *err)
{
	struct wfs_version *v = calloc(1, sizeof(*v));

	if (!v) {
		*err = -ENOMEM;
		return NULL;
	}
	pthread_mutex_init(&v->lock, NULL);
	pthread_mutex_init(&v->note_lock, NULL);
	v->refs = 1;
	v->store = store;
	v->in_order = true;
	v->tmp.fd = -1;
	v->size_fd = -1;
	v->keep = -1;
	*err = wfs_hasher_init(&v->hasher);
	if (*err) {
		wfs_version_put(v);
		return NULL;
	}
	return v;
}

int wfs_version_copy_base(struct wfs_version *v, const struct wfs_digest *base, struct wfs_lock *outer)
{
	int64_t copied;

	pthread_mutex_lock(&v->lock);
	assert(!v->frozen && v->size == 0 && v->tmp.fd < 0);
	mem_free(v);
	v->has_base = true;
	v->base = *base;
	v->in_order = false;
	wfs_unlock(outer);
	wfs_delay("version.copy"); /* test-only: a large file's copy */
	copied = v->keep >= 0 ? wfs_store_tmp_create_named(v->store, &v->tmp) : wfs_store_tmp_create(v->store, &v->tmp);
	if (copied == 0)
		copied = copy_object(v->store, &v->base, v->tmp.fd);
	if (copied < 0) {
		__atomic_store_n(&v->frozen, true, __ATOMIC_RELEASE);
		v->done = true;
		wfs_store_tmp_discard(v->store, &v->tmp);
	} else {
		set_size(v, (uint64_t)copied);
		wfs_keep_in_file(v->keep, v->tmp.name, false); /* FILLING until here: never adopted half */
	}
	pthread_mutex_unlock(&v->lock);
	wfs_lock(outer);
	return copied < 0 ? (int)copied : 0;
}

/*
 * Move the in-memory bytes to a tmp file (version lock held). @stays: they live there from now on
 * (a kept version's file is then named, for a successor); else the file is only published, and a
 * kept version's record still points at its slot, which holds the same bytes. Returns 0 or -errno.
 */
static int spill(struct wfs_version *v, bool stays)
{
	size_t done = 0;
	int ret;

	ret = stays && v->keep >= 0 ? wfs_store_tmp_create_named(v->store, &v->tmp)
				    : wfs_store_tmp_create(v->store, &v->tmp);
	if (ret)
		return ret;
	while (done < v->size) {
		ssize_t n = pwrite(v->tmp.fd, v->mem + done, v->size - done, (off_t)done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			ret = n < 0 ? -errno : -EIO;
			wfs_store_tmp_discard(v->store, &v->tmp);
			return ret;
		}
		done += (size_t)n;
	}
	if (stays)
		wfs_keep_in_file(v->keep, v->tmp.name, false);
	mem_free(v);
	return 0;
}

/* Make the in-memory version hold @size bytes, zero-filled beyond the old size. */
static int mem_resize(struct wfs_version *v, size_t size)
{
	if (size > v->mem_cap && !v->mem_kept) {
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

/*
 * A version written through the kernel: the size is the tmp file's (version lock held). Errors
 * leave the last known size.
 */
static void refresh(struct wfs_version *v)
{
	struct stat st;

	if (v->kernel_writes && v->tmp.fd >= 0 && fstat(v->tmp.fd, &st) == 0)
		set_size(v, (uint64_t)st.st_size);
}

static ssize_t write_locked(struct wfs_version *v, const void *buf, size_t len, off_t off)
{
	uint64_t end = (uint64_t)off + len;
	size_t done = 0;
	int ret;

	if (len == 0)
		return 0;
	if (v->tmp.fd < 0 && end <= WFS_VERSION_MEM_MAX) {
		ret = mem_resize(v, end > v->size ? (size_t)end : v->size);
		if (ret)
			return ret;
		memcpy(v->mem + off, buf, len);
		return (ssize_t)len;
	}
	if (v->tmp.fd < 0) {
		ret = spill(v, true);
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
static bool keep_hashing(struct wfs_version *v, ssize_t err, off_t off)
{
	if ((err != -ENOSPC && err != -EDQUOT) || !v->in_order || v->has_base || (uint64_t)off != v->hasher.bytes)
		return false;
	wfs_store_tmp_discard(v->store, &v->tmp); /* give the space back: these bytes are not needed */
	mem_free(v);
	wfs_keep_lost(v->keep); /* a successor cannot go on hashing: its writer hears EIO */
	__atomic_store_n(&v->hash_only, true, __ATOMIC_RELEASE);
	return true;
}

/*
 * Being sealed, FROZEN or DONE (version lock held): a write or size change must start over. The
 * flags are read one by one: GCC folds `v->frozen || v->done` into one 4-byte load, which reads
 * @sealing too, and a seal sets that without the version lock (a data race to TSan).
 */
static bool stopped(struct wfs_version *v)
{
	return wfs_version_frozen(v) || v->done;
}

ssize_t wfs_version_write(struct wfs_version *v, const void *buf, size_t len, off_t off)
{
	bool extends;
	ssize_t ret;

	pthread_mutex_lock(&v->lock);
	if (stopped(v)) {
		ret = -EAGAIN;
		goto out;
	}
	refresh(v);
	if (off == WFS_VERSION_AT_END)
		off = (off_t)v->size;
	if (v->hash_only)
		ret = v->in_order && (uint64_t)off == v->hasher.bytes ? (ssize_t)len : -ENOSPC;
	else
		ret = write_locked(v, buf, len, off);
	if (ret < 0 && keep_hashing(v, ret, off))
		ret = (ssize_t)len;
	if (ret < 0) {
		if (!v->error)
			v->error = (int)ret;
		wfs_keep_lost(v->keep); /* the error is in this process only */
		goto out;
	}
	/* Hash in place when the write extends the hashed prefix; otherwise rehash at seal. */
	if (v->in_order && (uint64_t)off == v->hasher.bytes)
		wfs_hasher_update(&v->hasher, buf, len);
	else
		v->in_order = false;
	/* numpy.memmap(mode='w+') sizes a new (or truncated) file by writing its last byte, then fills
	 * a mapping: that first write alone is not the tensor's data (wfs_version_has_data()). A byte
	 * appended to a file with content is (`echo -n x >> f` of a tensor must reach its size check
	 * at close(2), not at release where nobody hears it). */
	extends = !v->written && len == 1 && off > 0 && v->size == 0;
	if ((uint64_t)off + len > v->size)
		set_size(v, (uint64_t)off + len);
	v->modified = true;
	__atomic_store_n(&v->only_extended, extends, __ATOMIC_RELEASE);
	__atomic_store_n(&v->written, true, __ATOMIC_RELEASE);
	note_changed(v); /* a write after utimes moves mtime again */
out:
	pthread_mutex_unlock(&v->lock);
	return ret;
}

ssize_t wfs_version_read(struct wfs_version *v, void *buf, size_t len, off_t off)
{
	ssize_t ret;

	pthread_mutex_lock(&v->lock);
	refresh(v);
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
static int changeable(struct wfs_version *v)
{
	if (stopped(v))
		return -EAGAIN;
	return v->hash_only ? -ENOSPC : 0;
}

int wfs_version_truncate(struct wfs_version *v, uint64_t size)
{
	int ret = 0;

	pthread_mutex_lock(&v->lock);
	ret = changeable(v);
	if (ret)
		goto out;
	refresh(v);
	if (v->tmp.fd < 0 && size > WFS_VERSION_MEM_MAX)
		ret = spill(v, true);
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
	set_size(v, size);
	v->modified = true;
	note_changed(v);
out:
	pthread_mutex_unlock(&v->lock);
	return ret;
}

/*
 * FALLOC_FL_PUNCH_HOLE: bytes [@off, @end) inside the version read as zeros from now on, its size
 * unchanged; the tmp file gives the blocks back (version lock held). Returns 0 or -errno.
 */
static int punch_hole(struct wfs_version *v, uint64_t off, uint64_t end)
{
	if (end > v->size)
		end = v->size;
	if (off >= end)
		return 0;
	if (v->tmp.fd < 0) {
		memset(v->mem + off, 0, (size_t)(end - off));
	} else if (fallocate(v->tmp.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off,
			     (off_t)(end - off)) < 0) {
		return -errno;
	}
	if (off < v->hasher.bytes)
		v->in_order = false; /* hashed bytes changed: the seal hashes the whole version again */
	v->modified = true;
	note_changed(v);
	return 0;
}

int wfs_version_fallocate(struct wfs_version *v, int mode, uint64_t off, uint64_t len)
{
	uint64_t end = off + len;
	int ret = 0;

	if (mode != (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE) && (mode & ~FALLOC_FL_KEEP_SIZE))
		return -EOPNOTSUPP;
	if (len == 0 || end < off || end > (uint64_t)INT64_MAX)
		return -EINVAL;
	pthread_mutex_lock(&v->lock);
	ret = changeable(v);
	if (ret)
		goto out;
	refresh(v);
	if (mode & FALLOC_FL_PUNCH_HOLE) {
		ret = punch_hole(v, off, end);
		goto out;
	}
	if (v->tmp.fd < 0 && end > WFS_VERSION_MEM_MAX)
		ret = spill(v, true);
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
			set_size(v, end); /* zeros: the hashed prefix stays, the seal hashes the rest */
			v->modified = true;
			note_changed(v);
		}
	}
out:
	pthread_mutex_unlock(&v->lock);
	return ret;
}

/*
 * One fstat(2) of the file the kernel writes @v through, into @st: false when the kernel writes
 * none of @v, or the fstat failed (the daemon's record stands). Without the version lock: a seal
 * holds it while it hashes, and callers hold fs->lock.
 */
static bool kernel_stat(struct wfs_version *v, struct stat *st)
{
	return __atomic_load_n(&v->kernel_writes, __ATOMIC_ACQUIRE) && v->size_fd >= 0 && fstat(v->size_fd, st) == 0;
}

static bool mtime_of(struct wfs_version *v, const struct stat *kst, struct timespec *mtime);

/* wfs_version_size() with @kst, kernel_stat()'s answer or NULL. Once FROZEN, refresh() took the
 * kernel's last size. */
static uint64_t size_of(struct wfs_version *v, const struct stat *kst)
{
	if (kst && !__atomic_load_n(&v->frozen, __ATOMIC_ACQUIRE))
		return (uint64_t)kst->st_size;
	return __atomic_load_n(&v->size, __ATOMIC_ACQUIRE);
}

uint64_t wfs_version_size(struct wfs_version *v)
{
	struct stat st;

	if (__atomic_load_n(&v->frozen, __ATOMIC_ACQUIRE))
		return size_of(v, NULL);
	return size_of(v, kernel_stat(v, &st) ? &st : NULL);
}

/* Digest of the version's bytes (version lock held). Returns 0 or -errno. */
/*
 * May the seal take the declared digest instead of reading the tmp file to hash it (version lock
 * held)? Only for bytes the kernel wrote (passthrough: the daemon saw none of them; the daemon path
 * hashes as the bytes arrive, or rereads them when they came out of order), only for content new
 * to the store, only when one writable handle ever wrote the version (a second one's bytes are
 * not what the first declared), and not for a copy made because the file was still writable at the
 * seal (the writer may have changed it since it declared). A stored object is never handed
 * to a name on a declaration: that would read any object whose digest the writer knows. The bytes
 * are checked before their first read (check.h); see docs/integrity.md.
 */
static bool declared_trusted(struct wfs_version *v, const struct wfs_digest *declared)
{
	return __atomic_load_n(&v->kernel, __ATOMIC_ACQUIRE) && !v->copied_to_publish &&
	       __atomic_load_n(&v->joins, __ATOMIC_RELAXED) <= 1 &&
	       !wfs_store_object_exists(v->store, declared);
}

/* The declared digest into *@d, if the writer declared one (any lock but note_lock held). */
static bool declaration(struct wfs_version *v, struct wfs_digest *d)
{
	bool has;

	pthread_mutex_lock(&v->note_lock);
	has = v->has_declared;
	if (has)
		*d = v->declared;
	pthread_mutex_unlock(&v->note_lock);
	return has;
}

static int version_digest(struct wfs_version *v, struct wfs_digest *d)
{
	struct wfs_digest declared;
	bool has_declared = declaration(v, &declared);
	uint64_t bytes;
	int ret;

	if (v->has_base && !v->modified) {
		*d = v->base;
		return 0;
	}
	if (v->in_order && v->hasher.bytes == v->size) {
		wfs_hasher_digest(&v->hasher, d);
	} else if (v->tmp.fd < 0) {
		wfs_digest_buf(v->mem, v->size, d);
	} else if (has_declared && declared_trusted(v, &declared)) {
		*d = declared;
		__atomic_store_n(&v->trusted, true, __ATOMIC_RELEASE);
		return 0;
	} else {
		ret = wfs_digest_fd(v->tmp.fd, d, &bytes);
		if (ret == 0 && bytes != v->size)
			ret = -EIO;
		if (ret)
			return ret;
	}
	__atomic_store_n(&v->declared_wrong, has_declared && !wfs_digest_equal(d, &declared), __ATOMIC_RELEASE);
	return 0;
}

/*
 * -o dedup_verify=bytes: before dropping a version whose digest is already stored, compare the bytes.
 * XXH3 is not collision-resistant; this is for stores whose writers are not all trusted, or the
 * cautious. Version lock held. Returns 0 when equal, -EIO (logged) when not, or -errno.
 */
static int compare_stored(struct wfs_version *v, const struct wfs_digest *d)
{
	enum { CHUNK = 1 << 20 };
	char *a = NULL, *b = NULL, hex[WFS_DIGEST_HEX_CHARS + 1];
	uint64_t off = 0;
	int fd, ret = 0;

	fd = wfs_store_object_open(v->store, d, 0);
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
		WFS_LOG_LIMITED(WFS_LOG_ERR, "object %s: same digest, different bytes (an XXH3 collision): refusing to "
				"store them under that digest", hex);
		ret = -EIO;
	}
out:
	free(a);
	free(b);
	close(fd);
	return ret;
}

/*
 * A version written through the kernel is published only when nothing can write its file any more:
 * no passthrough backing file of a writer, no writable mapping. The daemon cannot see those, but
 * the kernel refuses a read lease (F_SETLEASE, F_RDLCK) on a file while any descriptor of it is
 * open for writing, and a mapping holds its descriptor's open file (fcntl(2), "Leases"). So the
 * daemon's own read-write descriptor is replaced by a read-only one, and the lease is tried for up
 * to SETTLE_TRIES ms (the kernel puts a passthrough backing file when the FUSE file goes, around the
 * RELEASE). Refused: the bytes are copied into a tmp file only the daemon holds (a reflink where the
 * store's filesystem shares extents), and the copy is what gets hashed and published. Version lock
 * held, FROZEN. Returns 0 or -errno (of the copy).
 */
#define SETTLE_TRIES 50 /* at 20, a loaded 2-core machine once published a copy after munmap */

/* v->tmp.fd read-only (settle()) → read-write again, on the same file. Version lock held. */
static int reopen_writable(struct wfs_version *v)
{
	int rw = open_again(v->tmp.fd, O_RDWR);

	if (rw < 0)
		return rw;
	close(v->tmp.fd);
	v->tmp.fd = rw;
	return 0;
}

static int settle(struct wfs_version *v)
{
	struct wfs_tmpfile copy;
	int ro, ret = 0;
	bool leased = false, refused = false;

	refresh(v);
	if (v->reserved_past_eof && ftruncate(v->tmp.fd, (off_t)v->size) < 0)
		return -errno; /* blocks reserved past the end would stay with the object */
	v->reserved_past_eof = false;
	ro = fcntl(v->size_fd, F_DUPFD_CLOEXEC, 0); /* read-only, of the same file */
	if (ro < 0)
		return -errno;
	close(v->tmp.fd);
	v->tmp.fd = ro;
	for (int i = 0; i < SETTLE_TRIES && !leased; i++) {
		if (fcntl(ro, F_SETLEASE, F_RDLCK) == 0) {
			fcntl(ro, F_SETLEASE, F_UNLCK);
			leased = true;
		} else if (errno != EAGAIN && errno != EBUSY) {
			break; /* no leases here (EINVAL, ENOLCK): copy */
		} else {
			refused = true;
			usleep(1000);
		}
	}
	if (leased)
		return 0;
	if (refused && !v->copy_if_mapped) {
		/* A writable mapping outlived its descriptor's close (the kernel maps the backing file
		 * itself): what it writes from now on is the file's content. Wait for it to go. */
		ret = reopen_writable(v);
		return ret ? ret : -EBUSY;
	}
	ret = wfs_store_tmp_create(v->store, &copy);
	if (ret == 0 && ioctl(copy.fd, FICLONE, ro) < 0)
		ret = copy_range(ro, copy.fd, 0, (off_t)v->size);
	if (ret == 0 && ftruncate(copy.fd, (off_t)v->size) < 0)
		ret = -errno;
	if (ret) {
		wfs_store_tmp_discard(v->store, &copy);
		return ret;
	}
	wfs_store_tmp_discard(v->store, &v->tmp); /* the writers' file: they may keep it */
	v->tmp = copy;
	__atomic_store_n(&v->kernel_writes, false, __ATOMIC_RELEASE); /* nobody writes the copy */
	v->copied_to_publish = true;
	return 0;
}

/*
 * (V) A kernel-written file that a claim filled (wfs_version_claim_fill()), written through the kernel
 * since: its size is not the claimed one, or its mtime moved (taken after the fill, so the next
 * write's is later on kernels with multigrain timestamps). Those writes never reach the daemon:
 * without this the seal took the claimed digest and dropped them (`cat a - > b`, coreutils
 * copy_file_range, then a write on the same descriptor: found by a new user's trial).
 */
static bool claimed_then_written(struct wfs_version *v)
{
	struct stat st;

	if (!v->kernel_writes || !v->has_base || v->modified)
		return false;
	return v->size != v->claim_size || v->tmp.fd < 0 || fstat(v->tmp.fd, &st) != 0 ||
	       st.st_mtim.tv_sec != v->kernel_from.tv_sec || st.st_mtim.tv_nsec != v->kernel_from.tv_nsec;
}

int wfs_version_freeze(struct wfs_version *v, struct wfs_digest *d, uint64_t *size, bool *unwritten)
{
	int ret;

	pthread_mutex_lock(&v->lock);
	assert(!v->done);
	refresh(v); /* the last size the kernel wrote, before lock-free readers see FROZEN */
	__atomic_store_n(&v->frozen, true, __ATOMIC_RELEASE);
	ret = v->error;
	if (ret == 0 && claimed_then_written(v))
		v->modified = true; /* before settle(), which may put a copy in the file's place */
	if (ret == 0 && v->kernel_writes)
		ret = settle(v);
	if (ret == -EBUSY) {
		__atomic_store_n(&v->frozen, false, __ATOMIC_RELEASE); /* OPEN again, still the kernel's */
		pthread_mutex_unlock(&v->lock);
		return ret;
	}
	if (ret == 0)
		ret = version_digest(v, d);
	*size = v->size;
	*unwritten = v->size == 0 && !v->written;
	pthread_mutex_unlock(&v->lock);
	return ret;
}

bool wfs_version_unchanged(struct wfs_version *v)
{
	bool same;

	pthread_mutex_lock(&v->lock);
	same = v->has_base && !v->modified;
	pthread_mutex_unlock(&v->lock);
	return same;
}

/*
 * A version FROZEN with its declared digest (trusted), whose object has been stored meanwhile: hash
 * the bytes after all (version lock held). Returns 0 when they are the declared content, -EIO
 * (logged) when not, or -errno of reading the tmp file.
 */
static int hash_declared(struct wfs_version *v, const struct wfs_digest *d)
{
	char hex[WFS_DIGEST_HEX_CHARS + 1];
	struct wfs_digest got;
	uint64_t bytes;
	int ret = wfs_digest_fd(v->tmp.fd, &got, &bytes);

	if (ret)
		return ret;
	__atomic_store_n(&v->trusted, false, __ATOMIC_RELEASE);
	if (bytes == v->size && wfs_digest_equal(&got, d))
		return 0;
	wfs_digest_to_hex(d, hex);
	WFS_LOG_LIMITED(WFS_LOG_ERR, "seal refused (EIO): the bytes written are not the declared digest %s", hex);
	return -EIO;
}

/* Release the bytes and mark DONE (version lock held). */
/* wfs_version_free_kernel_bytes() with v->lock held. */
static void free_kernel_bytes(struct wfs_version *v)
{
	int fd;

	if (!v->kernel || v->tmp.fd < 0)
		return;
	/* @tmp may be read-only by now (settle()): truncate through a writable open of the same file. */
	fd = open_again(v->tmp.fd, O_WRONLY);
	if (fd < 0 || ftruncate(fd, 0) != 0)
		WFS_LOG_LIMITED(WFS_LOG_WARN, "the blocks of a failed seal's file stay allocated until its last "
				"descriptor closes: %s", strerror(errno));
	if (fd >= 0)
		close(fd);
}

/* Release the bytes and their record (version lock held). */
static void let_go(struct wfs_version *v)
{
	wfs_store_tmp_discard(v->store, &v->tmp);
	mem_free(v);
	wfs_keep_end(v->keep); /* after the bytes are out of its slot */
	v->keep = -1;
	v->kept_past_publish = false;
}

/*
 * → DONE (version lock held). A published version with a record (keep.h) keeps its bytes and record
 * until wfs_version_let_go(): a server killed between the publish and the catalog change that
 * records it leaves a successor the bytes to seal again, not a name it removes as never sealed.
 */
static void finish(struct wfs_version *v, bool published)
{
	if (published && v->keep >= 0) {
		if (v->tmp.fd >= 0 && v->tmp.name[0]) {
			close(v->tmp.fd);
			v->tmp.fd = -1;
		}
		v->kept_past_publish = true;
	} else {
		let_go(v);
	}
	__atomic_store_n(&v->frozen, true, __ATOMIC_RELEASE);
	v->done = true;
}

void wfs_version_let_go(struct wfs_version *v)
{
	pthread_mutex_lock(&v->lock);
	if (v->kept_past_publish)
		let_go(v);
	pthread_mutex_unlock(&v->lock);
}

int wfs_version_publish(struct wfs_version *v, const struct wfs_digest *d, bool stored, bool dedup_verify,
			bool durable, bool *existed)
{
	bool unchanged;
	int ret = 0;

	pthread_mutex_lock(&v->lock);
	assert(v->frozen && !v->done);
	unchanged = v->has_base && !v->modified;
	*existed = unchanged || stored;
	if (*existed && v->trusted) {
		/* Stored since the freeze trusted the declaration: a name gets a stored object only
		 * for bytes that hash to it. */
		ret = hash_declared(v, d);
	} else if (*existed) {
		/* Already stored: this copy is not needed. */
		if (dedup_verify && !unchanged)
			ret = v->hash_only ? -ENOSPC : compare_stored(v, d);
	} else if (v->hash_only) {
		ret = -ENOSPC; /* new content, and no room was left to keep it */
	} else if (v->tmp.fd < 0) {
		ret = spill(v, false);
	}
	/* Blocks reserved past the end would stay with the object: ftruncate frees them. */
	if (ret == 0 && !*existed && v->reserved_past_eof && ftruncate(v->tmp.fd, (off_t)v->size) < 0)
		ret = -errno;
	if (ret == 0 && !*existed) {
		v->tmp.keep_name = v->keep >= 0; /* until wfs_version_let_go() */
		ret = wfs_store_publish(v->store, &v->tmp, d, durable, existed);
	}
	if (ret)
		free_kernel_bytes(v); /* not linked: nothing else has this file */
	finish(v, ret == 0);
	pthread_mutex_unlock(&v->lock);
	return ret;
}

void wfs_version_discard(struct wfs_version *v)
{
	pthread_mutex_lock(&v->lock);
	finish(v, false);
	pthread_mutex_unlock(&v->lock);
}

int wfs_version_claim_fill(struct wfs_version *v, int src, uint64_t size, const struct wfs_digest *d)
{
	struct stat st;
	int ret = 0;

	pthread_mutex_lock(&v->lock);
	if (!v->kernel_writes || v->tmp.fd < 0)
		ret = -EINVAL;
	if (ret == 0 && ioctl(v->tmp.fd, FICLONE, src) < 0)
		ret = copy_range(src, v->tmp.fd, 0, (off_t)size); /* no shared extents here: a copy */
	if (ret == 0 && ftruncate(v->tmp.fd, (off_t)size) < 0)
		ret = -errno;
	if (ret == 0) {
		set_size(v, size);
		v->has_base = true;
		v->base = *d;
		v->claim_size = size;
		v->modified = false; /* unless the kernel writes it after all: claimed_then_written() */
		if (fstat(v->tmp.fd, &st) == 0)
			v->kernel_from = st.st_mtim; /* a write from now on moves it: wfs_version_touched() */
	} else if (v->tmp.fd >= 0 && ftruncate(v->tmp.fd, 0) < 0) {
		ret = -errno; /* not empty any more, and no way back: the claim fails, the seal says so */
	}
	pthread_mutex_unlock(&v->lock);
	return ret;
}

void wfs_version_free_kernel_bytes(struct wfs_version *v)
{
	pthread_mutex_lock(&v->lock);
	free_kernel_bytes(v);
	pthread_mutex_unlock(&v->lock);
}

void wfs_version_set_mtime(struct wfs_version *v, const struct timespec *mtime)
{
	pthread_mutex_lock(&v->note_lock);
	v->mtime_set = true;
	v->mtime = *mtime;
	clock_gettime(CLOCK_REALTIME, &v->set_at);
	v->set_at_set = true;
	pthread_mutex_unlock(&v->note_lock);
}

bool wfs_version_untouched_copy(struct wfs_version *v)
{
	bool copy;

	pthread_mutex_lock(&v->lock);
	copy = v->has_base;
	pthread_mutex_unlock(&v->lock);
	return copy && !wfs_version_touched(v);
}

bool wfs_version_touched(struct wfs_version *v)
{
	struct timespec ignored;
	struct stat st;

	if (!__atomic_load_n(&v->kernel_writes, __ATOMIC_ACQUIRE))
		return mtime_of(v, NULL, &ignored);
	pthread_mutex_lock(&v->note_lock);
	if (v->mtime_set || v->changed_set) {
		pthread_mutex_unlock(&v->note_lock);
		return true;
	}
	pthread_mutex_unlock(&v->note_lock);
	return v->size_fd < 0 || fstat(v->size_fd, &st) != 0 || st.st_mtim.tv_sec != v->kernel_from.tv_sec ||
	       st.st_mtim.tv_nsec != v->kernel_from.tv_nsec;
}

bool wfs_version_same_as_base(struct wfs_version *v, const struct wfs_digest *d)
{
	bool same;

	pthread_mutex_lock(&v->lock);
	same = v->has_base && wfs_digest_equal(&v->base, d);
	pthread_mutex_unlock(&v->lock);
	return same;
}

/* The mtime wfs_version_stat() gives, with @kst as there: false when it has none. */
static bool mtime_of(struct wfs_version *v, const struct stat *kst, struct timespec *mtime)
{
	bool set, changed;

	pthread_mutex_lock(&v->note_lock);
	set = v->mtime_set;
	changed = v->changed_set;
	if (set)
		*mtime = v->mtime;
	else if (changed)
		*mtime = v->changed;
	pthread_mutex_unlock(&v->note_lock);
	if (set)
		return true;
	if (kst) { /* written through the kernel (passthrough): its file's mtime is its last write's */
		*mtime = kst->st_mtim;
		return true;
	}
	return changed;
}

static bool ts_before(const struct timespec *a, const struct timespec *b)
{
	return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

/* Raise *@ctime to the ctime wfs_version_stat() gives, with @kst as there: false when it has none. */
static bool ctime_of(struct wfs_version *v, const struct stat *kst, struct timespec *ctime)
{
	struct timespec t[3];
	int n = 0;

	pthread_mutex_lock(&v->note_lock);
	if (v->changed_set)
		t[n++] = v->changed;
	if (v->set_at_set)
		t[n++] = v->set_at;
	pthread_mutex_unlock(&v->note_lock);
	if (kst)
		t[n++] = kst->st_mtim; /* the kernel's last write (or its file's creation) */
	for (int i = 0; i < n; i++)
		if (ts_before(ctime, &t[i]))
			*ctime = t[i];
	return n > 0;
}

/*
 * The allocation of the tmp file the daemon writes @v into, in 512-byte blocks: a truncate(2) or a
 * write past the end leaves holes that take nothing, as on ext4. false when @v lives in memory, or
 * its lock is busy (a seal hashing, which callers under fs->lock must not wait for).
 */
static bool tmp_blocks(struct wfs_version *v, blkcnt_t *blocks)
{
	struct stat st;
	bool ok = false;

	if (pthread_mutex_trylock(&v->lock) != 0)
		return false;
	if (v->tmp.fd >= 0 && fstat(v->tmp.fd, &st) == 0) {
		*blocks = st.st_blocks;
		ok = true;
	}
	pthread_mutex_unlock(&v->lock);
	return ok;
}

unsigned wfs_version_stat(struct wfs_version *v, struct stat *st)
{
	struct stat kernel;
	const struct stat *kst = kernel_stat(v, &kernel) ? &kernel : NULL;
	unsigned have = 0;

	st->st_size = (off_t)size_of(v, kst);
	if (kst && !__atomic_load_n(&v->frozen, __ATOMIC_ACQUIRE))
		st->st_blocks = kst->st_blocks;
	else if (kst || !tmp_blocks(v, &st->st_blocks))
		st->st_blocks = (blkcnt_t)(((uint64_t)st->st_size + 4095) / 4096 * 8); /* 4 KiB blocks */
	if (mtime_of(v, kst, &st->st_mtim))
		have |= WFS_VERSION_MTIME;
	if (ctime_of(v, kst, &st->st_ctim))
		have |= WFS_VERSION_CTIME;
	return have;
}

bool wfs_version_frozen(struct wfs_version *v)
{
	return __atomic_load_n(&v->frozen, __ATOMIC_ACQUIRE) || __atomic_load_n(&v->sealing, __ATOMIC_ACQUIRE);
}

void wfs_version_seal_cancel(struct wfs_version *v)
{
	__atomic_store_n(&v->sealing, false, __ATOMIC_RELEASE);
}

void wfs_version_copy_if_mapped(struct wfs_version *v)
{
	pthread_mutex_lock(&v->lock);
	v->copy_if_mapped = true;
	pthread_mutex_unlock(&v->lock);
}

bool wfs_version_mapped(struct wfs_version *v)
{
	bool mapped = false;
	int ro;

	pthread_mutex_lock(&v->lock);
	if (v->kernel_writes && v->tmp.fd >= 0 && v->size_fd >= 0 &&
	    (ro = fcntl(v->size_fd, F_DUPFD_CLOEXEC, 0)) >= 0) {
		close(v->tmp.fd); /* ours must not count: the lease is refused to any writable open */
		v->tmp.fd = ro;
		if (fcntl(ro, F_SETLEASE, F_RDLCK) == 0)
			fcntl(ro, F_SETLEASE, F_UNLCK);
		else
			mapped = errno == EAGAIN || errno == EBUSY;
		if (reopen_writable(v) != 0)
			mapped = false; /* the seal finds out, and fails with the reason */
	}
	pthread_mutex_unlock(&v->lock);
	return mapped;
}

bool wfs_version_seal_begin(struct wfs_version *v)
{
	if (__atomic_load_n(&v->frozen, __ATOMIC_ACQUIRE)) /* a claim holds it, or it is DONE */
		return false;
	return !__atomic_exchange_n(&v->sealing, true, __ATOMIC_ACQ_REL);
}

/* One filesystem block: what numpy's sizing byte allocates (ext4, XFS and tmpfs alike). */
#define SIZING_BLOCK_BYTES 4096

bool wfs_version_has_data(struct wfs_version *v)
{
	struct stat st;

	if (!__atomic_load_n(&v->written, __ATOMIC_ACQUIRE) || __atomic_load_n(&v->only_extended, __ATOMIC_ACQUIRE))
		return false;
	if (!__atomic_load_n(&v->kernel_writes, __ATOMIC_ACQUIRE) || v->size_fd < 0 || fstat(v->size_fd, &st) != 0)
		return true;
	/* Written by the kernel, unseen: empty, or one block allocated in a larger file (a sizing
	 * byte past the end; a file written as a hole reads zeros, allocates nothing, and is rare) is
	 * not data yet. Blocks the filesystem will allocate (delayed allocation) count already. */
	return st.st_size > 0 && (st.st_size <= SIZING_BLOCK_BYTES || (uint64_t)st.st_blocks * 512 > SIZING_BLOCK_BYTES);
}

int wfs_version_claim_freeze(struct wfs_version *v, bool freeze)
{
	int ret;

	pthread_mutex_lock(&v->lock);
	refresh(v);
	/* Written through the kernel, @written says only that it may be: the size says whether it was. */
	ret = (v->written && !v->kernel_writes) || v->size ? -EEXIST : 0;
	if (ret == 0 && freeze)
		__atomic_store_n(&v->frozen, true, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&v->lock);
	return ret;
}

void wfs_version_thaw(struct wfs_version *v)
{
	pthread_mutex_lock(&v->lock);
	assert(v->frozen && !v->done);
	__atomic_store_n(&v->frozen, false, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&v->lock);
}

void wfs_version_writer_add(struct wfs_version *v)
{
	v->writers++;
	__atomic_add_fetch(&v->joins, 1, __ATOMIC_RELAXED);
}

int wfs_version_declare(struct wfs_version *v, const struct wfs_digest *d)
{
	/* Not the version lock: a seal holds it while it hashes, and the caller holds fs->lock. A
	 * declaration that lands just after the freeze looked is not used: the seal hashes. */
	if (wfs_version_frozen(v))
		return -EAGAIN;
	pthread_mutex_lock(&v->note_lock);
	v->declared = *d;
	v->has_declared = true;
	pthread_mutex_unlock(&v->note_lock);
	return 0;
}

bool wfs_version_trusted(struct wfs_version *v)
{
	return __atomic_load_n(&v->trusted, __ATOMIC_ACQUIRE);
}

bool wfs_version_declared_wrong(struct wfs_version *v)
{
	return __atomic_load_n(&v->declared_wrong, __ATOMIC_ACQUIRE);
}

unsigned wfs_version_writer_drop(struct wfs_version *v)
{
	assert(v->writers > 0);
	return --v->writers;
}

unsigned wfs_version_writers(const struct wfs_version *v)
{
	return v->writers;
}

void wfs_version_finish(struct wfs_version *v)
{
	v->finished = true;
}

uint64_t wfs_version_dropped(struct wfs_version *v)
{
	uint64_t n;

	if (!__atomic_load_n(&v->hash_only, __ATOMIC_ACQUIRE))
		return 0; /* every write asks: no lock for the common answer */
	pthread_mutex_lock(&v->lock);
	n = v->hash_only ? v->hasher.bytes : 0;
	pthread_mutex_unlock(&v->lock);
	return n;
}

bool wfs_version_finished(const struct wfs_version *v)
{
	return v->finished;
}

void wfs_version_refuse(struct wfs_version *v)
{
	v->refused = true;
	v->refused_size = wfs_version_size(v);
}

bool wfs_version_refused(struct wfs_version *v)
{
	return v->refused && wfs_version_size(v) == v->refused_size;
}

int wfs_version_kernel_backing(struct wfs_version *v, uint64_t reserve)
{
	int ret = 0;

	pthread_mutex_lock(&v->lock);
	ret = changeable(v);
	if (ret == 0 && v->tmp.fd < 0)
		ret = spill(v, true);
	if (ret == 0 && reserve > v->size) {
		if (fallocate(v->tmp.fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)reserve) == 0)
			v->reserved_past_eof = true;
		else if (errno == ENOSPC || errno == EDQUOT)
			ret = -errno;
		/* else a filesystem without fallocate: nothing reserved, writes hear ENOSPC */
	}
	if (ret == 0 && v->size_fd < 0) {
		v->size_fd = open_again(v->tmp.fd, O_RDONLY);
		if (v->size_fd < 0) {
			ret = v->size_fd;
			v->size_fd = -1;
		}
	}
	if (ret == 0) {
		struct stat st;

		/* Taken after the copy: a write from now on gets a later mtime (a query makes the next
		 * change fine-grained on kernels with multigrain timestamps; on others the seal's
		 * digest still tells an unchanged copy from a change: wfs_version_touched()). */
		if (fstat(v->tmp.fd, &st) == 0)
			v->kernel_from = st.st_mtim;
		__atomic_store_n(&v->kernel_writes, true, __ATOMIC_RELEASE);
		__atomic_store_n(&v->kernel, true, __ATOMIC_RELEASE);
		wfs_keep_in_file(v->keep, v->tmp.name, true); /* an unnamed file: LOST, not adoptable */
		v->in_order = false;
		__atomic_store_n(&v->written, true, __ATOMIC_RELEASE); /* the kernel writes unseen */
		v->modified = true;
		ret = v->size_fd;
	}
	pthread_mutex_unlock(&v->lock);
	return ret;
}

bool wfs_version_kernel_written(struct wfs_version *v)
{
	return __atomic_load_n(&v->kernel, __ATOMIC_ACQUIRE); /* no lock: callers hold fs->lock */
}

int wfs_version_datasync_kernel(struct wfs_version *v)
{
	int fd = -1, ret = 0;

	pthread_mutex_lock(&v->lock);
	if (v->kernel_writes && v->tmp.fd >= 0 && (fd = fcntl(v->tmp.fd, F_DUPFD_CLOEXEC, 0)) < 0)
		ret = -errno;
	pthread_mutex_unlock(&v->lock);
	if (fd >= 0) {
		if (fdatasync(fd) < 0)
			ret = -errno; /* the kernel's writeback of the writer's bytes: EIO, ENOSPC */
		close(fd);
	}
	return ret;
}

void wfs_version_ask_durable(struct wfs_version *v)
{
	__atomic_store_n(&v->durable_asked, true, __ATOMIC_RELEASE);
}

bool wfs_version_durable_asked(struct wfs_version *v)
{
	return __atomic_load_n(&v->durable_asked, __ATOMIC_ACQUIRE);
}

bool wfs_version_published_copy(struct wfs_version *v)
{
	bool c;

	pthread_mutex_lock(&v->lock);
	c = v->copied_to_publish;
	pthread_mutex_unlock(&v->lock);
	return c;
}

void wfs_version_fail(struct wfs_version *v, int err)
{
	pthread_mutex_lock(&v->lock);
	if (!v->error) {
		v->error = err;
		v->error_told = true;
	}
	wfs_keep_lost(v->keep);
	pthread_mutex_unlock(&v->lock);
}

int wfs_version_failed(struct wfs_version *v)
{
	int err;

	pthread_mutex_lock(&v->lock);
	err = v->error;
	pthread_mutex_unlock(&v->lock);
	return err;
}

bool wfs_version_error_told(struct wfs_version *v)
{
	bool told;

	pthread_mutex_lock(&v->lock);
	told = v->error_told;
	pthread_mutex_unlock(&v->lock);
	return told;
}

void wfs_version_keep(struct wfs_version *v, uint64_t ino, bool base_follows)
{
	int k = wfs_keep_new(ino);

	if (k < 0)
		return;
	pthread_mutex_lock(&v->lock);
	assert(v->size == 0 && v->tmp.fd < 0 && !v->mem);
	v->keep = k;
	if (!base_follows) {
		v->mem = wfs_keep_mem(k);
		v->mem_cap = WFS_VERSION_MEM_MAX;
		v->mem_kept = true;
		wfs_keep_in_memory(k, 0);
	}
	pthread_mutex_unlock(&v->lock);
}

struct wfs_version *wfs_version_adopt(struct wfs_store *store, const struct wfs_keep_record *r, int *err)
{
	struct wfs_version *v;
	struct stat st;

	if (r->state != WFS_KEEP_LIVE || (r->in_memory && r->size > WFS_VERSION_MEM_MAX)) {
		*err = -EIO;
		return NULL;
	}
	v = wfs_version_new(store, err);
	if (!v)
		return NULL;
	if (r->in_memory) {
		v->mem = wfs_keep_mem((int)r->index);
		v->mem_cap = WFS_VERSION_MEM_MAX;
		v->mem_kept = true;
		v->size = r->size;
	} else {
		*err = wfs_store_tmp_open(store, r->tmp_name, &v->tmp);
		if (*err == 0 && fstat(v->tmp.fd, &st) < 0)
			*err = -errno;
		if (*err) {
			wfs_version_put(v);
			return NULL;
		}
		v->size = r->kernel ? (uint64_t)st.st_size : r->size;
		/* Bytes past the size (a reservation, or a write the dead server never answered) are
		 * trimmed before the bytes are published. */
		v->reserved_past_eof = (uint64_t)st.st_size != v->size || !r->kernel;
		if (r->kernel) {
			v->size_fd = open_again(v->tmp.fd, O_RDONLY);
			if (v->size_fd < 0) {
				*err = v->size_fd;
				v->size_fd = -1;
				close(v->tmp.fd); /* the name stays: the successor's sweep removes it */
				v->tmp.fd = -1;
				wfs_version_put(v);
				return NULL;
			}
			v->kernel_writes = true;
			v->kernel = true;
		}
	}
	v->keep = (int)r->index;
	v->in_order = false; /* the hash so far died with the server: the seal hashes it all */
	v->written = v->size > 0 || r->kernel;
	v->modified = true;
	note_changed(v);
	return v;
}
