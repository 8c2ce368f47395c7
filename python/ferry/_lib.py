"""The ctypes layer: finds libferry, checks its major version, and declares the C structs and
functions of include/ferry.h that the package calls. Nothing here is public."""
import ctypes
import os
from ctypes import (POINTER, Structure, Union, c_char_p, c_double, c_float, c_int, c_int64,
                    c_size_t, c_uint, c_uint32, c_uint64, c_void_p)

#: The major version of libferry this package speaks to (FERRY_VERSION_MAJOR).
MAJOR = 0

MAX_DIMS = 8
MAX_SPLIT = 8
MAX_DEVICES = 16


def _candidates():
    """Where the library is looked for, in order: $FERRY_LIBRARY, beside the package, the system
    path (the dynamic loader's own search)."""
    env = os.environ.get("FERRY_LIBRARY")
    if env:
        return [("$FERRY_LIBRARY", env)]
    here = os.path.dirname(os.path.abspath(__file__))
    out = [("beside the package", os.path.join(here, n)) for n in ("libferry.so.0", "libferry.so")]
    out.append(("the system path", "libferry.so.0"))
    return out


def _load():
    tried = []
    for where, path in _candidates():
        if os.sep in path and not os.path.exists(path):
            if where == "$FERRY_LIBRARY":
                raise ImportError("ferry: $FERRY_LIBRARY=%s: no such file" % path)
            tried.append(path)
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            if where != "the system path" and os.path.exists(path):
                raise ImportError("ferry: cannot load %s (%s): %s" % (path, where, e)) from None
            tried.append("%s (%s)" % (path, e))
            continue
        return lib, path
    raise ImportError("ferry: libferry.so.0 not found; tried %s. Build it (make build) and set "
                      "FERRY_LIBRARY=.../build/libferry.so.0, or install it (make install)"
                      % "; ".join(tried))


lib, path = _load()
lib.ferry_version_number.restype = c_uint
lib.ferry_version_number.argtypes = []
lib.ferry_version.restype = c_char_p
lib.ferry_version.argtypes = []
version = lib.ferry_version().decode()
if lib.ferry_version_number() // 10000 != MAJOR:
    raise ImportError("ferry: %s is libferry %s (major version %d); this package needs major "
                      "version %d" % (path, version, lib.ferry_version_number() // 10000, MAJOR))

#: Whether the library knows ferry_policy.writable / ferry_tensor_writable.
HAS_WRITABLE = hasattr(lib, "ferry_tensor_writable")
#: Whether the library knows ferry_policy.experts / ferry_slice.
HAS_SLICE = hasattr(lib, "ferry_slice")


class TensorInfo(Structure):
    _fields_ = [("name", c_char_p), ("file", c_char_p), ("format", c_int), ("dtype", c_int),
                ("ndim", c_uint32), ("shape", c_int64 * MAX_DIMS), ("n_elems", c_uint64),
                ("row_elems", c_uint64), ("n_rows", c_uint64), ("offset", c_uint64),
                ("nbytes", c_uint64)]


class _Str(Structure):
    _fields_ = [("ptr", c_void_p), ("len", c_uint64)]


class Value(Structure):
    pass


class _Arr(Structure):
    _fields_ = [("elem", c_int), ("n", c_uint64), ("items", POINTER(Value))]


class _ValueUnion(Union):
    _fields_ = [("u", c_uint64), ("i", c_int64), ("f", c_double), ("str", _Str), ("arr", _Arr)]


Value._fields_ = [("type", c_int), ("v", _ValueUnion)]

# struct ferry_policy, member for member as include/ferry.h declares it. New members are only
# ever appended there: append them here too, behind a check that the loaded library has them.
_POLICY_FIELDS = [("home", c_int), ("compute_device", c_int), ("load", c_int), ("lazy", c_int),
                  ("lazy_threshold", c_uint64), ("lock", c_int), ("convert", c_int),
                  ("compute_dtype", c_int), ("n_split", c_int),
                  ("split_devices", c_int * MAX_SPLIT), ("split_weights", c_float * MAX_SPLIT)]
if HAS_WRITABLE:
    _POLICY_FIELDS.append(("writable", c_int))
    if HAS_SLICE:
        _POLICY_FIELDS.append(("experts", c_int))


class Policy(Structure):
    _fields_ = _POLICY_FIELDS


class Options(Structure):
    _fields_ = [("io_threads", c_uint32), ("host_budget", c_uint64), ("no_schedule", c_int),
                ("slice_evict", c_int), ("io_request_bytes", c_uint64)]


class DeviceInfo(Structure):
    _fields_ = [("name", c_char_p), ("kind", c_char_p), ("total_bytes", c_uint64),
                ("free_bytes", c_uint64), ("budget", c_uint64), ("used_bytes", c_uint64),
                ("host_accessible", c_int)]


class TensorPart(Structure):
    _fields_ = [("device", c_int), ("row0", c_uint64), ("n_rows", c_uint64), ("data", c_void_p),
                ("nbytes", c_uint64)]


class LoraOptions(Structure):
    _fields_ = [("base_prefix", c_char_p), ("target_prefix", c_char_p), ("required", c_int)]


class LoraInfo(Structure):
    _fields_ = [("path", c_char_p), ("scheme", c_char_p), ("multiplier", c_float),
                ("n_pairs", c_uint32), ("n_matched", c_uint32), ("n_unmatched", c_uint32),
                ("unmatched", c_char_p * 4), ("skipped", c_uint32), ("factor_bytes", c_uint64)]


class LoraFactor(Structure):
    _fields_ = [("a", POINTER(c_float)), ("b", POINTER(c_float)), ("rank", c_uint32),
                ("rows", c_uint64), ("cols", c_uint64), ("scale", c_float), ("adapter", c_int)]


class Placement(Structure):
    _fields_ = [("name", c_char_p), ("group", c_char_p), ("home", c_int),
                ("compute_device", c_int), ("lazy", c_int), ("zero_copy", c_int),
                ("home_bytes", c_uint64), ("compute_bytes", c_uint64)]


class PlanTotals(Structure):
    _fields_ = [("host_bytes", c_uint64), ("mapped_bytes", c_uint64), ("disk_bytes", c_uint64),
                ("device_bytes", c_uint64 * MAX_DEVICES), ("staged_bytes", c_uint64 * MAX_DEVICES)]


class Stats(Structure):
    _fields_ = [("resident_bytes", c_uint64 * MAX_DEVICES), ("peak_bytes", c_uint64 * MAX_DEVICES),
                ("home_host_bytes", c_uint64), ("home_device_bytes", c_uint64),
                ("cached_bytes", c_uint64), ("bytes_read", c_uint64), ("bytes_copied", c_uint64),
                ("prepares", c_uint64), ("prefetch_hits", c_uint64),
                ("prefetch_misses", c_uint64), ("evictions", c_uint64), ("locked_bytes", c_uint64),
                ("lock_failures", c_uint64), ("wait_seconds", c_double),
                ("guess_bytes", c_uint64), ("guess_unused_bytes", c_uint64),
                ("faulted_ahead_bytes", c_uint64)]


#: Every struct the package mirrors, by its C name (the layout test compares them with C).
STRUCTS = {"ferry_tensor_info": TensorInfo, "ferry_value": Value, "ferry_policy": Policy,
           "ferry_options": Options, "ferry_device_info": DeviceInfo,
           "ferry_tensor_part": TensorPart, "ferry_lora_options": LoraOptions,
           "ferry_lora_info": LoraInfo, "ferry_lora_factor": LoraFactor,
           "ferry_placement": Placement, "ferry_plan_totals": PlanTotals, "ferry_stats": Stats}

P = c_void_p
_PP = POINTER(c_void_p)
_FUNCS = {
    "ferry_strerror": (c_char_p, [c_int]),
    "ferry_parse_size": (c_int, [c_char_p, POINTER(c_uint64)]),
    "ferry_dtype_name": (c_char_p, [c_int]),
    "ferry_dtype_from_name": (c_int, [c_char_p]),
    "ferry_dtype_block_elems": (c_uint32, [c_int]),
    "ferry_dtype_block_bytes": (c_uint32, [c_int]),
    "ferry_dtype_nbytes": (c_int, [c_int, c_uint64, POINTER(c_uint64)]),
    "ferry_dtype_convert": (c_int, [c_int, P, c_int, P, c_uint64]),
    "ferry_matvec": (c_int, [c_int, P, c_uint64, c_uint64, P, P]),
    "ferry_catalog_count": (c_size_t, [P]),
    "ferry_catalog_tensor": (c_int, [P, c_size_t, POINTER(TensorInfo)]),
    "ferry_catalog_meta_count": (c_size_t, [P]),
    "ferry_catalog_meta_key": (c_char_p, [P, c_size_t]),
    "ferry_catalog_meta_value": (POINTER(Value), [P, c_size_t]),
    "ferry_catalog_file_count": (c_size_t, [P]),
    "ferry_catalog_file_format": (c_int, [P, c_size_t]),
    "ferry_create": (P, [POINTER(Options)]),
    "ferry_destroy": (None, [P]),
    "ferry_errmsg": (c_char_p, [P]),
    "ferry_add_device": (c_int, [P, c_char_p, POINTER(c_int)]),
    "ferry_device_count": (c_int, [P]),
    "ferry_get_device_info": (c_int, [P, c_int, POINTER(DeviceInfo)]),
    "ferry_set_budget": (c_int, [P, c_int, c_uint64]),
    "ferry_reserve": (c_int, [P, c_int, c_uint64]),
    "ferry_open": (c_int, [P, c_char_p, c_char_p]),
    "ferry_catalog_of": (P, [P]),
    "ferry_group_add": (c_int, [P, c_char_p, c_char_p, POINTER(Policy)]),
    "ferry_ignore": (c_int, [P, c_char_p]),
    "ferry_optional": (c_int, [P, c_char_p]),
    "ferry_group_remove": (c_int, [P, c_char_p]),
    "ferry_find": (P, [P, c_char_p]),
    "ferry_tensor_get_info": (c_int, [P, POINTER(TensorInfo)]),
    "ferry_expect": (c_int, [P, c_char_p, c_int, c_uint32, POINTER(c_int64)]),
    "ferry_validate": (c_int, [P]),
    "ferry_prepare": (c_int, [P, _PP, c_size_t]),
    "ferry_release": (c_int, [P, _PP, c_size_t]),
    "ferry_release_all": (c_int, [P]),
    "ferry_prefetch": (c_int, [P, _PP, c_size_t]),
    "ferry_prefetch_guess": (c_int, [P, _PP, c_size_t]),
    "ferry_tensor_data": (c_void_p, [P]),
    "ferry_tensor_nbytes": (c_uint64, [P]),
    "ferry_tensor_dtype": (c_int, [P]),
    "ferry_tensor_part_count": (c_int, [P]),
    "ferry_tensor_get_part": (c_int, [P, c_int, POINTER(TensorPart)]),
    "ferry_tensor_read": (c_int, [P, P, c_uint64, c_uint64, P]),
    "ferry_read_rows": (c_int, [P, P, POINTER(c_uint64), c_size_t, P]),
    "ferry_load_group": (c_int, [P, c_char_p]),
    "ferry_lora_add": (c_int, [P, c_char_p, c_float, POINTER(LoraOptions), POINTER(c_int)]),
    "ferry_lora_set_multiplier": (c_int, [P, c_int, c_float]),
    "ferry_lora_remove": (c_int, [P, c_int]),
    "ferry_lora_clear": (c_int, [P]),
    "ferry_lora_set_mode": (c_int, [P, c_int]),
    "ferry_lora_epoch": (c_uint64, [P]),
    "ferry_lora_get_info": (c_int, [P, c_int, POINTER(LoraInfo)]),
    "ferry_plan": (c_int, [P, POINTER(POINTER(Placement)), POINTER(c_size_t),
                           POINTER(PlanTotals)]),
    "ferry_get_stats": (c_int, [P, POINTER(Stats)]),
    "ferry_check_files": (c_int, [P]),
    "ferry_guard_sigbus": (c_int, [c_int]),
    "ferry_trace_start": (c_int, [P, c_char_p]),
    "ferry_trace_stop": (c_int, [P]),
}
for _name, (_res, _args) in _FUNCS.items():
    _fn = getattr(lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args
if HAS_WRITABLE:
    lib.ferry_tensor_writable.restype = c_int
    lib.ferry_tensor_writable.argtypes = [P]
if HAS_SLICE:
    lib.ferry_slice.restype = c_int
    lib.ferry_slice.argtypes = [P, P, c_uint64, c_uint64, POINTER(P)]

_libc = ctypes.CDLL(None)
libc_free = _libc.free
libc_free.argtypes = [c_void_p]
libc_free.restype = None
