"""Random resized crops (+ horizontal flip) of uint8 CHW images, alone or fused with decoding.

The functions a ``random_resized_crop`` step runs per item under a ``random_map``:
:class:`ResizedCrop` crops decoded images, :class:`FusedDecodeCrop` decodes a
sample with its image fields cropped as they are decoded (a JPEG at a reduced
DCT scale or within its box: :mod:`nodes.media.jpeg_crop`), and
:func:`capture_stream` with :class:`WithStream` make the same draws on a pool
thread. Each item's box and flip are drawn by :mod:`nodes.media.crop_boxes`.

The resize is torch's antialiased bilinear ``F.interpolate`` on uint8
(measured on a 306x306 crop to 224: 0.33 ms against Pillow's 1.0 ms, one
thread; the same pixels for CHW and channels-last inputs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from nodes.media.crop_boxes import CropParams, MixedSizesError, OneBox, draw_crop
from nodes.media.decode import (
    IMAGE_EXTENSIONS,
    BadSample,
    ImageDecoder,
    SampleDecoder,
)
from nodes.media.device_jpeg import EncodedCrop
from nodes.media.image_resize import Box, crop_resize
from nodes.media.jpeg import is_jpeg
from nodes.media.jpeg_crop import decode_jpeg_crop


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
