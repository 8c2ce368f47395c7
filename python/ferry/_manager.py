"""ferry.Manager: the manager of include/ferry.h in Python's idioms."""
import contextlib
import ctypes
import re
from ctypes import byref, c_int, c_int64, c_size_t, c_uint64, c_void_p

import numpy as np

from . import _array, _dtypes, _lib
from ._errors import EINVAL, ENOENT, EUNSUPPORTED, error

L = _lib.lib

HOMES = {"host": 0, "disk": 1, "device": 2}
LOADS = {"auto": 0, "mmap": 1, "read": 2, "direct": 3}
_HOME_NAMES = {v: k for k, v in HOMES.items()}
_SLICE_NAME = re.compile(r"^(.+)\[([0-9]+):([0-9]+)\]$")


def _b(s):
    return None if s is None else s.encode() if isinstance(s, str) else bytes(s)


def _s(b):
    return None if b is None else b.decode("utf-8", "replace")


def parse_size(size):
    """Bytes from an int or a size string ("512M", "8GiB", "1.5KiB"), as ferry_parse_size."""
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        if size < 0:
            raise ValueError("ferry: a size cannot be negative: %d" % size)
        return int(size)
    if isinstance(size, str):
        out = c_uint64()
        if L.ferry_parse_size(size.encode(), out) == 0:
            return out.value
    raise ValueError("ferry: %r is not a size (bytes, or \"512M\", \"8GiB\", ...)" % (size,))


def value_to_python(v):
    """A ferry_value as a Python int, float, bool, str or list."""
    t = v.type
    if t in (0, 2, 4, 10):
        return v.v.u
    if t in (1, 3, 5, 11):
        return v.v.i
    if t in (6, 12):
        return v.v.f
    if t == 7:
        return bool(v.v.u)
    if t == 8:
        return ctypes.string_at(v.v.str.ptr, v.v.str.len).decode("utf-8", "replace") \
            if v.v.str.len else ""
    if t == 9:
        return [value_to_python(v.v.arr.items[i]) for i in range(v.v.arr.n)]
    return None


def catalog_metadata(cat):
    out = {}
    for i in range(L.ferry_catalog_meta_count(cat)):
        key = _s(L.ferry_catalog_meta_key(cat, i))
        val = L.ferry_catalog_meta_value(cat, i)
        out[key] = value_to_python(val.contents) if val else None
    return out


def info_dict(info):
    return {"name": _s(info.name), "file": _s(info.file),
            "format": {1: "gguf", 2: "safetensors"}.get(info.format, "unknown"),
            "dtype": _dtypes.dtype_name(info.dtype),
            "shape": tuple(info.shape[i] for i in range(info.ndim)),
            "numpy_shape": _dtypes.numpy_shape(info), "n_elems": info.n_elems,
            "row_elems": info.row_elems, "n_rows": info.n_rows, "offset": info.offset,
            "nbytes": info.nbytes}


def guard_sigbus(on=True):
    """Installs (ON) or removes ferry's process-wide SIGBUS guard: a read of a zero-copy array
    whose file was truncated under it sees zeros instead of killing the process, and the file's
    next check raises ECHANGED (ferry_guard_sigbus). Off by default."""
    rc = L.ferry_guard_sigbus(1 if on else 0)
    if rc:
        raise error(rc, "ferry_guard_sigbus(%d)" % (1 if on else 0))


class _Native:
    """Owns one ferry*: destroyed when the Manager is closed and no array over its memory is
    left (each Hold keeps it alive)."""

    def __init__(self, ptr):
        self.ptr = ptr

    def release_one(self, handle):
        arr = (c_void_p * 1)(handle)
        L.ferry_release(self.ptr, arr, 1)

    def __del__(self):
        p, self.ptr = self.ptr, None
        if p:
            try:
                L.ferry_destroy(p)
            except Exception:   # interpreter shutdown: the process frees everything anyway
                pass


class DeviceTensor:
    """A prepared tensor whose memory the CPU cannot read directly (an accelerator), or that is
    split over several devices. ``parts`` lists (device, row0, n_rows, data address, nbytes);
    ``numpy()`` copies it to a new host array."""

    def __init__(self, manager, name, hold, dtype, shape, parts):
        self._manager, self._hold, self.name = manager, hold, name
        self.dtype, self.shape, self.parts = dtype, shape, parts

    @property
    def data_ptr(self):
        """The device address of an unsplit tensor (None when split)."""
        return self.parts[0][3] if len(self.parts) == 1 else None

    def numpy(self):
        """A new host array with this tensor's bytes (ferry_tensor_read)."""
        return self._manager._read_prepared(self.name, self.dtype, self.shape)


class Prepared:
    """The tensors of one ``Manager.prepared`` block, in the order they were asked for. Indexing
    after the block ends raises FerryError; an array taken out of it stays valid on its own."""

    def __init__(self, names, arrays):
        self._names = list(names)
        self._arrays = arrays

    def _live(self):
        if self._arrays is None:
            raise EINVAL("ferry: these tensors were released at the end of their "
                         "'with prepared(...)' block", -1)
        return self._arrays

    def __getitem__(self, i):
        if isinstance(i, str):
            return self._live()[self._names.index(i)]
        return self._live()[i]

    def __len__(self):
        return len(self._live())

    def __iter__(self):
        return iter(self._live())

    def items(self):
        """(name, array) pairs."""
        return zip(self._names, self._live())

    def _release(self):
        self._arrays = None


class Lora:
    """An adapter added with ``Manager.add_lora``. Setting ``multiplier`` starts a new epoch
    (staged copies are re-merged at their next prepare); ``remove()`` takes it out."""

    def __init__(self, manager, id_):
        self._m, self.id = manager, id_

    @property
    def multiplier(self):
        """The adapter's multiplier (settable)."""
        return self.info["multiplier"]

    @multiplier.setter
    def multiplier(self, value):
        self._m._check(L.ferry_lora_set_multiplier(self._m._p(), self.id, float(value)))

    @property
    def info(self):
        """A dict: path, scheme, multiplier, n_pairs, n_matched, n_unmatched, unmatched (the
        first names), skipped, factor_bytes."""
        i = _lib.LoraInfo()
        self._m._check(L.ferry_lora_get_info(self._m._p(), self.id, byref(i)))
        return {"path": _s(i.path), "scheme": _s(i.scheme), "multiplier": i.multiplier,
                "n_pairs": i.n_pairs, "n_matched": i.n_matched, "n_unmatched": i.n_unmatched,
                "unmatched": [_s(u) for u in i.unmatched if u], "skipped": i.skipped,
                "factor_bytes": i.factor_bytes}

    def remove(self):
        """Removes the adapter (a new epoch)."""
        self._m._check(L.ferry_lora_remove(self._m._p(), self.id))


class Manager:
    """A ferry manager: model files, groups with placement policies, budgets, prepared tensors.

    ``Manager(host_budget=None, devices=(), io_threads=None, schedule=True)``: HOST_BUDGET is
    the bytes of host RAM ferry may hold (an int or "4GiB"; None: ferry's default host budget,
    what the host can give less a margin; above the host's capacity: EBUDGET); DEVICES are device
    specs added after the cpu (device 0): "sim:8GiB@25GB/s", "cuda:0", their ids 1, 2, ...;
    IO_THREADS the I/O workers (None: ferry's default); SCHEDULE=False never records an access
    order. Use it as a context manager, or call ``close()``. Thread-safe as the C API is.
    """

    def __init__(self, host_budget=None, devices=(), io_threads=None, schedule=True):
        opt = _lib.Options()
        opt.io_threads = int(io_threads or 0)
        opt.host_budget = parse_size(host_budget) if host_budget else 0
        opt.no_schedule = 0 if schedule else 1
        p = L.ferry_create(byref(opt))
        if not p and opt.host_budget:
            # ferry_create refuses a host budget above the host's capacity; a manager made
            # without it says why
            opt.host_budget = 0
            q = L.ferry_create(byref(opt))
            rc = L.ferry_set_budget(q, 0, parse_size(host_budget)) if q else -2
            msg = _s(L.ferry_errmsg(q)) if q else "ferry_create: out of memory"
            L.ferry_destroy(q)
            raise error(rc or -18, msg)
        if not p:
            raise error(-2, "ferry_create: out of memory")
        self._n = _Native(p)
        self._tensors = {}
        self._static_cache = {}
        self._host_ok = {}
        self.device_ids = {"cpu": 0}
        try:
            for spec in devices:
                self.add_device(spec)
        except BaseException:
            self.close()
            raise

    # ---- plumbing ----------------------------------------------------------------------------
    def _p(self):
        n = self._n
        if n is None:
            raise EINVAL("ferry: the manager is closed", -1)
        return n.ptr

    def _check(self, rc, what=None):
        if rc:
            msg = _s(L.ferry_errmsg(self._n.ptr)) if self._n is not None else ""
            if what and what not in (msg or ""):
                msg = "%s: %s" % (what, msg) if msg else what
            raise error(rc, msg)
        return rc

    def _handle(self, name):
        h = self._tensors.get(name)
        if h is None:
            h = L.ferry_find(self._p(), _b(name))
            m = _SLICE_NAME.match(name) if not h and _lib.HAS_SLICE else None
            if m:
                # "NAME[FIRST:END]": rows [FIRST, END) of NAME's outermost dimension (ferry_slice)
                first, end = int(m.group(2)), int(m.group(3))
                if end <= first:
                    raise EINVAL("ferry: slice '%s': END must be above FIRST" % name, -1)
                out = c_void_p()
                self._check(L.ferry_slice(self._p(), self._handle(m.group(1)), first,
                                          end - first, byref(out)), "slice '%s'" % name)
                h = out.value
            if not h:
                raise ENOENT("ferry: no tensor '%s' (absent or ignored)" % name, -4)
            self._tensors[name] = h
        return h

    def _device(self, dev):
        if isinstance(dev, str):
            if dev not in self.device_ids:
                raise ENOENT("ferry: no device '%s' in this manager (add it with devices=[...] "
                             "or add_device)" % dev, -4)
            return self.device_ids[dev]
        return int(dev)

    # ---- lifetime ----------------------------------------------------------------------------
    def close(self):
        """Closes the manager. Its memory is freed as soon as no array over it is left alive
        (an array taken out of a prepared block keeps its tensor, and the manager, valid)."""
        self._tensors = {}
        self._static_cache = {}
        self._n = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- devices, files, groups --------------------------------------------------------------
    def add_device(self, spec):
        """Adds device SPEC ("sim:8GiB", "cuda:0", ...) and returns its id."""
        i = c_int(-1)
        self._check(L.ferry_add_device(self._p(), _b(spec), byref(i)), "device '%s'" % spec)
        self.device_ids[spec] = i.value
        return i.value

    def devices(self):
        """A list of dicts, one per device: id, name, kind, total_bytes, free_bytes, budget,
        used_bytes, host_accessible."""
        out = []
        for d in range(L.ferry_device_count(self._p())):
            i = _lib.DeviceInfo()
            self._check(L.ferry_get_device_info(self._p(), d, byref(i)))
            out.append({"id": d, "name": _s(i.name), "kind": _s(i.kind),
                        "total_bytes": i.total_bytes, "free_bytes": i.free_bytes,
                        "budget": i.budget, "used_bytes": i.used_bytes,
                        "host_accessible": bool(i.host_accessible)})
        return out

    def set_budget(self, device, size):
        """Sets DEVICE's budget (an id, or a spec given at creation; 0 or "cpu" is the host
        budget) to SIZE bytes (int or "2GiB"; 0: the default)."""
        self._check(L.ferry_set_budget(self._p(), self._device(device), parse_size(size)))

    def reserve(self, device, size):
        """Reserves SIZE bytes (int or "1GiB") of DEVICE's budget for the engine's own memory
        (KV cache, activations), replacing the previous reservation there (0 gives it back);
        cached copies are evicted to make room (EBUDGET when it cannot fit)."""
        self._check(L.ferry_reserve(self._p(), self._device(device), parse_size(size)))

    def open(self, path, prefix=None):
        """Opens a model (GGUF, safetensors, a sharded index, a split GGUF) and adds its tensors,
        their names prefixed with PREFIX."""
        self._check(L.ferry_open(self._p(), _b(str(path)), _b(prefix)), str(path))

    def group(self, name, pattern, home="host", load="auto", lazy="auto", lazy_threshold=None,
              compute_device=0, dtype=None, lock=False, split=None, writable=False,
              experts=False):
        """Defines group NAME for the tensors matching the glob PATTERN (first match wins):
        HOME "host" | "disk" | "device"; LOAD "auto" | "mmap" | "read" | "direct"; LAZY "auto" |
        True | False (LAZY_THRESHOLD: bytes for "auto"); COMPUTE_DEVICE an id or a spec; DTYPE a
        type the staged copy is converted to ("f32", "f16", "q8_0", ...); LOCK mlocks host
        copies; SPLIT a list of devices (or (device, weight) pairs) to split 2-D tensors' rows
        over; WRITABLE guarantees a private writable host copy (libraries that support it);
        EXPERTS says the outermost dimension counts experts (plan lists one unit per expert:
        its slices, see ``prepared``)."""
        pol = _lib.Policy()
        if home not in HOMES:
            raise ValueError("ferry: home %r is not one of %s" % (home, ", ".join(HOMES)))
        if load not in LOADS:
            raise ValueError("ferry: load %r is not one of %s" % (load, ", ".join(LOADS)))
        pol.home, pol.load = HOMES[home], LOADS[load]
        lazies = {"auto": 0, None: 0, False: 1, "off": 1, True: 2, "on": 2}
        if lazy not in lazies:
            raise ValueError("ferry: lazy %r is not 'auto', True or False" % (lazy,))
        pol.lazy = lazies[lazy]
        pol.lazy_threshold = parse_size(lazy_threshold) if lazy_threshold else 0
        pol.compute_device = self._device(compute_device)
        pol.lock = 1 if lock else 0
        if dtype is not None:
            pol.convert, pol.compute_dtype = 1, _dtypes.dtype_id(dtype)
        if split:
            if len(split) > _lib.MAX_SPLIT:
                raise ValueError("ferry: at most %d split devices" % _lib.MAX_SPLIT)
            pol.n_split = len(split)
            for i, d in enumerate(split):
                dev, w = d if isinstance(d, tuple) else (d, 0.0)
                pol.split_devices[i], pol.split_weights[i] = self._device(dev), float(w)
        if writable:
            if not _lib.HAS_WRITABLE:
                raise EUNSUPPORTED("ferry: %s has no writable policies (ferry_tensor_writable)"
                                   % _lib.path, -22)
            pol.writable = 1
        if experts:
            if not _lib.HAS_SLICE:
                raise EUNSUPPORTED("ferry: %s has no slices (ferry_slice)" % _lib.path, -22)
            pol.experts = 1
        self._check(L.ferry_group_add(self._p(), _b(name), _b(pattern), byref(pol)),
                    "group '%s'" % name)
        self._static_cache = {}

    def ignore(self, pattern):
        """Tensors matching PATTERN are ignored: not loaded, not found, not required."""
        self._check(L.ferry_ignore(self._p(), _b(pattern)))

    def optional(self, pattern):
        """Tensors matching PATTERN may be missing without failing validate."""
        self._check(L.ferry_optional(self._p(), _b(pattern)))

    def remove_group(self, name):
        """Removes group NAME and frees its tensors' memory (EBUSY while any is prepared)."""
        self._check(L.ferry_group_remove(self._p(), _b(name)))
        self._tensors = {}
        self._static_cache = {}

    # ---- what the files hold -----------------------------------------------------------------
    def keys(self):
        """Every tensor's name, in file order."""
        cat = L.ferry_catalog_of(self._p())
        info = _lib.TensorInfo()
        out = []
        for i in range(L.ferry_catalog_count(cat)):
            L.ferry_catalog_tensor(cat, i, byref(info))
            out.append(_s(info.name))
        return out

    def info(self, name):
        """A dict describing tensor NAME: name, file, format, dtype, shape (the file's order),
        numpy_shape (outermost first), n_elems, row_elems, n_rows, offset, nbytes."""
        i = _lib.TensorInfo()
        self._check(L.ferry_tensor_get_info(self._handle(name), byref(i)))
        return info_dict(i)

    def metadata(self):
        """Every file's metadata as a dict (GGUF values keep their type)."""
        return catalog_metadata(L.ferry_catalog_of(self._p()))

    def expect(self, name, dtype=None, shape=None):
        """States the dtype (None: any) and shape (None: any; in the file's own order) the engine
        expects of tensor NAME; checked by validate() and at prepare."""
        t = -1 if dtype is None else _dtypes.dtype_id(dtype)
        dims = list(shape or [])
        arr = (c_int64 * max(len(dims), 1))(*dims)
        self._check(L.ferry_expect(self._p(), _b(name), t, len(dims), arr))

    def validate(self):
        """Checks every expectation; raises the error of the first problem, its message one
        line per problem."""
        self._check(L.ferry_validate(self._p()))

    # ---- prepare / release -------------------------------------------------------------------
    def _handles(self, names):
        hs = [self._handle(n) for n in names]
        return hs, (c_void_p * max(len(hs), 1))(*hs)

    def _read_prepared(self, name, dtype, shape):
        h = self._handle(name)
        n = L.ferry_tensor_nbytes(h)
        out = np.empty(n, dtype=np.uint8)
        self._check(L.ferry_tensor_read(self._p(), h, 0, n, out.ctypes.data), name)
        return out.view(dtype).reshape(shape)

    def _static(self, h):
        """What does not change between prepares of H: (dtype, shape, ferry dtype name or None,
        part count, whether its compute memory is host memory)."""
        st = self._static_cache.get(h)
        if st is None:
            info = _lib.TensorInfo()
            L.ferry_tensor_get_info(h, byref(info))
            t = L.ferry_tensor_dtype(h)
            dtype, shape = _dtypes.layout(t, _dtypes.numpy_shape(info))
            fname = None if t in _dtypes._NUMPY else _dtypes.dtype_name(t)
            nparts = L.ferry_tensor_part_count(h)
            part = _lib.TensorPart()
            L.ferry_tensor_get_part(h, 0, byref(part))
            st = (dtype, shape, fname, nparts, nparts == 1 and self._host_memory(part.device))
            self._static_cache[h] = st
        return st

    def _host_memory(self, dev):
        ok = self._host_ok.get(dev)
        if ok is None:
            i = _lib.DeviceInfo()
            L.ferry_get_device_info(self._n.ptr, dev, byref(i))
            ok = self._host_ok[dev] = bool(i.host_accessible)
        return ok

    def _wrap(self, name, h):
        dtype, shape, fname, nparts, host = self._static(h)
        nbytes = L.ferry_tensor_nbytes(h)
        ptr = L.ferry_tensor_data(h)
        writable = bool(_lib.HAS_WRITABLE and L.ferry_tensor_writable(h))
        hold = _array.Hold(self._n, h, ptr or 0, nbytes, writable)
        if host and ptr:
            return _array.view(hold, dtype, shape, fname, writable)
        if host and nbytes == 0:
            a = np.empty(shape, dtype).view(_array.Array)
            a._ferry_hold = hold
            return a
        parts = []
        for i in range(nparts):
            part = _lib.TensorPart()
            L.ferry_tensor_get_part(h, i, byref(part))
            parts.append((part.device, part.row0, part.n_rows, part.data, part.nbytes))
        return DeviceTensor(self, name, hold, dtype, shape, parts)

    def _prepare_arrays(self, names):
        hs, arr = self._handles(names)
        self._check(L.ferry_prepare(self._p(), arr, len(hs)))
        out = []
        try:
            for name, h in zip(names, hs):
                out.append(self._wrap(name, h))
        except BaseException:
            # holds made so far release themselves; the rest are released here
            rest = hs[len(out):]
            if rest:
                L.ferry_release(self._n.ptr, (c_void_p * len(rest))(*rest), len(rest))
            raise
        return out

    @contextlib.contextmanager
    def prepared(self, names):
        """``with m.prepared(names) as ts:`` prepares the tensors NAMES (a list, or one name) and
        yields them: numpy arrays (``ferry.Array``) over ferry's memory, zero-copy, in the order
        asked for (a ``Prepared`` sequence, indexable by position or name). Read-only unless
        the policy guarantees a private writable copy. At the end of the block the sequence is
        emptied and every tensor released, except that an array still referenced after the
        block (bound to a variable, a loop variable included) holds its own tensor prepared
        until that array dies: it never points at freed memory. Tensors on a device the CPU
        cannot read come as DeviceTensor. A name "NAME[FIRST:END]" names a slice: the rows
        [FIRST, END) of tensor NAME's outermost dimension (one expert of a mixture-of-experts
        tensor), a unit of its own with its own copy (ferry_slice); so in every call that
        takes names."""
        names = [names] if isinstance(names, str) else list(names)
        arrays = self._prepare_arrays(names)
        ts = Prepared(names, arrays)
        try:
            yield ts
        finally:
            ts._release()
            del arrays

    def prepare(self, names):
        """Prepares NAMES and returns their arrays (as ``prepared``, without a block): each
        tensor is released when its array dies."""
        single = isinstance(names, str)
        out = self._prepare_arrays([names] if single else list(names))
        return out[0] if single else out

    def prefetch(self, names):
        """Asynchronous hint: starts bringing NAMES towards their compute devices."""
        hs, arr = self._handles([names] if isinstance(names, str) else list(names))
        self._check(L.ferry_prefetch(self._p(), arr, len(hs)))

    def prefetch_guess(self, names):
        """Asynchronous guess (ferry_prefetch_guess): as prefetch, for slices ("NAME[E:E+1]") that
        may not be used; loads only into free room or over slices the expert policy values less,
        and keeps the named slices until their layer's next prepare."""
        hs, arr = self._handles([names] if isinstance(names, str) else list(names))
        self._check(L.ferry_prefetch_guess(self._p(), arr, len(hs)))

    def load(self, group=None):
        """Loads every tensor of GROUP (None: all) to its home, and returns when all are there."""
        self._check(L.ferry_load_group(self._p(), _b(group)))

    def read_rows(self, name, rows):
        """A new (len(rows), row) array with rows ROWS of tensor NAME (the row view: all but the
        innermost dimension), read explicitly: meant for lazy tensors (embedding tables)."""
        h = self._handle(name)
        info = _lib.TensorInfo()
        L.ferry_tensor_get_info(h, byref(info))
        rows = np.ascontiguousarray(np.asarray(rows, dtype=np.int64).reshape(-1))
        if rows.size and rows.min() < 0:
            raise EINVAL("ferry: tensor '%s': negative row %d" % (name, rows.min()), -1)
        rows = rows.astype(np.uint64)
        dtype, shape = _dtypes.layout(info.dtype, (int(rows.size), info.row_elems))
        out = np.empty(shape, dtype=dtype)
        self._check(L.ferry_read_rows(self._p(), h,
                                      rows.ctypes.data_as(ctypes.POINTER(c_uint64)), rows.size,
                                      out.ctypes.data), name)
        return out

    def release_all(self):
        """Drops every reference of every tensor (arrays still alive become invalid: use it only
        when none is left)."""
        self._check(L.ferry_release_all(self._p()))

    def check_files(self):
        """Raises ECHANGED, naming the file and what changed, when a file the manager has open
        is no longer what was opened (an engine computing on zero-copy arrays calls it after
        the compute to know its inputs held); prepare does the same for its tensors' files."""
        self._check(L.ferry_check_files(self._p()))

    # ---- LoRA --------------------------------------------------------------------------------
    def add_lora(self, path, multiplier=1.0, base_prefix=None, target_prefix=None,
                 required=False):
        """Adds the LoRA adapter at PATH with MULTIPLIER and returns a ``Lora``; BASE_PREFIX
        limits it to base tensors starting with it, TARGET_PREFIX aims it at weights opened
        under that prefix, REQUIRED makes prepare fail where it cannot merge."""
        opt = _lib.LoraOptions(_b(base_prefix), _b(target_prefix), 1 if required else 0)
        i = c_int(-1)
        self._check(L.ferry_lora_add(self._p(), _b(str(path)), float(multiplier), byref(opt),
                                     byref(i)), str(path))
        return Lora(self, i.value)

    def clear_loras(self):
        """Removes every adapter."""
        self._check(L.ferry_lora_clear(self._p()))

    @property
    def lora_mode(self):
        """Not readable from the C API; set "merge" or "runtime"."""
        raise AttributeError("lora_mode is write-only")

    @lora_mode.setter
    def lora_mode(self, mode):
        modes = {"merge": 0, "runtime": 1}
        if mode not in modes:
            raise ValueError("ferry: lora mode %r is not 'merge' or 'runtime'" % (mode,))
        self._check(L.ferry_lora_set_mode(self._p(), modes[mode]))

    @property
    def lora_epoch(self):
        """The adapter epoch: bumped by every change of the set or of a multiplier."""
        return L.ferry_lora_epoch(self._p())

    # ---- plans, statistics, traces -----------------------------------------------------------
    def plan(self):
        """The dry run: a list of dicts (name, group, home, compute_device, lazy, zero_copy,
        home_bytes, compute_bytes), one per placed tensor (per part when split)."""
        return self._plan()[0]

    def plan_totals(self):
        """The dry run's byte totals: host_bytes, mapped_bytes, disk_bytes, device_bytes and
        staged_bytes (lists, one per device)."""
        return self._plan()[1]

    def _plan(self):
        out = ctypes.POINTER(_lib.Placement)()
        n = c_size_t()
        tot = _lib.PlanTotals()
        self._check(L.ferry_plan(self._p(), byref(out), byref(n), byref(tot)))
        try:
            rows = [{"name": _s(p.name), "group": _s(p.group),
                     "home": _HOME_NAMES.get(p.home, p.home), "compute_device": p.compute_device,
                     "lazy": bool(p.lazy), "zero_copy": bool(p.zero_copy),
                     "home_bytes": p.home_bytes, "compute_bytes": p.compute_bytes}
                    for p in (out[i] for i in range(n.value))]
        finally:
            _lib.libc_free(ctypes.cast(out, c_void_p))
        nd = L.ferry_device_count(self._p())
        return rows, {"host_bytes": tot.host_bytes, "mapped_bytes": tot.mapped_bytes,
                      "disk_bytes": tot.disk_bytes, "device_bytes": list(tot.device_bytes[:nd]),
                      "staged_bytes": list(tot.staged_bytes[:nd])}

    def stats(self):
        """A snapshot of the counters as a dict (ferry_stats; resident_bytes and peak_bytes are
        lists, one per device, 0 the host)."""
        s = _lib.Stats()
        self._check(L.ferry_get_stats(self._p(), byref(s)))
        nd = L.ferry_device_count(self._p())
        out = {k: getattr(s, k) for k, _ in _lib.Stats._fields_}
        out["resident_bytes"] = list(s.resident_bytes[:nd])
        out["peak_bytes"] = list(s.peak_bytes[:nd])
        return out

    def trace(self, path):
        """Starts a Chrome-trace timeline written to PATH by ``trace_stop()`` (or close). Returns
        a context manager that stops it: ``with m.trace("t.json"): ...``."""
        self._check(L.ferry_trace_start(self._p(), _b(str(path))), str(path))
        m = self

        class _Stop:
            def __enter__(self):
                return m

            def __exit__(self, *exc):
                m.trace_stop()
        return _Stop()

    def trace_stop(self):
        """Writes the trace file and stops recording."""
        self._check(L.ferry_trace_stop(self._p()))
