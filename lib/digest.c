/* SPDX-License-Identifier: Apache-2.0 */
/* digest.h: XXH3-128 content digests of objects. */
#include "digest.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
/* XXH3 picks SSE2, AVX2 or AVX-512 at run time (libxxhash's dispatch): the same digests, faster on
 * the CPUs that have them than the baseline x86-64 build of the library. */
#include <xxh_x86dispatch.h>
#endif

/* Read size for wfs_digest_fd(): large enough to amortise syscalls, small enough to stay in L2. */
#define DIGEST_READ_BYTES (1u << 20)
/*
 * A data run of at least DIGEST_PARALLEL_MIN bytes is read by DIGEST_READERS threads into a ring of
 * DIGEST_SLOTS read-size buffers while the calling thread hashes them in order: copying out of the
 * page cache is what a warm digest spends most on (measured on the H200 machine: 1 GiB took 0.16 s
 * of copying and 0.04 s of XXH3), and copies run in parallel where the hash cannot.
 */
#define DIGEST_PARALLEL_MIN (32u << 20)
#define DIGEST_READERS 4
#define DIGEST_SLOTS 8

int wfs_hasher_init(struct wfs_hasher *h)
{
	h->bytes = 0;
	h->state = XXH3_createState();
	if (!h->state)
		return -ENOMEM;
	XXH3_128bits_reset(h->state);
	return 0;
}

void wfs_hasher_reset(struct wfs_hasher *h)
{
	h->bytes = 0;
	XXH3_128bits_reset(h->state);
}

void wfs_hasher_update(struct wfs_hasher *h, const void *buf, size_t len)
{
	XXH3_128bits_update(h->state, buf, len);
	h->bytes += len;
}

void wfs_hasher_digest(const struct wfs_hasher *h, struct wfs_digest *out)
{
	XXH128_hash_t v = XXH3_128bits_digest(h->state);
	XXH128_canonical_t c;

	XXH128_canonicalFromHash(&c, v);
	memcpy(out->bytes, c.digest, WFS_DIGEST_BYTES);
}

void wfs_hasher_release(struct wfs_hasher *h)
{
	if (h->state)
		XXH3_freeState(h->state);
	h->state = NULL;
}

void wfs_digest_buf(const void *buf, size_t len, struct wfs_digest *out)
{
	XXH128_canonical_t c;

	XXH128_canonicalFromHash(&c, XXH3_128bits(buf, len));
	memcpy(out->bytes, c.digest, WFS_DIGEST_BYTES);
}

/* Hash @len zero bytes (a hole) from a zero buffer of DIGEST_READ_BYTES: no read, no page cache. */
static void hash_zeros(struct wfs_hasher *h, const char *zeros, uint64_t len)
{
	while (len > 0) {
		size_t n = len < DIGEST_READ_BYTES ? (size_t)len : DIGEST_READ_BYTES;

		wfs_hasher_update(h, zeros, n);
		len -= n;
	}
}

/* The readers and the hasher of one parallel run (hash_run()). */
struct run {
	int fd;
	off_t off;       /* the run's first byte */
	uint64_t chunks; /* DIGEST_READ_BYTES each, the last one shorter */
	uint64_t len;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	uint64_t next;     /* the next chunk a reader takes */
	uint64_t consumed; /* chunks hashed: chunk i may use slot i % DIGEST_SLOTS once i < consumed + SLOTS */
	bool stop;         /* error or end of file: readers leave */
	struct slot {
		char *buf;
		uint64_t chunk; /* which chunk it holds, when @ready */
		ssize_t n;      /* bytes read, or -errno */
		bool ready;
	} slot[DIGEST_SLOTS];
};

static size_t chunk_len(const struct run *r, uint64_t i)
{
	uint64_t start = i * DIGEST_READ_BYTES;

	return r->len - start < DIGEST_READ_BYTES ? (size_t)(r->len - start) : DIGEST_READ_BYTES;
}

static void *run_reader(void *arg)
{
	struct run *r = arg;

	pthread_mutex_lock(&r->lock);
	for (;;) {
		uint64_t i;
		struct slot *sl;
		size_t want, got = 0;
		ssize_t n = 0;

		while (!r->stop && r->next < r->chunks && r->next >= r->consumed + DIGEST_SLOTS)
			pthread_cond_wait(&r->cond, &r->lock);
		if (r->stop || r->next >= r->chunks)
			break;
		i = r->next++;
		sl = &r->slot[i % DIGEST_SLOTS];
		pthread_mutex_unlock(&r->lock);
		want = chunk_len(r, i);
		while (got < want) { /* a short read before the end is retried; 0 is the end of file */
			n = pread(r->fd, sl->buf + got, want - got, r->off + (off_t)(i * DIGEST_READ_BYTES + got));
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				break;
			got += (size_t)n;
		}
		pthread_mutex_lock(&r->lock);
		sl->chunk = i;
		sl->n = n < 0 ? -errno : (ssize_t)got;
		sl->ready = true;
		pthread_cond_broadcast(&r->cond);
	}
	pthread_mutex_unlock(&r->lock);
	return NULL;
}

/*
 * Hash @len bytes of @fd from @off into @h, read by DIGEST_READERS threads. Returns the bytes hashed
 * (fewer than @len when the file ends first), -ENOMEM, -EAGAIN (no thread could be started: the
 * caller reads the run itself), or the -errno of a failed read.
 */
static int64_t hash_run(struct wfs_hasher *h, int fd, off_t off, uint64_t len)
{
	struct run r = {.fd = fd, .off = off, .len = len};
	pthread_t tid[DIGEST_READERS];
	int started = 0;
	int64_t ret = 0;

	r.chunks = (len + DIGEST_READ_BYTES - 1) / DIGEST_READ_BYTES;
	for (int i = 0; i < DIGEST_SLOTS; i++) {
		r.slot[i].buf = malloc(DIGEST_READ_BYTES);
		if (!r.slot[i].buf)
			ret = -ENOMEM;
	}
	pthread_mutex_init(&r.lock, NULL);
	pthread_cond_init(&r.cond, NULL);
	for (int i = 0; ret == 0 && i < DIGEST_READERS; i++)
		if (pthread_create(&tid[i], NULL, run_reader, &r) == 0)
			started++;
	if (ret == 0 && started == 0)
		ret = -EAGAIN;
	for (uint64_t i = 0; ret >= 0 && started && i < r.chunks; i++) {
		struct slot *sl = &r.slot[i % DIGEST_SLOTS];
		ssize_t n;

		pthread_mutex_lock(&r.lock);
		while (!(sl->ready && sl->chunk == i))
			pthread_cond_wait(&r.cond, &r.lock);
		n = sl->n;
		pthread_mutex_unlock(&r.lock);
		if (n < 0) {
			ret = n;
			break;
		}
		wfs_hasher_update(h, sl->buf, (size_t)n);
		ret += n;
		pthread_mutex_lock(&r.lock);
		sl->ready = false;
		r.consumed++;
		if ((size_t)n < chunk_len(&r, i))
			r.stop = true; /* the file ended: later chunks read nothing */
		pthread_cond_broadcast(&r.cond);
		pthread_mutex_unlock(&r.lock);
		if (r.stop)
			break;
	}
	pthread_mutex_lock(&r.lock);
	r.stop = true;
	pthread_cond_broadcast(&r.cond);
	pthread_mutex_unlock(&r.lock);
	for (int i = 0; i < started; i++)
		pthread_join(tid[i], NULL);
	pthread_cond_destroy(&r.cond);
	pthread_mutex_destroy(&r.lock);
	for (int i = 0; i < DIGEST_SLOTS; i++)
		free(r.slot[i].buf);
	return ret;
}

int wfs_digest_range(int fd, uint64_t offset, uint64_t bytes, struct wfs_digest *out)
{
	struct wfs_hasher h;
	char *buf = malloc(DIGEST_READ_BYTES);
	int ret = buf ? wfs_hasher_init(&h) : -ENOMEM;

	if (ret) {
		free(buf);
		return ret;
	}
	while (bytes > 0) {
		ssize_t n = pread(fd, buf, bytes < DIGEST_READ_BYTES ? (size_t)bytes : DIGEST_READ_BYTES,
				  (off_t)offset);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			ret = n < 0 ? -errno : -ENODATA;
			break;
		}
		wfs_hasher_update(&h, buf, (size_t)n);
		offset += (uint64_t)n;
		bytes -= (uint64_t)n;
	}
	if (ret == 0)
		wfs_hasher_digest(&h, out);
	wfs_hasher_release(&h);
	free(buf);
	return ret;
}

int wfs_digest_fd(int fd, struct wfs_digest *out, uint64_t *bytes)
{
	struct wfs_hasher h;
	char *buf, *zeros = NULL;
	off_t off = 0, data_end = 0; /* [off, data_end): known data; beyond: ask SEEK_DATA */
	bool holes;                  /* may hold holes, and the filesystem answers SEEK_DATA/SEEK_HOLE */
	off_t pos = -1;              /* SEEK_DATA moves the offset: the caller's is put back */
	struct stat st;
	int ret;

	if (fstat(fd, &st) < 0)
		return -errno;
	/* A file with as many blocks as bytes has no hole worth a seek (a hole it has beside blocks
	 * past its end reads, and hashes, as zeros all the same): a small tensor's seal costs no
	 * lseek(2). */
	holes = (uint64_t)st.st_blocks * 512 < (uint64_t)st.st_size;
	if (holes)
		pos = lseek(fd, 0, SEEK_CUR);
	buf = malloc(DIGEST_READ_BYTES);
	if (!buf)
		return -ENOMEM;
	ret = wfs_hasher_init(&h);
	if (ret)
		goto out;
	for (;;) {
		ssize_t n;
		off_t run;

		/* Holes hash as the zeros they read as, without reading them: a sparse 1 TiB tensor
		 * costs its data, not a terabyte of reads. */
		if (holes && off >= data_end && off < st.st_size) {
			off_t data = lseek(fd, off, SEEK_DATA);
			off_t hole = data >= 0 ? lseek(fd, data, SEEK_HOLE) : -1;

			if (data < 0 && errno == ENXIO)
				data = st.st_size; /* nothing but a hole to the end */
			if (data < 0 || (data < st.st_size && hole < 0)) {
				holes = false; /* not answered here: read everything */
			} else {
				if (data > off) {
					if (!zeros && !(zeros = calloc(1, DIGEST_READ_BYTES))) {
						ret = -ENOMEM;
						goto out;
					}
					hash_zeros(&h, zeros, (uint64_t)(data - off));
					off = data;
				}
				data_end = data < st.st_size ? hole : st.st_size;
				if (off >= st.st_size)
					break;
			}
		}
		run = holes ? data_end - off : st.st_size - off;
		if (run >= (off_t)DIGEST_PARALLEL_MIN) {
			int64_t got = hash_run(&h, fd, off, (uint64_t)run);

			if (got < 0 && got != -EAGAIN) {
				ret = (int)got;
				goto out;
			}
			if (got >= 0) {
				off += got;
				if (got < run)
					break; /* the file ended before its size said */
				continue;
			}
		}
		n = pread(fd, buf, holes && data_end - off < DIGEST_READ_BYTES ? (size_t)(data_end - off)
									  : DIGEST_READ_BYTES, off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			ret = -errno;
			goto out;
		}
		if (n == 0)
			break;
		wfs_hasher_update(&h, buf, (size_t)n);
		off += n;
	}
	wfs_hasher_digest(&h, out);
	if (bytes)
		*bytes = (uint64_t)off;
out:
	if (pos >= 0)
		lseek(fd, pos, SEEK_SET);
	wfs_hasher_release(&h);
	free(zeros);
	free(buf);
	return ret;
}

void wfs_digest_to_hex(const struct wfs_digest *d, char hex[WFS_DIGEST_HEX_CHARS + 1])
{
	static const char digits[] = "0123456789abcdef";

	for (int i = 0; i < WFS_DIGEST_BYTES; i++) {
		hex[2 * i] = digits[d->bytes[i] >> 4];
		hex[2 * i + 1] = digits[d->bytes[i] & 0xf];
	}
	hex[WFS_DIGEST_HEX_CHARS] = '\0';
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int wfs_digest_from_hex(const char *hex, struct wfs_digest *out)
{
	struct wfs_digest d;

	for (int i = 0; i < WFS_DIGEST_BYTES; i++) {
		int hi = hexval(hex[2 * i]), lo = hi < 0 ? -1 : hexval(hex[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return -EINVAL;
		d.bytes[i] = (uint8_t)(hi << 4 | lo);
	}
	if (hex[WFS_DIGEST_HEX_CHARS] != '\0')
		return -EINVAL;
	*out = d;
	return 0;
}
