"""Decoding sample fields by extension: JSON, text, labels, arrays, images, user decoders."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from operator import is_not
from typing import Any

import numpy as np
import torch

from nodes.base import UPSTREAM, Node, NotReset, State
from nodes.errors import BadRecordError, ErrorPolicy, check_expanded_size
from nodes.media.audio import AUDIO_EXTENSIONS, decode_audio
from nodes.media.gzipped import Gunzipped
from nodes.media.intra_op import one_thread
from nodes.media.jpeg import (
    PILLOW_SCALES,
    PillowJpeg,
    RegionJpeg,
    SimpleJpeg,
    check_backend,
    dct_scale,
    import_pillow,
    is_jpeg,
    jpeg_backend,
    pillow_open,
)
from nodes.state_checks import at, expect_int, expect_keys

Decoder = Callable[[bytes], Any]

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "ppm", "pgm", "tif", "tiff")
IMAGE_LAYOUTS = ("chw", "hwc", "pil")

_SKIP = object()


def decode_text(data: bytes) -> str:
    return data.decode("utf-8")


def decode_int(data: bytes) -> int:
    return int(data.decode("ascii").strip())


def decode_npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


def _check_zip_sizes(data: bytes, what: str) -> None:
    """Refuse a zip archive (npz, torch's pth) whose members, as its central directory
    declares them, expand past the record limit: before anything is decompressed."""
    with zipfile.ZipFile(io.BytesIO(data)) as members:
        check_expanded_size(sum(m.file_size for m in members.infolist()), what)


def decode_npz(data: bytes) -> dict[str, np.ndarray]:
    _check_zip_sizes(data, "the npz")
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return dict(archive)  # read every array now: the archive closes here


def decode_torch(data: bytes) -> Any:
    if zipfile.is_zipfile(io.BytesIO(data)):  # torch.save's format since 1.6
        _check_zip_sizes(data, "the pth")
    return torch.load(io.BytesIO(data), weights_only=True)


def image_decoder(
    layout: str = "chw",
    mode: str | None = "RGB",
    backend: str = "pillow",
    size: int | tuple[int, int] | None = None,
) -> Decoder:
    """A decoder from image bytes to a uint8 tensor (``"chw"``/``"hwc"``) or a PIL image.

    ``mode`` converts the image (``"RGB"``, ``"L"``, ...); ``None`` keeps the
    file's own mode. JPEGs go through ``backend`` (:mod:`nodes.media.jpeg`:
    ``"pillow"``, ``"simplejpeg"``, or ``"auto"``: simplejpeg when installed),
    other formats through Pillow. ``size`` (``(h, w)`` or an int for both)
    decodes JPEGs at the smallest DCT scale that keeps them at least that big
    (their pixels then differ from a full-size decode). Needs Pillow
    (``pip install pillow``).
    """
    return ImageDecoder(layout, mode, backend, size)


def image_size_hint(size: int | tuple[int, int] | None) -> tuple[int, int] | None:
    """``decode(image_size=...)`` as ``(height, width)``, or ``None``; ValueError if malformed."""
    if size is None:
        return None
    pair = (size, size) if isinstance(size, int) else tuple(size)
    if len(pair) != 2 or not all(type(n) is int and n >= 1 for n in pair):
        raise ValueError(
            f"image_size must be a positive int or a (height, width) pair of them, got {size!r}"
        )
    return pair  # type: ignore[return-value]


def image_tensor(array: np.ndarray, layout: str) -> torch.Tensor:
    """An ``(H, W, C)`` uint8 array as a tensor laid out ``"chw"`` (a copy) or ``"hwc"``."""
    tensor = torch.from_numpy(array)
    if layout != "chw":
        return tensor
    return one_thread(_to_chw, tensor)  # a per-item copy: see nodes.media.intra_op


def _to_chw(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.permute(2, 0, 1).contiguous()


class ImageDecoder:
    """Image bytes to a tensor or PIL image; JPEGs through a :mod:`nodes.media.jpeg` backend.

    The backend is made at the first JPEG, so samples without images never
    import an image library.
    """

    def __init__(
        self,
        layout: str = "chw",
        mode: str | None = "RGB",
        backend: str = "auto",
        size: int | tuple[int, int] | None = None,
    ) -> None:
        if layout not in IMAGE_LAYOUTS:
            raise ValueError(f"image must be one of {IMAGE_LAYOUTS} or None, got {layout!r}")
        self.layout, self.mode = layout, mode
        self.backend = check_backend(backend)
        self.size = image_size_hint(size)
        self._jpeg: PillowJpeg | SimpleJpeg | RegionJpeg | None = None

    def jpeg(self) -> PillowJpeg | SimpleJpeg | RegionJpeg:
        """The JPEG backend (made on first use)."""
        if self._jpeg is None:
            self._jpeg = jpeg_backend(self.backend)
        return self._jpeg

    def load(self) -> None:
        """Import the image libraries now: before a pool's threads decode, which would
        otherwise import them at once (a partly initialised module, Pillow's plugins)."""
        self.jpeg()
        import_pillow().init()  # every format plugin, which Pillow would import on demand

    def __call__(self, data: bytes) -> Any:
        if self.layout != "pil" and is_jpeg(data):
            jpeg = self.jpeg()
            eighths = 8
            if self.size is not None:
                eighths = dct_scale(*jpeg.size(data), *self.size, jpeg.scales)
            array, _ = jpeg.decode(data, self.mode, eighths)
            return image_tensor(array, self.layout)
        with pillow_open(data) as opened:
            if self.size is not None and opened.format == "JPEG":
                width, height = opened.size
                factor = 8 // dct_scale(height, width, *self.size, PILLOW_SCALES)
                opened.draft(None, (max(1, width // factor), max(1, height // factor)))
            mode = self.mode
            image = opened.convert(mode) if mode is not None and opened.mode != mode else opened
            image.load()
            if self.layout == "pil":
                return image.copy() if image is opened else image
            array = np.array(image)
        return image_tensor(array if array.ndim == 3 else array[:, :, None], self.layout)


def default_decoders(
    image: str | None = "chw",
    image_mode: str | None = "RGB",
    image_backend: str = "auto",
    image_size: int | tuple[int, int] | None = None,
) -> dict[str, Any]:
    """The built-in decoders by extension (``image=None`` leaves images as bytes)."""
    decoders: dict[str, Any] = {
        "json": json.loads,
        "jsn": json.loads,
        "txt": decode_text,
        "text": decode_text,
        "transcript": decode_text,
        "cls": decode_int,
        "cls2": decode_int,
        "index": decode_int,
        "inx": decode_int,
        "id": decode_int,
        "npy": decode_npy,
        "npz": decode_npz,
        "pth": decode_torch,
    }
    decoders.update(dict.fromkeys(AUDIO_EXTENSIONS, decode_audio))  # soundfile on first use
    if image is not None:
        decode_image = ImageDecoder(image, image_mode, image_backend, image_size)
        decoders.update(dict.fromkeys(IMAGE_EXTENSIONS, decode_image))
    elif image_size is not None or image_backend != "auto":
        raise ValueError("image_size and image_backend apply to decoded images: image is None")
    return decoders


class BadSample:
    """A sample that failed to decode under ``on_error="skip"``: the error, not yet counted.

    Made where the work runs (maybe a pool thread); counted where items come out
    in order (:class:`SettleBadSamples`), so the skip count matches the position.
    """

    __slots__ = ("error",)

    def __init__(self, error: BadRecordError) -> None:
        self.error = error


class SampleDecoder:
    """Decodes every field of a sample dict whose extension has a decoder.

    A field ``"seg.png"`` is looked up as ``"seg.png"`` first, then by its
    last extension ``"png"``. A field ``"json.gz"`` (or ``"gz"``) with no
    decoder of its own (nor one for ``"gz"``) is gunzipped and then decoded as
    ``"json"`` (left as bytes without one), as webdataset does. Fields
    starting with ``"__"`` (``__key__``, ``__url__``) and fields without a
    decoder are left as they are; a decoder mapped to ``None`` turns decoding
    of that extension off.
    """

    def __init__(self, decoders: Mapping[str, Decoder | None], errors: ErrorPolicy) -> None:
        self.decoders = dict(decoders)
        self.errors = errors
        self._lookup: dict[str, Decoder | None] = {}

    def decoder_for(self, field: str) -> Decoder | None:
        """The decoder of ``field`` (``None``: left as it is)."""
        found = self._lookup.get(field, _SKIP)
        if found is _SKIP:
            found = self.decoders.get(field, self.decoders.get(field.rsplit(".", 1)[-1]))
            gzipped = field == "gz" or field.endswith(".gz")
            if gzipped and field not in self.decoders and "gz" not in self.decoders:
                found = Gunzipped(self.decoder_for(field[:-3]) if field != "gz" else None)
            if field.startswith("__"):
                found = None
            self._lookup[field] = found
        return found  # type: ignore[return-value]

    def __call__(self, sample: Any) -> Any:
        out = self.decode_fields(sample)
        if type(out) is BadSample:
            self.errors.handle(out.error)
            return _SKIP
        return out

    def decode_fields(self, sample: Any) -> Any:
        """The decoded sample, or a :class:`BadSample` (not counted) under ``"skip"``."""
        if not isinstance(sample, dict):
            raise TypeError(
                f"decode() works on dict samples (from read_tar, read_bytes, ...), got "
                f"{type(sample).__name__}; use .map(fn) to decode other items"
            )
        out = dict(sample)
        for field, value in sample.items():
            decode = self.decoder_for(field)
            if not isinstance(value, bytes | bytearray | memoryview):
                if type(value) is not dict or value.keys() != _STORED_KEYS:
                    continue
                # A file stored in a column as Hugging Face datasets stores Image and Audio
                # features (read_parquet): {"bytes": ..., "path": ...}.
                decode, value = self.stored_decoder(field, value)
            if decode is None:
                continue
            try:
                out[field] = decode(value)
            except ImportError:
                raise  # a missing library is a setup error, not a bad record to skip
            except Exception as cause:  # noqa: BLE001 - any decoder failure is a bad record
                return self.bad_field(sample, field, cause)
        return out

    def stored_decoder(self, field: str, stored: dict[str, Any]) -> tuple[Decoder | None, Any]:
        """The decoder and bytes of a file stored as ``{"bytes": ..., "path": ...}`` in
        ``field`` (``None``: left as it is).

        The decoder is the field's own (``decoders={"image": fn}``), else the one
        of the path's extension (``"0001.png"``), else (no path, or an extension
        without a decoder) the one of the image or audio format its first bytes
        show (JPEG, PNG, GIF, WebP, BMP, TIFF, WAV, FLAC, Ogg). The field becomes
        the decoded value (the path is dropped, as ``datasets`` decodes it).
        """
        data = stored["bytes"]
        if field.startswith("__") or not isinstance(data, bytes | bytearray | memoryview):
            return None, data  # no bytes (a path to a file elsewhere): left as it is
        found = self.decoder_for(field)
        if found is not None:
            return found, data
        path = stored["path"]
        name = path.replace("\\", "/").rsplit("/", 1)[-1] if isinstance(path, str) else ""
        extension = name.split(".", 1)[1].lower() if "." in name.strip(".") else ""
        # The table's own decoders of extensions, whatever a subclass leaves out by field.
        found = SampleDecoder.decoder_for(self, extension) if extension else None
        if found is None:
            sniffed = sniff_extension(data)
            found = SampleDecoder.decoder_for(self, sniffed) if sniffed else None
        return found, data

    def bad_field(self, sample: dict[str, Any], field: str, cause: Exception) -> BadSample:
        """Raise the error for ``field`` of ``sample`` (``"raise"``), or return it as a
        :class:`BadSample` (``"skip"``)."""
        error = BadRecordError(
            str(sample.get("__url__", "<no __url__>")),
            f"sample {sample.get('__key__')!r}, field {field!r}",
            f"cannot decode: {type(cause).__name__}: {cause}",
        )
        if not self.errors.skip:
            raise error from cause
        return BadSample(error)


_STORED_KEYS = frozenset({"bytes", "path"})  # a file in a column, as HF datasets stores it

#: First bytes of the image and audio formats decode() knows, and their extensions.
_SIGNATURES = (
    (0, b"\xff\xd8\xff", "jpg"),
    (0, b"\x89PNG\r\n\x1a\n", "png"),
    (0, b"GIF87a", "gif"),
    (0, b"GIF89a", "gif"),
    (8, b"WEBP", "webp"),  # after b"RIFF" and a size
    (0, b"BM", "bmp"),
    (0, b"II*\x00", "tiff"),
    (0, b"MM\x00*", "tiff"),
    (8, b"WAVE", "wav"),
    (0, b"fLaC", "flac"),
    (0, b"OggS", "ogg"),
)


def sniff_extension(data: bytes | bytearray | memoryview) -> str | None:
    """The extension of the image or audio format ``data`` starts like, or ``None``."""
    head = bytes(data[:16])
    for offset, signature, extension in _SIGNATURES:
        if head[offset : offset + len(signature)] == signature:
            if offset == 8 and head[:4] != b"RIFF":
                continue
            return extension
    return None


class SettleBadSamples:
    """Counts (or raises) the :class:`BadSample` items a pool or fused step produced."""

    def __init__(self, errors: ErrorPolicy) -> None:
        self.errors = errors

    def __call__(self, item: Any) -> Any:
        if type(item) is BadSample:
            self.errors.handle(item.error)
            return _SKIP
        return item


class DecodeNode(Node):
    """Applies a :class:`SampleDecoder` to every sample; bad ones raise or are skipped.

    State: upstream's state and the number of samples skipped so far.
    """

    kind = "decode"
    elastic = "transparent"

    def __init__(self, upstream: Node, decoder: SampleDecoder | SettleBadSamples) -> None:
        super().__init__(upstream)
        self._up = upstream
        self._decoder = decoder
        self.errors = decoder.errors
        self._it: Iterator[Any] = NotReset(self)

    def reset(self, state: State | None = None) -> None:
        self._up.reset(None if state is None else state[UPSTREAM])
        self.errors.count = 0 if state is None else int(state["skipped"])
        decoded = map(self._decoder, iter(self._up))
        self._it = filter(partial(is_not, _SKIP), decoded) if self.errors.skip else decoded

    def __next__(self) -> Any:
        return next(self._it)

    def __iter__(self) -> Iterator[Any]:
        return self._it

    def state_dict(self) -> State:
        return {UPSTREAM: self._up.state_dict(), "skipped": self.errors.count}

    def validate_state(self, state: Any, path: str = "node") -> None:
        expect_keys(state, path, {UPSTREAM, "skipped"})
        expect_int(state, "skipped", path)
        self._up.validate_state(state[UPSTREAM], at(path, UPSTREAM))
