/*
 * Object verification: a name never returns bytes that differ from its digest.
 *
 * The first open of an object after the daemon starts reads it and checks its XXH3-128 digest before
 * the open succeeds (that read also warms the page cache the trainer is about to map). Later opens
 * trust the check while the object file is the same file (inode, size, mtime, and ctime, which any
 * write or `touch -r` moves and no user can set back). A mismatch moves the
 * object to STORE/quarantine, logs one line, and fails every open of every name with that content
 * with EIO — until the same content is written again, which publishes a good copy (the seal marks it
 * checked here, and its catalog row OK).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <numaif.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon.h"
#include "cache.h"
#include "log.h"

static uint64_t digest_key(const struct wfs_digest *d)
{
	uint64_t k;

	memcpy(&k, d->bytes, sizeof(k));
	return k;
}

static struct wfs_check *check_find(struct wfs_fs *fs, const struct wfs_digest *d)
{
	uint64_t key = digest_key(d);

	for (struct wfs_map_node *n = wfs_map_first(&fs->checks, key); n; n = wfs_map_next(n, key)) {
		struct wfs_check *c = (struct wfs_check *)n;

		if (wfs_digest_equal(&c->digest, d))
			return c;
	}
	return NULL;
}

static struct wfs_check *check_get(struct wfs_fs *fs, const struct wfs_digest *d)
{
	struct wfs_check *c = check_find(fs, d);

	if (c)
		return c;
	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->digest = *d;
	c->node.key = digest_key(d);
	if (wfs_map_insert(&fs->checks, &c->node)) {
		free(c);
		return NULL;
	}
	return c;
}

static void record(struct wfs_check *c, const struct stat *st)
{
	c->bad = false;
	c->st_ino = st->st_ino;
	c->st_size = st->st_size;
	c->st_mtim = st->st_mtim;
	c->st_ctim = st->st_ctim;
}

static bool same_file(const struct wfs_check *c, const struct stat *st)
{
	return c->st_ino == st->st_ino && c->st_size == st->st_size &&
	       c->st_mtim.tv_sec == st->st_mtim.tv_sec && c->st_mtim.tv_nsec == st->st_mtim.tv_nsec &&
	       c->st_ctim.tv_sec == st->st_ctim.tv_sec && c->st_ctim.tv_nsec == st->st_ctim.tv_nsec;
}

void wfs_verify_mark_good(struct wfs_fs *fs, const struct wfs_digest *d)
{
	struct wfs_check *c;
	struct stat st;

	if (!fs->opt.verify || wfs_store_object_stat(fs->store, d, &st))
		return;
	c = check_get(fs, d);
	if (c)
		record(c, &st);
}

/*
 * Read object @d through a descriptor of our own and compare. The read fills the page cache that the
 * process opening the name is about to map: with @node >= 0 (the opener's NUMA node), this thread
 * prefers that node while it reads, so the pages land where the opener runs, not where the daemon
 * thread happens to (the kernel places page-cache pages by the reading task's policy). fs->lock not
 * held.
 */
static int check_bytes(struct wfs_fs *fs, const struct wfs_digest *d, struct stat *st, int node)
{
	struct wfs_digest got;
	uint64_t bytes;
	bool placed = false;
	int fd, ret;

	fd = wfs_store_object_open(fs->store, d, 0);
	if (fd < 0)
		return fd;
	ret = fstat(fd, st) < 0 ? -errno : 0;
	if (ret == 0 && node >= 0 && node < (int)(8 * sizeof(unsigned long))) {
		unsigned long mask = 1ul << node;

		placed = set_mempolicy(MPOL_PREFERRED, &mask, 8 * sizeof(mask)) == 0;
		if (placed)
			atomic_fetch_add(&fs->checks_placed, 1);
	}
	if (ret == 0)
		ret = wfs_digest_fd(fd, &got, &bytes);
	if (placed)
		set_mempolicy(MPOL_DEFAULT, NULL, 0); /* daemon threads run with the default policy */
	if (ret == 0 && (!wfs_digest_equal(&got, d) || bytes != (uint64_t)st->st_size))
		ret = -EBADMSG;
	close(fd);
	return ret;
}

static void quarantine(struct wfs_fs *fs, const struct wfs_digest *d)
{
	char hex[WFS_DIGEST_HEX_CHARS + 1];
	int ret;

	wfs_digest_to_hex(d, hex);
	fs->counters.verify_failures++;
	ret = wfs_store_object_quarantine(fs->store, d);
	wfs_catalog_object_set_state(fs->catalog, d, WFS_OBJECT_QUARANTINED);
	wfs_log(WFS_LOG_ERR, "object %s: bytes do not match the digest; %s; its names fail with EIO "
		"until the content is written again", hex,
		ret == 0 ? "moved to quarantine/" : "could not move it to quarantine/");
}

/*
 * Check @o's bytes, or trust an earlier check of the same file unless @force; a read is placed on
 * thread @for_tid's NUMA node (0: none, check_bytes()). fs->lock held.
 */
static int verify(struct wfs_fs *fs, struct wfs_object *o, bool force, pid_t for_tid)
{
	struct wfs_check *c;
	struct stat st;
	int ret;

	while (o->verifying)
		pthread_cond_wait(&fs->sealed, &fs->lock);
	c = check_find(fs, &o->digest);
	ret = wfs_store_object_stat(fs->store, &o->digest, &st);
	if (c && c->bad && ret == -ENOENT)
		return -EIO; /* still quarantined or missing: already logged */
	if (ret == -ENOENT) {
		char hex[WFS_DIGEST_HEX_CHARS + 1];

		wfs_digest_to_hex(&o->digest, hex);
		wfs_log(WFS_LOG_ERR, "object %s: missing from objects/; its names fail with EIO until "
			"the content is written again", hex);
		c = check_get(fs, &o->digest);
		if (c)
			c->bad = true;
		return -EIO;
	}
	if (ret)
		return ret;
	if (c && !c->bad && !force && same_file(c, &st))
		return 0;

	o->verifying = true;
	pthread_mutex_unlock(&fs->lock);
	ret = check_bytes(fs, &o->digest, &st, for_tid ? wfs_cache_node_of_task(for_tid) : -1);
	pthread_mutex_lock(&fs->lock);
	o->verifying = false;
	pthread_cond_broadcast(&fs->sealed);

	c = check_get(fs, &o->digest);
	if (ret == 0) {
		if (c)
			record(c, &st);
		return 0;
	}
	if (ret == -EBADMSG) {
		if (c)
			c->bad = true;
		quarantine(fs, &o->digest);
		return -EIO;
	}
	return ret;
}

struct count_ctx {
	struct wfs_fs *fs;
	uint64_t verified, unverified;
};

static int count_one(void *ctx, const struct wfs_object_row *row)
{
	struct count_ctx *cc = ctx;
	struct wfs_check *c;

	if (row->refcount == 0 || row->state != WFS_OBJECT_OK)
		return 0; /* retained or quarantined: counted elsewhere */
	c = check_find(cc->fs, &row->digest);
	if (c && !c->bad)
		cc->verified++;
	else
		cc->unverified++;
	return 0;
}

int wfs_verify_count(struct wfs_fs *fs, uint64_t *verified, uint64_t *unverified)
{
	struct count_ctx cc = {.fs = fs};
	int ret = wfs_catalog_objects(fs->catalog, count_one, &cc);

	*verified = cc.verified;
	*unverified = cc.unverified;
	return ret;
}

int wfs_verify_object(struct wfs_fs *fs, struct wfs_object *o)
{
	return wfs_verify_object_for(fs, o, 0);
}

int wfs_verify_object_for(struct wfs_fs *fs, struct wfs_object *o, pid_t tid)
{
	return fs->opt.verify ? verify(fs, o, false, tid) : 0;
}

int wfs_verify_plausible(struct wfs_fs *fs, struct wfs_object *o, const struct stat *st)
{
	struct wfs_check *c = check_find(fs, &o->digest);
	uint64_t refs, bytes;

	if (c && c->bad && same_file(c, st))
		return -EIO; /* found damaged this run, and still the same file */
	if (wfs_catalog_object_get(fs->catalog, &o->digest, &refs, &bytes) == 0 && bytes == (uint64_t)st->st_size)
		return 0;
	return wfs_verify_object(fs, o); /* not as cataloged: read it now (quarantined if damaged) */
}

int wfs_verify_recheck(struct wfs_fs *fs, fuse_req_t req, const struct wfs_digest *d)
{
	struct wfs_check *c = check_find(fs, d);
	struct wfs_object *o;
	struct stat st;
	int ret;

	if (wfs_store_object_stat(fs->store, d, &st) == -ENOENT && !c)
		return -ENODATA; /* not stored (and not known to have been): nothing to check */
	o = wfs_object_pin(fs, d);
	if (!o)
		return -ENOMEM;
	ret = verify(fs, o, true, 0); /* read now, even with -o verify=none: asked for */
	wfs_object_unpin(fs, req, o);
	return ret;
}
