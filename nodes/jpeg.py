"""JPEG decoder backends: Pillow, or simplejpeg (libjpeg-turbo) when installed.

Both decode through libjpeg-turbo with the same settings (accurate integer
IDCT, fancy upsampling), so a full-scale decode gives the same pixels; the
simplejpeg backend only takes the files it decodes exactly like Pillow
(YCbCr at 4:4:4, 4:2:2 or 4:2:0 to RGB, grayscale to RGB or L) and hands
every other one (CMYK, YCCK, odd subsamplings, damaged files) to Pillow, so
the result, or the error, is Pillow's.

A *scale* is in eighths, as libjpeg's DCT scaling: ``4`` decodes at 4/8 of
the size (each side rounded up). Only 1/8, 2/8, 3/8, 4/8 and 8/8 are used:
measured on 500x375 q90 photos, 5/8 to 7/8 decode slower than full size
(their IDCTs are not the fast ones), and Pillow's ``draft`` knows only
powers of two.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

BACKENDS = ("auto", "pillow", "simplejpeg")
#: The DCT scales (in eighths) a reduced decode may use, smallest first.
SCALES = (1, 2, 3, 4, 8)
PILLOW_SCALES = (1, 2, 4, 8)
#: Modes the simplejpeg backend decodes itself (others go to Pillow).
_SIMPLEJPEG_MODES = {"RGB": "RGB", "L": "GRAY"}
#: (JPEG colour layout, subsampling: simplejpeg's header names, mode) that simplejpeg decodes
#: exactly like Pillow, tested. A colour JPEG to "L" is not one: Pillow converts the decoded
#: RGB (ITU-R 601-2 weights), libjpeg keeps the file's Y channel; they differ by rounding.
_SIMPLEJPEG_EXACT = {
    ("YCbCr", "444", "RGB"),
    ("YCbCr", "422", "RGB"),
    ("YCbCr", "420", "RGB"),
    ("Gray", "Gray", "RGB"),
    ("Gray", "Gray", "L"),
}


def is_jpeg(data: bytes | bytearray | memoryview) -> bool:
    """Whether ``data`` starts like a JPEG file (SOI marker), whatever its extension says."""
    return bytes(data[:3]) == b"\xff\xd8\xff"


def scaled_size(height: int, width: int, eighths: int) -> tuple[int, int]:
    """The size libjpeg decodes an image at ``eighths``/8 of its size (sides rounded up)."""
    return -(-height * eighths // 8), -(-width * eighths // 8)


def dct_scale(
    height: int, width: int, min_height: int, min_width: int, scales: tuple[int, ...] = SCALES
) -> int:
    """The smallest scale (in eighths) of ``scales`` at which the image is still at least
    ``min_height x min_width``; 8 (full size) when no smaller one is.

    >>> dct_scale(375, 500, 224, 224), dct_scale(375, 500, 100, 100), dct_scale(375, 500, 300, 1)
    (8, 3, 8)
    >>> dct_scale(375, 500, 187, 250)
    4
    """
    for eighths in sorted(scales):
        h, w = scaled_size(height, width, eighths)
        if h >= min_height and w >= min_width:
            return eighths
    return 8


def import_pillow() -> Any:
    """``PIL.Image`` (ImportError naming the extra without Pillow)."""
    try:
        from PIL import Image
    except ImportError as error:
        raise ImportError(
            "decoding images needs Pillow: pip install 'datapipes-torch[images]' (or pillow), "
            "or pass image=None to leave image fields as bytes"
        ) from error
    return Image


def pillow_open(data: bytes | bytearray | memoryview) -> Any:
    """A lazily decoded Pillow image of ``data`` (ImportError naming the extra without Pillow)."""
    return import_pillow().open(io.BytesIO(data))


class PillowJpeg:
    """JPEG through Pillow: ``Image.draft`` for reduced scales."""

    name = "pillow"
    scales = PILLOW_SCALES

    def size(self, data: bytes | bytearray | memoryview) -> tuple[int, int]:
        """``(height, width)`` from the header alone."""
        with pillow_open(data) as image:
            width, height = image.size
        return height, width

    def decode(
        self, data: bytes | bytearray | memoryview, mode: str | None, eighths: int = 8
    ) -> tuple[np.ndarray, int]:
        """An ``(H, W, C)`` uint8 array (C is 1 for ``"L"``) and its scale: ``eighths``
        rounded up to a scale Pillow has."""
        eighths = min(s for s in PILLOW_SCALES if s >= eighths)
        with pillow_open(data) as opened:
            if opened.format != "JPEG":
                eighths = 8  # draft scales JPEGs only
            elif eighths != 8:
                width, height = opened.size
                factor = 8 // eighths
                # draft picks the largest power of two <= min(W // w, H // h): exactly factor
                # (less for an image under factor pixels wide: the scale is read back).
                opened.draft(None, (max(1, width // factor), max(1, height // factor)))
                eighths = next(
                    e for e in PILLOW_SCALES if scaled_size(height, width, e)[::-1] == opened.size
                )
            image = opened.convert(mode) if mode is not None and opened.mode != mode else opened
            array = np.array(image)
        return (array if array.ndim == 3 else array[:, :, None]), eighths


class SimpleJpeg:
    """JPEG through simplejpeg (libjpeg-turbo, the GIL released while it decodes).

    Files it would not decode exactly like Pillow, and files it refuses
    (truncated, damaged), go to Pillow, so the pixels or the error are Pillow's.
    """

    name = "simplejpeg"
    scales = SCALES

    def __init__(self) -> None:
        self._sj = import_simplejpeg()
        self._pillow = PillowJpeg()

    def size(self, data: bytes | bytearray | memoryview) -> tuple[int, int]:
        """``(height, width)`` from the header alone (a few microseconds)."""
        try:
            height, width, _, _ = self._sj.decode_jpeg_header(data)
        except ValueError:
            return self._pillow.size(data)  # Pillow's reading, or its error
        return height, width

    def decode(
        self, data: bytes | bytearray | memoryview, mode: str | None, eighths: int = 8
    ) -> tuple[np.ndarray, int]:
        """An ``(H, W, C)`` uint8 array (C is 1 for ``"L"``) at ``eighths``/8 of the size, and
        that scale (Pillow's next larger one when the file went to Pillow)."""
        colorspace = _SIMPLEJPEG_MODES.get(mode)  # type: ignore[arg-type]
        if colorspace is None:
            return self._fallback(data, mode, eighths)
        sj = self._sj
        try:
            height, width, layout, subsampling = sj.decode_jpeg_header(data)
            if (layout, subsampling, mode) not in _SIMPLEJPEG_EXACT or _bomb(height, width):
                return self._fallback(data, mode, eighths)
            # Pillow's settings, said explicitly: accurate IDCT, fancy upsampling.
            exact = {"fastdct": False, "fastupsample": False}
            if eighths == 8:
                array = sj.decode_jpeg(data, colorspace, **exact)
            else:
                min_height, min_width = scaled_size(height, width, eighths)
                array = sj.decode_jpeg(
                    data, colorspace, min_height=min_height, min_width=min_width, **exact
                )
                if array.shape[:2] != (min_height, min_width):  # it chose another scale
                    return self._fallback(data, mode, eighths)
        except ValueError:  # truncated or damaged (strict): Pillow decides, and says why
            return self._fallback(data, mode, eighths)
        return (array if array.ndim == 3 else array[:, :, None]), eighths

    def _fallback(
        self, data: bytes | bytearray | memoryview, mode: str | None, eighths: int
    ) -> tuple[np.ndarray, int]:
        return self._pillow.decode(data, mode, eighths)


def _bomb(height: int, width: int) -> bool:
    """Whether Pillow would warn about or refuse an image this big (its decompression-bomb
    limit, ``PIL.Image.MAX_IMAGE_PIXELS``): such files go to Pillow, which does so."""
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    return limit is not None and height * width > limit


def import_simplejpeg() -> Any:
    try:
        import simplejpeg
    except ImportError as error:
        raise ImportError(
            "image_backend='simplejpeg' needs simplejpeg: pip install 'datapipes-torch[jpeg]' "
            "(or simplejpeg), or use image_backend='auto' (simplejpeg when installed, else "
            "Pillow) or 'pillow'"
        ) from error
    return simplejpeg


def check_backend(name: str) -> str:
    """``name`` if it is a backend name (ValueError otherwise); a missing library is not
    checked here, so recipes stay buildable where they are only described."""
    if name not in BACKENDS:
        raise ValueError(f"image_backend must be one of {BACKENDS}, got {name!r}")
    return name


def jpeg_backend(name: str = "auto") -> PillowJpeg | SimpleJpeg:
    """The backend called ``name``: ``"auto"`` is simplejpeg when importable, else Pillow."""
    check_backend(name)
    if name == "pillow":
        return PillowJpeg()
    if name == "simplejpeg":
        return SimpleJpeg()
    try:
        return SimpleJpeg()
    except ImportError:
        return PillowJpeg()
