/*
 * FUSE low-level handlers. Each handler calls a helper that returns 0 or -errno and sends exactly
 * one reply. Namespace work happens under fs->lock (daemon.h explains the locking and why writable
 * opens are daemon-served while sealed reads use kernel passthrough).
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "daemon.h"
#include "direct.h"
#include "dtype.h"
#include "log.h"
#include "writer.h"
#include "weightfs.h"

#define BLKSIZE (1u << 20) /* st_blksize: large, so cp and friends write in big pieces */

static atomic_bool warned_passthrough, warned_txtbsy, warned_unsealed;

static struct wfs_fs *fs_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

static struct wfs_handle *handle_of(const struct fuse_file_info *fi)
{
	return (struct wfs_handle *)(uintptr_t)fi->fh;
}

/* stat(2) view of @a; a file being written shows the size written so far. fs->lock held. */
static void attr_to_stat(const struct wfs_attr *a, const struct wfs_inode *in, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = a->ino;
	st->st_mode = a->mode;
	st->st_nlink = a->nlink;
	st->st_uid = a->uid;
	st->st_gid = a->gid;
	st->st_rdev = (dev_t)a->rdev;
	st->st_size = (off_t)a->size;
	if (in && in->writer)
		st->st_size = (off_t)wfs_version_size(in->writer);
	st->st_blocks = (blkcnt_t)(((uint64_t)st->st_size + 511) / 512); /* logical, not shared */
	st->st_blksize = BLKSIZE;
	st->st_atim = a->atime;
	st->st_mtim = a->mtime;
	st->st_ctim = a->ctime;
}

/* Entry reply for @a, taking a lookup reference on its inode. fs->lock held. */
static int make_entry(struct wfs_fs *fs, const struct wfs_attr *a, struct fuse_entry_param *e)
{
	struct wfs_inode *in = wfs_inode_get(fs, a);

	if (!in)
		return -ENOMEM;
	memset(e, 0, sizeof(*e));
	e->ino = a->ino;
	e->generation = 1;
	e->attr_timeout = fs->opt.timeout;
	e->entry_timeout = fs->opt.timeout;
	attr_to_stat(a, in, &e->attr);
	in->nlookup++;
	return 0;
}

static int check_name(const char *name)
{
	return strlen(name) > NAME_MAX ? -ENAMETOOLONG : 0;
}

static void reply_entry_or_err(fuse_req_t req, int ret, const struct fuse_entry_param *e)
{
	if (ret)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_entry(req, e);
}

static void wfs_init(void *userdata, struct fuse_conn_info *conn)
{
	struct wfs_fs *fs = userdata;

	if (fs->opt.passthrough != 0 && fuse_set_feature_flag(conn, FUSE_CAP_PASSTHROUGH))
		atomic_store(&fs->passthrough, true);
	else if (fs->opt.passthrough != 0)
		wfs_log(WFS_LOG_WARN, "kernel FUSE passthrough unavailable: the daemon serves reads");
	/* Writeback caching would defer writes past close(2), where seal errors must be reported. */
	fuse_unset_feature_flag(conn, FUSE_CAP_WRITEBACK_CACHE);
	conn->max_write = 1u << 20;
	/* Writable opens are direct I/O: write(2) hands the caller's pages to the daemon instead of
	 * first copying them into the FUSE inode's page cache, one memory copy fewer (1.5x ingest
	 * measured). Mappings of a writable file still go through the page cache (allow_mmap). */
	fs->direct_writes = fuse_set_feature_flag(conn, FUSE_CAP_DIRECT_IO_ALLOW_MMAP);
	conn->time_gran = 1;
}

static void wfs_destroy(void *userdata)
{
	struct wfs_fs *fs = userdata;

	pthread_mutex_lock(&fs->lock);
	wfs_catalog_sync(fs->catalog);
	pthread_mutex_unlock(&fs->lock);
}

static void wfs_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct wfs_fs *fs = fs_of(req);
	struct fuse_entry_param e;
	struct wfs_attr a;
	int ret = check_name(name);

	pthread_mutex_lock(&fs->lock);
	if (ret == 0)
		ret = wfs_catalog_lookup(fs->catalog, parent, name, &a);
	if (ret == 0)
		ret = make_entry(fs, &a, &e);
	pthread_mutex_unlock(&fs->lock);
	if (ret == -ENOENT) {
		/* Negative entry: the kernel may cache the absence; creates go through us anyway. */
		memset(&e, 0, sizeof(e));
		e.entry_timeout = fs->opt.timeout;
		fuse_reply_entry(req, &e);
		return;
	}
	reply_entry_or_err(req, ret, &e);
}

static void forget_one(struct wfs_fs *fs, fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	struct wfs_inode *in = wfs_inode_find(fs, ino);

	if (!in)
		return;
	if (in->nlookup < nlookup) {
		wfs_log(WFS_LOG_ERR, "inode %llu: kernel forgot %llu lookups of %llu",
			(unsigned long long)ino, (unsigned long long)nlookup, (unsigned long long)in->nlookup);
		nlookup = in->nlookup;
	}
	in->nlookup -= nlookup;
	wfs_inode_maybe_free(fs, req, in);
}

static void wfs_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	struct wfs_fs *fs = fs_of(req);

	pthread_mutex_lock(&fs->lock);
	forget_one(fs, req, ino, nlookup);
	pthread_mutex_unlock(&fs->lock);
	fuse_reply_none(req);
}

static void wfs_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
	struct wfs_fs *fs = fs_of(req);

	pthread_mutex_lock(&fs->lock);
	for (size_t i = 0; i < count; i++)
		forget_one(fs, req, forgets[i].ino, forgets[i].nlookup);
	pthread_mutex_unlock(&fs->lock);
	fuse_reply_none(req);
}

static void wfs_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct wfs_fs *fs = fs_of(req);
	struct wfs_attr a;
	struct stat st;
	int ret;

	(void)fi;
	pthread_mutex_lock(&fs->lock);
	ret = wfs_catalog_getattr(fs->catalog, ino, &a);
	if (ret == 0)
		attr_to_stat(&a, wfs_inode_find(fs, ino), &st);
	pthread_mutex_unlock(&fs->lock);
	if (ret)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_attr(req, &st, fs->opt.timeout);
}

/*
 * What a handler must tell the kernel once fs->lock is dropped: names removed because their file was
 * never sealed, and an inode whose cached size and pages are stale. Telling it under fs->lock could
 * deadlock: a notify_delete takes the directory's lock, which a lookup waiting for fs->lock holds.
 */
struct kernel_news {
	uint64_t ino;      /* the inode concerned, 0 for none */
	bool inval;        /* its attributes and page cache are stale */
	bool moved;        /* the names below now name another inode (else they are gone) */
	size_t n;          /* names removed or moved */
	struct removed_name {
		uint64_t parent;
		char *name;
	} *names;
};

static void news_name(void *ctx, uint64_t parent, const char *name)
{
	struct kernel_news *k = ctx;
	struct removed_name *p = realloc(k->names, (k->n + 1) * sizeof(*p));

	if (!p)
		return; /* the kernel forgets the name at its entry timeout instead */
	k->names = p;
	p[k->n].parent = parent;
	p[k->n].name = strdup(name);
	if (p[k->n].name)
		k->n++;
}

/* Send @k to the kernel (fs->lock not held) and free it. */
static void news_send(struct wfs_fs *fs, struct kernel_news *k)
{
	for (size_t i = 0; i < k->n; i++) {
		const char *name = k->names[i].name;

		if (k->moved || fuse_lowlevel_notify_delete(fs->se, k->names[i].parent, k->ino, name,
							    strlen(name)) == -ENOSYS)
			fuse_lowlevel_notify_inval_entry(fs->se, k->names[i].parent, name, strlen(name));
		free(k->names[i].name);
	}
	if (k->inval)
		fuse_lowlevel_notify_inval_inode(fs->se, k->ino, 0, 0);
	free(k->names);
	*k = (struct kernel_news){0};
}

/*
 * @in's version was just dropped unsealed (its writer was killed, or the seal failed). A name that
 * was never sealed is removed now — a restarted writer checking "exists, with the right size" must
 * not find a name that fails every open with EIO — and a name that was sealed shows that content
 * again, the kernel's cached size included. fs->lock held; @news collects what to tell the kernel.
 */
static void writer_gone(struct wfs_fs *fs, struct wfs_inode *in, struct kernel_news *news)
{
	int ret;

	news->ino = in->ino;
	news->inval = true;
	if (in->sealed || in->writer)
		return;
	ret = wfs_catalog_unlink_unsealed(fs->catalog, in->ino, news_name, news);
	if (ret)
		wfs_log(WFS_LOG_ERR, "inode %llu: removing the never-sealed name failed: %s (removed at the "
			"next mount)", (unsigned long long)in->ino, strerror(-ret));
	else if (news->n)
		wfs_log(WFS_LOG_INFO, "inode %llu: never sealed and its writer is gone: name removed",
			(unsigned long long)in->ino);
}

/*
 * A writer beside readers. The kernel gives an inode one backing file (passthrough) and one page
 * cache (daemon-served), so a writable open of a sealed file that readers hold would fail (ETXTBSY)
 * or change the bytes under them. Instead its name moves to a new inode with the same attributes,
 * xattrs and content (wfs_catalog_inode_replace), and the request fails with ESTALE: the VFS looks
 * the name up again (LOOKUP_REVAL) and retries once, which reaches the new inode, held by nobody.
 * The readers keep the old inode and its object until they close; new opens see the new version.
 * Hard links cannot move one name alone: they keep the old rule (no_passthrough_readers()), and so
 * does a file that already has writers or is being written. fs->lock held; @nlink is the inode's,
 * from the catalog. Returns 1 (moved: reply ESTALE, then send @news), 0 (go on) or -errno.
 */
/*
 * The writer's retry after a move must not be moved again, or it gets ESTALE (the VFS retries once):
 * a reader may open the new inode between the retry's LOOKUP and its OPEN. So the new inode is noted
 * for a second; its next writable open goes ahead in place (moved_take), and a reader that comes
 * first is daemon-served (moved_pending), which a writer may join, instead of taking a passthrough
 * backing file that would refuse it. fs->lock held.
 */
static void moved_note(struct wfs_fs *fs, uint64_t ino)
{
	struct wfs_moved *slot = &fs->moved[0];
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	for (size_t i = 0; i < sizeof(fs->moved) / sizeof(fs->moved[0]); i++) {
		struct wfs_moved *m = &fs->moved[i];

		if (m->until.tv_sec < slot->until.tv_sec ||
		    (m->until.tv_sec == slot->until.tv_sec && m->until.tv_nsec < slot->until.tv_nsec))
			slot = m; /* the oldest (or an empty one) */
	}
	slot->ino = ino;
	slot->until = now;
	slot->until.tv_sec += 1;
}

static struct wfs_moved *moved_find(struct wfs_fs *fs, uint64_t ino)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	for (size_t i = 0; i < sizeof(fs->moved) / sizeof(fs->moved[0]); i++) {
		struct wfs_moved *m = &fs->moved[i];

		if (m->ino == ino && (m->until.tv_sec > now.tv_sec ||
				      (m->until.tv_sec == now.tv_sec && m->until.tv_nsec > now.tv_nsec)))
			return m;
	}
	return NULL;
}

static bool moved_pending(struct wfs_fs *fs, uint64_t ino)
{
	return moved_find(fs, ino) != NULL;
}

static bool moved_take(struct wfs_fs *fs, uint64_t ino)
{
	struct wfs_moved *m = moved_find(fs, ino);

	if (m)
		*m = (struct wfs_moved){0};
	return m != NULL;
}

static int move_from_readers(struct wfs_fs *fs, struct wfs_inode *in, uint32_t nlink, struct kernel_news *news)
{
	struct wfs_attr fresh;
	int ret;

	if (moved_take(fs, in->ino))
		return 0; /* the writer's retry: readers that came first are daemon-served, join them */
	if (!in->sealed || in->writer || in->nwritable > 0 || in->nopen == 0 || nlink != 1)
		return 0;
	ret = wfs_catalog_inode_replace(fs->catalog, in->ino, news_name, news, &fresh);
	if (ret)
		return ret == -EMLINK ? 0 : ret;
	in->replaced = true;
	news->ino = in->ino;
	news->moved = true;
	moved_note(fs, fresh.ino);
	fs->counters.moved_from_readers++;
	wfs_log(WFS_LOG_DEBUG, "inode %llu: opened for writing while %u readers hold it: name moved to inode "
		"%llu", (unsigned long long)in->ino, in->nopen, (unsigned long long)fresh.ino);
	return 1;
}

/*
 * Stop counting @h as a writer of its version; the last writer seals it. fs->lock held; @news gets
 * what the kernel must hear when the version was dropped unsealed (writer_gone()).
 */
static int finish_writing(struct wfs_fs *fs, fuse_req_t req, struct wfs_handle *h, bool at_release,
			  struct kernel_news *news)
{
	struct wfs_version *v = h->writing;
	struct wfs_inode *in = h->inode;
	int ret = 0, sig;

	if (!v)
		return 0;
	h->writing = NULL;
	if (--v->writers == 0 && in->writer == v) {
		sig = wfs_writer_killed_by(fuse_req_ctx(req)->pid);
		if (sig) {
			wfs_log(WFS_LOG_WARN, "inode %llu: writer killed by signal %d before it finished: "
				"nothing sealed%s", (unsigned long long)in->ino, sig,
				in->sealed ? ", the name keeps its previous content" : "");
			wfs_version_abandon(fs, in);
			writer_gone(fs, in, news);
		} else {
			ret = wfs_version_seal(fs, req, in, !at_release);
			if (ret)
				writer_gone(fs, in, news);
		}
	}
	wfs_version_put(v);
	return ret;
}

/* Count @h as a writer of @v (a referenced version of its inode). fs->lock held. */
static void start_writing(struct wfs_handle *h, struct wfs_version *v)
{
	if (h->writing == v)
		return;
	wfs_version_get(v);
	v->writers++;
	if (h->writing) {
		/* The version it wrote was sealed or dropped meanwhile; it no longer counts there. */
		h->writing->writers--;
		wfs_version_put(h->writing);
	}
	h->writing = v;
}

/* truncate(2)/ftruncate(2): a new version of the given size, sealed now unless a writer is open. */
static int set_size(struct wfs_fs *fs, fuse_req_t req, struct wfs_inode *in, struct wfs_handle *h,
		    uint64_t size, struct kernel_news *news)
{
	struct wfs_version *v;
	int ret;

	/* Through a descriptor the version is sealed at its close or release, perhaps where nobody
	 * hears a refusal (a mapping filled after close): hold the size to dtype/shape now. Empty is
	 * the state before the bytes are written, as for a new file. */
	if (h && size != 0) {
		ret = wfs_tensor_fits(fs, in->ino, size, NULL, NULL, 0, "ftruncate refused");
		if (ret)
			return ret;
	}
	for (;;) {
		v = wfs_version_writer(fs, req, in, size == 0, &ret);
		if (!v)
			return ret;
		ret = size == 0 ? 0 : wfs_version_truncate(fs, v, size);
		if (ret != -EAGAIN)
			break;
		wfs_version_put(v);
	}
	if (ret == 0 && h && h->writable)
		start_writing(h, v); /* sealed at this handle's close */
	if (v->writers == 0 && in->writer == v) {
		int r = wfs_version_seal(fs, req, in, true);

		if (r)
			writer_gone(fs, in, news);
		if (ret == 0)
			ret = r;
	}
	wfs_version_put(v);
	return ret;
}

static int no_passthrough_readers(struct wfs_fs *fs, struct wfs_inode *in);

static int do_setattr(struct wfs_fs *fs, fuse_req_t req, fuse_ino_t ino, const struct stat *st,
		      int to_set, struct fuse_file_info *fi, struct stat *out, struct kernel_news *news)
{
	struct wfs_attr a, in_attr = {0};
	struct wfs_inode *in;
	unsigned valid = 0;
	int ret;

	ret = wfs_catalog_getattr(fs->catalog, ino, &a);
	if (ret)
		return ret;
	if (to_set & FUSE_SET_ATTR_SIZE) {
		if (S_ISDIR(a.mode))
			return -EISDIR;
		if (!S_ISREG(a.mode))
			return -EINVAL;
		in = wfs_inode_get(fs, &a);
		if (!in)
			return -ENOMEM;
		if (in->replaced)
			return -ESTALE; /* a stale name: the kernel looks it up again */
		ret = fi ? 0 : move_from_readers(fs, in, a.nlink, news);
		if (ret == 1)
			return -ESTALE; /* truncate(2) retries on the name's new inode */
		if (ret == 0)
			ret = no_passthrough_readers(fs, in);
		if (ret == 0)
			ret = set_size(fs, req, in, fi ? handle_of(fi) : NULL, (uint64_t)st->st_size, news);
		if (ret) {
			wfs_inode_maybe_free(fs, req, in);
			return ret;
		}
		if (a.size != (uint64_t)st->st_size && !(to_set & (FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_MTIME_NOW)))
			to_set |= FUSE_SET_ATTR_MTIME_NOW; /* as ftruncate(2) does, seal or not */
	}
	if (to_set & FUSE_SET_ATTR_MODE) {
		valid |= WFS_ATTR_MODE;
		in_attr.mode = st->st_mode;
	}
	if (to_set & FUSE_SET_ATTR_UID) {
		valid |= WFS_ATTR_UID;
		in_attr.uid = st->st_uid;
	}
	if (to_set & FUSE_SET_ATTR_GID) {
		valid |= WFS_ATTR_GID;
		in_attr.gid = st->st_gid;
	}
	if (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_ATIME_NOW)) {
		valid |= WFS_ATTR_ATIME;
		in_attr.atime = st->st_atim;
		if (to_set & FUSE_SET_ATTR_ATIME_NOW)
			clock_gettime(CLOCK_REALTIME, &in_attr.atime);
	}
	if (to_set & (FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_MTIME_NOW)) {
		valid |= WFS_ATTR_MTIME;
		in_attr.mtime = st->st_mtim;
		if (to_set & FUSE_SET_ATTR_MTIME_NOW)
			clock_gettime(CLOCK_REALTIME, &in_attr.mtime);
	}
	if (to_set & FUSE_SET_ATTR_CTIME) {
		valid |= WFS_ATTR_CTIME;
		in_attr.ctime = st->st_ctim;
	}
	if (valid)
		ret = wfs_catalog_setattr(fs->catalog, ino, &in_attr, valid, &a);
	else
		ret = wfs_catalog_getattr(fs->catalog, ino, &a);
	in = wfs_inode_find(fs, ino);
	if (ret == 0 && (valid & WFS_ATTR_MTIME) && in && in->writer) {
		struct wfs_version *v = in->writer;

		pthread_mutex_lock(&v->lock);
		v->mtime_set = true;
		v->mtime = in_attr.mtime;
		pthread_mutex_unlock(&v->lock);
	}
	if (ret == 0)
		attr_to_stat(&a, wfs_inode_find(fs, ino), out);
	return ret;
}

static void wfs_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
			struct fuse_file_info *fi)
{
	struct wfs_fs *fs = fs_of(req);
	struct kernel_news news = {0};
	struct stat st;
	int ret;

	pthread_mutex_lock(&fs->lock);
	ret = do_setattr(fs, req, ino, attr, to_set, fi, &st, &news);
	pthread_mutex_unlock(&fs->lock);
	/* A moved name is told after the reply: truncate(2) holds the old inode's lock meanwhile. */
	if (!news.moved)
		news_send(fs, &news);
	if (ret)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_attr(req, &st, fs->opt.timeout);
	news_send(fs, &news);
}

/* Owner of a new inode: the caller, with the group of a set-group-ID parent (as ext4 does). */
static void new_owner(struct wfs_fs *fs, fuse_req_t req, fuse_ino_t parent, uint32_t *mode,
		      uint32_t *uid, uint32_t *gid)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct wfs_attr p;

	*uid = ctx->uid;
	*gid = ctx->gid;
	if (wfs_catalog_getattr(fs->catalog, parent, &p) == 0 && (p.mode & S_ISGID)) {
		*gid = p.gid;
		if (S_ISDIR(*mode))
			*mode |= S_ISGID;
	}
}

static int do_mknode(struct wfs_fs *fs, fuse_req_t req, fuse_ino_t parent, const char *name,
		     uint32_t mode, const char *target, struct wfs_attr *a)
{
	uint32_t uid, gid;
	int ret = check_name(name);

	if (ret)
		return ret;
	new_owner(fs, req, parent, &mode, &uid, &gid);
	return wfs_catalog_create(fs->catalog, parent, name, mode, uid, gid, target, a);
}

static void wfs_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	struct wfs_fs *fs = fs_of(req);
	struct fuse_entry_param e;
	struct wfs_attr a;
	int ret;

	pthread_mutex_lock(&fs->lock);
	ret = do_mknode(fs, req, parent, name, S_IFDIR | (mode & 07777), NULL, &a);
	if (ret == 0)
		ret = make_entry(fs, &a, &e);
	pthread_mutex_unlock(&fs->lock);
	reply_entry_or_err(req, ret, &e);
}

static void wfs_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
	struct wfs_fs *fs = fs_of(req);
	struct fuse_entry_param e;
	struct wfs_attr a;
	int ret = strlen(link) >= PATH_MAX ? -ENAMETOOLONG : 0;

	pthread_mutex_lock(&fs->lock);
	if (ret == 0)
		ret = do_mknode(fs, req, parent, name, S_IFLNK | 0777, link, &a);
	if (ret == 0)
		ret = make_entry(fs, &a, &e);
	pthread_mutex_unlock(&fs->lock);
	reply_entry_or_err(req, ret, &e);
}

/* Undo the catalog side of a create that could not be completed. fs->lock held. */
static void undo_create(struct wfs_fs *fs, fuse_req_t req, fuse_ino_t parent, const char *name)
{
	uint64_t ino;

	if (wfs_catalog_unlink(fs->catalog, parent, name, false, &ino) == 0)
		wfs_inode_maybe_drop(fs, req, ino);
}

/*
 * A FIFO, socket or device node: a catalog entry with its type and device number, nothing more. The
 * kernel serves its opens (a FIFO's pipe, a device's driver, refused under nodev) without the daemon.
 * fs->lock held.
 */
static int do_mkspecial(struct wfs_fs *fs, fuse_req_t req, fuse_ino_t parent, const char *name,
			mode_t mode, dev_t rdev, struct fuse_entry_param *e)
{
	uint32_t m = (mode & S_IFMT) | (mode & 07777), uid, gid;
	struct wfs_attr a;
	int ret = check_name(name);

	if (ret)
		return ret;
	new_owner(fs, req, parent, &m, &uid, &gid);
	ret = wfs_catalog_mknod(fs->catalog, parent, name, m, S_ISCHR(mode) || S_ISBLK(mode) ? rdev : 0,
				uid, gid, NULL, &a);
	return ret ? ret : make_entry(fs, &a, e);
}

/*
 * mknod(2): a regular file is an empty sealed file; FIFOs, sockets and device nodes are special files
 * (do_mkspecial()).
 */
static void wfs_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
	struct wfs_fs *fs = fs_of(req);
	struct fuse_entry_param e;
	struct wfs_inode *in = NULL;
	struct wfs_version *v;
	struct wfs_attr a;
	int ret;

	if (!S_ISREG(mode)) {
		if (S_ISFIFO(mode) || S_ISSOCK(mode) || S_ISCHR(mode) || S_ISBLK(mode)) {
			pthread_mutex_lock(&fs->lock);
			ret = do_mkspecial(fs, req, parent, name, mode, rdev, &e);
			pthread_mutex_unlock(&fs->lock);
		} else {
			ret = -EINVAL;
		}
		reply_entry_or_err(req, ret, &e);
		return;
	}
	pthread_mutex_lock(&fs->lock);
	ret = do_mknode(fs, req, parent, name, S_IFREG | (mode & 07777), NULL, &a);
	if (ret == 0) {
		in = wfs_inode_get(fs, &a);
		ret = in ? 0 : -ENOMEM;
	}
	if (ret == 0) {
		v = wfs_version_writer(fs, req, in, true, &ret);
		if (v) {
			ret = wfs_version_seal(fs, req, in, true);
			wfs_version_put(v);
		}
		if (ret == 0)
			ret = wfs_catalog_getattr(fs->catalog, a.ino, &a);
		if (ret == 0)
			ret = make_entry(fs, &a, &e);
		if (ret) {
			undo_create(fs, req, parent, name);
			wfs_inode_maybe_free(fs, req, in);
		}
	}
	pthread_mutex_unlock(&fs->lock);
	reply_entry_or_err(req, ret, &e);
}

/* A handle for an open of @in, on fs->handles until handle_free() (fs->lock held for both). */
static struct wfs_handle *handle_new(struct wfs_fs *fs, struct wfs_inode *in, bool writable)
{
	struct wfs_handle *h = calloc(1, sizeof(*h));

	if (h) {
		h->inode = in;
		h->writable = writable;
		h->next = fs->handles;
		if (fs->handles)
			fs->handles->prev = h;
		fs->handles = h;
	}
	return h;
}

static void handle_free(struct wfs_fs *fs, struct wfs_handle *h)
{
	if (!h)
		return;
	if (h->prev)
		h->prev->next = h->next;
	else
		fs->handles = h->next;
	if (h->next)
		h->next->prev = h->prev;
	free(h);
}

static void wfs_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		       struct fuse_file_info *fi)
{
	struct wfs_fs *fs = fs_of(req);
	struct fuse_entry_param e;
	struct wfs_inode *in = NULL;
	struct wfs_handle *h = NULL;
	struct wfs_version *v;
	struct wfs_attr a;
	int ret;

	pthread_mutex_lock(&fs->lock);
	ret = do_mknode(fs, req, parent, name, S_IFREG | (mode & 07777), NULL, &a);
	if (ret)
		goto out;
	in = wfs_inode_get(fs, &a);
	h = in ? handle_new(fs, in, true) : NULL;
	v = h ? wfs_version_writer(fs, req, in, true, &ret) : NULL;
	if (!h)
		ret = -ENOMEM;
	if (!v) {
		handle_free(fs, h);
		undo_create(fs, req, parent, name);
		if (in)
			wfs_inode_maybe_free(fs, req, in);
		goto out;
	}
	start_writing(h, v); /* a created file is sealed at close even if nothing is written */
	wfs_version_put(v);
	ret = make_entry(fs, &a, &e);
	if (ret == 0) {
		in->nopen++;
		in->nwritable++;
		in->ncached++;
		fs->counters.opens_daemon++;
		fi->fh = (uintptr_t)h;
		fi->keep_cache = 0;
		fi->direct_io = fs->direct_writes; /* wfs_init: writes skip the FUSE page cache */
	}
out:
	pthread_mutex_unlock(&fs->lock);
	if (ret)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_create(req, &e, fi);
}

/*
 * Register @o as a passthrough backing file. Our descriptor is closed right after: the kernel holds
 * the file from then on, so open objects cost no descriptors here. fs->lock held. Returns 0 or -errno.
 */
static int object_backing(struct wfs_fs *fs, fuse_req_t req, struct wfs_object *o)
{
	int id, ret;

	if (o->backing_id)
		return 0;
	ret = wfs_object_open_fd(fs, o);
	if (ret)
		return ret;
	id = fuse_passthrough_open(req, o->fd);
	if (id <= 0) {
		wfs_log_once(&warned_passthrough, WFS_LOG_WARN,
			     "passthrough open failed (needs CAP_SYS_ADMIN and kernel >= 6.9): "
			     "the daemon serves reads from now on");
		atomic_store(&fs->passthrough, false);
		return -EOPNOTSUPP;
	}
	o->backing_id = id;
	close(o->fd);
	o->fd = -1;
	return 0;
}

/* The CLOCK_REALTIME time @ms milliseconds from now, for pthread_cond_timedwait(). */
static struct timespec deadline_in(long ms)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	t.tv_nsec += ms * 1000 * 1000;
	t.tv_sec += t.tv_nsec / 1000000000;
	t.tv_nsec %= 1000000000;
	return t;
}

/*
 * close(2) returns before the kernel's RELEASE reaches us, so a handle that was just closed may still
 * count in @count (in->npassthrough or in->ncached). Give pending releases up to @ms milliseconds
 * before deciding how to open. fs->lock held (dropped while waiting); @in stays, the kernel holds a
 * lookup on it.
 */
static void wait_released(struct wfs_fs *fs, const unsigned *count, long ms)
{
	struct timespec deadline;

	if (*count == 0)
		return;
	deadline = deadline_in(ms);
	while (*count > 0)
		if (pthread_cond_timedwait(&fs->sealed, &fs->lock, &deadline) == ETIMEDOUT)
			break;
}

/*
 * A name open read-only through passthrough has its backing file fixed in the kernel, so its content
 * may not change under those readers: a writable open, a truncate or a claim waits up to 500 ms for
 * readers that are closing, then fails with ETXTBSY (logged once). fs->lock held (dropped while
 * waiting). Returns 0 or -ETXTBSY.
 */
static int no_passthrough_readers(struct wfs_fs *fs, struct wfs_inode *in)
{
	wait_released(fs, &in->npassthrough, 500);
	if (in->npassthrough == 0)
		return 0;
	wfs_log_once(&warned_txtbsy, WFS_LOG_WARN,
		     "inode %llu: changed while open read-only through passthrough: ETXTBSY (write a new "
		     "name and rename it over this one instead)", (unsigned long long)in->ino);
	return -ETXTBSY;
}

static int open_read_only(struct wfs_fs *fs, fuse_req_t req, struct wfs_inode *in, struct wfs_handle *h,
			  struct fuse_file_info *fi)
{
	struct wfs_object *o;
	int ret;

	if (!in->sealed && !in->writer) {
		wfs_log_once(&warned_unsealed, WFS_LOG_WARN,
			     "inode %llu: never sealed (its writer failed or was killed): EIO",
			     (unsigned long long)in->ino);
		return -EIO;
	}
	/* The writer that just sealed this file may not be released yet: without the wait, a reader
	 * mapping a file right after writing it would be daemon-served for as long as it keeps it.
	 * Only closed handles are waited for: one still open (a long-lived O_RDWR opener) stays. */
	if (atomic_load(&fs->passthrough) && !in->writer && in->npassthrough == 0 &&
	    in->ncached == in->ncached_closed)
		wait_released(fs, &in->ncached, 100);
	if (in->npassthrough > 0) {
		/* All passthrough opens of an inode share one backing file (checked by the first). */
		o = in->pt_object;
		o->pins++;
	} else if (!in->writer) {
		o = wfs_object_pin(fs, &in->digest);
		if (!o)
			return -ENOMEM;
		ret = wfs_verify_object_for(fs, o, fuse_req_ctx(req)->pid); /* may drop fs->lock */
		if (ret) {
			wfs_object_unpin(fs, req, o);
			return ret;
		}
		if (in->npassthrough > 0 || in->writer || !wfs_digest_equal(&in->digest, &o->digest)) {
			wfs_object_unpin(fs, req, o); /* the inode changed meanwhile: decide again */
			return open_read_only(fs, req, in, h, fi);
		}
	} else {
		o = NULL; /* being written: daemon-served from the version */
	}
	h->object = o;
	if (o && (in->npassthrough > 0 ||
		  (atomic_load(&fs->passthrough) && !in->writer && in->ncached == 0 && !moved_pending(fs, in->ino)))) {
		ret = object_backing(fs, req, o);
		if (ret == 0) {
			h->passthrough = true;
			fi->backing_id = o->backing_id;
			fi->keep_cache = 0;
			in->pt_object = o;
			in->npassthrough++;
			return 0;
		}
		if (in->npassthrough > 0) {
			h->object = NULL;
			wfs_object_unpin(fs, req, o);
			return ret;
		}
	}
	/* Daemon-served: the kernel page cache of this inode may be kept when it holds this content. */
	fi->keep_cache = !in->writer && in->sealed && in->cache_valid &&
			 wfs_digest_equal(&in->cache_digest, &in->digest);
	if (!in->writer && in->sealed) {
		in->cache_valid = true;
		in->cache_digest = in->digest;
	}
	in->ncached++;
	return 0;
}

static int do_open(struct wfs_fs *fs, fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi,
		   struct kernel_news *news)
{
	bool truncate = fi->flags & O_TRUNC;
	bool writable = (fi->flags & O_ACCMODE) != O_RDONLY || truncate;
	struct wfs_version *v;
	struct wfs_inode *in;
	struct wfs_handle *h;
	struct wfs_attr a;
	int ret;

	ret = wfs_catalog_getattr(fs->catalog, ino, &a);
	if (ret)
		return ret;
	if (S_ISDIR(a.mode))
		return -EISDIR;
	in = wfs_inode_get(fs, &a);
	if (!in)
		return -ENOMEM;
	/* A writer must reach the name's new inode: the kernel looks the name up again. A reader that
	 * looked the name up before it moved opens what it found, as an open racing a rename does. */
	if (in->replaced && writable)
		return -ESTALE;
	if (writable) {
		ret = move_from_readers(fs, in, a.nlink, news);
		if (ret == 1)
			return -ESTALE; /* the VFS retries on the name's new inode */
		if (ret < 0)
			return ret;
	}
	h = handle_new(fs, in, writable);
	if (!h)
		return -ENOMEM;
	if (writable) {
		ret = no_passthrough_readers(fs, in);
		if (ret) {
			handle_free(fs, h);
			return ret;
		}
		if (truncate) {
			v = wfs_version_writer(fs, req, in, true, &ret);
			if (!v) {
				handle_free(fs, h);
				return ret;
			}
			start_writing(h, v);
			wfs_version_put(v);
		}
		fi->keep_cache = 0;
		fi->direct_io = fs->direct_writes; /* wfs_init: writes skip the FUSE page cache */
		in->ncached++;
	} else {
		ret = open_read_only(fs, req, in, h, fi);
		if (ret) {
			if (h->object)
				wfs_object_unpin(fs, req, h->object);
			handle_free(fs, h);
			wfs_inode_maybe_free(fs, req, in);
			return ret;
		}
	}
	in->nopen++;
	in->nwritable += writable;
	fi->fh = (uintptr_t)h;
	if (h->passthrough)
		fs->counters.opens_passthrough++;
	else
		fs->counters.opens_daemon++;
	return 0;
}

static void wfs_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct wfs_fs *fs = fs_of(req);
	struct kernel_news news = {0};
	int ret;

	pthread_mutex_lock(&fs->lock);
	ret = do_open(fs, req, ino, fi, &news);
	pthread_mutex_unlock(&fs->lock);
	if (ret)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_open(req, fi);
	news_send(fs, &news); /* a moved name: other processes' cached dentries go too */
}

/*
 * Where a daemon-served read of @h reads from now: the version being written (referenced into *@v),
 * or the inode's current object (pinned in h->object, with a descriptor). fs->lock held.
 */
static int read_source(struct wfs_fs *fs, fuse_req_t req, struct wfs_handle *h, struct wfs_version **v)
{
	struct wfs_inode *in = h->inode;
	struct wfs_object *o;

	*v = NULL;
	if (in->writer) {
		wfs_version_get(in->writer);
		*v = in->writer;
		return 0;
	}
	if (!in->sealed)
		return -EIO;
	if (!h->object || !wfs_digest_equal(&h->object->digest, &in->digest)) {
		int ret;

		o = wfs_object_pin(fs, &in->digest);
		if (!o)
			return -ENOMEM;
		ret = wfs_verify_object_for(fs, o, fuse_req_ctx(req)->pid); /* may drop fs->lock: the caller
									   * retries on -EAGAIN */
		if (ret == 0 && (in->writer || !wfs_digest_equal(&in->digest, &o->digest)))
			ret = -EAGAIN;
		if (ret) {
			wfs_object_unpin(fs, req, o);
			return ret;
		}
		if (h->object)
			wfs_object_unpin(fs, req, h->object);
		h->object = o;
	}
	return wfs_object_open_fd(fs, h->object);
}

static ssize_t do_read(struct wfs_fs *fs, fuse_req_t req, struct wfs_handle *h, char *buf, size_t size,
		       off_t off)
{
	struct wfs_version *v;
	ssize_t n;
	int fd;

	for (;;) {
		pthread_mutex_lock(&fs->lock);
		do
			n = read_source(fs, req, h, &v);
		while (n == -EAGAIN);
		fd = h->object ? h->object->fd : -1;
		pthread_mutex_unlock(&fs->lock);
		if (n)
			return n;
		if (!v)
			break;
		n = wfs_version_read(v, buf, size, off);
		if (n == -EAGAIN) {
			pthread_mutex_lock(&fs->lock);
			while (h->inode->writer == v)
				pthread_cond_wait(&fs->sealed, &fs->lock);
			pthread_mutex_unlock(&fs->lock);
		}
		wfs_version_put(v);
		if (n != -EAGAIN)
			return n;
	}
	/* The descriptor stays valid: h->object is pinned by this handle until release. */
	n = pread(fd, buf, size, off);
	if (n < 0)
		return -errno;
	/* Without passthrough the kernel caches these bytes for the FUSE inode; a second copy in the
	 * backing file's page cache would only double the memory. */
	posix_fadvise(fd, off, (off_t)n, POSIX_FADV_DONTNEED);
	return n;
}

static void wfs_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	struct wfs_fs *fs = fs_of(req);
	char *buf = malloc(size ? size : 1);
	ssize_t n;

	(void)ino;
	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	n = do_read(fs, req, handle_of(fi), buf, size, off);
	if (n < 0)
		fuse_reply_err(req, (int)-n);
	else
		fuse_reply_buf(req, buf, (size_t)n);
	free(buf);
}

/*
 * A write by an unprivileged user clears the set-user-ID bit, and the set-group-ID bit of a
 * group-executable file, as every local filesystem does (should_remove_suid()). Writable opens are
 * direct I/O, where the kernel leaves that to the daemon, and libfuse does not pass the kernel's
 * FUSE_WRITE_KILL_SUIDGID: uid 0 stands for CAP_FSETID. Once per handle, at its first write.
 * fs->lock held. Returns true when the mode changed (the kernel's cached attributes are stale).
 */
static bool drop_privs(struct wfs_fs *fs, fuse_req_t req, struct wfs_handle *h)
{
	struct wfs_attr a, set = {0}, out;
	uint32_t kill;

	if (h->privs_dropped)
		return false;
	h->privs_dropped = true;
	if (fuse_req_ctx(req)->uid == 0 || wfs_catalog_getattr(fs->catalog, h->inode->ino, &a))
		return false;
	kill = (a.mode & S_ISUID) | ((a.mode & (S_ISGID | S_IXGRP)) == (S_ISGID | S_IXGRP) ? S_ISGID : 0);
	if (!kill)
		return false;
	set.mode = a.mode & ~kill;
	return wfs_catalog_setattr(fs->catalog, h->inode->ino, &set, WFS_ATTR_MODE, &out) == 0;
}

static ssize_t do_write(struct wfs_fs *fs, fuse_req_t req, struct wfs_handle *h, const char *buf, size_t size,
		       off_t off)
{
	struct wfs_version *v;
	bool inval = false;
	ssize_t n;
	int ret;

	if (!h->writable)
		return -EBADF;
	pthread_mutex_lock(&fs->lock);
	inval = drop_privs(fs, req, h);
	pthread_mutex_unlock(&fs->lock);
	if (inval)
		fuse_lowlevel_notify_inval_inode(fs->se, h->inode->ino, -1, 0); /* attributes only */
	do {
		pthread_mutex_lock(&fs->lock);
		v = wfs_version_writer(fs, req, h->inode, false, &ret);
		if (v) {
			start_writing(h, v); /* also after close: a shared mapping's writeback */
			h->writer_tid = fuse_req_ctx(req)->pid;
		}
		pthread_mutex_unlock(&fs->lock);
		if (!v)
			return ret;
		n = wfs_version_write(fs, v, buf, size, off);
		wfs_version_put(v);
	} while (n == -EAGAIN);
	return n;
}

static void wfs_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		      struct fuse_file_info *fi)
{
	ssize_t n = do_write(fs_of(req), req, handle_of(fi), buf, size, off);

	(void)ino;
	if (n < 0)
		fuse_reply_err(req, (int)-n);
	else
		fuse_reply_write(req, (size_t)n);
}

/*
 * fallocate(2) through a writable handle: space reserved in the version being written, so a full
 * store fails here and not at close(2). A size change is held to dtype/shape now, as ftruncate(2)
 * is. Modes other than 0 and FALLOC_FL_KEEP_SIZE: -EOPNOTSUPP (wfs_version_fallocate()).
 */
static int do_fallocate(struct wfs_fs *fs, fuse_req_t req, struct wfs_handle *h, int mode, off_t off,
			off_t len)
{
	struct wfs_inode *in = h->inode;
	struct wfs_version *v;
	struct wfs_attr a;
	uint64_t size;
	int ret;

	if (!h->writable)
		return -EBADF;
	if (mode & ~FALLOC_FL_KEEP_SIZE)
		return -EOPNOTSUPP;
	if (off < 0 || len <= 0)
		return -EINVAL;
	do {
		pthread_mutex_lock(&fs->lock);
		ret = 0;
		if (!(mode & FALLOC_FL_KEEP_SIZE)) {
			size = in->writer ? wfs_version_size(in->writer) : 0;
			if (!in->writer && (ret = wfs_catalog_getattr(fs->catalog, in->ino, &a)) == 0)
				size = a.size;
			if (ret == 0 && (uint64_t)off + (uint64_t)len > size)
				ret = wfs_tensor_fits(fs, in->ino, (uint64_t)off + (uint64_t)len, NULL, NULL, 0,
						      "fallocate refused");
		}
		v = ret ? NULL : wfs_version_writer(fs, req, in, false, &ret);
		if (v) {
			start_writing(h, v); /* sealed at this handle's close */
			h->writer_tid = fuse_req_ctx(req)->pid;
		}
		pthread_mutex_unlock(&fs->lock);
		if (!v)
			return ret;
		ret = wfs_version_fallocate(fs, v, mode, (uint64_t)off, (uint64_t)len);
		wfs_version_put(v);
	} while (ret == -EAGAIN);
	return ret;
}

static void wfs_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len,
			  struct fuse_file_info *fi)
{
	(void)ino;
	fuse_reply_err(req, -do_fallocate(fs_of(req), req, handle_of(fi), mode, off, len));
}

/* The most one copy_file_range reply reports: its count travels in 32 bits. */
#define COPY_RANGE_MAX ((size_t)1 << 30) /* bytes */

/*
 * copy_file_range(2) of a whole sealed file onto an empty one (what cp does): the destination
 * claims the source's object, so no byte moves; each name keeps its own attributes and xattrs.
 * The caller has the source open for reading, which is all a claim by digest would prove. Returns
 * the bytes the destination now holds (> 0), or 0 when this is not such a copy. fs->lock held.
 */
static ssize_t copy_by_claim(struct wfs_fs *fs, fuse_req_t req, struct wfs_inode *src, off_t off_in,
			     struct wfs_inode *dst, off_t off_out, size_t len)
{
	struct wfs_digest d = src->digest;
	struct wfs_attr a;

	if (off_in != 0 || off_out != 0 || !src->sealed || src->writer || src == dst ||
	    wfs_catalog_getattr(fs->catalog, src->ino, &a) || a.size == 0 || len < a.size)
		return 0;
	if (no_passthrough_readers(fs, dst) || wfs_version_claim(fs, req, dst, &d))
		return 0; /* not empty, being read, or the object did not check: copy the bytes */
	return (ssize_t)a.size;
}

/*
 * A range whose bytes the destination already holds: both sealed (nothing being written) as the
 * same object, at the same offset. The rest of a claimed copy past COPY_RANGE_MAX lands here.
 * Returns the bytes "copied" (> 0), or 0. fs->lock held.
 */
static ssize_t copy_same_object(struct wfs_fs *fs, struct wfs_inode *src, off_t off_in,
				struct wfs_inode *dst, off_t off_out, size_t len)
{
	struct wfs_attr a;

	if (off_in != off_out || !src->sealed || !dst->sealed || src->writer || dst->writer ||
	    !wfs_digest_equal(&src->digest, &dst->digest) || wfs_catalog_getattr(fs->catalog, src->ino, &a) ||
	    (uint64_t)off_in >= a.size)
		return 0;
	return (ssize_t)(len < a.size - (uint64_t)off_in ? len : a.size - (uint64_t)off_in);
}

static ssize_t do_copy_range(struct wfs_fs *fs, fuse_req_t req, struct wfs_handle *hin, off_t off_in,
			     struct wfs_handle *hout, off_t off_out, size_t len)
{
	size_t chunk = 1u << 20, done = 0;
	ssize_t n;
	char *buf;

	if (!hout->writable)
		return -EBADF;
	if (len > COPY_RANGE_MAX)
		len = COPY_RANGE_MAX;
	pthread_mutex_lock(&fs->lock);
	n = copy_by_claim(fs, req, hin->inode, off_in, hout->inode, off_out, len);
	if (n == 0)
		n = copy_same_object(fs, hin->inode, off_in, hout->inode, off_out, len);
	pthread_mutex_unlock(&fs->lock);
	if (n > 0)
		return n > (ssize_t)len ? (ssize_t)len : n;
	/* Partial ranges, a destination with bytes: read and write through the version. */
	buf = malloc(chunk);
	if (!buf)
		return -ENOMEM;
	while (done < len) {
		size_t want = len - done < chunk ? len - done : chunk;
		ssize_t r = do_read(fs, req, hin, buf, want, off_in + (off_t)done), w = 0;

		if (r <= 0) {
			n = r;
			break;
		}
		while (w < r) {
			n = do_write(fs, req, hout, buf + w, (size_t)(r - w), off_out + (off_t)done + w);
			if (n <= 0)
				break;
			w += n;
		}
		if (n < 0)
			break;
		done += (size_t)w;
		if (r < (ssize_t)want)
			break;
	}
	free(buf);
	return done ? (ssize_t)done : n;
}

static void wfs_copy_file_range(fuse_req_t req, fuse_ino_t ino_in, off_t off_in, struct fuse_file_info *fi_in,
				fuse_ino_t ino_out, off_t off_out, struct fuse_file_info *fi_out, size_t len,
				int flags)
{
	ssize_t n = flags ? -EINVAL
			  : do_copy_range(fs_of(req), req, handle_of(fi_in), off_in, handle_of(fi_out), off_out,
					  len);

	(void)ino_in;
	(void)ino_out;
	if (n < 0)
		fuse_reply_err(req, (int)-n);
	else
		fuse_reply_write(req, (size_t)n);
}

/* close(2): the last writable handle's flush seals, and its errors come back from close(2). */
static void wfs_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct wfs_fs *fs = fs_of(req);
	struct wfs_handle *h = handle_of(fi);
	struct kernel_news news = {0};
	int ret = 0;

	(void)ino;
	pthread_mutex_lock(&fs->lock);
	if (!h->closed && !h->passthrough) {
		h->closed = true;
		h->inode->ncached_closed++;
	}
	if (h->writing && wfs_writer_flush_ends(h->writing, h->writer_tid, fuse_req_ctx(req)->pid))
		ret = finish_writing(fs, req, h, false, &news);
	pthread_mutex_unlock(&fs->lock);
	/* Before the reply: once a killed writer's exit is seen, its name is gone from the kernel. */
	news_send(fs, &news);
	fuse_reply_err(req, -ret);
}

static void wfs_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct wfs_fs *fs = fs_of(req);
	struct wfs_handle *h = handle_of(fi);
	struct wfs_inode *in = h->inode;
	struct kernel_news news = {0};
	int ret;

	pthread_mutex_lock(&fs->lock);
	/* Writes after the last flush (a shared mapping written back at munmap) seal here; the
	 * kernel drops release errors, so they can only be logged. */
	ret = finish_writing(fs, req, h, true, &news);
	if (ret)
		wfs_log(WFS_LOG_ERR, "inode %llu: seal at release failed: %s", (unsigned long long)ino,
			strerror(-ret));
	if (h->passthrough) {
		if (--in->npassthrough == 0) {
			in->pt_object = NULL;
			pthread_cond_broadcast(&fs->sealed); /* a writable open may be waiting */
		}
	} else {
		in->ncached_closed -= h->closed;
		if (--in->ncached == 0)
			pthread_cond_broadcast(&fs->sealed); /* a read-only open may wait to go passthrough */
	}
	if (h->object)
		wfs_object_unpin(fs, req, h->object);
	assert(in->nopen > 0 && in->nwritable >= h->writable);
	in->nwritable -= h->writable;
	in->nopen--;
	wfs_inode_maybe_free(fs, req, in);
	handle_free(fs, h);
	pthread_mutex_unlock(&fs->lock);
	news_send(fs, &news);
	fuse_reply_err(req, 0);
}

static void wfs_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	struct wfs_fs *fs = fs_of(req);
	int ret;

	(void)ino, (void)datasync, (void)fi;
	/* Bytes become durable when sealed (at close); fsync makes the namespace durable: every
	 * commit so far, the WAL's fdatasync, without holding fs->lock. */
	ret = wfs_catalog_wal_sync(fs->catalog);
	fuse_reply_err(req, -ret);
}

static void wfs_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	wfs_fsync(req, ino, datasync, fi);
}

static void wfs_unlink_common(fuse_req_t req, fuse_ino_t parent, const char *name, bool dir)
{
	struct wfs_fs *fs = fs_of(req);
	uint64_t ino;
	int ret;

	pthread_mutex_lock(&fs->lock);
	ret = wfs_catalog_unlink(fs->catalog, parent, name, dir, &ino);
	if (ret == 0)
		wfs_inode_maybe_drop(fs, req, ino);
	pthread_mutex_unlock(&fs->lock);
	fuse_reply_err(req, -ret);
}

static void wfs_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	wfs_unlink_common(req, parent, name, false);
}

static void wfs_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	wfs_unlink_common(req, parent, name, true);
}

static void wfs_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
		       const char *newname, unsigned int flags)
{
	struct wfs_fs *fs = fs_of(req);
	uint64_t replaced = 0;
	int ret = check_name(newname);

	pthread_mutex_lock(&fs->lock);
	if (ret == 0)
		ret = wfs_catalog_rename(fs->catalog, parent, name, newparent, newname, flags, &replaced);
	if (ret == 0 && replaced)
		wfs_inode_maybe_drop(fs, req, replaced);
	pthread_mutex_unlock(&fs->lock);
	fuse_reply_err(req, -ret);
}

static void wfs_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
	struct wfs_fs *fs = fs_of(req);
	struct fuse_entry_param e;
	struct wfs_attr a;
	int ret = check_name(newname);

	pthread_mutex_lock(&fs->lock);
	if (ret == 0)
		ret = wfs_catalog_link(fs->catalog, ino, newparent, newname, &a);
	if (ret == 0)
		ret = make_entry(fs, &a, &e);
	pthread_mutex_unlock(&fs->lock);
	reply_entry_or_err(req, ret, &e);
}

static void wfs_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct wfs_fs *fs = fs_of(req);
	char buf[PATH_MAX];
	int ret;

	pthread_mutex_lock(&fs->lock);
	ret = wfs_catalog_readlink(fs->catalog, ino, buf, sizeof(buf));
	pthread_mutex_unlock(&fs->lock);
	if (ret)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_readlink(req, buf);
}

static void wfs_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct wfs_fs *fs = fs_of(req);
	struct wfs_attr a;
	int ret;

	pthread_mutex_lock(&fs->lock);
	ret = wfs_catalog_getattr(fs->catalog, ino, &a);
	pthread_mutex_unlock(&fs->lock);
	if (ret == 0 && !S_ISDIR(a.mode))
		ret = -ENOTDIR;
	if (ret) {
		fuse_reply_err(req, -ret);
		return;
	}
	fi->fh = 0;
	fuse_reply_open(req, fi);
}

static void wfs_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino, (void)fi;
	fuse_reply_err(req, 0);
}

/*
 * readdir offsets: 1 after ".", 2 after "..", then catalog cookie + 2 after each entry, so a later
 * call resumes after the last entry returned even when entries are added or removed meanwhile.
 */
struct dirbuf {
	struct wfs_fs *fs;
	fuse_req_t req;
	bool plus;
	char *buf;
	size_t size, used;
};

static bool dirbuf_add(struct dirbuf *d, const char *name, const struct stat *st,
		       const struct fuse_entry_param *e, off_t next)
{
	size_t n;

	if (d->plus)
		n = fuse_add_direntry_plus(d->req, d->buf + d->used, d->size - d->used, name, e, next);
	else
		n = fuse_add_direntry(d->req, d->buf + d->used, d->size - d->used, name, st, next);
	if (n > d->size - d->used)
		return false;
	d->used += n;
	return true;
}

static int dirbuf_entry(void *ctx, const char *name, const struct wfs_attr *a, uint64_t cookie)
{
	struct dirbuf *d = ctx;
	struct fuse_entry_param e;
	struct wfs_inode *in;

	if (!d->plus) {
		memset(&e, 0, sizeof(e));
		attr_to_stat(a, wfs_inode_find(d->fs, a->ino), &e.attr);
		return !dirbuf_add(d, name, &e.attr, NULL, (off_t)(cookie + 2));
	}
	/* readdirplus hands the kernel a lookup reference per entry: count it only if it fit. */
	if (make_entry(d->fs, a, &e))
		return 1;
	if (dirbuf_add(d, name, &e.attr, &e, (off_t)(cookie + 2)))
		return 0;
	in = wfs_inode_find(d->fs, a->ino);
	in->nlookup--;
	wfs_inode_maybe_free(d->fs, d->req, in);
	return 1;
}

static void readdir_common(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus)
{
	struct wfs_fs *fs = fs_of(req);
	struct dirbuf d = {.fs = fs, .req = req, .plus = plus, .size = size};
	struct fuse_entry_param e;
	struct wfs_attr a;
	int ret;

	d.buf = malloc(size ? size : 1);
	if (!d.buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	pthread_mutex_lock(&fs->lock);
	ret = wfs_catalog_getattr(fs->catalog, ino, &a);
	if (ret == 0 && !S_ISDIR(a.mode))
		ret = -ENOTDIR;
	memset(&e, 0, sizeof(e));
	/* "." and ".." carry no lookup reference (the kernel skips them in readdirplus). */
	if (ret == 0 && off < 1) {
		e.attr.st_ino = a.ino;
		e.attr.st_mode = S_IFDIR;
		if (!dirbuf_add(&d, ".", &e.attr, &e, 1))
			goto done;
	}
	if (ret == 0 && off < 2) {
		e.attr.st_ino = a.parent ? a.parent : a.ino;
		e.attr.st_mode = S_IFDIR;
		if (!dirbuf_add(&d, "..", &e.attr, &e, 2))
			goto done;
	}
	if (ret == 0)
		ret = wfs_catalog_readdir(fs->catalog, ino, off > 2 ? (uint64_t)off - 2 : 0, dirbuf_entry, &d);
done:
	pthread_mutex_unlock(&fs->lock);
	if (ret)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_buf(req, d.buf, d.used);
	free(d.buf);
}

static void wfs_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)fi;
	readdir_common(req, ino, size, off, false);
}

static void wfs_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			    struct fuse_file_info *fi)
{
	(void)fi;
	readdir_common(req, ino, size, off, true);
}

static void wfs_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct wfs_fs *fs = fs_of(req);
	struct statvfs st;
	int ret;

	(void)ino;
	ret = wfs_store_statfs(fs->store, &st);
	if (ret) {
		fuse_reply_err(req, -ret);
		return;
	}
	st.f_namemax = NAME_MAX;
	fuse_reply_statfs(req, &st);
}

/* Extended attributes: user.* stored in the catalog; user.weightfs.digest computed, read-only. */
static bool is_user_xattr(const char *name)
{
	return strncmp(name, "user.", 5) == 0;
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
	struct wfs_counters *k = &fs->counters;
	uint64_t verified, unverified;
	FILE *f;
	int ret;

	ret = wfs_catalog_stats(fs->catalog, &st);
	if (ret == 0)
		ret = wfs_verify_count(fs, &verified, &unverified);
	if (ret)
		return ret;
	f = open_memstream(text, len);
	if (!f)
		return -ENOMEM;
	fprintf(f, "{\"names\": %" PRIu64 ", \"directories\": %" PRIu64 ", \"symlinks\": %" PRIu64
		", \"logical_bytes\": %" PRIu64 ", \"objects\": %" PRIu64 ", \"physical_bytes\": %" PRIu64
		", \"dedup_ratio\": %.3f, \"retained_objects\": %" PRIu64 ", \"retained_bytes\": %" PRIu64
		", \"objects_verified\": %" PRIu64 ", \"objects_unverified\": %" PRIu64
		", \"objects_quarantined\": %" PRIu64 ", \"unsealed_files\": %" PRIu64
		", \"special_files\": %" PRIu64 ", \"passthrough\": %s, \"direct\": %s, \"verify\": \"%s\", \"since_mount\": {\"seals\": %" PRIu64
		", \"objects_published\": %" PRIu64 ", \"bytes_published\": %" PRIu64
		", \"dedup_hits\": %" PRIu64 ", \"claims\": %" PRIu64 ", \"claim_misses\": %" PRIu64
		", \"opens_passthrough\": %" PRIu64 ", \"opens_daemon\": %" PRIu64 ", \"opens_direct\": %" PRIu64
		", \"moved_from_readers\": %" PRIu64 ", \"checks_on_opener_node\": %" PRIu64
		", \"verify_failures\": %" PRIu64 "}}\n",
		st.names, st.directories, st.symlinks, st.logical_bytes, st.objects, st.object_bytes,
		st.object_bytes ? (double)st.logical_bytes / (double)st.object_bytes : 1.0,
		st.unreferenced_objects, st.unreferenced_bytes, verified, unverified, st.quarantined_objects,
		st.unsealed_files, st.special_files, atomic_load(&fs->passthrough) ? "true" : "false",
		wfs_direct_served(fs) ? "true" : "false", fs->opt.verify ? "open" : "none", k->seals, k->objects_published, k->bytes_published,
		k->dedup_hits, k->claims, k->claim_misses, k->opens_passthrough, k->opens_daemon,
		k->opens_direct, k->moved_from_readers, (uint64_t)atomic_load(&fs->checks_placed),
		k->verify_failures);
	if (fclose(f)) {
		free(*text);
		*text = NULL;
		return -ENOMEM;
	}
	return 0;
}

/*
 * A file closed with nothing written (touch, or created and given attributes only) is sealed at its
 * release, which close(2) does not wait for: its digest asked for right after the close would be
 * missing. When every handle of @ino has been closed, give that seal up to 100 ms. fs->lock held
 * (dropped while waiting); the kernel holds a lookup on the inode.
 */
static void wait_release_seal(struct wfs_fs *fs, fuse_ino_t ino)
{
	struct wfs_inode *in = wfs_inode_find(fs, ino);
	struct timespec deadline = deadline_in(100);

	while (in && in->writer && in->ncached > 0 && in->ncached == in->ncached_closed)
		if (pthread_cond_timedwait(&fs->sealed, &fs->lock, &deadline) == ETIMEDOUT)
			break;
}

static void wfs_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	struct wfs_fs *fs = fs_of(req);
	char *buf = NULL;
	size_t len = 0;
	struct wfs_attr a;
	int ret;

	if (!is_user_xattr(name)) {
		fuse_reply_err(req, ENODATA); /* security.*, system.*: none stored */
		return;
	}
	if (size && !(buf = malloc(size))) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	pthread_mutex_lock(&fs->lock);
	if (ino == FUSE_ROOT_ID && strcmp(name, WFS_XATTR_STATS) == 0) {
		char *text = NULL;

		ret = stats_json(fs, &text, &len);
		if (ret == 0 && size >= len)
			memcpy(buf, text, len);
		free(text);
	} else if (strcmp(name, WFS_XATTR_DIRECT) == 0) {
		ret = wfs_direct_xattr(fs, buf, size, &len); /* any file: where to ask for its object */
	} else if (strcmp(name, WFS_XATTR_DIGEST) == 0) {
		char hex[WFS_DIGEST_HEX_CHARS + 1];

		wait_release_seal(fs, ino);
		ret = wfs_catalog_getattr(fs->catalog, ino, &a);
		if (ret == 0 && !a.sealed)
			ret = -ENODATA;
		if (ret == 0) {
			wfs_digest_to_hex(&a.digest, hex);
			len = WFS_DIGEST_HEX_CHARS;
			if (size >= len)
				memcpy(buf, hex, len);
		}
	} else {
		ret = wfs_catalog_xattr_get(fs->catalog, ino, name, buf, size, &len);
	}
	pthread_mutex_unlock(&fs->lock);
	reply_xattr(req, ret, size, buf, len);
	free(buf);
}


/*
 * user.weightfs.dtype (a safetensors dtype name) and user.weightfs.shape (a JSON array) describe the
 * tensor a file holds: each must parse, and with both set on a sealed file, elements × dtype bytes
 * must equal the file's size. fs->lock held. Returns 0 or -EINVAL (logged: what did not fit).
 */
static int check_tensor_xattr(struct wfs_fs *fs, fuse_ino_t ino, const char *name, const char *value,
			      size_t size)
{
	bool is_dtype = strcmp(name, WFS_XATTR_DTYPE) == 0;
	uint64_t elements;
	struct wfs_attr a;
	int ret;

	/* Longer values than these cannot be valid (32 dimensions of 20 digits), and the seal reads
	 * them back into buffers of these sizes. */
	if (size >= (is_dtype ? 64u : 1024u) ||
	    (is_dtype ? wfs_dtype_size(value, size) < 0 : wfs_shape_elements(value, size, &elements) < 0)) {
		wfs_log(WFS_LOG_WARN, "inode %llu: %s=\"%.*s\" refused: %s", (unsigned long long)ino, name,
			(int)(size < 64 ? size : 64), value,
			is_dtype ? "not a safetensors dtype (BF16, F16, F32, I8, U8, BOOL, F8_E4M3, ...)"
				 : "not a shape like [4096,1024]");
		return -EINVAL;
	}
	ret = wfs_catalog_getattr(fs->catalog, ino, &a);
	/* A file being written is held to its attributes when it is sealed; so is an empty one, which
	 * tar (mknod, attributes, then the bytes) and a digest claim fill only after this. */
	if (ret || !a.sealed || !S_ISREG(a.mode) || a.size == 0)
		return ret;
	return wfs_tensor_fits(fs, ino, a.size, name, value, size,
			       is_dtype ? WFS_XATTR_DTYPE " refused" : WFS_XATTR_SHAPE " refused");
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
 * wfs_version_claim() for the errors. Only the mounting user (or root) may claim: with allow_other,
 * naming a digest would otherwise read any object in the store without permission to any of its
 * names. A trailing newline (`setfattr -v "$(xxhsum -H2 ...)"`, echo) is accepted.
 */
static int claim(struct wfs_fs *fs, fuse_req_t req, fuse_ino_t ino, const char *value, size_t size)
{
	struct wfs_digest d;
	struct wfs_inode *in;
	struct wfs_attr a;
	int ret;

	ret = digest_request(req, value, size, &d);
	if (ret)
		return ret;
	pthread_mutex_lock(&fs->lock);
	ret = wfs_catalog_getattr(fs->catalog, ino, &a);
	if (ret == 0 && !S_ISREG(a.mode))
		ret = -EINVAL;
	in = ret == 0 ? wfs_inode_get(fs, &a) : NULL;
	if (ret == 0 && !in)
		ret = -ENOMEM;
	if (in) {
		ret = no_passthrough_readers(fs, in);
		if (ret == 0)
			ret = wfs_version_claim(fs, req, in, &d);
		wfs_inode_maybe_free(fs, req, in);
	}
	pthread_mutex_unlock(&fs->lock);
	return ret;
}

/*
 * setxattr of the computed user.weightfs.digest: a copy made by an older weightfs (which listed it)
 * carries it as a plain attribute, and tar or rsync set it back. The same value as the file's own
 * digest changes nothing: 1 (succeed, store nothing). Any other value: -EPERM (the digest is
 * computed). fs->lock not held.
 */
static int digest_unchanged(struct wfs_fs *fs, fuse_ino_t ino, const char *value, size_t size)
{
	char hex[WFS_DIGEST_HEX_CHARS + 1];
	struct wfs_attr a;
	int ret;

	if (size > 0 && value[size - 1] == '\n')
		size--;
	if (size != WFS_DIGEST_HEX_CHARS)
		return -EPERM;
	pthread_mutex_lock(&fs->lock);
	wait_release_seal(fs, ino);
	ret = wfs_catalog_getattr(fs->catalog, ino, &a);
	pthread_mutex_unlock(&fs->lock);
	if (ret || !a.sealed)
		return -EPERM;
	wfs_digest_to_hex(&a.digest, hex);
	return strncasecmp(hex, value, size) == 0 ? 1 : -EPERM;
}

static void wfs_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value, size_t size,
			 int flags)
{
	struct wfs_fs *fs = fs_of(req);
	int ret = 0;

	if (!is_user_xattr(name))
		ret = -EOPNOTSUPP;
	else if (strcmp(name, WFS_XATTR_DIGEST) == 0)
		ret = digest_unchanged(fs, ino, value, size);
	else if (strcmp(name, WFS_XATTR_STATS) == 0 || strcmp(name, WFS_XATTR_DIRECT) == 0 ||
		 (ino != FUSE_ROOT_ID && strcmp(name, WFS_XATTR_RECHECK) == 0))
		ret = -EPERM; /* computed, or a request only the mount root takes */
	if (ret == 1) {
		fuse_reply_err(req, 0);
		return;
	}
	if (ret == 0 && ino == FUSE_ROOT_ID && strcmp(name, WFS_XATTR_RECHECK) == 0) {
		struct wfs_digest d;

		ret = digest_request(req, value, size, &d);
		if (ret == 0) {
			pthread_mutex_lock(&fs->lock);
			ret = wfs_verify_recheck(fs, req, &d);
			pthread_mutex_unlock(&fs->lock);
		}
		fuse_reply_err(req, -ret);
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
		pthread_mutex_lock(&fs->lock);
		if (strcmp(name, WFS_XATTR_DTYPE) == 0 || strcmp(name, WFS_XATTR_SHAPE) == 0) {
			wait_release_seal(fs, ino); /* judge the file as close(2) left it */
			ret = check_tensor_xattr(fs, ino, name, value, size);
		}
		if (ret == 0)
			ret = wfs_catalog_xattr_set(fs->catalog, ino, name, value, size, flags);
		pthread_mutex_unlock(&fs->lock);
	}
	fuse_reply_err(req, -ret);
}

/*
 * Only stored attributes are listed. The computed ones (user.weightfs.digest, user.weightfs.stats)
 * are read by name, as other filesystems hide theirs: a listed one would be copied out by `cp -a`,
 * `rsync -X` and tar as a plain attribute, and rsync would try to remove it (EPERM) from every file
 * whose source lacks it.
 */
static void wfs_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	struct wfs_fs *fs = fs_of(req);
	char *buf = NULL;
	size_t len = 0;
	int ret;

	if (size && !(buf = malloc(size))) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	pthread_mutex_lock(&fs->lock);
	ret = wfs_catalog_xattr_list(fs->catalog, ino, buf, size, &len);
	pthread_mutex_unlock(&fs->lock);
	reply_xattr(req, ret, size, buf, len);
	free(buf);
}

static void wfs_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	struct wfs_fs *fs = fs_of(req);
	int ret = 0;

	if (!is_user_xattr(name))
		ret = -ENODATA;
	else if (strcmp(name, WFS_XATTR_DIGEST) == 0 || strcmp(name, WFS_XATTR_STATS) == 0 ||
		 strcmp(name, WFS_XATTR_DIRECT) == 0)
		ret = -EPERM;
	if (ret == 0) {
		pthread_mutex_lock(&fs->lock);
		ret = wfs_catalog_xattr_remove(fs->catalog, ino, name);
		pthread_mutex_unlock(&fs->lock);
	}
	fuse_reply_err(req, -ret);
}

const struct fuse_lowlevel_ops wfs_ops = {
	.init = wfs_init,
	.destroy = wfs_destroy,
	.lookup = wfs_lookup,
	.forget = wfs_forget,
	.forget_multi = wfs_forget_multi,
	.getattr = wfs_getattr,
	.setattr = wfs_setattr,
	.readlink = wfs_readlink,
	.mknod = wfs_mknod,
	.mkdir = wfs_mkdir,
	.unlink = wfs_unlink,
	.rmdir = wfs_rmdir,
	.symlink = wfs_symlink,
	.rename = wfs_rename,
	.link = wfs_link,
	.open = wfs_open,
	.read = wfs_read,
	.write = wfs_write,
	.fallocate = wfs_fallocate,
	.copy_file_range = wfs_copy_file_range,
	.flush = wfs_flush,
	.release = wfs_release,
	.fsync = wfs_fsync,
	.opendir = wfs_opendir,
	.readdir = wfs_readdir,
	.readdirplus = wfs_readdirplus,
	.releasedir = wfs_releasedir,
	.fsyncdir = wfs_fsyncdir,
	.statfs = wfs_statfs,
	.setxattr = wfs_setxattr,
	.getxattr = wfs_getxattr,
	.listxattr = wfs_listxattr,
	.removexattr = wfs_removexattr,
	.create = wfs_create,
};
