# SPDX-License-Identifier: Apache-2.0
"""FrozenOffload: one rank's frozen parameters as files, offloaded once, mapped or backloaded later.

    fo = weightfs.FrozenOffload("/data/skyrl/frozen-offload", rank=0)
    summary = fo.offload(model, free=True)   # every parameter with requires_grad False; frees GPU memory
    ...                                       # rollout / inference uses the GPU memory
    fo.restore(model)                         # CUDA params: backload; CPU params: mapped from the files
    w = fo.load("encoder.layers.0.attn.q.weight")   # or one tensor, mapped (CPU)

Layout: ROOT/rank{N}/<parameter name> per parameter (names are kept as they are; only what cannot be a
file name is escaped: '%' '/' NUL as %25 %2F %00, a leading '.' as %2E, a name over 200 bytes is cut
and given a hash suffix), and ROOT/rank{N}/.weightfs-manifest.json: for each parameter its file, digest,
bytes, dtype and shape; on a filesystem without user.weightfs.digest also the file's inode, size and
mtime when it was written. The names are stable across restarts and identical across ranks, so on
weightfs every rank's copy and every restart's copy of a content is one object and one page-cache copy
-- the manifest included: it names no rank, device or time, so the ranks' manifests are one object too,
and it is rewritten only when its content changes.

Restart: offload() skips a parameter whose file exists with the same digest. The file's digest comes
from user.weightfs.digest on weightfs; elsewhere from the manifest when the file's inode, size and mtime
are the ones recorded (the stat identity make and git trust), else by reading and hashing the file.
A parameter whose file is missing or different is offloaded with weightfs.offload(): a claim first, so
content any rank or an earlier run stored moves no bytes.

Not thread-safe: one FrozenOffload per rank process (ranks never share a directory).
"""

import errno
import hashlib
import json
import operator
import os
import time
from typing import Any, List, NamedTuple, Optional, Tuple

from .stage import backload as _backload
from .names import PASSTHROUGH_WRITE_MIN
from ._types import PathLike
from .claims import _claims_refused, claim_files
from .digests import digest, digest_file
from .dtypes import _torch_dtype, dtype_name, shape_text
from .errors import WeightfsError
from .loading import load
from .mountinfo import fs_type
from .names import DIGEST_XATTR, DTYPE_XATTR, SHAPE_XATTR
from .offloading import OffloadResult, offload, remove_stale_tmp

__all__ = ["ENV_DIR", "FrozenOffload", "MANIFEST", "OffloadSummary", "fs_type"]

MANIFEST = ".weightfs-manifest.json"  # WFS_FROZEN_MANIFEST in lib/weightfs.h (weightfsctl export reads it)
ENV_DIR = "SKYRL_FROZEN_OFFLOAD_DIR"
_NAME_MAX = 200


class _Facts(NamedTuple):
    """What FrozenOffload computes once per parameter it claims: file name, digest (32 hex),
    safetensors dtype name (or None), shape (list of ints), bytes, torch dtype (str)."""
    file: str
    digest: str
    dtype: Optional[str]
    shape: List[int]
    nbytes: int
    torch_dtype: str


class OffloadSummary(NamedTuple):
    """What one FrozenOffload.offload() call did. results: [OffloadResult] in parameter order.
    tensors/bytes: all of them; written/claimed/skipped: how many took each path; written_bytes: bytes
    that went through write(2); seconds: wall time of the call."""

    results: List[OffloadResult]
    tensors: int
    bytes: int
    written: int
    claimed: int
    skipped: int
    written_bytes: int
    seconds: float

    def __repr__(self) -> str:  # the counts: results holds one line per tensor
        return (f"OffloadSummary(tensors={self.tensors}, bytes={self.bytes}, written={self.written}, "
                f"claimed={self.claimed}, skipped={self.skipped}, written_bytes={self.written_bytes}, "
                f"seconds={self.seconds:.3f}, results=[{len(self.results)} OffloadResult])")


def file_name(param: str) -> str:
    """The file name of parameter param under rank{N}/ (see the module comment)."""
    s = param.replace("%", "%25").replace("/", "%2F").replace("\0", "%00")
    if s.startswith("."):
        s = "%2E" + s[1:]
    if not s:
        s = "%"
    b = s.encode("utf-8", "surrogateescape")
    if len(b) > _NAME_MAX:
        s = b[:180].decode("utf-8", "ignore") + "~" + hashlib.sha256(b).hexdigest()[:16]
    return s


def _frozen_params(params):
    """[(name, tensor)] from an nn.Module (its parameters with requires_grad False), a mapping
    name -> tensor, or an iterable of (name, tensor). TypeError for a name that is not a string or
    a value that is not a tensor (anything with .detach())."""
    if hasattr(params, "named_parameters") and callable(params.named_parameters):
        return [(n, p) for n, p in params.named_parameters() if not p.requires_grad]
    items = list(params.items()) if hasattr(params, "items") else list(params)
    for item in items:
        if not isinstance(item, tuple) or len(item) != 2:
            raise TypeError(f"FrozenOffload.offload: expected (name, tensor) pairs, got {item!r:.80}")
        name, t = item
        if not isinstance(name, str):
            raise TypeError(f"FrozenOffload.offload: parameter name {name!r:.80} is not a string")
        if not callable(getattr(t, "detach", None)):
            raise TypeError(f"FrozenOffload.offload: parameter {name!r}: {type(t).__name__} is not a "
                            "tensor (torch.Tensor)")
    return items


def _labels_match(path, dname, shape):
    """Do the dtype and shape attributes of the file at path say dname and shape? The same bytes
    offloaded again as another shape or dtype (zeros(4, 8), then zeros(8, 4)) are not skipped: the
    file is made again (a claim: no bytes move) with the new pair, not kept with the stale one. True
    for a dtype without a safetensors name (no attributes are set) and where the filesystem has no
    user xattrs; false for a file without them."""
    if dname is None:
        return True
    try:
        return (os.getxattr(path, DTYPE_XATTR).decode("ascii", "replace") == dname and
                os.getxattr(path, SHAPE_XATTR).decode("ascii", "replace") == shape_text(shape))
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return True
        if e.errno == errno.ENODATA:
            return False
        raise


class FrozenOffload:
    """One rank's frozen parameters under ROOT/rank{rank}/ (created). Reads the manifest if present.
    Parameters are torch tensors only: offload() raises TypeError for a numpy array (weightfs.offload
    takes one, a file at a time).

    root: a directory, normally on a weightfs mount; None means $SKYRL_FROZEN_OFFLOAD_DIR. It works on
    any filesystem (no dedup there). rank: this process's rank (an int). fsync: fdatasync each
    written file before its close: on weightfs the seal is then durable when close returns (without
    it, the default -o sync=group makes it durable within 1 s of the close).

    Raises OSError when the directory cannot be created, WeightfsError(EINVAL) for a manifest that
    does not parse (it is never silently replaced: remove it to start over), ValueError when root is
    None and SKYRL_FROZEN_OFFLOAD_DIR is not set or rank is negative or a bool, TypeError when rank is
    not an int."""

    def __init__(self, root: Optional[PathLike], rank: int, *, fsync: bool = False) -> None:
        if root is None:
            root = os.environ.get(ENV_DIR)
            if not root:
                raise ValueError(f"FrozenOffload: no root given and ${ENV_DIR} is not set")
        self.root = os.path.abspath(os.fspath(root))
        try:  # an int, numpy's included; not "0" (which made rank0/ all the same), 1.0 or True
            self.rank = operator.index(rank)
        except TypeError:
            raise TypeError(f"FrozenOffload: rank must be an int, not {type(rank).__name__} {rank!r}") from None
        if isinstance(rank, bool) or self.rank < 0:
            raise ValueError(f"FrozenOffload: rank must be an int >= 0, not {rank!r}")
        self.dir = os.path.join(self.root, f"rank{self.rank}")
        self.manifest_path = os.path.join(self.dir, MANIFEST)
        self.fsync = bool(fsync)
        os.makedirs(self.dir, exist_ok=True)
        self.entries = self._read_manifest()
        self._manifest_on_disk = self._manifest_text() if self.entries else None
        # On weightfs every sealed file has user.weightfs.digest; elsewhere the manifest keeps the
        # files' stat identity.
        self._weightfs = fs_type(self.dir) == "fuse.weightfs"

    # ---- manifest ----
    def _read_manifest(self):
        try:
            with open(self.manifest_path, "rb") as f:
                doc = json.load(f)
        except FileNotFoundError:
            return {}
        except ValueError as e:
            raise WeightfsError(errno.EINVAL, f"{self.manifest_path}: not a manifest ({e}); remove it "
                                "to start over", self.manifest_path) from None
        if not isinstance(doc, dict) or not isinstance(doc.get("params"), dict):
            raise WeightfsError(errno.EINVAL, f"{self.manifest_path}: no 'params' object",
                                self.manifest_path)
        return doc["params"]

    def _manifest_text(self):
        # One parameter per line, each encoded by json's C encoder (indent= falls back to the pure
        # Python one: 50 us per parameter, a fifth of a re-offload's time).
        enc = json.JSONEncoder(sort_keys=True)
        body = ",\n".join(f" {enc.encode(k)}: {enc.encode(v)}" for k, v in sorted(self.entries.items()))
        return '{"params": {\n' + body + ("\n" if body else "") + '}, "version": 1}\n'

    def _write_manifest(self):
        text = self._manifest_text()
        if text == self._manifest_on_disk:
            return
        tmp = os.path.join(self.dir, f".{MANIFEST}.tmp-{os.getpid()}")
        try:
            with open(tmp, "w") as f:
                f.write(text)
            os.rename(tmp, self.manifest_path)
            self._manifest_on_disk = text
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    # ---- names ----
    def path(self, name: str) -> str:
        """The file of parameter name (whether or not it exists)."""
        e = self.entries.get(name)
        return os.path.join(self.dir, e["file"] if e else file_name(name))

    def names(self) -> List[str]:
        """Parameter names in the manifest, sorted."""
        return sorted(self.entries)

    def __contains__(self, name):
        return name in self.entries

    def _entry(self, name):
        e = self.entries.get(name)
        if e is None:
            raise KeyError(f"{name!r}: not offloaded by rank {self.rank} (no manifest entry in "
                           f"{self.manifest_path})")
        return e

    # ---- offload ----
    def _existing_digest(self, path, entry, nbytes):
        """Digest of the file at path if it exists with nbytes bytes, else None."""
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        if st.st_size != nbytes:
            return None
        try:
            d = os.getxattr(path, DIGEST_XATTR).decode("ascii", "replace")
            if len(d) == 32:
                return d
        except OSError as e:
            if e.errno == errno.EIO:
                return None  # weightfs: its content was found damaged; writing it again heals it
        if entry and entry.get("stat") == [st.st_ino, st.st_size, st.st_mtime_ns]:
            return entry.get("digest")
        return digest_file(path)

    def offload(self, params: Any, *, free: bool = False, claim: bool = True) -> OffloadSummary:
        """Offload frozen parameters: params is an nn.Module (its parameters with requires_grad False),
        a mapping name -> tensor, or an iterable of (name, tensor); torch tensors on the CPU or a CUDA
        device, any dtype (see weightfs.offload). Torch tensors only: a numpy array (anything without
        .detach()) raises TypeError before anything is written; weightfs.offload takes numpy arrays.

        Per parameter: digest on the host; skip when its file already holds that digest; else
        weightfs.offload (claim, write on a miss). On weightfs the parameters whose files do not exist
        yet (a restart into a new directory) are first claimed together, hundreds per request
        (weightfs.claim_files); only the rest go one by one. With free=True each offloaded tensor's .data is
        replaced by an empty tensor of its dtype and device (its memory is released once nothing else
        refers to it); restore() brings it back. Before it lets a skipped or claimed tensor go, it opens
        the file once, which on weightfs checks the stored bytes if they were not checked since the
        mount (a read of the object); damaged ones are written again from the tensor. The manifest is rewritten at the end (and also when an
        error stops the call, for what was done).

        On weightfs a tensor written through passthrough is sealed on the digest computed before it
        was written (declared; weightfs checks the bytes right after): a tensor that changed while
        it was offloaded is found there, and this call opens every such file once at its end (which
        waits for those checks, mostly done by then) and raises WeightfsError(EIO) naming it.

        Returns OffloadSummary. Raises what weightfs.offload raises (OSError, WeightfsError,
        TypeError/ValueError) for the first parameter that fails; earlier ones stay offloaded."""
        t0 = time.perf_counter()
        results = []
        remove_stale_tmp(self.dir)  # names a killed offload left behind (an hour old, process gone)
        try:
            items = list(_frozen_params(params))
            facts, claimed = self._claim_new(items) if claim and self._weightfs else ({}, set())
            for name, t in items:
                f = facts.get(name)
                if f is not None and f.file in claimed:
                    r = self._claimed(name, f)
                else:
                    r = self._offload_one(name, t, claim, f.digest if f else None)
                if free and (r.claimed or r.skipped) and not self._stored_bytes_good(r.path):
                    # Damaged on disk, found at this first open since the mount: written again,
                    # which heals the name, before the tensor's only other copy goes.
                    r = self._offload_one(name, t, False, r.digest)
                results.append(r)
                if free:
                    t.data = t.data.new_empty(0)
        finally:
            if results:
                self._write_manifest()
        self._await_checks(items, results)
        return OffloadSummary(
            results=results, tensors=len(results), bytes=sum(r.bytes for r in results),
            written=sum(1 for r in results if not r.claimed and not r.skipped),
            claimed=sum(1 for r in results if r.claimed),
            skipped=sum(1 for r in results if r.skipped),
            written_bytes=sum(r.written_bytes for r in results),
            seconds=time.perf_counter() - t0)

    def _stored_bytes_good(self, path):
        """Does the file at path open? A skip or a claim reads no bytes; on weightfs the first open of
        an object since the mount checks them against its digest (-o verify=open, the default) and
        fails with EIO when they are damaged (bit rot under an object not yet checked). Asked only
        before free=True lets the tensor go. Other errors of the open are raised."""
        if not self._weightfs:
            return True  # a plain directory: no digest to check the file against
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
        except OSError as e:
            if e.errno != errno.EIO:
                raise
            return False
        return True

    def _claim_new(self, items):
        """Claim in batches the parameters of items [(name, tensor)] whose files are not in the
        directory. Returns ({name: _Facts} of those, {file names made})."""
        present = set(os.listdir(self.dir))
        facts = {}

        def entries():  # digests computed while weightfs makes the previous request's files
            for name, t in items:
                fname = file_name(name)
                if fname in present:
                    continue  # _offload_one skips it or replaces it
                t = t.detach()
                f = facts[name] = _Facts(fname, digest(t), dtype_name(t.dtype), list(t.shape),
                                         t.numel() * t.element_size(), str(t.dtype))
                yield fname, f.digest, f.dtype, f.shape

        try:
            claimed = claim_files(self.dir, entries())
        except OSError as e:  # claims refused here (another user than the mounting one): write
            if not _claims_refused(e, os.stat(self.dir).st_dev, self.dir):
                raise
            claimed = set()
        return facts, claimed

    def _await_checks(self, items, results):
        """Open each tensor this call wrote through passthrough on weightfs (sealed on the digest
        taken before its bytes were written, then checked by the daemon): WeightfsError(EIO) for
        the first whose bytes are not that digest. The open waits for a check still running."""
        if not self._weightfs:
            return
        for (name, _), r in zip(items, results):
            if r.claimed or r.skipped or r.bytes < PASSTHROUGH_WRITE_MIN:
                continue
            try:
                os.close(os.open(r.path, os.O_RDONLY | os.O_CLOEXEC))
            except OSError as e:
                if e.errno != errno.EIO:
                    raise
                raise WeightfsError(errno.EIO, f"{r.path}: tensor {name!r} changed while it was being "
                                    f"offloaded: its bytes are not the digest {r.digest} taken before "
                                    f"they were written (weightfs's check failed; offload it again)",
                                    r.path) from None

    def _claimed(self, name, f):
        """The result and manifest entry of parameter name, claimed by _claim_new (facts f)."""
        self.entries[name] = {"file": f.file, "digest": f.digest, "bytes": f.nbytes,
                              "dtype": f.dtype or f.torch_dtype, "shape": f.shape}
        return OffloadResult(os.path.join(self.dir, f.file), f.digest, f.nbytes, True)

    def _offload_one(self, name, t, claim, d=None):
        t = t.detach()
        path = os.path.join(self.dir, file_name(name))
        entry = self.entries.get(name)
        nbytes = t.numel() * t.element_size()
        d = d or digest(t)
        dname = dtype_name(t.dtype)
        if self._existing_digest(path, entry, nbytes) == d and _labels_match(path, dname, t.shape):
            r = OffloadResult(path, d, nbytes, False, True)
        else:
            # A name the batch claim asked for and did not get is claimed again, on the file about
            # to be written: another rank offloading the same tensor at this moment may be writing
            # it, and weightfs makes that claim wait for its seal (one round trip more per tensor
            # written; where claims are refused, offload() does not ask again).
            r = offload(t, path, claim=claim, fsync=self.fsync, _digest=d)
            if r.digest != d:
                raise WeightfsError(errno.EIO, f"{path}: tensor {name!r} changed while it was being "
                                    f"offloaded ({d} then {r.digest})", path)
        e = {"file": os.path.basename(path), "digest": d, "bytes": nbytes,
             "dtype": dname or str(t.dtype), "shape": list(t.shape)}
        if not self._weightfs:  # a plain filesystem: remember the stat identity instead
            st = os.stat(path)
            e["stat"] = [st.st_ino, st.st_size, st.st_mtime_ns]
        self.entries[name] = e
        return r

    # ---- back ----
    def load(self, name: str) -> Any:
        """Parameter name as a CPU tensor mapped from its file (weightfs.load: private read-only
        mapping, page cache shared on weightfs). Raises KeyError (not in the manifest), OSError,
        WeightfsError(EMSGSIZE) when the file does not match the manifest's size."""
        e = self._entry(name)
        return load(self.path(name), dtype=e["dtype"], shape=e["shape"])

    def backload(self, name: str, tensor: Any = None, device: Any = None) -> Any:
        """Copy parameter name's file into a contiguous CUDA tensor through the staging ring.
        tensor: the destination (numel x element size must equal the file's bytes); default a new
        torch.empty(shape, dtype, device=device or 'cuda'). Returns the tensor. Raises KeyError,
        OSError (ENODATA short file, EMSGSIZE size mismatch, ...), ValueError (tensor not on CUDA)."""
        e = self._entry(name)
        if tensor is None:
            import torch

            tensor = torch.empty(e["shape"], dtype=_torch_dtype(e["dtype"]), device=device or "cuda")
        return _backload(self.path(name), tensor)

    def restore(self, module: Any) -> int:
        """Give back every parameter of module that is in the manifest and was freed (numel 0 where
        the manifest has more): CUDA parameters get a new tensor filled by backload, CPU parameters
        are pointed at the mapped file (load). Before it uses a file it checks that the file still
        holds the manifest's digest, as offload()'s skip does (user.weightfs.digest on weightfs, the
        recorded stat identity or a hash elsewhere): bytes that another process wrote over the name
        since the offload are refused, not given to the model. Returns the number restored. Raises
        WeightfsError(EIO) for such a file (and ENOENT for a missing one), else as load/backload;
        the parameters before it are restored."""
        n = 0
        for name, p in module.named_parameters():
            e = self.entries.get(name)
            if e is None or p.numel() != 0 or list(p.shape) == e["shape"]:
                continue
            self._check_stored(name, e)
            if e["bytes"] == 0:
                p.data = p.data.new_empty(e["shape"])
            elif p.device.type == "cuda":
                p.data = self.backload(name, device=p.device)
            else:
                p.data = self.load(name)
            n += 1
        return n

    def _check_stored(self, name, e):
        """Raise unless parameter name's file holds what manifest entry e recorded."""
        path = self.path(name)
        if not os.path.lexists(path):
            raise WeightfsError(errno.ENOENT, f"parameter {name!r}: its file is gone", path)
        d = self._existing_digest(path, e, e["bytes"])
        if d != e["digest"]:
            got = f"digest {d}" if d else "another size, or content found damaged"
            raise WeightfsError(errno.EIO, f"parameter {name!r}: the file holds {got}, not the manifest's "
                                f"{e['digest']}: written over since it was offloaded", path)

    def evict(self) -> Any:
        """Free the host page cache of this rank's files (weightfs.evict of the rank directory): after
        backload, before a colocated inference engine wakes. Shared content is one copy: the other
        ranks' names of it lose their cache too. Returns weightfs.EvictResult; raises as evict."""
        from .cache import evict

        return evict([self.dir])

    def prefetch(self, numa_node: Optional[int] = None, device: Optional[int] = None) -> Any:
        """Start reading this rank's files into the page cache (weightfs.prefetch of the rank
        directory), on numa_node, or the node of CUDA device `device`; returns a Prefetch handle
        (.wait(), .done()) at once: while the engine generates, ahead of the next backload."""
        from .cache import prefetch

        return prefetch([self.dir], numa_node, device=device)

    def verify(self) -> List[Tuple[str, str]]:
        """Hash every file in the manifest from its bytes; return [(name, problem)] for files that are
        missing or differ (empty when all match)."""
        bad = []
        for name in self.names():
            e = self.entries[name]
            path = self.path(name)
            try:
                d = digest_file(path)
            except OSError as ex:
                bad.append((name, f"{path}: {ex.strerror}"))
                continue
            if d != e["digest"]:
                bad.append((name, f"{path}: digest {d}, manifest {e['digest']}"))
        return bad

