/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Check suite for lib/digest: golden XXH3-128 vectors in canonical hex, streaming versus one-shot,
 * digests of files, and the hex spelling both ways.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "digest.h"
#include "testutil.h"

#define MIB (1024u * 1024u)

/*
 * The "pattern" inputs: byte i is (i*131 + (i>>8)*7 + 1) mod 256. The vectors were produced once with
 * xxhsum 0.8.1:  printf '' | xxhsum -H2;  printf 'hello\n' | xxhsum -H2;  printf abc | xxhsum -H2;
 * python3 -c 'open("p","wb").write(bytes((i*131+(i>>8)*7+1)&255 for i in range(1<<20)))'; then
 * `head -c N p | xxhsum -H2` for N = 17, 129, 240, 241 and `xxhsum -H2 p` for the whole MiB.
 * The lengths reach XXH3's input-size branches: 0, 1–3, 4–8, 17–128, 129–240, >240 and many stripes.
 */
static void pattern(unsigned char *p, size_t len)
{
	for (size_t i = 0; i < len; i++)
		p[i] = (unsigned char)((i * 131u + (i >> 8) * 7u + 1u) & 0xffu);
}

struct golden {
	const char *text;  /* literal input, or NULL for the first @bytes bytes of pattern() */
	size_t bytes;
	const char *hex;
};

static const struct golden goldens[] = {
	{"", 0, "99aa06d3014798d86001c324468d497f"},
	{"hello\n", 6, "6bba86c7e069f56d5a10b435f1c8e49c"},
	{"abc", 3, "06b05ab6733a618578af5f94892f3950"},
	{NULL, 17, "40f38e34c8635f363964a62e19392dfb"},
	{NULL, 129, "b3cdd4ac5aaabfcadcf53479806d1efc"},
	{NULL, 240, "5d7e6aa5c25af182085fae5e31567298"},
	{NULL, 241, "c007238d4839af1e4ddfb221defd6188"},
	{NULL, MIB, "e0da42779583b0b5aca7bc9811662ea4"},
};
#define NGOLDEN (sizeof(goldens) / sizeof(goldens[0]))

/* The input of golden @i in a new buffer (free() it). */
static unsigned char *golden_input(size_t i)
{
	unsigned char *p = malloc(goldens[i].bytes + 1);

	ck_assert_ptr_nonnull(p);
	if (goldens[i].text)
		memcpy(p, goldens[i].text, goldens[i].bytes);
	else
		pattern(p, goldens[i].bytes);
	return p;
}

static void assert_hex(const struct wfs_digest *d, const char *want, const char *what)
{
	char hex[WFS_DIGEST_HEX_CHARS + 1];

	wfs_digest_to_hex(d, hex);
	ck_assert_msg(strcmp(hex, want) == 0, "%s: digest %s, want %s", what, hex, want);
}

/* ---- golden vectors -------------------------------------------------------------------------- */

START_TEST(test_golden_buf)
{
	unsigned char *in = golden_input((size_t)_i);
	struct wfs_digest d;

	wfs_digest_buf(in, goldens[_i].bytes, &d);
	assert_hex(&d, goldens[_i].hex, "wfs_digest_buf");
	free(in);
}
END_TEST

START_TEST(test_golden_hasher)
{
	unsigned char *in = golden_input((size_t)_i);
	struct wfs_hasher h = {0};
	struct wfs_digest d;

	ck_assert_int_eq(wfs_hasher_init(&h), 0);
	ck_assert_uint_eq(h.bytes, 0);
	wfs_hasher_update(&h, in, goldens[_i].bytes);
	ck_assert_uint_eq(h.bytes, goldens[_i].bytes);
	wfs_hasher_digest(&h, &d);
	assert_hex(&d, goldens[_i].hex, "hasher");
	wfs_hasher_release(&h);
	free(in);
}
END_TEST

/* The canonical form is big-endian: high 64 bits first. */
START_TEST(test_golden_bytes_canonical)
{
	static const uint8_t want[WFS_DIGEST_BYTES] = {0x99, 0xaa, 0x06, 0xd3, 0x01, 0x47, 0x98, 0xd8,
						       0x60, 0x01, 0xc3, 0x24, 0x46, 0x8d, 0x49, 0x7f};
	struct wfs_digest d;

	wfs_digest_buf("", 0, &d);
	ck_assert_mem_eq(d.bytes, want, WFS_DIGEST_BYTES);
}
END_TEST

/* ---- streaming ------------------------------------------------------------------------------- */

/* Random chunkings (including empty chunks) of 1 MiB + 7 bytes equal the one-shot digest. */
START_TEST(test_stream_random_chunks)
{
	const size_t len = MIB + 7;
	unsigned char *in = malloc(len);
	struct wfs_digest once, streamed;
	struct wfs_hasher h = {0};
	unsigned seed = 12345;

	ck_assert_ptr_nonnull(in);
	tu_fill(in, len, 99);
	wfs_digest_buf(in, len, &once);
	ck_assert_int_eq(wfs_hasher_init(&h), 0);
	for (int round = 0; round < 40; round++) {
		size_t off = 0;
		/* Alternate small chunks (inside XXH3's 256-byte buffer) and large ones. */
		size_t max = round % 2 ? 300 : 70000;

		wfs_hasher_reset(&h);
		ck_assert_uint_eq(h.bytes, 0);
		while (off < len) {
			size_t n = (size_t)rand_r(&seed) % (max + 1);

			if (n > len - off)
				n = len - off;
			wfs_hasher_update(&h, in + off, n);
			off += n;
		}
		ck_assert_uint_eq(h.bytes, len);
		wfs_hasher_digest(&h, &streamed);
		ck_assert_msg(wfs_digest_equal(&streamed, &once), "round %d: streamed digest differs", round);
	}
	wfs_hasher_release(&h);
	free(in);
}
END_TEST

/* Byte-at-a-time over the golden 241-byte input. */
START_TEST(test_stream_bytewise)
{
	unsigned char in[241];
	struct wfs_hasher h = {0};
	struct wfs_digest d;

	pattern(in, sizeof(in));
	ck_assert_int_eq(wfs_hasher_init(&h), 0);
	for (size_t i = 0; i < sizeof(in); i++)
		wfs_hasher_update(&h, in + i, 1);
	wfs_hasher_digest(&h, &d);
	assert_hex(&d, "c007238d4839af1e4ddfb221defd6188", "bytewise");
	wfs_hasher_release(&h);
}
END_TEST

/* A digest mid-stream does not disturb the hasher: "hel" then "lo\n" still gives "hello\n". */
START_TEST(test_stream_digest_midway)
{
	struct wfs_hasher h = {0};
	struct wfs_digest d;

	ck_assert_int_eq(wfs_hasher_init(&h), 0);
	wfs_hasher_update(&h, "abc", 3);
	wfs_hasher_digest(&h, &d);
	assert_hex(&d, "06b05ab6733a618578af5f94892f3950", "after abc");
	wfs_hasher_reset(&h);
	wfs_hasher_update(&h, "hel", 3);
	wfs_hasher_digest(&h, &d);
	wfs_hasher_update(&h, "lo\n", 3);
	wfs_hasher_digest(&h, &d);
	assert_hex(&d, "6bba86c7e069f56d5a10b435f1c8e49c", "after hel+lo");
	ck_assert_uint_eq(h.bytes, 6);
	wfs_hasher_reset(&h);
	wfs_hasher_digest(&h, &d);
	assert_hex(&d, "99aa06d3014798d86001c324468d497f", "after reset");
	wfs_hasher_release(&h);
}
END_TEST

START_TEST(test_stream_release_twice)
{
	struct wfs_hasher zeroed = {0}, h = {0};

	wfs_hasher_release(&zeroed); /* zeroed: a no-op */
	ck_assert_ptr_null(zeroed.state);
	ck_assert_int_eq(wfs_hasher_init(&h), 0);
	ck_assert_ptr_nonnull(h.state);
	wfs_hasher_release(&h);
	ck_assert_ptr_null(h.state);
	wfs_hasher_release(&h);
	ck_assert_ptr_null(h.state);
}
END_TEST

/* ---- files ----------------------------------------------------------------------------------- */

/* wfs_digest_fd over files of golden and larger sizes equals wfs_digest_buf and reports the bytes. */
START_TEST(test_fd_equals_buf)
{
	/* Sizes around the 1 MiB read size of wfs_digest_fd and the golden sizes. */
	static const size_t sizes[] = {0, 1, 241, MIB - 1, MIB, MIB + 1, 3 * MIB + 17};
	char path[300];

	tu_path(path, sizeof(path), tu_test_dir, "f");
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		unsigned char *in = malloc(sizes[k] + 1);
		struct wfs_digest a, b;
		uint64_t bytes = 12345;
		int fd;

		ck_assert_ptr_nonnull(in);
		tu_fill(in, sizes[k], k);
		ck_assert_int_eq(tu_write_file(path, in, sizes[k], 0644), 0);
		fd = open(path, O_RDONLY);
		ck_assert_int_ge(fd, 0);
		ck_assert_int_eq(wfs_digest_fd(fd, &a, &bytes), 0);
		ck_assert_uint_eq(bytes, sizes[k]);
		wfs_digest_buf(in, sizes[k], &b);
		ck_assert_msg(wfs_digest_equal(&a, &b), "size %zu: fd digest differs from buf digest", sizes[k]);
		/* NULL byte count is allowed. */
		ck_assert_int_eq(wfs_digest_fd(fd, &a, NULL), 0);
		ck_assert(wfs_digest_equal(&a, &b));
		close(fd);
		free(in);
	}
}
END_TEST

/* A range of a file hashes as those bytes alone (a tensor inside a safetensors file). */
START_TEST(test_range_equals_buf)
{
	const size_t size = 3 * MIB + 17;
	static const uint64_t ranges[][2] = {{0, 0}, {0, 1}, {8, 241}, {100, MIB}, {1, 3 * MIB + 16}, {MIB - 3, MIB + 9}};
	unsigned char *in = malloc(size);
	struct wfs_digest a, b;
	char path[300];
	int fd;

	ck_assert_ptr_nonnull(in);
	tu_fill(in, size, 7);
	tu_path(path, sizeof(path), tu_test_dir, "f");
	ck_assert_int_eq(tu_write_file(path, in, size, 0644), 0);
	fd = open(path, O_RDONLY);
	ck_assert_int_ge(fd, 0);
	for (size_t k = 0; k < sizeof(ranges) / sizeof(ranges[0]); k++) {
		ck_assert_int_eq(wfs_digest_range(fd, ranges[k][0], ranges[k][1], &a), 0);
		wfs_digest_buf(in + ranges[k][0], ranges[k][1], &b);
		ck_assert_msg(wfs_digest_equal(&a, &b), "range %d: differs", (int)k);
	}
	ck_assert_int_eq(lseek(fd, 0, SEEK_CUR), 0); /* pread: the offset is the caller's */
	memset(&a, 0xab, sizeof(a));
	ck_assert_int_eq(wfs_digest_range(fd, size - 10, 11, &a), -ENODATA); /* past the end */
	ck_assert_uint_eq(a.bytes[0], 0xab); /* untouched on error */
	close(fd);
	free(in);
}
END_TEST

START_TEST(test_fd_golden_mib)
{
	unsigned char *in = malloc(MIB);
	struct wfs_digest d;
	uint64_t bytes = 0;
	char path[300];
	int fd;

	ck_assert_ptr_nonnull(in);
	pattern(in, MIB);
	tu_path(path, sizeof(path), tu_test_dir, "p");
	ck_assert_int_eq(tu_write_file(path, in, MIB, 0644), 0);
	fd = open(path, O_RDONLY);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(wfs_digest_fd(fd, &d, &bytes), 0);
	ck_assert_uint_eq(bytes, MIB);
	assert_hex(&d, "e0da42779583b0b5aca7bc9811662ea4", "fd of pattern MiB");
	close(fd);
	free(in);
}
END_TEST

/* The digest covers the whole file from offset 0, and the descriptor's offset is left alone. */
START_TEST(test_fd_offset_untouched)
{
	struct wfs_digest d;
	uint64_t bytes = 0;
	char path[300];
	int fd;

	tu_path(path, sizeof(path), tu_test_dir, "h");
	ck_assert_int_eq(tu_write_file(path, "hello\n", 6, 0644), 0);
	fd = open(path, O_RDONLY);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(lseek(fd, 4, SEEK_SET), 4);
	ck_assert_int_eq(wfs_digest_fd(fd, &d, &bytes), 0);
	ck_assert_uint_eq(bytes, 6);
	assert_hex(&d, "6bba86c7e069f56d5a10b435f1c8e49c", "fd at offset 4");
	ck_assert_int_eq(lseek(fd, 0, SEEK_CUR), 4);
	close(fd);
}
END_TEST

/*
 * A sparse file hashes as the zeros its holes read as (without reading them): data at the start, in
 * the middle and before a trailing hole, the same digest as the whole buffer.
 */
START_TEST(test_fd_sparse)
{
	enum { SIZE = 64 << 20 };
	unsigned char *buf = calloc(1, SIZE);
	struct wfs_digest d, want;
	uint64_t bytes = 0;
	char path[300];
	int fd;

	ck_assert_ptr_nonnull(buf);
	tu_path(path, sizeof(path), tu_test_dir, "sparse");
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	ck_assert_int_ge(fd, 0);
	memcpy(buf, "head", 4);
	memcpy(buf + (SIZE / 2) + 123, "middle", 6);
	memcpy(buf + SIZE - (8 << 20), "tail", 4); /* then an 8 MiB hole to the end */
	ck_assert_int_eq(pwrite(fd, buf, 4, 0), 4);
	ck_assert_int_eq(pwrite(fd, buf + (SIZE / 2) + 123, 6, (SIZE / 2) + 123), 6);
	ck_assert_int_eq(pwrite(fd, buf + SIZE - (8 << 20), 4, SIZE - (8 << 20)), 4);
	ck_assert_int_eq(ftruncate(fd, SIZE), 0);
	ck_assert_int_eq(wfs_digest_fd(fd, &d, &bytes), 0);
	ck_assert_uint_eq(bytes, SIZE);
	wfs_digest_buf(buf, SIZE, &want);
	ck_assert(wfs_digest_equal(&d, &want));
	close(fd);
	free(buf);
}
END_TEST

/*
 * Data runs of 32 MiB and more are read by several threads and hashed in order (digest.c): the
 * digest is still the one of the bytes, with holes between runs, a run that does not end on a read
 * boundary, and a file without holes at all.
 */
START_TEST(test_fd_parallel_runs)
{
	enum { SIZE = 90 * (1 << 20) + 12345 };
	unsigned char *buf = calloc(1, SIZE);
	struct wfs_digest d, want;
	uint64_t bytes = 0;
	char path[300];
	int fd;

	ck_assert_ptr_nonnull(buf);
	tu_fill(buf, 40 * MIB + 777, 11);            /* a 40 MiB run, then a hole */
	tu_fill(buf + 50 * MIB, SIZE - 50 * MIB, 12); /* a run to the end */
	tu_path(path, sizeof(path), tu_test_dir, "runs");
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(tu_write_all(fd, buf, 40 * MIB + 777), 0);
	ck_assert_int_eq(pwrite(fd, buf + 50 * MIB, SIZE - 50 * MIB, 50 * MIB), SIZE - 50 * MIB);
	ck_assert_int_eq(wfs_digest_fd(fd, &d, &bytes), 0);
	ck_assert_uint_eq(bytes, SIZE);
	wfs_digest_buf(buf, SIZE, &want);
	ck_assert(wfs_digest_equal(&d, &want));
	/* All data: one run of the whole file. */
	ck_assert_int_eq(pwrite(fd, buf + 40 * MIB, 10 * MIB, 40 * MIB), 10 * MIB);
	ck_assert_int_eq(wfs_digest_fd(fd, &d, &bytes), 0);
	ck_assert(wfs_digest_equal(&d, &want));
	close(fd);
	free(buf);
}
END_TEST

/* Read errors come back as -errno and leave the out parameters alone. */
START_TEST(test_fd_errors)
{
	struct wfs_digest d, before;
	uint64_t bytes = 777;
	char path[300];
	int fd;

	memset(&d, 0x5a, sizeof(d));
	before = d;
	tu_path(path, sizeof(path), tu_test_dir, "w");
	fd = open(path, O_WRONLY | O_CREAT, 0644);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(wfs_digest_fd(fd, &d, &bytes), -EBADF);
	close(fd);
	fd = open(tu_test_dir, O_RDONLY | O_DIRECTORY);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(wfs_digest_fd(fd, &d, &bytes), -EISDIR);
	close(fd);
	ck_assert_int_eq(wfs_digest_fd(-1, &d, &bytes), -EBADF);
	ck_assert_mem_eq(d.bytes, before.bytes, WFS_DIGEST_BYTES);
	ck_assert_uint_eq(bytes, 777);
}
END_TEST

/* ---- hex ------------------------------------------------------------------------------------- */

START_TEST(test_hex_round_trip)
{
	char hex[WFS_DIGEST_HEX_CHARS + 1], again[WFS_DIGEST_HEX_CHARS + 1];
	struct wfs_digest d, back;

	for (uint64_t seed = 0; seed < 200; seed++) {
		tu_fill(d.bytes, sizeof(d.bytes), seed);
		memset(hex, 'x', sizeof(hex));
		wfs_digest_to_hex(&d, hex);
		ck_assert_uint_eq(strlen(hex), WFS_DIGEST_HEX_CHARS);
		ck_assert_uint_eq(strspn(hex, "0123456789abcdef"), WFS_DIGEST_HEX_CHARS);
		ck_assert_int_eq(wfs_digest_from_hex(hex, &back), 0);
		ck_assert_mem_eq(back.bytes, d.bytes, WFS_DIGEST_BYTES);
		wfs_digest_to_hex(&back, again);
		ck_assert_str_eq(again, hex);
	}
	/* Every byte value spells as two lower-case digits, high nibble first. */
	for (int i = 0; i < WFS_DIGEST_BYTES; i++)
		d.bytes[i] = (uint8_t)(i * 0x11);
	wfs_digest_to_hex(&d, hex);
	ck_assert_str_eq(hex, "00112233445566778899aabbccddeeff");
}
END_TEST

START_TEST(test_hex_upper_case)
{
	struct wfs_digest lower, upper, mixed;

	ck_assert_int_eq(wfs_digest_from_hex("99aa06d3014798d86001c324468d497f", &lower), 0);
	ck_assert_int_eq(wfs_digest_from_hex("99AA06D3014798D86001C324468D497F", &upper), 0);
	ck_assert_int_eq(wfs_digest_from_hex("99Aa06d3014798D86001c324468d497F", &mixed), 0);
	ck_assert(wfs_digest_equal(&lower, &upper));
	ck_assert(wfs_digest_equal(&lower, &mixed));
	ck_assert_uint_eq(lower.bytes[0], 0x99);
	ck_assert_uint_eq(lower.bytes[15], 0x7f);
}
END_TEST

START_TEST(test_hex_rejects)
{
	static const char *const bad[] = {
		"",
		"9",
		"99aa06d3014798d86001c324468d497",   /* 31 */
		"99aa06d3014798d86001c324468d497f0", /* 33 */
		"99aa06d3014798d86001c324468d497g",  /* non-hex last */
		"g9aa06d3014798d86001c324468d497f",  /* non-hex first */
		"99aa06d3014798d8-001c324468d497f",
		" 99aa06d3014798d86001c324468d497",
		"99aa06d3014798d86001c324468d497 ",
		"0x99aa06d3014798d86001c324468d49",
		"99aa06d3014798d86001c324468d497f\n",
	};
	struct wfs_digest d, before;

	memset(&d, 0xa5, sizeof(d));
	before = d;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_msg(wfs_digest_from_hex(bad[i], &d) == -EINVAL, "accepted \"%s\"", bad[i]);
		ck_assert_mem_eq(d.bytes, before.bytes, WFS_DIGEST_BYTES);
	}
}
END_TEST

START_TEST(test_digest_equal)
{
	struct wfs_digest a, b;

	wfs_digest_buf("abc", 3, &a);
	b = a;
	ck_assert(wfs_digest_equal(&a, &b));
	b.bytes[15] ^= 1;
	ck_assert(!wfs_digest_equal(&a, &b));
	b = a;
	b.bytes[0] ^= 0x80;
	ck_assert(!wfs_digest_equal(&a, &b));
}
END_TEST

static Suite *digest_suite(void)
{
	Suite *s = suite_create("digest");
	TCase *tc;

	tc = tcase_create("golden");
	tcase_add_loop_test(tc, test_golden_buf, 0, (int)NGOLDEN);
	tcase_add_loop_test(tc, test_golden_hasher, 0, (int)NGOLDEN);
	tcase_add_test(tc, test_golden_bytes_canonical);
	suite_add_tcase(s, tc);

	tc = tcase_create("streaming");
	tcase_add_test(tc, test_stream_random_chunks);
	tcase_add_test(tc, test_stream_bytewise);
	tcase_add_test(tc, test_stream_digest_midway);
	tcase_add_test(tc, test_stream_release_twice);
	tcase_set_timeout(tc, 30);
	suite_add_tcase(s, tc);

	tc = tcase_create("fd");
	tcase_add_checked_fixture(tc, tu_test_dir_setup, tu_test_dir_teardown);
	tcase_add_test(tc, test_fd_equals_buf);
	tcase_add_test(tc, test_range_equals_buf);
	tcase_add_test(tc, test_fd_golden_mib);
	tcase_add_test(tc, test_fd_offset_untouched);
	tcase_add_test(tc, test_fd_sparse);
	tcase_add_test(tc, test_fd_parallel_runs);
	tcase_add_test(tc, test_fd_errors);
	tcase_set_timeout(tc, 30);
	suite_add_tcase(s, tc);

	tc = tcase_create("hex");
	tcase_add_test(tc, test_hex_round_trip);
	tcase_add_test(tc, test_hex_upper_case);
	tcase_add_test(tc, test_hex_rejects);
	tcase_add_test(tc, test_digest_equal);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tu_main("check_digest", digest_suite(), TU_RUN_DIR, NULL);
}
