/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ctl — weightfsctl, the admin command line: its subcommands (one file each) and what they share:
 * options, the progress line, JSON output, the store behind a path, and --store's private mount.
 *
 * Each subcommand takes the arguments after its own name (argv[0] is the subcommand name), prints
 * what it did or one clear error line ("weightfsctl NAME: what: why"), and returns the process exit
 * status: 0 on success, 1 when the work found or hit a problem, 2 on a usage error. Output is stdout;
 * errors and the progress line are stderr. The command is one thread unless a function says so.
 */
#ifndef WFS_CTL_H
#define WFS_CTL_H

#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <time.h>

#include <jansson.h>

int wfs_ctl_init(int argc, char **argv);   /* init.c */
int wfs_ctl_stat(int argc, char **argv);   /* stat.c */
int wfs_ctl_fsck(int argc, char **argv);   /* fsck.c */
int wfs_ctl_gc(int argc, char **argv);     /* gc.c */
int wfs_ctl_stage(int argc, char **argv);  /* stage.c */
int wfs_ctl_import(int argc, char **argv); /* import.c */
int wfs_ctl_export(int argc, char **argv); /* export.c */
int wfs_ctl_cache(int argc, char **argv);  /* cache.c */
int wfs_ctl_retain(int argc, char **argv); /* retain.c */
int wfs_ctl_upgrade(int argc, char **argv); /* upgrade.c */

/* ---- options -------------------------------------------------------------------------------- */

/* What an option sets through wfs_ctl_opt.out. */
enum wfs_ctl_opt_kind {
	WFS_CTL_FLAG,   /* no argument: bool *out = true */
	WFS_CTL_STRING, /* const char **out = the argument (in argv) */
	WFS_CTL_SIZE,   /* uint64_t *out = the argument in bytes, K/M/G/T suffixes (wfs_parse_size) */
	WFS_CTL_LONG,   /* long *out = the argument, a decimal integer in [min, max] */
};

struct wfs_ctl_opt {
	const char *name; /* long name without "--"; NULL ends a table */
	char letter;      /* short option, or 0 for none */
	enum wfs_ctl_opt_kind kind;
	void *out;        /* written when the option is given, as kind says */
	long min, max;    /* WFS_CTL_LONG: the accepted range */
	/* WFS_CTL_SIZE and _LONG: what a bad argument is not, as in "--rate X: not a size (e.g.
	 * 200M)"; NULL: "--NAME: bad value 'X' (MIN..MAX)" */
	const char *bad;
};

/* Table entries: a flag, a string, a size, or an integer in [MIN, MAX]; the end of a table. */
#define WFS_CTL_OPT_FLAG(name, letter, out) {(name), (letter), WFS_CTL_FLAG, (out), 0, 0, NULL}
#define WFS_CTL_OPT_STRING(name, letter, out) {(name), (letter), WFS_CTL_STRING, (out), 0, 0, NULL}
#define WFS_CTL_OPT_SIZE(name, letter, out, bad) {(name), (letter), WFS_CTL_SIZE, (out), 0, 0, (bad)}
#define WFS_CTL_OPT_LONG(name, letter, out, min, max, bad) \
	{(name), (letter), WFS_CTL_LONG, (out), (min), (max), (bad)}
#define WFS_CTL_OPT_END {NULL, 0, WFS_CTL_FLAG, NULL, 0, 0, NULL}

/* A subcommand's options and operands. */
struct wfs_ctl_cmd {
	const char *name;               /* "fsck": messages start "weightfsctl fsck: " */
	void (*usage)(FILE *out);       /* its --help text, also printed (on stderr) on a usage error */
	const struct wfs_ctl_opt *opts; /* ends with WFS_CTL_OPT_END, at most WFS_CTL_MAX_OPTS before it;
					   NULL: none; --help and -h are always there */
	int min_operands, max_operands; /* after the options; max -1: no limit */
};

#define WFS_CTL_MAX_OPTS 16 /* asserted */
#define WFS_CTL_GO_ON (-1) /* wfs_ctl_parse(): the options are read, the subcommand goes on */

/*
 * Read the options of @argv (@argc entries, argv[0] the subcommand) by @cmd's table as getopt_long(3)
 * does (options and operands may mix, "--" ends the options), leaving the operands at
 * argv[optind..argc-1]. Returns WFS_CTL_GO_ON, or the exit status the subcommand ends with, its
 * message printed: 0 after --help (the usage on stdout), 2 after a usage error (an unknown option,
 * a bad value, too few or too many operands; the usage or one line on stderr).
 */
int wfs_ctl_parse(const struct wfs_ctl_cmd *cmd, int argc, char **argv);

/* ---- the progress line, and timing ----------------------------------------------------------- */

/* Seconds on CLOCK_MONOTONIC: differences of two are elapsed times. */
double wfs_ctl_now(void);

/*
 * One line on stderr that shows how far a long piece of work is: rewritten in place ("\r\033[K" and
 * the text) at most every WFS_CTL_PROGRESS_MS, only when stderr is a terminal, and erased by
 * wfs_ctl_progress_clear(), which the command calls before it prints anything else (a finding, an
 * error, the result). A zeroed struct shows nothing. Not thread-safe: one thread writes the line at a
 * time (stage.c hands it to its progress thread and takes it back after joining it).
 */
#define WFS_CTL_PROGRESS_MS 250

struct wfs_ctl_progress {
	bool tty;             /* shown at all: enabled, and stderr is a terminal */
	bool shown;           /* a line is on the terminal */
	struct timespec last; /* CLOCK_MONOTONIC time of the last line */
};

/* Start with no line; @enabled false (e.g. --json) keeps it from ever showing. */
void wfs_ctl_progress_init(struct wfs_ctl_progress *p, bool enabled);
/*
 * Rewrite the line with printf(3)'s @fmt and arguments (one line, no newline), unless the last one
 * is younger than WFS_CTL_PROGRESS_MS and @force is false (force the first and last states).
 */
__attribute__((format(printf, 3, 4))) void wfs_ctl_progress_show(struct wfs_ctl_progress *p, bool force,
								  const char *fmt, ...);
/* Erase the line, if one is shown. */
void wfs_ctl_progress_clear(struct wfs_ctl_progress *p);

/* ---- JSON output ---------------------------------------------------------------------------- */

/*
 * A JSON string of @text (a path, a message): its bytes as they are when they are UTF-8, each byte
 * that is not replaced by U+FFFD. NULL @text gives NULL (json_pack's "o?" makes that null). Returns a
 * new reference, or NULL when out of memory.
 */
json_t *wfs_ctl_json_string(const char *text);
/* A JSON real of @v rounded to @decimals places, the number printf's "%.*f" shows (new reference). */
json_t *wfs_ctl_json_fixed(double v, int decimals);
/*
 * Print @v (consumed; NULL when building it failed) on stdout as one line, by json_dumpf(3) with
 * @flags (0: ", " and ": " between items, as every --json prints; JSON_COMPACT: none). Reals print
 * with up to 15 significant digits, so a wfs_ctl_json_fixed() value prints as its places show it.
 * Returns the exit status: 0, or 1 with one line on stderr when @v is NULL (as with printf(3), a
 * failed write to stdout is not seen here).
 */
int wfs_ctl_json_print(json_t *v, size_t flags);

/* ---- the store behind a path ---------------------------------------------------------------- */

/*
 * The store directory for @path: @path itself when it holds a catalog (or only its backup, as after
 * losing catalog.db: wfs_ctl_catalog_error() tells), or the store behind the
 * weightfs mount at @path (the daemon mounts with fsname=STORE). Writes an absolute path into @out
 * (PATH_MAX bytes). When the store is mounted, its daemon is first asked (fsync of the mount point)
 * to commit its batch of changes, so that catalog.db shows all of them. Returns 0, -EMEDIUMTYPE
 * (@path exists but is neither), -EACCES (a store this user may not read: mode 0700),
 * WFS_MOUNTS_EHIDDEN (@path is a mount point, or the path its daemon has of its store, and the store
 * that daemon serves is not the directory that path names here: another mount namespace, as a
 * container given the mount only; @out still gets the daemon's path of the store, for its stats),
 * or -errno from realpath (-ENOENT: no such path) or reading the mount table (lib/mounts.h).
 */
int wfs_ctl_resolve_store(const char *path, char *out);
/*
 * What to print for wfs_ctl_resolve_store()'s error @err (-errno), or for that of a lib/ call given
 * the store it found: "not a weightfs store ..." for -EMEDIUMTYPE, "Permission denied: the store
 * belongs to another user (run as root or as the store's owner)" for -EACCES, for WFS_MOUNTS_EHIDDEN
 * that the store is not visible here and what to do (wfs_mounts_hidden_message()), strerror otherwise.
 * A static string.
 */
const char *wfs_ctl_store_error(int err);
/*
 * What is wrong with the catalog of store @store, after a command that reads it failed with @err
 * (-errno): "catalog.db is missing" or "the catalog is damaged (SQLite: ...)", each with what to
 * run (fsck --repair restores or rebuilds it from catalog.db.backup, or fsck says what to do), written
 * into @out (@out_bytes bytes). Returns @out, or NULL when the catalog is there and intact (the error
 * is another: print wfs_ctl_store_error()), and for WFS_MOUNTS_EHIDDEN (the store is elsewhere). Reads the catalog read-only (wfs_catalog_diagnose) only after -EIO.
 */
const char *wfs_ctl_catalog_error(const char *store, int err, char *out, size_t out_bytes);
/*
 * Who holds the store at @store, for a message after wfs_store_open() (or a lib/ call that opens it)
 * returned -EBUSY: "weightfs (pid N, mounted on MNT)" as its owner recorded it (wfs_store_owner()),
 * "weightfs (pid N)" when it recorded no line, "another process" when it recorded nothing. Written
 * into @out (@out_bytes bytes, NUL-terminated); returns @out.
 */
const char *wfs_ctl_store_owner(const char *store, char *out, size_t out_bytes);
/*
 * The running daemon's user.weightfs.stats (JSON, fs/xattr.c) read from mount point @mnt; NULL when
 * no daemon answers there. The caller json_decref()s it.
 */
json_t *wfs_ctl_mount_stats(const char *mnt);

/* ---- --store: a store's namespace, mounted for the command if need be (import, export) -------- */

/*
 * The namespace of a store given with --store: through the mount of a daemon that serves it, or, for
 * a store that is not mounted, a private mount made for the command: the weightfs daemon next to this
 * binary runs in the foreground on a temporary mount point, unmounted at the end. Going through the
 * daemon, rather than lib/store and lib/catalog directly, keeps one implementation of sealing, dedup,
 * xattr validation and durability, and the daemon's lock on the store keeps the command from racing
 * another writer. Paths under a private mount are shown as STORE:path (wfs_ctl_display).
 */
struct wfs_ctl_target {
	char root[PATH_MAX];   /* where the store's namespace starts */
	char tmpdir[PATH_MAX]; /* a private mount: holds mnt/ and weightfs.log; "" otherwise */
	pid_t daemon;          /* a private mount's daemon while it runs, or 0 */
};

/*
 * Set by SIGINT, SIGTERM or SIGHUP once wfs_ctl_catch_signals() has run; the library's stop flag:
 * the copy stops at its next chunk, so that temporary files and a private mount are cleaned up.
 */
extern volatile sig_atomic_t wfs_ctl_interrupted;
void wfs_ctl_catch_signals(void);

/*
 * Make store @arg's namespace reachable at t->root (all of @t is written): the mount of a live
 * daemon, or a private one. @cmd names the command in messages. Returns 0, or 1 with the error
 * printed; either way wfs_ctl_target_close(@t) undoes what was done.
 */
int wfs_ctl_target_open(const char *cmd, const char *arg, struct wfs_ctl_target *t);
/*
 * Undo wfs_ctl_target_open(): unmount a private mount, wait for its daemon and remove the temporary
 * directory (kept, with the daemon's log, when the daemon failed). A zeroed @t is fine. Returns 0,
 * or 1 with the error printed.
 */
int wfs_ctl_target_close(const char *cmd, struct wfs_ctl_target *t);
/*
 * The directory that @dir names, into @out (PATH_MAX bytes): @dir itself when @t is NULL (no --store),
 * or @dir below t->root ("/" and "." being the store's root). Returns 0, -EINVAL (a ".." component
 * would leave the store) or -ENAMETOOLONG.
 */
int wfs_ctl_target_dir(const struct wfs_ctl_target *t, const char *dir, char *out);
/*
 * @path as messages show it: "STORE:path/in/store" below a private mount, else @path itself. The
 * result is @path or one of two static buffers used in turn (two paths fit in one message).
 */
const char *wfs_ctl_display(const char *path);

/* ---- import and export: the library's callbacks (lib/st_import.h, lib/st_export.h) ------------ */

struct wfs_tf_progress;

struct wfs_ctl_tf_ui {
	const char *verb;                 /* "import": the line's label, the messages' subcommand */
	struct wfs_ctl_progress progress; /* wfs_ctl_progress_init() it */
};

/* The progress callback (@ctx: a struct wfs_ctl_tf_ui): a bar, tensors and MiB done. */
void wfs_ctl_tf_progress(void *ctx, const struct wfs_tf_progress *p);
/* The error callback: the line erased, then "weightfsctl VERB: PATH: message" (PATH displayed). */
void wfs_ctl_tf_error(void *ctx, const char *path, const char *message);

#endif
