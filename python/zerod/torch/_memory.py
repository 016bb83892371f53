"""Torch tensors over memory the engine owns (no copy), and the dtype names both sides use.

Host memory becomes a tensor through torch.frombuffer over a ctypes array at the address; GPU
memory through __cuda_array_interface__, which every torch with CUDA accepts. 16-bit floats travel
as int16 and are viewed back, since neither path knows bfloat16. The tensor does not own the
memory; it holds `owner` (through the buffer object torch keeps alive), so the session whose
memory it is outlives every tensor over it. At stage 3 the values are the unit's only while it is
gathered.
"""

import ctypes

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


class _CudaMemory:
    def __init__(self, address, numel, typestr, owner):
        self.owner = owner
        self.__cuda_array_interface__ = {
            "shape": (numel,), "typestr": typestr, "data": (address, False), "version": 2,
            "strides": None,
        }


def tensor_at(address, numel, dtype_name, device, owner=None):
    """A 1-D tensor of `numel` elements of `dtype_name` at `address` on `device`, keeping
    `owner` alive as long as the memory is referenced."""
    dtype = DTYPES[dtype_name]
    if numel == 0:
        return torch.empty(0, dtype=dtype, device=device)
    if device.type == "cpu":
        raw = (ctypes.c_byte * (numel * ELEMENT_BYTES[dtype_name])).from_address(address)
        raw.owner = owner
        return torch.frombuffer(raw, dtype=dtype)
    typestr = "<f4" if dtype_name == "fp32" else "<i2"
    t = torch.as_tensor(_CudaMemory(address, numel, typestr, owner), device=device)
    return t if dtype_name == "fp32" else t.view(dtype)


def storage_key(t):
    """The address of t's storage: equal for a tensor and every view of it."""
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage().data_ptr()
    return t.storage().data_ptr()
