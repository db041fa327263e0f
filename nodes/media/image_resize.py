"""Resizing a decoded crop to the output size on its device, flipped: the one resize every
crop path shares (the fused CPU decode, a user's decoded image, the GPU batch)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nodes.media.intra_op import one_thread

Box = tuple[int, int, int, int]  # top, left, height, width (full-resolution pixels)


def resize(image: torch.Tensor, size: int, flip: bool) -> torch.Tensor:
    """A uint8 ``(C, h, w)`` image (any strides) resized to ``(C, size, size)``, flipped."""
    return one_thread(_resize, image, size, flip)  # per-item work: see nodes.media.intra_op


def _resize(image: torch.Tensor, size: int, flip: bool) -> torch.Tensor:
    if image.shape[1] == image.shape[2] == size:
        out = image
    elif image.device.type == "cpu":
        out = F.interpolate(
            image[None], size=(size, size), mode="bilinear", antialias=True, align_corners=False
        )[0]
    else:  # on a GPU the antialiased resize takes floats: rounded back to uint8
        resized = F.interpolate(
            image[None].float(),
            size=(size, size),
            mode="bilinear",
            antialias=True,
            align_corners=False,
        )[0]
        out = resized.round_().clamp_(0, 255).to(torch.uint8)
    return (out.flip(-1) if flip else out).contiguous()


def crop_resize(image: torch.Tensor, box: Box, size: int, flip: bool) -> torch.Tensor:
    """``image[:, box]`` resized to ``size x size`` and flipped when ``flip``."""
    top, left, h, w = box
    return resize(image[:, top : top + h, left : left + w], size, flip)
