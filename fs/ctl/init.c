/* SPDX-License-Identifier: Apache-2.0 */
/*
 * weightfsctl init: make a new, empty store in a directory (lib/store.h, lib/catalog.h).
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "catalog.h"
#include "ctl.h"
#include "mounts.h"
#include "store.h"
#include "weightfs.h"

/* Does directory @path exist and hold anything? */
static bool dir_has_entries(const char *path)
{
	struct dirent *e;
	bool found = false;
	DIR *d = opendir(path);

	if (!d)
		return false;
	while (!found && (e = readdir(d)) != NULL)
		found = strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
	closedir(d);
	return found;
}

/*
 * @path made absolute with its links resolved into @real (PATH_MAX bytes); a @path that does not
 * exist yet (init creates it) by its parent's. Returns 0 or -errno of realpath(3).
 */
static int resolve(const char *path, char *real)
{
	char parent[PATH_MAX], *slash;
	const char *base;

	if (realpath(path, real))
		return 0;
	if (errno != ENOENT || strlen(path) >= sizeof(parent))
		return -errno;
	strcpy(parent, path);
	slash = strrchr(parent, '/');
	base = slash ? slash + 1 : parent;
	if (slash == parent)
		strcpy(parent, "/");
	else if (slash)
		*slash = '\0';
	if (!realpath(slash ? parent : ".", real))
		return -errno;
	if (strlen(real) + 1 + strlen(path + (base - parent)) >= PATH_MAX)
		return -ENAMETOOLONG;
	strcat(real, strcmp(real, "/") == 0 ? "" : "/");
	strcat(real, path + (base - parent));
	return 0;
}

static void init_usage(FILE *out)
{
	fprintf(out, "usage: weightfsctl init [--retain SIZE] STORE\n\n"
		     "Make a new, empty weightfs store in directory STORE (created when missing; its parent\n"
		     "must exist): objects/, tmp/ and catalog.db, with STORE made 0700 so that only you (and\n"
		     "root) read it directly; others read through a mount, under each file's mode. STORE may\n"
		     "hold other files (left as they are, but out of other users' reach: a line says when\n"
		     "STORE's mode changed, from what to what): this is the way to make a store there, which\n"
		     "weightfs refuses to do by itself. A store already there is left as it is (exit 0).\n"
		     "Then mount it: weightfs STORE MOUNTPOINT.\n\n"
		     "  --retain SIZE every mount of the store keeps up to SIZE bytes (K, M, G, T, P suffixes)\n"
		     "                of the objects no name uses, so a later run writing the same weights\n"
		     "                stores nothing new (default 0; weightfsctl retain changes it later)\n");
}

int wfs_ctl_init(int argc, char **argv)
{
	uint64_t retain = UINT64_MAX, recorded = 0; /* UINT64_MAX: not given (no size parses to it) */
	const struct wfs_ctl_opt opts[] = {
		WFS_CTL_OPT_SIZE("retain", 'r', &retain, "not a size (e.g. 20G)"),
		WFS_CTL_OPT_END,
	};
	const struct wfs_ctl_cmd cmd = {"init", init_usage, opts, 1, 1};
	char real[PATH_MAX], mnt[PATH_MAX], store[PATH_MAX], db[PATH_MAX + 16];
	struct wfs_catalog *c = NULL;
	struct wfs_store *s = NULL;
	const char *path;
	struct stat st;
	bool existed = false, had_files = false; /* STORE was a directory before init; it held entries */
	mode_t before = 0;                        /* then its permission bits */
	int ret;

	ret = wfs_ctl_parse(&cmd, argc, argv);
	if (ret != WFS_CTL_GO_ON)
		return ret;
	path = argv[optind];
	if (resolve(path, real) == 0) {
		if (wfs_mounts_holding(real, mnt, store) == 0) {
			if (strcmp(mnt, real) == 0)
				fprintf(stderr, "weightfsctl init: %s: a weightfs mount point (of %s): a store "
					"must live outside any mount of one\n", path, store);
			else
				fprintf(stderr, "weightfsctl init: %s: inside the weightfs mount %s (of %s): a "
					"store must live outside any mount of one\n", path, mnt, store);
			return 1;
		}
	}
	if (wfs_store_enclosing(path, store)) {
		fprintf(stderr, "weightfsctl init: %s: inside the weightfs store %s: a store must live outside "
			"any other (its gc and fsck would take this one's files for their own)\n", path, store);
		return 1;
	}
	snprintf(db, sizeof(db), "%s/" WFS_STORE_CATALOG, path);
	if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
		existed = true;
		before = st.st_mode & 07777;
	}
	if (existed && access(db, F_OK) == 0) {
		/* An init run again with what it was run with: done. Another budget is a change, which
		 * init does not make to a store it finds. */
		if (retain != UINT64_MAX && (wfs_catalog_open(db, WFS_CATALOG_READONLY, 0, 0, &c) ||
				     wfs_catalog_retain_get(c, &recorded) || recorded != retain)) {
			wfs_catalog_close(c);
			fprintf(stderr, "weightfsctl init: %s: already a weightfs store, left as it is (its "
				"retention budget: %llu bytes); change the budget with: weightfsctl retain %s "
				"SIZE\n", path, (unsigned long long)recorded, path);
			return 1;
		}
		wfs_catalog_close(c);
		printf("init: %s: already a weightfs store; left as it is\n", path);
		return 0;
	}
	snprintf(mnt, sizeof(mnt), "%s/objects", path);
	if (dir_has_entries(mnt)) {
		fprintf(stderr, "weightfsctl init: %s: objects/ holds objects but there is no catalog.db: not "
			"starting an empty namespace over them (restore catalog.db, or move objects/ away)\n",
			path);
		return 1;
	}
	had_files = existed && dir_has_entries(path);
	umask(077); /* catalog.db and what else is made here: for the store's owner only */
	ret = wfs_store_open(path, WFS_STORE_INIT, &s);
	if (ret == 0)
		ret = wfs_catalog_open(db, WFS_CATALOG_CREATE, getuid(), getgid(), &c);
	if (ret == 0 && retain != UINT64_MAX)
		ret = wfs_catalog_retain_set(c, retain);
	wfs_catalog_close(c);
	wfs_store_close(s);
	if (ret == -ENOENT && wfs_store_parent_missing(path, mnt)) {
		fprintf(stderr, "weightfsctl init: %s: its parent directory %s does not exist (make it first: "
			"mkdir -p %s)\n", path, mnt, mnt);
		return 1;
	}
	if (ret == -EBUSY) {
		fprintf(stderr, "weightfsctl init: %s: in use by %s\n", path, wfs_ctl_store_owner(path, mnt, sizeof(mnt)));
		return 1;
	}
	if (ret) {
		fprintf(stderr, "weightfsctl init: %s: %s\n", path, strerror(-ret));
		return 1;
	}
	printf("init: %s: a new weightfs store (mode 0700, keeps %llu bytes of objects no name uses); mount it "
	       "with: weightfs %s MOUNTPOINT\n", path, retain == UINT64_MAX ? 0ull : (unsigned long long)retain,
	       path);
	/* The store is made 0700 (lib/store.h): say so where that took other users' access away. */
	if (existed && stat(path, &st) == 0 && (st.st_mode & 07777) != before)
		printf("init: %s: mode changed from %04o to %04o%s\n", path, (unsigned)before,
		       (unsigned)(st.st_mode & 07777),
		       had_files ? ": other users can no longer reach the files that were there" : "");
	return 0;
}
