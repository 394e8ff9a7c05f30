/* SPDX-License-Identifier: Apache-2.0 */
/*
 * weightfs — the names weightfs puts in the world, in one place: the extended attributes of files
 * under a mount, the temporary names of files being written, and the store's layout. Names only:
 * no functions, no types. Every module, the daemon, the admin command and the Python package
 * (which repeats the strings and tests them against wfs_names(), lib/dtype.h) spell them from here.
 */
#ifndef WFS_WEIGHTFS_H
#define WFS_WEIGHTFS_H

/* ---- extended attributes (weightfs(8)) ---- */
#define WFS_XATTR_PREFIX "user.weightfs."                  /* every attribute below starts so */
#define WFS_XATTR_DIGEST "user.weightfs.digest"            /* sealed file: content digest, 32 hex; set
							     * while writing: the writer's declared digest */
#define WFS_XATTR_DTYPE "user.weightfs.dtype"              /* a safetensors dtype name, e.g. "BF16" (lib/dtype.h) */
#define WFS_XATTR_SHAPE "user.weightfs.shape"              /* a JSON array of dimensions, e.g. "[4096,1024]" */
#define WFS_XATTR_CLAIM "user.weightfs.claim"              /* set on an empty file: seal it as a stored object */
#define WFS_XATTR_CLAIMS "user.weightfs.claims"            /* set on a directory: new sealed files by digest */
#define WFS_XATTR_STATS "user.weightfs.stats"              /* mount root: store and daemon statistics, JSON */
#define WFS_XATTR_RECHECK "user.weightfs.recheck"          /* set on the mount root: re-hash an object now */
#define WFS_XATTR_DIRECT "user.weightfs.direct"            /* any file: the direct path's socket, read-only */
#define WFS_XATTR_GC "user.weightfs.gc"                    /* mount root: set SIZE: remove objects no name
							     * uses beyond SIZE bytes now; get: what the
							     * last such removal did, JSON */
#define WFS_XATTR_ST_META "user.weightfs.safetensors.metadata" /* import dir: the checkpoint's __metadata__ */
/* A rank directory's index, written by weightfs.FrozenOffload (lib/python/weightfs/frozen.py,
 * MANIFEST): {"version": 1, "params": {NAME: {"file": FILE, "dtype", "shape", "bytes", "digest"}}},
 * FILE the parameter's escaped file name in that directory ('/' as %2F, ...). */
#define WFS_FROZEN_MANIFEST ".weightfs-manifest.json"
#define WFS_XATTR_ST_INDEX "user.weightfs.safetensors.index"   /* import dir: a sharded index's "metadata" */

/* ---- writing tensors ---- */
/*
 * A tensor file of at least this many bytes (dtype × shape, declared before the bytes) is written
 * through kernel FUSE passthrough when it is opened for writing after its attributes are set: the
 * writer's bytes go to the store's filesystem without the daemon (fs/core/openmode.h). Smaller ones
 * go through the daemon, in memory until the seal. lib/tensorfile.c reopens such files to write.
 */
#define WFS_PASSTHROUGH_WRITE_MIN (4u << 20) /* bytes */

/* ---- temporary names ---- */
/* A tensor file being written (lib/tensorfile.h, weightfs.offload()): PREFIX<pid>-<n>[-<tag>]. */
#define WFS_TMP_PREFIX ".wfs-tmp-"
/* What weightfsctl import named its files being written before WFS_TMP_PREFIX; still no tensor name. */
#define WFS_TMP_PREFIX_IMPORT_OLD ".wfs-import."
/* Infix of the file export writes before renaming it over OUT: OUT's dir/.<base>.wfs-export.XXXXXX. */
#define WFS_TMP_EXPORT_INFIX ".wfs-export."

/* ---- store layout (STORE/...) ---- */
#define WFS_STORE_OBJECTS "objects"       /* objects/ab/<30 hex>: one read-only file per content */
#define WFS_STORE_TMP "tmp"               /* files being written by the daemon */
#define WFS_STORE_QUARANTINE "quarantine" /* objects whose bytes did not match their digest */
#define WFS_STORE_CATALOG "catalog.db"    /* the SQLite catalog (WAL) */
#define WFS_STORE_CATALOG_BACKUP "catalog.db.backup" /* a whole copy of it (wfs_catalog_backup) */
#define WFS_STORE_LOG "weightfs.log"      /* a background daemon's log */

#endif
