"""Make fake ``cuda:N`` tensors usable with autograd on a CPU-only build of torch.

``torch._subclasses.fake_tensor.FakeTensorMode`` creates tensors that report ``cuda:N`` and carry
no data. On a CPU build of torch (2.13) the forward works but autograd does not, for two reasons,
both fixed here while a simulation is active:

1. **No CUDA device guard.** Autograd records each tensor's stream through the device guard of its
   device type; with none registered the process aborts (``c10::Error`` thrown through a noexcept
   path). torch's own ``_ensureCUDADeviceGuardSet`` (called by FakeTensorMode) only *replaces* a
   registered guard that reports zero devices, and a CPU build has none registered, so it does
   nothing. We register a placeholder guard reporting zero devices and call it: torch then
   installs its ``FakeGuardImpl<CUDA>`` (8 devices, no-op streams and events). This one stays for
   the life of the process; it only makes fake CUDA streams exist.
2. **No accelerator.** ``at::getAccelerator()`` is empty on a CPU build, so the autograd engine
   finds no canonical stream for CUDA nodes and raises. While a simulation is active the CUDA hooks
   object reports ``isBuilt``/``hasCUDA``/``hasPrimaryContext`` true: its vtable pointer is pointed
   at a copy of its vtable with those three slots replaced (found by their symbol addresses), and
   pointed back when the last simulation exits. ``torch.cuda.is_available()`` stays False.

Backward must run in the calling thread (``torch.autograd.set_multithreading_enabled(False)``),
because the engine's per-device worker threads may have been sized before the guard existed;
:func:`autograd_context` does that. With a CUDA build of torch nothing is patched: FakeTensorMode
handles a GPU-less CUDA build itself.

The guard models at most 8 devices (``kFakeGuardImplMaxDevices``): a simulated node has at most
8 GPUs, and ranks map to ``cuda:(local_rank)``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator

import torch

from ds.interfaces.errors import AcceleratorError
from ds.sim._elf import symbols

MAX_DEVICES = 8

_VTABLE = "_ZTVN2at18CUDAHooksInterfaceE"
_IS_BUILT = "_ZNK2at25AcceleratorHooksInterface7isBuiltEv"
_HAS_CUDA = "_ZNK2at18CUDAHooksInterface7hasCUDAEv"
_HAS_PRIMARY_CONTEXT = "_ZNK2at18CUDAHooksInterface17hasPrimaryContextEa"
_GET_HOOKS = "_ZN2at6detail12getCUDAHooksEv"
_GUARD_REGISTRY = "_ZN3c104impl26device_guard_impl_registryE"
_ENSURE_GUARD = "_ZN3c104impl24ensureCUDADeviceGuardSetEv"
_CUDA_TYPE_INDEX = 1  # c10::DeviceType::CUDA

_BOOL0 = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p)
_BOOL1 = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_int8)
_INT8 = ctypes.CFUNCTYPE(ctypes.c_int8, ctypes.c_void_p)

_lock = threading.Lock()
_depth = 0
_patch: _HooksPatch | None = None
_guard_ready = False
_keep: list[object] = []  # ctypes objects the C++ side points at; never freed


def needs_patch() -> bool:
    """True on a CPU-only build of torch (no CUDA runtime compiled in)."""
    return not hasattr(torch._C, "_cuda_getDeviceCount")


def _lib(name: str) -> str:
    return os.path.join(os.path.dirname(torch.__file__), "lib", name)


def _unsupported(what: str) -> AcceleratorError:
    return AcceleratorError(
        f"the simulated GPU (DS_ACCELERATOR=simgpu) cannot run on this build of torch "
        f"{torch.__version__}: {what}. It needs a Linux CPU wheel of torch 2.13 (the dev "
        "environment's) or any CUDA build"
    )


def _ensure_guard() -> None:
    global _guard_ready
    if _guard_ready:
        return
    c10 = ctypes.CDLL(_lib("libc10.so"))
    try:
        registry = ctypes.c_void_p.in_dll(c10, _GUARD_REGISTRY)
        ensure = getattr(c10, _ENSURE_GUARD)
    except (AttributeError, ValueError) as exc:
        raise _unsupported(f"libc10 lacks {exc}") from None
    slot = ctypes.c_void_p.from_address(ctypes.addressof(registry) + 8 * _CUDA_TYPE_INDEX)
    if slot.value is None:
        # A stand-in "guard" whose every virtual returns 0: ensureCUDADeviceGuardSet reads its
        # deviceCount() (0) and swaps in torch's FakeGuardImpl<CUDA>.
        zero = _INT8(lambda this: 0)
        vtable = (ctypes.c_void_p * 64)(*([ctypes.cast(zero, ctypes.c_void_p).value] * 64))
        obj = (ctypes.c_void_p * 1)(ctypes.addressof(vtable))
        _keep.extend([zero, vtable, obj])
        slot.value = ctypes.addressof(obj)
        ensure()
        if slot.value == ctypes.addressof(obj):
            raise _unsupported("torch did not install its fake CUDA device guard")
    _guard_ready = True


class _HooksPatch:
    """The CUDA hooks object with three answers changed (see the module docstring, item 2)."""

    def __init__(self) -> None:
        path = _lib("libtorch_cpu.so")
        lib = ctypes.CDLL(path)
        found = symbols(path, [_VTABLE, _IS_BUILT, _HAS_CUDA, _HAS_PRIMARY_CONTEXT])
        missing = [
            n for n in (_VTABLE, _IS_BUILT, _HAS_CUDA, _HAS_PRIMARY_CONTEXT) if n not in found
        ]
        if missing:
            raise _unsupported(f"libtorch_cpu has no symbol {', '.join(missing)}")
        try:
            vtable_addr = ctypes.addressof(ctypes.c_void_p.in_dll(lib, _VTABLE))
            get_hooks = getattr(lib, _GET_HOOKS)
        except (AttributeError, ValueError) as exc:
            raise _unsupported(f"libtorch_cpu lacks {exc}") from None
        base = vtable_addr - found[_VTABLE][0]
        get_hooks.restype = ctypes.c_void_p
        hooks = get_hooks()
        self._vptr = ctypes.c_void_p.from_address(hooks)
        self._original = self._vptr.value
        if self._original != vtable_addr + 16:
            raise _unsupported("a CUDA hooks implementation is registered (not a CPU build?)")
        slots = found[_VTABLE][1] // 8 - 2  # offset-to-top and RTTI come first
        entries = (ctypes.c_void_p * slots).from_address(vtable_addr + 16)
        copy = (ctypes.c_void_p * slots)(*entries)
        self._true0 = _BOOL0(lambda this: True)
        self._true1 = _BOOL1(lambda this, index: True)
        replace = {
            base + found[_IS_BUILT][0]: self._true0,
            base + found[_HAS_CUDA][0]: self._true0,
            base + found[_HAS_PRIMARY_CONTEXT][0]: self._true1,
        }
        hit = set()
        for i in range(slots):
            fn = replace.get(copy[i] or 0)
            if fn is not None:
                hit.add(copy[i])
                copy[i] = ctypes.cast(fn, ctypes.c_void_p).value
        if len(hit) != len(replace):
            raise _unsupported("the CUDA hooks vtable does not have the expected slots")
        self._copy = copy

    def install(self) -> None:
        self._vptr.value = ctypes.addressof(self._copy)

    def remove(self) -> None:
        self._vptr.value = self._original


@contextlib.contextmanager
def fake_cuda_runtime() -> Iterator[None]:
    """While inside (re-entrant, process-wide), fake cuda tensors work with autograd."""
    global _depth, _patch
    if not needs_patch():
        yield
        return
    with _lock:
        _ensure_guard()
        if _patch is None:
            _patch = _HooksPatch()
        if _depth == 0:
            _patch.install()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _patch.remove()


def _set_data_following_device(self: torch.Tensor, value: torch.Tensor) -> None:
    torch._C.TensorBase.data.__set__(self, value)  # type: ignore[attr-defined]
    device = getattr(value, "fake_device", None)
    if device is not None:
        self.fake_device = device  # type: ignore[attr-defined]


@contextlib.contextmanager
def data_follows_device() -> Iterator[None]:
    """``param.data = t`` moves a fake tensor to ``t``'s device, as it does a real one.

    A FakeTensor keeps the device it reports in a Python attribute that ``.data =`` leaves
    alone, so ``p.data = p.data.to("cuda:3")`` (how ZeRO-3 shards move) would leave ``p`` claiming
    its old device. While inside, FakeTensor's ``data`` setter also takes the new device."""
    from torch._subclasses.fake_tensor import FakeTensor

    base = torch._C.TensorBase.data  # type: ignore[attr-defined]
    previous = FakeTensor.__dict__.get("data")
    FakeTensor.data = property(base.__get__, _set_data_following_device)  # type: ignore[assignment,method-assign]
    try:
        yield
    finally:
        if previous is None:
            del FakeTensor.data
        else:
            FakeTensor.data = previous  # type: ignore[method-assign]


@contextlib.contextmanager
def autograd_context() -> Iterator[None]:
    """Backward in the calling thread (see the module docstring)."""
    with torch.autograd.set_multithreading_enabled(False):
        yield
