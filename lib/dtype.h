/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dtype — tensor element types and shapes as safetensors names them, for the user.weightfs.dtype and
 * user.weightfs.shape extended attributes and for safetensors import/export (safetensors.h).
 *
 * Names and sizes follow the safetensors format (huggingface/safetensors, Dtype enum): BOOL U8 I8
 * F8_E5M2 F8_E4M3 F8_E8M0 (1 byte), I16 U16 F16 BF16 (2), I32 U32 F32 (4), I64 U64 F64 C64 (8;
 * C64 is a complex number of two F32). The enum's sub-byte dtypes (F4, F6_E2M3, F6_E3M2) have no
 * whole bytes per element and are not accepted. Shapes are JSON arrays of non-negative integers:
 * "[4096,1024]", "[]" for a scalar (one element).
 */
#ifndef WFS_DTYPE_H
#define WFS_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "weightfs.h"

/*
 * The one dtype table. Its order is the reference's Dtype enum ("MUST be in increasing alignment
 * order"), sub-byte dtypes included, so that a position is also the rank safetensors' writer lays
 * tensors out by (largest first). All functions are pure and thread-safe.
 */

/* Bytes per element of dtype @name (@len bytes, not NUL-terminated): 1, 2, 4 or 8; -EINVAL if
 * unknown or sub-byte (F4, F6_E2M3, F6_E3M2). */
int wfs_dtype_size(const char *name, size_t len);

/* Number of dtypes wfs_dtype_size() accepts (the whole-byte ones): 17. For the Python package. */
unsigned wfs_dtype_count(void);

/* Name of accepted dtype @i (0 <= @i < wfs_dtype_count(), in the reference's order: "BOOL" first),
 * a static string; NULL when @i is out of range. */
const char *wfs_dtype_name(unsigned i);

/* Bytes per element of accepted dtype @i (as wfs_dtype_name()), or -EINVAL when out of range. */
int wfs_dtype_size_at(unsigned i);

/*
 * Position of dtype @name (@len bytes) in the reference's full Dtype order (sub-byte dtypes
 * included: BOOL 0, F4 1, ..., U64 19), or -EINVAL when unknown. *@sub_byte (may be NULL) tells
 * whether it is one of the sub-byte dtypes, which safetensors knows but weightfs refuses.
 */
int wfs_dtype_rank(const char *name, size_t len, bool *sub_byte);

#define WFS_SHAPE_MAX_DIMS 32

/*
 * Parse shape @text (@len bytes): a JSON array of at most WFS_SHAPE_MAX_DIMS integers in
 * [0, 2^64), digits only (no sign, fraction or exponent), whitespace allowed between tokens. Writes
 * the dimensions to @dims and their count to *@ndim (0 for "[]", a scalar). Returns 0 or -EINVAL;
 * out parameters are written only on success. The one grammar for user.weightfs.shape: the daemon
 * checks with it what export reads back.
 */
int wfs_shape_parse(const char *text, size_t len, uint64_t dims[WFS_SHAPE_MAX_DIMS], unsigned *ndim);

/*
 * Parse shape @text (@len bytes, as wfs_shape_parse()) into its element count (the product of the
 * dimensions; 1 for "[]", 0 when any dimension is 0). Returns 0, or -EINVAL (not a shape) or
 * -EOVERFLOW (the product does not fit in 64 bits). *@elements is written only on success.
 */
int wfs_shape_elements(const char *text, size_t len, uint64_t *elements);

/*
 * Bytes of a tensor of dtype @dtype (@dlen bytes) and shape @shape (@slen bytes, as
 * wfs_shape_parse()): elements × bytes per element, into *@bytes. Returns 0, -EINVAL (not a dtype or
 * not a shape) or -EOVERFLOW (more than 2^64 - 1 bytes). *@bytes is written only on success.
 */
int wfs_tensor_bytes(const char *dtype, size_t dlen, const char *shape, size_t slen, uint64_t *bytes);

/* WFS_TMP_PREFIX (weightfs.h) as a function, so the Python package can check its copy (ctypes). */
const char *wfs_tmp_prefix(void);

#endif
