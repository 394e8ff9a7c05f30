/* SPDX-License-Identifier: Apache-2.0 */
/*
 * FUSE low-level handlers (ops.h): parse the request, call the core (fs/core/), reply once. Namespace
 * work happens under fs->lock; what the kernel must hear afterwards goes out once it is dropped.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/capability.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "daemon.h"
#include "fault.h"
#include "fileio.h"
#include "filelock.h"
#include "inode.h"
#include "clock.h"
#include "log.h"
#include "mounts.h"
#include "openmode.h"
#include "ops.h"
#include "receive.h"
#include "seal.h"
#include "takeover.h"
#include "upgrade.h"
#include "version.h"

/*
 * A handle goes to the kernel in an open's or a create's reply and comes back in the requests on
 * that file, which other request threads may serve. The kernel orders them, out of ThreadSanitizer's
 * sight: it sees no lock between the open's last use of the handle and a write's lock-free read of
 * it, or the release's free. handoff_release() at the end of set_open_reply() and handoff_acquire()
 * in handle_of() tell it that edge; in other builds they are nothing.
 */
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define handoff_release(h) __tsan_release(h)
#define handoff_acquire(h) __tsan_acquire(h)
#else
#define handoff_release(h) ((void)(h))
#define handoff_acquire(h) ((void)(h))
#endif

#define BLKSIZE (1u << 20) /* st_blksize: large, so cp and friends write in big pieces */

/*
 * The kernel's passthrough ioctls on /dev/fuse (include/uapi/linux/fuse.h, Linux 6.9), which
 * libfuse's fuse_passthrough_open()/close() wrap for a request; the session's descriptor is the one
 * they use.
 */
struct backing_map {
	int32_t fd;       /* cppcheck-suppress unusedStructMember ; read by the kernel */
	uint32_t flags;   /* cppcheck-suppress unusedStructMember ; read by the kernel */
	uint64_t padding; /* cppcheck-suppress unusedStructMember ; the kernel's layout */
};
#define DEV_IOC_BACKING_OPEN _IOW(229, 1, struct backing_map)
#define DEV_IOC_BACKING_CLOSE _IOW(229, 2, uint32_t)

static int backing_open(void *ctx, int fd)
{
	struct backing_map map = {.fd = fd};
	int id = wfs_takeover_backing_inherited(fd); /* after a takeover: the id the kernel has for it */

	if (id > 0)
		return id;
	id = ioctl(fuse_session_fd(ctx), DEV_IOC_BACKING_OPEN, &map);
	if (id > 0)
		wfs_takeover_backing_opened(id, fd);
	return id > 0 ? id : (id < 0 ? -errno : -EIO);
}

static void backing_close(void *ctx, int id)
{
	uint32_t backing_id = (uint32_t)id;

	if (wfs_takeover_backing_keep(id))
		return; /* a dead server's handles still use it */
	if (ioctl(fuse_session_fd(ctx), DEV_IOC_BACKING_CLOSE, &backing_id) < 0)
		wfs_log(WFS_LOG_WARN, "passthrough backing id %d: cannot release: %s", id, strerror(errno));
}

struct wfs_kernel wfs_ops_kernel(struct fuse_session *se)
{
	return (struct wfs_kernel){.backing_open = backing_open, .backing_close = backing_close, .ctx = se};
}

/*
 * The default -o readahead. Cold 1 GiB preads through a daemon-served mount on the H200 test machine,
 * 3 rounds each against native: 1 MiB 0.71x, 2 MiB 0.79x, 4 MiB 0.92x, 8 MiB 0.71x (the kernel's
 * 128 KiB: 0.80x, one small request in flight at a time).
 */
#define READAHEAD_DEFAULT (4u << 20)

/*
 * How far the kernel reads ahead in the mount's files when the daemon serves them (no passthrough):
 * -o readahead (fs->opt.readahead), by default READAHEAD_DEFAULT. The kernel's FUSE default of
 * 128 KiB keeps one small request in flight, and a cold sequential read runs at the round trip's
 * pace. Set through the mount's bdi in sysfs, which needs root; otherwise the kernel's default
 * stays (logged). Only after INIT: its reply sets the bdi's readahead to at most the kernel's offer,
 * 128 KiB. Files read through passthrough use their backing file's readahead, not this one.
 */
static void set_readahead(struct wfs_fs *fs)
{
	long kb = (long)((fs->opt.readahead >= 0 ? (uint64_t)fs->opt.readahead : READAHEAD_DEFAULT) / 1024);
	char dev[WFS_MOUNT_DEV_BYTES], path[96];
	bool ok = false;
	FILE *f;

	if (wfs_mounts_device(fs->opt.mountpoint, dev) != 0) {
		wfs_log(WFS_LOG_INFO, "readahead: %s is not in /proc/self/mountinfo: the kernel's default stays",
			fs->opt.mountpoint);
		return;
	}
	snprintf(path, sizeof(path), "/sys/class/bdi/%s/read_ahead_kb", dev);
	errno = 0;
	f = fopen(path, "we");
	if (f) {
		ok = fprintf(f, "%ld\n", kb) > 0;
		ok = fclose(f) == 0 && ok; /* sysfs takes the value at the flush */
	}
	if (!ok)
		wfs_log(fs->opt.readahead >= 0 ? WFS_LOG_WARN : WFS_LOG_INFO,
			"readahead: cannot set %s to %ld KiB (%s): the kernel's default stays", path, kb,
			strerror(errno ? errno : EIO));
	else
		wfs_log(WFS_LOG_DEBUG, "readahead: %ld KiB (%s)", kb, path);
}

static struct wfs_ops_tally own_requests[WFS_REQ_COUNT];
struct wfs_ops_tally *wfs_ops_requests = own_requests;

struct wfs_ops_timer wfs_ops_timer_start(enum wfs_ops_request op)
{
	atomic_fetch_add_explicit(&wfs_ops_requests[op].count, 1, memory_order_relaxed);
	return (struct wfs_ops_timer){.op = op, .start_ns = wfs_clock_ns()};
}

void wfs_ops_timer_stop(struct wfs_ops_timer *t)
{
	atomic_fetch_add_explicit(&wfs_ops_requests[t->op].ns, wfs_clock_ns() - t->start_ns,
				  memory_order_relaxed);
}

void wfs_ops_requests_json(json_t **counts, json_t **ms)
{
	static const char *const names[] = {
#define WFS_OPS_NAME(n) #n,
		WFS_OPS_REQUESTS(WFS_OPS_NAME)
#undef WFS_OPS_NAME
	};
	bool ok;

	*counts = json_object();
	*ms = json_object();
	ok = *counts && *ms;
	for (size_t i = 0; ok && i < WFS_REQ_COUNT; i++) {
		uint64_t n = atomic_load_explicit(&wfs_ops_requests[i].count, memory_order_relaxed);
		uint64_t ns = atomic_load_explicit(&wfs_ops_requests[i].ns, memory_order_relaxed);

		if (n)
			ok = json_object_set_new(*counts, names[i], json_integer((json_int_t)n)) == 0 &&
			     json_object_set_new(*ms, names[i], json_real((double)ns / 1e6)) == 0;
	}
	if (!ok) {
		json_decref(*counts);
		json_decref(*ms);
		*counts = *ms = NULL;
	}
}

static void release_orphans(struct wfs_fs *fs);

struct wfs_fs *wfs_ops_fs(fuse_req_t req)
{
	struct wfs_fs *fs = fuse_req_userdata(req);

	/* The first request after INIT: the kernel has processed INIT's reply (no other request is
	 * sent before that), which reset the readahead. */
	if (atomic_load_explicit(&fs->readahead_pending, memory_order_relaxed) &&
	    atomic_exchange(&fs->readahead_pending, false))
		set_readahead(fs);
	/* A successor's resend is over: the handles no resent request took go (takeover.h). */
	if (wfs_takeover_orphans_due())
		release_orphans(fs);
	return fs;
}

/* The handle in @fi; NULL for a handle of a server that died before a takeover (stale()). */
static struct wfs_handle *handle_of(const struct fuse_file_info *fi)
{
	struct wfs_handle *h = wfs_takeover_fh_handle(fi->fh);

	if (h)
		handoff_acquire(h);
	return h;
}

/*
 * Was @fi opened by a server that died (takeover.h)? Its handle died with it: a request on it is
 * answered without the core (stale_read(), or an error), never by following the pointer.
 */
static bool stale(const struct fuse_file_info *fi)
{
	return fi && wfs_takeover_fh_handle(fi->fh) == NULL;
}

/*
 * The answer to a request that changes the bytes of a file through a handle of a dead server: what
 * that handle wrote lived in the dead process (or its tmp file, which no successor can name), so
 * it is gone, and the writer must hear it rather than seal a part of it. Logged once.
 */
static int stale_write(void)
{
	static atomic_bool said;

	wfs_log_once(&said, WFS_LOG_WARN, "a write, truncate or close of a file opened for writing before "
		     "a takeover: what it wrote died with the old server; EIO to its writer (this is "
		     "logged once)");
	return -EIO;
}

/*
 * A daemon-served read through a handle of a dead server: sealed content is immutable, so the read
 * is served from the inode's object as it is now (an unsealed file's bytes died with the server:
 * EIO). Returns the bytes read into @buf or -errno.
 */
static ssize_t stale_read(struct wfs_fs *fs, fuse_ino_t ino, char *buf, size_t size, off_t off)
{
	struct wfs_attr a;
	ssize_t n;
	int ret, fd;

	wfs_lock(&fs->lock);
	ret = wfs_catalog_getattr(fs->catalog, ino, &a);
	wfs_unlock(&fs->lock);
	if (ret)
		return ret == -ENOENT ? -EIO : ret;
	if (!a.sealed)
		return stale_write();
	fd = wfs_store_object_open(fs->store, &a.digest, 0);
	if (fd < 0)
		return fd == -ENOENT ? -EIO : fd;
	n = pread(fd, buf, size, off);
	if (n < 0)
		n = -errno;
	close(fd);
	return n;
}

/* The thread that sent @req (the kernel's thread id, not the process id). */
static pid_t tid_of(fuse_req_t req)
{
	return fuse_req_ctx(req)->pid;
}

/* Who sent @req: its fsuid, fsgid and thread. */
static struct wfs_caller caller_of(fuse_req_t req)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);

	return (struct wfs_caller){.uid = ctx->uid, .gid = ctx->gid, .tid = ctx->pid};
}

void wfs_ops_news_send(struct wfs_fs *fs, struct wfs_news *k)
{
	for (size_t i = 0; i < k->n; i++) {
		const char *name = k->names[i].name;

		if (k->moved || fuse_lowlevel_notify_delete(fs->se, k->names[i].parent, k->ino, name,
							    strlen(name)) == -ENOSYS)
			fuse_lowlevel_notify_inval_entry(fs->se, k->names[i].parent, name, strlen(name));
	}
	if (k->inval)
		fuse_lowlevel_notify_inval_inode(fs->se, k->ino, 0, 0);
	else if (k->inval_attr)
		fuse_lowlevel_notify_inval_inode(fs->se, k->ino, -1, 0); /* a negative offset: attributes only */
	wfs_news_release(k);
}

/*
 * The notifier: news told after a reply, from a thread no request waits for. Telling the kernel a
 * dentry changed takes the directory's lock (fuse_reverse_inval_entry), which a caller's next
 * request in that directory may hold while it waits for a free request thread; with every request
 * thread telling, none is left to answer it (seen: ten batch claims in a row hung the mount). One
 * session per daemon process, so one notifier.
 */
struct news_item {
	struct news_item *next;
	struct wfs_news news;
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t more; /* an item was queued, or the notifier is to stop */
	struct news_item *head, **tail;
	struct wfs_fs *fs;
	pthread_t thread;
	bool started, stop;
} notifier = {.lock = PTHREAD_MUTEX_INITIALIZER, .more = PTHREAD_COND_INITIALIZER, .tail = &notifier.head};

static void *notifier_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&notifier.lock);
	for (;;) {
		struct news_item *it = notifier.head;

		if (!it) {
			if (notifier.stop)
				break;
			pthread_cond_wait(&notifier.more, &notifier.lock);
			continue;
		}
		notifier.head = it->next;
		if (!notifier.head)
			notifier.tail = &notifier.head;
		pthread_mutex_unlock(&notifier.lock);
		wfs_ops_news_send(notifier.fs, &it->news);
		free(it);
		pthread_mutex_lock(&notifier.lock);
	}
	pthread_mutex_unlock(&notifier.lock);
	return NULL;
}

int wfs_ops_notifier_start(struct wfs_fs *fs)
{
	int ret;

	notifier.fs = fs;
	notifier.stop = false;
	ret = pthread_create(&notifier.thread, NULL, notifier_main, NULL);
	if (ret)
		return -ret;
	notifier.started = true;
	return 0;
}

void wfs_ops_notifier_stop(void)
{
	if (!notifier.started)
		return;
	pthread_mutex_lock(&notifier.lock);
	notifier.stop = true;
	pthread_cond_signal(&notifier.more);
	pthread_mutex_unlock(&notifier.lock);
	pthread_join(notifier.thread, NULL); /* what was queued is told first */
	notifier.started = false;
}

void wfs_ops_news_post(struct wfs_fs *fs, struct wfs_news *news)
{
	struct news_item *it;

	if (!news->n && !news->inval)
		return;
	it = notifier.started ? malloc(sizeof(*it)) : NULL;
	if (!it) {
		wfs_ops_news_send(fs, news); /* no notifier: told here, as before it existed */
		return;
	}
	it->next = NULL;
	it->news = *news;
	*news = (struct wfs_news){0};
	pthread_mutex_lock(&notifier.lock);
	*notifier.tail = it;
	notifier.tail = &it->next;
	pthread_cond_signal(&notifier.more);
	pthread_mutex_unlock(&notifier.lock);
}

/* The reply to an open: how the kernel serves it (openmode.h). */
static void set_open_reply(struct fuse_file_info *fi, struct wfs_handle *h, const struct wfs_open_reply *r)
{
	fi->fh = wfs_takeover_fh(h, h->writable);
	/* Before the kernel knows it; unanswered until reply_open() has written the reply. */
	wfs_takeover_handle_opened(fi->fh, r->backing_id, h->inode->ino, wfs_receive_unique(), h->append);
	if (h->writable)
		wfs_upgrade_writer_opened(); /* an upgrade waits for it to be released */
	fi->backing_id = r->backing_id;
	fi->keep_cache = r->keep_cache;
	fi->direct_io = r->direct_io;
	fi->noflush = r->noflush;
	handoff_release(h); /* after the last use of @h here: the kernel has it next */
}

/*
 * st_blocks of @a (@in its entry, or NULL): the disk its data take, as on ext4, so that du counts a
 * sparse file's data and not its holes: its object file's allocation (wfs_inode_object_blocks());
 * @size rounded up for anything else (a file being written: wfs_version_stat()),
 * or when the object cannot be stat'ed (missing: its reads say EIO). Each name counts its object
 * whole, shared or not. fs->lock held (light holds too).
 */
static blkcnt_t file_blocks(struct wfs_fs *fs, const struct wfs_attr *a, struct wfs_inode *in, off_t size)
{
	int64_t blocks;

	if (S_ISREG(a->mode) && a->sealed && (blocks = wfs_inode_object_blocks(fs, in, &a->digest)) >= 0)
		return (blkcnt_t)blocks;
	return (blkcnt_t)(((uint64_t)size + 511) / 512);
}

/*
 * The reply to an open (@e NULL) or a create that gives the kernel the handle in @fi (set_open_reply()
 * or claim_open()), and what the takeover table must know of it: that the kernel may have it from
 * the write on, and that it has it once the write succeeded (takeover.h).
 */
static void reply_open(fuse_req_t req, const struct fuse_entry_param *e, const struct fuse_file_info *fi)
{
	int ret;

	wfs_delay("handle.recorded"); /* test-only: a kill lands between the handle's record and its reply */
	wfs_takeover_handle_replying(fi->fh);
	ret = e ? fuse_reply_create(req, e, fi) : fuse_reply_open(req, fi);
	wfs_delay("handle.answered"); /* test-only: a kill lands after the kernel has the handle */
	if (ret == 0)
		wfs_takeover_handle_answered(fi->fh);
}

/*
 * A resent OPEN or CREATE (@what) of inode @ino for writing, after a takeover: the handle the dead
 * server made for it and never answered, which this server adopted, goes into @fi (takeover.h,
 * wfs_takeover_claim()); false when there is none. A second handle would be a writer that no
 * release ever ends: its file would stay unsealed until the unmount. fs->lock held.
 */
static bool claim_open(struct wfs_fs *fs, uint64_t ino, struct fuse_file_info *fi, const char *what)
{
	struct wfs_open_reply r;
	struct wfs_handle *h;
	uint64_t fh;

	if (!wfs_receive_resent() || !(h = wfs_takeover_claim(wfs_receive_unique(), ino, &fh)))
		return false;
	wfs_openmode_adopted_reply(fs, h, &r);
	fi->fh = fh;
	fi->backing_id = r.backing_id;
	fi->keep_cache = r.keep_cache;
	fi->direct_io = r.direct_io;
	fi->noflush = r.noflush;
	wfs_log(WFS_LOG_INFO, "takeover: inode %llu: the resent %s gets the handle the dead server made for it",
		(unsigned long long)ino, what);
	handoff_release(h); /* the kernel has it next */
	return true;
}

/* stat(2) view of @a; a file being written shows the size and blocks written so far and the times
 * its seal will give it (the last write's, wfs_version_stat()). fs->lock held. */
static void attr_to_stat(struct wfs_fs *fs, const struct wfs_attr *a, struct wfs_inode *in, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = a->ino;
	st->st_mode = a->mode;
	st->st_nlink = a->nlink;
	st->st_uid = a->uid;
	st->st_gid = a->gid;
	st->st_rdev = (dev_t)a->rdev;
	st->st_size = (off_t)a->size;
	st->st_atim = a->atime;
	st->st_mtim = a->mtime;
	st->st_ctim = a->ctime;
	/* A version whose close refused its size (seal.h) is not what the name holds: until another
	 * descriptor changes it, or its release drops it, stat shows the name's content. */
	if (in && in->writer && !wfs_version_refused(in->writer))
		wfs_version_stat(in->writer, st); /* what the seal will give it (version.h) */
	else
		st->st_blocks = file_blocks(fs, a, in, st->st_size);
	st->st_blksize = BLKSIZE;
	if (in && in->writer)
		wfs_inode_tell(in, st); /* the seal may change what the kernel caches now (inode.h) */
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
	wfs_takeover_told_ino(a->ino); /* a successor numbers new inodes above it */
	e->attr_timeout = fs->opt.timeout;
	e->entry_timeout = fs->opt.timeout;
	attr_to_stat(fs, a, in, &e->attr);
	wfs_inode_lookup(in);
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

/*
 * May this process hand the kernel backing files? FUSE_DEV_IOC_BACKING_OPEN asks for CAP_SYS_ADMIN
 * (the kernel's fs/fuse/passthrough.c); without it every passthrough open fails. Unknown (capget
 * failed) counts as yes, and so does the capability in a user namespace only, which the kernel
 * refuses: the first open finds out (object.c) and the daemon serves from then on.
 */
static bool may_passthrough(void)
{
	struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
	struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];

	if (wfs_fault("init.cap-sys-admin")) /* test-only: a daemon without the capability */
		return false;
	if (syscall(SYS_capget, &hdr, data) != 0)
		return true;
	return (data[CAP_TO_INDEX(CAP_SYS_ADMIN)].effective & CAP_TO_MASK(CAP_SYS_ADMIN)) != 0;
}

static void wfs_init(void *userdata, struct fuse_conn_info *conn)
{
	struct wfs_fs *fs = userdata;

	/* Not asked for without the capability: user.weightfs.stats and weightfsctl stat then say
	 * "off" from the mount on, not after the first open failed. */
	if (fs->opt.passthrough != 0 && !may_passthrough())
		wfs_log(WFS_LOG_WARN, "kernel FUSE passthrough needs CAP_SYS_ADMIN (mount as root): the daemon "
			"serves reads and writes");
	else if (fs->opt.passthrough != 0 && fuse_set_feature_flag(conn, FUSE_CAP_PASSTHROUGH))
		atomic_store(&fs->passthrough, true);
	else if (fs->opt.passthrough != 0)
		wfs_log(WFS_LOG_WARN, "kernel FUSE passthrough unavailable: the daemon serves reads");
	/* Writeback caching would defer writes past close(2), where seal errors must be reported. */
	fuse_unset_feature_flag(conn, FUSE_CAP_WRITEBACK_CACHE);
	conn->max_write = WFS_WRITE_MAX;
	/* Writable opens are direct I/O: write(2) hands the caller's pages to the daemon instead of
	 * first copying them into the FUSE inode's page cache, one memory copy fewer (1.5x ingest
	 * measured). Mappings of a writable file still go through the page cache (allow_mmap). */
	fs->direct_writes = fuse_set_feature_flag(conn, FUSE_CAP_DIRECT_IO_ALLOW_MMAP);
	/* With FUSE_HANDLE_KILLPRIV_V2 the kernel marks the mount SB_NOSEC: a write(2) through
	 * passthrough asks for security.capability (a GETXATTR round trip) once per inode instead of
	 * every time, and the daemon clears set-user-ID bits itself (fileio.h). A successor asks what
	 * the connection's first server asked (takeover.h). */
	if (wfs_takeover_killpriv_granted())
		fs->killpriv_v2 = fuse_set_feature_flag(conn, FUSE_CAP_HANDLE_KILLPRIV_V2);
	else
		fuse_unset_feature_flag(conn, FUSE_CAP_HANDLE_KILLPRIV_V2);
	conn->time_gran = 1;
	/* Daemon-served reads of sealed files splice from the object (wfs_read). */
	fuse_set_feature_flag(conn, FUSE_CAP_SPLICE_WRITE);
	/* flock and POSIX locks are the daemon's (filelock.h), so that they follow a moved name. A
	 * successor answers as the kernel was first answered (a server of a build before them did
	 * not ask: the kernel keeps those locks itself). */
	if (wfs_takeover_locks_granted(false))
		fuse_set_feature_flag(conn, FUSE_CAP_POSIX_LOCKS);
	else
		fuse_unset_feature_flag(conn, FUSE_CAP_POSIX_LOCKS);
	if (wfs_takeover_locks_granted(true))
		fuse_set_feature_flag(conn, FUSE_CAP_FLOCK_LOCKS);
	else
		fuse_unset_feature_flag(conn, FUSE_CAP_FLOCK_LOCKS);
	atomic_store(&fs->readahead_pending, true);
}

static void wfs_destroy(void *userdata)
{
	struct wfs_fs *fs = userdata;

	wfs_lock(&fs->lock);
	wfs_catalog_sync(fs->catalog);
	wfs_unlock(&fs->lock);
}

static void wfs_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	WFS_OPS_COUNT(LOOKUP);
	struct wfs_fs *fs = wfs_ops_fs(req);
	struct fuse_entry_param e;
	struct wfs_news news = {0};
	struct wfs_attr a;
	int ret = check_name(name);

	wfs_lock(&fs->lock);
	if (ret == 0)
		ret = wfs_catalog_lookup(fs->catalog, parent, name, &a);
	if (ret == 0)
		ret = wfs_openmode_lookup(fs, &a, tid_of(req), &news); /* a writer's retry (openmode.h) */
	if (ret == 0)
		ret = make_entry(fs, &a, &e);
	if (ret == 0)
		wfs_inode_attr_note(fs, &a); /* read just now: the entry's inode is held from here */
	wfs_unlock(&fs->lock);
	if (ret == -ENOENT) {
		/* Negative entry: the kernel may cache the absence; creates go through us anyway. */
		memset(&e, 0, sizeof(e));
		e.entry_timeout = fs->opt.timeout;
		fuse_reply_entry(req, &e);
		return;
	}
	reply_entry_or_err(req, ret, &e);
	wfs_ops_news_send(fs, &news); /* the moved names' other dentries go */
}

static void wfs_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	WFS_OPS_COUNT(FORGET);
	struct wfs_fs *fs = wfs_ops_fs(req);

	wfs_lock(&fs->lock);
	wfs_inode_forget(fs, ino, nlookup);
	wfs_unlock(&fs->lock);
	fuse_reply_none(req);
}

static void wfs_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
	WFS_OPS_COUNT(BATCH_FORGET);
	struct wfs_fs *fs = wfs_ops_fs(req);

	wfs_lock(&fs->lock);
	for (size_t i = 0; i < count; i++)
		wfs_inode_forget(fs, forgets[i].ino, forgets[i].nlookup);
	wfs_unlock(&fs->lock);
	fuse_reply_none(req);
}

static void wfs_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	WFS_OPS_COUNT(GETATTR);
	struct wfs_fs *fs = wfs_ops_fs(req);
	struct wfs_inode *in;
	struct wfs_attr a;
	struct stat st;
	int ret;

	(void)fi;
	/* From memory when the catalog has not changed the inode since it was read (inode.h): also
	 * while fs->lock is lent to a commit (lock.h). */
	wfs_lock_light(&fs->lock);
	in = wfs_inode_find(fs, ino);
	if (in && wfs_inode_attr(fs, in, &a)) {
		ret = 0;
	} else {
		wfs_lock_ordinary(&fs->lock);
		ret = wfs_catalog_getattr(fs->catalog, ino, &a);
		if (ret == 0)
			wfs_inode_attr_note(fs, &a);
		in = wfs_inode_find(fs, ino);
	}
	if (ret == 0)
		attr_to_stat(fs, &a, in, &st);
	wfs_unlock(&fs->lock);
	if (ret)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_attr(req, &st, fs->opt.timeout);
}

/*
 * The kernel's FATTR_KILL_SUIDGID, which libfuse 3.17 passes on in to_set under the name of the bit
 * it shares (fuse_lowlevel.c, do_setattr()).
 */
#define SET_ATTR_KILL_SUIDGID FUSE_SET_ATTR_KILL_SUID
_Static_assert(SET_ATTR_KILL_SUIDGID == FATTR_KILL_SUIDGID, "libfuse passes FATTR_KILL_SUIDGID on as is");

/*
 * Does a SETATTR of @a by caller @c ask to clear set-user-ID and set-group-ID bits (fileio.h)? With
 * killpriv_v2, when it carries FATTR_KILL_SUIDGID, or carries nothing at all: the kernel's
 * fuse_setattr() takes ATTR_KILL_SUID, ATTR_KILL_SGID and the mode change they imply out of a
 * notify_change() and sends the rest, which for file_remove_privs() (a write, fallocate or
 * copy_file_range through passthrough by a user without CAP_FSETID) and chown(-1, -1) is nothing.
 * Not for a directory, whose chown keeps them (chown_common()). -EPERM when the bits would go but
 * @c may not change the mode (neither root nor the owner) and nothing has the file open for
 * writing: only a chown(-1, -1) sends that, and ext4 refuses it, the mode change that the kernel
 * took out being the owner's to make (setattr_prepare()). Returns 1 (clear them), 0 or -EPERM.
 * fs->lock held.
 */
static int setattr_kills_privs(struct wfs_fs *fs, const struct wfs_attr *a, int to_set, const struct wfs_caller *c)
{
	const struct wfs_inode *in;

	if (!fs->killpriv_v2 || S_ISDIR(a->mode))
		return 0;
	if (to_set & SET_ATTR_KILL_SUIDGID)
		return 1;
	if (to_set != 0)
		return 0;
	in = wfs_inode_find(fs, a->ino);
	if (c->uid == 0 || c->uid == a->uid || (in && in->io.nwritable > 0))
		return 1;
	return wfs_fileio_mode_killpriv(a->mode, a->gid, c) != a->mode ? -EPERM : 0;
}

static int do_setattr(struct wfs_fs *fs, fuse_ino_t ino, const struct stat *st, int to_set,
		      struct fuse_file_info *fi, const struct wfs_caller *c, struct stat *out, struct wfs_news *news)
{
	struct wfs_attr a, in_attr = {0};
	unsigned valid = 0;
	int ret, kill;

	ret = wfs_catalog_getattr(fs->catalog, ino, &a);
	if (ret)
		return ret;
	kill = setattr_kills_privs(fs, &a, to_set, c);
	if (kill < 0)
		return kill;
	if (to_set & FUSE_SET_ATTR_SIZE) {
		ret = wfs_fileio_truncate(fs, ino, fi ? handle_of(fi) : NULL, (uint64_t)st->st_size, c->tid, news);
		if (ret)
			return ret;
		if (a.size != (uint64_t)st->st_size && !(to_set & (FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_MTIME_NOW)))
			to_set |= FUSE_SET_ATTR_MTIME_NOW; /* as ftruncate(2) does, seal or not */
	}
	if (to_set & FUSE_SET_ATTR_MODE) {
		valid |= WFS_ATTR_MODE;
		in_attr.mode = st->st_mode;
	}
	if (kill) {
		uint32_t mode = valid & WFS_ATTR_MODE ? in_attr.mode : a.mode;
		uint32_t killed = wfs_fileio_mode_killpriv(mode, a.gid, c);

		if (killed != mode) {
			in_attr.mode = killed;
			valid |= WFS_ATTR_MODE;
		}
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
	if (ret == 0 && (valid & WFS_ATTR_MTIME))
		wfs_seal_set_mtime(fs, ino, &in_attr.mtime);
	if (ret == 0)
		attr_to_stat(fs, &a, wfs_inode_find(fs, ino), out);
	return ret;
}

static void wfs_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
			struct fuse_file_info *fi)
{
	WFS_OPS_COUNT(SETATTR);
	struct wfs_fs *fs = wfs_ops_fs(req);
	struct wfs_caller c = caller_of(req);
	struct wfs_news news = {0};
	struct stat st;
	int ret;

	if (stale(fi) && (to_set & FUSE_SET_ATTR_SIZE)) {
		fuse_reply_err(req, -stale_write());
		return;
	}
	if (stale(fi))
		fi = NULL; /* the attributes are the inode's, whoever asks */
	wfs_lock(&fs->lock);
	ret = do_setattr(fs, ino, attr, to_set, fi, &c, &st, &news);
	wfs_unlock(&fs->lock);
	/* A moved name is told after the reply: truncate(2) holds the old inode's lock meanwhile. */
	if (!news.moved)
		wfs_ops_news_send(fs, &news);
	if (ret)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_attr(req, &st, fs->opt.timeout);
	wfs_ops_news_send(fs, &news);
}

/* Owner of a new inode: the caller, with the group of a set-group-ID parent (as ext4 does). */
void wfs_ops_new_owner(struct wfs_fs *fs, fuse_req_t req, fuse_ino_t parent, uint32_t *mode, uint32_t *uid,
		       uint32_t *gid)
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

/*
 * A new catalog entry @name in directory @parent for @req's caller (wfs_ops_new_owner()), of type and
 * mode @mode (S_IFDIR | 0755, ...); @target for a symlink, else NULL. Its attributes into @a. fs->lock
 * held. Returns 0, -ENAMETOOLONG, -EEXIST, -ENOENT, -ENOTDIR, or an -errno of the catalog.
 */
static int mknode(struct wfs_fs *fs, fuse_req_t req, fuse_ino_t parent, const char *name, uint32_t mode,
		  const char *target, struct wfs_attr *a)
{
	uint32_t uid, gid;
	int ret = check_name(name);

	if (ret)
		return ret;
	wfs_ops_new_owner(fs, req, parent, &mode, &uid, &gid);
	return wfs_catalog_create(fs->catalog, parent, name, mode, uid, gid, target, a);
}

static void wfs_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	WFS_OPS_COUNT(MKDIR);
	struct wfs_fs *fs = wfs_ops_fs(req);
	struct fuse_entry_param e;
	struct wfs_attr a;
	int ret;

	wfs_lock(&fs->lock);
	ret = mknode(fs, req, parent, name, S_IFDIR | (mode & 07777), NULL, &a);
	/* Resent after a takeover: the dead server may have made it already (takeover.h). */
	if (ret == -EEXIST && wfs_receive_resent() && wfs_catalog_lookup(fs->catalog, parent, name, &a) == 0 &&
	    S_ISDIR(a.mode))
		ret = 0;
	if (ret == 0)
		ret = make_entry(fs, &a, &e);
	wfs_unlock(&fs->lock);
	reply_entry_or_err(req, ret, &e);
}

static void wfs_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
	WFS_OPS_COUNT(SYMLINK);
	struct wfs_fs *fs = wfs_ops_fs(req);
	struct fuse_entry_param e;
	struct wfs_attr a;
	int ret = strlen(link) >= PATH_MAX ? -ENAMETOOLONG : 0;

	wfs_lock(&fs->lock);
	if (ret == 0)
		ret = mknode(fs, req, parent, name, S_IFLNK | 0777, link, &a);
	if (ret == 0)
		ret = make_entry(fs, &a, &e);
	wfs_unlock(&fs->lock);
	reply_entry_or_err(req, ret, &e);
}

/* Remove entry @name of @parent made by mknode() that could not be completed. fs->lock held. */
static void undo_create(struct wfs_fs *fs, fuse_ino_t parent, const char *name)
{
	uint64_t ino;

	if (wfs_catalog_unlink(fs->catalog, parent, name, false, &ino) == 0)
		wfs_inode_maybe_drop(fs, ino);
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
	wfs_ops_new_owner(fs, req, parent, &m, &uid, &gid);
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
	WFS_OPS_COUNT(MKNOD);
	struct wfs_fs *fs = wfs_ops_fs(req);
	struct fuse_entry_param e;
	struct wfs_inode *in = NULL;
	struct wfs_attr a;
	int ret;

	if (!S_ISREG(mode)) {
		if (S_ISFIFO(mode) || S_ISSOCK(mode) || S_ISCHR(mode) || S_ISBLK(mode)) {
			wfs_lock(&fs->lock);
			ret = do_mkspecial(fs, req, parent, name, mode, rdev, &e);
			wfs_unlock(&fs->lock);
		} else {
			ret = -EINVAL;
		}
		reply_entry_or_err(req, ret, &e);
		return;
	}
	wfs_lock(&fs->lock);
	ret = mknode(fs, req, parent, name, S_IFREG | (mode & 07777), NULL, &a);
	if (ret == 0) {
		in = wfs_inode_get(fs, &a);
		ret = in ? 0 : -ENOMEM;
	}
	if (ret == 0) {
		ret = wfs_seal_empty(fs, in);
		if (ret == 0)
			ret = wfs_catalog_getattr(fs->catalog, a.ino, &a);
		if (ret == 0)
			ret = make_entry(fs, &a, &e);
		if (ret) {
			undo_create(fs, parent, name);
			wfs_inode_maybe_free(fs, in);
		}
	}
	wfs_unlock(&fs->lock);
	reply_entry_or_err(req, ret, &e);
}

static void wfs_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		       struct fuse_file_info *fi)
{
	WFS_OPS_COUNT(CREATE);
	struct wfs_fs *fs = wfs_ops_fs(req);
	struct fuse_entry_param e;
	struct wfs_open_reply r;
	struct wfs_inode *in;
	struct wfs_handle *h;
	struct wfs_attr a;
	int ret;

	wfs_lock(&fs->lock);
	ret = mknode(fs, req, parent, name, S_IFREG | (mode & 07777), NULL, &a);
	if (ret == -EEXIST && wfs_receive_resent() && wfs_catalog_lookup(fs->catalog, parent, name, &a) == 0 &&
	    S_ISREG(a.mode)) {
		/* Resent after a takeover: the dead server made the file for this request and died
		 * before its answer (takeover.h). The handle it made for it, if it recorded one, is the
		 * answer; else open what it made, as the create would have. */
		bool writable = (fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC);
		struct wfs_news news = {0};

		if (claim_open(fs, a.ino, fi, "create")) {
			ret = make_entry(fs, &a, &e); /* finds the handle's inode: cannot fail */
			assert(ret == 0);
		} else {
			ret = wfs_openmode_open(fs, a.ino, writable, fi->flags & ~O_EXCL, tid_of(req), &h, &r, &news);
			if (ret == 0)
				ret = make_entry(fs, &a, &e);
			if (ret == 0)
				set_open_reply(fi, h, &r);
		}
		wfs_unlock(&fs->lock);
		wfs_ops_news_send(fs, &news);
		if (ret)
			fuse_reply_err(req, -ret);
		else
			reply_open(req, &e, fi);
		return;
	}
	if (ret)
		goto out;
	in = wfs_inode_get(fs, &a);
	if (in)
		wfs_inode_pin(in); /* a seal's wait drops fs->lock (wfs_inode_pin()) */
	ret = in ? wfs_openmode_create(fs, in, fi->flags, tid_of(req), &h, &r) : -ENOMEM;
	if (ret)
		undo_create(fs, parent, name);
	if (in)
		wfs_inode_unpin(fs, in); /* after the undo: frees it, nameless; on success @h holds it */
	if (ret)
		goto out;
	ret = make_entry(fs, &a, &e); /* finds @in: cannot fail */
	assert(ret == 0);
	set_open_reply(fi, h, &r);
out:
	wfs_unlock(&fs->lock);
	if (ret)
		fuse_reply_err(req, -ret);
	else
		reply_open(req, &e, fi);
}

static void wfs_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	WFS_OPS_COUNT(OPEN);
	struct wfs_fs *fs = wfs_ops_fs(req);
	bool truncate = fi->flags & O_TRUNC;
	bool writable = (fi->flags & O_ACCMODE) != O_RDONLY || truncate;
	struct wfs_news news = {0};
	struct wfs_open_reply r = {0};
	struct wfs_handle *h = NULL;
	bool claimed = false;
	bool mode_changed = false;
	int ret = -EAGAIN;

	/* A read-only open goes on while the catalog commits (fs->lock lent, lock.h) when it can. */
	if (writable) {
		wfs_receive_hand_over(); /* it may copy the file's bytes into a new version (receive.h) */
		wfs_delay("open.writable"); /* test-only: other processes act before this open is served */
		wfs_lock(&fs->lock);
		claimed = claim_open(fs, ino, fi, "open"); /* resent after a takeover */
	} else if (wfs_lock_light(&fs->lock) && (ret = wfs_openmode_open_lent(fs, ino, &h, &r)) == -EAGAIN) {
		wfs_lock_ordinary(&fs->lock);
	}
	if (ret == -EAGAIN)
		ret = claimed ? 0 : wfs_openmode_open(fs, ino, writable, fi->flags, tid_of(req), &h, &r, &news);
	/* The truncate of an O_TRUNC open by a user other than root clears set-user-ID bits, which the
	 * kernel leaves to the daemon with killpriv_v2 (fileio.h). */
	if (ret == 0 && !claimed && truncate && fs->killpriv_v2 && fuse_req_ctx(req)->uid != 0) {
		struct wfs_caller c = caller_of(req);

		mode_changed = wfs_fileio_killpriv(fs, h->inode->ino, &c);
	}
	wfs_unlock(&fs->lock);
	if (mode_changed)
		fuse_lowlevel_notify_inval_inode(fs->se, ino, -1, 0); /* attributes only */
	wfs_delay("open.reply"); /* test-only: the kernel hears of an O_TRUNC after the daemon did it */
	if (ret == -ESTALE)
		wfs_delay("open.estale"); /* test-only: a rename comes before the writer's retry */
	if (ret == 0 && r.noflush && wfs_filelock_flush_wanted(&fs->filelocks, ino))
		r.noflush = false; /* its close(2) drops the closer's POSIX locks (filelock.h) */
	/* A moved name: every cached dentry of the inode's names goes before the opener hears of it
	 * (its ESTALE retry, then its writes and close, come after): told later, an open of another
	 * hard link right after the writer's close(2) could still reach the old inode and read the old
	 * bytes (check_mount writer_beside_readers, 1 run in 30 under ThreadSanitizer). The opener
	 * holds no directory lock while its OPEN waits (the VFS takes it only around the lookup and a
	 * create), so fuse_reverse_inval_entry() cannot wait for it. */
	wfs_ops_news_send(fs, &news);
	if (ret) {
		fuse_reply_err(req, -ret);
	} else {
		if (!claimed)
			set_open_reply(fi, h, &r);
		reply_open(req, NULL, fi);
	}
}

static void wfs_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	WFS_OPS_COUNT(READ);
	struct wfs_fs *fs = wfs_ops_fs(req);
	struct fuse_bufvec object = FUSE_BUFVEC_INIT(size);
	char *buf;
	ssize_t n;
	int fd;

	if (stale(fi)) {
		buf = malloc(size ? size : 1);
		n = buf ? stale_read(fs, ino, buf, size, off) : -ENOMEM;
		if (n < 0)
			fuse_reply_err(req, (int)-n);
		else
			fuse_reply_buf(req, buf, (size_t)n);
		free(buf);
		return;
	}
	n = wfs_openmode_read_object(fs, handle_of(fi), tid_of(req), &fd);
	if (n == 0) {
		/* Spliced from the object's page cache into the request's pages: one copy, in the
		 * kernel (libfuse copies through memory instead where splice is unavailable). */
		object.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
		object.buf[0].fd = fd;
		object.buf[0].pos = off;
		fuse_reply_data(req, &object, 0);
		wfs_openmode_read_done(fs, fd, off, size);
		close(fd);
		return;
	}
	if (n < 0) {
		fuse_reply_err(req, (int)-n);
		return;
	}
	buf = malloc(size ? size : 1);
	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	n = wfs_openmode_read(fs, handle_of(fi), tid_of(req), buf, size, off);
	if (n < 0)
		fuse_reply_err(req, (int)-n);
	else
		fuse_reply_buf(req, buf, (size_t)n);
	free(buf);
}

static void wfs_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		      struct fuse_file_info *fi)
{
	WFS_OPS_COUNT(WRITE);
	struct wfs_fs *fs = wfs_ops_fs(req);
	struct wfs_caller c = caller_of(req);
	bool mode_changed = false;
	ssize_t n;

	n = stale(fi) ? stale_write() : wfs_fileio_write(fs, handle_of(fi), &c, buf, size, off, &mode_changed);
	if (mode_changed)
		fuse_lowlevel_notify_inval_inode(fs->se, ino, -1, 0); /* attributes only */
	if (n < 0)
		fuse_reply_err(req, (int)-n);
	else
		fuse_reply_write(req, (size_t)n);
}

static void wfs_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len,
			  struct fuse_file_info *fi)
{
	WFS_OPS_COUNT(FALLOCATE);
	(void)ino;
	if (stale(fi))
		fuse_reply_err(req, -stale_write());
	else
		fuse_reply_err(req, -wfs_fileio_fallocate(wfs_ops_fs(req), handle_of(fi), tid_of(req), mode, off,
							  len));
}

static void wfs_copy_file_range(fuse_req_t req, fuse_ino_t ino_in, off_t off_in, struct fuse_file_info *fi_in,
				fuse_ino_t ino_out, off_t off_out, struct fuse_file_info *fi_out, size_t len,
				int flags)
{
	WFS_OPS_COUNT(COPY_FILE_RANGE);
	struct wfs_caller c = caller_of(req);
	ssize_t n = flags ? -EINVAL
		    : stale(fi_in) || stale(fi_out)
			? stale_write()
			: wfs_fileio_copy_range(wfs_ops_fs(req), handle_of(fi_in), off_in, handle_of(fi_out), off_out,
						len, &c);

	(void)ino_in;
	(void)ino_out;
	if (n < 0)
		fuse_reply_err(req, (int)-n);
	else
		fuse_reply_write(req, (size_t)n);
}

/*
 * Locks (filelock.h). A blocked request (F_SETLKW, flock without LOCK_NB) holds no thread: it is
 * queued with its request and answered by the thread whose unlock, close or release grants it, or
 * with EINTR by the interrupt (a signal to the caller: the kernel sends FUSE_INTERRUPT). Whoever
 * takes a wait out of the table answers it and frees it; the interrupt callback is unregistered
 * first (libfuse then waits for a callback running on another thread), so that it never sees a
 * freed wait.
 */
static void locks_answer(struct wfs_filelock_wait *granted)
{
	struct wfs_filelock_wait *next;

	for (; granted; granted = next) {
		next = granted->next;
		fuse_req_interrupt_func(granted->req, NULL, NULL);
		fuse_reply_err(granted->req, 0);
		free(granted);
	}
}

/* FLUSH (@fh 0): @owner's POSIX locks; RELEASE: the locks of handle @fh, and with @flock_release
 * @owner's flock lock. Waiters that this unblocks are answered. */
static void locks_dropped(struct wfs_fs *fs, fuse_ino_t ino, uint64_t owner, uint64_t fh, bool flock_release)
{
	struct wfs_filelock_wait *granted = NULL;

	if (fh == 0) {
		wfs_filelock_drop_owner(&fs->filelocks, ino, owner, false, &granted);
	} else {
		wfs_filelock_drop_handle(&fs->filelocks, ino, fh, &granted);
		if (flock_release)
			wfs_filelock_drop_owner(&fs->filelocks, ino, owner, true, &granted);
	}
	locks_answer(granted);
}

/* libfuse's interrupt callback of a waiting lock request (see above). */
static void lock_interrupted(fuse_req_t req, void *data)
{
	struct wfs_fs *fs = fuse_req_userdata(req); /* not a handler: libfuse holds the request's lock */

	if (wfs_filelock_cancel(&fs->filelocks, data)) {
		fuse_reply_err(req, EINTR);
		free(data);
	}
}

static void lock_set(fuse_req_t req, fuse_ino_t ino, const struct wfs_filelock_req *rq, bool sleep)
{
	struct wfs_fs *fs = wfs_ops_fs(req);
	struct wfs_filelock_wait *granted = NULL, *w = NULL;
	int ret;

	if (sleep && rq->type != F_UNLCK) {
		w = calloc(1, sizeof(*w));
		if (!w) {
			fuse_reply_err(req, ENOLCK);
			return;
		}
		w->rq = *rq;
		w->req = req;
		fuse_req_interrupt_func(req, lock_interrupted, w); /* before it is queued: never lost */
	}
	ret = wfs_filelock_set(&fs->filelocks, ino, rq, w, &granted);
	if (ret == WFS_FILELOCK_QUEUED) { /* @w and @req are the table's now */
		locks_answer(granted);
		return;
	}
	if (w) {
		fuse_req_interrupt_func(req, NULL, NULL);
		free(w);
	}
	fuse_reply_err(req, -ret);
	locks_answer(granted);
}

/* struct flock (libfuse's, from the kernel's inclusive range) as a lock request of @fi. */
static struct wfs_filelock_req lock_req_of(const struct fuse_file_info *fi, const struct flock *lk)
{
	struct wfs_filelock_req rq = {.owner = fi->lock_owner, .fh = fi->fh, .pid = lk->l_pid, .type = lk->l_type,
				      .start = lk->l_start, .end = WFS_FILELOCK_EOF};

	if (lk->l_len > 0 && lk->l_start <= WFS_FILELOCK_EOF - lk->l_len + 1)
		rq.end = lk->l_start + lk->l_len - 1;
	else if (lk->l_len < 0)
		rq.end = -1; /* the kernel sends none: refused (EINVAL) */
	return rq;
}

static void wfs_getlk(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, struct flock *lk)
{
	WFS_OPS_COUNT(GETLK);
	struct wfs_fs *fs = wfs_ops_fs(req);
	struct wfs_filelock_req rq = lock_req_of(fi, lk), held;
	int ret = wfs_filelock_test(&fs->filelocks, ino, &rq, &held);

	if (ret < 0) {
		fuse_reply_err(req, -ret);
		return;
	}
	if (ret == 1) {
		lk->l_type = held.type;
		lk->l_whence = SEEK_SET;
		lk->l_start = held.start;
		lk->l_len = held.end == WFS_FILELOCK_EOF ? 0 : held.end - held.start + 1;
		lk->l_pid = held.pid;
	} else {
		lk->l_type = F_UNLCK;
	}
	fuse_reply_lock(req, lk);
}

static void wfs_setlk(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, struct flock *lk, int sleep)
{
	struct wfs_ops_timer wfs_ops_timer_ __attribute__((cleanup(wfs_ops_timer_stop), unused)) =
		wfs_ops_timer_start(sleep ? WFS_REQ_SETLKW : WFS_REQ_SETLK);
	struct wfs_filelock_req rq = lock_req_of(fi, lk);

	lock_set(req, ino, &rq, sleep != 0);
}

static void wfs_flock(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, int op)
{
	struct wfs_ops_timer wfs_ops_timer_ __attribute__((cleanup(wfs_ops_timer_stop), unused)) =
		wfs_ops_timer_start((op & LOCK_NB) ? WFS_REQ_SETLK : WFS_REQ_SETLKW); /* the kernel's opcodes */
	struct wfs_filelock_req rq = {.owner = fi->lock_owner, .fh = fi->fh, .pid = fuse_req_ctx(req)->pid,
				      .flock = true, .end = WFS_FILELOCK_EOF};

	switch (op & (LOCK_SH | LOCK_EX | LOCK_UN)) {
	case LOCK_SH:
		rq.type = F_RDLCK;
		break;
	case LOCK_EX:
		rq.type = F_WRLCK;
		break;
	case LOCK_UN:
		rq.type = F_UNLCK;
		break;
	default:
		fuse_reply_err(req, EINVAL);
		return;
	}
	lock_set(req, ino, &rq, !(op & LOCK_NB));
}

/* close(2): the last writable handle's flush seals, and its errors come back from close(2). */
static void wfs_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	WFS_OPS_COUNT(FLUSH);
	struct wfs_fs *fs = wfs_ops_fs(req);
	struct wfs_adopted_writer closed;
	struct wfs_news news = {0};
	int ret;

	locks_dropped(fs, ino, fi->lock_owner, 0, false); /* the closer's POSIX locks, before close(2) returns */
	if (stale(fi)) { /* a reader's close has nothing to do; a writer's bytes are gone */
		fuse_reply_err(req, wfs_takeover_fh_writable(fi->fh) ? -stale_write() : 0);
		return;
	}
	wfs_lock(&fs->lock);
	if (wfs_openmode_flush_seals_data(handle_of(fi)))
		wfs_receive_hand_over(); /* requests go on beside the seal (receive.h) */
	ret = wfs_openmode_flush(fs, handle_of(fi), tid_of(req), &news);
	closed = wfs_openmode_closed_state(handle_of(fi));
	wfs_unlock(&fs->lock);
	/* Before the reply: once a killed writer's exit is seen, its name is gone from the kernel. */
	wfs_ops_news_send(fs, &news);
	wfs_takeover_handle_flushed(fi->fh, &closed); /* before the reply, as its open's record */
	fuse_reply_err(req, -ret);
}

/*
 * The kernel is done with open file @fi of inode @ino (its RELEASE, from thread @tid), or a
 * successor with a handle of a dead server that the kernel never got (release_orphans(), @tid 0):
 * its locks, its backing id, and the handle itself, with the seal its release makes.
 */
static void release_handle(struct wfs_fs *fs, fuse_ino_t ino, const struct fuse_file_info *fi, pid_t tid)
{
	uint64_t unique = wfs_takeover_handle_unique(fi->fh); /* while the handle lives */
	struct wfs_news news = {0};
	bool telling;

	wfs_delay("release"); /* test-only: a RELEASE that reaches the daemon late (a loaded machine) */
	/* Every lock taken through this open file description: flock's, OFD's, and the POSIX locks of
	 * a descriptor that sent no FLUSH (FOPEN_NOFLUSH, filelock.h). */
	locks_dropped(fs, ino, fi->lock_owner, fi->fh, fi->flock_release);
	wfs_takeover_handle_released(fi->fh); /* its backing id, if a dead server's is done with */
	if (stale(fi)) {
		wfs_takeover_release_done(fi->fh, unique);
		return;
	}
	if (wfs_takeover_fh_writable(fi->fh))
		wfs_upgrade_writer_released();
	if (!wfs_lock_light(&fs->lock) || wfs_openmode_release_lent(fs, handle_of(fi)) == -EAGAIN) {
		wfs_lock_ordinary(&fs->lock);
		if (wfs_openmode_release_seals_data(handle_of(fi)))
			wfs_receive_hand_over(); /* requests go on beside the seal (receive.h) */
		wfs_openmode_release(fs, handle_of(fi), tid, &news);
	}
	telling = news.ino || news.n;
	fs->releases_telling += telling;
	wfs_unlock(&fs->lock);
	wfs_ops_news_send(fs, &news);
	if (telling) { /* an open waiting for this release may go on now (seal.h) */
		wfs_lock(&fs->lock);
		fs->releases_telling--;
		pthread_cond_broadcast(&fs->seal_done);
		wfs_unlock(&fs->lock);
	}
	/* test-only: the handle is freed and its slot still there; a writable open meanwhile may get
	 * the same address, hence the same fh, and record its own slot (tests/takeover/run-handles) */
	wfs_delay("release.freed");
	wfs_takeover_release_done(fi->fh, unique); /* after its seal: a successor finds one or the other */
}

static void wfs_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	WFS_OPS_COUNT(RELEASE);
	struct wfs_fs *fs = wfs_ops_fs(req);

	release_handle(fs, ino, fi, tid_of(req));
	fuse_reply_err(req, 0);
}

/*
 * Successor, once every resent request was answered: the handles dead servers made for opens
 * whose reply the kernel never got and never asked for again go, as their RELEASE would have made
 * them go (takeover.h, wfs_takeover_orphan_next()). Their writers counted: a file stayed unsealed.
 */
static void release_orphans(struct wfs_fs *fs)
{
	struct fuse_file_info fi = {0};
	uint64_t ino;

	while (wfs_takeover_orphan_next(&fi.fh, &ino)) {
		struct wfs_news news = {.moved = true}; /* names to drop from the dcache, not deleted */

		release_handle(fs, ino, &fi, 0);
		/* A CREATE whose caller was killed before the kernel had the reply leaves the negative
		 * dentry of its LOOKUP (-o timeout): others would not see the file the dead server made
		 * until it expires. Its names are dropped from the kernel's dcache, looked up again. */
		wfs_lock(&fs->lock);
		(void)wfs_catalog_names(fs->catalog, ino, wfs_news_name, &news);
		wfs_unlock(&fs->lock);
		news.ino = ino;
		wfs_ops_news_post(fs, &news);
	}
}

/*
 * fsync(2), fsyncdir(2): the namespace and every seal so far made durable (the batch committed, the
 * group sync, the WAL's fdatasync; fs->lock dropped for the disk). A file being written is sealed at
 * its close, not here: a writer's fsync makes that seal wait for the disk, whatever its size; ENOSPC
 * when a full store left it only the digest of its bytes.
 */
static void sync_common(fuse_req_t req, struct wfs_handle *h)
{
	struct wfs_fs *fs = wfs_ops_fs(req);
	struct wfs_version *v = NULL;
	int ret;

	wfs_lock(&fs->lock);
	if (h && h->writing) {
		v = h->writing;
		wfs_version_get(v);
		wfs_version_ask_durable(v);
	}
	/* A full store made the version drop its bytes (only their digest is kept, in case the content
	 * is stored already): they are not on any disk, and fsync(2) must not say they are. */
	ret = v && wfs_version_dropped(v) ? -ENOSPC : wfs_commit_now(fs);
	wfs_unlock(&fs->lock);
	if (ret == 0 && v)
		ret = wfs_version_datasync_kernel(v); /* the kernel's bytes, written through passthrough */
	if (v)
		wfs_version_put(v);
	if (ret == 0)
		ret = wfs_commit_sync(fs);
	fuse_reply_err(req, -ret);
}

static void wfs_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	WFS_OPS_COUNT(FSYNC);
	(void)ino, (void)datasync;
	if (stale(fi) && wfs_takeover_fh_writable(fi->fh))
		fuse_reply_err(req, -stale_write());
	else
		sync_common(req, handle_of(fi)); /* NULL for a reader of a dead server: the namespace */
}

static void wfs_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	WFS_OPS_COUNT(FSYNCDIR);
	(void)ino, (void)datasync, (void)fi;
	sync_common(req, NULL);
}

static void wfs_unlink_common(fuse_req_t req, fuse_ino_t parent, const char *name, bool dir)
{
	struct wfs_fs *fs = wfs_ops_fs(req);
	uint64_t ino;
	int ret;

	wfs_lock(&fs->lock);
	ret = wfs_catalog_unlink(fs->catalog, parent, name, dir, &ino);
	if (ret == 0)
		wfs_inode_maybe_drop(fs, ino);
	else if (ret == -ENOENT && wfs_receive_resent())
		ret = 0; /* resent after a takeover: the dead server removed it already */
	wfs_unlock(&fs->lock);
	fuse_reply_err(req, -ret);
}

static void wfs_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	WFS_OPS_COUNT(UNLINK);
	wfs_unlink_common(req, parent, name, false);
}

static void wfs_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	WFS_OPS_COUNT(RMDIR);
	wfs_unlink_common(req, parent, name, true);
}

static void wfs_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
		       const char *newname, unsigned int flags)
{
	WFS_OPS_COUNT(RENAME);
	struct wfs_fs *fs = wfs_ops_fs(req);
	uint64_t replaced = 0;
	int ret = check_name(newname);

	wfs_lock(&fs->lock);
	if (ret == 0)
		ret = wfs_catalog_rename(fs->catalog, parent, name, newparent, newname, flags, &replaced);
	if (ret == 0 && replaced)
		wfs_inode_maybe_drop(fs, replaced);
	else if (ret == -ENOENT && wfs_receive_resent())
		ret = 0; /* resent after a takeover: the dead server moved it already */
	wfs_unlock(&fs->lock);
	fuse_reply_err(req, -ret);
}

static void wfs_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
	WFS_OPS_COUNT(LINK);
	struct wfs_fs *fs = wfs_ops_fs(req);
	struct fuse_entry_param e;
	struct wfs_attr a;
	int ret = check_name(newname);

	wfs_lock(&fs->lock);
	if (ret == 0)
		ret = wfs_catalog_link(fs->catalog, ino, newparent, newname, &a);
	if (ret == 0)
		ret = make_entry(fs, &a, &e);
	wfs_unlock(&fs->lock);
	reply_entry_or_err(req, ret, &e);
}

static void wfs_readlink(fuse_req_t req, fuse_ino_t ino)
{
	WFS_OPS_COUNT(READLINK);
	struct wfs_fs *fs = wfs_ops_fs(req);
	char buf[PATH_MAX];
	int ret;

	wfs_lock(&fs->lock);
	ret = wfs_catalog_readlink(fs->catalog, ino, buf, sizeof(buf));
	wfs_unlock(&fs->lock);
	if (ret)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_readlink(req, buf);
}

static void wfs_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	WFS_OPS_COUNT(OPENDIR);
	struct wfs_fs *fs = wfs_ops_fs(req);
	struct wfs_attr a;
	int ret;

	wfs_lock(&fs->lock);
	ret = wfs_catalog_getattr(fs->catalog, ino, &a);
	wfs_unlock(&fs->lock);
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
	WFS_OPS_COUNT(RELEASEDIR);
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
		attr_to_stat(d->fs, a, wfs_inode_find(d->fs, a->ino), &e.attr);
		return !dirbuf_add(d, name, &e.attr, NULL, (off_t)(cookie + 2));
	}
	/* readdirplus hands the kernel a lookup reference per entry: count it only if it fit. */
	if (make_entry(d->fs, a, &e))
		return 1;
	if (dirbuf_add(d, name, &e.attr, &e, (off_t)(cookie + 2)))
		return 0;
	in = wfs_inode_find(d->fs, a->ino);
	wfs_inode_forget(d->fs, in->ino, 1);
	return 1;
}

static void readdir_common(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus)
{
	struct wfs_fs *fs = wfs_ops_fs(req);
	struct dirbuf d = {.fs = fs, .req = req, .plus = plus, .size = size};
	struct fuse_entry_param e;
	struct wfs_attr a;
	int ret;

	d.buf = malloc(size ? size : 1);
	if (!d.buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	wfs_lock(&fs->lock);
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
	wfs_unlock(&fs->lock);
	if (ret)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_buf(req, d.buf, d.used);
	free(d.buf);
}

static void wfs_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	WFS_OPS_COUNT(READDIR);
	(void)fi;
	readdir_common(req, ino, size, off, false);
}

static void wfs_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			    struct fuse_file_info *fi)
{
	WFS_OPS_COUNT(READDIRPLUS);
	(void)fi;
	readdir_common(req, ino, size, off, true);
}

static void wfs_statfs(fuse_req_t req, fuse_ino_t ino)
{
	WFS_OPS_COUNT(STATFS);
	struct wfs_fs *fs = wfs_ops_fs(req);
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
	.getlk = wfs_getlk,
	.setlk = wfs_setlk,
	.flock = wfs_flock,
};
