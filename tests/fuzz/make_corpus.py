#!/usr/bin/env python3
"""make_corpus.py — writes the seed corpus of the fuzz targets (tests/fuzz/corpus/{gguf,
safetensors,index}/): valid files that reach every part of each reader, and near-valid broken ones
that stop in each of its checks. Deterministic; rerun after changing it:

    python3 tests/fuzz/make_corpus.py            # writes next to this script
    python3 tests/fuzz/make_corpus.py OUTDIR

Every file stays well under 64 KiB (the fuzzers run with -max_len=65536).
"""
import json
import os
import struct
import sys

# GGUF metadata value types and the block geometry of the tensor types used here.
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
              BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}
# type id: (name, elements per block, bytes per block)
GT = {0: ("f32", 1, 4), 1: ("f16", 1, 2), 2: ("q4_0", 32, 18), 3: ("q4_1", 32, 20),
      6: ("q5_0", 32, 22), 7: ("q5_1", 32, 24), 8: ("q8_0", 32, 34), 9: ("q8_1", 32, 36),
      10: ("q2_k", 256, 84), 11: ("q3_k", 256, 110), 12: ("q4_k", 256, 144),
      13: ("q5_k", 256, 176), 14: ("q6_k", 256, 210), 15: ("q8_k", 256, 292),
      16: ("iq2_xxs", 256, 66), 17: ("iq2_xs", 256, 74), 18: ("iq3_xxs", 256, 98),
      19: ("iq1_s", 256, 50), 20: ("iq4_nl", 32, 18), 21: ("iq3_s", 256, 110),
      22: ("iq2_s", 256, 82), 23: ("iq4_xs", 256, 136), 24: ("i8", 1, 1), 25: ("i16", 1, 2),
      26: ("i32", 1, 4), 27: ("i64", 1, 8), 28: ("f64", 1, 8), 29: ("iq1_m", 256, 56),
      30: ("bf16", 1, 2), 34: ("tq1_0", 256, 54), 35: ("tq2_0", 256, 66), 39: ("mxfp4", 32, 17)}


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gval(t, v):
    """A GGUF value of type T (without the type tag). Arrays: v = (elem_type, [items])."""
    if t == STR:
        return gstr(v)
    if t == ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(gval(et, x) for x in items)
    return struct.pack(SCALAR_FMT[t], v)


def gguf(kvs, tensors, version=3, align=32, n_tensors=None, n_kv=None, data=None, tail=b""):
    """kvs: [(key, type, value)]; tensors: [(name, [ne...], type_id)] placed one after another,
    each aligned, or [(name, [ne...], type_id, offset)] placed at OFFSET. Returns the file bytes
    (data zero-filled unless DATA given)."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                len(kvs) if n_kv is None else n_kv)
    for k, t, v in kvs:
        out += gstr(k) + struct.pack("<I", t) + gval(t, v)
    off = 0
    sizes = []
    for name, ne, tid, *at in tensors:
        _, be, bb = GT.get(tid, ("?", 1, 1))
        n = 1
        for d in ne:
            n *= d
        size = (n // be) * bb
        off = at[0] if at else (off + align - 1) // align * align
        out += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<q", d) for d in ne)
        out += struct.pack("<IQ", tid, off)
        sizes.append((off, size))
        off += size
    out += b"\0" * ((-len(out)) % align)
    end = max([o + s for o, s in sizes], default=0)
    out += data if data is not None else bytes((i * 37) & 0xFF for i in range(end))
    return out + tail


def st(tensors, metadata=None, pad=True, raw_header=None, declared=None, data_len=None):
    """tensors: [(name, dtype, shape, nbytes)] packed in order. Returns the file bytes."""
    if raw_header is None:
        hdr = {}
        if metadata is not None:
            hdr["__metadata__"] = metadata
        off = 0
        for name, dt, shape, nb in tensors:
            hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nb]}
            off += nb
        text = json.dumps(hdr, separators=(",", ":")).encode()
        total = off
    else:
        text = raw_header if isinstance(raw_header, bytes) else raw_header.encode()
        total = 0
    if pad:
        text += b" " * ((-len(text)) % 8)
    n = len(text) if declared is None else declared
    body = bytes((i * 11) & 0xFF for i in range(total if data_len is None else data_len))
    return struct.pack("<Q", n) + text + body


def gguf_corpus():
    c = {}
    every = [
        ("general.architecture", STR, "llama"), ("general.name", STR, "tiny \u00e9\u4e2d"),
        ("u8", U8, 255), ("i8", I8, -128), ("u16", U16, 65535), ("i16", I16, -32768),
        ("u32", U32, 4294967295), ("i32", I32, -2147483648), ("f32", F32, 1.5),
        ("bool", BOOL, 1), ("u64", U64, 2**64 - 1), ("i64", I64, -2**63), ("f64", F64, -0.0),
        ("empty", STR, ""),
        ("arr.u8", ARR, (U8, [1, 2, 3])), ("arr.i32", ARR, (I32, [-1, 0, 1])),
        ("arr.f32", ARR, (F32, [0.5, -2.0])), ("arr.str", ARR, (STR, ["a", "", "tok\u00e9"])),
        ("arr.bool", ARR, (BOOL, [0, 1])), ("arr.f64", ARR, (F64, [1e300])),
        ("arr.empty", ARR, (U64, [])),
        ("arr.nested", ARR, (ARR, [(U32, [1, 2]), (U32, [3])])),
        ("arr.nested3", ARR, (ARR, [(ARR, [(STR, ["x"]), (STR, [])])])),
    ]
    tensors = [("tok_embd.weight", [32, 4], 8), ("norm.weight", [32], 0), ("h.f16", [8, 2], 1),
               ("q4", [64, 2], 2), ("qk", [256], 12), ("bf", [4], 30), ("i", [3], 26),
               ("scalarish", [1], 0), ("empty.t", [0, 4], 0)]
    c["v3_every_type.gguf"] = gguf(every, tensors)
    c["v2_every_type.gguf"] = gguf(every, tensors, version=2)
    c["v3_align64.gguf"] = gguf([("general.alignment", U32, 64)] + every[:3], tensors[:4],
                                align=64)
    c["v3_align1.gguf"] = gguf([("general.alignment", U32, 1)], tensors[:4], align=1)
    c["v3_empty.gguf"] = gguf([], [])
    c["v3_meta_only.gguf"] = gguf(every, [])
    quant = [(f"t.{GT[t][0]}", [GT[t][1] * 2, 1], t) for t in sorted(GT)]
    c["v3_all_tensor_types.gguf"] = gguf([("general.name", STR, "types")], quant)
    c["v3_dims.gguf"] = gguf([], [("d1", [2], 0), ("d4", [1, 2, 1, 2], 0),
                                  ("d8", [1, 1, 1, 1, 1, 1, 1, 2], 0)])
    c["v3_split.gguf"] = gguf([("split.no", U16, 0), ("split.count", U16, 2),
                               ("split.tensors.count", I32, 2)], tensors[:1])
    c["v3_many.gguf"] = gguf([], [(f"blk.{i}.w", [4], 0) for i in range(64)])
    # near-valid broken ones
    base = gguf(every[:4], tensors[:3])
    c["bad_magic.gguf"] = b"GGUG" + base[4:]
    c["bad_version1.gguf"] = base[:4] + struct.pack("<I", 1) + base[8:]
    c["bad_version4.gguf"] = base[:4] + struct.pack("<I", 4) + base[8:]
    c["bad_truncated.gguf"] = base[:len(base) // 2]
    c["bad_n_kv_huge.gguf"] = gguf(every[:2], [], n_kv=2**63)
    c["bad_retired_type.gguf"] = gguf([], [("t", [32], 4)])
    c["bad_unknown_type.gguf"] = gguf([], [("t", [32], 40)])
    c["bad_q4_0_33.gguf"] = gguf([], [("t", [33], 2)], data=b"\0" * 64)
    c["bad_align3.gguf"] = gguf([("general.alignment", U32, 3)], tensors[:1])
    c["bad_dup_key.gguf"] = gguf([("a", U8, 1), ("a", U8, 2)], [])
    c["bad_dup_tensor.gguf"] = gguf([], [("t", [4], 0), ("t", [4], 0)])
    c["bad_nesting.gguf"] = gguf([("deep", ARR, (ARR, [(ARR, [(ARR, [(ARR, [(ARR, [(ARR, [(ARR, [
        (ARR, [(ARR, [(U8, [1])])])])])])])])])]))], [])
    c["bad_ndim9.gguf"] = gguf([], [("t", [1] * 9, 0)])
    c["bad_data_short.gguf"] = gguf([], tensors[:2])[:-5]
    # an empty tensor placed inside the first one, before the second that overlaps it
    c["bad_overlap_behind_empty.gguf"] = gguf([], [("a", [64], 0, 0), ("e", [0], 0, 128),
                                                   ("c", [16], 0, 160)])
    c["v3_empty_rows.gguf"] = gguf([], [("a.weight", [64, 4], 0), ("empty.weight", [64, 0], 0),
                                        ("empty1d", [0], 0)])
    c["bad_empty_name.gguf"] = gguf([], [("", [4], 0)])
    return c


def st_corpus():
    c = {}
    meta = {"format": "pt", "note": "caf\u00e9 \"quoted\" \\ \n\t\u2028 \U0001F600"}
    every = [("f64", "F64", [2], 16), ("f32", "F32", [2, 3], 24), ("f16", "F16", [4], 8),
             ("bf16", "BF16", [1, 4], 8), ("i64", "I64", [1], 8), ("i32", "I32", [2], 8),
             ("i16", "I16", [2], 4), ("i8", "I8", [3], 3), ("u64", "U64", [1], 8),
             ("u32", "U32", [1], 4), ("u16", "U16", [1], 2), ("u8", "U8", [5], 5),
             ("bool", "BOOL", [2], 2), ("e4m3", "F8_E4M3", [4], 4), ("e5m2", "F8_E5M2", [4], 4),
             ("e8m0", "F8_E8M0", [2], 2), ("c64", "C64", [1], 8), ("f4", "F4", [4], 2),
             ("f6a", "F6_E2M3", [4], 3), ("f6b", "F6_E3M2", [8], 6),
             ("scalar", "F32", [], 4), ("zero", "F32", [0, 7], 0)]
    c["every_dtype.safetensors"] = st(every, meta)
    c["no_metadata.safetensors"] = st(every[:3])
    c["unpadded.safetensors"] = st(every[:3], {"a": "b"}, pad=False)
    c["empty_object.safetensors"] = st([], None)
    c["metadata_only.safetensors"] = st([], {"k": "v"})
    c["unicode_names.safetensors"] = st([("caf\u00e9.w", "F32", [1], 4),
                                         ("\u4e2d\u6587", "F16", [1], 2),
                                         ("model.layers.0.self_attn.q_proj.weight", "BF16",
                                          [2, 2], 8)])
    c["escapes.safetensors"] = st([], raw_header='{"a\\u0041\\/b":{"dtype":"F32","shape":[1],'
                                  '"data_offsets":[0,4]},"__metadata__":{"x":"\\ud83d\\ude00"}}',
                                  data_len=4)
    c["whitespace.safetensors"] = st([], raw_header=' {\n "t" : { "dtype" : "U8" , "shape" : '
                                     '[ 2 ] , "data_offsets" : [ 0 , 2 ] } \n}\n', data_len=2)
    c["many.safetensors"] = st([(f"layer.{i}.w", "F16", [2], 4) for i in range(100)])
    c["reordered_offsets.safetensors"] = st([], raw_header='{"b":{"dtype":"U8","shape":[2],'
                                            '"data_offsets":[2,4]},"a":{"dtype":"U8","shape":[2],'
                                            '"data_offsets":[0,2]}}', data_len=4)
    # near-valid broken ones
    c["bad_short.safetensors"] = b"\x08\0\0\0"
    c["bad_header_past_eof.safetensors"] = st(every[:2], declared=4096)
    c["bad_not_json.safetensors"] = st([], raw_header='{"a" 1}')
    c["bad_trailing.safetensors"] = st([], raw_header='{} x')
    c["bad_utf8.safetensors"] = st([], raw_header=b'{"a\xc0\xaf":{"dtype":"F32","shape":[1],'
                                   b'"data_offsets":[0,4]}}')
    c["bad_surrogate.safetensors"] = st([], raw_header='{"a\\ud800":1}')
    c["bad_depth.safetensors"] = st([], raw_header='{"__metadata__":' + "[" * 200 + "]" * 200 + "}")
    c["bad_dup.safetensors"] = st([], raw_header='{"a":{"dtype":"F32","shape":[1],"data_offsets"'
                                  ':[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}')
    c["bad_dtype.safetensors"] = st([("a", "F17", [1], 4)])
    c["bad_shape_neg.safetensors"] = st([], raw_header='{"a":{"dtype":"F32","shape":[-1],'
                                        '"data_offsets":[0,4]}}')
    c["bad_shape_overflow.safetensors"] = st([("a", "F32", [2**32, 2**32, 4], 4)])
    c["bad_offsets_reversed.safetensors"] = st([], raw_header='{"a":{"dtype":"U8","shape":[4],'
                                               '"data_offsets":[4,0]}}', data_len=4)
    c["bad_size_mismatch.safetensors"] = st([("a", "F32", [2, 3], 20)])
    c["bad_overlap.safetensors"] = st([], raw_header='{"a":{"dtype":"U8","shape":[4],'
                                      '"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],'
                                      '"data_offsets":[2,6]}}', data_len=6)
    c["bad_overlap_behind_empty.safetensors"] = st([], raw_header='{"a":{"dtype":"U8","shape":'
                                                   '[8],"data_offsets":[0,8]},"e":{"dtype":"U8",'
                                                   '"shape":[0],"data_offsets":[4,4]},"c":{"dtype"'
                                                   ':"U8","shape":[2],"data_offsets":[6,8]}}',
                                                   data_len=8)
    c["empty_rows.safetensors"] = st([("a.weight", "F32", [4, 64], 1024),
                                      ("empty.weight", "F32", [0, 64], 0),
                                      ("empty1d", "F32", [0], 0)])
    c["bad_empty_name.safetensors"] = st([("", "F32", [4], 16)])
    c["bad_meta_number.safetensors"] = st([], {"epochs": 3})
    c["bad_numbers.safetensors"] = st([], raw_header='{"a":{"dtype":"F32","shape":[1.5e3,01,-0],'
                                      '"data_offsets":[0,1e2]}}')
    return c


def index_corpus():
    c = {}

    def ix(obj):
        return json.dumps(obj, indent=2, ensure_ascii=False).encode()

    wm = {f"model.layers.{i}.w": f"model-0000{i % 3 + 1}-of-00003.safetensors" for i in range(12)}
    c["basic.index.json"] = ix({"metadata": {"total_size": 123456}, "weight_map": wm})
    c["no_metadata.index.json"] = ix({"weight_map": {"a": "a.safetensors"}})
    c["meta_strings.index.json"] = ix({"metadata": {"total_size": "77", "format": "pt",
                                                    "ratio": 0.5}, "weight_map": wm})
    c["subdir.index.json"] = ix({"weight_map": {"a": "sub/dir/a.safetensors",
                                                "b": "./b.safetensors", "c": "..x.safetensors"}})
    c["unicode.index.json"] = ix({"weight_map": {"caf\u00e9": "\u4e2d.safetensors"}})
    c["empty_map.index.json"] = ix({"metadata": {}, "weight_map": {}})
    c["extra_keys.index.json"] = ix({"weight_map": {"a": "a.safetensors"},
                                     "other": [1, {"x": None}], "metadata": {"total_size": 8}})
    c["diffusers.index.json"] = ix({"_class_name": "UNet", "metadata": {"total_size": 9},
                                    "weight_map": {"down.0.w": "diffusion_pytorch_model-00001-"
                                                   "of-00002.safetensors"}})
    # near-valid broken ones
    c["bad_absolute.index.json"] = ix({"weight_map": {"a": "/etc/passwd"}})
    c["bad_dotdot.index.json"] = ix({"weight_map": {"a": "../a.safetensors"}})
    c["bad_dotdot_inner.index.json"] = ix({"weight_map": {"a": "x/../../a.safetensors"}})
    c["bad_wm_array.index.json"] = ix({"weight_map": ["a.safetensors"]})
    c["bad_wm_absent.index.json"] = ix({"metadata": {"total_size": 1}})
    c["bad_shard_number.index.json"] = ix({"weight_map": {"a": 1}})
    c["bad_empty_shard.index.json"] = ix({"weight_map": {"a": ""}})
    c["bad_not_object.index.json"] = b'["weight_map"]'
    c["bad_truncated.index.json"] = ix({"weight_map": wm})[:60]
    c["bad_dup.index.json"] = b'{"weight_map":{"a":"x.safetensors","a":"y.safetensors"}}'
    c["bad_depth.index.json"] = b'{"metadata":' + b"[" * 100 + b"]" * 100 + b"}"
    return c


def main():
    here = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(
        os.path.abspath(__file__)), "corpus")
    for sub, files in (("gguf", gguf_corpus()), ("safetensors", st_corpus()),
                       ("index", index_corpus())):
        d = os.path.join(here, sub)
        os.makedirs(d, exist_ok=True)
        for name, data in sorted(files.items()):
            assert len(data) < 65536, name
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        print(f"{sub}: {len(files)} files")


if __name__ == "__main__":
    main()
