"""JPEG decoder backends: Pillow, simplejpeg (libjpeg-turbo) when installed, and
nvImageCodec's CPU decoder for regions (:class:`RegionJpeg`) when installed too.

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

A *region* decode (:class:`RegionJpeg`, ``pip install 'datapipes-torch[jpeg-region]'``)
decodes only the rows and columns of a box, at full scale, through
nvImageCodec's CPU backend (libjpeg-turbo's cropped and skipped scanlines,
the GIL released): the rows below the box are never read, the rows above are
entropy-decoded only. Its pixels are Pillow's full decode cut to the box,
exactly (tested), for the same files simplejpeg decodes exactly; every other
file, and every file it refuses, is decoded whole by simplejpeg or Pillow and
cut, so the pixels, or the error, are theirs.
"""

from __future__ import annotations

import io
import os
import threading
from typing import Any

import numpy as np

BACKENDS = ("auto", "pillow", "simplejpeg", "nvimgcodec")
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
    region = False  # no decode_region: a crop is decoded whole (or scaled) and cut

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
    region = False

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


class RegionJpeg(SimpleJpeg):
    """simplejpeg, plus regions through nvImageCodec's CPU decoder (:meth:`decode_region`).

    The nvImageCodec decoder is made per thread and per process (a pool's
    threads and forked workers each make their own), CPU only: no CUDA needed.
    """

    name = "nvimgcodec"
    region = True

    def __init__(self) -> None:
        super().__init__()
        self._nv = import_nvimgcodec()
        self._local = threading.local()

    def decode_region(
        self, data: bytes | bytearray | memoryview, mode: str | None, box: tuple[int, int, int, int]
    ) -> np.ndarray:
        """The ``(h, w, C)`` uint8 pixels of ``box`` (top, left, height, width; full-scale
        pixels): Pillow's full decode cut to the box. Files outside the exact set, and files
        nvImageCodec refuses, are decoded whole (simplejpeg or Pillow) and cut."""
        top, left, h, w = box
        if mode == "RGB":
            array = self._region(data, top, left, h, w)
            if array is not None:
                return array
        whole, _ = self.decode(data, mode, 8)  # Pillow's pixels, or Pillow's error
        return whole[top : top + h, left : left + w]

    def _region(
        self, data: bytes | bytearray | memoryview, top: int, left: int, h: int, w: int
    ) -> np.ndarray | None:
        try:
            height, width, layout, subsampling = self._sj.decode_jpeg_header(data)
        except ValueError:
            return None
        if (layout, subsampling, "RGB") not in _SIMPLEJPEG_EXACT or _bomb(height, width):
            return None
        if not (0 <= top and 0 <= left and 0 < h and 0 < w):
            return None
        if top + h > height or left + w > width:
            return None
        nv = self._nv
        try:
            stream = nv.CodeStream(data).get_sub_code_stream(
                region=nv.Region(top, left, top + h, left + w)
            )
            image = self._decoder().decode(stream)
        except RuntimeError:  # a header it cannot read
            return None
        if image is None:  # truncated or damaged: the whole decode decides, and says why
            return None
        array = np.asarray(image.cpu())
        return array if array.shape == (h, w, 3) and array.dtype == np.uint8 else None

    def _decoder(self) -> Any:
        local, pid = self._local, os.getpid()
        if getattr(local, "pid", None) != pid:  # a new thread, or a forked worker
            nv = self._nv
            local.decoder = nv.Decoder(
                device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY,
                backends=[nv.Backend(nv.CPU_ONLY)],
                max_num_cpu_threads=1,
            )
            local.pid = pid
        return local.decoder


#: Lines nvImageCodec prints at import about its GPU codecs' libraries (nvJPEG, nvJPEG2000,
#: nvTIFF) when they are not installed: expected on a CPU machine, so not shown.
_NV_IMPORT_NOISE = ("nvjpeg", "nvtiff", "note: if using nvimagecodec")


_NO_NVIMGCODEC = (
    "image_backend='nvimgcodec' (region decode for random crops) needs nvImageCodec: "
    "pip install 'datapipes-torch[jpeg-region]' (or nvidia-nvimgcodec-cu12 and simplejpeg), "
    "or use image_backend='auto' (it decodes whole images without it)"
)


def check_nvimgcodec() -> None:
    """An ImportError naming the extra unless nvImageCodec and simplejpeg are installed
    (found, not imported: a recipe names its backend without loading it)."""
    import importlib.util

    import_simplejpeg()
    try:
        found = importlib.util.find_spec("nvidia.nvimgcodec") is not None
    except (ImportError, ValueError):  # no "nvidia" package, or one marked absent
        found = False
    if not found:
        raise ImportError(_NO_NVIMGCODEC)


def import_nvimgcodec() -> Any:
    """``nvidia.nvimgcodec`` (ImportError naming the extra without it; simplejpeg too, which
    decodes what is not a region). Its complaints about absent GPU codec libraries, printed
    while it imports, are left out; anything else it prints is shown."""
    import_simplejpeg()
    import sys

    loaded = sys.modules.get("nvidia.nvimgcodec")
    if loaded is not None:
        return loaded
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as captured:
            os.dup2(captured.fileno(), 2)
            try:
                import nvidia.nvimgcodec as nv
            except ImportError as error:
                raise ImportError(_NO_NVIMGCODEC) from error
            finally:
                os.dup2(saved, 2)
                captured.seek(0)
                said = captured.read().decode("utf-8", "replace").splitlines()
    finally:
        os.close(saved)
    kept = [line for line in said if not any(n in line.lower() for n in _NV_IMPORT_NOISE)]
    if kept:
        print("\n".join(kept), file=sys.stderr)
    return nv


def check_backend(name: str) -> str:
    """``name`` if it is a backend name (ValueError otherwise); a missing library is not
    checked here, so recipes stay buildable where they are only described."""
    if name not in BACKENDS:
        raise ValueError(f"image_backend must be one of {BACKENDS}, got {name!r}")
    return name


def jpeg_backend(name: str = "auto") -> PillowJpeg | SimpleJpeg | RegionJpeg:
    """The backend called ``name``: ``"auto"`` is nvImageCodec's region decoder with
    simplejpeg when both import, else simplejpeg when it imports, else Pillow."""
    check_backend(name)
    if name == "pillow":
        return PillowJpeg()
    if name == "simplejpeg":
        return SimpleJpeg()
    if name == "nvimgcodec":
        return RegionJpeg()
    for backend in (RegionJpeg, SimpleJpeg):
        try:
            return backend()
        except ImportError:
            continue
    return PillowJpeg()
