"""Checkpoint files: a Loader state saved, found and read back.

- :mod:`~datapipes.checkpoint.saving`: ``save_checkpoint`` and ``load_checkpoint``, atomic files;
- :mod:`~datapipes.checkpoint.reading`: states found inside ``torch.save``, JSON files
  and DCP directories, read with ``weights_only``;
- :mod:`~datapipes.checkpoint.dcp`: a Loader state in ``torch.distributed.checkpoint``.

May import: nodes, datapipes.resume.
"""
