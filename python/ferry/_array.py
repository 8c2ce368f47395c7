"""Arrays over ferry's memory: an ndarray subclass that exports itself through DLPack without
numpy's help (numpy 1.24 refuses to export read-only arrays, and ferry's zero-copy memory is the
read-only file mapping), and the hold that keeps a prepared tensor's memory valid for as long as
any array over it lives."""
import ctypes
import threading
from ctypes import CFUNCTYPE, POINTER, Structure, c_int, c_int32, c_int64, c_uint8, c_uint16, \
    c_uint64, c_void_p

import numpy as np


class _DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class _DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class _DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", _DLDevice), ("ndim", c_int32),
                ("dtype", _DLDataType), ("shape", POINTER(c_int64)),
                ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


class _DLManagedTensor(Structure):
    pass


_DELETER = CFUNCTYPE(None, c_void_p)
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", c_void_p),
                             ("deleter", _DELETER)]

_KDL_CPU = 1
_DL_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
_CAPSULE_NAME = b"dltensor"

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [c_void_p, ctypes.c_char_p, c_void_p]
_api.PyCapsule_IsValid.restype = c_int
_api.PyCapsule_IsValid.argtypes = [c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = c_void_p
_api.PyCapsule_GetPointer.argtypes = [c_void_p, ctypes.c_char_p]

# DLManagedTensor address -> what it keeps alive (the struct, its shape and strides, the array).
_exported = {}
_exported_lock = threading.Lock()


def _delete(addr):
    with _exported_lock:
        _exported.pop(addr, None)


_deleter = _DELETER(_delete)


@CFUNCTYPE(None, c_void_p)
def _capsule_destructor(capsule):
    # A capsule still named "dltensor" was never consumed: its tensor is ours to delete.
    if _api.PyCapsule_IsValid(capsule, _CAPSULE_NAME):
        _delete(_api.PyCapsule_GetPointer(capsule, _CAPSULE_NAME))


def to_dlpack(arr):
    """A "dltensor" capsule sharing ARR's memory (host memory, device kDLCPU). ARR stays alive
    until the consumer calls the deleter (or the capsule dies unconsumed)."""
    kind = arr.dtype.kind
    if kind not in _DL_CODES or arr.dtype.byteorder == ">":
        raise BufferError("ferry: dtype %s has no DLPack type" % arr.dtype)
    item = arr.itemsize
    if any(s % item for s in arr.strides):
        raise BufferError("ferry: strides %s are no whole elements" % (arr.strides,))
    nd = arr.ndim
    mt = _DLManagedTensor()
    shape = (c_int64 * max(nd, 1))(*arr.shape)
    strides = (c_int64 * max(nd, 1))(*[s // item for s in arr.strides])
    mt.dl_tensor.data = arr.__array_interface__["data"][0]
    mt.dl_tensor.device = _DLDevice(_KDL_CPU, 0)
    mt.dl_tensor.ndim = nd
    mt.dl_tensor.dtype = _DLDataType(_DL_CODES[kind], item * 8, 1)
    mt.dl_tensor.shape = ctypes.cast(shape, POINTER(c_int64))
    mt.dl_tensor.strides = ctypes.cast(strides, POINTER(c_int64))
    mt.dl_tensor.byte_offset = 0
    mt.manager_ctx = None
    mt.deleter = _deleter
    addr = ctypes.addressof(mt)
    with _exported_lock:
        _exported[addr] = (mt, shape, strides, arr)
    return _api.PyCapsule_New(addr, _CAPSULE_NAME, ctypes.cast(_capsule_destructor, c_void_p))


class Array(np.ndarray):
    """A numpy array over memory ferry holds (a prepared tensor), or derived from one.

    It is an ordinary ndarray, read-only unless the tensor's policy guarantees a private
    writable copy, and it keeps that memory valid for as long as it (or any view of it) lives.
    ``__dlpack__`` / ``__dlpack_device__`` export it on the cpu device, read-only or not, so
    ``np.from_dlpack`` and ``torch.from_dlpack`` share its memory: a consumer must not write to
    an array that is read-only here (DLPack has no way to say so).

    ``ferry_dtype`` is ferry's name of the element type when it is not numpy's ("bf16", "q8_0").
    """

    def __array_finalize__(self, obj):
        fd = getattr(obj, "ferry_dtype", None)
        self.ferry_dtype = fd if fd and obj.dtype == self.dtype else None

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule sharing this array's memory (cpu device; STREAM must be None).
        COPY=True exports a copy; DL_DEVICE, when given, must be the cpu."""
        if stream is not None:
            raise BufferError("ferry: a cpu array takes no stream")
        if dl_device is not None and tuple(dl_device) != (_KDL_CPU, 0):
            raise BufferError("ferry: the array is on the cpu, not device %s" % (dl_device,))
        if copy:
            return to_dlpack(np.array(self, copy=True))
        return to_dlpack(self)

    def __dlpack_device__(self):
        """(kDLCPU, 0): the memory is host memory."""
        return (_KDL_CPU, 0)


class Hold:
    """One reference of a prepared tensor: released (ferry_release) when the last array over
    its memory dies, which in CPython is as soon as the last reference to it goes."""

    def __init__(self, manager, handle, ptr, nbytes, writable):
        self._manager = manager          # keeps the ferry handle alive while memory is held
        self._handle = handle
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "version": 3,
                                    "data": (ptr, not writable)}

    def __del__(self):
        m, self._manager = self._manager, None
        if m is not None:
            try:
                m.release_one(self._handle)
            except Exception:   # interpreter shutdown: the process frees everything anyway
                pass


def view(hold, dtype, shape, ferry_dtype, writable):
    """An Array of DTYPE and SHAPE over HOLD's memory."""
    raw = np.asarray(hold)
    a = raw.view(dtype).reshape(shape).view(Array)
    a.ferry_dtype = ferry_dtype
    if not writable:
        a.flags.writeable = False
    return a
