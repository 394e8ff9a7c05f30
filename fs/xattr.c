/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The user.weightfs.* extended attributes (names in lib/weightfs.h) and stored user.* ones: user.*
 * lives in the catalog; user.weightfs.digest is computed and read-only; user.weightfs.stats (mount
 * root) is the daemon's JSON; user.weightfs.claim seals a file by digest, user.weightfs.claims (on a
 * directory) makes many such files at once, and
 * user.weightfs.recheck (mount root) checks an object again; user.weightfs.dtype and .shape are
 * validated against the file's size (seal.h). security.*, system.* and trusted.* are not supported
 * (EOPNOTSUPP); "user." alone is EINVAL.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "check.h"
#include "claim.h"
#include "direct.h"
#include "dtype.h"
#include "fault.h"
#include "gc.h"
#include "clock.h"
#include "log.h"
#include "object.h"
#include "openmode.h"
#include "ops.h"
#include "receive.h"
#include "takeover.h"
#include "seal.h"
#include "weightfs.h"

/* 0 for a user.* name, -EINVAL for "user." alone (as ext4 answers: the VFS refuses an empty name
 * after a handler's prefix, but hands FUSE the whole name), -EOPNOTSUPP for any other namespace. */
static int user_xattr(const char *name)
{
	if (strncmp(name, "user.", 5) != 0)
		return -EOPNOTSUPP;
	return name[5] ? 0 : -EINVAL;
}

static void reply_xattr(fuse_req_t req, int ret, size_t size, const void *value, size_t len)
{
	if (ret)
		fuse_reply_err(req, -ret);
	else if (size == 0)
		fuse_reply_xattr(req, len);
	else if (len > size)
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, value, len);
}

/*
 * user.weightfs.stats: one JSON object with the catalog's totals (what `weightfsctl stat` shows) and
 * what only the running daemon knows: objects checked this run, passthrough, counters since mount.
 * fs->lock held. *@text is malloc'ed (the caller frees it), *@len its bytes without a NUL.
 */
static int stats_json(struct wfs_fs *fs, char **text, size_t *len)
{
	struct wfs_catalog_stats st;
	struct wfs_counters *k = fs->counters;
	uint64_t verified, unverified, qfiles, qbytes;
	const struct wfs_lock *l = &fs->lock;
	struct wfs_catalog_timing ct;
	char site[160];
	json_t *o, *requests, *request_ms;
	char *dump;
	int ret;

	wfs_catalog_timing(fs->catalog, &ct);
	snprintf(site, sizeof(site), "%s:%d to %s:%d", l->max_site ? l->max_site : "", l->max_line,
		 l->max_end_site ? l->max_end_site : "", l->max_end_line);
	/* The totals scan every name (15 ms for 20,000 on the 2-core machine): lent meanwhile, so that
	 * a monitoring scrape does not stall the opens of sealed files. */
	wfs_fs_lend(fs);
	ret = wfs_catalog_stats(fs->catalog, &st);
	wfs_fs_reclaim(fs);
	if (ret == 0)
		ret = wfs_check_count(fs, &verified, &unverified);
	if (ret == 0) /* damaged copies on disk, healed or not: stat shows them to the mount's users */
		ret = wfs_store_quarantine_clear(fs->store, true, &qfiles, &qbytes);
	if (ret)
		return ret;
	wfs_ops_requests_json(&requests, &request_ms); /* NULL (ENOMEM) fails the pack below */
#define U64(v) json_integer((json_int_t)(v))
	o = json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:f, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:b, s:b, s:s, "
		      "s:{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, "
		      "s:o, s:o, s:o, s:o, s:o}, s:{s:o, s:f, s:f, s:s, s:o, s:f, s:o, s:f, s:o}, s:{s:o, s:f, s:f, s:o, s:f, s:f, s:o, s:f}}",
		      "names", U64(st.names), "directories", U64(st.directories), "symlinks", U64(st.symlinks),
		      "logical_bytes", U64(st.logical_bytes), "objects", U64(st.objects),
		      "physical_bytes", U64(st.object_bytes),
		      "dedup_ratio", st.object_bytes ? (double)st.logical_bytes / (double)st.object_bytes : 1.0,
		      "retained_objects", U64(st.unreferenced_objects), "retained_bytes", U64(st.unreferenced_bytes),
		      "objects_verified", U64(verified), "objects_unverified", U64(unverified),
		      "objects_quarantined", U64(st.quarantined_objects), "quarantine_files", U64(qfiles),
		      "quarantine_bytes", U64(qbytes), "unsealed_files", U64(st.unsealed_files),
		      "special_files", U64(st.special_files), "passthrough", (int)atomic_load(&fs->passthrough),
		      "direct", (int)wfs_direct_served(fs), "verify", fs->opt.verify ? "open" : "none",
		      "since_mount", "seals", U64(k->seals), "objects_published", U64(k->objects_published),
		      "bytes_published", U64(k->bytes_published), "dedup_hits", U64(k->dedup_hits),
		      "claims", U64(k->claims), "claim_misses", U64(k->claim_misses),
		      "opens_passthrough", U64(k->opens_passthrough), "opens_daemon", U64(k->opens_daemon),
		      "opens_direct", U64(k->opens_direct), "opens_lent", U64(k->opens_lent), "moved_from_readers", U64(k->moved_from_readers),
		      "opens_passthrough_write", U64(k->opens_passthrough_write),
		      "published_copies", U64(k->published_copies),
		      "seals_synced", U64(k->seals_synced), "group_syncs", U64(k->group_syncs),
		      "group_syncs_by_file", U64(k->group_syncs_by_file),
		      "seals_awaiting_sync", U64(wfs_commit_waiting(&fs->commit)),
		      "checks_on_opener_node", U64(atomic_load(&k->checks_placed)),
		      "seals_declared", U64(k->seals_declared), "checks_after_seal", U64(k->checks_after_seal),
		      "verify_failures", U64(k->verify_failures), "requests", requests,
		      "request_ms", request_ms,
		      "lock", "holds", U64(l->holds), "held_ms", (double)l->held_ns / 1e6,
		      "held_max_ms", (double)l->held_max_ns / 1e6, "held_max_at", site,
		      "holds_slow", U64(l->slow), "holds_slow_ms", (double)l->slow_ns / 1e6, "lends", U64(l->lends),
		      "lent_max_ms", (double)l->lent_max_ns / 1e6, "light_holds", U64(l->light_holds),
		      "commits", "commits", U64(ct.commits), "commit_max_ms", (double)ct.commit_max_ns / 1e6,
		      "commit_ms", (double)ct.commit_ns / 1e6, "headroom_refills", U64(ct.refills),
		      "refill_max_ms", (double)ct.refill_max_ns / 1e6, "refill_ms", (double)ct.refill_ns / 1e6,
		      "reserve_fills", U64(ct.reserve_fills), "reserve_max_ms", (double)ct.reserve_max_ns / 1e6);
	if (o) {
		struct wfs_receive_stats rs;

		json_object_set_new(json_object_get(o, "commits"), "checkpoints", U64(fs->commit.checkpoints));

		struct wfs_takeover_info ti;

		wfs_takeover_info(&ti);
		struct stat sd;

		/* The store's identity: a client that reaches the mount from another mount namespace
		 * tells by it whether the store's path names the same directory there (lib/mounts.h). */
		if (wfs_store_stat(fs->store, &sd) == 0) {
			json_object_set_new(o, "store_dev", U64(sd.st_dev));
			json_object_set_new(o, "store_ino", U64(sd.st_ino));
		}
		json_object_set_new(o, "server_pid", json_integer(ti.server_pid));
		json_object_set_new(o, "server_version", json_string(WFS_VERSION));
		json_object_set_new(o, "holder_pid", json_integer(ti.holder_pid));
		if (ti.holder_lost_pid)
			json_object_set_new(o, "holder_lost_pid", json_integer(ti.holder_lost_pid));
		json_object_set_new(o, "takeovers", U64(ti.takeovers));
		json_object_set_new(o, "upgrades", U64(ti.upgrades));
		json_object_set_new(o, "takeover",
				    json_pack("{s:i, s:f, s:f, s:o}", "epoch", (int)ti.epoch, "last_pause_ms",
					      ti.last_pause_ms, "worst_pause_ms", ti.worst_pause_ms,
					      "backing_inherited", U64(ti.backing_inherited)));
		wfs_receive_stats(&rs);
		json_object_set_new(o, "receive",
				    json_pack("{s:b, s:i, s:o, s:o, s:o, s:o}", "installed", rs.installed,
					      "spin_us", (int)rs.spin_us, "taken_spinning", U64(rs.taken_spinning),
					      "taken_sleeping", U64(rs.taken_sleeping), "handovers", U64(rs.handovers),
					      "takeovers", U64(rs.takeovers)));
	}
#undef U64
	/* Three decimals are what a ratio needs; JSON_REAL_PRECISION counts significant digits. */
	dump = o ? json_dumps(o, JSON_REAL_PRECISION(6)) : NULL;
	json_decref(o);
	if (!dump)
		return -ENOMEM;
	*len = strlen(dump) + 1;
	*text = realloc(dump, *len + 1);
	if (!*text) {
		free(dump);
		return -ENOMEM;
	}
	(*text)[*len - 1] = '\n'; /* a line, for getfattr and shell readers */
	(*text)[*len] = '\0';
	return 0;
}

/*
 * The stats for a getxattr of @size bytes (0: the size only) by thread @tid into @buf, their length
 * into *@len. getfattr and most callers ask twice, for the size and then for the value: the text
 * given for the first is kept and handed to the same thread's next ask (within WFS_STATS_KEPT_NS,
 * when it fits; anyone else's gets a fresh one), so the totals are computed once (a scan of every name: 15 ms for 20,000 on the 2-core machine) and the
 * value has the length the caller was told, not one a counter has grown since (ERANGE). Under
 * fs->lock.
 */
#define WFS_STATS_KEPT_NS 2000000000ull
static struct {
	char *text;
	size_t len;
	uint64_t at_ns;
	pid_t tid;
} stats_kept; /* (L) */

static int stats_text(struct wfs_fs *fs, pid_t tid, size_t size, char *buf, size_t *len)
{
	uint64_t now_ns = wfs_clock_ns();
	char *text = NULL;
	int ret;

	if (size && stats_kept.text && stats_kept.tid == tid && now_ns - stats_kept.at_ns < WFS_STATS_KEPT_NS &&
	    stats_kept.len <= size) {
		*len = stats_kept.len;
		memcpy(buf, stats_kept.text, *len);
		free(stats_kept.text);
		stats_kept.text = NULL;
		return 0;
	}
	ret = stats_json(fs, &text, len);
	if (ret)
		return ret;
	free(stats_kept.text);
	stats_kept.text = NULL;
	if (size == 0) {
		stats_kept.text = text;
		stats_kept.len = *len;
		stats_kept.at_ns = now_ns;
		stats_kept.tid = tid;
		return 0;
	}
	if (size >= *len)
		memcpy(buf, text, *len);
	free(text);
	return 0;
}

/* (L) What the last user.weightfs.gc request removed and kept, for the getxattr that follows it. */
static struct wfs_gc_report gc_last;
static bool gc_done;

/*
 * getxattr(MOUNT, "user.weightfs.gc"): the last request's report, JSON ({"objects_removed",
 * "bytes_removed", "objects_kept", "bytes_kept"}); -ENODATA before the first. fs->lock held.
 */
static int gc_report(char *buf, size_t size, size_t *len)
{
	char text[256];
	int n;

	if (!gc_done)
		return -ENODATA;
	n = snprintf(text, sizeof(text),
		     "{\"objects_removed\": %llu, \"bytes_removed\": %llu, \"objects_kept\": %llu, "
		     "\"bytes_kept\": %llu}", (unsigned long long)gc_last.objects_removed,
		     (unsigned long long)gc_last.bytes_removed, (unsigned long long)gc_last.objects_kept,
		     (unsigned long long)gc_last.bytes_kept);
	*len = (size_t)n;
	if (size >= *len)
		memcpy(buf, text, *len);
	return 0;
}

/*
 * setxattr(MOUNT, "user.weightfs.gc", SIZE): weightfsctl gc on a mounted store. Removes the objects
 * no name uses beyond SIZE bytes (wfs_parse_size(); a trailing newline allowed), least recently
 * released first, skipping those in use (object.h, wfs_object_collect()). Only the mounting user or
 * root. Returns 0, -EPERM, -EINVAL, or -errno of the removal.
 */
static int gc_request(struct wfs_fs *fs, fuse_req_t req, const char *value, size_t size)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct wfs_gc_report r;
	uint64_t retain;
	char text[32];
	int ret;

	if (ctx->uid != 0 && ctx->uid != getuid())
		return -EPERM;
	if (size > 0 && value[size - 1] == '\n')
		size--;
	if (size == 0 || size >= sizeof(text))
		return -EINVAL;
	memcpy(text, value, size);
	text[size] = '\0';
	if (wfs_parse_size(text, &retain))
		return -EINVAL;
	wfs_lock(&fs->lock);
	ret = wfs_object_collect(fs, retain, &r);
	if (ret == 0) {
		gc_last = r;
		gc_done = true;
	}
	wfs_unlock(&fs->lock);
	return ret;
}

void wfs_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	WFS_OPS_COUNT(GETXATTR);
	struct wfs_fs *fs = wfs_ops_fs(req);
	char *buf = NULL;
	size_t len = 0;
	struct wfs_attr a;
	int ret;

	ret = user_xattr(name);
	if (ret) {
		/* security.*, system.* (POSIX ACLs), trusted.*: not supported, as setxattr says too.
		 * EOPNOTSUPP rather than ENODATA: ls -l asks each file for security.selinux and
		 * system.posix_acl_access unless a file of the device answered "not supported" (two
		 * requests per file, the whole cost of a warm ls -l), and the kernel caches neither. */
		fuse_reply_err(req, -ret);
		return;
	}
	if (size && !(buf = malloc(size))) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	if (ino == FUSE_ROOT_ID && strcmp(name, WFS_XATTR_STATS) == 0)
		wfs_delay("stats"); /* test-only: a request slow in its handler, fs->lock not held (receive.h) */
	wfs_lock(&fs->lock);
	if (ino == FUSE_ROOT_ID && strcmp(name, WFS_XATTR_STATS) == 0) {
		ret = stats_text(fs, fuse_req_ctx(req)->pid, size, buf, &len);
	} else if (ino == FUSE_ROOT_ID && strcmp(name, WFS_XATTR_GC) == 0) {
		ret = gc_report(buf, size, &len);
	} else if (strcmp(name, WFS_XATTR_DIRECT) == 0) {
		ret = wfs_direct_xattr(fs, buf, size, &len); /* any file: where to ask for its object */
	} else if (strcmp(name, WFS_XATTR_DIGEST) == 0) {
		char hex[WFS_DIGEST_HEX_CHARS + 1];

		wfs_openmode_wait_release(fs, ino);
		ret = wfs_catalog_getattr(fs->catalog, ino, &a);
		if (ret == 0 && !a.sealed)
			ret = -ENODATA;
		if (ret == 0 && wfs_check_damaged(fs, &a.digest))
			ret = -EIO; /* as its reads: the content is not there (writing it again heals) */
		if (ret == 0) {
			wfs_digest_to_hex(&a.digest, hex);
			len = WFS_DIGEST_HEX_CHARS;
			if (size >= len)
				memcpy(buf, hex, len);
		}
	} else {
		ret = wfs_catalog_xattr_get(fs->catalog, ino, name, buf, size, &len);
	}
	wfs_unlock(&fs->lock);
	reply_xattr(req, ret, size, buf, len);
	free(buf);
}

/*
 * A digest given as an attribute value by the mounting user (or root): 32 hex digits, a trailing
 * newline allowed. Returns 0, -EPERM (another user) or -EINVAL.
 */
static int digest_request(fuse_req_t req, const char *value, size_t size, struct wfs_digest *d)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	char hex[WFS_DIGEST_HEX_CHARS + 1];

	if (ctx->uid != 0 && ctx->uid != getuid())
		return -EPERM;
	if (size > 0 && value[size - 1] == '\n')
		size--;
	if (size != WFS_DIGEST_HEX_CHARS)
		return -EINVAL;
	memcpy(hex, value, size);
	hex[size] = '\0';
	return wfs_digest_from_hex(hex, d) ? -EINVAL : 0;
}

/*
 * setxattr(FILE, "user.weightfs.claim", "<32 hex digits>"): the caller knows the digest of the bytes
 * it would write. Sealing needs an empty regular file and an intact stored object; see
 * wfs_claim() for the errors. Only the mounting user (or root) may claim: with allow_other,
 * naming a digest would otherwise read any object in the store without permission to any of its
 * names. A trailing newline (`setfattr -v "$(xxhsum -H2 ...)"`, echo) is accepted.
 */
static int claim(struct wfs_fs *fs, fuse_req_t req, fuse_ino_t ino, const char *value, size_t size)
{
	struct wfs_digest d;
	int ret;

	ret = digest_request(req, value, size, &d);
	if (ret)
		return ret;
	wfs_lock(&fs->lock);
	ret = wfs_claim(fs, ino, &d);
	wfs_unlock(&fs->lock);
	return ret;
}

/* One line of a batch claim (claim_batch()), its strings in the parsed copy of the value. */
struct claim_line {
	struct wfs_digest d;
	const char *dtype, *shape, *name; /* dtype and shape "" when not given */
};

/*
 * Split a batch claim's value (@size bytes, not NUL-terminated) into lines: copied into *@buf (the
 * caller frees it) and *@lines (too). Returns the line count, or -EINVAL (a malformed line: too few
 * fields, a bad digest, a name that is empty, ".", "..", has '/' or is longer than NAME_MAX), -ENOMEM.
 */
static ssize_t parse_claims(const char *value, size_t size, char **buf, struct claim_line **lines)
{
	size_t n = 0, cap = 0;
	char *p, *end;
	const char *nul = memchr(value, '\0', size);

	*lines = NULL;
	*buf = NULL;
	if (nul) { /* a NUL would cut a name, and the lines after it, short */
		WFS_LOG_LIMITED(WFS_LOG_WARN, "claims: a NUL byte at offset %zu: request refused (EINVAL)",
				(size_t)(nul - value));
		return -EINVAL;
	}
	*buf = malloc(size + 1);
	if (!*buf)
		return -ENOMEM;
	memcpy(*buf, value, size);
	(*buf)[size] = '\0';
	for (p = *buf; *p; p = end) {
		char *f[4];
		int i;

		end = strchr(p, '\n');
		end = end ? (*end = '\0', end + 1) : p + strlen(p);
		for (i = 0, f[0] = p; i < 3; i++) { /* the name is the rest: it may hold tabs */
			char *t = strchr(f[i], '\t');

			if (!t) {
				WFS_LOG_LIMITED(WFS_LOG_WARN, "claims: line %zu has %d of its 4 tab-separated fields "
						"(digest, dtype, shape, name): request refused (EINVAL)", n + 1, i + 1);
				return -EINVAL;
			}
			*t = '\0';
			f[i + 1] = t + 1;
		}
		if (n == cap) {
			struct claim_line *more = realloc(*lines, (cap = cap ? 2 * cap : 64) * sizeof(**lines));

			if (!more)
				return -ENOMEM;
			*lines = more;
		}
		if (strlen(f[0]) != WFS_DIGEST_HEX_CHARS || wfs_digest_from_hex(f[0], &(*lines)[n].d)) {
			WFS_LOG_LIMITED(WFS_LOG_WARN, "claims: line %zu: digest \"%.40s\" is not 32 hex digits: "
					"request refused (EINVAL)", n + 1, f[0]);
			return -EINVAL;
		}
		if (!*f[3] || strcmp(f[3], ".") == 0 || strcmp(f[3], "..") == 0 || strchr(f[3], '/') ||
		    strlen(f[3]) > NAME_MAX) {
			WFS_LOG_LIMITED(WFS_LOG_WARN, "claims: line %zu: \"%.64s\" is not a file name (empty, "
					"\".\", \"..\", a '/', or over %d bytes): request refused (EINVAL)", n + 1, f[3],
					NAME_MAX);
			return -EINVAL;
		}
		(*lines)[n].dtype = f[1];
		(*lines)[n].shape = f[2];
		(*lines)[n].name = f[3];
		n++;
	}
	return (ssize_t)n;
}

/*
 * Do line @l's dtype and shape (those given) parse, and with both given, make @size bytes? A line
 * that does not is passed over with one log line naming it (the seal's own checks would name an
 * inode that is then removed).
 */
static bool claim_line_fits(const struct claim_line *l, uint64_t dir, uint64_t size)
{
	size_t dl = strlen(l->dtype), sl = strlen(l->shape);
	uint64_t elements, bytes;

	if ((dl && wfs_dtype_size(l->dtype, dl) < 0) || (sl && wfs_shape_elements(l->shape, sl, &elements))) {
		WFS_LOG_LIMITED(WFS_LOG_WARN, "claims in directory inode %llu: %s: dtype \"%s\" shape \"%s\" not "
				"valid: passed over", (unsigned long long)dir, l->name, l->dtype, l->shape);
		return false;
	}
	if (dl && sl && (wfs_tensor_bytes(l->dtype, dl, l->shape, sl, &bytes) || bytes != size)) {
		WFS_LOG_LIMITED(WFS_LOG_WARN, "claims in directory inode %llu: %s: shape %s x %s is not the object's "
				"%llu bytes: passed over", (unsigned long long)dir, l->name, l->shape, l->dtype,
				(unsigned long long)size);
		return false;
	}
	return true;
}

/*
 * setxattr(DIR, "user.weightfs.claims", LINES): many digest claims in one request, for a restart
 * that writes the same weights under new names. Each line is "DIGEST\tDTYPE\tSHAPE\tNAME" (lines
 * end with '\n'; DTYPE and SHAPE may be empty; NAME is the rest of the line). For each line whose
 * NAME does not exist in DIR and whose object is stored and plausibly intact, a regular file NAME
 * (mode 0644, owned as a create by the caller would make it) is made, given DTYPE and SHAPE as
 * user.weightfs.dtype and .shape, and sealed as that object, as a create, setxattr and claim would.
 * Lines whose name exists, whose object is missing or damaged, or whose DTYPE or SHAPE does not
 * parse or (both given) does not fit the object's size are passed over (the last two logged): the
 * caller reads DIR to learn which names it got. The names
 * made are returned in *@made (the caller frees each and the array; *@nmade of them) for the
 * kernel's dentries to be dropped after the reply. fs->lock is taken per line, not for the batch.
 * The kernel has checked write permission on DIR
 * (and that a sticky DIR is the caller's); as for user.weightfs.claim, only the mounting user or
 * root may claim. Returns 0, -EINVAL (a malformed value: a line without its four fields, a bad
 * digest or name, a NUL byte anywhere; nothing made), -ENOTDIR, -EPERM, -ENOMEM,
 * or the -errno that stopped the batch part way (-ENOSPC, the catalog's; lines before it stay made).
 */
static int claim_batch(struct wfs_fs *fs, fuse_req_t req, fuse_ino_t dir, const char *value, size_t size,
		       char ***made, size_t *nmade)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct claim_line *lines = NULL;
	uint32_t mode = S_IFREG | 0644, uid, gid;
	struct wfs_attr a;
	char *buf = NULL;
	ssize_t n;
	int ret = 0;

	*made = NULL;
	*nmade = 0;
	if (ctx->uid != 0 && ctx->uid != getuid())
		return -EPERM;
	n = parse_claims(value, size, &buf, &lines);
	if (n > 0 && !(*made = calloc((size_t)n, sizeof(**made))))
		n = -ENOMEM;
	wfs_lock(&fs->lock);
	if (n >= 0 && (ret = wfs_catalog_getattr(fs->catalog, dir, &a)) == 0 && !S_ISDIR(a.mode))
		ret = -ENOTDIR;
	if (n > 0 && ret == 0)
		wfs_ops_new_owner(fs, req, dir, &mode, &uid, &gid);
	for (ssize_t i = 0; n > 0 && ret == 0 && i < n; i++) {
		const struct claim_line *l = &lines[i];
		struct wfs_catalog_xattr x[2];
		size_t nx = 0;
		struct stat st;
		char *copy;

		if (wfs_store_object_stat(fs->store, &l->d, &st) != 0) {
			fs->counters->claim_misses++; /* absent: nothing to make, nothing held up */
			continue;
		}
		if (!claim_line_fits(l, dir, (uint64_t)st.st_size))
			continue;
		if (*l->dtype)
			x[nx++] = (struct wfs_catalog_xattr){WFS_XATTR_DTYPE, l->dtype, strlen(l->dtype)};
		if (*l->shape)
			x[nx++] = (struct wfs_catalog_xattr){WFS_XATTR_SHAPE, l->shape, strlen(l->shape)};
		if (!(copy = strdup(l->name))) {
			ret = -ENOMEM;
			break;
		}
		/* One catalog call per line: create, attributes and seal (~15 statements fewer). */
		ret = wfs_claim_new(fs, dir, l->name, mode, uid, gid, &l->d, &st, x, nx, &a);
		if (ret == 0)
			(*made)[(*nmade)++] = copy;
		else
			free(copy);
		if (ret == -EEXIST || ret == -ENODATA)
			ret = 0; /* the name exists, or the object is damaged: this line only */
		/* Other requests wait for one line (~0.05 ms), not for the whole batch. */
		wfs_unlock(&fs->lock);
		wfs_lock(&fs->lock);
	}
	wfs_unlock(&fs->lock);
	free(lines);
	free(buf);
	return n < 0 ? (int)n : ret;
}

/*
 * setxattr of the computed user.weightfs.digest. On a file being written, from the mounting user or
 * root, it is its writer's word for the digest of the bytes it writes (wfs_seal_declare(): a tensor
 * written through passthrough is then sealed without a second pass over its bytes): 1 (taken). On a sealed file: a copy made by
 * an older weightfs (which listed it) carries it as a plain attribute, and tar or rsync set it
 * back; the same value as the file's own digest changes nothing: 1 (succeed, store nothing). Any
 * other value: -EPERM (the digest is computed). A declaration by another user: -EPERM; one that
 * is not 32 hex digits: -EINVAL. fs->lock not held.
 */
static int digest_set(struct wfs_fs *fs, fuse_req_t req, fuse_ino_t ino, const char *value, size_t size)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	char hex[WFS_DIGEST_HEX_CHARS + 1];
	struct wfs_digest d;
	struct wfs_attr a;
	bool hex_ok;
	int ret;

	if (size > 0 && value[size - 1] == '\n')
		size--;
	hex_ok = size == WFS_DIGEST_HEX_CHARS;
	if (hex_ok) {
		memcpy(hex, value, size);
		hex[size] = '\0';
		hex_ok = wfs_digest_from_hex(hex, &d) == 0;
	}
	wfs_lock(&fs->lock);
	/* Being written: the writer declares the digest its bytes will have (seal.h). Only the
	 * mounting user (or root), as for claims: a name sealed on a wrong declaration reads the
	 * declared content once it is stored, so a declaration is a claim of what comes later. */
	if (wfs_seal_writing(fs, ino)) {
		if (ctx->uid != 0 && ctx->uid != getuid())
			ret = -EPERM;
		else if (!hex_ok)
			ret = -EINVAL;
		else
			ret = wfs_seal_declare(fs, ino, &d);
		if (ret != 0) { /* 0: its seal began meanwhile; answered as for a sealed file */
			wfs_unlock(&fs->lock);
			return ret;
		}
	}
	if (!hex_ok) {
		wfs_unlock(&fs->lock);
		return -EPERM;
	}
	wfs_openmode_wait_release(fs, ino);
	ret = wfs_catalog_getattr(fs->catalog, ino, &a);
	wfs_unlock(&fs->lock);
	if (ret || !a.sealed)
		return -EPERM;
	wfs_digest_to_hex(&a.digest, hex);
	return strncasecmp(hex, value, size) == 0 ? 1 : -EPERM;
}

void wfs_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value, size_t size,
			 int flags)
{
	WFS_OPS_COUNT(SETXATTR);
	struct wfs_fs *fs = wfs_ops_fs(req);
	int ret = user_xattr(name);

	if (ret == 0 && strcmp(name, WFS_XATTR_DIGEST) == 0)
		ret = digest_set(fs, req, ino, value, size);
	else if (ret == 0 && (strcmp(name, WFS_XATTR_STATS) == 0 || strcmp(name, WFS_XATTR_DIRECT) == 0 ||
			      (ino != FUSE_ROOT_ID && (strcmp(name, WFS_XATTR_RECHECK) == 0 ||
						       strcmp(name, WFS_XATTR_GC) == 0))))
		ret = -EPERM; /* computed, or a request only the mount root takes */
	if (ret == 1) {
		fuse_reply_err(req, 0);
		return;
	}
	if (ret == 0 && ino == FUSE_ROOT_ID && strcmp(name, WFS_XATTR_GC) == 0) {
		fuse_reply_err(req, -gc_request(fs, req, value, size));
		return;
	}
	if (ret == 0 && ino == FUSE_ROOT_ID && strcmp(name, WFS_XATTR_RECHECK) == 0) {
		struct wfs_digest d;

		ret = digest_request(req, value, size, &d);
		if (ret == 0) {
			wfs_lock(&fs->lock);
			ret = wfs_check_recheck(fs, &d);
			wfs_unlock(&fs->lock);
		}
		fuse_reply_err(req, -ret);
		return;
	}
	if (ret == 0 && strcmp(name, WFS_XATTR_CLAIMS) == 0) {
		char **made;
		size_t nmade;

		struct wfs_news news = {.ino = ino, .moved = true};

		ret = claim_batch(fs, req, ino, value, size, &made, &nmade);
		fuse_reply_err(req, -ret);
		/* After the reply (setxattr holds the directory's lock, which dropping a dentry takes),
		 * and from the notifier, not this thread: the caller's next request holds that lock
		 * while it waits for a free thread. Cached negative dentries of the new names, and the
		 * directory's attributes, go. */
		for (size_t i = 0; i < nmade; i++) {
			wfs_news_name(&news, ino, made[i]);
			free(made[i]);
		}
		free(made);
		news.inval = news.n > 0;
		wfs_ops_news_post(fs, &news);
		return;
	}
	if (ret == 0 && strcmp(name, WFS_XATTR_CLAIM) == 0) {
		ret = claim(fs, req, ino, value, size);
		/* The kernel caches this inode's size as 0: drop its attributes before the caller can
		 * read. Safe before the reply: the kernel takes no lock setxattr holds to do it. */
		if (ret == 0)
			fuse_lowlevel_notify_inval_inode(fs->se, ino, 0, 0);
		fuse_reply_err(req, -ret);
		return;
	}
	if (ret == 0) {
		wfs_lock(&fs->lock);
		if (strcmp(name, WFS_XATTR_DTYPE) == 0 || strcmp(name, WFS_XATTR_SHAPE) == 0) {
			wfs_openmode_wait_release(fs, ino); /* judge the file as close(2) left it */
			ret = wfs_seal_check_xattr(fs, ino, name, value, size);
		}
		if (ret == 0)
			ret = wfs_catalog_xattr_set(fs->catalog, ino, name, value, size, flags);
		wfs_unlock(&fs->lock);
	}
	fuse_reply_err(req, -ret);
}

/*
 * Only stored attributes are listed. The computed ones (user.weightfs.digest, user.weightfs.stats)
 * are read by name, as other filesystems hide theirs: a listed one would be copied out by `cp -a`,
 * `rsync -X` and tar as a plain attribute, and rsync would try to remove it (EPERM) from every file
 * whose source lacks it.
 */
void wfs_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	WFS_OPS_COUNT(LISTXATTR);
	struct wfs_fs *fs = wfs_ops_fs(req);
	char *buf = NULL;
	size_t len = 0;
	int ret;

	if (size && !(buf = malloc(size))) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	wfs_lock(&fs->lock);
	ret = wfs_catalog_xattr_list(fs->catalog, ino, buf, size, &len);
	wfs_unlock(&fs->lock);
	reply_xattr(req, ret, size, buf, len);
	free(buf);
}

void wfs_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	WFS_OPS_COUNT(REMOVEXATTR);
	struct wfs_fs *fs = wfs_ops_fs(req);
	int ret = user_xattr(name); /* as getxattr and setxattr say */

	if (ret == 0 && (strcmp(name, WFS_XATTR_DIGEST) == 0 || strcmp(name, WFS_XATTR_STATS) == 0 ||
			 strcmp(name, WFS_XATTR_DIRECT) == 0 || (ino == FUSE_ROOT_ID && strcmp(name, WFS_XATTR_GC) == 0)))
		ret = -EPERM;
	if (ret == 0) {
		wfs_lock(&fs->lock);
		ret = wfs_catalog_xattr_remove(fs->catalog, ino, name);
		wfs_unlock(&fs->lock);
	}
	fuse_reply_err(req, -ret);
}
