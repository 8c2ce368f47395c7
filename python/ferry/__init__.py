"""ferry: keeps a neural network's weights where they are cheapest to hold (the model file, host
RAM, accelerator memory) and moves them just in time, under memory budgets, with LoRA merged on
the way. This package is pure Python over libferry.so.0 (ctypes) and numpy.

- ``ferry.safe_open(path, framework="np"|"pt")``: safetensors' reading interface, for
  safetensors and GGUF files alike.
- ``ferry.Manager(...)``: the manager: groups and policies, budgets, ``prepared(names)`` blocks
  yielding zero-copy numpy arrays (DLPack-exportable), LoRA adapters, plans, statistics, traces.
- ``ferry.dequantize(array, dtype)``: raw bf16 / quantized elements to float32;
  ``ferry.matvec(w, x)``: the decode-shaped product of a weight with a vector.
- Errors raise ``ferry.FerryError`` subclasses named after ferry's codes (``ferry.ENOENT``, ...).

The library is found at $FERRY_LIBRARY, else beside this package, else on the system path.
"""
from . import _lib
from ._array import Array
from ._dtypes import dequantize, matvec
from ._errors import *  # noqa: F401,F403  (FerryError and one subclass per code)
from ._errors import FerryError, __all__ as _error_names
from ._manager import DeviceTensor, Lora, Manager, Prepared, guard_sigbus, parse_size
from ._safe_open import SafeOpen, safe_open

__version__ = "0.3.0"
#: The path of the libferry this package loaded.
library_path = _lib.path
#: The version of that library ("0.3.0").
library_version = _lib.version


def dtype_name(dtype):
    """ferry's name of a dtype given by number, name or numpy dtype ("bf16", "q8_0")."""
    from ._dtypes import dtype_id, dtype_name as _name
    return _name(dtype_id(dtype))


__all__ = ["Manager", "safe_open", "SafeOpen", "dequantize", "matvec", "Array", "Prepared", "Lora",
           "DeviceTensor", "parse_size", "guard_sigbus", "dtype_name", "library_path", "library_version",
           "__version__"] + list(_error_names)
