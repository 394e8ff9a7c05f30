/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target for lib/safetensors: the input is a whole safetensors file. Whatever parses must
 * survive a write and a re-read unchanged (parse(encode(x)) == x, encode(parse(encode(x))) ==
 * encode(x)); the same bytes also go through the metadata, index and shape parsers and the name check.
 * Built with clang -fsanitize=fuzzer by `make fuzz`, and with cc into tests/fuzz/replay.c's driver,
 * which `make check` runs over tests/fuzz/corpus.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                  \
	do {                                                                                         \
		if (!(cond)) {                                                                       \
			fprintf(stderr, "fuzz_safetensors: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
			abort();                                                                     \
		}                                                                                    \
	} while (0)

static void same(const struct wfs_st_file *a, const struct wfs_st_file *b)
{
	CHECK(a->ntensors == b->ntensors && a->data_bytes == b->data_bytes);
	CHECK(a->has_metadata == b->has_metadata && a->nmeta == b->nmeta);
	for (size_t i = 0; i < a->ntensors; i++) {
		const struct wfs_st_tensor *x = &a->tensors[i], *y = &b->tensors[i];

		CHECK(strcmp(x->name, y->name) == 0 && strcmp(x->dtype, y->dtype) == 0);
		CHECK(x->ndim == y->ndim && x->begin == y->begin && x->end == y->end);
		CHECK(memcmp(x->shape, y->shape, x->ndim * sizeof(x->shape[0])) == 0);
	}
	for (size_t i = 0; i < a->nmeta; i++)
		CHECK(strcmp(a->meta[i].key, b->meta[i].key) == 0 && strcmp(a->meta[i].value, b->meta[i].value) == 0);
}

static void round_trip(struct wfs_st_file *f)
{
	struct wfs_st_file *g = NULL;
	char err[WFS_ST_ERR_MAX], *out = NULL, *again = NULL;
	size_t len, len2;
	int ret;

	/* Offsets as parsed: contiguous from 0, in data order. */
	for (size_t i = 0; i < f->ntensors; i++)
		CHECK(f->tensors[i].begin == (i ? f->tensors[i - 1].end : 0) && f->tensors[i].begin <= f->tensors[i].end);
	if (wfs_st_encode(f, &out, &len) != 0)
		return; /* -ENOMEM, or a header over the limit */
	CHECK(len >= 8 && (len - 8) % 8 == 0);
	/* The data need not be in memory: pass the file size. */
	ret = wfs_st_parse(out, len, len + f->data_bytes, &g, err, sizeof(err));
	if (ret != 0)
		fprintf(stderr, "fuzz_safetensors: re-parse failed: %s\n%.*s\n", err, (int)(len - 8), out + 8);
	CHECK(ret == 0);
	same(f, g);
	CHECK(wfs_st_encode(g, &again, &len2) == 0);
	CHECK(len2 == len && memcmp(again, out, len) == 0);
	free(again);
	free(out);
	wfs_st_free(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct wfs_st_file *f = NULL, *m;
	struct wfs_st_index *ix = NULL;
	uint64_t shape[WFS_ST_MAX_DIMS];
	char err[WFS_ST_ERR_MAX], *text;
	unsigned ndim;

	if (wfs_st_parse(data, size, size, &f, err, sizeof(err)) == 0) {
		round_trip(f);
		wfs_st_free(f);
	} else {
		CHECK(strlen(err) > 0 && strlen(err) < sizeof(err));
	}
	if (wfs_st_index_parse((const char *)data, size, &ix, err, sizeof(err)) == 0) {
		for (size_t i = 0; i < ix->nentries; i++)
			CHECK(strcmp(wfs_st_index_shard(ix, ix->entries[i].name), ix->entries[i].shard) == 0);
		wfs_st_index_free(ix);
	}
	m = wfs_st_new();
	if (m && wfs_st_meta_parse(m, (const char *)data, size, err, sizeof(err)) == 0) {
		size_t len;

		if (wfs_st_meta_json(m, &text, &len) == 0) {
			struct wfs_st_file *n = wfs_st_new();

			CHECK(!n || wfs_st_meta_parse(n, text, len, err, sizeof(err)) == 0);
			if (n)
				same(m, n);
			wfs_st_free(n);
			free(text);
		}
	}
	wfs_st_free(m);
	if (wfs_st_shape_parse((const char *)data, size, shape, &ndim) == 0) {
		char buf[WFS_ST_MAX_DIMS * 21 + 2];

		CHECK(ndim <= WFS_ST_MAX_DIMS && wfs_st_shape_format(shape, ndim, buf, sizeof(buf)) > 0);
	}
	text = malloc(size + 1);
	if (text) {
		memcpy(text, data, size);
		text[size] = '\0';
		wfs_st_name_check(text, err, sizeof(err));
		free(text);
	}
	return 0;
}
