#include "dtype.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

static const struct {
	const char *name;
	int bytes;
} dtypes[] = {
	{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1}, {"I16", 2},
	{"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},    {"U32", 4},     {"F32", 4},     {"I64", 8},
	{"U64", 8},  {"F64", 8}, {"C64", 8},
};

int wfs_dtype_size(const char *name, size_t len)
{
	for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
		if (strlen(dtypes[i].name) == len && memcmp(dtypes[i].name, name, len) == 0)
			return dtypes[i].bytes;
	return -EINVAL;
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
