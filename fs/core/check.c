/* SPDX-License-Identifier: Apache-2.0 */
/* check.h: objects' bytes against their digests, and quarantine. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <numaif.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache.h"
#include "check.h"
#include "daemon.h"
#include "fault.h"
#include "log.h"
#include "object.h"

struct wfs_check {
	struct wfs_map_node node; /* key: wfs_map_digest_key() */
	struct wfs_digest digest;
	bool checking;            /* (L) being read now: others wait on fs->check_done */
	bool ok;                  /* (L) read and matched, as the file below */
	bool bad;                 /* (L) mismatch or missing: quarantined, logged once */
	bool declared;            /* (L) published on its writer's declared digest and not read since
				   * (catalog state WFS_OBJECT_DECLARED): checked even with -o verify=none */
	bool listed;              /* (L) the catalog has its row (-o verify=none reads an unlisted one) */
	bool sized;               /* (L) -o verify=none: the file below has the catalog's size */
	ino_t st_ino;             /* (L) the object file as checked: a different file is checked again */
	off_t st_size;
	struct timespec st_mtim;
	struct timespec st_ctim;
};

static struct wfs_check *check_find(struct wfs_fs *fs, const struct wfs_digest *d)
{
	uint64_t key = wfs_map_digest_key(d);

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
	c->node.key = wfs_map_digest_key(d);
	if (wfs_map_insert(&fs->checks, &c->node)) {
		free(c);
		return NULL;
	}
	return c;
}

/* The identity of the object file @c's finding is about (same_file()). */
static void note_file(struct wfs_check *c, const struct stat *st)
{
	c->st_ino = st->st_ino;
	c->st_size = st->st_size;
	c->st_mtim = st->st_mtim;
	c->st_ctim = st->st_ctim;
}

static void record(struct wfs_check *c, const struct stat *st)
{
	c->ok = true;
	c->bad = false;
	note_file(c, st);
}

static bool same_file(const struct wfs_check *c, const struct stat *st)
{
	return c->st_ino == st->st_ino && c->st_size == st->st_size &&
	       c->st_mtim.tv_sec == st->st_mtim.tv_sec && c->st_mtim.tv_nsec == st->st_mtim.tv_nsec &&
	       c->st_ctim.tv_sec == st->st_ctim.tv_sec && c->st_ctim.tv_nsec == st->st_ctim.tv_nsec;
}

void wfs_check_mark_good(struct wfs_fs *fs, const struct wfs_digest *d, const struct stat *st)
{
	struct wfs_check *c = check_get(fs, d);

	if (c)
		record(c, st);
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
			atomic_fetch_add(&fs->counters->checks_placed, 1);
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

/* Object @d was found damaged (@why: what was found): moved aside, marked, logged. fs->lock held. */
static void quarantine(struct wfs_fs *fs, const struct wfs_digest *d, const char *why)
{
	char hex[WFS_DIGEST_HEX_CHARS + 1];
	int ret;

	wfs_digest_to_hex(d, hex);
	fs->counters->verify_failures++;
	ret = wfs_store_object_quarantine(fs->store, d);
	wfs_catalog_object_set_state(fs->catalog, d, WFS_OBJECT_QUARANTINED);
	wfs_log(WFS_LOG_ERR, "object %s: %s; %s; its names fail with EIO until the content is written again",
		hex, why, ret == 0 ? "moved to quarantine/" : "could not move it to quarantine/");
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
	const struct wfs_digest *d = wfs_object_digest(o);

	while ((c = check_find(fs, d)) != NULL && c->checking)
		wfs_lock_wait(&fs->check_done, &fs->lock);
	ret = wfs_store_object_stat(fs->store, d, &st);
	if (c && c->bad && ret == -ENOENT)
		return -EIO; /* still quarantined or missing: already logged */
	if (ret == -ENOENT) {
		char hex[WFS_DIGEST_HEX_CHARS + 1];

		wfs_digest_to_hex(d, hex);
		wfs_log(WFS_LOG_ERR, "object %s: missing from objects/; its names fail with EIO until "
			"the content is written again", hex);
		c = check_get(fs, d);
		if (c) {
			c->ok = false;
			c->bad = true;
		}
		return -EIO;
	}
	if (ret)
		return ret;
	if (c && c->ok && !force && same_file(c, &st))
		return 0;

	c = check_get(fs, d);
	if (!c)
		return -ENOMEM;
	c->checking = true;
	wfs_lock_long_work(&fs->lock);
	wfs_unlock(&fs->lock);
	wfs_delay("check.read"); /* test-only: a large object, read from a busy disk */
	ret = check_bytes(fs, d, &st, for_tid ? wfs_cache_node_of_task(for_tid) : -1);
	wfs_lock(&fs->lock);
	c->checking = false; /* entries are freed only at exit: @c is still ours */
	pthread_cond_broadcast(&fs->check_done);

	if (ret == 0) {
		record(c, &st);
		if (c->declared) {
			c->declared = false;
			if (wfs_catalog_object_set_state(fs->catalog, d, WFS_OBJECT_OK) == 0)
				return 0;
			c->declared = true; /* still DECLARED in the catalog: checked again next run */
		}
		return 0;
	}
	if (ret == -EBADMSG) {
		c->ok = false;
		c->bad = true;
		c->declared = false; /* quarantine() sets its catalog state */
		quarantine(fs, d, "bytes do not match the digest");
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

	if (row->refcount == 0 || row->state == WFS_OBJECT_QUARANTINED)
		return 0; /* retained or quarantined: counted elsewhere */
	c = check_find(cc->fs, &row->digest);
	if (c && c->ok)
		cc->verified++;
	else
		cc->unverified++;
	return 0;
}

int wfs_check_count(struct wfs_fs *fs, uint64_t *verified, uint64_t *unverified)
{
	struct count_ctx cc = {.fs = fs};
	int ret = wfs_catalog_objects(fs->catalog, count_one, &cc);

	*verified = cc.verified;
	*unverified = cc.unverified;
	return ret;
}

/* Is object @d one published on a declared digest and not read since (fs->lock held)? */
static bool declared(struct wfs_fs *fs, const struct wfs_digest *d)
{
	struct wfs_check *c = check_find(fs, d);

	return c && c->declared;
}

/*
 * Does the catalog list object @d, or did this daemon check or publish it (fs->lock held)? An
 * object file it does not list is what a seal killed between its link and its commit leaves: with
 * a declared digest, bytes nobody read.
 */
static bool listed(struct wfs_fs *fs, const struct wfs_digest *d)
{
	struct wfs_check *c = check_find(fs, d);
	uint64_t refs, bytes;

	if (c && (c->ok || c->listed))
		return true;
	if (wfs_catalog_object_get(fs->catalog, d, &refs, &bytes))
		return false;
	c = check_get(fs, d);
	if (c)
		c->listed = true;
	return true;
}

/*
 * -o verify=none reads no bytes, but an object file whose size is not the catalog's is damaged all
 * the same, and the fstat that a check makes first tells (found by a new operator: an object cut to
 * 100 bytes read short, with no error and nothing logged). Once per object file. Returns 0, or -EIO
 * for one found damaged (quarantined and logged, or before). fs->lock held.
 */
static int check_size(struct wfs_fs *fs, const struct wfs_digest *d)
{
	struct wfs_check *c = check_find(fs, d);
	uint64_t refs, bytes;
	struct stat st;
	char why[96];

	if (c && c->bad)
		return -EIO; /* what a check found still holds */
	if (wfs_store_object_stat(fs->store, d, &st) != 0)
		return 0; /* missing: the open of its file fails and says so */
	if (c && (c->ok || c->sized) && same_file(c, &st))
		return 0;
	if (wfs_catalog_object_get(fs->catalog, d, &refs, &bytes) != 0 || (uint64_t)st.st_size == bytes) {
		c = check_get(fs, d);
		if (c) {
			c->sized = true;
			note_file(c, &st);
		}
		return 0;
	}
	c = check_get(fs, d);
	if (c) {
		c->ok = false;
		c->bad = true;
	}
	snprintf(why, sizeof(why), "%lld bytes on the disk, not the %llu of its digest", (long long)st.st_size,
		 (unsigned long long)bytes);
	quarantine(fs, d, why);
	return -EIO;
}

int wfs_check_object(struct wfs_fs *fs, struct wfs_object *o, pid_t tid)
{
	const struct wfs_digest *d = wfs_object_digest(o);

	if (fs->opt.verify || declared(fs, d) || !listed(fs, d))
		return verify(fs, o, false, tid);
	return check_size(fs, d); /* -o verify=none */
}

bool wfs_check_known_good(struct wfs_fs *fs, const struct wfs_digest *d)
{
	struct wfs_check *c = check_find(fs, d);
	struct stat st;

	return c && c->ok && !c->checking && !c->bad && !c->declared &&
	       wfs_store_object_stat(fs->store, d, &st) == 0 && same_file(c, &st);
}

bool wfs_check_damaged(struct wfs_fs *fs, const struct wfs_digest *d)
{
	struct wfs_check *c = check_find(fs, d);
	struct stat st;

	if (!c || !c->bad)
		return false;
	/* Quarantined or missing, or the damaged file still there: not a good copy published since. */
	return wfs_store_object_stat(fs->store, d, &st) != 0 || same_file(c, &st);
}

int wfs_check_plausible(struct wfs_fs *fs, struct wfs_object *o, const struct stat *st)
{
	struct wfs_check *c = check_find(fs, wfs_object_digest(o));
	uint64_t refs, bytes;

	if (c && c->bad && same_file(c, st))
		return -EIO; /* found damaged this run, and still the same file */
	if (wfs_catalog_object_get(fs->catalog, wfs_object_digest(o), &refs, &bytes) == 0 &&
	    bytes == (uint64_t)st->st_size)
		return 0;
	return wfs_check_object(fs, o, 0); /* not as cataloged: read it now (quarantined if damaged) */
}

int wfs_check_recheck(struct wfs_fs *fs, const struct wfs_digest *d)
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
	wfs_object_unpin(fs, o);
	return ret;
}

void wfs_check_soon(struct wfs_fs *fs, const struct wfs_digest *d)
{
	struct wfs_checker *k = &fs->checker;
	struct wfs_check *c = check_get(fs, d);

	if (c)
		c->declared = true;
	if (!k->started || k->stop)
		return;
	if (k->n == k->cap) {
		size_t cap = k->cap ? 2 * k->cap : 64;
		struct wfs_digest *more = realloc(k->queue, cap * sizeof(*more));

		if (!more)
			return; /* its first open checks it */
		k->queue = more;
		k->cap = cap;
	}
	k->queue[k->n++] = *d;
	pthread_cond_signal(&k->due);
}

static void *checker(void *arg)
{
	struct wfs_fs *fs = arg;
	struct wfs_checker *k = &fs->checker;

	/* Below the request threads: a check is never what a caller waits for, unless it opens the
	 * object, and then it waits on the check itself. */
	setpriority(PRIO_PROCESS, (id_t)gettid(), 10);
	wfs_lock(&fs->lock);
	for (;;) {
		struct wfs_object *o;
		struct wfs_digest d;

		while (!k->stop && k->n == 0)
			wfs_lock_wait(&k->due, &fs->lock);
		if (k->stop)
			break;
		d = k->queue[0];
		memmove(k->queue, k->queue + 1, --k->n * sizeof(*k->queue));
		if (wfs_fault("checker.check"))
			continue; /* test-only: left unchecked, for what uses it first (check_mount) */
		o = wfs_object_pin(fs, &d); /* not deleted while it is read */
		if (!o)
			continue;
		if (wfs_store_object_exists(fs->store, &d)) { /* its names may be gone already */
			char hex[WFS_DIGEST_HEX_CHARS + 1];
			int ret = verify(fs, o, false, 0);

			fs->counters->checks_after_seal++;
			if (ret == -EIO) {
				wfs_digest_to_hex(&d, hex);
				wfs_log(WFS_LOG_ERR, "object %s was sealed on the digest its writer declared "
					"(setxattr user.weightfs.digest): the bytes written are other content", hex);
			}
		}
		wfs_object_unpin(fs, o);
	}
	wfs_unlock(&fs->lock);
	return NULL;
}

static int queue_declared(void *ctx, const struct wfs_object_row *row)
{
	if (row->state == WFS_OBJECT_DECLARED)
		wfs_check_soon(ctx, &row->digest);
	return 0;
}

int wfs_check_start(struct wfs_fs *fs)
{
	struct wfs_checker *k = &fs->checker;
	int ret = pthread_cond_init(&k->due, NULL);

	if (ret)
		return -ret;
	wfs_lock(&fs->lock);
	k->stop = false;
	ret = pthread_create(&k->thread, NULL, checker, fs);
	k->started = ret == 0;
	/* Objects sealed on a declared digest by an earlier run that stopped before checking them:
	 * checked now, and before any use meanwhile (even with -o verify=none). */
	if (wfs_catalog_objects(fs->catalog, queue_declared, fs))
		wfs_log(WFS_LOG_WARN, "catalog: objects sealed on a declared digest and not checked could not "
			"be listed: they are checked at their first open");
	wfs_unlock(&fs->lock);
	if (ret) {
		pthread_cond_destroy(&k->due);
		wfs_log(WFS_LOG_WARN, "no checker thread (%s): objects sealed on a declared digest are "
			"checked at their first open", strerror(ret));
	}
	return -ret;
}

void wfs_check_stop(struct wfs_fs *fs)
{
	struct wfs_checker *k = &fs->checker;

	if (!k->started)
		return;
	wfs_lock(&fs->lock);
	k->stop = true;
	pthread_cond_signal(&k->due);
	wfs_unlock(&fs->lock);
	pthread_join(k->thread, NULL);
	wfs_lock(&fs->lock);
	k->started = false;
	free(k->queue);
	k->queue = NULL;
	k->n = k->cap = 0;
	wfs_unlock(&fs->lock);
	pthread_cond_destroy(&k->due);
}

void wfs_checks_release(struct wfs_fs *fs)
{
	struct wfs_map_node *n;

	while ((n = wfs_map_pop(&fs->checks)) != NULL)
		free(n);
	wfs_map_release(&fs->checks);
}
