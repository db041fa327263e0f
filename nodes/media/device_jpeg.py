"""JPEG decode onto a device through nvImageCodec: ``decode(device="cuda")``.

On a CUDA device the JPEGs are decoded by nvImageCodec's GPU decoders
(nvJPEG: the hardware decoder where the GPU has one, else CUDA, else its
hybrid CPU + GPU path; ``pip install 'datapipes-torch[gpu]'`` adds the nvJPEG
library), on torch's current CUDA stream, into uint8 ``(3, H, W)`` tensors on
that device. :class:`EncodedCrop` and :func:`decode_crops` serve
``random_resized_crop(on_device=True)``: ``to_device()`` decodes a batch's
boxes in one call and resizes them on the device. On
``"cpu"`` the same code path runs through nvImageCodec's CPU decoder (Pillow's
pixels, tested), which is how the path is tested on a machine without a GPU.

nvJPEG's pixels need not be libjpeg's: its IDCT and chroma upsampling may
differ slightly (``benchmarks/gpu_check.sh`` reports how far on the machine it
runs on; not measured yet). A file the device decoder refuses (damaged, CMYK,
unusual layouts) is decoded by the CPU backends (:func:`nodes.media.jpeg.jpeg_backend`)
and copied to the device, so the pixels, or the error, are theirs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from nodes.media.image_resize import Box, resize
from nodes.media.jpeg import import_nvimgcodec, is_jpeg, jpeg_backend


def check_device(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device`` if JPEGs can be decoded onto it, else an error saying
    what to change (checked when the recipe is made: a CPU-only torch refuses ``"cuda"``)."""
    resolved = torch.device(device)
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(
            f"decode(device=...) decodes JPEGs on 'cuda' (nvJPEG) or 'cpu', got {str(device)!r}"
        )
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"decode(device={str(device)!r}) needs CUDA, but torch.cuda.is_available() is "
            "False here (a CPU build of torch, or no GPU): leave device out to decode on the "
            "CPU, and move batches with .to_device() after .batch()"
        )
    return resolved


class DeviceJpeg:
    """Decodes JPEGs (whole, or a box of each) into uint8 ``(3, H, W)`` tensors on a device.

    The nvImageCodec decoder is made on first use, in the process and thread
    that decodes (the main process: the step runs there).
    """

    def __init__(self, device: str | torch.device) -> None:
        self.device = check_device(device)
        self._nv = import_nvimgcodec()
        self._cpu = jpeg_backend("auto")
        self._decoder: Any = None

    def _make_decoder(self) -> Any:
        nv = self._nv
        if self.device.type == "cpu":
            return nv.Decoder(
                device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY,
                backends=[nv.Backend(nv.CPU_ONLY)],
                max_num_cpu_threads=1,
            )
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        gpu = [nv.Backend(nv.HW_GPU_ONLY), nv.Backend(nv.GPU_ONLY), nv.Backend(nv.HYBRID_CPU_GPU)]
        return nv.Decoder(device_id=index, backends=gpu)

    def decode(
        self,
        datas: Sequence[bytes | bytearray | memoryview],
        boxes: Sequence[Box | None] | None = None,
    ) -> list[torch.Tensor]:
        """uint8 ``(3, h, w)`` tensors on the device, one per JPEG: the whole image, or its box
        (``boxes[i]``, full-resolution pixels) where one is given. One batched call."""
        if boxes is None:
            boxes = [None] * len(datas)
        if self._decoder is None:
            self._decoder = self._make_decoder()
        nv = self._nv
        streams: list[Any] = []
        for data, box in zip(datas, boxes, strict=True):
            stream = None
            if is_jpeg(data):
                try:
                    stream = nv.CodeStream(data)
                    if box is not None:
                        top, left, h, w = box
                        region = nv.Region(top, left, top + h, left + w)
                        stream = stream.get_sub_code_stream(region=region)
                except RuntimeError:  # a header it cannot read: the CPU decoder decides
                    stream = None
            streams.append(stream)
        todo = [i for i, s in enumerate(streams) if s is not None]
        decoded: list[Any] = [None] * len(datas)
        if todo:
            if self.device.type == "cuda":
                with torch.cuda.device(self.device):
                    cuda_stream = torch.cuda.current_stream().cuda_stream
                    images = self._decoder.decode(
                        [streams[i] for i in todo], cuda_stream=cuda_stream
                    )
            else:
                images = self._decoder.decode([streams[i] for i in todo])
            for i, image in zip(todo, images, strict=True):
                decoded[i] = image
        return [
            self._tensor(image, data, box)
            for image, data, box in zip(decoded, datas, boxes, strict=True)
        ]

    def _tensor(self, image: Any, data: Any, box: Box | None) -> torch.Tensor:
        expected = None if box is None else (box[2], box[3])
        if image is not None:
            if self.device.type == "cuda":
                tensor = torch.as_tensor(image, device=self.device)  # __cuda_array_interface__
            else:
                tensor = torch.from_numpy(np.asarray(image.cpu()))
            shape = tuple(tensor.shape)
            ok = len(shape) == 3 and shape[2] == 3 and tensor.dtype == torch.uint8
            if ok and (expected is None or shape[:2] == expected):
                return tensor.permute(2, 0, 1)
        # refused (damaged, an odd layout, not a JPEG): the CPU decoders' pixels or error
        array, _ = self._cpu.decode(data, "RGB", 8)
        if box is not None:
            top, left, h, w = box
            array = array[top : top + h, left : left + w]
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device).permute(2, 0, 1)


class DeviceImageDecoder:
    """A ``decode()`` image decoder that puts images on ``device``: JPEGs through
    :class:`DeviceJpeg`, other formats decoded on the CPU (Pillow) and copied."""

    def __init__(self, device: str, cpu_decoder: Any) -> None:
        self.device = device
        self.cpu = cpu_decoder
        self._jpeg: DeviceJpeg | None = None

    def jpeg(self) -> DeviceJpeg:
        if self._jpeg is None:
            self._jpeg = DeviceJpeg(self.device)
        return self._jpeg

    def __call__(self, data: bytes) -> torch.Tensor:
        if is_jpeg(data):
            return self.jpeg().decode([data])[0]
        return self.cpu(data).to(self.device)


@dataclass(frozen=True)
class EncodedCrop:
    """A JPEG and the crop drawn for it (``random_resized_crop(on_device=True)``), to be
    decoded by ``to_device()``: its ``box`` (top, left, height, width; full-resolution
    pixels) resized to ``size x size``, flipped when ``flip``."""

    data: bytes
    box: Box
    flip: bool
    size: int
    name: str = ""  # the sample and field, for errors: "sample 's001', field 'jpg'"

    def __repr__(self) -> str:
        return (
            f"EncodedCrop({len(self.data)} JPEG bytes, box={self.box}, flip={self.flip}, "
            f"size={self.size}; .to_device() decodes it)"
        )


_DECODERS: dict[str, DeviceJpeg] = {}


def device_jpeg(device: torch.device) -> DeviceJpeg:
    """The process's :class:`DeviceJpeg` for ``device`` (made once)."""
    key = str(device)
    found = _DECODERS.get(key)
    if found is None:
        found = _DECODERS[key] = DeviceJpeg(device)
    return found


def decode_crops(items: Sequence[Any], device: torch.device) -> torch.Tensor:
    """A batch's crops as one uint8 ``(B, C, size, size)`` tensor on ``device``: the
    :class:`EncodedCrop` ones decoded in one call there (their boxes only), resized and
    flipped there; the tensors among them (other formats, cropped already) moved there."""
    encoded = [i for i, item in enumerate(items) if type(item) is EncodedCrop]
    jpeg = device_jpeg(device)
    try:
        regions = jpeg.decode([items[i].data for i in encoded], [items[i].box for i in encoded])
    except Exception as error:  # a file no decoder could read: which one, named
        bad = _first_undecodable(jpeg, [items[i] for i in encoded])
        raise ValueError(
            f"to_device() could not decode the JPEG of {bad.name or 'a sample'} (box {bad.box})"
            f": {type(error).__name__}: {error}; drop such files before training, or decode "
            "them on the CPU (random_resized_crop without on_device) with "
            "decode(on_error='skip')"
        ) from error
    out: list[Any] = [item.to(device) if isinstance(item, torch.Tensor) else item for item in items]
    for i, region in zip(encoded, regions, strict=True):
        crop = items[i]
        out[i] = resize(region, crop.size, crop.flip)
    for item in out:
        if not isinstance(item, torch.Tensor):
            raise TypeError(
                f"to_device() decodes lists of EncodedCrop (and tensors among them), got a "
                f"{type(item).__name__} in one"
            )
    return torch.stack(out)


def _first_undecodable(jpeg: DeviceJpeg, crops: list[EncodedCrop]) -> EncodedCrop:
    for crop in crops:
        try:
            jpeg.decode([crop.data], [crop.box])
        except Exception:  # noqa: BLE001 - the one that fails is the one to name
            return crop
    return crops[0]


def decode_encoded(item: Any, device: torch.device) -> Any:
    """``item`` with every :class:`EncodedCrop` in it (alone, or a batch's list of them)
    decoded on ``device``; the same object where it holds none."""
    kind = type(item)
    if kind is EncodedCrop:
        return decode_crops([item], device)[0]
    if kind is dict:
        changed = None
        for key, value in item.items():
            new = decode_encoded(value, device)
            if new is not value:
                changed = dict(item) if changed is None else changed
                changed[key] = new
        return item if changed is None else changed
    if kind is list or kind is tuple:
        if any(type(value) is EncodedCrop for value in item):
            return decode_crops(item, device)
        if item and isinstance(item[0], dict | list | tuple):
            new_items = [decode_encoded(value, device) for value in item]
            if any(new is not old for new, old in zip(new_items, item, strict=True)):
                return kind(new_items)
    return item
