"""What a run reports: per-step statistics, traces, and their figures.

- :mod:`~datapipes.observe.stats` and :mod:`~datapipes.observe.rank_stats`: statistics of
  one process and of every rank; :mod:`~datapipes.observe.stats_figure`: drawn;
- :mod:`~datapipes.observe.trace`: timelines in the Chrome trace format;
  :mod:`~datapipes.observe.trace_figure`: drawn.

May import: nodes.
"""
