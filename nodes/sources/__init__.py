"""Source nodes: where items enter a graph and how they are dealt to consumers.

- :mod:`~nodes.sources.sequence`: random-access sources, with an optional global shuffle;
- :mod:`~nodes.sources.iterable`, :mod:`~nodes.sources.hf_iterable`: iterables and
  Hugging Face iterable datasets;
- :mod:`~nodes.sources.files`: file listings, dealt whole or split inside files;
  :mod:`~nodes.sources.getitems` and :mod:`~nodes.sources.batched_fetch`: ``__getitems__``;
- :mod:`~nodes.sources.worker_info`: what ``get_worker_info()`` says while a dataset starts.

May import: nodes.base, nodes.context, nodes.errors, nodes.origins, nodes.rng, nodes.state_checks,
nodes.iterators, nodes.steps, nodes.storage, nodes.elastic, nodes.adapters, nodes.observe.
"""
