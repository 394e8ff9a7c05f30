/* SPDX-License-Identifier: Apache-2.0 */
/*
 * weightfsctl stage — stage files (or directories of params) into GPU memory with lib/stage and report
 * the rate; --offload writes them back out (device → file); --bench measures, in the same run, the
 * pinned cudaMemcpy peak, the naive path (pageable mmap of the file → cudaMemcpy) and the helper.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "stage.h"

#ifdef WFS_HAVE_CUDA
#include "cudart.h"
#endif

#define MIB (1024.0 * 1024.0)
#define ALIGN_DEV 256u          /* each file starts at a multiple of this in the staging area */
#define CMP_CHUNK (16u << 20)   /* bytes compared at a time by --verify */

struct file {
	char *path;
	char *rel;       /* --offload writes it to OUTDIR/rel: a file given directly, its last
			    component; one found under a directory argument, its path below it */
	uint64_t bytes;
	uint64_t at;     /* offset in the staging area */
};

/* nftw() takes no user pointer, so the walk collects into these. */
static struct file *files;
static size_t nfiles, capfiles;
static size_t walk_root_len;

static int add_file(const char *path, const char *rel, uint64_t bytes)
{
	if (nfiles == capfiles) {
		size_t cap = capfiles ? 2 * capfiles : 64;
		struct file *f = realloc(files, cap * sizeof(*f));

		if (!f)
			return -ENOMEM;
		files = f;
		capfiles = cap;
	}
	files[nfiles].path = strdup(path);
	files[nfiles].rel = strdup(rel);
	if (!files[nfiles].path || !files[nfiles].rel)
		return -ENOMEM;
	files[nfiles++].bytes = bytes;
	return 0;
}

static int walk_one(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
	(void)ftw;
	if (type == FTW_F && S_ISREG(sb->st_mode))
		return add_file(path, path + walk_root_len + (path[walk_root_len] == '/'), (uint64_t)sb->st_size)
			       ? 1
			       : 0;
	if (type == FTW_DNR || type == FTW_NS) {
		fprintf(stderr, "weightfsctl stage: %s: cannot read\n", path);
		return 1;
	}
	return 0;
}

static int collect(const char *arg)
{
	struct stat sb;
	const char *slash;

	if (stat(arg, &sb) < 0) {
		fprintf(stderr, "weightfsctl stage: %s: %s\n", arg, strerror(errno));
		return -1;
	}
	if (!S_ISDIR(sb.st_mode)) {
		slash = strrchr(arg, '/');
		if (add_file(arg, slash ? slash + 1 : arg, (uint64_t)sb.st_size) < 0)
			goto nomem;
		return 0;
	}
	walk_root_len = strlen(arg);
	if (nftw(arg, walk_one, 32, FTW_PHYS) != 0) {
		if (errno == ENOMEM)
			goto nomem;
		fprintf(stderr, "weightfsctl stage: %s: cannot walk the directory\n", arg);
		return -1;
	}
	return 0;
nomem:
	fprintf(stderr, "weightfsctl stage: out of memory\n");
	return -1;
}

/*
 * Order of destination names, byte by byte except that '/' comes before every other byte: the names
 * below "a/" then follow "a" at once (before "a.x"), so a name that another needs as a directory is
 * next to it.
 */
static int rel_cmp(const void *pa, const void *pb)
{
	const unsigned char *x = (const unsigned char *)(*(const struct file *const *)pa)->rel;
	const unsigned char *y = (const unsigned char *)(*(const struct file *const *)pb)->rel;
	int cx, cy;

	while (*x && *x == *y)
		x++, y++;
	cx = *x == '/' ? 1 : *x ? *x + 1 : 0;
	cy = *y == '/' ? 1 : *y ? *y + 1 : 0;
	return (cx > cy) - (cx < cy);
}

/*
 * --offload: refuse inputs whose destinations clash, before anything is staged or written. Two
 * inputs with one destination name (M/rank0/w and M/rank1/w given directly, or the same-named files
 * of directories M/rank0 and M/rank1) would be written into one file at once, by two workers: one
 * file, of mixed bytes, for two reported as offloaded. A destination that another needs as a
 * directory would fail half-way. Prints one line (the first clash, how many in all). Returns the
 * exit status: 0 (no clash), 2 (a clash: a usage error) or 1 (out of memory).
 */
static int check_destinations(const char *outdir)
{
	const struct file **by = malloc((nfiles ? nfiles : 1) * sizeof(*by));
	const struct file *a = NULL, *b = NULL;
	size_t clashes = 0;
	bool as_dir = false;

	if (!by) {
		fprintf(stderr, "weightfsctl stage: out of memory\n");
		return 1;
	}
	for (size_t i = 0; i < nfiles; i++)
		by[i] = &files[i];
	qsort(by, nfiles, sizeof(*by), rel_cmp);
	for (size_t i = 1; i < nfiles; i++) {
		const char *p = by[i - 1]->rel, *q = by[i]->rel;
		size_t n = strlen(p);
		bool same = strcmp(p, q) == 0, below = !same && strncmp(p, q, n) == 0 && q[n] == '/';

		if (!same && !below)
			continue;
		if (!clashes++) {
			a = by[i - 1];
			b = by[i];
			as_dir = below;
		}
	}
	free(by);
	if (!clashes)
		return 0;
	if (as_dir)
		fprintf(stderr, "weightfsctl stage: --offload %s: %s would be written to %s/%s, which %s needs as a "
			"directory", outdir, a->path, outdir, a->rel, b->path);
	else
		fprintf(stderr, "weightfsctl stage: --offload %s: %s and %s would both be written to %s/%s",
			outdir, a->path, b->path, outdir, a->rel);
	if (clashes > 1)
		fprintf(stderr, " (%zu clashes in all)", clashes);
	fprintf(stderr, "; nothing staged or written (a file given directly keeps its name, one found under a "
		"directory its path below it: offload such inputs to separate directories)\n");
	return 2;
}

static double gbps(uint64_t bytes, double s)
{
	return s > 0 ? (double)bytes / s / 1e9 : 0;
}

#ifdef WFS_HAVE_CUDA
static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
#endif

static void usage(FILE *out)
{
	fprintf(out,
		"usage: weightfsctl stage [options] PATH...\n"
		"Stage files, or directories of param files (recursively), from PATH into GPU memory through\n"
		"a ring of pinned buffers, and report bytes, seconds and GB/s.\n"
		"\n"
		"  -d, --device N      CUDA device index as this process sees it (default 0)\n"
		"  -b, --buffers N     ring buffers (default 64)\n"
		"  -s, --buffer-mib N  MiB per ring buffer (default 2)\n"
		"  -t, --threads N     reader threads (default: online CPUs - 2, 2 to 12)\n"
		"  -n, --numa NODE     NUMA node for the ring and threads, -1 for unbound\n"
		"                      (default: the GPU's node; env WFS_STAGE_NUMA_NODE)\n"
		"      --host          stage into host memory instead of a GPU (no CUDA needed)\n"
		"      --verify        compare the staged (and offloaded) bytes with the files\n"
		"      --offload DIR   then write the staged bytes back out under DIR (device to file): a\n"
		"                      file given as PATH to DIR/NAME, NAME its last component; a file\n"
		"                      found under a directory PATH to DIR/REL, REL its path below PATH.\n"
		"                      Inputs that would share a destination are refused before anything\n"
		"                      is staged (exit 2)\n"
		"      --fsync         with --offload: fsync every file before closing it\n"
		"      --bench         measure pinned cudaMemcpy peak, the naive path (pageable mmap of the\n"
		"                      file, cudaMemcpy) and the helper in one run; print the ratios\n"
		"      --cold          with --bench: drop the files' page cache before every pass, and also\n"
		"                      time plain pread of the files\n"
		"  -r, --repeat N      with --bench: passes of each method, interleaved (default 5); medians\n"
		"  -h, --help          this text\n"
		"Progress is shown on a terminal (not with --bench).\n"
		"Exit status: 0 done, 1 a file or the GPU failed, 2 usage error (clashing --offload\n"
		"destinations included).\n");
}

/* The staging area: device memory, or host memory with --host. */
struct area {
	bool host;
	unsigned char *mem;
	uint64_t bytes;
#ifdef WFS_HAVE_CUDA
	const struct wfs_cudart *rt; /* device memory: the CUDA runtime (lib/cudart.h) */
#endif
};

static int area_alloc(struct area *a, uint64_t bytes)
{
	a->bytes = bytes;
	if (a->host) {
		a->mem = malloc(bytes ? bytes : 1);
		if (!a->mem) {
			fprintf(stderr, "weightfsctl stage: cannot allocate %llu bytes of host memory\n",
				(unsigned long long)bytes);
			return -1;
		}
		return 0;
	}
#ifdef WFS_HAVE_CUDA
	char why[WFS_STAGE_MSG_MAX];
	cudaError_t ce;

	if (wfs_cudart_get(&a->rt, why, sizeof(why)) < 0) {
		fprintf(stderr, "weightfsctl stage: %s\n", why);
		return -1;
	}
	ce = a->rt->cudaMalloc((void **)&a->mem, bytes ? bytes : 1);
	if (ce != cudaSuccess) {
		fprintf(stderr, "weightfsctl stage: cudaMalloc of %llu bytes: %s\n", (unsigned long long)bytes,
			a->rt->cudaGetErrorString(ce));
		a->mem = NULL;
		return -1;
	}
	return 0;
#else
	return -1;
#endif
}

static void area_free(struct area *a)
{
	if (a->host)
		free(a->mem);
#ifdef WFS_HAVE_CUDA
	else if (a->mem)
		a->rt->cudaFree(a->mem);
#endif
	a->mem = NULL;
}

/* Copy @n bytes at @off of the area to @dst (host). */
static int area_read(const struct area *a, uint64_t off, void *dst, size_t n)
{
	if (a->host) {
		memcpy(dst, a->mem + off, n);
		return 0;
	}
#ifdef WFS_HAVE_CUDA
	cudaError_t ce = a->rt->cudaMemcpy(dst, a->mem + off, n, cudaMemcpyDeviceToHost);

	if (ce != cudaSuccess) {
		fprintf(stderr, "weightfsctl stage: reading device memory back: %s\n",
			a->rt->cudaGetErrorString(ce));
		return -1;
	}
#endif
	return 0;
}

/*
 * Progress of one batch on a terminal: the progress line (ctl.h), rewritten once a second by a thread
 * that reads the stager's byte counters (wfs_stage_stats is thread-safe), and erased when the batch
 * ends. A batch done within a second prints nothing.
 */
struct progress {
	struct wfs_stager *st;
	const char *what;
	uint64_t base;        /* bytes the stager had moved before the batch */
	uint64_t total;       /* bytes in the batch */
	double t0;
	pthread_t thread;
	pthread_mutex_t lock; /* protects done */
	pthread_cond_t wake;
	bool done;
	struct wfs_ctl_progress line; /* the thread's until it is joined */
};

static uint64_t bytes_moved(struct wfs_stager *st)
{
	struct wfs_stage_stats s;

	wfs_stage_stats(st, &s);
	return s.bytes_loaded + s.bytes_offloaded;
}

static void progress_print(struct progress *p)
{
	uint64_t done = bytes_moved(p->st) - p->base;

	wfs_ctl_progress_show(&p->line, false, "%s: %.1f/%.1f MiB (%.0f%%), %.2f GB/s", p->what,
			      (double)done / MIB, (double)p->total / MIB,
			      p->total ? 100.0 * (double)done / (double)p->total : 100.0,
			      gbps(done, wfs_ctl_now() - p->t0));
}

static void *progress_main(void *arg)
{
	struct progress *p = arg;
	struct timespec until;
	bool done;

	clock_gettime(CLOCK_REALTIME, &until);
	for (;;) {
		until.tv_sec++;
		pthread_mutex_lock(&p->lock);
		while (!p->done && pthread_cond_timedwait(&p->wake, &p->lock, &until) == 0)
			;
		done = p->done;
		pthread_mutex_unlock(&p->lock);
		if (done)
			return NULL;
		progress_print(p);
	}
}

/*
 * Start the progress line for a batch of @total bytes; false (and no line) when stderr is not a
 * terminal or no thread could start.
 */
static bool progress_start(struct progress *p, struct wfs_stager *st, const char *what, uint64_t total)
{
	*p = (struct progress){ .st = st, .what = what, .total = total, .base = bytes_moved(st),
				.t0 = wfs_ctl_now() };
	wfs_ctl_progress_init(&p->line, true);
	if (!p->line.tty)
		return false;
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->wake, NULL);
	if (pthread_create(&p->thread, NULL, progress_main, p) == 0)
		return true;
	pthread_cond_destroy(&p->wake);
	pthread_mutex_destroy(&p->lock);
	return false;
}

static void progress_stop(struct progress *p)
{
	pthread_mutex_lock(&p->lock);
	p->done = true;
	pthread_cond_signal(&p->wake);
	pthread_mutex_unlock(&p->lock);
	pthread_join(p->thread, NULL);
	wfs_ctl_progress_clear(&p->line);
	pthread_cond_destroy(&p->wake);
	pthread_mutex_destroy(&p->lock);
}

/*
 * Run one batch; on failure print one line (first failure, and how many) and return -1. With
 * @progress, a progress line is shown on stderr while it runs, if that is a terminal.
 */
static int run_batch(struct wfs_stager *st, struct wfs_stage_item *items, size_t n, const char *what,
		     bool progress, double *secs)
{
	struct wfs_stage_batch *b;
	struct progress p;
	size_t failed = 0;
	const char *first = NULL, *msg;
	uint64_t total = 0;
	double t0 = wfs_ctl_now();
	int r;

	for (size_t i = 0; i < n; i++)
		total += items[i].bytes;
	progress = progress && progress_start(&p, st, what, total);
	r = wfs_stage_submit(st, items, n, &b);
	if (r >= 0)
		wfs_stage_wait(b);
	*secs = wfs_ctl_now() - t0;
	if (progress)
		progress_stop(&p);
	if (r < 0) {
		fprintf(stderr, "weightfsctl stage: %s: %s\n", what, strerror(-r));
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		if (wfs_stage_result(b, i, &msg) < 0) {
			failed++;
			if (!first)
				first = msg;
		}
	}
	if (failed)
		fprintf(stderr, "weightfsctl stage: %s: %zu of %zu files failed; first: %s\n", what, failed, n,
			first);
	wfs_stage_batch_free(b);
	return failed ? -1 : 0;
}

static int pread_full(int fd, unsigned char *buf, size_t n, uint64_t off)
{
	size_t got = 0;

	while (got < n) {
		ssize_t k = pread(fd, buf + got, n - got, (off_t)(off + got));

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return k < 0 ? -errno : -ENODATA;
		got += (size_t)k;
	}
	return 0;
}

/* Compare every file with its bytes in the area (@area_side) or with the file under @outdir. */
static int verify(const struct area *a, const char *outdir)
{
	unsigned char *x = malloc(CMP_CHUNK), *y = malloc(CMP_CHUNK);
	int rc = -1;

	if (!x || !y) {
		fprintf(stderr, "weightfsctl stage: out of memory\n");
		goto out;
	}
	for (size_t i = 0; i < nfiles; i++) {
		const struct file *f = &files[i];
		char other[4096];
		int fd = open(f->path, O_RDONLY | O_CLOEXEC), fd2 = -1, r = 0;

		if (outdir) {
			snprintf(other, sizeof(other), "%s/%s", outdir, f->rel);
			fd2 = open(other, O_RDONLY | O_CLOEXEC);
		}
		if (fd < 0 || (outdir && fd2 < 0)) {
			fprintf(stderr, "weightfsctl stage: verify: %s: %s\n", fd < 0 ? f->path : other,
				strerror(errno));
			if (fd >= 0)
				close(fd);
			goto out;
		}
		for (uint64_t off = 0; off < f->bytes && !r; off += CMP_CHUNK) {
			size_t n = f->bytes - off < CMP_CHUNK ? (size_t)(f->bytes - off) : CMP_CHUNK;

			r = pread_full(fd, x, n, off);
			if (!r)
				r = outdir ? pread_full(fd2, y, n, off) : area_read(a, f->at + off, y, n);
			if (!r && memcmp(x, y, n)) {
				fprintf(stderr, "weightfsctl stage: verify: %s: bytes differ in [%llu, %llu) %s\n",
					f->path, (unsigned long long)off, (unsigned long long)(off + n),
					outdir ? "in the offloaded file" : "on the device");
				r = -EBADMSG;
			}
		}
		close(fd);
		if (fd2 >= 0)
			close(fd2);
		if (r < 0)
			goto out;
	}
	rc = 0;
out:
	free(x);
	free(y);
	return rc;
}

static int mkdir_parents(const char *path)
{
	char tmp[4096];

	snprintf(tmp, sizeof(tmp), "%s", path);
	for (char *p = tmp + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(tmp, 0755) < 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	return 0;
}

#ifdef WFS_HAVE_CUDA
static void drop_cache(void)
{
	int fd;

	/* Under a weightfs passthrough mount a file's pages belong to its backing object, which
	 * posix_fadvise on the mounted file cannot reach: drop every clean page when allowed (root). */
	sync();
	fd = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
	if (fd >= 0) {
		bool dropped = write(fd, "3\n", 2) == 2;

		close(fd);
		if (dropped)
			return;
	}
	for (size_t i = 0; i < nfiles; i++) {
		fd = open(files[i].path, O_RDONLY | O_CLOEXEC);
		if (fd >= 0) {
			(void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
			close(fd);
		}
	}
}

static double pread_pass(uint64_t total)
{
	unsigned char *buf = malloc(CMP_CHUNK);
	double t0 = wfs_ctl_now();

	if (!buf)
		return 0;
	for (size_t i = 0; i < nfiles; i++) {
		int fd = open(files[i].path, O_RDONLY | O_CLOEXEC);

		if (fd < 0)
			continue;
		for (uint64_t off = 0; off < files[i].bytes; off += CMP_CHUNK) {
			size_t n = files[i].bytes - off < CMP_CHUNK ? (size_t)(files[i].bytes - off) : CMP_CHUNK;

			if (pread_full(fd, buf, n, off) < 0)
				break;
		}
		close(fd);
	}
	free(buf);
	return gbps(total, wfs_ctl_now() - t0);
}

/* Naive path: pageable mmap of each file, one cudaMemcpy each. Returns GB/s, or -1. */
static double naive_pass(const struct area *a, uint64_t total)
{
	double t0 = wfs_ctl_now();

	for (size_t i = 0; i < nfiles; i++) {
		const struct file *f = &files[i];
		int fd;
		void *map;
		cudaError_t ce;

		if (!f->bytes)
			continue;
		fd = open(f->path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			return -1;
		map = mmap(NULL, f->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
		close(fd);
		if (map == MAP_FAILED)
			return -1;
		ce = a->rt->cudaMemcpy(a->mem + f->at, map, f->bytes, cudaMemcpyHostToDevice);
		munmap(map, f->bytes);
		if (ce != cudaSuccess) {
			fprintf(stderr, "weightfsctl stage: naive cudaMemcpy: %s\n", a->rt->cudaGetErrorString(ce));
			return -1;
		}
	}
	return gbps(total, wfs_ctl_now() - t0);
}

static int bench(struct wfs_stager *st, const struct area *a, struct wfs_stage_item *items, uint64_t total,
		 int repeat, bool cold)
{
	double *peak = calloc((size_t)repeat, sizeof(double)), *naive = calloc((size_t)repeat, sizeof(double));
	double *help = calloc((size_t)repeat, sizeof(double)), *rd = calloc((size_t)repeat, sizeof(double));
	uint64_t pbytes = total < (1ull << 30) ? total : (1ull << 30);
	void *pinned = NULL;
	struct wfs_stage_stats s;
	cudaError_t ce;
	int rc = -1;

	if (!peak || !naive || !help || !rd)
		goto out;
	if (!pbytes)
		pbytes = 1;
	/* The peak's own pinned buffer exists only for this measurement; the helper pins its ring only. */
	ce = a->rt->cudaHostAlloc(&pinned, pbytes, cudaHostAllocDefault);
	if (ce != cudaSuccess) {
		fprintf(stderr, "weightfsctl stage: cudaHostAlloc of %llu bytes: %s\n", (unsigned long long)pbytes,
			a->rt->cudaGetErrorString(ce));
		goto out;
	}
	memset(pinned, 1, pbytes);
	/* One untimed pass of each warms the CUDA context, the page cache (warm runs) and the copy engines. */
	a->rt->cudaMemcpy(a->mem, pinned, pbytes, cudaMemcpyHostToDevice);
	if (!cold) {
		double t;

		if (run_batch(st, items, nfiles, "bench warm-up", false, &t) < 0)
			goto out;
	}
	for (int r = 0; r < repeat; r++) {
		double t0, t;

		t0 = wfs_ctl_now();
		ce = a->rt->cudaMemcpy(a->mem, pinned, pbytes, cudaMemcpyHostToDevice);
		peak[r] = gbps(pbytes, wfs_ctl_now() - t0);
		if (ce != cudaSuccess) {
			fprintf(stderr, "weightfsctl stage: pinned cudaMemcpy: %s\n", a->rt->cudaGetErrorString(ce));
			goto out;
		}
		if (cold)
			drop_cache();
		naive[r] = naive_pass(a, total);
		if (naive[r] < 0)
			goto out;
		if (cold)
			drop_cache();
		if (run_batch(st, items, nfiles, "bench", false, &t) < 0)
			goto out;
		help[r] = gbps(total, t);
		if (cold) {
			drop_cache();
			rd[r] = pread_pass(total);
		}
		printf("  pass %d: peak %.2f  naive %.2f  helper %.2f", r + 1, peak[r], naive[r], help[r]);
		if (cold)
			printf("  pread %.2f", rd[r]);
		printf(" GB/s\n");
	}
	wfs_stage_stats(st, &s);
	{
		double mp = median(peak, repeat), mn = median(naive, repeat), mh = median(help, repeat);

		printf("bench: %zu files, %llu bytes, %s page cache, %d passes each, interleaved; medians:\n", nfiles,
		       (unsigned long long)total, cold ? "cold" : "warm", repeat);
		printf("  pinned cudaMemcpy peak (%llu bytes)   %8.2f GB/s\n", (unsigned long long)pbytes, mp);
		printf("  naive: pageable mmap -> cudaMemcpy     %8.2f GB/s\n", mn);
		printf("  helper (%u x %.0f MiB ring, %u threads)  %8.2f GB/s\n", s.buffers,
		       (double)s.buffer_bytes / MIB, s.threads, mh);
		if (cold)
			printf("  plain pread, one thread, 16 MiB reads  %8.2f GB/s\n", median(rd, repeat));
		printf("  helper / peak  = %.2f   (goal >= 0.9)\n", mp > 0 ? mh / mp : 0);
		printf("  helper / naive = %.2fx  (goal >= 6)\n", mn > 0 ? mh / mn : 0);
		if (cold)
			printf("  helper / pread = %.2f\n", median(rd, repeat) > 0 ? mh / median(rd, repeat) : 0);
		printf("  helper pinned host memory: %llu bytes (the ring), NUMA node %d, GPU %s\n",
		       (unsigned long long)s.ring_bytes, s.numa_node, s.pci_bus_id);
	}
	rc = 0;
out:
	if (pinned)
		a->rt->cudaFreeHost(pinned);
	free(peak);
	free(naive);
	free(help);
	free(rd);
	return rc;
}
#endif

int wfs_ctl_stage(int argc, char **argv)
{
	/* A value outside its option's range (-1, 0, LONG_MIN): not given, the library's default stands. */
	long device = -1, buffers = 0, buffer_mib = 0, threads = 0, numa = LONG_MIN, repeat = 5;
	bool host = false, do_verify = false, do_fsync = false, do_bench = false, cold = false;
	const char *outdir = NULL;
	const struct wfs_ctl_opt opts[] = {
		WFS_CTL_OPT_LONG("device", 'd', &device, 0, 4095, NULL),
		WFS_CTL_OPT_LONG("buffers", 'b', &buffers, 1, 4096, NULL),
		WFS_CTL_OPT_LONG("buffer-mib", 's', &buffer_mib, 1, 1024, NULL),
		WFS_CTL_OPT_LONG("threads", 't', &threads, 1, 256, NULL),
		WFS_CTL_OPT_LONG("numa", 'n', &numa, -1, 4095, NULL),
		WFS_CTL_OPT_LONG("repeat", 'r', &repeat, 1, 1000, NULL),
		WFS_CTL_OPT_FLAG("host", 0, &host),
		WFS_CTL_OPT_FLAG("verify", 0, &do_verify),
		WFS_CTL_OPT_STRING("offload", 0, &outdir),
		WFS_CTL_OPT_FLAG("fsync", 0, &do_fsync),
		WFS_CTL_OPT_FLAG("bench", 0, &do_bench),
		WFS_CTL_OPT_FLAG("cold", 0, &cold),
		WFS_CTL_OPT_END,
	};
	const struct wfs_ctl_cmd cmd = {"stage", usage, opts, 0, -1};
	struct wfs_stage_opts o;
	struct wfs_stager *st = NULL;
	struct wfs_stage_item *items = NULL;
	struct wfs_stage_stats s;
	struct area a = { 0 };
	uint64_t total = 0;
	char err[WFS_STAGE_MSG_MAX];
	double secs;
	int c, rc = 1;

	c = wfs_ctl_parse(&cmd, argc, argv);
	if (c != WFS_CTL_GO_ON)
		return c;
	wfs_stage_opts_init(&o);
	if (device >= 0)
		o.device = (int)device;
	if (buffers)
		o.buffers = (unsigned)buffers;
	if (buffer_mib)
		o.buffer_bytes = (size_t)buffer_mib << 20;
	if (threads)
		o.threads = (unsigned)threads;
	if (numa != LONG_MIN)
		o.numa_node = numa < 0 ? -2 : (int)numa;
	if (host)
		o.mem = WFS_STAGE_MEM_HOST;
	a.host = host;
	if (optind >= argc) {
		fprintf(stderr, "weightfsctl stage: no PATH given (see --help)\n");
		return 2;
	}
	if (cold && !do_bench) {
		fprintf(stderr, "weightfsctl stage: --cold goes with --bench\n");
		return 2;
	}
	if (do_bench && (a.host || outdir)) {
		fprintf(stderr, "weightfsctl stage: --bench measures GPU copies: not with --host or --offload\n");
		return 2;
	}
	if (!a.host && !wfs_stage_have_cuda()) {
		fprintf(stderr, "weightfsctl stage: weightfs was not built with CUDA (use --host to test the "
				"pipeline into host memory)\n");
		return 1;
	}

	for (int i = optind; i < argc; i++)
		if (collect(argv[i]) < 0)
			goto out;
	if (outdir) {
		c = check_destinations(outdir);
		if (c) {
			rc = c;
			goto out;
		}
	}
	for (size_t i = 0; i < nfiles; i++) {
		files[i].at = total;
		total += (files[i].bytes + ALIGN_DEV - 1) / ALIGN_DEV * ALIGN_DEV;
	}

	if (wfs_stage_new(&o, &st, err, sizeof(err)) < 0) {
		fprintf(stderr, "weightfsctl %s\n", err);
		goto out;
	}
	if (area_alloc(&a, total) < 0)
		goto out;
	items = calloc(nfiles ? nfiles : 1, sizeof(*items));
	if (!items) {
		fprintf(stderr, "weightfsctl stage: out of memory\n");
		goto out;
	}
	total = 0;
	for (size_t i = 0; i < nfiles; i++) {
		items[i] = (struct wfs_stage_item){ .path = files[i].path, .bytes = files[i].bytes,
						    .mem = a.mem + files[i].at, .flags = WFS_STAGE_EXACT };
		total += files[i].bytes;
	}

	if (do_bench) {
#ifdef WFS_HAVE_CUDA
		if (bench(st, &a, items, total, (int)repeat, cold) < 0)
			goto out;
#else
		(void)repeat; /* unreachable: --bench needs a GPU stager, refused above */
#endif
	} else {
		if (run_batch(st, items, nfiles, "stage", true, &secs) < 0)
			goto out;
		wfs_stage_stats(st, &s);
		printf("staged %zu files, %llu bytes in %.3f s: %.2f GB/s (%s; ring %u x %zu bytes = %llu bytes "
		       "%s, %u threads, NUMA node %d)\n",
		       nfiles, (unsigned long long)total, secs, gbps(total, secs),
		       a.host ? "host memory" : s.pci_bus_id, s.buffers, s.buffer_bytes,
		       (unsigned long long)s.ring_bytes, s.pinned ? "pinned" : "unpinned", s.threads, s.numa_node);
	}
	if (do_verify) {
		if (verify(&a, NULL) < 0)
			goto out;
		printf("verify: %zu files, every byte on the %s equals the file\n", nfiles,
		       a.host ? "destination" : "device");
	}
	if (outdir) {
		for (size_t i = 0; i < nfiles; i++) {
			char *p = NULL;

			if (asprintf(&p, "%s/%s", outdir, files[i].rel) < 0 || mkdir_parents(p) < 0) {
				fprintf(stderr, "weightfsctl stage: --offload %s: cannot create directories\n", outdir);
				free(p);
				goto out;
			}
			items[i] = (struct wfs_stage_item){ .path = p, .bytes = files[i].bytes, .mem = a.mem + files[i].at,
							    .flags = WFS_STAGE_OFFLOAD | (do_fsync ? WFS_STAGE_FSYNC : 0) };
		}
		c = run_batch(st, items, nfiles, "offload", true, &secs);
		for (size_t i = 0; i < nfiles; i++) {
			free((char *)items[i].path);
			items[i].path = NULL;
		}
		if (c < 0)
			goto out;
		printf("offloaded %zu files, %llu bytes to %s in %.3f s: %.2f GB/s%s\n", nfiles,
		       (unsigned long long)total, outdir, secs, gbps(total, secs), do_fsync ? " (fsync)" : "");
		if (do_verify) {
			if (verify(&a, outdir) < 0)
				goto out;
			printf("verify: %zu offloaded files equal their sources\n", nfiles);
		}
	}
	rc = 0;
out:
	wfs_stage_free(st);
	area_free(&a);
	free(items);
	for (size_t i = 0; i < nfiles; i++) {
		free(files[i].path);
		free(files[i].rel);
	}
	free(files);
	files = NULL;
	nfiles = capfiles = 0;
	return rc;
}
