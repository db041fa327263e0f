"""The Loader: a recipe run as an iterable that checkpoints, resumes and reports.

One class composed of parts, each built once from one frozen record of its options:

- :mod:`~datapipes.loader.loader`: the :class:`~datapipes.Loader` class itself, and
  :mod:`~datapipes.loader.parts`, its methods carried out by a part;
- :mod:`~datapipes.loader.options`: its arguments checked into that record;
- :mod:`~datapipes.loader.consumers`: this rank's consumers and what they read;
- :mod:`~datapipes.loader.graph`: the graph it runs, built once per need;
- :mod:`~datapipes.loader.checkpoints`: ``state_dict`` and ``load_state_dict``;
- :mod:`~datapipes.loader.reports`: statistics, skips, losses and drops of its epochs, with
  :mod:`~datapipes.loader.drops` and :mod:`~datapipes.loader.epoch_stats`;
- :mod:`~datapipes.loader.epochs`: which epoch runs next, and the position it resumes from;
- :mod:`~datapipes.loader.even_batches`, :mod:`~datapipes.loader.listings`,
  :mod:`~datapipes.loader.progress`: even ends across ranks, file listings taken once,
  the epoch clock and its progress bar.

May import: nodes, datapipes.pipe, datapipes.placement, datapipes.topology, datapipes.steps,
datapipes.resume, datapipes.workers, datapipes.dispatch, datapipes.observe.
"""
