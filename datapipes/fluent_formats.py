"""The fluent steps that know a format: decode samples, crop images, tokenize and pack text.

:class:`datapipes.fluent.FluentSteps` inherits them; like the rest of the fluent API they
only build the step (:mod:`datapipes.steps.decode`, :mod:`datapipes.steps.crops`,
:mod:`datapipes.steps.text`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datapipes.pipe import DataPipe


class FormatSteps:
    """The step methods of :class:`datapipes.DataPipe` for text, samples and images."""

    # ----- text -------------------------------------------------------------------------------
    def tokenize(
        self,
        tokenizer: Any,
        field: str = "text",
        *,
        output: str = "input_ids",
        bos: int | None = None,
        eos: int | None = None,
        block: int = 128,
        name: str | None = None,
    ) -> DataPipe[Any]:
        """Add the token ids of every record's ``field`` (an int32 array, under ``output``).

        ``tokenizer``: a Hugging Face ``tokenizers.Tokenizer`` or ``transformers`` fast
        tokenizer (``block`` records encoded per call, on the tokenizer's threads), or a
        callable ``text -> token ids``. ``bos``/``eos``: ids put around every document.
        The tokenizer's identity (its whole definition; for a callable its name, or
        ``name``) is in the recipe's fingerprint: a checkpoint of another vocabulary is
        refused. A record that is a str becomes ``{output: ids}``; a ``field`` that is
        not a str raises ``TypeError``; an empty text gives no ids (only ``bos``/``eos``).

        >>> import datapipes as dp
        >>> pipe = dp.from_sequence(["ab", "c"]).tokenize(lambda text: [ord(c) for c in text])
        >>> [list(map(int, r["input_ids"])) for r in dp.Loader(pipe)]
        [[97, 98], [99]]
        """
        from datapipes.steps.text import Tokenize

        return Tokenize(
            self, tokenizer, field=field, output=output, bos=bos, eos=eos, block=block, name=name
        )

    def pack(
        self,
        seq_len: int,
        method: str = "concat",
        *,
        field: str = "input_ids",
        pad_id: int = 0,
        bins: int = 8,
        drop_last: bool = False,
    ) -> DataPipe[Any]:
        """Pack documents' token ids into sequences of ``seq_len`` tokens.

        ``method="concat"``: documents end to end, cut every ``seq_len`` tokens (a
        document may span sequences); ``"first_fit"``: documents kept whole in the first
        of ``bins`` open sequences with room, padded (a document longer than ``seq_len``
        gives its full chunks first). Each sequence is a dict of ``input_ids``,
        ``labels`` (``-100`` at padding and at each segment's first token),
        ``position_ids`` (restarting at every document's segment) and ``cu_seqlens``
        (segment bounds for variable-length attention; a batch's are concatenated).
        The state names positions in documents, never tokens; a resume on another
        topology delivers every token of the epoch once. See :mod:`nodes.steps.pack`.

        >>> import datapipes as dp
        >>> docs = dp.from_sequence([[1, 2, 3], [4, 5], [6]])
        >>> [s["input_ids"].tolist() for s in dp.Loader(docs.pack(4))]
        [[1, 2, 3, 4], [5, 6, 0, 0]]
        """
        from datapipes.steps.text import Pack

        return Pack(
            self, seq_len, method=method, field=field, pad_id=pad_id, bins=bins,
            drop_last=drop_last,
        )  # fmt: skip

    # ----- samples and images -------------------------------------------------------------
    def decode(
        self,
        *,
        image: str | None = "chw",
        image_mode: str | None = "RGB",
        decoders: dict[str, Callable[[bytes], Any] | None] | None = None,
        on_error: str = "raise",
        image_size: int | tuple[int, int] | None = None,
        image_backend: str = "auto",
        device: str | None = None,
    ) -> DataPipe[Any]:
        """Decode the bytes fields of dict samples by extension (``read_tar``, ``read_bytes``).

        Built in: ``json``, ``txt``/``text``/``transcript``,
        ``cls``/``index``/``inx``/``id`` (int), ``npy``, ``npz`` (a dict of
        arrays), ``pth`` (``weights_only``), images (``jpg``, ``png``,
        ``webp``, ... through Pillow) as uint8 tensors laid out ``"chw"``
        (default) or ``"hwc"``, or ``"pil"`` images (``image=None`` leaves
        images as bytes), and audio (``wav``, ``flac``, ``ogg``/``oga``,
        ``opus``, ``mp3``, ``aiff``/``aif``, ``au``, ``caf``, ``w64``,
        ``rf64`` through soundfile, ``pip install 'datapipes-torch[audio]'``)
        as a tuple ``(waveform, sample_rate)``: a float32 tensor shaped
        ``(channels, frames)`` and an int, as ``torchaudio.load`` returns.
        A field ``"json.gz"`` is gunzipped, then decoded as ``"json"``.
        ``decoders`` adds or overrides decoders by extension or full field
        name (``{"seg.png": my_fn, "txt": None}``; ``{"wav": None}`` leaves
        wav fields as bytes). A field that fails to decode raises an error
        naming the URL, key and field, or with ``on_error="skip"`` drops the
        sample and counts it; a missing library (Pillow, soundfile) raises
        ``ImportError`` naming it, also under ``"skip"``.

        JPEGs decode through ``image_backend``: ``"auto"`` (nvImageCodec's
        region decoder with simplejpeg when installed, ``pip install
        'datapipes-torch[jpeg-region]'``, else simplejpeg when installed,
        ``pip install 'datapipes-torch[jpeg]'``, else Pillow), ``"pillow"``,
        ``"simplejpeg"`` or ``"nvimgcodec"``; the pixels are Pillow's either
        way (files simplejpeg would decode differently, CMYK ones for
        example, go to Pillow). ``image_size=(h, w)`` (or an int for both) decodes JPEGs
        at the smallest DCT scale (1/8, 2/8, 3/8 with simplejpeg, 4/8 of each
        side, or full) that keeps them at least that big: faster when a later
        step resizes anyway, and the pixels then differ from a full-size
        decode's.
        A :meth:`random_resized_crop` right after ``decode()`` picks the scale
        per image from its crop box instead, and with the region decoder
        decodes only the box (full scale) where that does less work.

        ``device="cuda"`` decodes JPEGs on the GPU (nvImageCodec's nvJPEG
        decoders, ``pip install 'datapipes-torch[gpu]'``) into uint8
        ``(C, H, W)`` tensors there; the step then runs in the main process
        (the workers only read). For crops decoded on the GPU use
        ``decode().random_resized_crop(size, on_device=True)`` and
        ``to_device()`` instead (a crop after ``decode(device=...)`` is
        refused). nvJPEG's pixels may differ slightly from libjpeg's;
        ``device="cpu"`` runs the same path on nvImageCodec's CPU decoder
        (Pillow's pixels).

        >>> import datapipes as dp
        >>> sample = {"__key__": "a", "cls": b"3", "json": b'{"x": 1}'}
        >>> list(dp.Loader(dp.from_sequence([sample]).decode()))
        [{'__key__': 'a', 'cls': 3, 'json': {'x': 1}}]
        """
        from datapipes.steps.decode import Decode  # it imports this module

        return Decode(
            self,
            image=image,
            image_mode=image_mode,
            decoders=decoders,
            on_error=on_error,
            image_size=image_size,
            image_backend=image_backend,
            device=device,
        )

    def random_resized_crop(
        self,
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
    ) -> DataPipe[Any]:
        """Seeded random resized crops of images to ``size x size``, flipped with ``flip``.

        torchvision's ``RandomResizedCrop`` draws (an area fraction in ``scale``,
        a log-uniform aspect ratio in ``ratio``, 10 tries, then the centre crop)
        and a horizontal flip with probability ``flip``, on uint8 ``(C, H, W)``
        tensors, or on the image fields of dict samples (``fields=None``: every
        field with an image extension, one box for all of a sample's; a name or
        names pick fields). The output is uint8 ``(C, size, size)``, resized
        with torch's antialiased bilinear interpolation. The draws are seeded
        per item as in :meth:`random_map`: the same at any ``num_workers``,
        world size and after a resume, new every epoch; ``seed`` overrides the
        Loader's seed for this step.

        Right after :meth:`decode` it decodes the images itself (``fused=True``):
        a JPEG's size comes from its header, the box is drawn, and the image is
        decoded at the smallest DCT scale (1/8 to 4/8, or full) that keeps the
        box at least ``size`` pixels on each side. The boxes are the same as
        unfused; the pixels are identical when no reduction applies and
        slightly different (a lower-resolution source) when one does;
        ``fused=False`` decodes at full size first (the decode's
        ``image_size`` applies then; fused, the box sets the scale). ``num_threads=k`` decodes
        and crops on ``k`` threads (the decoders release the GIL), resuming
        like ``map(..., num_workers=k)``, with the same pixels.

        ``on_device=True`` (right after ``decode()``) leaves the decoding to
        :meth:`to_device`: the box is drawn from the JPEG's header where the
        step runs (a worker), the item carries the JPEG and its box
        (:class:`nodes.media.device_jpeg.EncodedCrop`), and ``to_device(device)``
        decodes a batch's boxes in one nvImageCodec call on the device
        (nvJPEG on CUDA, ``pip install 'datapipes-torch[gpu]'``; its CPU
        decoder on the CPU, Pillow's pixels), then resizes and flips there.
        Other image formats are cropped where the step runs, as without it.

        >>> import datapipes as dp, torch
        >>> images = [torch.zeros(3, 40, 60, dtype=torch.uint8)] * 2
        >>> [tuple(x.shape) for x in dp.Loader(dp.from_sequence(images).random_resized_crop(16))]
        [(3, 16, 16), (3, 16, 16)]
        """
        from datapipes.steps.crops import RandomResizedCrop  # it imports this module

        return RandomResizedCrop(
            self,
            size,
            scale=scale,
            ratio=ratio,
            flip=flip,
            fields=fields,
            seed=seed,
            fused=fused,
            num_threads=num_threads,
            on_device=on_device,
        )
