"""Observation at runtime: per-node counters and trace events.

- :mod:`~nodes.observe.stats`: counters a node keeps while it runs;
- :mod:`~nodes.observe.trace`: spans of the steps, for a trace and the torch profiler.

May import: nodes.base, nodes.errors, nodes.adapters.
"""
