/* SPDX-License-Identifier: Apache-2.0 */
/* safetensors.h: the safetensors header's parser and writer. */
#include "safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dtype.h"
#include "weightfs.h"

/* The reference's Dtype order (lib/dtype.h): its writer lays tensors out by this rank, largest first. */
static int dtype_rank(const char *name)
{
	return wfs_dtype_rank(name, strlen(name), NULL);
}

/* Write a reason into @err (control characters shown as '?', so any name prints on one line). */
__attribute__((format(printf, 4, 5))) static int fail(char *err, size_t errlen, int ret, const char *fmt,
						      ...)
{
	va_list ap;

	if (!err || errlen == 0)
		return ret;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	for (char *p = err; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = '?';
	return ret;
}

/* @name for a message: at most 80 bytes, cut on a UTF-8 character boundary, "..." when cut. */
static const char *shown(const char *name, char buf[88])
{
	size_t len = strlen(name), cut = 80;

	if (len <= cut)
		return name;
	while (cut > 0 && ((unsigned char)name[cut] & 0xc0) == 0x80)
		cut--;
	memcpy(buf, name, cut);
	memcpy(buf + cut, "...", 4);
	return buf;
}

static uint64_t get_le64(const unsigned char *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

int wfs_st_header_length(const void *prefix, size_t prefix_bytes, uint64_t file_bytes,
			 uint64_t *header_bytes, char *err, size_t errlen)
{
	uint64_t n;

	if (file_bytes < 8)
		return fail(err, errlen, -EINVAL, "byte 0: file is %llu bytes, shorter than the 8-byte header length",
			    (unsigned long long)file_bytes);
	if (prefix_bytes < 8)
		return fail(err, errlen, -ENOBUFS, "byte %zu: the header length is cut short", prefix_bytes);
	n = get_le64(prefix);
	if (n > WFS_ST_HEADER_MAX)
		return fail(err, errlen, -EINVAL, "byte 0: header length %llu is over the %llu-byte limit",
			    (unsigned long long)n, WFS_ST_HEADER_MAX);
	if (n > file_bytes - 8)
		return fail(err, errlen, -EINVAL,
			    "byte 0: header length %llu runs past the end of the file (%llu bytes)",
			    (unsigned long long)n, (unsigned long long)file_bytes);
	*header_bytes = n;
	return 0;
}

/* ---- where a key sits in the (already validated) JSON text, for messages ------------------------ */

static size_t skip_ws(const char *s, size_t len, size_t i)
{
	while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
		i++;
	return i;
}

/* Index just past the string token starting at @i (s[i] == '"'). */
static size_t skip_string(const char *s, size_t len, size_t i)
{
	for (i++; i < len; i++) {
		if (s[i] == '\\')
			i++;
		else if (s[i] == '"')
			return i + 1;
	}
	return len;
}

/* Index just past the value starting at @i. Iterative: the depth of the JSON does not matter. */
static size_t skip_value(const char *s, size_t len, size_t i)
{
	size_t depth = 0;

	if (i < len && s[i] == '"')
		return skip_string(s, len, i);
	if (i < len && s[i] != '{' && s[i] != '[') {
		while (i < len && !strchr(",}] \t\n\r", s[i]))
			i++;
		return i;
	}
	for (; i < len; i++) {
		if (s[i] == '"') {
			i = skip_string(s, len, i) - 1;
		} else if (s[i] == '{' || s[i] == '[') {
			depth++;
		} else if (s[i] == '}' || s[i] == ']') {
			if (--depth == 0)
				return i + 1;
		}
	}
	return len;
}

/* Does the string token s[start, end) decode to @key? */
static bool token_is(const char *s, size_t start, size_t end, const char *key)
{
	json_t *j = json_loadb(s + start, end - start, JSON_DECODE_ANY, NULL);
	bool same = j && json_is_string(j) && strcmp(json_string_value(j), key) == 0;

	json_decref(j);
	return same;
}

/*
 * Offset in @s (@len bytes of valid JSON) of the value of member @key of the object starting at
 * @obj; SIZE_MAX when absent.
 */
static size_t member_at(const char *s, size_t len, size_t obj, const char *key)
{
	size_t i = skip_ws(s, len, obj);

	if (i >= len || s[i] != '{')
		return SIZE_MAX;
	for (i = skip_ws(s, len, i + 1); i < len && s[i] == '"';) {
		size_t k = i, v;

		i = skip_string(s, len, i);
		v = skip_ws(s, len, skip_ws(s, len, i) + 1); /* past the ':' */
		if (token_is(s, k, i, key))
			return v;
		i = skip_ws(s, len, skip_value(s, len, v));
		if (i < len && s[i] == ',')
			i = skip_ws(s, len, i + 1);
	}
	return SIZE_MAX;
}

/* File offset of tensor @name's entry in the header (of @field in it, when given), for a message. */
static unsigned long long where(const char *json, size_t len, const char *name, const char *field)
{
	size_t at = member_at(json, len, 0, name), in;

	if (at == SIZE_MAX)
		return 8;
	if (field && (in = member_at(json, len, at, field)) != SIZE_MAX)
		at = in;
	return 8 + (unsigned long long)at;
}

/* ---- reading ------------------------------------------------------------------------------------- */

void wfs_st_free(struct wfs_st_file *f)
{
	if (!f)
		return;
	for (size_t i = 0; i < f->ntensors; i++)
		free(f->tensors[i].name);
	for (size_t i = 0; i < f->nmeta; i++) {
		free(f->meta[i].key);
		free(f->meta[i].value);
	}
	free(f->tensors);
	free(f->meta);
	free(f);
}

struct wfs_st_file *wfs_st_new(void)
{
	return calloc(1, sizeof(struct wfs_st_file));
}

static int by_key(const void *a, const void *b)
{
	return strcmp(((const struct wfs_st_meta *)a)->key, ((const struct wfs_st_meta *)b)->key);
}

static int by_offsets(const void *a, const void *b)
{
	const struct wfs_st_tensor *x = a, *y = b;

	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return strcmp(x->name, y->name); /* empty tensors sharing an offset: a stable order */
}

/*
 * Fill @f's metadata from JSON object @obj. @json/@jlen/@base locate it for messages (@base: file
 * offset of @json; @at_key: the member @obj is the value of, or NULL when @obj is the whole text).
 */
static int meta_from_json(struct wfs_st_file *f, json_t *obj, const char *json, size_t jlen,
			  unsigned long long base, const char *at_key, char *err, size_t errlen)
{
	const char *key;
	json_t *value;
	size_t n = 0;

	if (!json_is_object(obj))
		return fail(err, errlen, -EINVAL, "byte %llu: __metadata__ is not an object of strings",
			    at_key ? where(json, jlen, at_key, NULL) - 8 + base : base);
	f->meta = calloc(json_object_size(obj) + 1, sizeof(*f->meta));
	if (!f->meta)
		return -ENOMEM;
	f->has_metadata = true;
	json_object_foreach(obj, key, value) {
		char b[88];

		if (!json_is_string(value)) {
			size_t at = at_key ? member_at(json, jlen, member_at(json, jlen, 0, at_key), key)
					   : member_at(json, jlen, 0, key);

			return fail(err, errlen, -EINVAL, "byte %llu: __metadata__ '%s': value is not a string",
				    base + (at == SIZE_MAX ? 0 : at), shown(key, b));
		}
		f->meta[n].key = strdup(key);
		f->meta[n].value = strdup(json_string_value(value));
		f->nmeta = ++n;
		if (!f->meta[n - 1].key || !f->meta[n - 1].value)
			return -ENOMEM;
	}
	qsort(f->meta, f->nmeta, sizeof(*f->meta), by_key);
	return 0;
}

/* A JSON integer >= 0 into *@v. */
static bool get_uint(json_t *j, uint64_t *v)
{
	if (!json_is_integer(j) || json_integer_value(j) < 0)
		return false;
	*v = (uint64_t)json_integer_value(j);
	return true;
}

/* Check one tensor entry @entry named @name and fill @t. */
static int tensor_from_json(struct wfs_st_tensor *t, const char *name, json_t *entry, const char *json,
			    size_t jlen, uint64_t data_bytes, char *err, size_t errlen)
{
	json_t *dtype, *shape, *offsets, *dim, *value;
	const char *field, *dname;
	uint64_t elements = 1, bytes;
	bool overflow = false, zero = false;
	char b[88];
	size_t i;
	int size, rank;

	if (!json_is_object(entry))
		return fail(err, errlen, -EINVAL, "byte %llu: tensor '%s': not an object", where(json, jlen, name, NULL),
			    shown(name, b));
	json_object_foreach(entry, field, value) {
		if (strcmp(field, "dtype") != 0 && strcmp(field, "shape") != 0 && strcmp(field, "data_offsets") != 0)
			return fail(err, errlen, -EINVAL,
				    "byte %llu: tensor '%s': unknown field '%.40s' (only dtype, shape, data_offsets)",
				    where(json, jlen, name, field), shown(name, b), field);
	}
	dtype = json_object_get(entry, "dtype");
	shape = json_object_get(entry, "shape");
	offsets = json_object_get(entry, "data_offsets");
	if (!dtype || !shape || !offsets)
		return fail(err, errlen, -EINVAL, "byte %llu: tensor '%s': no %s", where(json, jlen, name, NULL),
			    shown(name, b), !dtype ? "dtype" : !shape ? "shape" : "data_offsets");

	dname = json_string_value(dtype);
	rank = dname ? dtype_rank(dname) : -1;
	if (!dname || rank < 0 ||
	    (size = wfs_dtype_size(dname, strlen(dname))) < 0) {
		if (rank >= 0)
			return fail(err, errlen, -EINVAL,
				    "byte %llu: tensor '%s': dtype %s has elements smaller than a byte, which "
				    "weightfs does not support",
				    where(json, jlen, name, "dtype"), shown(name, b), dname);
		return fail(err, errlen, -EINVAL,
			    "byte %llu: tensor '%s': dtype %s%.20s%s is not a safetensors dtype (BF16, F16, F32, "
			    "I8, U8, BOOL, F8_E4M3, ...)",
			    where(json, jlen, name, "dtype"), shown(name, b), dname ? "'" : "",
			    dname ? dname : "(not a string)", dname ? "'" : "");
	}
	snprintf(t->dtype, sizeof(t->dtype), "%s", dname);
	t->dtype_bytes = (unsigned)size;

	if (!json_is_array(shape))
		return fail(err, errlen, -EINVAL, "byte %llu: tensor '%s': shape is not an array",
			    where(json, jlen, name, "shape"), shown(name, b));
	if (json_array_size(shape) > WFS_ST_MAX_DIMS)
		return fail(err, errlen, -EINVAL, "byte %llu: tensor '%s': shape has %zu dimensions, over %d",
			    where(json, jlen, name, "shape"), shown(name, b), json_array_size(shape),
			    WFS_ST_MAX_DIMS);
	json_array_foreach(shape, i, dim) {
		if (!get_uint(dim, &t->shape[i]))
			return fail(err, errlen, -EINVAL,
				    "byte %llu: tensor '%s': shape[%zu] is not a non-negative integer",
				    where(json, jlen, name, "shape"), shown(name, b), i);
		if (t->shape[i] == 0)
			zero = true;
		else if (elements > UINT64_MAX / t->shape[i])
			overflow = true;
		else
			elements *= t->shape[i];
	}
	t->ndim = (unsigned)json_array_size(shape);
	if (zero)
		elements = 0; /* a zero dimension: no bytes, whatever the others */
	else if (overflow || elements > UINT64_MAX / (uint64_t)size) {
		char s[WFS_ST_MAX_DIMS * 21 + 2];

		wfs_st_shape_format(t->shape, t->ndim, s, sizeof(s));
		return fail(err, errlen, -EINVAL, "byte %llu: tensor '%s': %s x %s overflows 64 bits",
			    where(json, jlen, name, "shape"), shown(name, b), t->dtype, s);
	}
	bytes = elements * (uint64_t)size;

	if (!json_is_array(offsets) || json_array_size(offsets) != 2 ||
	    !get_uint(json_array_get(offsets, 0), &t->begin) || !get_uint(json_array_get(offsets, 1), &t->end))
		return fail(err, errlen, -EINVAL,
			    "byte %llu: tensor '%s': data_offsets is not [BEGIN, END] of non-negative integers",
			    where(json, jlen, name, "data_offsets"), shown(name, b));
	if (t->begin > t->end)
		return fail(err, errlen, -EINVAL, "byte %llu: tensor '%s': data_offsets [%llu, %llu] end before they begin",
			    where(json, jlen, name, "data_offsets"), shown(name, b), (unsigned long long)t->begin,
			    (unsigned long long)t->end);
	if (t->end > data_bytes)
		return fail(err, errlen, -EINVAL,
			    "byte %llu: tensor '%s': data_offsets [%llu, %llu] run past the data buffer (%llu bytes)",
			    where(json, jlen, name, "data_offsets"), shown(name, b), (unsigned long long)t->begin,
			    (unsigned long long)t->end, (unsigned long long)data_bytes);
	if (t->end - t->begin != bytes) {
		char s[WFS_ST_MAX_DIMS * 21 + 2];

		wfs_st_shape_format(t->shape, t->ndim, s, sizeof(s));
		return fail(err, errlen, -EINVAL,
			    "byte %llu: tensor '%s': data_offsets [%llu, %llu] but %s x %s is %llu bytes",
			    where(json, jlen, name, "data_offsets"), shown(name, b), (unsigned long long)t->begin,
			    (unsigned long long)t->end, t->dtype, s, (unsigned long long)bytes);
	}
	t->name = strdup(name);
	return t->name ? 0 : -ENOMEM;
}

/* The tensors of @f, sorted by offset, must cover the data buffer exactly. */
static int check_coverage(const struct wfs_st_file *f, const char *json, size_t jlen, char *err, size_t errlen)
{
	uint64_t at = 0;
	char b[88], b2[88];

	for (size_t i = 0; i < f->ntensors; i++) {
		const struct wfs_st_tensor *t = &f->tensors[i], *prev = i ? &f->tensors[i - 1] : NULL;

		if (t->begin < at)
			return fail(err, errlen, -EINVAL,
				    "byte %llu: tensor '%s': data_offsets [%llu, %llu] overlap tensor '%s' [%llu, %llu]",
				    where(json, jlen, t->name, "data_offsets"), shown(t->name, b),
				    (unsigned long long)t->begin, (unsigned long long)t->end, shown(prev->name, b2),
				    (unsigned long long)prev->begin, (unsigned long long)prev->end);
		if (t->begin > at)
			return fail(err, errlen, -EINVAL,
				    "byte %llu: tensor '%s': data_offsets [%llu, %llu] leave a hole: data bytes "
				    "[%llu, %llu) belong to no tensor",
				    where(json, jlen, t->name, "data_offsets"), shown(t->name, b),
				    (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)at,
				    (unsigned long long)t->begin);
		at = t->end;
	}
	if (at != f->data_bytes)
		return fail(err, errlen, -EINVAL,
			    "byte %llu: the last %llu bytes of the data buffer belong to no tensor (the tensors "
			    "end at data byte %llu of %llu)",
			    (unsigned long long)(8 + f->header_bytes + at), (unsigned long long)(f->data_bytes - at),
			    (unsigned long long)at, (unsigned long long)f->data_bytes);
	return 0;
}

int wfs_st_parse(const void *buf, size_t len, uint64_t file_bytes, struct wfs_st_file **out, char *err,
		 size_t errlen)
{
	struct wfs_st_file *f = NULL;
	const char *json = (const char *)buf + 8, *key;
	json_error_t jerr;
	json_t *root = NULL, *value;
	uint64_t n;
	size_t jlen;
	int ret;

	ret = wfs_st_header_length(buf, len, file_bytes, &n, err, errlen);
	if (ret)
		return ret;
	if (len - 8 < n)
		return fail(err, errlen, -ENOBUFS, "byte %zu: header of %llu bytes is cut short", len,
			    (unsigned long long)n);
	jlen = (size_t)n;
	root = json_loadb(json, jlen, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return fail(err, errlen, -EINVAL, "byte %llu: invalid JSON: %s",
			    8 + (unsigned long long)(jerr.position > 0 ? jerr.position : 0), jerr.text);
	ret = -ENOMEM;
	f = wfs_st_new();
	if (!f)
		goto out;
	f->header_bytes = n;
	f->data_bytes = file_bytes - 8 - n;
	if (!json_is_object(root)) {
		ret = fail(err, errlen, -EINVAL, "byte %llu: the header is a JSON array, not an object",
			   8 + (unsigned long long)skip_ws(json, jlen, 0));
		goto out;
	}
	f->tensors = calloc(json_object_size(root) + 1, sizeof(*f->tensors));
	if (!f->tensors)
		goto out;
	json_object_foreach(root, key, value) {
		if (strcmp(key, "__metadata__") == 0)
			ret = meta_from_json(f, value, json, jlen, 8, key, err, errlen);
		else if ((ret = tensor_from_json(&f->tensors[f->ntensors], key, value, json, jlen, f->data_bytes,
						  err, errlen)) == 0)
			f->ntensors++;
		if (ret) {
			free(f->tensors[f->ntensors].name); /* a failed entry may have its name */
			f->tensors[f->ntensors].name = NULL;
			goto out;
		}
	}
	qsort(f->tensors, f->ntensors, sizeof(*f->tensors), by_offsets);
	ret = check_coverage(f, json, jlen, err, errlen);
out:
	json_decref(root);
	if (ret) {
		if (ret == -ENOMEM)
			fail(err, errlen, ret, "out of memory for a %zu-byte header", jlen);
		wfs_st_free(f);
		return ret;
	}
	*out = f;
	return 0;
}

int wfs_st_read_fd(int fd, struct wfs_st_file **out, char *err, size_t errlen)
{
	unsigned char prefix[8];
	struct stat st;
	uint64_t n;
	char *buf;
	size_t got = 0, want;
	ssize_t r;
	int ret;

	if (fstat(fd, &st) < 0)
		return fail(err, errlen, -errno, "cannot stat: %s", strerror(errno));
	while (got < sizeof(prefix) && (r = pread(fd, prefix + got, sizeof(prefix) - got, (off_t)got)) != 0) {
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return fail(err, errlen, -errno, "byte 0: cannot read: %s", strerror(errno));
		got += (size_t)r;
	}
	ret = wfs_st_header_length(prefix, got, (uint64_t)st.st_size, &n, err, errlen);
	if (ret)
		return ret;
	want = 8 + (size_t)n;
	buf = malloc(want);
	if (!buf)
		return fail(err, errlen, -ENOMEM, "no memory for a %llu-byte header", (unsigned long long)n);
	for (got = 0; got < want;) {
		r = pread(fd, buf + got, want - got, (off_t)got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			ret = r < 0 ? -errno : -EIO;
			free(buf);
			return fail(err, errlen, ret, "byte %zu: cannot read the header: %s", got,
				    r < 0 ? strerror(-ret) : "the file got shorter");
		}
		got += (size_t)r;
	}
	ret = wfs_st_parse(buf, want, (uint64_t)st.st_size, out, err, errlen);
	free(buf);
	return ret;
}

/* ---- writing ------------------------------------------------------------------------------------- */

int wfs_st_add_tensor(struct wfs_st_file *f, const char *name, const char *dtype, unsigned ndim,
		      const uint64_t *shape)
{
	struct wfs_st_tensor *t, *grown;
	uint64_t elements = 1;
	bool overflow = false, zero = false;
	int rank = dtype_rank(dtype), size;

	if (rank < 0 || (size = wfs_dtype_size(dtype, strlen(dtype))) < 0 ||
	    ndim > WFS_ST_MAX_DIMS)
		return -EINVAL;
	for (unsigned i = 0; i < ndim; i++) {
		if (shape[i] == 0)
			zero = true;
		else if (elements > UINT64_MAX / shape[i])
			overflow = true;
		else
			elements *= shape[i];
	}
	if (!zero && (overflow || elements > UINT64_MAX / (uint64_t)size))
		return -EINVAL;
	if ((f->ntensors & (f->ntensors + 1)) == 0) { /* grow at 0, 1, 3, 7, ...: capacity doubles */
		grown = realloc(f->tensors, (2 * f->ntensors + 2) * sizeof(*f->tensors));
		if (!grown)
			return -ENOMEM;
		f->tensors = grown;
	}
	t = &f->tensors[f->ntensors];
	memset(t, 0, sizeof(*t));
	t->name = strdup(name);
	if (!t->name)
		return -ENOMEM;
	snprintf(t->dtype, sizeof(t->dtype), "%s", dtype);
	t->dtype_bytes = (unsigned)size;
	t->ndim = ndim;
	if (ndim)
		memcpy(t->shape, shape, ndim * sizeof(*shape));
	f->ntensors++;
	return 0;
}

int wfs_st_set_meta(struct wfs_st_file *f, const char *key, const char *value)
{
	struct wfs_st_meta *m = NULL, *grown;
	char *v = strdup(value);

	if (!v)
		return -ENOMEM;
	for (size_t i = 0; i < f->nmeta; i++)
		if (strcmp(f->meta[i].key, key) == 0)
			m = &f->meta[i];
	if (m) {
		free(m->value);
		m->value = v;
		f->has_metadata = true;
		return 0;
	}
	grown = realloc(f->meta, (f->nmeta + 1) * sizeof(*f->meta));
	if (!grown) {
		free(v);
		return -ENOMEM;
	}
	f->meta = grown;
	m = &f->meta[f->nmeta];
	m->key = strdup(key);
	if (!m->key) {
		free(v);
		return -ENOMEM;
	}
	m->value = v;
	f->nmeta++;
	f->has_metadata = true;
	qsort(f->meta, f->nmeta, sizeof(*f->meta), by_key);
	return 0;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(((const struct wfs_st_tensor *)a)->name, ((const struct wfs_st_tensor *)b)->name);
}

static int by_layout(const void *a, const void *b)
{
	const struct wfs_st_tensor *x = a, *y = b;
	int rx = dtype_rank(x->dtype), ry = dtype_rank(y->dtype);

	if (rx != ry)
		return rx > ry ? -1 : 1;
	return strcmp(x->name, y->name);
}

int wfs_st_layout(struct wfs_st_file *f, char *err, size_t errlen)
{
	uint64_t at = 0;
	char b[88];

	if (f->ntensors == 0) {
		f->data_bytes = 0;
		return 0;
	}
	qsort(f->tensors, f->ntensors, sizeof(*f->tensors), by_name);
	for (size_t i = 1; i < f->ntensors; i++)
		if (strcmp(f->tensors[i - 1].name, f->tensors[i].name) == 0)
			return fail(err, errlen, -EINVAL, "tensor '%s' is there twice", shown(f->tensors[i].name, b));
	qsort(f->tensors, f->ntensors, sizeof(*f->tensors), by_layout);
	for (size_t i = 0; i < f->ntensors; i++) {
		struct wfs_st_tensor *t = &f->tensors[i];
		uint64_t bytes = t->dtype_bytes;

		for (unsigned d = 0; d < t->ndim; d++)
			bytes *= t->shape[d]; /* wfs_st_add_tensor() checked it fits */
		if (bytes > UINT64_MAX - at)
			return fail(err, errlen, -EOVERFLOW, "the tensors' data passes 2^64 bytes");
		t->begin = at;
		t->end = at + bytes;
		at = t->end;
	}
	f->data_bytes = at;
	return 0;
}

/* A growable byte buffer; @oom sticks once an allocation failed. */
struct sbuf {
	char *p;
	size_t len, cap;
	bool oom;
};

static void sb_add(struct sbuf *b, const void *data, size_t len)
{
	if (b->oom)
		return;
	if (b->len + len + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		char *p;

		while (cap < b->len + len + 1)
			cap *= 2;
		p = realloc(b->p, cap);
		if (!p) {
			b->oom = true;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, data, len);
	b->len += len;
	b->p[b->len] = '\0';
}

static void sb_str(struct sbuf *b, const char *s)
{
	sb_add(b, s, strlen(s));
}

static void sb_u64(struct sbuf *b, uint64_t v)
{
	char num[24];

	sb_add(b, num, (size_t)snprintf(num, sizeof(num), "%llu", (unsigned long long)v));
}

/* @s as a JSON string, escaped as serde_json escapes it (header comment, rule 2). */
static void sb_json_string(struct sbuf *b, const char *s)
{
	static const char hex[] = "0123456789abcdef";
	const char *run = s;

	sb_add(b, "\"", 1);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		char esc[7] = {'\\', 0};
		size_t n = 2;

		if (c >= 0x20 && c != '"' && c != '\\')
			continue;
		sb_add(b, run, (size_t)(s - run));
		run = s + 1;
		switch (c) {
		case '"': esc[1] = '"'; break;
		case '\\': esc[1] = '\\'; break;
		case '\b': esc[1] = 'b'; break;
		case '\f': esc[1] = 'f'; break;
		case '\n': esc[1] = 'n'; break;
		case '\r': esc[1] = 'r'; break;
		case '\t': esc[1] = 't'; break;
		default:
			memcpy(esc + 1, "u00", 3);
			esc[4] = hex[c >> 4];
			esc[5] = hex[c & 15];
			n = 6;
		}
		sb_add(b, esc, n);
	}
	sb_add(b, run, (size_t)(s - run));
	sb_add(b, "\"", 1);
}

static void sb_meta(struct sbuf *b, const struct wfs_st_file *f)
{
	sb_add(b, "{", 1);
	for (size_t i = 0; i < f->nmeta; i++) {
		if (i)
			sb_add(b, ",", 1);
		sb_json_string(b, f->meta[i].key);
		sb_add(b, ":", 1);
		sb_json_string(b, f->meta[i].value);
	}
	sb_add(b, "}", 1);
}

int wfs_st_encode(struct wfs_st_file *f, char **out, size_t *len)
{
	struct sbuf b = {0};
	uint64_t n;
	bool first = true;

	sb_add(&b, "\0\0\0\0\0\0\0\0{", 9);
	if (f->has_metadata) {
		sb_str(&b, "\"__metadata__\":");
		sb_meta(&b, f);
		first = false;
	}
	for (size_t i = 0; i < f->ntensors; i++) {
		const struct wfs_st_tensor *t = &f->tensors[i];

		if (!first)
			sb_add(&b, ",", 1);
		first = false;
		sb_json_string(&b, t->name);
		sb_str(&b, ":{\"dtype\":\"");
		sb_str(&b, t->dtype);
		sb_str(&b, "\",\"shape\":[");
		for (unsigned d = 0; d < t->ndim; d++) {
			if (d)
				sb_add(&b, ",", 1);
			sb_u64(&b, t->shape[d]);
		}
		sb_str(&b, "],\"data_offsets\":[");
		sb_u64(&b, t->begin);
		sb_add(&b, ",", 1);
		sb_u64(&b, t->end);
		sb_str(&b, "]}");
	}
	sb_add(&b, "}", 1);
	while (!b.oom && (b.len - 8) % 8)
		sb_add(&b, " ", 1);
	if (b.oom) {
		free(b.p);
		return -ENOMEM;
	}
	n = b.len - 8;
	if (n > WFS_ST_HEADER_MAX) {
		free(b.p);
		return -EFBIG;
	}
	for (int i = 0; i < 8; i++)
		b.p[i] = (char)(n >> (8 * i));
	f->header_bytes = n;
	*out = b.p;
	*len = b.len;
	return 0;
}

int wfs_st_meta_json(const struct wfs_st_file *f, char **out, size_t *len)
{
	struct sbuf b = {0};

	sb_meta(&b, f);
	if (b.oom) {
		free(b.p);
		return -ENOMEM;
	}
	*out = b.p;
	*len = b.len;
	return 0;
}

int wfs_st_meta_parse(struct wfs_st_file *f, const char *text, size_t len, char *err, size_t errlen)
{
	struct wfs_st_file parsed = {0};
	json_error_t jerr;
	json_t *root;
	int ret;

	root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return fail(err, errlen, -EINVAL, "byte %d: invalid JSON: %s", jerr.position > 0 ? jerr.position : 0,
			    jerr.text);
	ret = meta_from_json(&parsed, root, text, len, 0, NULL, err, errlen);
	json_decref(root);
	if (ret) {
		for (size_t i = 0; i < parsed.nmeta; i++) {
			free(parsed.meta[i].key);
			free(parsed.meta[i].value);
		}
		free(parsed.meta);
		return ret;
	}
	for (size_t i = 0; i < f->nmeta; i++) {
		free(f->meta[i].key);
		free(f->meta[i].value);
	}
	free(f->meta);
	f->meta = parsed.meta;
	f->nmeta = parsed.nmeta;
	f->has_metadata = true;
	return 0;
}

int wfs_st_shape_parse(const char *text, size_t len, uint64_t shape[WFS_ST_MAX_DIMS], unsigned *ndim)
{
	return wfs_shape_parse(text, len, shape, ndim);
}

int wfs_st_shape_format(const uint64_t *shape, unsigned ndim, char *buf, size_t size)
{
	size_t at = 0;
	int n;

	if (size < 3)
		return -ERANGE;
	buf[at++] = '[';
	for (unsigned d = 0; d < ndim; d++) {
		n = snprintf(buf + at, size - at, "%s%llu", d ? "," : "", (unsigned long long)shape[d]);
		if (n < 0 || (size_t)n >= size - at)
			return -ERANGE;
		at += (size_t)n;
	}
	if (at + 2 > size)
		return -ERANGE;
	buf[at++] = ']';
	buf[at] = '\0';
	return (int)at;
}

/* Does component @p (@len bytes) start with @prefix? */
static bool starts(const char *p, size_t len, const char *prefix)
{
	size_t n = strlen(prefix);

	return len >= n && memcmp(p, prefix, n) == 0;
}

int wfs_st_name_check(const char *name, char *err, size_t errlen)
{
	const char *p = name;
	char b[88];

	if (!*name)
		return fail(err, errlen, -EINVAL, "tensor '': an empty name cannot be a file name");
	if (*name == '/')
		return fail(err, errlen, -EINVAL, "tensor '%s': starts with '/' (must be a relative path)",
			    shown(name, b));
	for (;;) {
		const char *slash = strchr(p, '/');
		size_t len = slash ? (size_t)(slash - p) : strlen(p);

		if (len == 0)
			return fail(err, errlen, -EINVAL, "tensor '%s': %s", shown(name, b),
				    *p ? "has an empty path component ('//')" : "ends with '/'");
		if ((len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
			return fail(err, errlen, -EINVAL, "tensor '%s': has a '%.*s' path component", shown(name, b),
				    (int)len, p);
		if (len > 255)
			return fail(err, errlen, -EINVAL, "tensor '%s': a path component is %zu bytes, over 255",
				    shown(name, b), len);
		if (starts(p, len, WFS_TMP_PREFIX_IMPORT_OLD))
			return fail(err, errlen, -EINVAL,
				    "tensor '%s': names starting with '" WFS_TMP_PREFIX_IMPORT_OLD
				    "' are import's files being written",
				    shown(name, b));
		if (starts(p, len, WFS_TMP_PREFIX))
			return fail(err, errlen, -EINVAL,
				    "tensor '%s': names starting with '" WFS_TMP_PREFIX
				    "' are tensor files being written (lib/tensorfile.h)",
				    shown(name, b));
		if (!slash)
			return 0;
		p = slash + 1;
	}
}

/* ---- sharded checkpoints' index ------------------------------------------------------------------ */

void wfs_st_index_free(struct wfs_st_index *ix)
{
	if (!ix)
		return;
	for (size_t i = 0; i < ix->nentries; i++) {
		free(ix->entries[i].name);
		free(ix->entries[i].shard);
	}
	free(ix->entries);
	free(ix->shards); /* its strings are the entries' */
	free(ix->metadata);
	free(ix);
}

static int entry_by_name(const void *a, const void *b)
{
	return strcmp(((const struct wfs_st_index_entry *)a)->name, ((const struct wfs_st_index_entry *)b)->name);
}

static int str_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A shard name must stay below the index's directory. */
static bool shard_name_ok(const char *s)
{
	if (!*s || *s == '/')
		return false;
	for (const char *p = s;;) {
		const char *slash = strchr(p, '/');
		size_t len = slash ? (size_t)(slash - p) : strlen(p);

		if (len == 0 || (len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
			return false;
		if (!slash)
			return true;
		p = slash + 1;
	}
}

int wfs_st_index_parse(const char *text, size_t len, struct wfs_st_index **out, char *err, size_t errlen)
{
	struct wfs_st_index *ix = NULL;
	json_t *root, *map, *meta, *value;
	json_error_t jerr;
	const char *key;
	size_t n = 0, at;
	int ret;

	root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return fail(err, errlen, -EINVAL, "byte %d: invalid JSON: %s", jerr.position > 0 ? jerr.position : 0,
			    jerr.text);
	ret = -ENOMEM;
	ix = calloc(1, sizeof(*ix));
	if (!ix)
		goto out;
	map = json_object_get(root, "weight_map");
	if (!json_is_object(map)) {
		at = member_at(text, len, 0, "weight_map");
		ret = fail(err, errlen, -EINVAL, "byte %zu: %s", at == SIZE_MAX ? skip_ws(text, len, 0) : at,
			   map ? "weight_map is not an object" : "no weight_map (not a safetensors index)");
		goto out;
	}
	ix->entries = calloc(json_object_size(map) + 1, sizeof(*ix->entries));
	ix->shards = calloc(json_object_size(map) + 1, sizeof(*ix->shards));
	if (!ix->entries || !ix->shards)
		goto out;
	json_object_foreach(map, key, value) {
		const char *shard = json_string_value(value);
		char b[88];

		if (!shard || !shard_name_ok(shard)) {
			at = member_at(text, len, member_at(text, len, 0, "weight_map"), key);
			ret = fail(err, errlen, -EINVAL, "byte %zu: weight_map '%s': %s", at == SIZE_MAX ? 0 : at,
				   shown(key, b),
				   shard ? "shard file name must be a relative path without '.' or '..'"
					 : "value is not a shard file name");
			goto out;
		}
		ix->entries[n].name = strdup(key);
		ix->entries[n].shard = strdup(shard);
		ix->nentries = ++n;
		if (!ix->entries[n - 1].name || !ix->entries[n - 1].shard)
			goto out;
	}
	qsort(ix->entries, ix->nentries, sizeof(*ix->entries), entry_by_name);
	for (size_t i = 0; i < ix->nentries; i++)
		ix->shards[i] = ix->entries[i].shard;
	qsort(ix->shards, ix->nentries, sizeof(*ix->shards), str_cmp);
	for (size_t i = 0; i < ix->nentries; i++)
		if (i == 0 || strcmp(ix->shards[i], ix->shards[ix->nshards - 1]) != 0)
			ix->shards[ix->nshards++] = ix->shards[i];
	meta = json_object_get(root, "metadata");
	if (meta && !(ix->metadata = json_dumps(meta, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY)))
		goto out;
	ret = 0;
out:
	json_decref(root);
	if (ret) {
		if (ret == -ENOMEM)
			fail(err, errlen, ret, "out of memory");
		wfs_st_index_free(ix);
		return ret;
	}
	*out = ix;
	return 0;
}

const char *wfs_st_index_shard(const struct wfs_st_index *ix, const char *name)
{
	struct wfs_st_index_entry key = {.name = (char *)name}, *e;

	e = bsearch(&key, ix->entries, ix->nentries, sizeof(*ix->entries), entry_by_name);
	return e ? e->shard : NULL;
}
