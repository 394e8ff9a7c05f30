/* SPDX-License-Identifier: Apache-2.0 */
/*
 * weightfs STORE MOUNTPOINT [options] — mount a content-addressed store of frozen model weights.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse_opt.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "cache.h"
#include "daemon.h"
#include "direct.h"
#include "fault.h"
#include "gc.h"
#include "holder.h"
#include "inode.h"
#include "log.h"
#include "mounts.h"
#include "object.h"
#include "ops.h"
#include "receive.h"
#include "takeover.h"
#include "upgrade.h"
#include "weightfs.h"

enum { KEY_HELP, KEY_VERSION, KEY_CHOICE, KEY_ACCESS, KEY_REFUSED };

#define OPT(t, p, v) {t, offsetof(struct wfs_options, p), v}
/* -o timeout's largest value (seconds): a day; the kernel's caches of names and attributes are
 * dropped by the daemon when they change, so a longer one buys nothing. */
#define WFS_TIMEOUT_MAX_S 86400
static const struct fuse_opt option_spec[] = {
	OPT("passthrough=auto", passthrough, -1),
	OPT("passthrough=off", passthrough, 0),
	OPT("passthrough_writes=all", passthrough_writes, WFS_WRITES_ALL),
	OPT("passthrough_writes=tensors", passthrough_writes, WFS_WRITES_TENSORS),
	OPT("passthrough_writes=auto", passthrough_writes, WFS_WRITES_ALL),
	OPT("passthrough_writes=off", passthrough_writes, WFS_WRITES_OFF),
	OPT("verify=open", verify, 1),
	OPT("verify=none", verify, 0),
	OPT("dedup_verify=bytes", dedup_verify, 1),
	OPT("dedup_verify=digest", dedup_verify, 0),
	OPT("retain=%s", retain_text, 0),
	OPT("readahead=%s", readahead_text, 0),
	OPT("sync", sync, WFS_SYNC_CLOSE),
	OPT("sync=close", sync, WFS_SYNC_CLOSE),
	OPT("sync=group", sync, WFS_SYNC_GROUP),
	OPT("sync=none", sync, WFS_SYNC_NONE),
	OPT("nosync", sync, WFS_SYNC_NONE),
	OPT("timeout=%lf", timeout, 0),
	OPT("spin=%s", spin_text, 0),
	OPT("holder", holder, 1),
	OPT("noholder", holder, 0),
	/* fuse_opt runs every template that matches: these see the choices above too (opt_proc). */
	FUSE_OPT_KEY("passthrough=", KEY_CHOICE),
	FUSE_OPT_KEY("passthrough_writes=", KEY_CHOICE),
	FUSE_OPT_KEY("verify=", KEY_CHOICE),
	FUSE_OPT_KEY("dedup_verify=", KEY_CHOICE),
	FUSE_OPT_KEY("sync", KEY_CHOICE),
	FUSE_OPT_KEY("sync=", KEY_CHOICE),
	FUSE_OPT_KEY("nosync", KEY_CHOICE),
	FUSE_OPT_KEY("holder", KEY_CHOICE),
	FUSE_OPT_KEY("noholder", KEY_CHOICE),
	FUSE_OPT_KEY("allow_other", KEY_ACCESS),
	FUSE_OPT_KEY("allow_root", KEY_ACCESS),
	FUSE_OPT_KEY("auto_unmount", KEY_REFUSED),
	FUSE_OPT_KEY("-h", KEY_HELP),
	FUSE_OPT_KEY("--help", KEY_HELP),
	FUSE_OPT_KEY("-V", KEY_VERSION),
	FUSE_OPT_KEY("--version", KEY_VERSION),
	FUSE_OPT_END,
};

static void usage(const char *prog)
{
	printf("usage: %s STORE MOUNTPOINT [options]\n"
	       "\n"
	       "Mount the weightfs store in directory STORE at MOUNTPOINT. A missing or empty STORE\n"
	       "becomes a new store, private to you (mode 0700; its parent must exist; not below an\n"
	       "fstab mount point that is not mounted now); a directory that holds other files is\n"
	       "refused (weightfsctl init STORE makes a store there).\n"
	       "Refused too: a MOUNTPOINT that holds a store (swapped arguments), one already mounted,\n"
	       "and a dead mount (clear it with fusermount3 -u MOUNTPOINT).\n"
	       "Files written under the mount are stored once per distinct content, named by their\n"
	       "XXH3-128 digest, and sealed (made immutable) when closed.\n"
	       "\n"
	       "weightfs options:\n"
	       "    -o passthrough=auto|off  serve reads through kernel FUSE passthrough when the kernel\n"
	       "                             and privileges allow (default auto)\n"
	       "    -o passthrough_writes=all|tensors|off  with passthrough, which writes the kernel\n"
	       "                             makes into the store itself: every create or open with\n"
	       "                             O_TRUNC, and tensors whose dtype and shape declare 4 MiB\n"
	       "                             or more (all, the default; auto is all); only those\n"
	       "                             tensors (tensors); none (off)\n"
	       "    -o verify=open|none      check each object's digest on its first open after mount;\n"
	       "                             a mismatch quarantines it and fails its names with EIO\n"
	       "                             (default open)\n"
	       "    -o dedup_verify=bytes    when content is already stored, compare the bytes before\n"
	       "                             dropping the new copy (XXH3 is not collision-resistant;\n"
	       "                             default digest: trust the digest)\n"
	       "    -o retain=SIZE           keep up to SIZE bytes (K, M, G, T, P suffixes) of objects no\n"
	       "                             name uses, least recently released out first, so a later\n"
	       "                             run writing the same weights stores nothing new; recorded\n"
	       "                             in the store for every later mount (default: the recorded\n"
	       "                             budget, weightfsctl retain STORE); gives way to writes on\n"
	       "                             a store that fills up\n"
	       "    -o readahead=SIZE        how far the kernel reads ahead of a daemon-served reader\n"
	       "                             (no passthrough; default 4M, root only)\n"
	       "    -o sync=group|close|none group: every seal is durable within 1 s of its close(2)\n"
	       "                             (one syncfs of the store for all of them), a file whose\n"
	       "                             writer called fsync(2) when close(2) returns. close (or\n"
	       "                             sync): so is every file of 64 MiB or more. none (or\n"
	       "                             nosync): no syncs (scratch stores). Default group\n"
	       "    -o timeout=SECONDS       kernel cache timeout for names and attributes (default 10,\n"
	       "                             at most 86400)\n"
	       "    -o spin=US               after each request, a request thread polls for the next one\n"
	       "                             this long before it sleeps, so the requests of a create or\n"
	       "                             an unlink need no wake-ups; 0: sleep at once (no CPU spent\n"
	       "                             polling; slower). Default 50, at most 10000\n"
	       "    -o holder|noholder       holder: a holder process keeps the FUSE connection: when the\n"
	       "                             process serving it dies (kill -9, OOM, a crash), a successor\n"
	       "                             takes the mount over within a second, with every change it\n"
	       "                             answered, and callers only wait. noholder: a crash leaves\n"
	       "                             the mount dead (ENOTCONN). Default holder, noholder with -f\n"
	       "                             or -d (the process in the foreground serves the mount)\n"
	       "    -f                       stay in the foreground\n"
	       "    -d                       debug output (implies -f)\n"
	       "    -h, --help               this help, then libfuse's own options\n"
	       "    -V, --version            version\n"
	       "passthrough, passthrough_writes, verify, dedup_verify, sync|nosync and holder|noholder\n"
	       "take one choice each: conflicting ones in one option set (sync,nosync) are refused,\n"
	       "and so is passthrough=off with passthrough_writes=all or tensors.\n"
	       "\n"
	       "Unmount with: fusermount3 -u MOUNTPOINT\n"
	       "libfuse's options follow; of them, auto_unmount is refused (a holder keeps the mount\n"
	       "through a server's death).\n\n",
	       prog);
}

/*
 * Set in a server the holder started from another binary (an upgrade, upgrade.h): the mount point
 * argument is not given to libfuse, whose realpath(3) of it would wait for this very server.
 */
static bool upgrade_server;

static int opt_proc(void *data, const char *arg, int key, struct fuse_args *outargs)
{
	struct wfs_options *opt = data;

	(void)outargs;
	switch (key) {
	case FUSE_OPT_KEY_NONOPT:
		if (!opt->store) {
			opt->store = strdup(arg);
			return 0;
		}
		if (!opt->mountpoint)
			opt->mountpoint = strdup(arg); /* to name it if it is missing */
		return upgrade_server ? 0 : 1; /* the mount point: fuse_parse_cmdline takes it */
	case KEY_HELP:
		opt->show_help = 1;
		return 0;
	case KEY_VERSION:
		opt->show_version = 1;
		return 0;
	case KEY_REFUSED:
		/* libfuse's, and listed by its --help: it would spawn fusermount3 to unmount when this
		 * process dies, which the holder exists to prevent (and Debian's fusermount3 refuses
		 * libfuse 3.17's flag for it, so the mount went on without it). */
		fprintf(stderr, "weightfs: -o %s is not supported: a holder (-o holder, the default in the "
			"background) keeps the mount through a server's death; unmount with fusermount3 -u\n", arg);
		return -1;
	case KEY_ACCESS: {
		/* libfuse's, passed on; with both, allow_root won silently (only root and the owner got
		 * in), where fusermount3 refuses the pair. */
		static char *chosen_access; /* the first of the pair given */

		if (chosen_access && strcmp(chosen_access, arg) != 0) {
			fprintf(stderr, "weightfs: -o %s,%s: conflicting choices for who may use the mount; give "
				"one\n", chosen_access, arg);
			return -1;
		}
		free(chosen_access);
		chosen_access = strdup(arg);
		return 1;
	}
	case KEY_CHOICE: {
		/* Each choice with its group: one choice per group in an option set (a later one must not
		 * silently win over an earlier one, as in -o sync,nosync). */
		static const struct {
			const char *group, *arg;
		} valid[] = {
			{"passthrough", "passthrough=auto"}, {"passthrough", "passthrough=off"},
			{"passthrough_writes", "passthrough_writes=all"},
			{"passthrough_writes", "passthrough_writes=tensors"},
			{"passthrough_writes", "passthrough_writes=auto"},
			{"passthrough_writes", "passthrough_writes=off"},
			{"verify", "verify=open"},           {"verify", "verify=none"},
			{"dedup_verify", "dedup_verify=bytes"}, {"dedup_verify", "dedup_verify=digest"},
			{"sync", "sync=group"},              {"sync", "sync=close"},
			{"sync", "sync=none"},
			{"holder", "holder=on"},             {"holder", "holder=off"},
		};
		static const char *chosen[sizeof(valid) / sizeof(valid[0])]; /* by the group's first entry */
		static const char *typed[sizeof(valid) / sizeof(valid[0])]; /* as given, for the message */
		const char *given = arg;
		size_t n;

		if (strcmp(arg, "sync") == 0) /* the short names of four choices */
			arg = "sync=close";
		else if (strcmp(arg, "nosync") == 0)
			arg = "sync=none";
		else if (strcmp(arg, "holder") == 0)
			arg = "holder=on";
		else if (strcmp(arg, "noholder") == 0)
			arg = "holder=off";
		n = strcspn(arg, "=") + 1;

		for (size_t i = 0; i < sizeof(valid) / sizeof(valid[0]); i++) {
			size_t g = 0;

			if (strcmp(arg, valid[i].arg) != 0)
				continue;
			while (strcmp(valid[g].group, valid[i].group) != 0)
				g++;
			if (chosen[g] && strcmp(chosen[g], valid[i].arg) != 0) {
				fprintf(stderr, "weightfs: -o %s,%s: conflicting choices for %s; give one\n",
					typed[g], given, valid[i].group);
				return -1;
			}
			chosen[g] = valid[i].arg;
			free((char *)typed[g]);
			typed[g] = strdup(given); /* fuse_opt frees the option string it split */
			/* Writes through passthrough need passthrough: asked for both ways, neither wins. */
			for (size_t pt = 0, pw = 0; pt < sizeof(valid) / sizeof(valid[0]); pt++) {
				while (pw < sizeof(valid) / sizeof(valid[0]) &&
				       strcmp(valid[pw].group, "passthrough_writes") != 0)
					pw++;
				if (strcmp(valid[pt].group, "passthrough") != 0 || !chosen[pt] || !chosen[pw])
					continue;
				if (strcmp(chosen[pt], "passthrough=off") == 0 &&
				    (strcmp(chosen[pw], "passthrough_writes=all") == 0 ||
				     strcmp(chosen[pw], "passthrough_writes=tensors") == 0)) {
					fprintf(stderr, "weightfs: -o %s,%s: writes through passthrough need "
						"passthrough; give one\n", typed[g == pt ? pw : pt], given);
					return -1;
				}
				break;
			}
			return 0; /* set by its own template */
		}
		fprintf(stderr, "weightfs: -o %s: expected", arg);
		for (size_t i = 0, k = 0; i < sizeof(valid) / sizeof(valid[0]); i++)
			if (strncmp(arg, valid[i].arg, n) == 0)
				fprintf(stderr, "%s%s", k++ ? " or " : " ", valid[i].arg + n);
		fprintf(stderr, "\n");
		return -1;
	}
	default:
		return 1;
	}
}

/*
 * The store (fsname) of the live fuse.weightfs mount on directory @dir (a resolved path), into @store
 * (PATH_MAX bytes); the topmost when mounts are stacked. Returns true when there is one.
 */
static bool weightfs_mount_on(const char *dir, char *store)
{
	return wfs_mounts_on(dir, store) == 0;
}

/* The mount point of a fuse.weightfs mount of store @store (a resolved path), into @mnt. */
static bool weightfs_mount_of(const char *store, char *mnt)
{
	return wfs_mounts_of(store, false, mnt) == 0;
}

/* Does directory @dir hold a store's catalog.db or objects/ (of which @found gets the name)? */
static bool holds_store(const char *dir, const char **found)
{
	static const char *const marks[] = {WFS_STORE_CATALOG, WFS_STORE_OBJECTS};
	char path[PATH_MAX + 16];

	for (size_t i = 0; i < sizeof(marks) / sizeof(marks[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, marks[i]);
		if (access(path, F_OK) == 0) {
			*found = marks[i];
			return true;
		}
	}
	return false;
}

/*
 * Refuse what cannot work, or would hide or clobber something, before touching anything: a mount
 * point that is not a directory, a dead mount, one already served by weightfs (a second mount would
 * stack on it), one that holds a store (the arguments swapped: mounting would hide that store and lay
 * a new one out elsewhere), a STORE that is a weightfs mount point, a store inside its own mount
 * point (the daemon would wait on itself), inside any other weightfs mount, or inside another store.
 * Prints one line; 0 or -1.
 */
/* Say that @mountpoint is a mount whose daemon is gone (ENOTCONN), and how to clear it. */
static void dead_mount(const char *mountpoint)
{
	fprintf(stderr, "weightfs: %s: a dead mount (its daemon is gone: %s); clear it with: fusermount3 -u %s "
		"(if that says busy, a process still has a file open there: fusermount3 -uz %s detaches it "
		"now)\n", mountpoint, strerror(ENOTCONN), mountpoint, mountpoint);
}

static int check_paths(const char *store, const char *mountpoint)
{
	char mnt[PATH_MAX], st[PATH_MAX], parent[PATH_MAX], other[PATH_MAX];
	bool made = false;
	const char *mark;
	struct stat sb;
	size_t n;

	if (stat(mountpoint, &sb) < 0) {
		if (errno == ENOTCONN)
			dead_mount(mountpoint);
		else
			fprintf(stderr, "weightfs: %s: %s\n", mountpoint, strerror(errno));
		return -1;
	}
	if (!S_ISDIR(sb.st_mode)) {
		fprintf(stderr, "weightfs: %s: mount point is not a directory\n", mountpoint);
		return -1;
	}
	if (!realpath(mountpoint, mnt))
		return 0;
	if (weightfs_mount_on(mnt, other)) {
		struct statfs sf;

		/* stat(2) of a dead mount's root can succeed from the kernel's attribute cache; statfs is
		 * always sent to the daemon, and fails with ENOTCONN once it is gone. */
		if (statfs(mnt, &sf) < 0 && errno == ENOTCONN)
			dead_mount(mountpoint);
		else
			fprintf(stderr, "weightfs: %s: already a weightfs mount (of %s); unmount it first: "
				"fusermount3 -u %s\n", mountpoint, other, mountpoint);
		return -1;
	}
	if (holds_store(mnt, &mark)) {
		fprintf(stderr, "weightfs: %s: the mount point holds a weightfs store (%s): the arguments "
			"look swapped (usage: weightfs STORE MOUNTPOINT)\n", mountpoint, mark);
		return -1;
	}
	/* The store may not exist yet (@made: to be made): resolve its parent. */
	if (!realpath(store, st)) {
		made = true;
		snprintf(parent, sizeof(parent), "%s", store);
		for (n = strlen(parent); n > 1 && parent[n - 1] == '/'; n--)
			parent[n - 1] = '\0'; /* "new/": its parent is that of "new" */
		char *slash = strrchr(parent, '/');

		if (slash && slash != parent)
			*slash = '\0';
		else
			snprintf(parent, sizeof(parent), ".");
		if (!realpath(parent, st))
			return 0;
	} else if (weightfs_mount_on(st, other)) {
		fprintf(stderr, "weightfs: %s: a weightfs mount point (of %s), not a store: the arguments "
			"look swapped (usage: weightfs STORE MOUNTPOINT)\n", store, other);
		return -1;
	}
	n = strlen(mnt);
	if (strncmp(st, mnt, n) == 0 && (st[n] == '\0' || st[n] == '/' || n == 1)) {
		fprintf(stderr, "weightfs: %s: the store cannot live inside its own mount point %s\n", store,
			mountpoint);
		return -1;
	}
	/* The mount would hide the store's own objects/, tmp/ or any of its files. */
	n = strlen(st);
	if (!made && strncmp(mnt, st, n) == 0 && mnt[n] == '/') {
		fprintf(stderr, "weightfs: %s: the mount point is inside the store %s: the mount would hide "
			"the store's own files\n", mountpoint, store);
		return -1;
	}
	/* @st: the store, or the parent it will be made in, which may be the mount point itself. */
	if (wfs_mounts_holding(st, parent, other) == 0) {
		fprintf(stderr, "weightfs: %s: inside the weightfs mount %s (of %s): a store must live outside "
			"any mount of one\n", store, parent, other);
		return -1;
	}
	/* Inside another store (its tmp/ or objects/, say), also when this one is still to be made. */
	if (wfs_store_enclosing(store, other)) {
		fprintf(stderr, "weightfs: %s: inside the weightfs store %s: a store must live outside any "
			"other\n", store, other);
		return -1;
	}
	return 0;
}

/*
 * Can this process open /dev/fuse, as libfuse does first to mount? Root can; another user needs read
 * and write permission on it, which some systems do not give (mode 0600): libfuse's own line was a
 * bare "fuse: failed to open /dev/fuse: Permission denied", after the store had been made. Says
 * what a mount by a user other than root needs, in one line, before anything is touched. A mount
 * point of /dev/fd/N (a connection a mount helper already made) opens nothing. Other errors
 * (no device: the fuse module) are left to libfuse, which names them. Returns 0 or -1.
 */
static int check_fuse_device(const char *mountpoint)
{
	struct stat st;
	char mode[64] = "";
	int fd, err;

	if (strncmp(mountpoint, "/dev/fd/", 8) == 0)
		return 0;
	fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
	if (fd >= 0) {
		close(fd);
		return 0;
	}
	err = errno;
	if (err != EACCES && err != EPERM)
		return 0;
	if (stat("/dev/fuse", &st) == 0)
		snprintf(mode, sizeof(mode), " (mode %04o, owner uid %u, group gid %u)",
			 (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid, (unsigned)st.st_gid);
	fprintf(stderr, "weightfs: cannot open /dev/fuse%s: %s: a mount by a user other than root needs "
		"read and write access to /dev/fuse (mode 0666, as most distributions set it; or a group of "
		"the user's) and fusermount3 installed set-user-ID root; passthrough needs CAP_SYS_ADMIN, so "
		"such a mount serves reads and writes from the daemon (weightfs(8), MOUNTING AS A USER)\n",
		mode, strerror(err));
	return -1;
}

/* Print why the store at @store could not be opened (wfs_store_open's @err): one line. */
static void store_open_error(const char *store, int err)
{
	char real[PATH_MAX], what[PATH_MAX], mnt[PATH_MAX];
	int pid;

	if (err == -ENOTEMPTY) {
		fprintf(stderr, "weightfs: %s: not a weightfs store (no catalog.db or objects/) and not empty: "
			"refusing to make a store among its files; give a missing or empty directory, or make "
			"a store there on purpose with: weightfsctl init %s\n", store, store);
		return;
	}
	if (err == -ENODEV && wfs_store_disk_absent(store, what, mnt) == -ENODEV) {
		fprintf(stderr, "weightfs: %s: no store here, and not making one: the fstab mounts %s on %s, "
			"which is not mounted now (its disk absent?), so a new store would land on the "
			"filesystem below it. Mount %s first; or make a store here on purpose with: "
			"weightfsctl init %s\n", store, mnt, what, what, store);
		return;
	}
	if (err == -ENOENT && wfs_store_parent_missing(store, what)) {
		fprintf(stderr, "weightfs: %s: cannot make the store: its parent directory %s does not exist "
			"(make it first: mkdir -p %s)\n", store, what, what);
		return;
	}
	if (err != -EBUSY) {
		fprintf(stderr, "weightfs: %s: cannot open store: %s\n", store, strerror(-err));
		return;
	}
	if (wfs_store_owner(store, &pid, what, sizeof(what)) == 0) {
		/* Its mount gone while it runs: a lazy unmount detached it, and it serves the files still
		 * open through it until the last one closes. */
		bool detached = realpath(store, real) && !weightfs_mount_of(real, mnt);

		fprintf(stderr, "weightfs: %s: cannot open store: in use by another weightfs process (pid %d%s%s)%s\n",
			store, pid, *what ? ", " : "", what,
			detached ? "; it is no longer mounted: a lazy unmount (fusermount3 -uz, umount -l) "
				   "detached it, and it exits once the last file still open through it is closed"
				 : "");
		return;
	}
	if (realpath(store, real) && weightfs_mount_of(real, mnt)) {
		fprintf(stderr, "weightfs: %s: cannot open store: in use by another weightfs process "
			"(mounted on %s)\n", store, mnt);
		return;
	}
	fprintf(stderr, "weightfs: %s: cannot open store: in use by another weightfs process\n", store);
}

/*
 * Warn (log and stderr) when other users can enter the store directory: they could read every object
 * and the catalog directly, whatever a file's mode under the mount says.
 */
static void warn_if_open(const char *store)
{
	struct stat st;

	if (stat(store, &st) == 0 && (st.st_mode & (S_IXGRP | S_IXOTH)))
		wfs_log(WFS_LOG_WARN, "%s: the store can be entered by other users (mode %04o): they can read "
			"every object and the catalog directly, whatever a file's mode under the mount; make it "
			"private with: chmod 700 %s", store, (unsigned)(st.st_mode & 07777), store);
}

/* Is STORE/objects non-empty? */
static bool has_objects(const char *store)
{
	char path[PATH_MAX + 16];
	struct dirent *e;
	bool found = false;
	DIR *d;

	snprintf(path, sizeof(path), "%s/objects", store);
	d = opendir(path);
	if (!d)
		return false;
	while (!found && (e = readdir(d)) != NULL)
		found = e->d_name[0] != '.';
	closedir(d);
	return found;
}

/*
 * The retention budget belongs to the store (catalog.h, wfs_catalog_retain_get): -o retain=SIZE
 * records it for every later mount, and a mount without it keeps what is recorded, so that a plain
 * remount after a crash, mount(8) and weightfsctl's private mounts do not delete what the store
 * keeps. Sets fs->opt.retain. Returns 0 or -errno of the catalog (printed).
 */
static int retention_budget(struct wfs_fs *fs)
{
	uint64_t recorded;
	int ret = wfs_catalog_retain_get(fs->catalog, &recorded);

	if (ret == 0 && !fs->opt.retain_text)
		fs->opt.retain = recorded;
	else if (ret == 0 && recorded != fs->opt.retain) {
		ret = wfs_catalog_retain_set(fs->catalog, fs->opt.retain);
		if (ret == 0)
			wfs_log(WFS_LOG_INFO, "%s: retention budget recorded: %llu bytes (was %llu); every "
				"mount of the store keeps that much of the objects no name uses",
				fs->opt.store, (unsigned long long)fs->opt.retain, (unsigned long long)recorded);
	}
	if (ret)
		fprintf(stderr, "weightfs: %s: cannot %s the retention budget: %s\n", fs->opt.store,
			fs->opt.retain_text ? "record" : "read", strerror(-ret));
	return ret;
}

/* wfs_catalog_unreferenced()'s callback: adds each object's bytes to the total at @ctx. */
static int add_bytes(void *ctx, const struct wfs_digest *d, uint64_t bytes)
{
	(void)d;
	*(uint64_t *)ctx += bytes;
	return 0;
}

/*
 * What every server learns of retention before it serves, however it started: the first server of
 * a mount, a crash's successor (forked from the holder, whose copies of both date from the mount)
 * and an upgrade's new binary (which ran none of the mount's start). Sets fs->opt.retain, the
 * store's budget (retention_budget), and fs->retained, the bytes of the objects no name uses now,
 * which must never count less than there is: wfs_object_maybe_delete() collects only once the
 * count crosses the budget. Call once the catalog is as the last server left it (a successor's
 * replay done, its releases counted). Removes nothing: a successor's objects still open through the
 * dead server are not adopted yet; the next release collects beyond the budget. A catalog that
 * cannot be read leaves the budget as it was (the command line's, or the holder's copy) and the
 * retained bytes counted at the budget, so that the first release collects, and counts them.
 */
static void retention_start(struct wfs_fs *fs)
{
	uint64_t bytes = 0;
	int ret;

	retention_budget(fs); /* on an error, printed: the budget stays as it was */
	ret = wfs_catalog_unreferenced(fs->catalog, add_bytes, &bytes);
	if (ret) {
		wfs_log(WFS_LOG_WARN, "retention: cannot count the objects no name uses: %s; the next "
			"removal counts them", strerror(-ret));
		bytes = fs->opt.retain;
	}
	fs->retained = bytes;
	fs->retained_none = false;
}

/* Does @store hold a catalog without the objects/ directory beside it (removed by hand)? */
static bool objects_missing(const char *store)
{
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s/" WFS_STORE_CATALOG, store);
	if (access(path, F_OK) < 0)
		return false;
	snprintf(path, sizeof(path), "%s/" WFS_STORE_OBJECTS, store);
	return access(path, F_OK) < 0 && errno == ENOENT;
}

/*
 * objects/ was missing and the store's open made an empty one: the catalog's contents are gone.
 * Served all the same (their names read EIO until written again, and nothing else is lost), but
 * said at once, in the log and on stderr (found by a new operator: such a store mounted without a
 * word).
 */
static void objects_gone_note(struct wfs_fs *fs)
{
	struct wfs_catalog_stats st;

	if (wfs_catalog_stats(fs->catalog, &st) != 0 || st.objects + st.unreferenced_objects == 0)
		return;
	wfs_log(WFS_LOG_ERR, "%s/objects was missing (made again, empty): the %llu contents the catalog lists "
		"are gone; their names fail with EIO until written again (weightfsctl fsck %s lists them)",
		fs->opt.store, (unsigned long long)(st.objects + st.unreferenced_objects), fs->opt.store);
}

static int open_catalog(struct wfs_fs *fs, bool recover)
{
	char path[PATH_MAX];
	struct wfs_recovery rec;
	int ret, pid;

	snprintf(path, sizeof(path), "%s/" WFS_STORE_CATALOG, fs->opt.store);
	if (recover && access(path, F_OK) < 0 && errno == ENOENT && has_objects(fs->opt.store)) {
		char backup[PATH_MAX + 8];

		snprintf(backup, sizeof(backup), "%s.backup", path);
		fprintf(stderr, "weightfs: %s is missing but %s/objects holds objects: refusing to start an "
			"empty namespace over them (restore catalog.db, or move objects/ away%s)\n", path,
			fs->opt.store, access(backup, F_OK) == 0 ? "; catalog.db.backup, which the last unmount "
			"kept, is beside it" : "");
		return -ENOENT;
	}
	ret = wfs_catalog_open(path, WFS_CATALOG_CREATE, getuid(), getgid(), &fs->catalog);
	if (ret) {
		char why[256];

		if (ret == -EIO && wfs_catalog_diagnose(path, why, sizeof(why)) == 1)
			fprintf(stderr, "weightfs: %s: the catalog is damaged (SQLite: %s); see what weightfsctl "
				"fsck %s says (with a backup beside it, fsck --repair rebuilds it)\n", path, why,
				fs->opt.store);
		else
			fprintf(stderr, "weightfs: %s: cannot open catalog: %s\n", path, strerror(-ret));
		return ret;
	}
	wfs_catalog_watch_inodes(fs->catalog, wfs_inode_attr_changed, fs); /* GETATTR from memory */
	if (!recover)
		return 0;
	if (retention_budget(fs))
		return -EIO;
	ret = wfs_catalog_recover(fs->catalog, &rec);
	if (ret) {
		fprintf(stderr, "weightfs: %s: recovery failed: %s\n", path, strerror(-ret));
		return ret;
	}
	if (rec.unsealed_removed || rec.orphans_removed || rec.declared_empty_removed)
		wfs_log(WFS_LOG_INFO, "recovered: removed %llu never-sealed names, %llu temporary names "
			"sealed empty that declare bytes (a tensor write cut short), %llu orphan inodes",
			(unsigned long long)rec.unsealed_removed, (unsigned long long)rec.declared_empty_removed,
			(unsigned long long)rec.orphans_removed);
	{
		struct wfs_gc_report gc;

		/* Objects no name uses beyond the retention budget (a crash between a commit and
		 * the delete that follows it, or a smaller budget than last time) go now. */
		ret = wfs_gc_collect(fs->store, fs->catalog, fs->opt.retain, false, NULL, NULL, &gc);
		if (ret == 0 && gc.objects_removed)
			wfs_object_log_collected(fs, &gc);
		/* After a killed or crashed owner: object files linked whose catalog commit was lost
		 * (nothing names them; no seal is in flight before the mount). */
		if (ret == 0 && wfs_store_unclean(fs->store, &pid, NULL, 0))
			ret = wfs_gc_orphans(fs->store, fs->catalog, false, &gc);
		if (ret == 0 && gc.orphans_removed)
			wfs_log(WFS_LOG_INFO, "removed %llu orphan object files the catalog does not list (%llu bytes)",
				(unsigned long long)gc.orphans_removed, (unsigned long long)gc.orphan_bytes_removed);
		if (ret) {
			fprintf(stderr, "weightfs: %s: removing unused objects failed: %s\n", fs->opt.store,
				strerror(-ret));
			return ret;
		}
	}
	return 0;
}

/*
 * A successor that cannot take the connection over (takeover.h) says why and exits without
 * unmounting: the holder gives up, and the mount fails with ENOTCONN as it would without a holder,
 * rather than being served wrong or unmounted under its users (who would then write into the
 * directory beneath). Returns in any other server.
 */
static void takeover_refused(const char *why)
{
	if (!wfs_takeover_successor())
		return;
	wfs_log(WFS_LOG_ERR, "takeover refused: %s; server pid %d exits (its holder gives up and the mount "
		"fails, or, for an upgrade, starts the binary that served before)", why, (int)getpid());
	_exit(WFS_TAKEOVER_REFUSED);
}

/*
 * A server the holder started from another binary (upgrade.h) that cannot take the connection over
 * before it is a successor (takeover.h): says why, in the store's log too, and exits with
 * WFS_TAKEOVER_REFUSED, without unmounting; the holder goes back to the binary that served before.
 */
static __attribute__((noreturn)) void upgrade_refused(const char *store, const char *why, int err)
{
	char logpath[PATH_MAX + 16];

	snprintf(logpath, sizeof(logpath), "%s/" WFS_STORE_LOG, store ? store : ".");
	if (store)
		wfs_log_open_file(logpath);
	wfs_log(WFS_LOG_ERR, "takeover refused: pid %d (%s) %s%s%s; it exits and leaves the mount to its "
		"holder", (int)getpid(), WFS_VERSION, why, err ? ": " : "", err ? strerror(-err) : "");
	_exit(WFS_TAKEOVER_REFUSED);
}

/*
 * Let libfuse reject the options it does not know (a typo in an fstab line) before the store is
 * opened: opening it runs recovery and retention, which must not happen for a mount that fails.
 * Returns 0, or -1 after libfuse printed what it refused.
 */
static int check_fuse_options(const struct fuse_args *args, struct wfs_fs *fs)
{
	struct fuse_args probe = FUSE_ARGS_INIT(0, NULL);
	struct fuse_session *se;

	for (int i = 0; i < args->argc; i++)
		if (fuse_opt_add_arg(&probe, args->argv[i]) != 0) {
			fuse_opt_free_args(&probe);
			return -1;
		}
	se = fuse_session_new(&probe, &wfs_ops, sizeof(wfs_ops), fs);
	fuse_opt_free_args(&probe);
	if (!se)
		return -1;
	fuse_session_destroy(se);
	return 0;
}

int main(int argc, char *argv[])
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct fuse_cmdline_opts cmd = {0};
	struct fuse_loop_config *loop = NULL;
	bool mounted = false; /* fuse_session_mount() succeeded: a clean end is logged */
	bool made = false;    /* this run made the store: undone when the mount fails (wfs_store_unmake) */
	bool objects_gone = false; /* STORE/objects was missing, the catalog there (objects_gone_note) */
	struct wfs_fs fs = {0};
	struct wfs_upgrade_inherited inherited = {0};
	char fsname[2 * PATH_MAX + 64];
	uint64_t readahead = 0;
	int ret = 1;

	/* Started by a holder to take its mount over (upgrade.h): what it handed over, and no mount. */
	{
		int got = wfs_upgrade_inherited(&inherited);

		if (got == -ECHILD)
			upgrade_refused(getenv("WFS_UPGRADE_STORE"), "is not the holder's child: a wrapper of "
					"the upgrade's binary must exec weightfs, not run it", 0);
		if (got < 0)
			upgrade_refused(NULL, "was started with malformed WFS_UPGRADE_* variables", got);
		upgrade_server = got == 1;
	}

	fs.opt.passthrough = -1;
	fs.opt.passthrough_writes = WFS_WRITES_ALL;
	fs.opt.sync = WFS_SYNC_GROUP;
	fs.opt.verify = 1;
	fs.opt.timeout = 10.0;
	fs.opt.spin_us = WFS_RECEIVE_SPIN_US;
	fs.opt.holder = -1; /* not given: see below */
	if (fuse_opt_parse(&args, &fs.opt, option_spec, opt_proc) == -1) {
		ret = 2;
		goto out;
	}
	if (fs.opt.show_version) {
		printf("weightfs %s (libfuse %s)\n", WFS_VERSION, fuse_pkgversion());
		ret = 0;
		goto out;
	}
	if (fs.opt.show_help) {
		usage(argv[0]);
		fuse_lowlevel_help();
		ret = 0;
		goto out;
	}
	{
		struct stat sb;

		/* libfuse would say "bad mount point" and we would exit as for a usage error. */
		if (!upgrade_server && fs.opt.mountpoint && stat(fs.opt.mountpoint, &sb) < 0 && errno == ENOENT) {
			fprintf(stderr, "weightfs: %s: mount point: %s\n", fs.opt.mountpoint, strerror(errno));
			ret = 1;
			goto out;
		}
	}
	if (fuse_parse_cmdline(&args, &cmd) != 0) {
		ret = 2;
		goto out;
	}
	if (upgrade_server) { /* the holder's absolute paths: its working directory is not this one's */
		free(cmd.mountpoint);
		free(fs.opt.store);
		cmd.mountpoint = strdup(inherited.mount);
		fs.opt.store = strdup(inherited.store);
	}
	if (!fs.opt.store || !cmd.mountpoint) {
		fprintf(stderr, "usage: %s STORE MOUNTPOINT [options]  (try --help)\n", argv[0]);
		ret = 2;
		goto out;
	}
	if (fs.opt.retain_text && wfs_parse_size(fs.opt.retain_text, &fs.opt.retain)) {
		fprintf(stderr, "weightfs: -o retain=%s: not a size (e.g. 20G; units K, M, G, T, P)\n",
			fs.opt.retain_text);
		ret = 2;
		goto out;
	}
	if (fs.opt.readahead_text && (wfs_parse_size(fs.opt.readahead_text, &readahead) ||
				      (readahead > 0 && readahead < 4096) || readahead > (1ull << 30))) {
		fprintf(stderr, "weightfs: -o readahead=%s: expected 0 (none) or a size from 4K to 1G (e.g. 4M)\n",
			fs.opt.readahead_text);
		ret = 2;
		goto out;
	}
	fs.opt.readahead = fs.opt.readahead_text ? (int64_t)readahead : -1;
	if (!(fs.opt.timeout >= 0 && fs.opt.timeout <= WFS_TIMEOUT_MAX_S)) { /* NaN too */
		fprintf(stderr, "weightfs: -o timeout=%.17g: expected 0 to %d seconds\n", fs.opt.timeout,
			WFS_TIMEOUT_MAX_S);
		ret = 2;
		goto out;
	}
	if (fs.opt.spin_text) {
		char *end;
		unsigned long us = strtoul(fs.opt.spin_text, &end, 10);

		if (!isdigit((unsigned char)fs.opt.spin_text[0]) || *end || us > 10000) {
			fprintf(stderr, "weightfs: -o spin=%s: expected 0 to 10000 (microseconds)\n",
				fs.opt.spin_text);
			ret = 2;
			goto out;
		}
		fs.opt.spin_us = (unsigned)us;
	}
	free(fs.opt.mountpoint);
	fs.opt.mountpoint = strdup(cmd.mountpoint); /* resolved by fuse_parse_cmdline */
	if (!fs.opt.mountpoint || (!upgrade_server && (check_paths(fs.opt.store, cmd.mountpoint) ||
						       check_fuse_device(cmd.mountpoint)))) {
		ret = 1;
		goto out;
	}
	if (check_fuse_options(&args, &fs)) {
		/* libfuse's line names the option but not this program nor where the options are. */
		fprintf(stderr, "weightfs: options refused; nothing mounted (weightfs --help lists them)\n");
		ret = 2;
		goto out;
	}
	fs.opt.foreground = cmd.foreground;
	fs.opt.debug = cmd.debug;
	/* A daemon has a holder unless told not to; a process in the foreground (a terminal, a
	 * debugger) serves the mount itself unless told to have one (a systemd service: mounting.md). */
	if (fs.opt.holder < 0)
		fs.opt.holder = !cmd.foreground;
	wfs_log_init("weightfs", !cmd.foreground, cmd.debug ? WFS_LOG_DEBUG : WFS_LOG_INFO);

	/* The store is private to the mounting user: whatever the daemon creates in it (catalog.db,
	 * its WAL, tmp files, the log) is for its owner only. Other users read through the mount. */
	umask(077);
	if (upgrade_server) {
		ret = wfs_store_open_inherited(fs.opt.store, fs.opt.sync ? 0 : WFS_STORE_NOSYNC, inherited.lock_fd,
					       &fs.store);
		if (ret)
			upgrade_refused(fs.opt.store, "cannot open the store with the lock the holder handed over",
					ret);
	} else {
		made = access(fs.opt.store, F_OK) < 0 && errno == ENOENT; /* undone if the mount fails */
		objects_gone = !made && objects_missing(fs.opt.store);
		ret = wfs_store_open(fs.opt.store, WFS_STORE_CREATE | (fs.opt.sync ? 0 : WFS_STORE_NOSYNC),
				     &fs.store);
	}
	if (ret) {
		store_open_error(fs.opt.store, ret);
		ret = 1;
		goto out;
	}
	{
		/* fuse_daemonize() changes directory to /: keep the store's absolute path. */
		char *abs = realpath(fs.opt.store, NULL);

		if (abs) {
			free(fs.opt.store);
			fs.opt.store = abs;
		}
	}
	{
		/* Every mount logs next to the store (a background daemon also to syslog; its stderr
		 * goes nowhere): a foreground one too, such as weightfsctl's private mounts, so that
		 * what any mount did to the store (recovery, retention) is found in one place. */
		char logpath[PATH_MAX + 16];

		snprintf(logpath, sizeof(logpath), "%s/" WFS_STORE_LOG, fs.opt.store);
		wfs_log_open_file(logpath);
	}
	if (!upgrade_server)
		warn_if_open(fs.opt.store);
	if (!upgrade_server) {
		char what[PATH_MAX + 16];
		int pid;

		if (wfs_store_unclean(fs.store, &pid, what, sizeof(what)))
			wfs_log(WFS_LOG_WARN, "%s was not closed by its last owner (pid %d%s%s): killed, crashed "
				"or a power loss. Recovery runs now. A killed daemon's last %d ms of changes that "
				"no close or fsync waited for are gone; after a power loss, also files of its last "
				"%d ms whose bytes had not reached the disk: their first open fails with EIO "
				"(weightfsctl fsck %s lists them)",
				fs.opt.store, pid, what[0] ? ", " : "", what, WFS_COMMIT_INTERVAL_MS,
				WFS_SYNC_INTERVAL_MS, fs.opt.store);
	}
	/* SQLite connections must not cross fork(): recover now, reopen after daemonizing. A server of
	 * an upgrade recovers as a successor does, below. */
	if (!upgrade_server && open_catalog(&fs, true)) {
		ret = 1;
		goto out;
	}
	if (objects_gone)
		objects_gone_note(&fs);
	wfs_catalog_close(fs.catalog);
	fs.catalog = NULL;

	{
		/* libfuse splits -o at commas and takes a backslash as an escape: a store path with
		 * either is escaped (a comma made "unknown option" of the rest, after the store was made). */
		size_t n = 0;

		n += (size_t)snprintf(fsname, sizeof(fsname), "-ofsname=");
		for (const char *p = fs.opt.store; *p && n + 2 < sizeof(fsname) - 48; p++) {
			if (*p == ',' || *p == '\\')
				fsname[n++] = '\\';
			fsname[n++] = *p;
		}
		snprintf(fsname + n, sizeof(fsname) - n, ",subtype=weightfs,default_permissions");
	}
	fuse_opt_add_arg(&args, fsname);
	wfs_fs_init(&fs);

	fs.se = fuse_session_new(&args, &wfs_ops, sizeof(wfs_ops), &fs);
	ret = 1;
	if (!fs.se)
		goto out;
	fs.kernel = wfs_ops_kernel(fs.se); /* passthrough backing files, on the session's device */
	fs.lock.long_hook = wfs_receive_hand_over; /* a request thread that waits leads no more */
	if (fuse_set_signal_handlers(fs.se) != 0)
		goto out_session;
	if (upgrade_server) {
		char devpath[32];

		/* libfuse takes /dev/fd/N as a connection already mounted (its session unmounts nothing). */
		snprintf(devpath, sizeof(devpath), "/dev/fd/%d", inherited.devfd);
		if (fuse_session_mount(fs.se, devpath) != 0)
			upgrade_refused(fs.opt.store, "cannot use the /dev/fuse descriptor the holder handed over", 0);
	} else if (wfs_fault("mount") || fuse_session_mount(fs.se, cmd.mountpoint) != 0) {
		goto out_signals; /* (the fault point: a mount that fails, for the tests) */
	}
	mounted = true;
	/* Request threads are never retired: one that libfuse let go while it led would leave the
	 * device unread until a follower took over (receive.h). Say so (on the terminal too: before
	 * the daemon leaves it) rather than ignore it. */
	if (cmd.max_idle_threads != UINT_MAX)
		wfs_log(WFS_LOG_WARN, "-o max_idle_threads=%u is not used: request threads stay once started "
			"(at most max_threads)", cmd.max_idle_threads);
	/* Before the daemon's parent returns (fuse_daemonize() waits for the child): a signal that
	 * reaches it the moment `weightfs` returned is logged too. A fork keeps the handlers. */
	wfs_log_crash_handlers();
	if (!upgrade_server)
		fuse_daemonize(cmd.foreground); /* a server of an upgrade runs where its holder put it */
	if (!cmd.foreground)
		wfs_log_take_stderr(); /* an assertion's message, libfuse's and SQLite's, into the log */
	wfs_log_reopen_on(SIGUSR1); /* logrotate: weightfs.8 */
	{
		/* Each file being written through passthrough holds two descriptors of its version's
		 * file (openmode.h): as many as the hard limit allows, as servers do. */
		struct rlimit rl;

		if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
			rl.rlim_cur = rl.rlim_max;
			if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
				wfs_log(WFS_LOG_WARN, "RLIMIT_NOFILE stays at its soft limit: %s", strerror(errno));
		}
	}
	wfs_log(WFS_LOG_INFO, "%s mounted on %s (pid %d)", fs.opt.store, cmd.mountpoint, (int)getpid());
	if (fs.opt.holder && cmd.clone_fd) {
		wfs_log(WFS_LOG_WARN, "-o clone_fd is not used with -o holder: a dead server's cloned "
			"descriptors would end the requests it had read instead of leaving them to be resent");
		cmd.clone_fd = 0;
	}
	/* libnuma fills its table of each node's CPUs at its first use, without a lock: two first
	 * opens checking objects at once (wfs_cache_node_of_task, as after a takeover, when every
	 * rank opens again) raced on it under TSan. Filled here, before any thread or fork. */
	wfs_cache_node_of_task(getpid());
	/* From here on, with -o holder, this is a server process: the first, or a successor that takes
	 * the connection over from a dead one (takeover.h). The holder never returns. */
	if (upgrade_server) {
		ret = wfs_takeover_attach(inherited.region_fd);
		if (ret)
			upgrade_refused(fs.opt.store, "cannot use the holder's shared region", ret);
		wfs_takeover_server_start(fuse_session_fd(fs.se));
	} else {
		struct wfs_holder_args ha = {.mountpoint = cmd.mountpoint, .store = fs.opt.store,
					     .devfd = fuse_session_fd(fs.se), .lock_fd = wfs_store_lock_fd(fs.store),
					     .argv = argv};

		if (!fs.opt.holder || wfs_holder_run(&ha) != 0)
			wfs_takeover_server_start(fuse_session_fd(fs.se));
	}
	if (wfs_takeover_counters()) { /* since the mount, across takeovers */
		fs.counters = wfs_takeover_counters();
		wfs_ops_requests = wfs_takeover_request_tallies();
	}
	{
		char what[PATH_MAX + 16];

		/* After the fork: the pid that holds the store now, for a second mount's message. */
		snprintf(what, sizeof(what), WFS_STORE_MOUNTED_ON "%s", cmd.mountpoint);
		wfs_store_set_owner(fs.store, what);
	}
	{
		char catalog[PATH_MAX + 16];

		snprintf(catalog, sizeof(catalog), "%s/" WFS_STORE_CATALOG, fs.opt.store);
		if (wfs_takeover_check_store(catalog) != 0)
			takeover_refused("not the store the connection was set up for (the line above says why)");
	}
	if (open_catalog(&fs, false)) {
		takeover_refused("cannot open the catalog (the line above says why)");
		goto out_unmount;
	}
	if (wfs_takeover_successor()) {
		uint64_t removed = 0, replayed = 0, *kept = NULL;
		size_t redo_bytes, nkept;
		void *redo = wfs_takeover_redo_area(&redo_bytes);
		int r;

		/* First: the dead server's answered changes, on the catalog it logged them against. */
		r = wfs_catalog_redo_replay(fs.catalog, redo, redo_bytes, &replayed);
		if (r) {
			char why[160];

			snprintf(why, sizeof(why), "cannot apply the dead server's changes not yet committed: %s",
				 strerror(-r));
			takeover_refused(why);
		}
		if (replayed)
			wfs_log(WFS_LOG_INFO, "takeover: applied %llu changes the dead server had answered and "
				"not yet committed", (unsigned long long)replayed);
		nkept = wfs_takeover_kept_inodes(&kept);
		r = wfs_catalog_takeover(fs.catalog, wfs_takeover_ino_floor(), kept, nkept, &removed,
					     &fs.held_before);

		free(kept);

		if (r) {
			char why[160];

			snprintf(why, sizeof(why), "cannot recover the catalog: %s", strerror(-r));
			takeover_refused(why);
		}
		if (removed)
			wfs_log(WFS_LOG_INFO, "takeover: removed %llu names of files still being written when the "
				"server died (their writers get EIO)", (unsigned long long)removed);
		/* Object files the dead server linked and never committed (no seal runs yet here). */
		{
			struct wfs_gc_report gc = {0};

			if (wfs_gc_orphans(fs.store, fs.catalog, false, &gc) == 0 && gc.orphans_removed)
				wfs_log(WFS_LOG_INFO, "takeover: removed %llu object files the dead server linked "
					"and never committed (%llu bytes)", (unsigned long long)gc.orphans_removed,
					(unsigned long long)gc.orphan_bytes_removed);
		}
	}
	retention_start(&fs); /* every server, as the catalog is now: before any release */
	{
		size_t redo_bytes;
		void *redo = wfs_takeover_redo_area(&redo_bytes);
		int r = redo ? wfs_catalog_redo(fs.catalog, redo, redo_bytes) : 0;

		/* A successor must find every change the kernel was told of: a batch dies with its
		 * server, its redo log does not. Without a log, no batch: each change commits. */
		if (r)
			wfs_log(WFS_LOG_WARN, "catalog: no redo log for a successor (%s): every change commits "
				"before its reply", strerror(-r));
		else
			wfs_commit_start(&fs); /* without it, every change commits at once */
	}
	wfs_check_start(&fs);  /* without it, objects sealed on a declared digest wait for a first open */
	wfs_mapped_start(&fs); /* without it, files closed while mapped for writing seal at the unmount */
	if (wfs_ops_notifier_start(&fs))
		wfs_log(WFS_LOG_WARN, "no notifier thread: dentry news are told by request threads");
	wfs_direct_start(&fs, cmd.mountpoint); /* without it, clients read the mounted files */

	/* Without it, libfuse's receive path: slower, and no successor can take the mount over. */
	if (wfs_receive_install(fs.se, fs.opt.spin_us) != 0) {
		takeover_refused("cannot install the receive path that replays the INIT");
		if (wfs_takeover_on())
			wfs_log(WFS_LOG_WARN, "-o holder: the INIT cannot be kept: no successor can take this "
				"mount over");
	}
	if (wfs_takeover_on()) {
		int w = wfs_takeover_watch_holder(cmd.mountpoint);

		if (w)
			wfs_log(WFS_LOG_WARN, "holder: cannot watch the holder (%s): its death would go unlogged",
				strerror(-w));
	}
	wfs_delay("server.start"); /* test-only: a server slow to start (tests/takeover/run-upgrade) */
	if (wfs_takeover_on() && wfs_upgrade_server_start(&fs) != 0)
		wfs_log(WFS_LOG_WARN, "upgrade: this server cannot drain for an upgrade: weightfsctl upgrade of "
			"%s times out and leaves it serving", cmd.mountpoint);
	if (wfs_takeover_successor()) {
		struct wfs_takeover_info ti;

		wfs_takeover_adopt(&fs); /* before any request: the resent ones find them */
		if (wfs_takeover_replay(fs.se) != 0)
			takeover_refused("cannot replay the connection's INIT (the line above says why)");
		wfs_takeover_info(&ti);
		wfs_log(WFS_LOG_INFO, "takeover %llu: server pid %d serves %s (%.1f ms after the last one died)",
			(unsigned long long)ti.takeovers, (int)getpid(), cmd.mountpoint, ti.last_pause_ms);
		wfs_delay("takeover.serve"); /* test-only: resent requests wait in the kernel's queue */
	}
	if (cmd.singlethread) {
		ret = fuse_session_loop(fs.se);
	} else {
		loop = fuse_loop_cfg_create();
		fuse_loop_cfg_set_clone_fd(loop, cmd.clone_fd);
		fuse_loop_cfg_set_max_threads(loop, cmd.max_threads);
		ret = fuse_session_loop_mt(fs.se, loop);
	}
	if (ret == 0) { /* the kernel ended the connection (an unmount), not a signal: see openmode.h */
		wfs_lock(&fs.lock);
		wfs_openmode_release_closed(&fs); /* their seals, before the last commit */
		wfs_unlock(&fs.lock);
	}
	/* A positive value is the signal (SIGTERM, SIGINT, SIGHUP) that asked the loop to stop: a
	 * requested stop (systemd's at shutdown), as clean as an unmount. Negative is an error. */
	wfs_delay("daemon.exit"); /* test-only: a daemon slow to let go of its store after the unmount */
	wfs_direct_stop(&fs);
	wfs_ops_notifier_stop();
	wfs_mapped_stop(&fs); /* their seals, before the last commit */
	wfs_check_stop(&fs);
	wfs_commit_stop(&fs);
	wfs_catalog_rescue(fs.catalog); /* a catalog.db removed by hand while mounted: written again */
	wfs_commit_backup(&fs); /* the names as the unmount leaves them, for fsck --repair */
	wfs_log_limits_flush(); /* the lines left out that no later line told of (log.h) */
	if (ret > 0)
		wfs_log(WFS_LOG_INFO, "signal %d (%s): unmounting %s", ret, strsignal(ret), cmd.mountpoint);
	if (ret > 0 && upgrade_server)
		wfs_upgrade_unmount(cmd.mountpoint); /* libfuse did not mount it here: it would not */
	ret = ret < 0 ? 1 : 0;
out_unmount:
	fuse_session_unmount(fs.se);
out_signals:
	fuse_remove_signal_handlers(fs.se);
out_session:
	fuse_session_destroy(fs.se);
out:
	wfs_fs_release(&fs);
	fuse_loop_cfg_destroy(loop);
	wfs_catalog_close(fs.catalog);
	if (mounted)
		wfs_log(ret ? WFS_LOG_WARN : WFS_LOG_INFO, "%s: unmounted, store closed%s", cmd.mountpoint,
			ret ? " after an error" : "");
	wfs_store_close(fs.store);
	if (made && !mounted && fs.opt.store)
		wfs_store_unmake(fs.opt.store); /* refused or failed before it mounted: as it was */
	free(cmd.mountpoint);
	wfs_upgrade_inherited_free(&inherited);
	free(fs.opt.store);
	free(fs.opt.mountpoint);
	free(fs.opt.retain_text);
	free(fs.opt.readahead_text);
	free(fs.opt.spin_text);
	fuse_opt_free_args(&args);
	return ret;
}
