"""The recipe step for seeded random resized crops: ``pipe.random_resized_crop(224)``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from datapipes.pipe import DataPipe, _rebuild
from datapipes.steps.decode import Decode
from nodes import Context, Node
from nodes.media.crop_boxes import CropParams
from nodes.media.crops import FusedDecodeCrop, ResizedCrop, WithStream, capture_stream
from nodes.media.decode import DecodeNode, SampleDecoder, SettleBadSamples
from nodes.media.jpeg import check_nvimgcodec
from nodes.steps.parallel_map import ParallelMapNode
from nodes.steps.random_map import RandomMapNode

#: Options that change how the crops are made, not what is drawn: left out of the draws' key.
_HOW = ("fused", "num_threads", "on_device")
#: decode()'s arguments that change how images are decoded, not which crops are drawn.
_DECODE_HOW = {"image_backend"}


class RandomResizedCrop(DataPipe[Any]):
    """Random resized crops and flips of images, seeded per item like ``random_map``.

    See :meth:`DataPipe.random_resized_crop` and :mod:`nodes.media.crops`.
    """

    name = "random_resized_crop"
    consumer_length = DataPipe._upstream_length

    def __init__(
        self,
        upstream: DataPipe[Any],
        size: int,
        *,
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
        flip: float = 0.5,
        fields: str | Sequence[str] | None = None,
        seed: int | None = None,
        fused: bool = True,
        num_threads: int | None = None,
        on_device: bool = False,
    ) -> None:
        params = CropParams(size, _pair("scale", scale), _pair("ratio", ratio), float(flip))
        if isinstance(upstream, Decode) and "device" in upstream.kwargs:
            raise ValueError(
                "random_resized_crop after decode(device=...) would draw its crops in the main "
                "process, after the workers, where an item's place in the epoch is unknown: "
                "write decode().random_resized_crop(size, on_device=True).batch(n)"
                f".to_device({upstream.kwargs['device']!r}) (the boxes are drawn in the "
                "workers from the JPEG headers, the JPEGs decoded and cropped on the device)"
            )
        if on_device is not False:
            if on_device is not True:
                raise TypeError(
                    f"random_resized_crop on_device must be True or False, got {on_device!r}"
                )
            if not isinstance(upstream, Decode) or fused is False:
                raise ValueError(
                    "random_resized_crop(on_device=True) decodes the JPEGs itself, on the device "
                    "that to_device() moves to: put it right after decode(), with fused=True"
                )
            check_nvimgcodec()
        layout = upstream.kwargs.get("image", "chw") if isinstance(upstream, Decode) else "chw"
        if layout in ("hwc", "pil"):  # None: images stay bytes, or decoders of the user's
            raise ValueError(
                f"random_resized_crop works on (C, H, W) tensors, but the decode() before it "
                f"makes image={layout!r}: use decode() (image='chw', the default)"
            )
        kwargs: dict[str, Any] = {}
        if params.scale != (0.08, 1.0):
            kwargs["scale"] = params.scale
        if params.ratio != (3 / 4, 4 / 3):
            kwargs["ratio"] = params.ratio
        if params.flip != 0.5:
            kwargs["flip"] = params.flip
        if fields is not None:
            names = [fields] if isinstance(fields, str) else list(fields)
            if not names or not all(isinstance(n, str) and n for n in names):
                raise ValueError(f"random_resized_crop fields must be field names, got {fields!r}")
            kwargs["fields"] = fields if isinstance(fields, str) else tuple(names)
        if seed is not None:
            if type(seed) is not int:
                raise TypeError(f"random_resized_crop seed must be an int, got {seed!r}")
            kwargs["seed"] = seed
        if fused is not True:
            if fused is not False:
                raise TypeError(f"random_resized_crop fused must be True or False, got {fused!r}")
            kwargs["fused"] = False
        if num_threads is not None:
            if type(num_threads) is not int or num_threads < 1:
                raise ValueError(
                    f"random_resized_crop num_threads must be an int >= 1, got {num_threads!r}"
                )
            kwargs["num_threads"] = num_threads
        if on_device:
            kwargs["on_device"] = True
        super().__init__(upstream, args=(size,), **kwargs)

    @property
    def replays_input(self) -> bool:
        """On threads it resumes like a parallel map: by re-reading up to 64 input items."""
        return "num_threads" in self.kwargs

    def params(self) -> CropParams:
        kw = self.kwargs
        return CropParams(
            self.args[0],
            kw.get("scale", (0.08, 1.0)),
            kw.get("ratio", (3 / 4, 4 / 3)),
            kw.get("flip", 0.5),
        )

    def fuses(self) -> bool:
        """Whether it decodes the images itself: right after ``decode()``, ``fused=True``."""
        return self.kwargs.get("fused", True) and isinstance(self.inputs[0], Decode)

    def stats_label(self) -> str:
        """Fused, the row says it does the decode too: ``decode() + random_resized_crop(224)``."""
        own = self.describe_step()
        return f"{self.inputs[0].describe_step()} + {own}" if self.fuses() else own

    def draw_key(self) -> int:
        """The key of its draws: the step's place, whether or how it fuses or threads
        (and the decode backend below it) left out, so those give the same crops."""
        own = {k: v for k, v in self.kwargs.items() if k not in _HOW}
        below = self.inputs[0]
        if isinstance(below, Decode) and _DECODE_HOW & below.kwargs.keys():
            rest = {k: v for k, v in below.kwargs.items() if k not in _DECODE_HOW}
            below = _rebuild(Decode, {"inputs": below.inputs, "args": below.args, "kwargs": rest})
        twin = _rebuild(type(self), {"inputs": (below,), "args": self.args, "kwargs": own})
        return twin._key()

    def _build(self, ctx: Context) -> Node[Any]:
        params, fields = self.params(), self.kwargs.get("fields")
        seed, threads = self.kwargs.get("seed"), self.kwargs.get("num_threads")
        below = self.inputs[0]
        if self.fuses():
            assert isinstance(below, Decode)
            errors = below.error_policy()
            upstream = below.inputs[0].build(ctx)
            decoder = SampleDecoder(below.decoder_table(), errors)
            fn: Any = FusedDecodeCrop(decoder, params, fields, self.kwargs.get("on_device", False))
            if threads is not None:  # here, not at once in the pool's threads (a race)
                fn.load_backends()
        else:
            upstream = below.build(ctx)
            fn = ResizedCrop(params, fields)
        key = self.draw_key()
        if threads is None:
            node: Node[Any] = RandomMapNode(upstream, fn, ctx, key, seed=seed)
        else:  # the streams are keyed here, in order; the pool draws from copies of them
            keyed = RandomMapNode(upstream, capture_stream, ctx, key, seed=seed)
            node = ParallelMapNode(keyed, WithStream(fn), threads, method="thread")
        if self.fuses():  # bad samples are counted (or raised) here, in order
            node = DecodeNode(node, SettleBadSamples(errors))
        return node


def _pair(name: str, value: Sequence[float]) -> tuple[float, float]:
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(
            f"random_resized_crop {name} must be a (low, high) pair of numbers, got {value!r}"
        ) from None
    return low, high
