#include "digest.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
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

int wfs_digest_fd(int fd, struct wfs_digest *out, uint64_t *bytes)
{
	struct wfs_hasher h;
	char *buf;
	off_t off = 0;
	int ret;

	buf = malloc(DIGEST_READ_BYTES);
	if (!buf)
		return -ENOMEM;
	ret = wfs_hasher_init(&h);
	if (ret)
		goto out;
	for (;;) {
		ssize_t n = pread(fd, buf, DIGEST_READ_BYTES, off);

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
	wfs_hasher_release(&h);
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
