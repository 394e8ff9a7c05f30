/* SPDX-License-Identifier: Apache-2.0 */
/* claim.h: digest claims, which seal a name as a stored object without its bytes. */
#include <errno.h>
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>

#include "check.h"
#include "claim.h"
#include "lock.h"
#include "daemon.h"
#include "inode.h"
#include "object.h"
#include "openmode.h"
#include "seal.h"
#include "version.h"

/*
 * May a claim replace what @in holds now? Only nothing: no content, no bytes written, and no reader
 * holding the current (empty) object as its passthrough backing file. With @freeze, an empty
 * version being written is frozen (writes wait for the claim, then go to a new version) and
 * *@frozen says so. Waits for a seal in progress.
 */
static int claim_target_empty(struct wfs_fs *fs, struct wfs_inode *in, bool freeze, bool *frozen)
{
	struct wfs_version *v;
	struct wfs_attr a;
	int ret;

	/* A seal in progress (an empty file's is at its release, after close(2) returned): wait. */
	while ((v = in->writer) != NULL && wfs_version_frozen(v))
		wfs_lock_wait(&fs->seal_done, &fs->lock);
	if (in->io.npassthrough > 0 && !wfs_openmode_on_version(in))
		return -ETXTBSY; /* readers share the current object's file */
	if (v) {
		/* The bytes being written are what the file holds now, whatever was sealed before. */
		ret = wfs_version_claim_freeze(v, freeze);
		if (ret == 0 && freeze)
			*frozen = true;
		return ret;
	}
	ret = wfs_catalog_getattr(fs->catalog, in->ino, &a);
	if (ret)
		return ret;
	if (!S_ISREG(a.mode))
		return -EINVAL;
	return a.size ? -EEXIST : 0;
}

int wfs_claim_inode(struct wfs_fs *fs, struct wfs_inode *in, const struct wfs_digest *d)
{
	struct wfs_attr old;
	struct wfs_object *o;
	struct timespec mtime;
	bool frozen = false, kernel_fill = false;
	struct stat st;
	int ret;

	ret = claim_target_empty(fs, in, false, NULL); /* fail early, before reading the object */
	if (ret)
		return ret;
	o = wfs_object_pin(fs, d); /* from here on the object cannot be deleted under us */
	if (!o)
		return -ENOMEM;
	for (;;) {
		struct timespec until;

		ret = wfs_store_object_stat(fs->store, d, &st); /* absent: the common miss, no log */
		if (ret == 0)
			ret = wfs_check_plausible(fs, o, &st); /* a stat, not a read: a first open checks */
		if (ret == -ENOENT || ret == -EIO)
			ret = -ENODATA;
		if (ret != -ENODATA || !wfs_object_expected_elsewhere(o, in->ino, &until) ||
		    fs->claims_waiting >= WFS_CLAIM_WAITERS_MAX)
			break;
		/* Another file's claim of this content missed and its writer is writing it now (ranks
		 * offloading the same tensor at once): wait for that seal rather than write it again. */
		fs->claims_waiting++;
		ret = wfs_lock_timedwait(&fs->seal_done, &fs->lock, &until);
		fs->claims_waiting--;
		if (ret == ETIMEDOUT && wfs_store_object_stat(fs->store, d, &st) != 0) {
			ret = -ENODATA;
			break; /* waited long enough: this writer writes it too */
		}
	}
	if (ret == -ENODATA) {
		fs->counters->claim_misses++;
		if (!in->expecting && !wfs_object_expected_elsewhere(o, in->ino, &(struct timespec){0})) {
			/* This file's writer writes the content next: other claims of it wait for it. */
			wfs_object_repin(o);
			wfs_object_expect(o, in->ino, WFS_CLAIM_WAIT_MS);
			in->expecting = o;
		}
	}
	if (ret == 0) /* again, freezing an empty version: fs->lock may have been dropped, and a write
		       * must not land between this check and the commit */
		ret = claim_target_empty(fs, in, true, &frozen);
	if (ret == 0)
		ret = wfs_seal_fits(fs, in->ino, (uint64_t)st.st_size, NULL, NULL, 0, false, "claim refused");
	if (ret == 0 && frozen && wfs_version_kernel_written(in->writer)) {
		/* The kernel reads and writes the version's file (passthrough): the bytes go there. */
		struct wfs_version *v = in->writer;
		int fd = wfs_object_fd(fs, o);

		/* Frozen by the claim: no seal takes it and no writer joins it meanwhile (version.h). */
		wfs_version_get(v);
		wfs_unlock(&fs->lock);
		ret = fd < 0 ? fd : wfs_version_claim_fill(v, fd, (uint64_t)st.st_size, d);
		wfs_lock(&fs->lock);
		wfs_version_put(v);
		kernel_fill = ret == 0;
	}
	if (ret == 0) {
		clock_gettime(CLOCK_REALTIME, &mtime);
		/* Not synced: the object is durable already, and the claimed name becomes durable with
		 * the next synced commit, like a rename (trainers claim a temp name, then rename it). */
		ret = wfs_catalog_set_content(fs->catalog, in->ino, d, (uint64_t)st.st_size, &mtime, NULL, 0,
					      &old, NULL);
	}
	if (ret == 0 && kernel_fill) {
		/* Its file holds the object's bytes now: sealed at the release, as this content unless
		 * written since. Writes wait no more. */
		wfs_version_thaw(in->writer);
		pthread_cond_broadcast(&fs->seal_done);
	} else if (ret == 0 && in->writer) {
		wfs_seal_abandon(fs, in); /* empty and unwritten: nothing is lost */
	}
	if (ret == 0) {
		in->sealed = true;
		in->digest = *d;
		in->io.cache_valid = false;
		fs->counters->claims++;
	} else if (frozen) {
		/* The one frozen above (fs->lock held since): as it was; writers waiting go on with it. */
		if (kernel_fill)
			wfs_version_free_kernel_bytes(in->writer); /* empty again, as the claim found it */
		wfs_version_thaw(in->writer);
		pthread_cond_broadcast(&fs->seal_done);
	}
	wfs_object_unpin(fs, o);
	if (ret == 0 && old.sealed && !wfs_digest_equal(&old.digest, d))
		wfs_object_maybe_delete(fs, &old.digest); /* the empty object, when no other name has it */
	return ret;
}

int wfs_claim(struct wfs_fs *fs, uint64_t ino, const struct wfs_digest *d)
{
	struct wfs_inode *in;
	struct wfs_attr a;
	int ret;

	ret = wfs_catalog_getattr(fs->catalog, ino, &a);
	if (ret == 0 && !S_ISREG(a.mode))
		ret = -EINVAL;
	if (ret)
		return ret;
	in = wfs_inode_get(fs, &a);
	if (!in)
		return -ENOMEM;
	wfs_inode_pin(in); /* the wait drops fs->lock (wfs_inode_pin()) */
	/* The opens of a file the kernel writes share its version's file, which the claim fills. */
	ret = wfs_openmode_on_version(in) ? 0 : wfs_openmode_wait_readers(fs, in);
	if (ret == 0)
		ret = wfs_claim_inode(fs, in, d);
	wfs_inode_unpin(fs, in);
	return ret;
}

int wfs_claim_new(struct wfs_fs *fs, uint64_t parent, const char *name, uint32_t mode, uint32_t uid,
		       uint32_t gid, const struct wfs_digest *d, const struct stat *st,
		       const struct wfs_catalog_xattr *xattrs, size_t nxattrs, struct wfs_attr *out)
{
	struct wfs_object *o = wfs_object_pin(fs, d); /* the object cannot be deleted under us */
	int ret;

	if (!o)
		return -ENOMEM;
	ret = wfs_check_plausible(fs, o, st);
	if (ret == -ENOENT || ret == -EIO) {
		ret = -ENODATA;
		fs->counters->claim_misses++;
	}
	if (ret == 0)
		ret = wfs_catalog_create_sealed(fs->catalog, parent, name, mode, uid, gid, d,
						(uint64_t)st->st_size, xattrs, nxattrs, out);
	if (ret == 0)
		fs->counters->claims++;
	wfs_object_unpin(fs, o);
	return ret;
}
