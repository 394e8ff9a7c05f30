/* SPDX-License-Identifier: Apache-2.0 */
/* dtype.h: tensor element types and shapes as safetensors names them. */
#include "dtype.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

/* The reference's Dtype enum, in its order; bytes 0: a sub-byte dtype, known by name only, so that a
 * file using one is refused with a reason rather than as an unknown dtype. */
static const struct {
	const char *name;
	int bytes;
} dtypes[] = {
	{"BOOL", 1},    {"F4", 0},      {"F6_E2M3", 0}, {"F6_E3M2", 0}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1},
	{"F8_E4M3", 1}, {"F8_E8M0", 1}, {"I16", 2},     {"U16", 2},     {"F16", 2}, {"BF16", 2}, {"I32", 4},
	{"U32", 4},     {"F32", 4},     {"C64", 8},     {"F64", 8},     {"I64", 8}, {"U64", 8},
};
#define NDTYPES (sizeof(dtypes) / sizeof(dtypes[0]))

int wfs_dtype_rank(const char *name, size_t len, bool *sub_byte)
{
	for (size_t i = 0; i < NDTYPES; i++) {
		if (strlen(dtypes[i].name) == len && memcmp(dtypes[i].name, name, len) == 0) {
			if (sub_byte)
				*sub_byte = dtypes[i].bytes == 0;
			return (int)i;
		}
	}
	return -EINVAL;
}

int wfs_dtype_size(const char *name, size_t len)
{
	int rank = wfs_dtype_rank(name, len, NULL);

	return rank < 0 || dtypes[rank].bytes == 0 ? -EINVAL : dtypes[rank].bytes;
}

/* Table index of the @i-th whole-byte dtype, or -1. */
static int accepted(unsigned i)
{
	for (size_t k = 0; k < NDTYPES; k++)
		if (dtypes[k].bytes && i-- == 0)
			return (int)k;
	return -1;
}

unsigned wfs_dtype_count(void)
{
	unsigned n = 0;

	for (size_t k = 0; k < NDTYPES; k++)
		n += dtypes[k].bytes != 0;
	return n;
}

const char *wfs_dtype_name(unsigned i)
{
	int k = accepted(i);

	return k < 0 ? NULL : dtypes[k].name;
}

int wfs_dtype_size_at(unsigned i)
{
	int k = accepted(i);

	return k < 0 ? -EINVAL : dtypes[k].bytes;
}

int wfs_tensor_bytes(const char *dtype, size_t dlen, const char *shape, size_t slen, uint64_t *bytes)
{
	int esize = wfs_dtype_size(dtype, dlen);
	uint64_t elements;
	int ret;

	if (esize < 0)
		return -EINVAL;
	ret = wfs_shape_elements(shape, slen, &elements);
	if (ret)
		return ret;
	if (elements > UINT64_MAX / (uint64_t)esize)
		return -EOVERFLOW;
	*bytes = elements * (uint64_t)esize;
	return 0;
}

const char *wfs_tmp_prefix(void)
{
	return WFS_TMP_PREFIX;
}

static void skip_space(const char **p, const char *end)
{
	while (*p < end && (**p == ' ' || **p == '\t' || **p == '\n' || **p == '\r'))
		(*p)++;
}

int wfs_shape_parse(const char *text, size_t len, uint64_t dims[WFS_SHAPE_MAX_DIMS], unsigned *ndim)
{
	const char *p = text, *end = text + len;
	uint64_t got[WFS_SHAPE_MAX_DIMS];
	unsigned n = 0;

	skip_space(&p, end);
	if (p == end || *p++ != '[')
		return -EINVAL;
	skip_space(&p, end);
	if (p < end && *p == ']') {
		p++;
	} else {
		for (;;) {
			const char *digits;
			uint64_t dim = 0;

			skip_space(&p, end);
			digits = p;
			while (p < end && *p >= '0' && *p <= '9') {
				uint64_t digit = (uint64_t)(*p++ - '0');

				if (dim > (UINT64_MAX - digit) / 10)
					return -EINVAL; /* a dimension beyond 64 bits */
				dim = dim * 10 + digit;
			}
			if (p == digits || n == WFS_SHAPE_MAX_DIMS)
				return -EINVAL;
			got[n++] = dim;
			skip_space(&p, end);
			if (p < end && *p == ',') {
				p++;
				continue;
			}
			if (p < end && *p == ']') {
				p++;
				break;
			}
			return -EINVAL;
		}
	}
	skip_space(&p, end);
	if (p != end)
		return -EINVAL;
	memcpy(dims, got, n * sizeof(*got));
	*ndim = n;
	return 0;
}

int wfs_shape_elements(const char *text, size_t len, uint64_t *elements)
{
	uint64_t dims[WFS_SHAPE_MAX_DIMS], product = 1;
	bool overflow = false;
	unsigned n;

	if (wfs_shape_parse(text, len, dims, &n))
		return -EINVAL;
	for (unsigned i = 0; i < n; i++) {
		if (dims[i] == 0) {
			*elements = 0; /* an empty tensor, however large the other dimensions */
			return 0;
		}
		if (product > UINT64_MAX / dims[i])
			overflow = true;
		else
			product *= dims[i];
	}
	if (overflow)
		return -EOVERFLOW;
	*elements = product;
	return 0;
}
