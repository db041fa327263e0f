"""Natural-looking test images and JPEG encodings of them (every variant libjpeg reads).

The content is smooth noise at several scales plus hard edges (rectangles, lines),
so a 500x375 image at quality 90 compresses to about the size of a photo
(~100-150 KB), unlike flat gradients (tiny) or white noise (huge).
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np


def natural_image(height: int, width: int, seed: int = 0, channels: int = 3) -> np.ndarray:
    """An ``(H, W, channels)`` uint8 image (``(H, W)`` for ``channels=1``) that looks photo-like."""
    import torch

    rng = np.random.default_rng(seed)
    image = np.zeros((height, width, channels), np.float32)
    for cells, weight in ((4, 90.0), (16, 45.0), (64, 25.0), (160, 18.0)):
        coarse = torch.from_numpy(rng.normal(0.0, weight, (1, channels, cells, cells)))
        smooth = torch.nn.functional.interpolate(
            coarse.float(), size=(height, width), mode="bilinear", align_corners=True
        )
        image += smooth[0].permute(1, 2, 0).numpy()
    for _ in range(12):  # hard edges: filled rectangles of flat colour
        y, x = rng.integers(0, height), rng.integers(0, width)
        h, w = rng.integers(4, max(5, height // 3)), rng.integers(4, max(5, width // 3))
        image[y : y + h, x : x + w] = rng.normal(0.0, 80.0, channels)
    image += rng.normal(0.0, 18.0, image.shape)  # fine texture, as sensors and scenes have
    out = np.clip(image + 128.0, 0, 255).astype(np.uint8)
    return out[:, :, 0] if channels == 1 else out


def jpeg_bytes(array: np.ndarray, quality: int = 90, **options: Any) -> bytes:
    """``array`` encoded by Pillow: ``subsampling=0/1/2`` (4:4:4/4:2:2/4:2:0),
    ``progressive=True``, ``restart_marker_blocks=n``, ``mode="CMYK"`` and so on."""
    from PIL import Image

    mode = options.pop("mode", None)
    image = Image.fromarray(array)
    if mode is not None:
        image = image.convert(mode)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=quality, **options)
    return out.getvalue()


def png_bytes(array: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG")
    return out.getvalue()
