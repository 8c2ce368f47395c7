"""ferry.safe_open: safetensors' reading interface over ferry, for safetensors and GGUF files."""
import numpy as np

from . import _dtypes
from ._manager import Manager

_TORCH_VIEW = {np.dtype(np.uint16): "int16", np.dtype(np.uint32): "int32",
               np.dtype(np.uint64): "int64"}


def _torch():
    try:
        import torch
    except ImportError:
        raise ImportError("ferry.safe_open(framework='pt') needs torch (python3-torch)") from None
    return torch


class _Slice:
    """``get_slice(name)``: the tensor's shape and dtype without reading it, and ``[a:b]`` (and
    further indices) reading only the rows asked for along the first axis."""

    def __init__(self, f, name):
        self._f, self._name = f, name
        self._info = f._info(name)

    def get_shape(self):
        """The shape, outermost first (GGUF's reversed)."""
        return list(self._info["numpy_shape"])

    def get_dtype(self):
        """safetensors' name of the dtype ("F16", "BF16"); ferry's name for GGUF-only types."""
        return self._f._dtype_name(self._info["dtype"])

    def __getitem__(self, index):
        if not isinstance(index, tuple):
            index = (index,)
        shape = self._info["numpy_shape"]
        first, rest = (index[0], index[1:]) if index else (slice(None), ())
        if not shape or first is Ellipsis:
            return self._f._out(self._f._read(self._name)[index], self._name)
        if isinstance(first, (int, np.integer)):
            i = int(first) + (shape[0] if first < 0 else 0)
            if not 0 <= i < shape[0]:
                raise IndexError("ferry: index %d out of range for '%s' (first axis %d)"
                                 % (first, self._name, shape[0]))
            a = self._f._read_rows(self._name, i, i + 1)[0]
            return self._f._out(a[rest] if rest else a, self._name)
        elif isinstance(first, slice):
            start, stop, step = first.indices(shape[0])
            if step == 1:
                a = self._f._read_rows(self._name, start, max(start, stop))
            else:
                picks = list(range(start, stop, step))
                a = self._f._read_rows_list(self._name, picks)
        else:
            raise TypeError("ferry: get_slice takes ints and slices, not %r" % (first,))
        return self._f._out(a[(slice(None),) + rest] if rest else a, self._name)


class SafeOpen:
    """A model file opened by ``ferry.safe_open``: ``keys()``, ``metadata()``,
    ``get_tensor(name)``, ``get_slice(name)``. Use it as a context manager."""

    def __init__(self, path, framework="np", device="cpu", budget=None):
        if framework not in ("np", "numpy", "pt", "torch"):
            raise ValueError("ferry.safe_open: framework %r is not 'np' or 'pt'" % (framework,))
        self._pt = framework in ("pt", "torch")
        if not self._pt and device != "cpu":
            raise ValueError("ferry.safe_open: numpy arrays live on the cpu, not %r" % (device,))
        self._device = device
        self._torch = _torch() if self._pt else None
        self._m = Manager(host_budget=budget)
        try:
            self._m.open(path)
            # With a budget ferry reads each tensor into memory it holds under the budget (cached
            # while it fits, by the recorded order); without one the tensor is read out of the
            # file mapping.
            if budget:
                self._m.group("all", "*", home="disk", load="auto", lazy=False)
            else:
                self._m.group("all", "*", home="host", load="mmap", lazy=False)
            self._keys = self._m.keys()
            self._infos = {}
        except BaseException:
            self._m.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Closes the file."""
        self._m.close()

    def keys(self):
        """Every tensor's name, sorted (as safetensors lists them)."""
        return sorted(self._keys)

    def offset_keys(self):
        """Every tensor's name in the order of its data in the file."""
        return list(self._keys)

    def metadata(self):
        """The file's metadata: safetensors' ``__metadata__`` (str to str, None when absent);
        GGUF's key/values with their types."""
        md = self._m.metadata()
        return md if md else None

    def _info(self, name):
        i = self._infos.get(name)
        if i is None:
            i = self._infos[name] = self._m.info(name)
        return i

    @staticmethod
    def _dtype_name(name):
        st = {"f64": "F64", "f32": "F32", "f16": "F16", "bf16": "BF16", "i64": "I64",
              "i32": "I32", "i16": "I16", "i8": "I8", "u64": "U64", "u32": "U32", "u16": "U16",
              "u8": "U8", "bool": "BOOL", "f8_e4m3": "F8_E4M3", "f8_e5m2": "F8_E5M2",
              "f8_e8m0": "F8_E8M0", "c64": "C64"}
        return st.get(name, name)

    def _read(self, name):
        with self._m.prepared(name) as ts:
            return np.array(ts[0], copy=True)

    def _read_rows(self, name, start, stop):
        info = self._info(name)
        shape = info["numpy_shape"]
        if len(shape) == 1:
            return self._read(name)[start:stop]
        per = info["n_rows"] // shape[0] if shape[0] else 0
        rows = np.arange(start * per, stop * per, dtype=np.int64)
        a = self._m.read_rows(name, rows)
        dtype, full = _dtypes.layout(_dtypes.dtype_id(info["dtype"]), shape)
        return a.reshape((stop - start,) + full[1:])

    def _read_rows_list(self, name, picks):
        parts = [self._read_rows(name, p, p + 1) for p in picks]
        if not parts:
            return self._read_rows(name, 0, 0)
        return np.concatenate(parts)

    def _out(self, a, name):
        return self._to_torch(a, self._info(name)["dtype"]) if self._pt else a

    def get_tensor(self, name):
        """Tensor NAME as a new array (numpy, or torch with framework="pt") that owns its memory:
        its bytes are the file's. bf16 comes as uint16 in numpy and as torch.bfloat16 in torch;
        quantized GGUF types as raw uint8 rows (``ferry.dequantize`` reads them)."""
        return self._out(self._read(name), name)

    def _to_torch(self, a, dtype):
        torch = self._torch
        a = np.ascontiguousarray(a)
        if dtype == "bf16":
            t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        elif a.dtype in _TORCH_VIEW:
            raise TypeError("ferry.safe_open: torch has no %s" % a.dtype)
        else:
            t = torch.from_numpy(a)
        return t if self._device == "cpu" else t.to(self._device)

    def get_slice(self, name):
        """A lazy slice of tensor NAME: ``get_shape()``, ``get_dtype()``, and ``[a:b, ...]`` that
        reads only rows a..b of the first axis (``Manager.read_rows``)."""
        return _Slice(self, name)


def safe_open(path, framework="np", device="cpu", budget=None):
    """Opens the model at PATH (safetensors, GGUF, a sharded index) with safetensors'
    interface: ``with ferry.safe_open(path, framework="pt") as f: f.get_tensor(name)``.
    FRAMEWORK "np" gives numpy arrays, "pt" torch tensors (moved to DEVICE). BUDGET (bytes or
    "2GiB") streams through memory ferry holds under that host budget; without it tensors are
    copied out of the file mapping."""
    return SafeOpen(path, framework, device, budget)
