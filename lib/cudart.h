/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cudart — the CUDA runtime, loaded at run time.
 *
 * weightfs is compiled against the CUDA runtime's headers (WFS_HAVE_CUDA, when the Makefile finds
 * them) but links no CUDA library: the daemon and most of weightfsctl never touch a GPU, and a node
 * whose CUDA is absent, or upgraded to another major version, must still mount. What does touch a GPU
 * (a device stager, lib/stage.h; the GPU's NUMA node, lib/cache.h; weightfsctl stage) asks
 * wfs_cudart_get() for the entry points below, and the first call loads the library with dlopen(3):
 *
 *   1. $WFS_CUDART when set and not empty (a path, or a file name for the dynamic linker's search);
 *   2. else libcudart.so.N, N the major version of the headers built against (CUDART_VERSION / 1000:
 *      the runtime's ABI changes only with it), by the dynamic linker's search: LD_LIBRARY_PATH,
 *      ld.so.cache. A process that has loaded it already (torch, under the Python package) shares
 *      that copy;
 *   3. else libcudart.so.N in the build's $(CUDA_HOME)/lib64 (WFS_CUDART_DIR, from the Makefile).
 *
 * The library is loaded once per process and never unloaded; a failure is remembered too, so every
 * caller of a process gets the same answer and message.
 *
 * The table's members carry the CUDA functions' own names and types (taken from the headers), so a
 * call reads `rt->cudaMemcpyAsync(...)`. Built without CUDA this header declares nothing.
 */
#ifndef WFS_CUDART_H
#define WFS_CUDART_H

#ifdef WFS_HAVE_CUDA
#include <stddef.h>

#include <cuda_runtime_api.h>

/* Every CUDA runtime function weightfs calls (tests included), in one list. */
#define WFS_CUDART_FUNCS(X)                                                                              \
	X(cudaGetErrorString)                                                                            \
	X(cudaGetErrorName)                                                                              \
	X(cudaGetDeviceCount)                                                                            \
	X(cudaGetDevice)                                                                                 \
	X(cudaSetDevice)                                                                                 \
	X(cudaDeviceGetPCIBusId)                                                                         \
	X(cudaHostRegister)                                                                              \
	X(cudaHostUnregister)                                                                            \
	X(cudaHostAlloc)                                                                                 \
	X(cudaFreeHost)                                                                                  \
	X(cudaMalloc)                                                                                    \
	X(cudaFree)                                                                                      \
	X(cudaMemset)                                                                                    \
	X(cudaMemcpy)                                                                                    \
	X(cudaMemcpyAsync)                                                                               \
	X(cudaStreamCreateWithFlags)                                                                     \
	X(cudaStreamDestroy)                                                                             \
	X(cudaStreamSynchronize)                                                                         \
	X(cudaEventCreateWithFlags)                                                                      \
	X(cudaEventDestroy)                                                                              \
	X(cudaEventRecord)                                                                               \
	X(cudaEventSynchronize)

struct wfs_cudart {
#define WFS_CUDART_MEMBER(name) __typeof__(name) *name;
	WFS_CUDART_FUNCS(WFS_CUDART_MEMBER)
#undef WFS_CUDART_MEMBER
	const char *path; /* the file loaded, as dlopen(3) was given it */
};

/*
 * The CUDA runtime's entry points: sets *@out to a table that lives as long as the process and
 * returns 0, loading the library on the first call. Returns -ENOTSUP when no runtime can be loaded
 * or the one found lacks an entry point; @err (@errlen bytes, may be NULL) then says which file and
 * why, as one line: "cannot load the CUDA runtime libcudart.so.13: libcudart.so.13: cannot open shared
 * object file: No such file or directory". *@out is written only on success. Thread-safe.
 */
int wfs_cudart_get(const struct wfs_cudart **out, char *err, size_t errlen);

#endif
#endif
