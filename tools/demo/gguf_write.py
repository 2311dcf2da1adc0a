"""A GGUF v3 writer for float32 tensors and the metadata types a model needs (after the format's
specification in ggml's docs/gguf.md). Quantized files are made from its output by
`strata quantize`."""
import struct

import numpy as np

ALIGNMENT = 32
U32, I32_, F32, BOOL, STRING, ARRAY = 4, 5, 6, 7, 8, 9
GGML_F32 = 0


def _string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


class I32(list):
    """A list of ints stored as an array of i32 (tokenizer.ggml.token_type)."""


def _value(v):
    """(type id, bytes) of a metadata value: bool, int (u32 when >= 0, else i32), float, str, or a
    non-empty list of one of those."""
    if isinstance(v, bool):
        return BOOL, struct.pack("<?", v)
    if isinstance(v, int):
        return (U32, struct.pack("<I", v)) if v >= 0 else (I32_, struct.pack("<i", v))
    if isinstance(v, float):
        return F32, struct.pack("<f", v)
    if isinstance(v, str):
        return STRING, _string(v)
    if isinstance(v, I32):
        return ARRAY, struct.pack("<IQ", I32_, len(v)) + b"".join(struct.pack("<i", x) for x in v)
    if isinstance(v, list) and v:
        types = {_value(x)[0] for x in v}
        if len(types) != 1:
            raise ValueError("gguf: an array's values must share one type")
        t = types.pop()
        return ARRAY, struct.pack("<IQ", t, len(v)) + b"".join(_value(x)[1] for x in v)
    raise ValueError(f"gguf: cannot store {type(v).__name__} {v!r}")


def write(path, metadata, tensors):
    """metadata: dict name -> value (in order); tensors: dict name -> float32 numpy array, whose
    GGUF dims are the array's shape reversed (ggml's ne[0] is the contiguous axis)."""
    header = bytearray(b"GGUF")
    header += struct.pack("<IQQ", 3, len(tensors), len(metadata))
    for k, v in metadata.items():
        t, b = _value(v)
        header += _string(k) + struct.pack("<I", t) + b
    offset = 0
    blobs = []
    for name, a in tensors.items():
        a = np.ascontiguousarray(a, dtype=np.float32)
        dims = list(reversed(a.shape))
        header += _string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        header += struct.pack("<IQ", GGML_F32, offset)
        blob = a.tobytes()
        pad = (-len(blob)) % ALIGNMENT
        blobs.append(blob + b"\0" * pad)
        offset += len(blob) + pad
    header += b"\0" * ((-len(header)) % ALIGNMENT)
    with open(path, "wb") as f:
        f.write(header)
        for blob in blobs:
            f.write(blob)
