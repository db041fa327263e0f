"""Dynamic dispatch seen from the Loader: units claimed on demand, leases, takeovers.

- :mod:`~datapipes.dispatch.dynamic`: the store, the run's keys, each epoch's units;
- :mod:`~datapipes.dispatch.takeover`: a rank that ran out takes over its peers' stalled work.

May import: nodes, datapipes.pipe, datapipes.placement, datapipes.topology, datapipes.resume,
datapipes.loader.
"""
