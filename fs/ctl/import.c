/* SPDX-License-Identifier: Apache-2.0 */
/*
 * weightfsctl import: a safetensors checkpoint (or a sharded one's index) as tensor files, through
 * lib/st_import.h, which holds the format, the checks and the write protocol. Here: options, --store
 * (ctl.h), one progress line on a terminal, one line per error, a JSON or text summary.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "ctl.h"
#include "mounts.h"
#include "st_import.h"
#include "weightfs.h"

static void import_usage(FILE *out)
{
	fprintf(out,
		"usage: weightfsctl import [--force] [--json] CHECKPOINT DIR\n"
		"       weightfsctl import --store STORE [--force] [--json] CHECKPOINT [DIR]\n\n"
		"Write each tensor of a safetensors checkpoint as a file DIR/<tensor name> with its\n"
		"user.weightfs.dtype and user.weightfs.shape xattrs; '/' in a name makes directories.\n"
		"CHECKPOINT is a .safetensors file, or a sharded checkpoint's index (NAME.json: its\n"
		"weight_map names the shards, every one is imported and checked against the map).\n"
		"The checkpoint's __metadata__ goes into DIR's " WFS_XATTR_ST_META " xattr\n"
		"(an index's metadata into " WFS_XATTR_ST_INDEX "). Every header is checked before\n"
		"anything is written; a malformed one is refused with its byte offset and the reason.\n"
		"Identical tensors are stored once. DIR is made when missing. A tensor DIR already holds\n"
		"(the same dtype, shape and bytes) is left as it is and reported unchanged, so importing\n"
		"the same checkpoint again succeeds and writes nothing.\n\n"
		"  --store STORE  import into the store's namespace, DIR being a path in it (default: its\n"
		"                 root); an unmounted store is mounted privately for the import\n"
		"  --force        replace tensors that exist in DIR with other content, dtype or shape,\n"
		"                 and DIR's metadata\n"
		"  --json         print a JSON summary\n\n"
		"Each tensor appears under its name only complete and with its xattrs; tensors written\n"
		"before an error stay. Progress is shown on a terminal.\n\n"
		"exit status: 0 imported, 1 malformed checkpoint or failed import, 2 usage error\n");
}

/*
 * Does directory @dir (which may not exist yet) lie in a store's own directory, outside any weightfs
 * mount: under an ancestor holding catalog.db and objects/? Its path into @store (PATH_MAX bytes).
 * Importing there would write plain files among the store's objects.
 */
static bool inside_store(const char *dir, char *store)
{
	char real[PATH_MAX], probe[PATH_MAX + 16], mnt[PATH_MAX], of[PATH_MAX];
	struct stat st;

	if (strlen(dir) >= sizeof(real))
		return false;
	strcpy(real, dir);
	while (!realpath(real, store)) { /* the deepest part of @dir that exists */
		char *slash = strrchr(real, '/');

		if (!slash || slash == real)
			return false;
		*slash = '\0';
	}
	strcpy(real, store);
	if (wfs_mounts_below(real, mnt, of) == 0 || wfs_mounts_on(real, of) == 0)
		return false; /* through a mount: the namespace, whatever its names */
	for (char *slash;; *slash = '\0') { /* @real, then each of its ancestors but / */
		snprintf(probe, sizeof(probe), "%s/objects", real);
		if (stat(probe, &st) == 0 && S_ISDIR(st.st_mode)) {
			snprintf(probe, sizeof(probe), "%s/" WFS_STORE_CATALOG, real);
			if (access(probe, F_OK) == 0) {
				snprintf(store, PATH_MAX, "%s", real);
				return true;
			}
		}
		slash = strrchr(real, '/');
		if (!slash || slash == real)
			return false;
	}
}

int wfs_ctl_import(int argc, char **argv)
{
	struct wfs_ctl_tf_ui ui = {.verb = "import"};
	struct wfs_st_import_options opt = {
		.stop = &wfs_ctl_interrupted, .progress = wfs_ctl_tf_progress, .error = wfs_ctl_tf_error, .ctx = &ui,
	};
	const char *store = NULL, *dir_arg, *checkpoint;
	bool json = false;
	const struct wfs_ctl_opt opts[] = {
		WFS_CTL_OPT_STRING("store", 's', &store),
		WFS_CTL_OPT_FLAG("force", 'f', &opt.force),
		WFS_CTL_OPT_FLAG("json", 'j', &json),
		WFS_CTL_OPT_END,
	};
	const struct wfs_ctl_cmd cmd = {"import", import_usage, opts, 1, 2};
	struct wfs_st_import *im = NULL;
	struct wfs_st_import_summary sum = {0};
	struct wfs_ctl_target ts = {0};
	char dir[PATH_MAX];
	int c, ret;

	ret = wfs_ctl_parse(&cmd, argc, argv);
	if (ret != WFS_CTL_GO_ON)
		return ret;
	if (argc - optind == 1 && !store) { /* DIR may be left out only with --store */
		import_usage(stderr);
		return 2;
	}
	ret = 1;
	checkpoint = argv[optind];
	dir_arg = argc - optind == 2 ? argv[optind + 1] : ".";
	wfs_ctl_progress_init(&ui.progress, true);
	wfs_ctl_catch_signals();
	if (wfs_st_import_open(checkpoint, &opt, &im))
		goto out;
	if (store && wfs_ctl_target_open("import", store, &ts))
		goto out;
	if ((c = wfs_ctl_target_dir(store ? &ts : NULL, dir_arg, dir)) != 0) {
		fprintf(stderr, "weightfsctl import: %s: %s\n", dir_arg,
			c == -EINVAL ? "'..' would leave the store" : strerror(-c));
		goto out;
	}
	if (!store) {
		char where[PATH_MAX];

		if (inside_store(dir, where)) {
			fprintf(stderr, "weightfsctl import: %s: inside the weightfs store %s itself: import "
				"through its mount, or with --store %s\n", dir_arg, where, where);
			goto out;
		}
	}
	ret = wfs_st_import_run(im, dir) ? 1 : 0;
	wfs_ctl_progress_clear(&ui.progress);
	wfs_st_import_summary(im, &sum);
	if (wfs_ctl_interrupted) {
		fprintf(stderr, "weightfsctl import: interrupted; %zu of %zu tensors imported\n", sum.tensors_done,
			sum.tensors);
		ret = 1;
	}
out:
	if (wfs_ctl_target_close("import", &ts))
		ret = 1;
	if (ret == 0 && json) {
		ret = wfs_ctl_json_print(json_pack("{s:o, s:o, s:o?, s:I, s:I, s:I, s:I, s:I, s:b, s:b}", "checkpoint",
						   wfs_ctl_json_string(checkpoint), "dir", wfs_ctl_json_string(dir_arg),
						   "store", wfs_ctl_json_string(store), "shards", (json_int_t)sum.shards,
						   "tensors", (json_int_t)sum.tensors, "bytes", (json_int_t)sum.bytes,
						   "replaced", (json_int_t)sum.replaced, "unchanged",
						   (json_int_t)sum.unchanged, "metadata", sum.metadata,
						   "index_metadata", sum.index_metadata),
					 0);
	} else if (ret == 0) {
		char unchanged[64] = "";

		if (sum.unchanged == sum.tensors && sum.tensors)
			snprintf(unchanged, sizeof(unchanged), " (unchanged: all there already)");
		else if (sum.unchanged)
			snprintf(unchanged, sizeof(unchanged), " (%zu unchanged, %zu written)", sum.unchanged,
				 sum.tensors - sum.unchanged);
		printf("import: %zu tensors (%.1f MiB) from %s into %s%s%s%s\n", sum.tensors,
		       (double)sum.bytes / 1048576.0, checkpoint, store ? store : "", store ? ":" : "", dir_arg,
		       unchanged);
	}
	wfs_st_import_free(im);
	return ret;
}
