"""Random resized crops (+ horizontal flip) of uint8 CHW images, alone or fused with decoding.

The draws follow torchvision's ``RandomResizedCrop``: up to 10 tries of an
area fraction uniform in ``scale`` and an aspect ratio log-uniform in
``ratio``, the box placed uniformly; after 10 misses, the centre crop
clamped to ``ratio``. Every item draws the same 41 uniforms from its
``rng`` (4 per try, then the flip), so its box does not depend on how it is
decoded. The box is in full-resolution pixels.

The resize is torch's antialiased bilinear ``F.interpolate`` on uint8
(measured on a 306x306 crop to 224: 0.33 ms against Pillow's 1.0 ms, one
thread; the same pixels for CHW and channels-last inputs).

Fused with decoding (:class:`FusedDecodeCrop`), a JPEG's size is read from
its header, the box drawn, and the image decoded at the smallest DCT scale
(:data:`nodes.media.jpeg.SCALES`) at which the box still spans ``size`` pixels on
both sides. At full scale the pixels are the unfused path's exactly. At a
reduced scale the box's edges fall between pixels, so Pillow's resize, which
takes a fractional box, cuts it (:func:`resize_scaled_box`): the same part of
the scene from a lower-resolution source, a mean difference of 2-4 (of 255)
from the full-scale crop on noisy photos.

With a region decoder (:class:`nodes.media.jpeg.RegionJpeg`), each JPEG is either
decoded only within its box, at full scale (the unfused path's pixels
exactly), or whole at the reduced scale, whichever does less work for that
box (:func:`region_pays`). The choice depends on the image's size and the box
alone, so a seeded crop gives the same pixels at any number of workers and
after a resume.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from nodes.media.decode import (
    IMAGE_EXTENSIONS,
    BadSample,
    ImageDecoder,
    SampleDecoder,
    image_tensor,
)
from nodes.media.device_jpeg import EncodedCrop
from nodes.media.image_resize import Box, crop_resize, resize
from nodes.media.jpeg import PillowJpeg, RegionJpeg, SimpleJpeg, is_jpeg

TRIES = 10
DRAWS = 4 * TRIES + 1  # per item, whatever happens: 4 per try, then the flip


@dataclass(frozen=True)
class CropParams:
    """What a random resized crop draws and makes: ``size x size`` outputs."""

    size: int
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: float = 0.5

    def __post_init__(self) -> None:
        if type(self.size) is not int or self.size < 1:
            raise ValueError(f"random_resized_crop size must be a positive int, got {self.size!r}")
        for name, (lo, hi), low in (("scale", self.scale, 0.0), ("ratio", self.ratio, 0.0)):
            if not (low < lo <= hi) or not math.isfinite(hi):
                raise ValueError(
                    f"random_resized_crop {name} must be (low, high) with 0 < low <= high, "
                    f"got {(lo, hi)!r}"
                )
        if not 0.0 <= self.flip <= 1.0:
            raise ValueError(
                f"random_resized_crop flip is a probability in [0, 1], got {self.flip}"
            )


def draw_crop(
    rng: np.random.Generator, height: int, width: int, params: CropParams
) -> tuple[Box, bool]:
    """The box (full-resolution pixels) and the flip for an image ``height x width``."""
    u = rng.random(DRAWS).tolist()
    area = height * width
    scale_lo, scale_hi = params.scale
    log_lo, log_hi = math.log(params.ratio[0]), math.log(params.ratio[1])
    for i in range(0, 4 * TRIES, 4):
        target = area * (scale_lo + (scale_hi - scale_lo) * u[i])
        aspect = math.exp(log_lo + (log_hi - log_lo) * u[i + 1])
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(u[i + 2] * (height - h + 1))
            left = int(u[i + 3] * (width - w + 1))
            return (top, left, h, w), u[-1] < params.flip
    return centre_box(height, width, params.ratio), u[-1] < params.flip


def centre_box(height: int, width: int, ratio: tuple[float, float]) -> Box:
    """torchvision's fallback: the whole image, clamped to the aspect ``ratio``, centred."""
    aspect = width / height
    if aspect < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif aspect > ratio[1]:
        h, w = height, round(height * ratio[1])
    else:
        h, w = height, width
    return (height - h) // 2, (width - w) // 2, h, w


def check_image(value: Any, field: str | None) -> torch.Tensor:
    """``value`` if it is a uint8 CHW tensor, else a TypeError saying what to change."""
    where = "the item" if field is None else f"field {field!r}"
    if isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 3:
        if value.shape[0] > 4 and value.shape[2] in (1, 3, 4):
            raise TypeError(
                f"random_resized_crop works on (C, H, W) images, but {where} is shaped "
                f"{tuple(value.shape)}, which looks like (H, W, C): decode with "
                "decode(image='chw') (the default), or permute(2, 0, 1) it first"
            )
        return value
    shape = tuple(value.shape) if isinstance(value, torch.Tensor) else None
    raise TypeError(
        f"random_resized_crop works on uint8 (C, H, W) tensors, but {where} is "
        f"{type(value).__name__}{'' if shape is None else f' {value.dtype} {shape}'}: decode "
        "with decode(image='chw') (the default) before it, or name the image fields with "
        "fields=..."
    )


class FieldChoice:
    """Which fields of a dict sample are images to crop: ``None`` is every field whose last
    extension is an image's; a name or names pick those (each must be in every sample)."""

    def __init__(self, fields: str | Sequence[str] | None) -> None:
        self.names = (
            None if fields is None else ((fields,) if isinstance(fields, str) else tuple(fields))
        )

    def selects(self, field: str) -> bool:
        """Whether ``field`` is cropped (when a sample has it)."""
        if self.names is None:
            return not field.startswith("__") and is_image_field(field)
        return field in self.names

    def __call__(self, sample: dict[str, Any]) -> list[str]:
        if self.names is None:
            return [f for f in sample if not f.startswith("__") and is_image_field(f)]
        missing = [name for name in self.names if name not in sample]
        if missing:
            raise KeyError(
                f"random_resized_crop: sample {sample.get('__key__')!r} has no field "
                f"{missing[0]!r} (its fields: {sorted(sample)}); check fields=..."
            )
        return list(self.names)


def is_image_field(field: str) -> bool:
    return field.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS  # as decode() looks extensions up


class MixedSizesError(ValueError):
    """The image fields of one sample differ in size, so one box cannot crop them all."""


class OneBox:
    """A sample's box and flip: drawn at its first image, the same for its other images
    (which must be that size: a mask crops with its image)."""

    def __init__(self, rng: np.random.Generator, params: CropParams) -> None:
        self.rng, self.params = rng, params
        self.first: tuple[str, int, int] | None = None
        self.drawn: tuple[Box, bool] = ((0, 0, 0, 0), False)

    def __call__(self, field: str, height: int, width: int) -> tuple[Box, bool]:
        first = self.first
        if first is None:
            self.first = (field, height, width)
            self.drawn = draw_crop(self.rng, height, width, self.params)
        elif first[1:] != (height, width):
            raise MixedSizesError(
                f"random_resized_crop crops every image field of a sample with one box, but "
                f"field {field!r} is {height}x{width} and {first[0]!r} {first[1]}x{first[2]}; "
                "crop fields of different sizes in separate steps (fields=...)"
            )
        return self.drawn


class ResizedCrop:
    """``fn(item, rng)`` for ``random_map``: the crop of a tensor, or of a sample's images."""

    def __init__(self, params: CropParams, fields: str | Sequence[str] | None) -> None:
        self.params = params
        self.choose = FieldChoice(fields)

    def __call__(self, item: Any, rng: np.random.Generator) -> Any:
        params = self.params
        if not isinstance(item, dict):
            image = check_image(item, None)
            box, flip = draw_crop(rng, image.shape[1], image.shape[2], params)
            return crop_resize(image, box, params.size, flip)
        out = dict(item)
        box_for = OneBox(rng, params)
        for field in self.choose(item):
            image = check_image(item[field], field)
            box, flip = box_for(field, image.shape[1], image.shape[2])
            out[field] = crop_resize(image, box, params.size, flip)
        return out


class FusedDecodeCrop:
    """``fn(sample, rng)``: a ``decode()`` whose image fields are decoded already cropped.

    A cropped field whose decoder is a CHW :class:`nodes.media.decode.ImageDecoder`
    is decoded here: a JPEG through its backend at the smallest DCT scale the
    box allows, another format whole and then cropped; the other fields are
    decoded as ``decode()`` does. A field that fails to decode raises
    :class:`nodes.errors.BadRecordError` naming the sample and field, or
    (``on_error="skip"``) makes the sample a :class:`nodes.media.decode.BadSample`,
    counted where items come out in order.
    """

    def __init__(
        self,
        decoder: SampleDecoder,
        params: CropParams,
        fields: str | Sequence[str] | None,
        on_device: bool = False,
    ) -> None:
        self.params = params
        self.on_device = on_device  # JPEGs left encoded, with their box, for to_device()
        self.choose = FieldChoice(fields)
        self.full = decoder
        self.decoder = _LeaveFused(decoder.decoders, decoder.errors, self.fused_decoder)

    def load_backends(self) -> None:
        """Import the image libraries of its image decoders now, in the building thread,
        before a pool's threads run it (see :meth:`nodes.media.decode.ImageDecoder.load`)."""
        for decoder in self.full.decoders.values():
            if isinstance(decoder, ImageDecoder) and decoder.layout == "chw":
                decoder.load()

    def fused_decoder(self, field: str) -> ImageDecoder | None:
        """The image decoder this step runs for ``field`` itself, or ``None``."""
        found = self.full.decoder_for(field)
        if isinstance(found, ImageDecoder) and found.layout == "chw":
            return found if self.choose.selects(field) else None
        return None

    def __call__(self, sample: Any, rng: np.random.Generator) -> Any:
        out = self.decoder.decode_fields(sample)
        if type(out) is BadSample:
            return out
        box_for = OneBox(rng, self.params)
        size = self.params.size
        for field in self.choose(out):
            value = out[field]
            images = self.fused_decoder(field)
            if images is None or not isinstance(value, bytes | bytearray | memoryview):
                image = check_image(value, field)  # decoded by a decoder of the user's
                box, flip = box_for(field, image.shape[1], image.shape[2])
                out[field] = crop_resize(image, box, size, flip)
                continue
            try:
                whole = None
                if is_jpeg(value):
                    height, width = images.jpeg().size(value)  # the header alone
                else:  # another format: decoded whole to learn its size
                    whole = images(value)
                    height, width = whole.shape[1:]
                box, flip = box_for(field, height, width)
                if whole is None and self.on_device:
                    where = f"sample {sample.get('__key__')!r}, field {field!r}"
                    out[field] = EncodedCrop(bytes(value), box, flip, size, where)
                elif whole is None:
                    out[field] = self._decode_crop(images, value, box, flip, (height, width))
                else:
                    out[field] = crop_resize(whole, box, size, flip)
            except (ImportError, MixedSizesError):
                raise  # a missing library, a recipe that crops unlike images: not the record
            except Exception as cause:  # noqa: BLE001 - any decoder failure is a bad record
                return self.decoder.bad_field(sample, field, cause)
        return out

    def _decode_crop(
        self, images: ImageDecoder, data: Any, box: Box, flip: bool, shape: tuple[int, int]
    ) -> torch.Tensor:
        jpeg, size = images.jpeg(), self.params.size
        return decode_jpeg_crop(jpeg, images.mode, data, box, size, flip, shape)


def decode_jpeg_crop(
    jpeg: PillowJpeg | SimpleJpeg | RegionJpeg,
    mode: str | None,
    data: bytes | bytearray | memoryview,
    box: Box,
    size: int,
    flip: bool,
    shape: tuple[int, int] | None = None,
) -> torch.Tensor:
    """One JPEG's ``box`` (full-resolution pixels) resized to ``size x size``, flipped:
    decoded at the smallest DCT scale that keeps the box at least ``size`` pixels, or, with
    a region decoder, only within the box when that does less work (:func:`region_pays`),
    as the fused step does it (public so a benchmark can time exactly the library's work).
    ``shape`` is the image's ``(height, width)`` when known (read from the header if not).

    >>> import numpy as np, io
    >>> from PIL import Image
    >>> from nodes.media.jpeg import jpeg_backend
    >>> out = io.BytesIO(); Image.fromarray(np.zeros((60, 80, 3), np.uint8)).save(out, "JPEG")
    >>> box = (5, 10, 40, 50)  # top, left, height, width
    >>> decode_jpeg_crop(jpeg_backend("auto"), "RGB", out.getvalue(), box, 16, True).shape
    torch.Size([3, 16, 16])
    """
    top, left, h, w = box
    eighths = box_scale(h, w, size, jpeg.scales)
    if jpeg.region:
        height, width = jpeg.size(data) if shape is None else shape
        if region_pays(height, width, box, eighths):
            array = jpeg.decode_region(data, mode, box)  # type: ignore[union-attr]
            return resize(torch.from_numpy(array).permute(2, 0, 1), size, flip)
    array, eighths = jpeg.decode(data, mode, eighths)
    if eighths == 8:
        return crop_resize(image_tensor(array, "hwc").permute(2, 0, 1), box, size, flip)
    return resize_scaled_box(array, box, eighths / 8, size, flip)


def region_pays(height: int, width: int, box: Box, eighths: int) -> bool:
    """Whether decoding only ``box`` at full scale does less work than decoding the whole
    ``height x width`` image at ``eighths``/8, in pixels touched: the entropy decoding runs
    over every row down to the last one decoded either way; the region decode then
    transforms the box's rows (full width: libjpeg-turbo skips few columns, measured) and
    resizes the box, the scaled decode transforms the whole image and resizes the box, both
    at the scale.

    >>> region_pays(375, 500, (0, 0, 300, 300), 8)  # full scale anyway: the region is less
    True
    >>> region_pays(3000, 4000, (1000, 0, 2000, 2000), 1)  # 1/8 scale of a large photo
    False
    """
    top, _, h, w = box
    area = (eighths / 8) ** 2
    region = (top + h) * width + h * width + h * w
    scaled = height * width + area * (height * width + h * w)
    return region <= scaled  # at full scale the region is never more


def box_scale(height: int, width: int, size: int, scales: Sequence[int]) -> int:
    """The smallest scale (eighths) at which a ``height x width`` box still spans ``size``
    pixels on both sides; 8 when none smaller does."""
    short = min(height, width)
    return min((e for e in scales if short * e >= 8 * size), default=8)


def resize_scaled_box(
    array: np.ndarray, box: Box, scale: float, size: int, flip: bool
) -> torch.Tensor:
    """``box`` (full-resolution pixels) of an image decoded at ``scale``, resized.

    Pillow's resize takes the scaled box with its fractional edges, so the
    crop covers the same part of the scene as at full scale (rounding the
    edges to whole pixels of the smaller image moved them by up to half a
    reduced pixel: mean errors 2-4x larger, measured).
    """
    from PIL import Image

    top, left, h, w = box
    channels = array.shape[2]
    if channels not in (1, 3):  # RGBA, CMYK: Pillow would resample them unlike torch
        rows, cols = array.shape[:2]
        y0, x0 = _scaled(top, scale, rows), _scaled(left, scale, cols)
        y1, x1 = _scaled(top + h, scale, rows), _scaled(left + w, scale, cols)
        crop = torch.from_numpy(array[y0 : max(y1, y0 + 1), x0 : max(x1, x0 + 1)])
        return resize(crop.permute(2, 0, 1), size, flip)
    image = Image.fromarray(array[:, :, 0] if channels == 1 else array)
    edges = (left * scale, top * scale, (left + w) * scale, (top + h) * scale)
    out = image.resize((size, size), Image.Resampling.BILINEAR, box=edges)
    if flip:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    pixels = np.array(out)
    return image_tensor(pixels if pixels.ndim == 3 else pixels[:, :, None], "chw")


class _LeaveFused(SampleDecoder):
    """A sample decoder that leaves the fields a :class:`FusedDecodeCrop` decodes as bytes."""

    def __init__(
        self,
        decoders: dict[str, Any],
        errors: Any,
        fused: Callable[[str], ImageDecoder | None],
    ) -> None:
        super().__init__(decoders, errors)
        self.fused = fused

    def decoder_for(self, field: str) -> Any:
        return None if self.fused(field) is not None else super().decoder_for(field)


def _scaled(edge: int, scale: float, limit: int) -> int:
    return min(limit, math.floor(edge * scale + 0.5))


def capture_stream(item: Any, rng: np.random.Generator) -> tuple[Any, dict[str, Any]]:
    """``fn(item, rng)`` for ``random_map`` that hands on the item and its stream's state,
    so the draws can be made on a pool thread (:class:`WithStream`), the same ones."""
    return item, rng.bit_generator.state


class WithStream:
    """Runs ``fn(item, rng)`` on an ``(item, stream state)`` pair from :func:`capture_stream`."""

    def __init__(self, fn: Callable[[Any, np.random.Generator], Any]) -> None:
        self.fn = fn

    def __call__(self, pair: tuple[Any, dict[str, Any]]) -> Any:
        item, state = pair
        bg = np.random.Philox(key=0)  # a key: no OS entropy drawn for a state replaced next
        bg.state = state
        return self.fn(item, np.random.Generator(bg))
