/*
 * errors.c — ferry_strerror and the version functions.
 */
#include "ferry.h"

const char *ferry_version(void) { return FERRY_VERSION_STRING; }

unsigned ferry_version_number(void) { return FERRY_VERSION_NUMBER; }

const char *ferry_strerror(int code)
{
    switch (code) {
    case FERRY_OK: return "success";
    case FERRY_EINVAL: return "invalid argument";
    case FERRY_ENOMEM: return "out of memory";
    case FERRY_EIO: return "input/output error";
    case FERRY_ENOENT: return "not found";
    case FERRY_EFORMAT: return "not a valid model file";
    case FERRY_ETRUNC: return "truncated file";
    case FERRY_EOVERFLOW: return "size overflows";
    case FERRY_ERANGE: return "data out of range";
    case FERRY_EOVERLAP: return "overlapping tensors";
    case FERRY_EALIGN: return "bad alignment";
    case FERRY_EDUP: return "duplicate name";
    case FERRY_EDTYPE: return "unknown or unsupported data type";
    case FERRY_ESHAPE: return "bad shape";
    case FERRY_ELIMIT: return "beyond limits";
    case FERRY_EJSON: return "malformed JSON";
    case FERRY_EPATH: return "path leaves its folder";
    case FERRY_ETYPE: return "wrong value type";
    case FERRY_EBUDGET: return "does not fit in the budget";
    case FERRY_EBUSY: return "in use";
    case FERRY_EDEVICE: return "device error";
    case FERRY_ECANCELED: return "cancelled";
    case FERRY_EUNSUPPORTED: return "not supported";
    case FERRY_ELORA: return "adapter does not fit";
    case FERRY_EMISMATCH: return "data mismatch";
    case FERRY_ECHANGED: return "the model file changed since it was opened";
    default: return "unknown error";
    }
}
