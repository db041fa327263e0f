"""The decode step of a recipe: dict samples' bytes fields decoded by extension or field name.

``pipe.decode(...)`` checks its options when the recipe is built (image layout,
mode, size hint, backend, the user's decoders, ``on_error``, a device to
decode images on) and builds a :class:`nodes.media.decode.DecodeNode`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from datapipes.pipe import DataPipe
from nodes import Context, Node
from nodes.errors import ErrorPolicy, check_on_error
from nodes.media.decode import (
    IMAGE_EXTENSIONS,
    DecodeNode,
    SampleDecoder,
    default_decoders,
    image_size_hint,
)
from nodes.media.device_jpeg import DeviceImageDecoder, check_device
from nodes.media.jpeg import check_nvimgcodec, import_simplejpeg


class Decode(DataPipe[Any]):
    """Dict samples with their bytes fields decoded by extension."""

    name = "decode"

    def __init__(
        self,
        upstream: DataPipe[Any],
        *,
        image: str | None,
        image_mode: str | None,
        decoders: dict[str, Callable[[bytes], Any] | None] | None,
        on_error: str,
        image_size: int | tuple[int, int] | None = None,
        image_backend: str = "auto",
        device: str | torch.device | None = None,
    ) -> None:
        check_on_error(on_error)
        # Validates image, image_mode, image_size and image_backend now.
        default_decoders(image, image_mode, image_backend, image_size)
        if image_backend == "simplejpeg":
            import_simplejpeg()  # missing: an ImportError naming the extra, here
        elif image_backend == "nvimgcodec":
            check_nvimgcodec()
        kwargs: dict[str, Any] = {}
        if image != "chw":
            kwargs["image"] = image
        if image_mode != "RGB":
            kwargs["image_mode"] = image_mode
        if image_size is not None:
            kwargs["image_size"] = image_size_hint(image_size)
        if image_backend != "auto":
            kwargs["image_backend"] = image_backend
        if decoders:
            for field, fn in decoders.items():
                if fn is not None and not callable(fn):
                    raise TypeError(
                        f"decode() takes functions as decoders, got {type(fn).__name__} "
                        f"for {field!r}"
                    )
            kwargs["decoders"] = dict(decoders)
        if on_error != "raise":
            kwargs["on_error"] = on_error
        if device is not None:
            if image != "chw":
                raise ValueError(
                    f"decode(device=...) puts (C, H, W) tensors on the device: image must be "
                    f"'chw' (the default), got {image!r}"
                )
            if image_size is not None:
                raise ValueError("decode(device=...) decodes at full size: leave image_size out")
            check_nvimgcodec()
            kwargs["device"] = str(check_device(device))
        super().__init__(upstream, **kwargs)

    @property
    def main_process_only(self) -> bool:  # type: ignore[override]
        """With a device, it runs in the main process (where the device is used)."""
        return "device" in self.kwargs

    def consumer_length(self, ctx: Context) -> int | None:
        return None if self.kwargs.get("on_error") == "skip" else self._upstream_length(ctx)

    def decoder_table(self) -> dict[str, Any]:
        """The decoders by extension or field name this step uses (built-ins and the user's)."""
        kw = self.kwargs
        decoders = default_decoders(
            kw.get("image", "chw"),
            kw.get("image_mode", "RGB"),
            kw.get("image_backend", "auto"),
            kw.get("image_size"),
        )
        device = kw.get("device")
        if device is not None:
            on_device = DeviceImageDecoder(device, decoders[IMAGE_EXTENSIONS[0]])
            decoders.update(dict.fromkeys(IMAGE_EXTENSIONS, on_device))
        decoders.update(kw.get("decoders", {}))
        return decoders

    def error_policy(self) -> ErrorPolicy:
        """A fresh policy for one build: ``on_error`` and this step's name in its warnings."""
        return ErrorPolicy(self.kwargs.get("on_error", "raise"), repr(self))

    def _build(self, ctx: Context) -> Node[Any]:
        decoder = SampleDecoder(self.decoder_table(), self.error_policy())
        return DecodeNode(self.inputs[0].build(ctx), decoder)
