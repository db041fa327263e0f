"""A random resized crop's boxes: its parameters, each image's box and flip, one box per sample.

The draws follow torchvision's ``RandomResizedCrop``: up to 10 tries of an
area fraction uniform in ``scale`` and an aspect ratio log-uniform in
``ratio``, the box placed uniformly; after 10 misses, the centre crop
clamped to ``ratio``. Every item draws the same 41 uniforms from its
``rng`` (4 per try, then the flip), so its box does not depend on how it is
decoded. The box is in full-resolution pixels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nodes.media.image_resize import Box

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
