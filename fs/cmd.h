/*
 * Subcommands of weightfsctl, the admin command line. Each takes the arguments after its own name
 * (argv[0] is the subcommand name), prints what it did or one clear error line, and returns the
 * process exit status: 0 on success, 1 when the work found or hit a problem, 2 on a usage error.
 */
#ifndef WFS_CMD_H
#define WFS_CMD_H

#include <stdint.h>

int wfs_cmd_init(int argc, char **argv);
int wfs_cmd_stat(int argc, char **argv);
int wfs_cmd_stage(int argc, char **argv);
int wfs_cmd_fsck(int argc, char **argv);
int wfs_cmd_gc(int argc, char **argv);
int wfs_cmd_import(int argc, char **argv); /* cmd_safetensors.c */
int wfs_cmd_export(int argc, char **argv); /* cmd_safetensors.c */
int wfs_cmd_cache(int argc, char **argv);  /* cmd_cache.c */

struct wfs_catalog_stats;
struct json_t;
/*
 * weightfsctl stat --prometheus (cmd_cache.c): store @store's catalog totals @st, the disk usage of
 * its objects (@disk_bytes; WFS_CACHE_UNKNOWN: not measurable by this user, left out), the page cache
 * of its object files (read here; left out when this user cannot measure it, never reported as 0)
 * and the daemon's JSON @daemon (NULL: none serves it) in the Prometheus text format on stdout.
 * Returns the exit status.
 */
int wfs_cmd_stat_prometheus(const char *store, const struct wfs_catalog_stats *st, uint64_t disk_bytes,
			    const struct json_t *daemon);

/*
 * The store directory for @path: @path itself when it holds a catalog, or the store behind the
 * fuse.weightfs mount at @path (the daemon mounts with fsname=STORE). Writes an absolute path into
 * @out (PATH_MAX bytes). Returns 0, -EMEDIUMTYPE (@path exists but is neither), or -errno from
 * realpath (-ENOENT: no such path) or reading /proc/self/mounts.
 */
int wfs_cmd_resolve_store(const char *path, char *out);
/* What to print for wfs_cmd_resolve_store()'s error @err: "not a weightfs store ..." or strerror. */
const char *wfs_cmd_store_error(int err);
/*
 * The mount point (PATH_MAX bytes at @out) where a running daemon serves store @store (an absolute,
 * resolved path as wfs_cmd_resolve_store() gives): a fuse.weightfs mount of it whose statfs(2)
 * answers (a dead daemon's gives ENOTCONN; a hung daemon blocks this call). Returns 0, -ENOENT when
 * no live daemon has it mounted, or -errno reading /proc/self/mounts.
 */
int wfs_cmd_mount_of(const char *store, char *out);

#endif
