"""Dynamic dispatch seen from the Loader: units claimed on demand, leases, takeovers.

- :mod:`~datapipes.dispatch.dynamic`: the store, the run's keys, each epoch's units;
- :mod:`~datapipes.dispatch.takeover`: a rank that ran out takes over its peers' stalled work;
- :mod:`~datapipes.dispatch.owed`: what a taken-over rank owes, and the positions a takeover
  publishes, as Loader states.

May import: nodes, datapipes.pipe, datapipes.placement, datapipes.topology, datapipes.resume,
datapipes.loader.
"""
