#include "digest.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

/* Read size for wfs_digest_fd(): large enough to amortise syscalls, small enough to stay in L2. */
#define DIGEST_READ_BYTES (1u << 20)

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

int wfs_digest_fd(int fd, struct wfs_digest *out, uint64_t *bytes)
{
	struct wfs_hasher h;
	char *buf, *zeros = NULL;
	off_t off = 0, data_end = 0; /* [off, data_end): known data; beyond: ask SEEK_DATA */
	bool holes = true;           /* the filesystem answers SEEK_DATA/SEEK_HOLE */
	off_t pos = lseek(fd, 0, SEEK_CUR); /* SEEK_DATA moves the offset: the caller's is put back */
	struct stat st;
	int ret;

	if (fstat(fd, &st) < 0)
		return -errno;
	buf = malloc(DIGEST_READ_BYTES);
	if (!buf)
		return -ENOMEM;
	ret = wfs_hasher_init(&h);
	if (ret)
		goto out;
	for (;;) {
		ssize_t n;

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
