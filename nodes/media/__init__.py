"""Images and audio: decoding, JPEG on CPU and GPU, crops, resizing.

- :mod:`~nodes.media.decode`: bytes to arrays by file type (a ``*.gz`` field through
  :mod:`~nodes.media.gzipped`, never past the record limit); :mod:`~nodes.media.jpeg`,
  :mod:`~nodes.media.device_jpeg`: JPEG on the CPU and on the GPU;
- :mod:`~nodes.media.crops`: random resized crops, alone or fused with decoding; their
  boxes, :mod:`~nodes.media.crop_boxes`; a JPEG's crop at a reduced scale or within its
  box, :mod:`~nodes.media.jpeg_crop`; :mod:`~nodes.media.image_resize`: resizing;
- :mod:`~nodes.media.intra_op`: small torch ops on one intra-op thread;
- :mod:`~nodes.media.audio`: audio files.

May import: nodes.base, nodes.errors, nodes.state_checks.
"""
