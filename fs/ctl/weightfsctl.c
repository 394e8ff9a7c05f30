/* SPDX-License-Identifier: Apache-2.0 */
/*
 * weightfsctl — the weightfs admin command line: one binary, one subcommand per task (ctl.h).
 */
#include <stdio.h>
#include <string.h>

#include "ctl.h"
#include "log.h"

struct subcommand {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *summary;
};

static const struct subcommand subcommands[] = {
	{"init", wfs_ctl_init, "make a new, empty store (private to you) in a directory"},
	{"stat", wfs_ctl_stat, "names, bytes, objects and the dedup ratio of a store, mount or subtree"},
	{"fsck", wfs_ctl_fsck, "check every object's digest and the catalog; --repair what is safe"},
	{"gc", wfs_ctl_gc, "remove objects no name uses (beyond a retention budget)"},
	{"retain", wfs_ctl_retain, "show or record how much of the objects no name uses the store keeps"},
	{"stage", wfs_ctl_stage, "copy files to a GPU through pinned buffers (and back), with a benchmark"},
	{"import", wfs_ctl_import, "write a safetensors checkpoint (or sharded index) as tensor files"},
	{"export", wfs_ctl_export, "write a directory of tensor files as one safetensors file"},
	{"cache", wfs_ctl_cache, "drop, load (on a NUMA node) or measure the page cache of names"},
	{"upgrade", wfs_ctl_upgrade, "replace the binary serving a mount (-o holder) without unmounting"},
};

static void usage(FILE *out)
{
	fprintf(out, "usage: weightfsctl COMMAND [ARGS]  (weightfsctl COMMAND --help for its options)\n\n"
		     "commands:\n");
	for (size_t i = 0; i < sizeof(subcommands) / sizeof(subcommands[0]); i++)
		fprintf(out, "  %-8s %s\n", subcommands[i].name, subcommands[i].summary);
	fprintf(out, "\nexit status: 0 success, 1 the work failed or found a problem, 2 usage error\n");
}

int main(int argc, char **argv)
{
	wfs_log_init("weightfsctl", false, WFS_LOG_WARN);
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
		usage(stdout);
		return 0;
	}
	if (strcmp(argv[1], "--version") == 0) {
		printf("weightfsctl %s\n", WFS_VERSION);
		return 0;
	}
	for (size_t i = 0; i < sizeof(subcommands) / sizeof(subcommands[0]); i++)
		if (strcmp(argv[1], subcommands[i].name) == 0)
			return subcommands[i].fn(argc - 1, argv + 1);
	fprintf(stderr, "weightfsctl: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
