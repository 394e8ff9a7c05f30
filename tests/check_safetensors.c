/* SPDX-License-Identifier: Apache-2.0 */
/* safetensors: header parser, writer, index, names (lib/safetensors.h). */
#include <errno.h>
#include <string.h>

#include "safetensors.h"
#include "testutil.h"

/* A file: 8-byte length of @json, @json, then @data_bytes zero bytes. */
struct blob {
	char *p;
	size_t len;
};

static struct blob make(const char *json, size_t data_bytes)
{
	size_t n = strlen(json);
	struct blob b = {.len = 8 + n + data_bytes};

	b.p = calloc(1, b.len);
	ck_assert_ptr_nonnull(b.p);
	for (int i = 0; i < 8; i++)
		b.p[i] = (char)((uint64_t)n >> (8 * i));
	memcpy(b.p + 8, json, n);
	return b;
}

/* Parse @json + @data_bytes; expect -EINVAL and exactly @msg. */
static void rejects(const char *json, size_t data_bytes, const char *msg)
{
	struct blob b = make(json, data_bytes);
	struct wfs_st_file *f = (void *)1;
	char err[WFS_ST_ERR_MAX] = "";
	int ret = wfs_st_parse(b.p, b.len, b.len, &f, err, sizeof(err));

	ck_assert_msg(ret == -EINVAL, "%s: returned %d, want -EINVAL (%s)", json, ret, err);
	ck_assert_str_eq(err, msg);
	ck_assert_ptr_eq(f, (void *)1); /* untouched on error */
	free(b.p);
}

static struct wfs_st_file *accepts(const char *json, size_t data_bytes)
{
	struct blob b = make(json, data_bytes);
	struct wfs_st_file *f = NULL;
	char err[WFS_ST_ERR_MAX] = "";
	int ret = wfs_st_parse(b.p, b.len, b.len, &f, err, sizeof(err));

	ck_assert_msg(ret == 0, "%s: %d: %s", json, ret, err);
	free(b.p);
	return f;
}

/* ---- accepted ---------------------------------------------------------------------------------- */

START_TEST(parse_valid)
{
	struct wfs_st_file *f = accepts(
		"{\"__metadata__\":{\"format\":\"pt\",\"a\":\"b\"},"
		"\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[4,16]},"
		"\"s\":{\"data_offsets\":[0,4],\"shape\":[],\"dtype\":\"F32\"}}   ",
		16);

	ck_assert_uint_eq(f->header_bytes, 152);
	ck_assert_uint_eq(f->data_bytes, 16);
	ck_assert_uint_eq(f->ntensors, 2);
	/* in data order, not key order */
	ck_assert_str_eq(f->tensors[0].name, "s");
	ck_assert_str_eq(f->tensors[0].dtype, "F32");
	ck_assert_uint_eq(f->tensors[0].dtype_bytes, 4);
	ck_assert_uint_eq(f->tensors[0].ndim, 0);
	ck_assert_uint_eq(f->tensors[0].begin, 0);
	ck_assert_uint_eq(f->tensors[0].end, 4);
	ck_assert_str_eq(f->tensors[1].name, "w");
	ck_assert_str_eq(f->tensors[1].dtype, "BF16");
	ck_assert_uint_eq(f->tensors[1].ndim, 2);
	ck_assert_uint_eq(f->tensors[1].shape[0], 2);
	ck_assert_uint_eq(f->tensors[1].shape[1], 3);
	ck_assert_uint_eq(f->tensors[1].begin, 4);
	ck_assert_uint_eq(f->tensors[1].end, 16);
	ck_assert(f->has_metadata);
	ck_assert_uint_eq(f->nmeta, 2);
	ck_assert_str_eq(f->meta[0].key, "a"); /* sorted by key */
	ck_assert_str_eq(f->meta[1].key, "format");
	ck_assert_str_eq(f->meta[1].value, "pt");
	wfs_st_free(f);
}
END_TEST

START_TEST(parse_edge_cases)
{
	struct wfs_st_file *f = accepts("{}", 0);

	ck_assert_uint_eq(f->ntensors, 0);
	ck_assert(!f->has_metadata);
	wfs_st_free(f);

	f = accepts(" \n{\"__metadata__\":{}}\t", 0);
	ck_assert(f->has_metadata);
	ck_assert_uint_eq(f->nmeta, 0);
	wfs_st_free(f);

	/* Empty tensors share offsets with each other and with the next tensor: no overlap. */
	f = accepts("{\"z\":{\"dtype\":\"F16\",\"shape\":[0,4],\"data_offsets\":[0,0]},"
		    "\"y\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},"
		    "\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
		    "\"e\":{\"dtype\":\"I64\",\"shape\":[3,0],\"data_offsets\":[2,2]}}",
		    2);
	ck_assert_uint_eq(f->ntensors, 4);
	ck_assert_str_eq(f->tensors[0].name, "y"); /* [0,0] by name, then [0,2], then [2,2] */
	ck_assert_str_eq(f->tensors[1].name, "z");
	ck_assert_str_eq(f->tensors[2].name, "x");
	ck_assert_str_eq(f->tensors[3].name, "e");
	wfs_st_free(f);

	/* Every dtype, including F8_E8M0 and C64; a zero dimension wins over an overflowing product. */
	f = accepts("{\"a\":{\"dtype\":\"F8_E8M0\",\"shape\":[1],\"data_offsets\":[0,1]},"
		    "\"b\":{\"dtype\":\"C64\",\"shape\":[1],\"data_offsets\":[1,9]},"
		    "\"c\":{\"dtype\":\"U64\",\"shape\":[4294967296,4294967296,0],\"data_offsets\":[9,9]}}",
		    9);
	ck_assert_uint_eq(f->tensors[1].dtype_bytes, 8);
	wfs_st_free(f);

	/* Escapes and UTF-8 in names come back decoded. */
	f = accepts("{\"caf\\u00e9/\\\"q\\\"\\n\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
	ck_assert_str_eq(f->tensors[0].name, "caf\xc3\xa9/\"q\"\n");
	wfs_st_free(f);
}
END_TEST

START_TEST(parse_prefix_only)
{
	/* The header alone, with the file's real size: the data need not be in memory. */
	struct blob b = make("{\"a\":{\"dtype\":\"U8\",\"shape\":[1000],\"data_offsets\":[0,1000]}}", 0);
	struct wfs_st_file *f = NULL;
	char err[WFS_ST_ERR_MAX] = "";

	ck_assert_int_eq(wfs_st_parse(b.p, b.len, b.len + 1000, &f, err, sizeof(err)), 0);
	ck_assert_uint_eq(f->data_bytes, 1000);
	wfs_st_free(f);
	/* Fewer bytes than the header: -ENOBUFS, read more. */
	ck_assert_int_eq(wfs_st_parse(b.p, b.len - 1, b.len + 1000, &f, err, sizeof(err)), -ENOBUFS);
	ck_assert_int_eq(wfs_st_parse(b.p, 5, b.len + 1000, &f, err, sizeof(err)), -ENOBUFS);
	free(b.p);
}
END_TEST

/* ---- refused ------------------------------------------------------------------------------------ */

START_TEST(reject_truncated)
{
	char buf[16] = {4, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
	struct wfs_st_file *f = NULL;
	char err[WFS_ST_ERR_MAX];
	uint64_t n = 77;

	ck_assert_int_eq(wfs_st_parse(buf, 4, 4, &f, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "byte 0: file is 4 bytes, shorter than the 8-byte header length");
	ck_assert_int_eq(wfs_st_parse(buf, 0, 0, &f, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "byte 0: file is 0 bytes, shorter than the 8-byte header length");
	/* header length 4, but the file ends 2 bytes into the header */
	ck_assert_int_eq(wfs_st_parse(buf, 10, 10, &f, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "byte 0: header length 4 runs past the end of the file (10 bytes)");
	ck_assert_int_eq(wfs_st_header_length(buf, 8, 11, &n, err, sizeof(err)), -EINVAL);
	ck_assert_uint_eq(n, 77);
	ck_assert_int_eq(wfs_st_header_length(buf, 8, 12, &n, NULL, 0), 0);
	ck_assert_uint_eq(n, 4);
}
END_TEST

START_TEST(reject_huge_header)
{
	unsigned char buf[8] = {0x01, 0xe1, 0xf5, 0x05, 0, 0, 0, 0}; /* 100,000,001 */
	unsigned char max[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
	char err[WFS_ST_ERR_MAX];
	uint64_t n;

	ck_assert_int_eq(wfs_st_header_length(buf, 8, 1ull << 40, &n, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "byte 0: header length 100000001 is over the 100000000-byte limit");
	ck_assert_int_eq(wfs_st_header_length(max, 8, UINT64_MAX, &n, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "byte 0: header length 18446744073709551615 is over the 100000000-byte limit");
	buf[0] = 0x00; /* exactly the limit: allowed when the file is long enough */
	ck_assert_int_eq(wfs_st_header_length(buf, 8, 100000008, &n, err, sizeof(err)), 0);
	ck_assert_uint_eq(n, 100000000);
}
END_TEST

START_TEST(reject_bad_json)
{
	struct blob b = make("{\"a\":{\"dtype\":\"F32\",}}", 0);
	struct wfs_st_file *f = NULL;
	char err[WFS_ST_ERR_MAX];

	ck_assert_int_eq(wfs_st_parse(b.p, b.len, b.len, &f, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strncmp(err, "byte 29: invalid JSON: ", 23) == 0, "%s", err);
	free(b.p);
	b = make("{\"a\":\"\xff\"}", 0); /* not UTF-8 */
	ck_assert_int_eq(wfs_st_parse(b.p, b.len, b.len, &f, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strncmp(err, "byte 14: invalid JSON: unable to decode byte 0xff", 49) == 0, "%s", err);
	free(b.p);
	b = make("{} {}", 0);
	ck_assert_int_eq(wfs_st_parse(b.p, b.len, b.len, &f, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strncmp(err, "byte 12: invalid JSON: end of file expected", 43) == 0, "%s", err);
	free(b.p);
	b = make("", 0);
	ck_assert_int_eq(wfs_st_parse(b.p, b.len, b.len, &f, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strncmp(err, "byte 8: invalid JSON: ", 22) == 0, "%s", err);
	free(b.p);
	rejects("[1,2]", 0, "byte 8: the header is a JSON array, not an object");
	/* NUL in a key or a string: JSON allows it, a file name cannot hold it */
	b = make("{\"a\\u0000b\":{}}", 0);
	ck_assert_int_eq(wfs_st_parse(b.p, b.len, b.len, &f, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strncmp(err, "byte 19: invalid JSON: NUL byte in object key", 45) == 0, "%s", err);
	free(b.p);
}
END_TEST

START_TEST(reject_duplicate_key)
{
	struct blob b = make("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
			     "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
			     2);
	struct wfs_st_file *f = NULL;
	char err[WFS_ST_ERR_MAX];

	ck_assert_int_eq(wfs_st_parse(b.p, b.len, b.len, &f, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "byte 64: invalid JSON: duplicate object key near '\"a\"'");
	free(b.p);
}
END_TEST

START_TEST(reject_dtype)
{
	rejects("{\"a\":{\"dtype\":\"F31\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
		"byte 22: tensor 'a': dtype 'F31' is not a safetensors dtype (BF16, F16, F32, I8, U8, BOOL, F8_E4M3, ...)");
	rejects("{\"a\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
		"byte 22: tensor 'a': dtype 'f32' is not a safetensors dtype (BF16, F16, F32, I8, U8, BOOL, F8_E4M3, ...)");
	rejects("{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
		"byte 22: tensor 'a': dtype (not a string) is not a safetensors dtype (BF16, F16, F32, I8, U8, BOOL, F8_E4M3, ...)");
	rejects("{\"a\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}", 1,
		"byte 22: tensor 'a': dtype F4 has elements smaller than a byte, which weightfs does not support");
	rejects("{\"a\":{\"dtype\":\"F6_E3M2\",\"shape\":[4],\"data_offsets\":[0,3]}}", 3,
		"byte 22: tensor 'a': dtype F6_E3M2 has elements smaller than a byte, which weightfs does not support");
}
END_TEST

START_TEST(reject_shape)
{
	rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0,
		"byte 35: tensor 'a': shape[0] is not a non-negative integer");
	rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[2,1.0],\"data_offsets\":[0,2]}}", 2,
		"byte 35: tensor 'a': shape[1] is not a non-negative integer");
	rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":\"[2]\",\"data_offsets\":[0,2]}}", 2,
		"byte 35: tensor 'a': shape is not an array");
	rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
		"1],\"data_offsets\":[0,1]}}",
		1, "byte 35: tensor 'a': shape has 33 dimensions, over 32");
	/* elements overflow, and elements fit but bytes do not */
	rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0,
		"byte 35: tensor 'a': U8 x [4294967296,4294967296] overflows 64 bits");
	rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0,
		"byte 36: tensor 'a': F32 x [4611686018427387904] overflows 64 bits");
}
END_TEST

START_TEST(reject_fields)
{
	rejects("{\"a\":[1]}", 0, "byte 13: tensor 'a': not an object");
	rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 0, "byte 13: tensor 'a': no data_offsets");
	rejects("{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "byte 13: tensor 'a': no dtype");
	rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":0}}", 1,
		"byte 64: tensor 'a': unknown field 'x' (only dtype, shape, data_offsets)");
	rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1,
		"byte 54: tensor 'a': data_offsets is not [BEGIN, END] of non-negative integers");
	rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,-1]}}", 1,
		"byte 54: tensor 'a': data_offsets is not [BEGIN, END] of non-negative integers");
	rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[1,0]}}", 1,
		"byte 54: tensor 'a': data_offsets [1, 0] end before they begin");
}
END_TEST

START_TEST(reject_offsets)
{
	/* The issue's own example. */
	rejects("{\"a.weight\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,10]}}", 10,
		"byte 62: tensor 'a.weight': data_offsets [0, 10] but F32 x [3] is 12 bytes");
	rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}", 4,
		"byte 54: tensor 'a': data_offsets [0, 8] run past the data buffer (4 bytes)");
	rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
		"\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[4,12]}}",
		12, "byte 106: tensor 'b': data_offsets [4, 12] overlap tensor 'a' [0, 8]");
	/* Two tensors on the same bytes. */
	rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
		"\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}",
		8, "byte 106: tensor 'b': data_offsets [0, 8] overlap tensor 'a' [0, 8]");
	rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
		"\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[8,12]}}",
		12, "byte 106: tensor 'b': data_offsets [8, 12] leave a hole: data bytes [4, 8) belong to no tensor");
	/* The buffer must start at 0 ... */
	rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}", 6,
		"byte 54: tensor 'a': data_offsets [2, 6] leave a hole: data bytes [0, 2) belong to no tensor");
	/* ... and end at the end of the file. */
	rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 6,
		"byte 65: the last 2 bytes of the data buffer belong to no tensor (the tensors end at data byte 4 of 6)");
	rejects("{}", 3, "byte 10: the last 3 bytes of the data buffer belong to no tensor (the tensors end at data byte 0 of 3)");
}
END_TEST

START_TEST(reject_metadata)
{
	rejects("{\"__metadata__\":{\"format\":1}}", 0, "byte 34: __metadata__ 'format': value is not a string");
	rejects("{\"__metadata__\":{\"a\":\"b\",\"c\":null}}", 0, "byte 37: __metadata__ 'c': value is not a string");
	rejects("{\"__metadata__\":[\"pt\"]}", 0, "byte 24: __metadata__ is not an object of strings");
	rejects("{\"__metadata__\":\"pt\"}", 0, "byte 24: __metadata__ is not an object of strings");
}
END_TEST

START_TEST(reject_names_shown_safely)
{
	char json[1024], want[512], name[201];

	/* A control character in a name prints as '?'; a long name is cut with "...". */
	rejects("{\"a\\u0001b\":{\"dtype\":\"F31\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
		"byte 29: tensor 'a?b': dtype 'F31' is not a safetensors dtype (BF16, F16, F32, I8, U8, BOOL, F8_E4M3, ...)");
	memset(name, 'n', 200);
	name[200] = '\0';
	snprintf(json, sizeof(json), "{\"%s\":{\"dtype\":\"F31\",\"shape\":[1],\"data_offsets\":[0,4]}}", name);
	snprintf(want, sizeof(want),
		 "byte 221: tensor '%.80s...': dtype 'F31' is not a safetensors dtype (BF16, F16, F32, I8, U8, BOOL, F8_E4M3, ...)",
		 name);
	rejects(json, 4, want);
}
END_TEST

/* ---- writer ------------------------------------------------------------------------------------- */

static struct wfs_st_file *sample(bool reversed)
{
	static const struct {
		const char *name, *dtype;
		unsigned ndim;
		uint64_t shape[2];
	} t[] = {
		{"model.embed.weight", "BF16", 2, {4, 8}}, {"b", "U8", 1, {3}},       {"a", "U8", 1, {5}},
		{"scalar", "F64", 0, {0}},                 {"layers/0/w", "F32", 2, {2, 2}}, {"empty", "I16", 1, {0}},
		{"q\"\\\n\x01\x7f\xc3\xa9", "I8", 1, {1}}, {"flags", "BOOL", 1, {2}},
	};
	struct wfs_st_file *f = wfs_st_new();
	size_t n = sizeof(t) / sizeof(t[0]);

	ck_assert_ptr_nonnull(f);
	for (size_t i = 0; i < n; i++) {
		size_t k = reversed ? n - 1 - i : i;

		ck_assert_int_eq(wfs_st_add_tensor(f, t[k].name, t[k].dtype, t[k].ndim, t[k].shape), 0);
	}
	ck_assert_int_eq(wfs_st_set_meta(f, reversed ? "z" : "format", reversed ? "last" : "pt"), 0);
	ck_assert_int_eq(wfs_st_set_meta(f, reversed ? "format" : "z", reversed ? "pt" : "last"), 0);
	return f;
}

START_TEST(write_layout)
{
	static const char *order[] = {"scalar", "layers/0/w", "model.embed.weight", "empty", "q\"\\\n\x01\x7f\xc3\xa9",
				      "a", "b", "flags"};
	struct wfs_st_file *f = sample(false);
	char err[WFS_ST_ERR_MAX];
	uint64_t at = 0;

	ck_assert_int_eq(wfs_st_layout(f, err, sizeof(err)), 0);
	for (size_t i = 0; i < f->ntensors; i++) {
		ck_assert_str_eq(f->tensors[i].name, order[i]); /* F64, F32, BF16, I16, I8, U8 by name, BOOL */
		ck_assert_uint_eq(f->tensors[i].begin, at);
		at = f->tensors[i].end;
	}
	ck_assert_uint_eq(f->data_bytes, 8 + 16 + 64 + 0 + 1 + 5 + 3 + 2);
	ck_assert_uint_eq(f->data_bytes, at);
	wfs_st_free(f);
}
END_TEST

START_TEST(write_golden)
{
	/* The reference writer's bytes for this content (safetensors serialize(), torch metadata). */
	static const char want_json[] =
		"{\"__metadata__\":{\"format\":\"pt\"},"
		"\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		"\"a\\\"\\\\\\b\\f\\n\\r\\t\\u0001\\u001f\x7f\xc3\xa9\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]},"
		"\"t\":{\"dtype\":\"BOOL\",\"shape\":[],\"data_offsets\":[11,12]}}  ";
	uint64_t two = 2, three = 3;
	struct wfs_st_file *f = wfs_st_new();
	char err[WFS_ST_ERR_MAX], *out;
	size_t len, n = strlen(want_json);

	ck_assert_int_eq(wfs_st_add_tensor(f, "t", "BOOL", 0, NULL), 0);
	ck_assert_int_eq(wfs_st_add_tensor(f, "a\"\\\b\f\n\r\t\x01\x1f\x7f\xc3\xa9", "U8", 1, &three), 0);
	ck_assert_int_eq(wfs_st_add_tensor(f, "w", "F32", 1, &two), 0);
	ck_assert_int_eq(wfs_st_set_meta(f, "format", "pt"), 0);
	ck_assert_int_eq(wfs_st_layout(f, err, sizeof(err)), 0);
	ck_assert_int_eq(wfs_st_encode(f, &out, &len), 0);
	ck_assert_uint_eq(n % 8, 0);
	ck_assert_uint_eq(len, 8 + n);
	ck_assert_uint_eq(f->header_bytes, n);
	for (int i = 0; i < 8; i++)
		ck_assert_uint_eq((unsigned char)out[i], (n >> (8 * i)) & 0xff);
	ck_assert_msg(memcmp(out + 8, want_json, n) == 0, "got %.*s", (int)(len - 8), out + 8);
	free(out);
	wfs_st_free(f);
}
END_TEST

/* parse(encode(x)) == x, and encode(parse(encode(x))) == encode(x). */
START_TEST(write_round_trip)
{
	struct wfs_st_file *f = sample(false), *g = NULL;
	char err[WFS_ST_ERR_MAX], *out, *again, *file;
	size_t len, len2;

	ck_assert_int_eq(wfs_st_layout(f, err, sizeof(err)), 0);
	ck_assert_int_eq(wfs_st_encode(f, &out, &len), 0);
	file = calloc(1, len + f->data_bytes);
	memcpy(file, out, len);
	ck_assert_int_eq(wfs_st_parse(file, len + f->data_bytes, len + f->data_bytes, &g, err, sizeof(err)), 0);
	ck_assert_uint_eq(g->ntensors, f->ntensors);
	ck_assert_uint_eq(g->header_bytes, f->header_bytes);
	ck_assert_uint_eq(g->data_bytes, f->data_bytes);
	for (size_t i = 0; i < f->ntensors; i++) {
		ck_assert_str_eq(g->tensors[i].name, f->tensors[i].name);
		ck_assert_str_eq(g->tensors[i].dtype, f->tensors[i].dtype);
		ck_assert_uint_eq(g->tensors[i].ndim, f->tensors[i].ndim);
		for (unsigned d = 0; d < f->tensors[i].ndim; d++)
			ck_assert_uint_eq(g->tensors[i].shape[d], f->tensors[i].shape[d]);
		ck_assert_uint_eq(g->tensors[i].begin, f->tensors[i].begin);
		ck_assert_uint_eq(g->tensors[i].end, f->tensors[i].end);
	}
	ck_assert(g->has_metadata);
	ck_assert_uint_eq(g->nmeta, 2);
	ck_assert_str_eq(g->meta[0].key, "format");
	ck_assert_str_eq(g->meta[0].value, "pt");
	ck_assert_str_eq(g->meta[1].key, "z");
	ck_assert_int_eq(wfs_st_encode(g, &again, &len2), 0);
	ck_assert_uint_eq(len2, len);
	ck_assert(memcmp(again, out, len) == 0);
	free(again);
	free(out);
	free(file);
	wfs_st_free(g);
	wfs_st_free(f);
}
END_TEST

START_TEST(write_deterministic)
{
	struct wfs_st_file *f = sample(false), *g = sample(true);
	char err[WFS_ST_ERR_MAX], *a, *b;
	size_t la, lb;

	ck_assert_int_eq(wfs_st_layout(f, err, sizeof(err)), 0);
	ck_assert_int_eq(wfs_st_layout(g, err, sizeof(err)), 0);
	ck_assert_int_eq(wfs_st_encode(f, &a, &la), 0);
	ck_assert_int_eq(wfs_st_encode(g, &b, &lb), 0);
	ck_assert_uint_eq(la, lb);
	ck_assert(memcmp(a, b, la) == 0);
	free(a);
	free(b);
	wfs_st_free(f);
	wfs_st_free(g);
}
END_TEST

START_TEST(write_refuses)
{
	uint64_t big[2] = {4294967296ull, 4294967296ull}, one = 1, dims[33];
	struct wfs_st_file *f = wfs_st_new();
	char err[WFS_ST_ERR_MAX], *out;
	size_t len;

	for (int i = 0; i < 33; i++)
		dims[i] = 1;
	ck_assert_int_eq(wfs_st_add_tensor(f, "x", "F31", 1, &one), -EINVAL);
	ck_assert_int_eq(wfs_st_add_tensor(f, "x", "F4", 1, &one), -EINVAL);
	ck_assert_int_eq(wfs_st_add_tensor(f, "x", "U8", 2, big), -EINVAL);
	ck_assert_int_eq(wfs_st_add_tensor(f, "x", "U8", 33, dims), -EINVAL);
	ck_assert_uint_eq(f->ntensors, 0);
	ck_assert_int_eq(wfs_st_add_tensor(f, "x", "U8", 1, &one), 0);
	ck_assert_int_eq(wfs_st_add_tensor(f, "x", "F32", 1, &one), 0);
	ck_assert_int_eq(wfs_st_layout(f, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "tensor 'x' is there twice");
	wfs_st_free(f);
	/* No tensors, no metadata: "{}" and six spaces. */
	f = wfs_st_new();
	ck_assert_int_eq(wfs_st_layout(f, err, sizeof(err)), 0);
	ck_assert_int_eq(wfs_st_encode(f, &out, &len), 0);
	ck_assert_uint_eq(len, 16);
	ck_assert(memcmp(out, "\x08\0\0\0\0\0\0\0{}      ", 16) == 0);
	free(out);
	wfs_st_free(f);
}
END_TEST

START_TEST(meta_json_round_trip)
{
	struct wfs_st_file *f = wfs_st_new();
	char err[WFS_ST_ERR_MAX], *text;
	size_t len;

	ck_assert_int_eq(wfs_st_meta_json(f, &text, &len), 0);
	ck_assert_str_eq(text, "{}");
	free(text);
	ck_assert_int_eq(wfs_st_meta_parse(f, " { \"b\" : \"2\", \"a\":\"\\u00e9\\n\" } ", 31, err, sizeof(err)), 0);
	ck_assert(f->has_metadata);
	ck_assert_int_eq(wfs_st_meta_json(f, &text, &len), 0);
	ck_assert_str_eq(text, "{\"a\":\"\xc3\xa9\\n\",\"b\":\"2\"}");
	ck_assert_uint_eq(len, strlen(text));
	free(text);
	ck_assert_int_eq(wfs_st_set_meta(f, "b", "3"), 0); /* replaces */
	ck_assert_uint_eq(f->nmeta, 2);
	ck_assert_str_eq(f->meta[1].value, "3");
	ck_assert_int_eq(wfs_st_meta_parse(f, "{\"a\":1}", 7, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "byte 5: __metadata__ 'a': value is not a string");
	ck_assert_int_eq(wfs_st_meta_parse(f, "[]", 2, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "byte 0: __metadata__ is not an object of strings");
	ck_assert_int_eq(wfs_st_meta_parse(f, "{\"a\"", 4, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strncmp(err, "byte 4: invalid JSON: ", 22) == 0, "%s", err);
	ck_assert_uint_eq(f->nmeta, 2); /* untouched on error */
	wfs_st_free(f);
}
END_TEST

/* ---- shapes, names, index, files ---------------------------------------------------------------- */

START_TEST(shape_text)
{
	uint64_t shape[WFS_ST_MAX_DIMS], dims[3] = {4096, 1024, 0};
	unsigned ndim = 99;
	char buf[64];

	ck_assert_int_eq(wfs_st_shape_parse("[4096,1024]", 11, shape, &ndim), 0);
	ck_assert_uint_eq(ndim, 2);
	ck_assert_uint_eq(shape[0], 4096);
	ck_assert_uint_eq(shape[1], 1024);
	ck_assert_int_eq(wfs_st_shape_parse(" [ ] ", 5, shape, &ndim), 0);
	ck_assert_uint_eq(ndim, 0);
	ck_assert_int_eq(wfs_st_shape_parse("[-1]", 4, shape, &ndim), -EINVAL);
	ck_assert_int_eq(wfs_st_shape_parse("[1.5]", 5, shape, &ndim), -EINVAL);
	ck_assert_int_eq(wfs_st_shape_parse("{}", 2, shape, &ndim), -EINVAL);
	ck_assert_int_eq(wfs_st_shape_parse("[1", 2, shape, &ndim), -EINVAL);
	ck_assert_uint_eq(ndim, 0);
	ck_assert_int_eq(wfs_st_shape_format(dims, 3, buf, sizeof(buf)), 13);
	ck_assert_str_eq(buf, "[4096,1024,0]");
	ck_assert_int_eq(wfs_st_shape_format(dims, 0, buf, sizeof(buf)), 2);
	ck_assert_str_eq(buf, "[]");
	ck_assert_int_eq(wfs_st_shape_format(dims, 3, buf, 13), -ERANGE);
	ck_assert_int_eq(wfs_st_shape_format(dims, 3, buf, 14), 13);
}
END_TEST

START_TEST(names_as_paths)
{
	char err[WFS_ST_ERR_MAX], name[300];

	ck_assert_int_eq(wfs_st_name_check("model.layers.0.weight", err, sizeof(err)), 0);
	ck_assert_int_eq(wfs_st_name_check("a/b/c", err, sizeof(err)), 0);
	ck_assert_int_eq(wfs_st_name_check(".hidden/..x/...", err, sizeof(err)), 0);
	ck_assert_int_eq(wfs_st_name_check("", err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "tensor '': an empty name cannot be a file name");
	ck_assert_int_eq(wfs_st_name_check("/etc/passwd", err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "tensor '/etc/passwd': starts with '/' (must be a relative path)");
	ck_assert_int_eq(wfs_st_name_check("a/../../x", err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "tensor 'a/../../x': has a '..' path component");
	ck_assert_int_eq(wfs_st_name_check(".", err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "tensor '.': has a '.' path component");
	ck_assert_int_eq(wfs_st_name_check("a//b", err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "tensor 'a//b': has an empty path component ('//')");
	ck_assert_int_eq(wfs_st_name_check("a/", err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "tensor 'a/': ends with '/'");
	ck_assert_int_eq(wfs_st_name_check("x/.wfs-import.1.2", err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "tensor 'x/.wfs-import.1.2': names starting with '.wfs-import.' are import's files being written");
	memset(name, 'n', 256);
	name[256] = '\0';
	ck_assert_int_eq(wfs_st_name_check(name, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "a path component is 256 bytes, over 255") != NULL, "%s", err);
	name[255] = '\0';
	ck_assert_int_eq(wfs_st_name_check(name, err, sizeof(err)), 0);
}
END_TEST

START_TEST(index_parse)
{
	static const char good[] =
		"{\"metadata\": {\"total_size\": 24, \"b\": [1]},\n"
		" \"weight_map\": {\"z\": \"m-2.safetensors\", \"a\": \"m-1.safetensors\", \"m\": \"m-2.safetensors\"}}";
	struct wfs_st_index *ix = NULL;
	char err[WFS_ST_ERR_MAX];

	ck_assert_int_eq(wfs_st_index_parse(good, strlen(good), &ix, err, sizeof(err)), 0);
	ck_assert_uint_eq(ix->nentries, 3);
	ck_assert_str_eq(ix->entries[0].name, "a");
	ck_assert_str_eq(ix->entries[2].name, "z");
	ck_assert_uint_eq(ix->nshards, 2);
	ck_assert_str_eq(ix->shards[0], "m-1.safetensors");
	ck_assert_str_eq(ix->shards[1], "m-2.safetensors");
	ck_assert_str_eq(ix->metadata, "{\"b\":[1],\"total_size\":24}");
	ck_assert_str_eq(wfs_st_index_shard(ix, "m"), "m-2.safetensors");
	ck_assert_ptr_null(wfs_st_index_shard(ix, "q"));
	wfs_st_index_free(ix);

	ck_assert_int_eq(wfs_st_index_parse("{\"weight_map\":{}}", 17, &ix, err, sizeof(err)), 0);
	ck_assert_uint_eq(ix->nshards, 0);
	ck_assert_ptr_null(ix->metadata);
	wfs_st_index_free(ix);

	ck_assert_int_eq(wfs_st_index_parse("{\"metadata\":{}}", 15, &ix, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "byte 0: no weight_map (not a safetensors index)");
	ck_assert_int_eq(wfs_st_index_parse("{\"weight_map\":[]}", 17, &ix, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "byte 14: weight_map is not an object");
	ck_assert_int_eq(wfs_st_index_parse("{\"weight_map\":{\"a\":\"../x\"}}", 27, &ix, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "byte 19: weight_map 'a': shard file name must be a relative path without '.' or '..'");
	ck_assert_int_eq(wfs_st_index_parse("{\"weight_map\":{\"a\":\"/x\"}}", 25, &ix, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(wfs_st_index_parse("{\"weight_map\":{\"a\":3}}", 22, &ix, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "byte 19: weight_map 'a': value is not a shard file name");
	ck_assert_int_eq(wfs_st_index_parse("{\"weight_map\":{\"a\":\"x\",\"a\":\"y\"}}", 33, &ix, err, sizeof(err)),
			 -EINVAL);
	ck_assert_msg(strncmp(err, "byte 26: invalid JSON: duplicate object key", 43) == 0, "%s", err);
}
END_TEST

START_TEST(read_fd)
{
	char dir[4096], path[4200], err[WFS_ST_ERR_MAX];
	struct blob b = make("{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3);
	struct wfs_st_file *f = NULL;
	int fd;

	tu_mkdtemp(dir, sizeof(dir), "check_safetensors");
	tu_path(path, sizeof(path), dir, "x.safetensors");
	ck_assert_int_eq(tu_write_file(path, b.p, b.len, 0644), 0);
	fd = open(path, O_RDONLY);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(wfs_st_read_fd(fd, &f, err, sizeof(err)), 0);
	ck_assert_uint_eq(f->ntensors, 1);
	ck_assert_uint_eq(f->data_bytes, 3);
	wfs_st_free(f);
	close(fd);
	/* Cut inside the header. */
	ck_assert_int_eq(tu_write_file(path, b.p, 20, 0644), 0);
	fd = open(path, O_RDONLY);
	ck_assert_int_eq(wfs_st_read_fd(fd, &f, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "byte 0: header length 53 runs past the end of the file (20 bytes)");
	close(fd);
	ck_assert_int_eq(tu_write_file(path, b.p, 3, 0644), 0);
	fd = open(path, O_RDONLY);
	ck_assert_int_eq(wfs_st_read_fd(fd, &f, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "byte 0: file is 3 bytes, shorter than the 8-byte header length");
	close(fd);
	free(b.p);
	ck_assert_int_eq(tu_rmtree(dir), 0);
}
END_TEST

static Suite *safetensors_suite(void)
{
	Suite *s = suite_create("safetensors");
	TCase *tc = tcase_create("parse");

	tcase_add_test(tc, parse_valid);
	tcase_add_test(tc, parse_edge_cases);
	tcase_add_test(tc, parse_prefix_only);
	suite_add_tcase(s, tc);
	tc = tcase_create("reject");
	tcase_add_test(tc, reject_truncated);
	tcase_add_test(tc, reject_huge_header);
	tcase_add_test(tc, reject_bad_json);
	tcase_add_test(tc, reject_duplicate_key);
	tcase_add_test(tc, reject_dtype);
	tcase_add_test(tc, reject_shape);
	tcase_add_test(tc, reject_fields);
	tcase_add_test(tc, reject_offsets);
	tcase_add_test(tc, reject_metadata);
	tcase_add_test(tc, reject_names_shown_safely);
	suite_add_tcase(s, tc);
	tc = tcase_create("write");
	tcase_add_test(tc, write_layout);
	tcase_add_test(tc, write_golden);
	tcase_add_test(tc, write_round_trip);
	tcase_add_test(tc, write_deterministic);
	tcase_add_test(tc, write_refuses);
	tcase_add_test(tc, meta_json_round_trip);
	suite_add_tcase(s, tc);
	tc = tcase_create("helpers");
	tcase_add_test(tc, shape_text);
	tcase_add_test(tc, names_as_paths);
	tcase_add_test(tc, index_parse);
	tcase_add_test(tc, read_fd);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tu_main("check_safetensors", safetensors_suite(), 0, NULL);
}
