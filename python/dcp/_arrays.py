"""numpy arrays and torch tensors in, numpy arrays out, without copies.

A CPU torch tensor becomes a numpy view of the same memory (``Tensor.numpy()``); a bf16 tensor,
which numpy cannot hold, becomes a uint16 view of its bits. The C++ side then checks dtypes,
ranks and contiguity and never casts.
"""
import numpy as np

try:
    import torch
except ImportError:  # torch is optional
    torch = None


def _is_tensor(x):
    return torch is not None and isinstance(x, torch.Tensor)


def as_kernel_array(x, name, widen_bf16=False):
    if _is_tensor(x):
        if x.device.type != "cpu":
            raise ValueError(f"{name} is on {x.device}; dcp's Python kernels run on the CPU")
        if x.requires_grad:
            x = x.detach()
        if x.dtype == torch.bfloat16:
            if widen_bf16:
                return x.float().numpy()
            return x.view(torch.int16).numpy().view(np.uint16)
        return x.numpy()
    if isinstance(x, np.ndarray):
        if widen_bf16 and x.dtype == np.uint16:
            raise ValueError(f"{name} must be float32 (a uint16 {name} is ambiguous: pass a torch "
                             "bf16 tensor to have it widened)")
        return x
    raise ValueError(f"{name} must be a numpy array or a torch tensor, got {type(x).__name__}")


def like_input(template, out):
    """`out` as a torch tensor sharing its memory when `template` is one, else as is."""
    if _is_tensor(template):
        return torch.from_numpy(out)
    return out
