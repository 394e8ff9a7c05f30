/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stage — see stage.h for the design. Locking: one mutex, st->lock, guards every field marked
 * "guarded" below; there is no other lock, so there is no lock order. No system call or CUDA call is
 * made with st->lock held.
 */
#include "direct.h"
#include "stage.h"

#include <ctype.h>
#include <fcntl.h>
#include <numa.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "digest.h"
#include "log.h"
#include "weightfs.h"

#ifdef WFS_HAVE_CUDA
#include "cudart.h"
#endif

/* Measured on an H200 host (docs/staging.md): many small buffers and about 12 readers beat a few big
 * buffers, because each pread() then writes into memory that is still in cache when the GPU reads it. */
#define DEFAULT_BUFFERS 64u
#define DEFAULT_BUFFER_BYTES (2u << 20)
#define DEFAULT_THREADS_MAX 12L
#define RING_ALIGN 4096u

enum item_state {
	ITEM_UNOPENED, /* no chunk handed out yet */
	ITEM_OPENING,  /* the worker holding chunk 0 is opening the file; other chunks wait */
	ITEM_OPEN,     /* fd valid (or -1 after a failed open) until the last chunk is accounted */
};

struct stage_item {
	struct wfs_stage_item it; /* it.path is our own copy */
	struct wfs_stage_batch *batch;
	uint64_t nchunks;     /* ceil(bytes / S), at least 1 so that empty files are still opened */
	uint64_t next_chunk;  /* guarded: next chunk to hand out */
	uint64_t chunks_left; /* guarded: chunks not yet accounted */
	enum item_state state; /* guarded */
	int fd;               /* written by the opener before ITEM_OPEN is published */
	dev_t dev;            /* offload: the regular file created, unlinked if the item fails */
	ino_t ino;
	bool created;
	int err;              /* guarded: first error wins */
	bool done;            /* guarded */
	char msg[WFS_STAGE_MSG_MAX]; /* guarded until done */
	char digest[WFS_DIGEST_HEX_CHARS + 1]; /* it.digest's copy ("" for none); it.digest points here */
};

struct wfs_stage_batch {
	struct wfs_stager *st;
	struct stage_item *items;
	size_t n;
	size_t next_item;   /* guarded: first item with chunks left to hand out */
	size_t items_left;  /* guarded: items not finished */
	bool pending;       /* guarded: on st's pending list */
	struct wfs_stage_batch *next; /* guarded: pending list link */
};

/* A backload chunk whose copy has been queued; the completion thread finishes it. */
struct inflight {
	unsigned buf;
	struct stage_item *item;
	void *dst;
	size_t len;
};

struct worker {
	struct wfs_stager *st;
	unsigned idx;
	pthread_t tid;
#ifdef WFS_HAVE_CUDA
	cudaStream_t stream;
#endif
};

struct wfs_stager {
	struct wfs_stage_opts o;
	int node;          /* -1: unbound */
	char bus_id[32];
	unsigned char *ring;
	size_t ring_bytes;
	bool registered;   /* ring pinned with cudaHostRegister */
#ifdef WFS_HAVE_CUDA
	const struct wfs_cudart *rt; /* device stagers: the CUDA runtime (lib/cudart.h) */
#endif

	pthread_mutex_t lock;
	pthread_cond_t work_cv;     /* work queued, a buffer freed, an item opened, or stopping */
	pthread_cond_t inflight_cv; /* the FIFO got an entry, or stopping */
	pthread_cond_t done_cv;     /* an item finished */
	bool stopping;              /* guarded */
	unsigned *free_bufs;        /* guarded: stack of free buffer indices */
	unsigned nfree;             /* guarded */
	unsigned in_use_peak;       /* guarded */
	struct inflight *fifo;      /* guarded: B entries, at most one per buffer */
	unsigned fifo_head, fifo_len; /* guarded */
	struct wfs_stage_batch *pending_head, *pending_tail; /* guarded */
	uint64_t loaded, offloaded; /* guarded: bytes */

	struct worker *workers;
	unsigned nworkers;          /* started */
	pthread_t completer;
	bool completer_started;
#ifdef WFS_HAVE_CUDA
	cudaEvent_t *events;        /* one per buffer: its H2D copy is done */
	unsigned nevents;
#endif
};

/* One warning per process and per kind of NUMA trouble. */
static atomic_bool warned_no_node, warned_no_numa, warned_no_bind;

bool wfs_stage_have_cuda(void)
{
#ifdef WFS_HAVE_CUDA
	return true;
#else
	return false;
#endif
}

void wfs_stage_opts_init(struct wfs_stage_opts *o)
{
	long ncpu;

	memset(o, 0, sizeof(*o));
	o->mem = WFS_STAGE_MEM_DEVICE;
	o->device = 0;
	o->numa_node = -1;
	o->buffers = DEFAULT_BUFFERS;
	o->buffer_bytes = DEFAULT_BUFFER_BYTES;
	/* Leave a couple of CPUs to the caller and the completion thread. */
	ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	o->threads = (unsigned)(ncpu - 2 < 2 ? 2 : ncpu - 2 > DEFAULT_THREADS_MAX ? DEFAULT_THREADS_MAX : ncpu - 2);
}

static void set_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

int wfs_stage_numa_node_of_pci(const char *sysfs_root, const char *bus_id)
{
	unsigned dom, bus, dev, fn;
	int used = 0, node = -1;
	char path[512];
	FILE *f;

	/* CUDA prints the domain with 4 or 8 hex digits and upper case; sysfs wants "%04x:%02x:%02x.%x". */
	if (bus_id[strspn(bus_id, "0123456789abcdefABCDEF:.")] != '\0' ||
	    sscanf(bus_id, "%x:%x:%x.%x%n", &dom, &bus, &dev, &fn, &used) != 4 || bus_id[used] != '\0')
		return -EINVAL;
	snprintf(path, sizeof(path), "%s/bus/pci/devices/%04x:%02x:%02x.%x/numa_node", sysfs_root, dom, bus,
		 dev, fn);
	f = fopen(path, "re");
	if (!f)
		return -1;
	if (fscanf(f, "%d", &node) != 1 || node < 0)
		node = -1;
	fclose(f);
	return node;
}

/* Choose the NUMA node (see stage.h). Returns 0 with *@node set (-1: unbound), or -EINVAL. */
static int resolve_node(const struct wfs_stager *st, int *node, char *err, size_t errlen)
{
	const char *env = getenv("WFS_STAGE_NUMA_NODE");
	int n = -1;

	if (st->o.numa_node >= 0) {
		n = st->o.numa_node;
	} else if (st->o.numa_node == -2) {
		n = -1;
	} else if (st->o.numa_node != -1) {
		set_err(err, errlen, "stage: bad numa_node option %d", st->o.numa_node);
		return -EINVAL;
	} else if (env && *env) {
		char *end;
		long v;

		if (!strcmp(env, "none"))
			v = -1;
		else
			v = strtol(env, &end, 10);
		if (strcmp(env, "none") && (*end || v < -1 || v > 4095)) {
			set_err(err, errlen, "stage: WFS_STAGE_NUMA_NODE=%s is not a node number", env);
			return -EINVAL;
		}
		n = (int)v;
	} else if (st->o.mem == WFS_STAGE_MEM_DEVICE) {
		n = wfs_stage_numa_node_of_pci("/sys", st->bus_id);
		if (n < 0) {
			wfs_log_once(&warned_no_node, WFS_LOG_WARN,
				     "stage: GPU %d (PCI %s) reports no NUMA node; staging runs unbound",
				     st->o.device, st->bus_id);
			n = -1;
		}
	}
	if (n >= 0 && numa_available() < 0) {
		wfs_log_once(&warned_no_numa, WFS_LOG_WARN, "stage: NUMA is not available; staging runs unbound");
		n = -1;
	}
	if (n >= 0 && n > numa_max_node()) {
		set_err(err, errlen, "stage: NUMA node %d does not exist (highest is %d)", n, numa_max_node());
		return -EINVAL;
	}
	*node = n;
	return 0;
}

/*
 * The CPUs of @node as thread attributes, so the threads are born on the node. libnuma fills its
 * node-to-CPU cache lazily and without a lock (numa_run_on_node() from several new threads races), so
 * it is asked once, here, under numa_lock.
 */
static int node_attr(int node, pthread_attr_t *attr)
{
	static pthread_mutex_t numa_lock = PTHREAD_MUTEX_INITIALIZER;
	struct bitmask *mask;
	cpu_set_t set;
	int r = 0, ncpu;

	pthread_mutex_lock(&numa_lock);
	mask = numa_allocate_cpumask();
	if (!mask || numa_node_to_cpus(node, mask) < 0) {
		r = -EINVAL;
		goto out;
	}
	CPU_ZERO(&set);
	ncpu = numa_num_possible_cpus();
	for (int i = 0; i < ncpu && i < CPU_SETSIZE; i++)
		if (numa_bitmask_isbitset(mask, (unsigned)i))
			CPU_SET(i, &set);
	if (CPU_COUNT(&set) == 0 || pthread_attr_setaffinity_np(attr, sizeof(set), &set))
		r = -EINVAL;
out:
	if (mask)
		numa_free_cpumask(mask);
	pthread_mutex_unlock(&numa_lock);
	return r;
}

/* Record @err and a message for @it unless it already failed. Takes st->lock. */
static void item_fail(struct wfs_stager *st, struct stage_item *it, int err, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void item_fail(struct wfs_stager *st, struct stage_item *it, int err, const char *fmt, ...)
{
	char line[WFS_STAGE_MSG_MAX];
	int n = snprintf(line, sizeof(line), "%s: ", it->it.path);
	va_list ap;

	if (n >= 0 && (size_t)n < sizeof(line)) {
		va_start(ap, fmt);
		vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
		va_end(ap);
	}
	pthread_mutex_lock(&st->lock);
	if (!it->err) {
		it->err = err;
		memcpy(it->msg, line, sizeof(it->msg));
	}
	pthread_mutex_unlock(&st->lock);
}

static bool item_failed(struct wfs_stager *st, struct stage_item *it)
{
	bool failed;

	pthread_mutex_lock(&st->lock);
	failed = it->err != 0;
	pthread_mutex_unlock(&st->lock);
	return failed;
}

/* Move @b's cursor past items with nothing left to hand out; drop @b from the pending list when done.
 * Called with st->lock held. */
static void cursor_advance(struct wfs_stager *st, struct wfs_stage_batch *b)
{
	while (b->next_item < b->n && b->items[b->next_item].next_chunk == b->items[b->next_item].nchunks)
		b->next_item++;
	if (b->next_item < b->n || !b->pending)
		return;
	/* Only the head batch is ever handed out from, so an exhausted batch is the head. */
	st->pending_head = b->next;
	if (!st->pending_head)
		st->pending_tail = NULL;
	b->next = NULL;
	b->pending = false;
}

static int fault(struct wfs_stager *st, struct stage_item *it, enum wfs_stage_io op, uint64_t off)
{
	return st->o.io_fault ? st->o.io_fault(st->o.io_fault_arg, it->it.path, op, off) : 0;
}

/* Called once per item, after its last chunk is accounted, without st->lock. */
static void item_finish(struct wfs_stager *st, struct stage_item *it)
{
	bool offload = it->it.flags & WFS_STAGE_OFFLOAD;
	struct wfs_stage_batch *b = it->batch;

	if (it->fd >= 0) {
		bool failed = item_failed(st, it);

		if (offload && !failed && it->digest[0])
			(void)fsetxattr(it->fd, WFS_XATTR_DIGEST, it->digest, WFS_DIGEST_HEX_CHARS, 0);
		if (offload && !failed && (it->it.flags & WFS_STAGE_FSYNC) && fsync(it->fd) < 0)
			item_fail(st, it, -errno, "fsync: %s", strerror(errno));
		/* On weightfs close(2) seals the file: ENOSPC or EIO from the seal arrive here. A read-only
		 * descriptor's close cannot lose data, so only offloads check it. */
		if (offload) {
			int r = fault(st, it, WFS_STAGE_IO_CLOSE, 0);

			if (close(it->fd) < 0 && !r)
				r = -errno;
			if (r < 0)
				item_fail(st, it, r, "close: %s", strerror(-r));
		} else {
			close(it->fd);
		}
		it->fd = -1;
		if (offload && it->created && item_failed(st, it)) {
			struct stat sb;

			if (lstat(it->it.path, &sb) == 0 && sb.st_dev == it->dev && sb.st_ino == it->ino)
				(void)unlink(it->it.path);
		}
	}
	pthread_mutex_lock(&st->lock);
	it->done = true;
	if (--b->items_left == 0)
		pthread_cond_broadcast(&st->done_cv);
	pthread_mutex_unlock(&st->lock);
}

/* Give buffer @buf back and account one chunk of @it (@ok_bytes moved, 0 on failure or skip). */
static void chunk_done(struct wfs_stager *st, struct stage_item *it, unsigned buf, size_t ok_bytes)
{
	bool last;

	pthread_mutex_lock(&st->lock);
	st->free_bufs[st->nfree++] = buf;
	if (it->it.flags & WFS_STAGE_OFFLOAD)
		st->offloaded += ok_bytes;
	else
		st->loaded += ok_bytes;
	last = --it->chunks_left == 0;
	pthread_cond_broadcast(&st->work_cv);
	pthread_mutex_unlock(&st->lock);
	if (last)
		item_finish(st, it);
}

/* Open @it's file and check its size. Returns 0 or the item error (already recorded). */
static int item_open(struct wfs_stager *st, struct stage_item *it)
{
	const struct wfs_stage_item *w = &it->it;
	uint64_t want = w->offset + w->bytes;
	struct stat sb;
	int fd;

	if (w->flags & WFS_STAGE_OFFLOAD) {
		fd = open(w->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd < 0) {
			item_fail(st, it, -errno, "create: %s", strerror(errno));
			return -1;
		}
		it->fd = fd;
		/* Remember what we created: on failure only that regular file is unlinked, never a device
		 * node or a file someone else has since put under the name. */
		if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode)) {
			it->dev = sb.st_dev;
			it->ino = sb.st_ino;
			it->created = true;
		}
		return 0;
	}
	fd = open(w->path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		item_fail(st, it, -errno, "open: %s", strerror(errno));
		return -1;
	}
	{
		/* Under weightfs, read the object file itself (direct.h): native speed without passthrough,
		 * one page-cache copy for every name. Otherwise (not weightfs, being written, no direct
		 * path) read the file as opened; a damaged object is the error it is. */
		int ofd = wfs_direct_open_fd(fd);

		if (ofd >= 0) {
			close(fd);
			fd = ofd;
		} else if (ofd == -EIO) {
			close(fd);
			item_fail(st, it, -EIO, "open: %s", strerror(EIO));
			return -1;
		}
	}
	it->fd = fd;
	if (fstat(fd, &sb) < 0) {
		item_fail(st, it, -errno, "fstat: %s", strerror(errno));
		return -1;
	}
	if (S_ISDIR(sb.st_mode)) {
		item_fail(st, it, -EISDIR, "is a directory");
		return -1;
	}
	if (!S_ISREG(sb.st_mode)) {
		item_fail(st, it, -EINVAL, "not a regular file");
		return -1;
	}
	if ((uint64_t)sb.st_size < want) {
		item_fail(st, it, WFS_STAGE_ESHORT, "short file: %llu bytes, expected %llu",
			  (unsigned long long)sb.st_size, (unsigned long long)want);
		return -1;
	}
	if ((w->flags & WFS_STAGE_EXACT) && (uint64_t)sb.st_size != want) {
		item_fail(st, it, WFS_STAGE_ESIZE, "size mismatch: %llu bytes, expected %llu",
			  (unsigned long long)sb.st_size, (unsigned long long)want);
		return -1;
	}
	/* T readers share this descriptor's readahead state and arrive slightly out of order; a larger
	 * window keeps a cold file streaming. Only a hint: failure changes nothing. */
	(void)posix_fadvise(fd, (off_t)w->offset, (off_t)w->bytes, POSIX_FADV_SEQUENTIAL);
	return 0;
}

/* Read exactly @len bytes at @off. Returns 0 or -1 (item error recorded). */
static int read_full(struct wfs_stager *st, struct stage_item *it, unsigned char *buf, size_t len,
		     uint64_t off)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n;
		int r = fault(st, it, WFS_STAGE_IO_READ, off + got);

		if (r < 0) {
			errno = -r;
			n = -1;
		} else {
			n = pread(it->fd, buf + got, len - got, (off_t)(off + got));
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			item_fail(st, it, -errno, "read at byte %llu: %s", (unsigned long long)(off + got),
				  strerror(errno));
			return -1;
		}
		if (n == 0) {
			/* The file shrank after it was opened and checked. */
			item_fail(st, it, WFS_STAGE_ESHORT, "short file: ends at byte %llu, expected %llu",
				  (unsigned long long)(off + got),
				  (unsigned long long)(it->it.offset + it->it.bytes));
			return -1;
		}
		got += (size_t)n;
	}
	return 0;
}

static int write_full(struct wfs_stager *st, struct stage_item *it, const unsigned char *buf, size_t len,
		      uint64_t off)
{
	size_t put = 0;

	while (put < len) {
		ssize_t n;
		int r = fault(st, it, WFS_STAGE_IO_WRITE, off + put);

		if (r < 0) {
			errno = -r;
			n = -1;
		} else {
			n = pwrite(it->fd, buf + put, len - put, (off_t)(off + put));
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			int e = n < 0 ? errno : EIO;

			item_fail(st, it, -e, "write at byte %llu: %s", (unsigned long long)(off + put),
				  strerror(e));
			return -1;
		}
		put += (size_t)n;
	}
	return 0;
}

struct job {
	struct stage_item *item;
	uint64_t chunk;
	unsigned buf;
	bool open; /* this job opens the item's file */
};

/* Wait for a chunk and a free buffer. Returns false when the stager stops. */
static bool take_job(struct wfs_stager *st, struct job *j)
{
	struct wfs_stage_batch *b;
	struct stage_item *it;
	unsigned in_use;

	pthread_mutex_lock(&st->lock);
	for (;;) {
		if (st->stopping) {
			pthread_mutex_unlock(&st->lock);
			return false;
		}
		b = st->pending_head;
		/* While chunk 0's worker opens the file the fd is not there yet: later chunks wait. */
		if (b && st->nfree > 0 && b->items[b->next_item].state != ITEM_OPENING)
			break;
		pthread_cond_wait(&st->work_cv, &st->lock);
	}
	it = &b->items[b->next_item];
	j->item = it;
	j->chunk = it->next_chunk++;
	j->buf = st->free_bufs[--st->nfree];
	j->open = it->state == ITEM_UNOPENED;
	if (j->open)
		it->state = ITEM_OPENING;
	in_use = st->o.buffers - st->nfree;
	if (in_use > st->in_use_peak)
		st->in_use_peak = in_use;
	cursor_advance(st, b);
	pthread_mutex_unlock(&st->lock);
	return true;
}

/* Publish the result of opening @it: later chunks may go (or are skipped when the open failed). */
static void open_done(struct wfs_stager *st, struct stage_item *it, bool ok)
{
	pthread_mutex_lock(&st->lock);
	it->state = ITEM_OPEN;
	if (!ok) {
		/* Account the chunks nobody will take. Ours is still outstanding, so this is not the last. */
		it->chunks_left -= it->nchunks - it->next_chunk;
		it->next_chunk = it->nchunks;
		cursor_advance(st, it->batch);
	}
	pthread_cond_broadcast(&st->work_cv);
	pthread_mutex_unlock(&st->lock);
}

static void run_job(struct worker *w, const struct job *j)
{
	struct wfs_stager *st = w->st;
	struct stage_item *it = j->item;
	size_t S = st->o.buffer_bytes;
	uint64_t pos = j->chunk * S;
	size_t len = it->it.bytes - pos < S ? (size_t)(it->it.bytes - pos) : S;
	unsigned char *buf = st->ring + (size_t)j->buf * S;
	unsigned char *mem = (unsigned char *)it->it.mem + pos;
	bool device = st->o.mem == WFS_STAGE_MEM_DEVICE;

	if (j->open)
		open_done(st, it, item_open(st, it) == 0);
	if (len == 0 || item_failed(st, it)) {
		chunk_done(st, it, j->buf, 0);
		return;
	}

	if (it->it.flags & WFS_STAGE_OFFLOAD) {
		if (device) {
#ifdef WFS_HAVE_CUDA
			cudaError_t ce = st->rt->cudaMemcpyAsync(buf, mem, len, cudaMemcpyDeviceToHost, w->stream);

			if (ce == cudaSuccess)
				ce = st->rt->cudaStreamSynchronize(w->stream);
			if (ce != cudaSuccess) {
				item_fail(st, it, WFS_STAGE_ECUDA, "device-to-host copy of bytes %llu+%zu: %s",
					  (unsigned long long)pos, len, st->rt->cudaGetErrorString(ce));
				chunk_done(st, it, j->buf, 0);
				return;
			}
#endif
		} else {
			memcpy(buf, mem, len);
		}
		if (write_full(st, it, buf, len, pos) < 0)
			len = 0;
		chunk_done(st, it, j->buf, len);
		return;
	}

	if (read_full(st, it, buf, len, it->it.offset + pos) < 0) {
		chunk_done(st, it, j->buf, 0);
		return;
	}
	if (device) {
#ifdef WFS_HAVE_CUDA
		cudaError_t ce = st->rt->cudaMemcpyAsync(mem, buf, len, cudaMemcpyHostToDevice, w->stream);

		if (ce == cudaSuccess)
			ce = st->rt->cudaEventRecord(st->events[j->buf], w->stream);
		if (ce != cudaSuccess) {
			/* A copy queued before a failed record completes on its own; wait so the buffer is
			 * really free before it is reused. */
			st->rt->cudaStreamSynchronize(w->stream);
			item_fail(st, it, WFS_STAGE_ECUDA, "host-to-device copy of bytes %llu+%zu: %s",
				  (unsigned long long)pos, len, st->rt->cudaGetErrorString(ce));
			chunk_done(st, it, j->buf, 0);
			return;
		}
#endif
	}
	pthread_mutex_lock(&st->lock);
	st->fifo[(st->fifo_head + st->fifo_len++) % st->o.buffers] =
		(struct inflight){ .buf = j->buf, .item = it, .dst = mem, .len = len };
	pthread_cond_signal(&st->inflight_cv);
	pthread_mutex_unlock(&st->lock);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct job j;

#ifdef WFS_HAVE_CUDA
	if (w->st->o.mem == WFS_STAGE_MEM_DEVICE)
		w->st->rt->cudaSetDevice(w->st->o.device);
#endif
	while (take_job(w->st, &j))
		run_job(w, &j);
	return NULL;
}

/* Finishes queued backload chunks in FIFO order: waits for the copy, frees the buffer. */
static void *completer_main(void *arg)
{
	struct wfs_stager *st = arg;

#ifdef WFS_HAVE_CUDA
	if (st->o.mem == WFS_STAGE_MEM_DEVICE)
		st->rt->cudaSetDevice(st->o.device);
#endif
	for (;;) {
		struct inflight e;
		size_t ok = 0;

		pthread_mutex_lock(&st->lock);
		while (!st->fifo_len && !st->stopping)
			pthread_cond_wait(&st->inflight_cv, &st->lock);
		if (!st->fifo_len) {
			pthread_mutex_unlock(&st->lock);
			break;
		}
		e = st->fifo[st->fifo_head];
		st->fifo_head = (st->fifo_head + 1) % st->o.buffers;
		st->fifo_len--;
		pthread_mutex_unlock(&st->lock);

		if (st->o.mem == WFS_STAGE_MEM_HOST) {
			memcpy(e.dst, st->ring + (size_t)e.buf * st->o.buffer_bytes, e.len);
			ok = e.len;
		} else {
#ifdef WFS_HAVE_CUDA
			cudaError_t ce = st->rt->cudaEventSynchronize(st->events[e.buf]);

			if (ce == cudaSuccess)
				ok = e.len;
			else
				item_fail(st, e.item, WFS_STAGE_ECUDA, "host-to-device copy: %s",
					  st->rt->cudaGetErrorString(ce));
#endif
		}
		chunk_done(st, e.item, e.buf, ok);
	}
	return NULL;
}

#ifdef WFS_HAVE_CUDA
static int cuda_fail(const struct wfs_stager *st, cudaError_t ce, const char *what, char *err, size_t errlen)
{
	set_err(err, errlen, "stage: %s: %s (%s)", what, st->rt->cudaGetErrorString(ce), st->rt->cudaGetErrorName(ce));
	return WFS_STAGE_ECUDA;
}

/*
 * Load the CUDA runtime, check the device exists and learn its PCI bus id (no context is made current
 * here).
 */
static int cuda_probe(struct wfs_stager *st, char *err, size_t errlen)
{
	char why[WFS_STAGE_MSG_MAX];
	int count = 0;
	cudaError_t ce;

	if (wfs_cudart_get(&st->rt, why, sizeof(why)) < 0) {
		set_err(err, errlen, "stage: GPU staging is not available: %s", why);
		return WFS_STAGE_ENOCUDA;
	}
	ce = st->rt->cudaGetDeviceCount(&count);
	if (ce != cudaSuccess || count == 0) {
		/* Without a driver CUDA says "driver version is insufficient": say what is missing. */
		bool no_driver = ce == cudaErrorInsufficientDriver && access("/dev/nvidiactl", F_OK) != 0;

		set_err(err, errlen, "stage: no usable CUDA device: %s%s%s%s",
			no_driver ? "no NVIDIA GPU driver on this machine" : "",
			no_driver ? " (CUDA: " : "", ce != cudaSuccess ? st->rt->cudaGetErrorString(ce) : "none visible",
			no_driver ? ")" : "");
		return WFS_STAGE_ENODEV;
	}
	if (st->o.device < 0 || st->o.device >= count) {
		set_err(err, errlen, "stage: CUDA device %d does not exist (%d visible)", st->o.device, count);
		return WFS_STAGE_ENODEV;
	}
	ce = st->rt->cudaDeviceGetPCIBusId(st->bus_id, (int)sizeof(st->bus_id), st->o.device);
	if (ce != cudaSuccess)
		return cuda_fail(st, ce, "cudaDeviceGetPCIBusId", err, errlen);
	for (char *p = st->bus_id; *p; p++)
		*p = (char)tolower((unsigned char)*p);
	return 0;
}

/* Pin the ring, create streams and events. */
static int cuda_setup(struct wfs_stager *st, char *err, size_t errlen)
{
	int prev = 0, r = 0;
	cudaError_t ce;

	(void)st->rt->cudaGetDevice(&prev);
	ce = st->rt->cudaSetDevice(st->o.device);
	if (ce != cudaSuccess) {
		r = cuda_fail(st, ce, "cudaSetDevice", err, errlen);
		goto out;
	}
	ce = st->rt->cudaHostRegister(st->ring, st->ring_bytes, cudaHostRegisterPortable);
	if (ce != cudaSuccess) {
		r = cuda_fail(st, ce, "cudaHostRegister of the ring", err, errlen);
		goto out;
	}
	st->registered = true;
	for (unsigned i = 0; i < st->o.threads; i++) {
		ce = st->rt->cudaStreamCreateWithFlags(&st->workers[i].stream, cudaStreamNonBlocking);
		if (ce != cudaSuccess) {
			r = cuda_fail(st, ce, "cudaStreamCreate", err, errlen);
			goto out;
		}
	}
	st->events = calloc(st->o.buffers, sizeof(*st->events));
	if (!st->events) {
		r = -ENOMEM;
		goto out;
	}
	for (; st->nevents < st->o.buffers; st->nevents++) {
		/* Blocking sync: the completion thread sleeps instead of spinning a core the readers need. */
		ce = st->rt->cudaEventCreateWithFlags(&st->events[st->nevents],
					      cudaEventDisableTiming | cudaEventBlockingSync);
		if (ce != cudaSuccess) {
			r = cuda_fail(st, ce, "cudaEventCreate", err, errlen);
			goto out;
		}
	}
out:
	(void)st->rt->cudaSetDevice(prev);
	return r;
}
#endif

/*
 * Map exactly B × S bytes for the ring, starting on a 2 MiB boundary and advised as transparent huge
 * pages: every pread() writes into it, and with 4 KiB pages the copy takes a TLB miss per page (a
 * costly one inside a VM). Bound to the NUMA node with mbind() when there is one; the pages are placed
 * when first touched, which cudaHostRegister() does for a device stager.
 */
static int ring_alloc(struct wfs_stager *st)
{
	size_t huge = 2u << 20, over = st->ring_bytes + huge;
	unsigned char *p = mmap(NULL, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uintptr_t start;
	size_t head;

	if (p == MAP_FAILED)
		return -errno;
	/* Trim the over-allocation so that exactly ring_bytes stay mapped. */
	start = ((uintptr_t)p + huge - 1) & ~(uintptr_t)(huge - 1);
	head = start - (uintptr_t)p;
	if (head)
		munmap(p, head);
	if (over - head - st->ring_bytes)
		munmap((unsigned char *)start + st->ring_bytes, over - head - st->ring_bytes);
	st->ring = (unsigned char *)start;
	(void)madvise(st->ring, st->ring_bytes, MADV_HUGEPAGE);
	if (st->node >= 0)
		numa_tonode_memory(st->ring, st->ring_bytes, st->node);
	return 0;
}

int wfs_stage_new(const struct wfs_stage_opts *o, struct wfs_stager **out, char *err, size_t errlen)
{
	pthread_attr_t attr;
	struct wfs_stager *st;
	int r = 0;

	set_err(err, errlen, "%s", "");
	st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	if (o)
		st->o = *o;
	else
		wfs_stage_opts_init(&st->o);
	st->node = -1;
	pthread_mutex_init(&st->lock, NULL);
	pthread_cond_init(&st->work_cv, NULL);
	pthread_cond_init(&st->inflight_cv, NULL);
	pthread_cond_init(&st->done_cv, NULL);

	if (!st->o.buffers || !st->o.threads || !st->o.buffer_bytes || st->o.buffer_bytes % RING_ALIGN ||
	    (st->o.mem != WFS_STAGE_MEM_DEVICE && st->o.mem != WFS_STAGE_MEM_HOST) ||
	    st->o.buffer_bytes > SIZE_MAX / st->o.buffers || st->o.threads > 1024) {
		set_err(err, errlen, "stage: invalid options (buffers %u × %zu bytes, a multiple of %u; threads %u)",
			st->o.buffers, st->o.buffer_bytes, RING_ALIGN, st->o.threads);
		r = -EINVAL;
		goto out;
	}
	st->ring_bytes = st->o.buffer_bytes * st->o.buffers;

	if (st->o.mem == WFS_STAGE_MEM_DEVICE) {
#ifdef WFS_HAVE_CUDA
		r = cuda_probe(st, err, errlen);
		if (r < 0)
			goto out;
#else
		set_err(err, errlen, "stage: GPU staging is not available: weightfs was not built with CUDA");
		r = WFS_STAGE_ENOCUDA;
		goto out;
#endif
	}
	r = resolve_node(st, &st->node, err, errlen);
	if (r < 0)
		goto out;

	r = ring_alloc(st);
	if (r < 0) {
		set_err(err, errlen, "stage: cannot allocate a ring of %zu bytes: %s", st->ring_bytes, strerror(-r));
		goto out;
	}
	st->free_bufs = calloc(st->o.buffers, sizeof(*st->free_bufs));
	st->fifo = calloc(st->o.buffers, sizeof(*st->fifo));
	st->workers = calloc(st->o.threads, sizeof(*st->workers));
	if (!st->free_bufs || !st->fifo || !st->workers) {
		r = -ENOMEM;
		goto out;
	}
	/* Hand buffers out lowest index first (a stack, so push in reverse). */
	for (unsigned i = 0; i < st->o.buffers; i++)
		st->free_bufs[st->nfree++] = st->o.buffers - 1 - i;

#ifdef WFS_HAVE_CUDA
	if (st->o.mem == WFS_STAGE_MEM_DEVICE) {
		r = cuda_setup(st, err, errlen);
		if (r < 0)
			goto out;
	}
#endif
	pthread_attr_init(&attr);
	/* Best effort: a thread that cannot be bound still moves the right bytes, only further away. */
	if (st->node >= 0 && node_attr(st->node, &attr) < 0)
		wfs_log_once(&warned_no_bind, WFS_LOG_WARN, "stage: cannot bind threads to NUMA node %d's CPUs",
			     st->node);
	for (; st->nworkers < st->o.threads; st->nworkers++) {
		struct worker *w = &st->workers[st->nworkers];

		w->st = st;
		w->idx = st->nworkers;
		if (pthread_create(&w->tid, &attr, worker_main, w)) {
			set_err(err, errlen, "stage: cannot start worker threads");
			r = -EAGAIN;
			goto out_attr;
		}
	}
	if (pthread_create(&st->completer, &attr, completer_main, st)) {
		set_err(err, errlen, "stage: cannot start the completion thread");
		r = -EAGAIN;
		goto out_attr;
	}
	st->completer_started = true;
out_attr:
	pthread_attr_destroy(&attr);
out:
	if (r < 0) {
		if (r == -ENOMEM && err && !*err)
			set_err(err, errlen, "stage: out of memory");
		wfs_stage_free(st);
		return r;
	}
	*out = st;
	return 0;
}

void wfs_stage_free(struct wfs_stager *st)
{
	if (!st)
		return;
	pthread_mutex_lock(&st->lock);
	st->stopping = true;
	pthread_cond_broadcast(&st->work_cv);
	pthread_cond_broadcast(&st->inflight_cv);
	pthread_mutex_unlock(&st->lock);
	for (unsigned i = 0; i < st->nworkers; i++)
		pthread_join(st->workers[i].tid, NULL);
	if (st->completer_started)
		pthread_join(st->completer, NULL);
#ifdef WFS_HAVE_CUDA
	/* Streams, events and the pinning exist only once the runtime was loaded (st->rt set). */
	for (unsigned i = 0; i < st->nevents; i++)
		st->rt->cudaEventDestroy(st->events[i]);
	free(st->events);
	for (unsigned i = 0; st->workers && i < st->o.threads; i++)
		if (st->workers[i].stream)
			st->rt->cudaStreamDestroy(st->workers[i].stream);
	if (st->registered)
		st->rt->cudaHostUnregister(st->ring);
#endif
	if (st->ring)
		munmap(st->ring, st->ring_bytes);
	free(st->workers);
	free(st->fifo);
	free(st->free_bufs);
	pthread_cond_destroy(&st->done_cv);
	pthread_cond_destroy(&st->inflight_cv);
	pthread_cond_destroy(&st->work_cv);
	pthread_mutex_destroy(&st->lock);
	free(st);
}

static int item_path_cmp(const void *pa, const void *pb)
{
	return strcmp((*(const struct wfs_stage_item *const *)pa)->path,
		      (*(const struct wfs_stage_item *const *)pb)->path);
}

/*
 * Does an offload item of @items share its path with another item? Its workers would write the
 * file while another item's write or read it (mixed bytes, a short read), and a failed item's
 * unlink could take the other's finished file. Compares the strings only: the caller keeps one file
 * under two spellings apart. Returns 0, -EINVAL (shared) or -ENOMEM.
 */
static int offload_paths_shared(const struct wfs_stage_item *items, size_t n)
{
	const struct wfs_stage_item **by;
	bool offload = false;
	int r = 0;

	for (size_t i = 0; i < n && !offload; i++)
		offload = items[i].flags & WFS_STAGE_OFFLOAD;
	if (!offload || n < 2)
		return 0;
	by = malloc(n * sizeof(*by));
	if (!by)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		by[i] = &items[i];
	qsort(by, n, sizeof(*by), item_path_cmp);
	/* In a run of equal paths an offload item is next to another of the run. */
	for (size_t i = 1; i < n && !r; i++)
		if (((by[i - 1]->flags | by[i]->flags) & WFS_STAGE_OFFLOAD) && !strcmp(by[i - 1]->path, by[i]->path))
			r = -EINVAL;
	free(by);
	return r;
}

int wfs_stage_submit(struct wfs_stager *st, const struct wfs_stage_item *items, size_t n,
		     struct wfs_stage_batch **out)
{
	struct wfs_stage_batch *b;
	size_t S = st->o.buffer_bytes;
	int r = 0;

	for (size_t i = 0; i < n; i++) {
		const struct wfs_stage_item *w = &items[i];
		bool offload = w->flags & WFS_STAGE_OFFLOAD;

		struct wfs_digest d;

		if (!w->path || (!w->mem && w->bytes) ||
		    (offload && (w->offset || (w->flags & WFS_STAGE_EXACT))) ||
		    (!offload && (w->flags & WFS_STAGE_FSYNC)) ||
		    (w->digest && (!offload || strlen(w->digest) != WFS_DIGEST_HEX_CHARS ||
				   wfs_digest_from_hex(w->digest, &d))))
			return -EINVAL;
		if (w->offset > UINT64_MAX - w->bytes || w->offset + w->bytes > (uint64_t)INT64_MAX)
			return -EOVERFLOW;
	}
	r = offload_paths_shared(items, n);
	if (r < 0)
		return r;
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->st = st;
	b->n = n;
	b->items_left = n;
	b->items = calloc(n ? n : 1, sizeof(*b->items));
	if (!b->items) {
		r = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		struct stage_item *it = &b->items[i];

		it->it = items[i];
		it->it.path = NULL;
		it->batch = b;
		it->fd = -1;
		it->nchunks = items[i].bytes ? (items[i].bytes + S - 1) / S : 1;
		it->chunks_left = it->nchunks;
		if (items[i].digest)
			memcpy(it->digest, items[i].digest, sizeof(it->digest));
		it->it.digest = it->digest[0] ? it->digest : NULL;
		it->it.path = strdup(items[i].path);
		if (!it->it.path) {
			r = -ENOMEM;
			goto out;
		}
	}
	if (n) {
		pthread_mutex_lock(&st->lock);
		b->pending = true;
		if (st->pending_tail)
			st->pending_tail->next = b;
		else
			st->pending_head = b;
		st->pending_tail = b;
		pthread_cond_broadcast(&st->work_cv);
		pthread_mutex_unlock(&st->lock);
	}
	*out = b;
out:
	if (r < 0) {
		for (size_t i = 0; b->items && i < n; i++)
			free((char *)b->items[i].it.path);
		free(b->items);
		free(b);
	}
	return r;
}

int wfs_stage_wait(struct wfs_stage_batch *b)
{
	struct wfs_stager *st = b->st;
	int r = 0;

	pthread_mutex_lock(&st->lock);
	while (b->items_left)
		pthread_cond_wait(&st->done_cv, &st->lock);
	for (size_t i = 0; i < b->n && !r; i++)
		r = b->items[i].err;
	pthread_mutex_unlock(&st->lock);
	return r;
}

int wfs_stage_result(const struct wfs_stage_batch *b, size_t i, const char **msg)
{
	struct wfs_stager *st = b->st;
	int r;

	if (i >= b->n)
		return -EINVAL;
	pthread_mutex_lock(&st->lock);
	if (!b->items[i].done) {
		r = -EBUSY;
	} else {
		r = b->items[i].err;
		if (msg)
			*msg = b->items[i].msg;
	}
	pthread_mutex_unlock(&st->lock);
	return r;
}

void wfs_stage_batch_free(struct wfs_stage_batch *b)
{
	if (!b)
		return;
	wfs_stage_wait(b);
	for (size_t i = 0; i < b->n; i++)
		free((char *)b->items[i].it.path);
	free(b->items);
	free(b);
}

static int run_one(struct wfs_stager *st, const struct wfs_stage_item *item, char *err, size_t errlen)
{
	struct wfs_stage_batch *b;
	const char *msg = "";
	int r;

	set_err(err, errlen, "%s", "");
	r = wfs_stage_submit(st, item, 1, &b);
	if (r < 0) {
		set_err(err, errlen, "%s: stage: %s", item->path, strerror(-r));
		return r;
	}
	wfs_stage_wait(b);
	r = wfs_stage_result(b, 0, &msg);
	if (r < 0)
		set_err(err, errlen, "%s", msg);
	wfs_stage_batch_free(b);
	return r;
}

int wfs_stage_load(struct wfs_stager *st, const char *path, uint64_t offset, uint64_t bytes, void *mem,
		   unsigned flags, char *err, size_t errlen)
{
	struct wfs_stage_item item = {
		.path = path, .offset = offset, .bytes = bytes, .mem = mem, .flags = flags & WFS_STAGE_EXACT,
	};

	return run_one(st, &item, err, errlen);
}

int wfs_stage_offload(struct wfs_stager *st, const void *mem, uint64_t bytes, const char *path,
		      unsigned flags, const char *digest, char *err, size_t errlen)
{
	struct wfs_stage_item item = {
		.path = path, .bytes = bytes, .mem = (void *)(uintptr_t)mem,
		.flags = WFS_STAGE_OFFLOAD | (flags & WFS_STAGE_FSYNC), .digest = digest,
	};

	return run_one(st, &item, err, errlen);
}

void wfs_stage_stats(struct wfs_stager *st, struct wfs_stage_stats *out)
{
	memset(out, 0, sizeof(*out));
	pthread_mutex_lock(&st->lock);
	out->ring_bytes = st->ring_bytes;
	out->host_bytes_peak = st->ring ? st->ring_bytes : 0;
	out->pinned = st->registered;
	out->numa_node = st->node;
	out->buffers = st->o.buffers;
	out->buffer_bytes = st->o.buffer_bytes;
	out->threads = st->o.threads;
	out->buffers_in_use_peak = st->in_use_peak;
	out->bytes_loaded = st->loaded;
	out->bytes_offloaded = st->offloaded;
	snprintf(out->pci_bus_id, sizeof(out->pci_bus_id), "%s", st->bus_id);
	pthread_mutex_unlock(&st->lock);
}
