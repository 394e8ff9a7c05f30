/* SPDX-License-Identifier: Apache-2.0 */
/*
 * weightfsctl export: a directory of tensor files as one safetensors file, through lib/st_export.h,
 * which holds the format, the layout and the checks. Here: options, --store (ctl.h), one progress
 * line on a terminal, one line per error, a JSON or text summary.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "ctl.h"
#include "st_export.h"
#include "weightfs.h"

static void export_usage(FILE *out)
{
	fprintf(out,
		"usage: weightfsctl export [--force] [--raw-ok] [--json] DIR OUT\n"
		"       weightfsctl export --store STORE [--force] [--raw-ok] [--json] DIR OUT\n\n"
		"Write every regular file below DIR as one tensor of the safetensors file OUT, named by its\n"
		"path relative to DIR, with the dtype and shape of its user.weightfs.dtype and\n"
		"user.weightfs.shape xattrs (its size must match them); anything below DIR that is not a\n"
		"regular file or a directory is an error. DIR's " WFS_XATTR_ST_META "\n"
		"xattr, if any, becomes the header's __metadata__. Tensors are laid out as the reference\n"
		"implementation does (largest dtype first, then by name), so the output depends only on\n"
		"the tensors, and a checkpoint that import wrote exports byte-identical. A directory\n"
		"that weightfs.FrozenOffload wrote (with .weightfs-manifest.json) exports the\n"
		"parameters its manifest names, under their parameter names.\n\n"
		"  --store STORE  DIR is a path in the store's namespace; an unmounted store is mounted\n"
		"                 privately for the export\n"
		"  --force        replace OUT when it exists\n"
		"  --raw-ok       export a file without dtype/shape xattrs as U8 [bytes] (default: error)\n"
		"  --json         print a JSON summary\n\n"
		"OUT is written to a temporary file next to it, synced and renamed, so it is either the\n"
		"old file or the complete new one. Progress is shown on a terminal.\n\n"
		"exit status: 0 exported, 1 failed, 2 usage error\n");
}

int wfs_ctl_export(int argc, char **argv)
{
	struct wfs_ctl_tf_ui ui = {.verb = "export"};
	struct wfs_st_export_options opt = {
		.stop = &wfs_ctl_interrupted, .progress = wfs_ctl_tf_progress, .error = wfs_ctl_tf_error, .ctx = &ui,
	};
	const char *store = NULL, *out_arg;
	bool json = false;
	const struct wfs_ctl_opt opts[] = {
		WFS_CTL_OPT_STRING("store", 's', &store),
		WFS_CTL_OPT_FLAG("force", 'f', &opt.force),
		WFS_CTL_OPT_FLAG("raw-ok", 'r', &opt.raw_ok),
		WFS_CTL_OPT_FLAG("json", 'j', &json),
		WFS_CTL_OPT_END,
	};
	const struct wfs_ctl_cmd cmd = {"export", export_usage, opts, 2, 2};
	struct wfs_st_export_summary sum = {0};
	struct wfs_ctl_target ts = {0};
	char dir[PATH_MAX];
	struct stat st;
	int c, ret;

	ret = wfs_ctl_parse(&cmd, argc, argv);
	if (ret != WFS_CTL_GO_ON)
		return ret;
	ret = 1;
	out_arg = argv[optind + 1];
	wfs_ctl_progress_init(&ui.progress, true);
	wfs_ctl_catch_signals();
	if (stat(out_arg, &st) == 0) { /* before a private mount is made for nothing */
		if (!S_ISREG(st.st_mode)) {
			fprintf(stderr, "weightfsctl export: %s: exists and is not a regular file (the output is "
				"a .safetensors file; --force replaces a file only)\n", out_arg);
			return 1;
		}
		if (!opt.force) {
			fprintf(stderr, "weightfsctl export: %s: exists (--force replaces it)\n", out_arg);
			return 1;
		}
	}
	if (store && wfs_ctl_target_open("export", store, &ts))
		goto out;
	if ((c = wfs_ctl_target_dir(store ? &ts : NULL, argv[optind], dir)) != 0) {
		fprintf(stderr, "weightfsctl export: %s: %s\n", argv[optind],
			c == -EINVAL ? "'..' would leave the store" : strerror(-c));
		goto out;
	}
	ret = wfs_st_export(dir, out_arg, &opt, &sum) ? 1 : 0;
	if (wfs_ctl_interrupted) {
		fprintf(stderr, "weightfsctl export: interrupted; %s left as it was\n", out_arg);
		ret = 1;
	}
out:
	wfs_ctl_progress_clear(&ui.progress);
	if (wfs_ctl_target_close("export", &ts))
		ret = 1;
	if (ret == 0 && json)
		ret = wfs_ctl_json_print(json_pack("{s:o, s:o?, s:o, s:I, s:I, s:I, s:I, s:b, s:I}", "dir",
						   wfs_ctl_json_string(argv[optind]), "store", wfs_ctl_json_string(store),
						   "out", wfs_ctl_json_string(out_arg), "tensors", (json_int_t)sum.tensors,
						   "header_bytes", (json_int_t)sum.header_bytes, "data_bytes",
						   (json_int_t)sum.data_bytes, "file_bytes", (json_int_t)sum.file_bytes,
						   "metadata", sum.metadata, "raw_files", (json_int_t)sum.raw_files),
					 0);
	else if (ret == 0)
		printf("export: %zu tensors (%.1f MiB) from %s%s%s into %s (%llu bytes)\n", sum.tensors,
		       (double)sum.data_bytes / 1048576.0, store ? store : "", store ? ":" : "", argv[optind],
		       out_arg, (unsigned long long)sum.file_bytes);
	return ret;
}
