/* SPDX-License-Identifier: Apache-2.0 */
/* dtype: safetensors dtype sizes and shape parsing (lib/dtype.h). */
#include <errno.h>
#include <string.h>

#include "dtype.h"
#include "safetensors.h"
#include "testutil.h"

static int size_of(const char *name)
{
	return wfs_dtype_size(name, strlen(name));
}

static int shape(const char *text, uint64_t *n)
{
	return wfs_shape_elements(text, strlen(text), n);
}

START_TEST(dtype_sizes)
{
	ck_assert_int_eq(size_of("BOOL"), 1);
	ck_assert_int_eq(size_of("U8"), 1);
	ck_assert_int_eq(size_of("I8"), 1);
	ck_assert_int_eq(size_of("F8_E4M3"), 1);
	ck_assert_int_eq(size_of("F8_E5M2"), 1);
	ck_assert_int_eq(size_of("F16"), 2);
	ck_assert_int_eq(size_of("BF16"), 2);
	ck_assert_int_eq(size_of("I16"), 2);
	ck_assert_int_eq(size_of("U16"), 2);
	ck_assert_int_eq(size_of("F32"), 4);
	ck_assert_int_eq(size_of("I32"), 4);
	ck_assert_int_eq(size_of("U32"), 4);
	ck_assert_int_eq(size_of("F64"), 8);
	ck_assert_int_eq(size_of("I64"), 8);
	ck_assert_int_eq(size_of("U64"), 8);
	ck_assert_int_eq(size_of("F8_E8M0"), 1);
	ck_assert_int_eq(size_of("C64"), 8);
}
END_TEST

START_TEST(dtype_unknown)
{
	ck_assert_int_eq(size_of("f32"), -EINVAL); /* names are case-sensitive, as in safetensors */
	ck_assert_int_eq(size_of("F3"), -EINVAL);
	ck_assert_int_eq(size_of("F320"), -EINVAL);
	ck_assert_int_eq(size_of(""), -EINVAL);
	ck_assert_int_eq(size_of("F4"), -EINVAL); /* sub-byte: no whole bytes per element */
	ck_assert_int_eq(wfs_dtype_size("F32", 2), -EINVAL); /* length counts, not the NUL */
}
END_TEST

START_TEST(dtype_table)
{
	unsigned n = wfs_dtype_count();
	bool sub = false;

	ck_assert_uint_eq(n, 17);
	ck_assert_str_eq(wfs_dtype_name(0), "BOOL");
	ck_assert_ptr_null(wfs_dtype_name(n));
	ck_assert_int_eq(wfs_dtype_size_at(n), -EINVAL);
	for (unsigned i = 0; i < n; i++) /* the table by index agrees with the table by name */
		ck_assert_int_eq(wfs_dtype_size_at(i), size_of(wfs_dtype_name(i)));
	/* The reference's Dtype order, sub-byte dtypes known by name (rank) but without a size. */
	ck_assert_int_eq(wfs_dtype_rank("BOOL", 4, &sub), 0);
	ck_assert(!sub);
	ck_assert_int_eq(wfs_dtype_rank("F4", 2, &sub), 1);
	ck_assert(sub);
	ck_assert_int_eq(wfs_dtype_rank("U64", 3, NULL), 19);
	ck_assert_int_eq(wfs_dtype_rank("f32", 3, NULL), -EINVAL);
	ck_assert_str_eq(wfs_tmp_prefix(), ".wfs-tmp-");
}
END_TEST

START_TEST(shape_valid)
{
	uint64_t n = 99;

	ck_assert_int_eq(shape("[4096,1024]", &n), 0);
	ck_assert_uint_eq(n, 4194304);
	ck_assert_int_eq(shape("[]", &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_int_eq(shape(" [ 3 , 5 ,7 ] ", &n), 0);
	ck_assert_uint_eq(n, 105);
	ck_assert_int_eq(shape("[0,4096]", &n), 0);
	ck_assert_uint_eq(n, 0);
	ck_assert_int_eq(shape("[4294967296,4294967296,0]", &n), 0); /* zero wins over overflow */
	ck_assert_uint_eq(n, 0);
	ck_assert_int_eq(shape("[18446744073709551615]", &n), 0);
	ck_assert_uint_eq(n, UINT64_MAX);
}
END_TEST

START_TEST(shape_invalid)
{
	uint64_t n = 7;

	ck_assert_int_eq(shape("", &n), -EINVAL);
	ck_assert_int_eq(shape("4096,1024", &n), -EINVAL);
	ck_assert_int_eq(shape("[4096,1024", &n), -EINVAL);
	ck_assert_int_eq(shape("[4096,]", &n), -EINVAL);
	ck_assert_int_eq(shape("[,1]", &n), -EINVAL);
	ck_assert_int_eq(shape("[-1]", &n), -EINVAL);
	ck_assert_int_eq(shape("[1.5]", &n), -EINVAL);
	ck_assert_int_eq(shape("[1] x", &n), -EINVAL);
	ck_assert_int_eq(shape("[184467440737095516160]", &n), -EINVAL); /* a dimension past 64 bits */
	ck_assert_int_eq(shape("[4294967296,4294967296]", &n), -EOVERFLOW);
	ck_assert_int_eq(shape("[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]", &n), -EINVAL);
	ck_assert_uint_eq(n, 7); /* untouched on error */
}
END_TEST

/* The dimensions themselves, and the same grammar where export reads the attribute back. */
/* Tensor bytes from dtype and shape text: elements x element size; errors for each part. */
START_TEST(tensor_bytes)
{
	uint64_t b = 7;

	ck_assert_int_eq(wfs_tensor_bytes("BF16", 4, "[4096,1024]", 11, &b), 0);
	ck_assert_uint_eq(b, 4096ull * 1024 * 2);
	ck_assert_int_eq(wfs_tensor_bytes("F32", 3, "[]", 2, &b), 0);
	ck_assert_uint_eq(b, 4);
	ck_assert_int_eq(wfs_tensor_bytes("U8", 2, "[0,5]", 5, &b), 0);
	ck_assert_uint_eq(b, 0);
	b = 7;
	ck_assert_int_eq(wfs_tensor_bytes("XYZ", 3, "[1]", 3, &b), -EINVAL);
	ck_assert_int_eq(wfs_tensor_bytes("F32", 3, "4096", 4, &b), -EINVAL);
	/* 2^62 elements of 8 bytes: more than 2^64 - 1 bytes. */
	ck_assert_int_eq(wfs_tensor_bytes("F64", 3, "[4611686018427387904]", 21, &b), -EOVERFLOW);
	ck_assert_uint_eq(b, 7); /* written only on success */
}
END_TEST

START_TEST(shape_dims)
{
	uint64_t dims[WFS_SHAPE_MAX_DIMS] = {0};
	unsigned nd = 99;

	ck_assert_int_eq(wfs_shape_parse(" [ 4096 ,\t1024 ] ", 17, dims, &nd), 0);
	ck_assert_uint_eq(nd, 2);
	ck_assert_uint_eq(dims[0], 4096);
	ck_assert_uint_eq(dims[1], 1024);
	ck_assert_int_eq(wfs_shape_parse("[]", 2, dims, &nd), 0);
	ck_assert_uint_eq(nd, 0);
	nd = 99;
	ck_assert_int_eq(wfs_shape_parse("[-0]", 4, dims, &nd), -EINVAL); /* JSON allows it; a shape not */
	ck_assert_int_eq(wfs_shape_parse("[1e3]", 5, dims, &nd), -EINVAL);
	ck_assert_uint_eq(nd, 99);
	ck_assert_int_eq(wfs_st_shape_parse("[-0]", 4, dims, &nd), -EINVAL);
	ck_assert_int_eq(wfs_st_shape_parse("[18446744073709551615]", 22, dims, &nd), 0);
	ck_assert_uint_eq(dims[0], UINT64_MAX);
}
END_TEST

static Suite *dtype_suite(void)
{
	Suite *s = suite_create("dtype");
	TCase *tc = tcase_create("dtype");

	tcase_add_test(tc, dtype_sizes);
	tcase_add_test(tc, dtype_unknown);
	tcase_add_test(tc, dtype_table);
	tcase_add_test(tc, shape_dims);
	suite_add_tcase(s, tc);
	tc = tcase_create("shape");
	tcase_add_test(tc, shape_valid);
	tcase_add_test(tc, shape_invalid);
	tcase_add_test(tc, tensor_bytes);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tu_main("check_dtype", dtype_suite(), 0, NULL);
}
