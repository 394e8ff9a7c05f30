/* SPDX-License-Identifier: Apache-2.0 */
/*
 * digest — content digests of objects: XXH3-128 over the exact bytes of a file.
 *
 * A digest is the 128-bit XXH3 hash in its canonical form: 16 bytes, big-endian high 64 bits then low
 * 64 bits, as XXH128_canonicalFromHash() writes it. Its hex spelling (32 lower-case characters) is what
 * `xxhsum -H2 FILE` prints for the file, and is the object's name in the store.
 *
 * XXH3 is fast but not collision-resistant against an adversary: the store trusts its writers.
 * All functions are thread-safe; a wfs_hasher is used by one thread at a time.
 */
#ifndef WFS_DIGEST_H
#define WFS_DIGEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WFS_DIGEST_BYTES 16
#define WFS_DIGEST_HEX_CHARS 32 /* without the terminating NUL */

struct wfs_digest {
	uint8_t bytes[WFS_DIGEST_BYTES];
};

/* Streaming hasher. Opaque state lives on the heap (XXH3 state wants 64-byte alignment). */
struct wfs_hasher {
	void *state;
	uint64_t bytes; /* bytes fed so far */
};

/* Start hashing. Returns 0, or -ENOMEM. Release with wfs_hasher_release() either way it ends. */
int wfs_hasher_init(struct wfs_hasher *h);
/* Restart from zero bytes without reallocating. */
void wfs_hasher_reset(struct wfs_hasher *h);
/* Feed @len bytes. */
void wfs_hasher_update(struct wfs_hasher *h, const void *buf, size_t len);
/* Digest of everything fed since init/reset; the hasher stays usable (more updates may follow). */
void wfs_hasher_digest(const struct wfs_hasher *h, struct wfs_digest *out);
/* Free the state. Safe on a zeroed or already released hasher. */
void wfs_hasher_release(struct wfs_hasher *h);

/* One-shot digest of @len bytes at @buf. */
void wfs_digest_buf(const void *buf, size_t len, struct wfs_digest *out);

/*
 * Digest of the whole file open at @fd (read with pread from offset 0 to EOF, @fd's offset untouched).
 * Writes the byte count to *@bytes when @bytes is not NULL. Returns 0, -ENOMEM, or the -errno of a
 * failed read (-EIO, ...). Out parameters are written only on success.
 */
int wfs_digest_fd(int fd, struct wfs_digest *out, uint64_t *bytes);
/*
 * Digest of the @bytes bytes of the file open at @fd from byte @offset (pread, @fd's offset
 * untouched): what the content would be named as an object, without copying it (a tensor inside a
 * safetensors file). Returns 0, -ENODATA (the file ends before @offset + @bytes), -ENOMEM, or the
 * -errno of a failed read. *@out is written only on success.
 */
int wfs_digest_range(int fd, uint64_t offset, uint64_t bytes, struct wfs_digest *out);

/* Hex spelling: writes 32 lower-case hex characters and a NUL into @hex (33 bytes). */
void wfs_digest_to_hex(const struct wfs_digest *d, char hex[WFS_DIGEST_HEX_CHARS + 1]);
/* Parse exactly 32 hex characters (either case) followed by NUL. Returns 0 or -EINVAL. */
int wfs_digest_from_hex(const char *hex, struct wfs_digest *out);

static inline bool wfs_digest_equal(const struct wfs_digest *a, const struct wfs_digest *b)
{
	for (int i = 0; i < WFS_DIGEST_BYTES; i++)
		if (a->bytes[i] != b->bytes[i])
			return false;
	return true;
}

#endif
