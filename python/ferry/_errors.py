"""ferry's error codes as Python exceptions: one FerryError subclass per FERRY_E... code, named
after it, carrying ferry's own message (file, tensor, expected, found)."""
from . import _lib

_CODES = [
    ("EINVAL", -1, ValueError), ("ENOMEM", -2, MemoryError), ("EIO", -3, None),
    ("ENOENT", -4, LookupError), ("EFORMAT", -5, None), ("ETRUNC", -6, None),
    ("EOVERFLOW", -7, None), ("ERANGE", -8, None), ("EOVERLAP", -9, None), ("EALIGN", -10, None),
    ("EDUP", -11, None), ("EDTYPE", -12, TypeError), ("ESHAPE", -13, ValueError),
    ("ELIMIT", -14, None), ("EJSON", -15, None), ("EPATH", -16, None), ("ETYPE", -17, TypeError),
    ("EBUDGET", -18, None), ("EBUSY", -19, None), ("EDEVICE", -20, None),
    ("ECANCELED", -21, None), ("EUNSUPPORTED", -22, None), ("ELORA", -23, None),
    ("EMISMATCH", -24, None), ("ECHANGED", -25, None),
]


class FerryError(Exception):
    """A failure reported by libferry. ``code`` is the negative FERRY_E... code, ``strerror``
    its short description, ``message`` ferry's detailed message (also ``str(error)``)."""

    code = 0

    def __init__(self, message, code=None):
        if code is not None:
            self.code = code
        self.message = message
        self.strerror = _lib.lib.ferry_strerror(self.code).decode()
        super().__init__(message)


FerryError.__module__ = "ferry"


#: code -> exception class
BY_CODE = {}
__all__ = ["FerryError"]
for _name, _code, _extra in _CODES:
    _bases = (FerryError,) + ((_extra,) if _extra else ())
    _doc = "FERRY_%s (%d): %s." % (_name, _code, _lib.lib.ferry_strerror(_code).decode())
    _cls = type(_name, _bases, {"code": _code, "__doc__": _doc, "__module__": "ferry"})
    globals()[_name] = _cls
    BY_CODE[_code] = _cls
    __all__.append(_name)


def error(code, message):
    """The exception for CODE with MESSAGE (ferry's own, or its strerror when empty)."""
    cls = BY_CODE.get(code, FerryError)
    if not message:
        message = _lib.lib.ferry_strerror(code).decode()
    return cls(message, code)
