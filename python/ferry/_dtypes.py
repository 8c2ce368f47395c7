"""ferry dtypes and their numpy counterparts: every type numpy has keeps its numpy dtype; bf16
and the 1-byte float types come back as raw uint16/uint8 elements, block-quantized and packed
types as raw uint8 bytes of each row."""
import numpy as np

from . import _lib
from ._errors import error

L = _lib.lib
F32, F16, Q8_0, Q4_0, BF16 = 0, 1, 8, 2, 30
NONE = -1

_NUMPY = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32, 27: np.int64,
          28: np.float64, 64: np.bool_, 65: np.uint8, 66: np.uint16, 67: np.uint32,
          68: np.uint64, 75: np.complex64}


def dtype_id(dtype):
    """The ferry dtype for DTYPE: a name ("q8_0", "BF16"), a ferry dtype number, or a numpy
    dtype that ferry has ("float16")."""
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        if L.ferry_dtype_block_bytes(dtype) == 0:
            raise ValueError("ferry: %d is no dtype" % dtype)
        return dtype
    if isinstance(dtype, str):
        t = L.ferry_dtype_from_name(dtype.encode())
        if t != NONE:
            return t
    try:
        npd = np.dtype(dtype)
    except TypeError:
        raise ValueError("ferry: unknown dtype %r" % (dtype,)) from None
    for t, d in _NUMPY.items():
        if np.dtype(d) == npd:
            return t
    raise ValueError("ferry: unknown dtype %r" % (dtype,))


def dtype_name(t):
    """ferry's lower-case name of dtype number T."""
    return L.ferry_dtype_name(t).decode()


def nbytes(t, n):
    out = _lib.c_uint64()
    rc = L.ferry_dtype_nbytes(t, n, out)
    if rc:
        raise error(rc, "%d elements are no whole number of %s blocks" % (n, dtype_name(t)))
    return out.value


def layout(t, shape):
    """(numpy dtype, numpy shape) of a tensor of ferry dtype T and element shape SHAPE
    (outermost first), as ferry hands it out."""
    shape = tuple(int(s) for s in shape)
    if t in _NUMPY:
        return np.dtype(_NUMPY[t]), shape
    be, bb = L.ferry_dtype_block_elems(t), L.ferry_dtype_block_bytes(t)
    if be == 1 and bb in (1, 2):
        return np.dtype(np.uint8 if bb == 1 else np.uint16), shape
    row = shape[-1] if shape else 1
    return np.dtype(np.uint8), shape[:-1] + (nbytes(t, row),)


def numpy_shape(info):
    """A tensor's element shape outermost first (GGUF lists it innermost first)."""
    dims = [info.shape[i] for i in range(info.ndim)]
    return tuple(reversed(dims)) if info.format == 1 else tuple(dims)


def dequantize(array, dtype):
    """Converts ARRAY, raw elements of ferry dtype DTYPE as ferry hands them out (a uint16 view
    of bf16, uint8 rows of q8_0 blocks, ...), to a new float32 array, through
    ferry_dtype_convert. The last axis is read as whole rows of blocks: a raw (..., row_bytes)
    array becomes (..., row_elems); an array that is not whole rows comes back flat."""
    t = dtype_id(dtype)
    src = np.ascontiguousarray(array)
    be, bb = L.ferry_dtype_block_elems(t), L.ferry_dtype_block_bytes(t)
    total = src.nbytes
    if total % bb:
        raise ValueError("ferry.dequantize: %d bytes are no whole number of %s blocks (%d bytes)"
                         % (total, dtype_name(t), bb))
    n = total // bb * be
    out = np.empty(n, dtype=np.float32)
    rc = L.ferry_dtype_convert(t, src.ctypes.data, F32, out.ctypes.data, n)
    if rc:
        raise error(rc, "ferry.dequantize: cannot convert %s to f32" % dtype_name(t))
    if src.ndim >= 1 and src.shape[-1] and (src.shape[-1] * src.itemsize) % bb == 0:
        return out.reshape(src.shape[:-1] + (src.shape[-1] * src.itemsize // bb * be,))
    return out


def matvec(w, x, dtype=None):
    """y = W.x for a 2-D weight W as ferry hands it out (rows outermost; raw uint8 rows of
    blocks for quantized types, uint16 for bf16: give DTYPE, or let ``w.ferry_dtype`` say) and
    a float32 vector X of a row's elements, dequantizing on the fly (ferry_matvec). Returns a
    new float32 vector of W's rows."""
    t = dtype_id(dtype if dtype is not None else getattr(w, "ferry_dtype", None) or w.dtype)
    w = np.ascontiguousarray(w)
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    rows = w.shape[0] if w.ndim else 1
    cols = x.size
    if rows and nbytes(t, cols) * rows != w.nbytes:
        raise ValueError("ferry.matvec: %s weight of %d bytes is not %d rows of %d elements"
                         % (dtype_name(t), w.nbytes, rows, cols))
    y = np.empty(rows, dtype=np.float32)
    rc = L.ferry_matvec(t, w.ctypes.data, rows, cols, x.ctypes.data, y.ctypes.data)
    if rc:
        raise error(rc, "ferry.matvec: %s cannot be read as numbers" % dtype_name(t))
    return y
