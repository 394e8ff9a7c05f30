/* SPDX-License-Identifier: Apache-2.0 */
/*
 * safetensors — parse and write the header of a safetensors file (prefix wfs_st_).
 *
 * Format (huggingface/safetensors, docs and safetensors/src/tensor.rs):
 *
 *   byte 0      u64 N, little-endian: bytes of the JSON header that follows
 *   byte 8      N bytes of UTF-8 JSON: one object; its "__metadata__" key (optional) maps to an object
 *               of string → string; every other key is a tensor name mapping to
 *               {"dtype": "BF16", "shape": [4096, 1024], "data_offsets": [BEGIN, END]}
 *   byte 8 + N  the data buffer: every tensor's bytes (little-endian, C order), at [BEGIN, END)
 *               relative to the start of the buffer. The tensors cover the buffer exactly: sorted by
 *               offset they start at 0, each begins where the previous one ended, the last ends at
 *               the end of the file. END - BEGIN = dtype bytes × product(shape) (1 for shape []).
 *
 * Identifier spaces: a tensor's name is its JSON key (UTF-8, any characters but NUL); dtypes are
 * the safetensors names of lib/dtype.h; offsets and sizes are bytes.
 *
 * Reading (wfs_st_parse) checks everything above and refuses, like the reference implementation:
 * files under 8 bytes, N > WFS_ST_HEADER_MAX or beyond the file, JSON that is not UTF-8 or not an
 * object, duplicate keys, an unknown dtype, shapes that are not arrays of non-negative integers or
 * whose byte count overflows 64 bits, data_offsets out of the buffer, overlapping, or leaving a
 * hole, and a "__metadata__" that is not string → string. It is stricter in four places, each a
 * file the reference could read but weightfs cannot represent: a tensor entry with a field besides
 * dtype/shape/data_offsets (it would be lost), more than WFS_ST_MAX_DIMS dimensions (the
 * user.weightfs.shape limit), an integer above INT64_MAX (JSON parser limit), and the sub-byte
 * dtypes F4, F6_E2M3 and F6_E3M2 (the daemon sizes tensors in whole bytes per element).
 * Every refusal comes with one line: "byte OFFSET: reason", OFFSET counted from the start of the
 * file (the JSON starts at byte 8), e.g.
 *   byte 123: tensor 'a.weight': data_offsets [0, 10] but F32 x [3] is 12 bytes
 * For a check on a tensor, OFFSET is where the offending field's value starts; for invalid JSON,
 * where the JSON parser (jansson) stopped, just past the offending token; for data no tensor
 * covers, the first such byte of the file. Names in messages are cut at 80 bytes, control
 * characters shown as '?'.
 *
 * Writing (wfs_st_layout, wfs_st_encode) produces the reference's own layout, so a file written by
 * the reference implementation with at most one "__metadata__" entry (torch's {"format": "pt"})
 * comes out byte-identical after a trip through weightfs:
 *  1. tensors sorted by dtype alignment, largest first (the reference's Dtype order: U64 I64 F64
 *     C64 F32 U32 I32 BF16 F16 U16 I16 F8_E8M0 F8_E4M3 F8_E5M2 I8 U8 BOOL), then by name (bytewise);
 *     their data back to back in that order from offset 0;
 *  2. header JSON without whitespace: "__metadata__" first (its keys sorted bytewise), then the
 *     tensors in data order, fields dtype, shape, data_offsets; strings escaped as serde_json does
 *     (\" \\ \b \f \n \r \t, other control characters \u00xx, everything else as is);
 *  3. the JSON padded with spaces (0x20) to a multiple of 8 bytes.
 * The output depends only on the tensors and metadata, never on the order they were given in.
 *
 * Memory: a struct wfs_st_file and everything it points to is owned by whoever the function that
 * made it says, and freed with wfs_st_free(). No global state: all functions are thread-safe on
 * distinct objects.
 */
#ifndef WFS_SAFETENSORS_H
#define WFS_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"

/* Largest header (N) read or written, in bytes: the reference's MAX_HEADER_SIZE. */
#define WFS_ST_HEADER_MAX 100000000ull
/* Most dimensions of one tensor (what user.weightfs.shape accepts, lib/dtype.h). */
#define WFS_ST_MAX_DIMS WFS_SHAPE_MAX_DIMS /* lib/dtype.h */
/* Room for an error line, including the NUL; longer lines are cut. */
#define WFS_ST_ERR_MAX 512
/* Longest dtype name plus NUL. */
#define WFS_ST_DTYPE_MAX 12

/* One tensor of a header. */
struct wfs_st_tensor {
	char *name;                     /* the JSON key, UTF-8, NUL-terminated; owned by the file */
	char dtype[WFS_ST_DTYPE_MAX];   /* safetensors dtype name, e.g. "BF16" */
	unsigned dtype_bytes;           /* bytes per element: 1, 2, 4 or 8 */
	unsigned ndim;                  /* 0 (a scalar: one element) .. WFS_ST_MAX_DIMS */
	uint64_t shape[WFS_ST_MAX_DIMS];
	uint64_t begin, end;            /* bytes, relative to the data buffer: [begin, end) */
};

/* One "__metadata__" entry: both strings UTF-8, NUL-terminated, owned by the file. */
struct wfs_st_meta {
	char *key;
	char *value;
};

/* A header, as read from a file or about to be written. */
struct wfs_st_file {
	uint64_t header_bytes;         /* N: bytes of JSON (with padding) after the 8-byte prefix */
	uint64_t data_bytes;           /* bytes of the data buffer (file bytes - 8 - N) */
	size_t ntensors;
	struct wfs_st_tensor *tensors; /* parsed: in data order (by begin, then end) */
	bool has_metadata;             /* a "__metadata__" key is present (it may be empty: {}) */
	size_t nmeta;
	struct wfs_st_meta *meta;      /* sorted by key, bytewise; keys are unique */
};

/*
 * Check the 8-byte prefix at @prefix (@prefix_bytes bytes, fewer than 8 if the file is that short)
 * of a file of @file_bytes bytes, and write N to *@header_bytes. Returns 0, or -EINVAL with the
 * reason in @err (@errlen bytes, NUL-terminated; may be NULL): file shorter than 8 bytes, N above
 * WFS_ST_HEADER_MAX, or N beyond the end of the file. *@header_bytes is written only on success.
 */
int wfs_st_header_length(const void *prefix, size_t prefix_bytes, uint64_t file_bytes,
			 uint64_t *header_bytes, char *err, size_t errlen);

/*
 * Parse the header of a safetensors file of @file_bytes bytes whose first @len bytes are at @buf
 * (@len >= 8 + N; bytes beyond are ignored: a whole file in memory works too). On success *@out
 * gets a new struct wfs_st_file the caller owns (wfs_st_free()). Errors: -EINVAL (malformed; the
 * reason in @err as "byte OFFSET: ...", see above), -ENOBUFS (@len shorter than 8 + N: read more),
 * -ENOMEM. *@out is written only on success.
 */
int wfs_st_parse(const void *buf, size_t len, uint64_t file_bytes, struct wfs_st_file **out,
		 char *err, size_t errlen);

/*
 * Read and parse the header of the safetensors file open at @fd (any position; pread is used, the
 * file offset is untouched). Errors: as wfs_st_parse(), and -errno of fstat/pread (-EIO, ...), with
 * the reason in @err.
 */
int wfs_st_read_fd(int fd, struct wfs_st_file **out, char *err, size_t errlen);

/* Free @f and everything it owns. NULL is fine. */
void wfs_st_free(struct wfs_st_file *f);

/* An empty header (no tensors, no metadata), owned by the caller. NULL when out of memory. */
struct wfs_st_file *wfs_st_new(void);

/*
 * Append tensor @name (copied; any UTF-8 string, see wfs_st_name_check() for file names) of dtype
 * @dtype, @ndim dimensions @shape, to @f, with begin = end = 0 until wfs_st_layout(). Returns 0, or
 * -EINVAL (unknown or sub-byte dtype, more than WFS_ST_MAX_DIMS dimensions, dtype bytes × elements
 * over 64 bits), -ENOMEM. Duplicate names are found by wfs_st_layout().
 */
int wfs_st_add_tensor(struct wfs_st_file *f, const char *name, const char *dtype, unsigned ndim,
		      const uint64_t *shape);

/*
 * Set metadata entry @key to @value (both copied, UTF-8 without NUL), replacing an existing value,
 * and mark @f as having metadata. Returns 0 or -ENOMEM.
 */
int wfs_st_set_meta(struct wfs_st_file *f, const char *key, const char *value);

/*
 * Sort @f's tensors into the write order (rule 1 above) and give them back-to-back offsets from 0;
 * sets data_bytes. Returns 0, or -EINVAL when two tensors share a name (the name in @err), or
 * -EOVERFLOW when the data would pass 2^64 bytes.
 */
int wfs_st_layout(struct wfs_st_file *f, char *err, size_t errlen);

/*
 * Encode @f's header as it is written at the start of the file: the 8-byte prefix, the JSON, the
 * padding (rules 2 and 3; tensors in their current order with their current offsets, so call
 * wfs_st_layout() first for a new file). *@out gets a malloc()ed buffer of *@len bytes the caller
 * frees; f->header_bytes is set to N. Returns 0, -ENOMEM, or -EFBIG when N would pass
 * WFS_ST_HEADER_MAX.
 */
int wfs_st_encode(struct wfs_st_file *f, char **out, size_t *len);

/*
 * The metadata of @f as one JSON object, canonical as in the header ("{}" when it has none): what
 * weightfs keeps in the user.weightfs.safetensors.metadata xattr. *@out gets a malloc()ed
 * NUL-terminated string (*@len bytes without the NUL). Returns 0 or -ENOMEM.
 */
int wfs_st_meta_json(const struct wfs_st_file *f, char **out, size_t *len);

/*
 * Replace @f's metadata with the JSON object of string values at @text (@len bytes), as
 * wfs_st_meta_json() writes it (any JSON layout is accepted). Returns 0, -EINVAL (not such an
 * object; the reason in @err, "byte OFFSET" counted in @text), or -ENOMEM.
 */
int wfs_st_meta_parse(struct wfs_st_file *f, const char *text, size_t len, char *err, size_t errlen);

/*
 * Parse a shape like "[4096,1024]" as user.weightfs.shape holds it (@len bytes at @text) into @shape
 * (WFS_ST_MAX_DIMS entries) and *@ndim: wfs_shape_parse(), the grammar the daemon checks the
 * attribute with. Returns 0 or -EINVAL. Out parameters are written only on success.
 */
int wfs_st_shape_parse(const char *text, size_t len, uint64_t shape[WFS_ST_MAX_DIMS], unsigned *ndim);

/*
 * Format @shape (@ndim dimensions) as user.weightfs.shape holds it: "[4096,1024]", "[]" for a
 * scalar, into @buf (@size bytes; WFS_ST_MAX_DIMS × 21 + 2 is always enough). Returns the length
 * without the NUL, or -ERANGE when @buf is too small.
 */
int wfs_st_shape_format(const uint64_t *shape, unsigned ndim, char *buf, size_t size);

/*
 * Can tensor name @name be a relative path below a directory (import writes tensor "a/b.weight" as
 * file a/b.weight)? It cannot when it is empty, starts or ends with '/', has an empty, "." or ".."
 * component or a component over 255 bytes, or starts a component with WFS_TMP_PREFIX (".wfs-tmp-",
 * the names of tensor files being written, lib/tensorfile.h) or ".wfs-import." (what import named
 * them before). Returns 0, or -EINVAL with the reason in @err.
 */
int wfs_st_name_check(const char *name, char *err, size_t errlen);

/*
 * A sharded checkpoint's index (model.safetensors.index.json, the transformers convention):
 *   {"metadata": {...any JSON...}, "weight_map": {"TENSOR NAME": "SHARD FILE NAME", ...}}
 * Shard file names are relative to the index's directory.
 */
struct wfs_st_index_entry {
	char *name;  /* tensor name, UTF-8, owned by the index */
	char *shard; /* shard file name, owned by the index */
};
struct wfs_st_index {
	size_t nentries;
	struct wfs_st_index_entry *entries; /* sorted by name, bytewise; names are unique */
	size_t nshards;
	char **shards;                      /* the distinct shard file names, sorted */
	char *metadata;                     /* "metadata" as compact JSON with sorted keys; NULL if absent */
};

/*
 * Parse an index (@len bytes at @text). Refuses (-EINVAL, the reason in @err with a byte offset in
 * @text): invalid JSON, duplicate keys, no "weight_map" object, a value that is not a string, a shard
 * name that is empty, absolute, or has a "." or ".." component. -ENOMEM. On success *@out is a new
 * index the caller frees with wfs_st_index_free().
 */
int wfs_st_index_parse(const char *text, size_t len, struct wfs_st_index **out, char *err, size_t errlen);
void wfs_st_index_free(struct wfs_st_index *ix);
/* The shard file the index maps tensor @name to, or NULL (owned by @ix). */
const char *wfs_st_index_shard(const struct wfs_st_index *ix, const char *name);

#endif
