#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Write safetensors files in the reference implementation's layout, standard library only.

The layout is huggingface/safetensors' `serialize` (safetensors/src/tensor.rs): tensors sorted by
dtype alignment, largest first, then by name (bytewise); data back to back in that order; header
JSON without whitespace, "__metadata__" first (its keys sorted here: the reference keeps them in a
hash map), each tensor as {"dtype","shape","data_offsets"}; the JSON padded with spaces to a multiple
of 8 bytes. `weightfsctl export` writes the same layout, so a file written here comes back
byte-identical through import and export.

Library:
    write(path, {"name": (dtype, shape, data_bytes), ...}, metadata={"format": "pt"} or None)
    header_bytes(...)   the 8-byte prefix + JSON + padding, for building malformed files

Command (fixtures for tests/cli/test_cli.sh):
    st_write.py fixtures DIR    writes the valid, sharded and malformed files the CLI test uses
"""

import json
import os
import struct
import sys

# The reference's Dtype enum order ("increasing alignment order") and bytes per element.
DTYPE_ORDER = ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
               "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64"]
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2,
               "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "C64": 8, "F64": 8,
               "I64": 8, "U64": 8}


def nbytes(dtype, shape):
    n = DTYPE_BYTES[dtype]
    for d in shape:
        n *= d
    return n


def layout(tensors):
    """Names in write order."""
    return sorted(tensors, key=lambda k: (-DTYPE_ORDER.index(tensors[k][0]), k.encode("utf-8")))


def header_bytes(entries, metadata=None):
    """Prefix + JSON + padding for `entries`: [(name, dtype, shape, begin, end)] in header order."""
    parts = []
    if metadata is not None:
        meta = {k: metadata[k] for k in sorted(metadata, key=lambda k: k.encode("utf-8"))}
        parts.append('"__metadata__":' + json.dumps(meta, separators=(",", ":"), ensure_ascii=False))
    for name, dtype, shape, begin, end in entries:
        parts.append(json.dumps(name, ensure_ascii=False) + ":" +
                     json.dumps({"dtype": dtype, "shape": list(shape), "data_offsets": [begin, end]},
                                separators=(",", ":")))
    text = ("{" + ",".join(parts) + "}").encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text


def encode(tensors, metadata=None):
    """(header bytes, [data bytes in order]) for {name: (dtype, shape, data)}."""
    entries, datas, at = [], [], 0
    for name in layout(tensors):
        dtype, shape, data = tensors[name]
        if len(data) != nbytes(dtype, shape):
            raise ValueError("%s: %d bytes, but %s x %s is %d" % (name, len(data), dtype, shape,
                                                                 nbytes(dtype, shape)))
        entries.append((name, dtype, shape, at, at + len(data)))
        datas.append(data)
        at += len(data)
    return header_bytes(entries, metadata), datas


def write(path, tensors, metadata=None):
    head, datas = encode(tensors, metadata)
    with open(path, "wb") as f:
        f.write(head)
        for d in datas:
            f.write(d)


def det_bytes(n, seed):
    """n reproducible bytes (not random-looking enough to matter; distinct per seed)."""
    out = bytearray()
    x = seed * 2654435761 % 2**32 + 1
    while len(out) < n:
        x = (x * 1103515245 + 12345) % 2**31
        out += struct.pack("<I", x)
    return bytes(out[:n])


def fixtures(d):
    os.makedirs(d, exist_ok=True)
    t = {}

    def add(name, dtype, shape, seed):
        t[name] = (dtype, shape, det_bytes(nbytes(dtype, shape), seed))

    add("model.embed_tokens.weight", "BF16", [16, 8], 1)
    add("model.layers.0.self_attn.q_proj.weight", "F32", [8, 8], 2)
    add("model.layers.0.self_attn.q_proj.bias", "F32", [8], 3)
    add("model.layers.0.mlp.up.weight", "F16", [4, 8], 4)
    add("blocks/0/attn/qkv", "I64", [3, 2], 5)
    add("blocks/0/norm", "U8", [5], 6)
    add("scalar", "F64", [], 7)
    add("empty", "F16", [0, 4], 8)
    add("flags", "BOOL", [5], 9)
    add("quant.scale", "F8_E4M3", [6], 10)
    add("caf\u00e9 \"q\"", "I8", [3], 11)  # non-ASCII and a quote in a name
    t["lm_head.weight"] = t["model.embed_tokens.weight"]  # tied: the same bytes, stored once
    write(os.path.join(d, "model.safetensors"), t, {"format": "pt"})
    # No __metadata__ at all, and an empty checkpoint.
    write(os.path.join(d, "nometa.safetensors"), {"x": ("F32", [2], det_bytes(8, 12))})
    write(os.path.join(d, "empty.safetensors"), {}, {})

    # Sharded: the same tensors split over two files, with an index.
    names = sorted(t)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    sd = os.path.join(d, "sharded")
    os.makedirs(sd, exist_ok=True)
    weight_map = {}
    for shard, keys in shards.items():
        write(os.path.join(sd, shard), {k: t[k] for k in keys}, {"format": "pt"})
        weight_map.update({k: shard for k in keys})
    total = sum(len(v[2]) for v in t.values())
    with open(os.path.join(sd, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    # An index that maps a tensor to the wrong shard.
    wrong = dict(weight_map)
    k = shards["model-00001-of-00002.safetensors"][0]
    wrong[k] = "model-00002-of-00002.safetensors"
    with open(os.path.join(sd, "wrong.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wrong}, f, indent=2)
    # An index naming a tensor no shard has, and one missing a tensor a shard has.
    with open(os.path.join(sd, "ghost.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": dict(weight_map, ghost="model-00001-of-00002.safetensors")}, f)
    with open(os.path.join(sd, "partial.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {n: s for n, s in weight_map.items() if n != "scalar"}}, f)

    # Malformed files, one problem each.
    bad = os.path.join(d, "bad")
    os.makedirs(bad, exist_ok=True)

    def raw(name, data):
        with open(os.path.join(bad, name), "wb") as f:
            f.write(data)

    def hdr(text, data=b""):
        text = text.encode("utf-8")
        return struct.pack("<Q", len(text)) + text + data

    raw("short.safetensors", b"\x10\x00\x00\x00")
    raw("cut.safetensors", struct.pack("<Q", 100) + b'{"a":')
    raw("huge.safetensors", struct.pack("<Q", 1 << 40) + b"{}      ")
    raw("badjson.safetensors", hdr('{"a":{"dtype":"F32",}}'))
    raw("array.safetensors", hdr('[1,2]   '))
    raw("baddtype.safetensors", hdr('{"a":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4))
    raw("subbyte.safetensors", hdr('{"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}', b"\0"))
    raw("mismatch.safetensors", hdr('{"a.weight":{"dtype":"F32","shape":[3],"data_offsets":[0,10]}}',
                                    b"\0" * 10))
    raw("overlap.safetensors", hdr('{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},'
                                   '"b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}}', b"\0" * 12))
    raw("hole.safetensors", hdr('{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
                                '"b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}}', b"\0" * 12))
    raw("tail.safetensors", hdr('{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}', b"\0" * 6))
    raw("range.safetensors", hdr('{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}}', b"\0" * 4))
    raw("dup.safetensors", hdr('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                               '"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"\0" * 2))
    raw("negshape.safetensors", hdr('{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}}'))
    raw("metanum.safetensors", hdr('{"__metadata__":{"format":1}}'))
    raw("dotdot.safetensors", hdr('{"../evil":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0"))
    raw("filedir.safetensors", hdr('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                   '"a/b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"\0" * 2))


def main(argv):
    if len(argv) == 3 and argv[1] == "fixtures":
        fixtures(argv[2])
        return 0
    print(__doc__.strip().splitlines()[0], file=sys.stderr)
    print("usage: st_write.py fixtures DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
