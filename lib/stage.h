/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stage — GPU staging: files to device memory (backload) and device memory to files (offload)
 * through a bounded ring of pinned host buffers.
 *
 * A stager is bound to one CUDA device. It owns:
 *   - a ring of B buffers of S bytes each, allocated once, at exactly B × S bytes (default 64 × 2 MiB
 *     = 128 MiB), on the GPU's NUMA node and pinned with cudaHostRegister. This is all the host memory a stager ever holds for
 *     data, whatever the size of what it moves;
 *   - T worker threads, bound to the NUMA node's CPUs, each with its own CUDA stream;
 *   - one completion thread that waits for copies to finish and gives buffers back to the ring.
 *
 * Backload of one chunk (at most S bytes): a worker takes a free buffer, pread()s the chunk into it,
 * queues cudaMemcpyAsync(H2D) on its stream and records the buffer's event; it is then free to read
 * the next chunk while the copy runs. The completion thread synchronizes on the event and puts the
 * buffer back. Offload of one chunk runs the other way inside one worker: cudaMemcpyAsync(D2H) into a
 * buffer, wait for it, pwrite(). So reads, writes and copies of different chunks overlap, and at most
 * B chunks are in flight.
 *
 * Buffer states:  FREE --worker--> READING --worker--> COPYING --completion thread--> FREE
 *                 (offload: FREE --worker--> COPYING+WRITING --worker--> FREE)
 *
 * Invariants:
 *  1. Host memory for data is the ring, B × S bytes, allocated at wfs_stage_new() and never grown.
 *  2. An item is reported successful only if every byte of its range was read (or written) in full
 *     and every copy of it completed without a CUDA error. Any failure fails the whole item, with an
 *     error code and a message naming the file; the destination's contents are then unspecified.
 *     Nothing is ever silently partial.
 *  3. An item's file is opened once (by the worker that takes its first chunk) and closed once, after
 *     its last chunk is accounted. Every chunk in progress holds a buffer, so at most B + 1 items
 *     hold a descriptor at any time, however many items a batch has.
 *
 * Memory kinds. A WFS_STAGE_MEM_DEVICE stager moves bytes to and from CUDA device memory. A
 * WFS_STAGE_MEM_HOST stager runs the same ring, threads and error paths with plain host memory at
 * the far end (memcpy instead of cudaMemcpyAsync, ring not pinned): it needs no GPU and no CUDA, and
 * is what the tests use on machines without a GPU. The library links no CUDA library: the first
 * device stager loads the CUDA runtime (lib/cudart.h).
 *
 * NUMA. The node comes from, in order: opts.numa_node when >= 0; the environment variable
 * WFS_STAGE_NUMA_NODE (a node number, or "-1"/"none" for unbound); for a device stager, the GPU's PCI
 * bus id as the CUDA runtime reports it (so CUDA_VISIBLE_DEVICES is honoured), lower-cased, then
 * /sys/bus/pci/devices/<bus id>/numa_node. A node of -1 or no such file: one warning per process and
 * the stager runs unbound.
 *
 * Thread-safety: one stager may be used from several threads at once (submit, wait, free batches);
 * wfs_stage_free() must not race with any other call on the same stager.
 */
#ifndef WFS_STAGE_H
#define WFS_STAGE_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Error codes beyond plain errno values (all negative, all errno values, so they pass through). */
#define WFS_STAGE_ESHORT  (-ENODATA)   /* the file ends before the range does ("short file") */
#define WFS_STAGE_ESIZE   (-EMSGSIZE)  /* WFS_STAGE_EXACT: file size differs from offset + bytes */
#define WFS_STAGE_ENOCUDA (-ENOTSUP)   /* device stager asked for: built without CUDA, or no CUDA runtime */
#define WFS_STAGE_ENODEV  (-ENODEV)    /* CUDA present but no usable GPU, or no such device index */
#define WFS_STAGE_ECUDA   (-EREMOTEIO) /* a CUDA runtime call failed; the message has its text */

/* Longest per-item or per-stager error message, terminating NUL included. */
#define WFS_STAGE_MSG_MAX 512

enum wfs_stage_mem {
	WFS_STAGE_MEM_DEVICE = 0, /* item memory is CUDA device memory of opts.device */
	WFS_STAGE_MEM_HOST = 1,   /* item memory is host memory; no CUDA used at all */
};

/* File operations, as seen by the test-only fault hook below. */
enum wfs_stage_io { WFS_STAGE_IO_READ, WFS_STAGE_IO_WRITE, WFS_STAGE_IO_CLOSE };

struct wfs_stage_opts {
	enum wfs_stage_mem mem; /* default WFS_STAGE_MEM_DEVICE */
	int device;             /* CUDA device index as this process sees it; default 0 */
	int numa_node;          /* >= 0: that node; -1: auto (env, then GPU); -2: unbound, no warning */
	unsigned buffers;       /* ring buffers (B); default 64 */
	size_t buffer_bytes;    /* bytes per ring buffer (S), a multiple of 4096; default 2 MiB */
	unsigned threads;       /* worker threads (T), one CUDA stream each; default online CPUs - 2,
				   at least 2, at most 12 */
	/*
	 * Test-only fault injection: when set, called before every pread()/pwrite() of an item's file and
	 * before the close() of an offloaded file, with the item's path, the operation and the file offset
	 * (0 for close); a negative return makes that call fail with that -errno as if the kernel had
	 * returned it (a failed close still releases the descriptor). Leave NULL in production code.
	 */
	int (*io_fault)(void *arg, const char *path, enum wfs_stage_io op, uint64_t offset);
	void *io_fault_arg;
};

/* Item flags. */
#define WFS_STAGE_OFFLOAD (1u << 0) /* device → file (default: file → device) */
#define WFS_STAGE_EXACT   (1u << 1) /* backload: the file must be exactly offset + bytes long */
#define WFS_STAGE_FSYNC   (1u << 2) /* offload: fsync() the file before closing it */

/*
 * One unit of work. Backload: read @bytes bytes of the file at @path from byte @offset into @mem.
 * Offload: create (or truncate) @path with mode 0644 and write @bytes bytes from @mem into it from byte
 * 0 (@offset must be 0); on any failure the file is unlinked (when it is a regular file and still
 * the one created), so no partial file is left behind; an existing file's old bytes are lost.
 * @mem is device memory for a device stager, host memory for a host stager; it must stay valid and
 * untouched by other work until the batch has been waited for. The stager copies @path.
 */
struct wfs_stage_item {
	const char *path;
	uint64_t offset; /* bytes */
	uint64_t bytes;
	void *mem;
	unsigned flags; /* WFS_STAGE_* item flags */
	/* Offload, or NULL: the XXH3-128 digest of the @bytes at @mem (32 hex digits, lib/digest.h),
	 * set as user.weightfs.digest on the file before its close: on weightfs the seal then takes it
	 * instead of reading the file back to hash it (a declaration, docs/integrity.md). Only for a
	 * file on weightfs: elsewhere it would be stored as an ordinary attribute. Copied. Its errors
	 * are not the item's (the seal hashes instead). */
	const char *digest;
};

struct wfs_stager;
struct wfs_stage_batch;

struct wfs_stage_stats {
	uint64_t ring_bytes;      /* host memory of the ring: buffers × buffer_bytes, exactly */
	uint64_t host_bytes_peak; /* most host data memory the stager held at once (== ring_bytes) */
	bool pinned;              /* ring registered with CUDA (device stagers) */
	int numa_node;            /* node the ring and threads are bound to; -1 when unbound */
	unsigned buffers;         /* B */
	size_t buffer_bytes;      /* S */
	unsigned threads;         /* T */
	unsigned buffers_in_use_peak; /* most ring buffers out of the free list at once; <= B */
	uint64_t bytes_loaded;    /* file → memory bytes of successful chunks, since creation */
	uint64_t bytes_offloaded; /* memory → file bytes of successful chunks, since creation */
	char pci_bus_id[32];      /* the GPU's PCI bus id, lower case ("" for a host stager) */
};

/* Fill @o with the defaults above. */
void wfs_stage_opts_init(struct wfs_stage_opts *o);

/*
 * Create a stager. @o may be NULL for the defaults. On success *@out owns the stager (free it with
 * wfs_stage_free()). On failure, when @err is not NULL, one line saying why is written there
 * (@errlen bytes at most, NUL-terminated).
 * Errors: -EINVAL (zero or unaligned sizes, numa node out of range), -ENOMEM, WFS_STAGE_ENOCUDA
 * (a device stager, and the library was built without CUDA or cannot load the CUDA runtime: the
 * message says which file it looked for, lib/cudart.h), WFS_STAGE_ENODEV (no GPU, or @o->device out of range), WFS_STAGE_ECUDA (pinning, stream or event
 * creation failed), -EAGAIN (thread creation failed).
 */
int wfs_stage_new(const struct wfs_stage_opts *o, struct wfs_stager **out, char *err, size_t errlen);

/*
 * Stop the threads and free the ring. Every batch of @st must have been freed (or at least waited
 * for) first. NULL is a no-op.
 */
void wfs_stage_free(struct wfs_stager *st);

/*
 * Queue @n items (copied; @items may be freed on return) and return at once. Work on earlier batches
 * comes first. On success *@out owns the batch: wait for it with wfs_stage_wait() and free it with
 * wfs_stage_batch_free(). @n may be 0.
 * Errors (nothing is queued): -EINVAL (NULL path, NULL mem with bytes > 0, offload with offset != 0,
 * EXACT on an offload, a digest on a backload or one that is not 32 hex digits, an offload whose path
 * string another item of the batch also gives: two writers, or a writer and a reader, of one file at
 * once), -EOVERFLOW (offset + bytes overflows), -ENOMEM. One file under two spellings (a/b, a//b, a
 * link), or in two batches in flight at once, is not detected: the caller keeps those apart.
 * Per-item errors (missing file, short file, EIO, ...) come back through wfs_stage_wait() and
 * wfs_stage_result(), never from here.
 */
int wfs_stage_submit(struct wfs_stager *st, const struct wfs_stage_item *items, size_t n,
		     struct wfs_stage_batch **out);

/*
 * Block until every item of @b is finished (all copies complete: device memory may be used from any
 * stream afterwards). Returns 0 when all items succeeded, else the error of the lowest-numbered
 * failed item. May be called more than once, from any thread.
 */
int wfs_stage_wait(struct wfs_stage_batch *b);

/*
 * Result of item @i (0-based) of a waited-for batch: 0, or a negative error: -ENOENT/-EACCES/... from
 * open, -EIO or another -errno from pread/pwrite/fsync/close (close errors included: on weightfs
 * close(2) reports seal errors such as -ENOSPC), WFS_STAGE_ESHORT, WFS_STAGE_ESIZE, WFS_STAGE_ECUDA.
 * When @msg is not NULL, *@msg is set to a line naming the file ("" on success), owned by the batch.
 * Returns -EINVAL for @i out of range, -EBUSY when the batch is not finished.
 */
int wfs_stage_result(const struct wfs_stage_batch *b, size_t i, const char **msg);

/* Wait for @b if needed, then free it. NULL is a no-op. */
void wfs_stage_batch_free(struct wfs_stage_batch *b);

/*
 * Synchronous conveniences: one item, submitted, waited for and freed. Backload @bytes bytes of
 * @path from @offset into @mem (@flags: WFS_STAGE_EXACT), or offload @bytes bytes of @mem into a new
 * @path (@flags: WFS_STAGE_FSYNC; @digest: as struct wfs_stage_item's, or NULL). Return as
 * wfs_stage_result(); on failure the message is written to @err when not NULL.
 */
int wfs_stage_load(struct wfs_stager *st, const char *path, uint64_t offset, uint64_t bytes, void *mem,
		   unsigned flags, char *err, size_t errlen);
int wfs_stage_offload(struct wfs_stager *st, const void *mem, uint64_t bytes, const char *path,
		      unsigned flags, const char *digest, char *err, size_t errlen);

/* Counters and configuration of @st, copied into *@out. Thread-safe. */
void wfs_stage_stats(struct wfs_stager *st, struct wfs_stage_stats *out);

/*
 * The NUMA node of PCI device @bus_id (any case; "0000:3B:00.0" or the 8-digit domain form) read from
 * <@sysfs_root>/bus/pci/devices/<bus id>/numa_node (@sysfs_root "/sys" in production). Returns the
 * node (>= 0), or -1 when the file is missing or says -1, -EINVAL for a malformed @bus_id.
 */
int wfs_stage_numa_node_of_pci(const char *sysfs_root, const char *bus_id);

/*
 * True when the library was built with CUDA support (WFS_HAVE_CUDA). The CUDA runtime itself is loaded
 * by the first device stager (lib/cudart.h), which fails with WFS_STAGE_ENOCUDA if none is found.
 */
bool wfs_stage_have_cuda(void);

#endif
