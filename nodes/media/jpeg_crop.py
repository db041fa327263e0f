"""One JPEG's crop, decoded at the smallest DCT scale its box allows or only within its box.

A JPEG's size is read from its header, the box drawn (:mod:`nodes.media.crop_boxes`),
and the image decoded at the smallest DCT scale (:data:`nodes.media.jpeg.SCALES`) at
which the box still spans ``size`` pixels on both sides. At full scale the pixels are
the unfused path's exactly. At a reduced scale the box's edges fall between pixels, so
Pillow's resize, which takes a fractional box, cuts it (:func:`resize_scaled_box`): the
same part of the scene from a lower-resolution source, a mean difference of 2-4 (of 255)
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
from collections.abc import Sequence

import numpy as np
import torch

from nodes.media.decode import image_tensor
from nodes.media.image_resize import Box, crop_resize, resize
from nodes.media.jpeg import PillowJpeg, RegionJpeg, SimpleJpeg


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


def _scaled(edge: int, scale: float, limit: int) -> int:
    return min(limit, math.floor(edge * scale + 0.5))
