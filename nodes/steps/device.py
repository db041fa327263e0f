"""Main-process steps that hand batches to the accelerator: pin_memory and to_device."""

from __future__ import annotations

from typing import Any

import torch

from nodes.base import Node, State
from nodes.media.device_jpeg import decode_encoded
from nodes.steps.transforms import MapNode
from nodes.tensor_tree import apply_to_tensors


def can_pin_memory() -> bool:
    """Whether page-locked memory is available (it needs an accelerator such as CUDA)."""
    return torch.cuda.is_available()


def _pin(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.is_pinned() else tensor.pin_memory()


def _pinned(item: Any) -> Any:
    return apply_to_tensors(item, _pin)


def _unchanged(item: Any) -> Any:
    return item


class PinMemoryNode(MapNode):
    """Copies the tensors of every item into page-locked memory, for fast host-to-device copies.

    Without an accelerator page-locked memory does not exist, and items pass
    through unchanged.
    """

    kind = "pin_memory"

    def __init__(self, upstream: Node) -> None:
        super().__init__(upstream, _pinned if can_pin_memory() else _unchanged)


class ToDeviceNode(MapNode):
    """Moves the tensors of every item to ``device``.

    On CUDA the copies are issued with ``non_blocking=True`` on a side stream,
    so the copy of the next batch overlaps the compute on the current one;
    the compute stream waits for the copy on the GPU (not on the CPU), the
    copied tensors are marked as used by the compute stream so their memory
    is not recycled early, and the source item is kept alive until its copy
    has finished. Copies from pinned memory are the ones that truly overlap:
    put ``pin_memory()`` before this step. The copy is ordered before the
    work of the thread that calls ``next``, so no step that moves work to
    another thread (``prefetch``) may come after it.

    ``device=None`` means the current CUDA device when CUDA is available and
    no copy at all otherwise. Any other device is a plain ``.to(device)``.
    """

    kind = "to_device"

    def __init__(self, upstream: Node, device: str | torch.device | None = None) -> None:
        self.device = resolve_device(device)
        #: where crops left encoded (random_resized_crop(on_device=True)) are decoded
        self._crops_on = torch.device("cpu") if self.device is None else self.device
        if self.device is None:
            move = self._decode_only
        elif self.device.type == "cuda":
            move = self._cuda_copy
        else:
            move = self._plain_move
        super().__init__(upstream, move)
        self._stream: Any = None
        self._in_flight: list[tuple[Any, Any]] = []

    def _plain_move(self, item: Any) -> Any:
        return apply_to_tensors(decode_encoded(item, self._crops_on), self._plain_copy)

    def _decode_only(self, item: Any) -> Any:
        return decode_encoded(item, self._crops_on)

    def reset(self, state: State | None = None) -> None:
        self._release_sources()
        super().reset(state)

    def _release_sources(self) -> None:
        for done, _ in self._in_flight:
            done.synchronize()
        self._in_flight = []

    def _plain_copy(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.device)

    def _cuda_copy(self, item: Any) -> Any:
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self.device)
        # Sources whose copy has finished may be freed now.
        self._in_flight = [entry for entry in self._in_flight if not entry[0].query()]
        # The side stream does not wait for the compute stream: the sources are host memory,
        # so the copy of this batch may run while the compute on the last one does.
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._stream):  # crops left encoded decode here too
            moved = apply_to_tensors(decode_encoded(item, self._crops_on), self._async_copy)
        done = torch.cuda.Event()
        done.record(self._stream)
        compute.wait_event(done)
        apply_to_tensors(moved, lambda t: _record_on(t, compute))
        self._in_flight.append((done, item))
        return moved

    def _async_copy(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.device, non_blocking=True)

    def close(self) -> None:
        self._release_sources()
        super().close()


def _record_on(tensor: torch.Tensor, stream: Any) -> torch.Tensor:
    tensor.record_stream(stream)
    return tensor


def resolve_device(device: str | torch.device | None) -> torch.device | None:
    """The device ``to_device`` copies to: ``None`` picks CUDA when present, else no copy.

    A named CUDA device on a machine without CUDA is an error that says so.
    """
    if device is None:
        return (
            torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        )
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"to_device({str(device)!r}): CUDA is not available on this machine; use "
            "to_device() to copy only when CUDA is present, or name another device"
        )
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device
