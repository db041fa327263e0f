"""Worker processes: a graph run in other processes, with their states and failures.

- :mod:`~nodes.workers.stream`: the node that reads a DataLoader's workers in order;
- :mod:`~nodes.workers.bundles`: several items per transfer;
  :mod:`~nodes.workers.handover`: how items cross to the main process;
- :mod:`~nodes.workers.states`: a workers' state checked; :mod:`~nodes.workers.replay`:
  the DataLoader's turn order replayed;
- :mod:`~nodes.workers.carry`: a worker's error carried to the parent;
  :mod:`~nodes.workers.parent_watch`: workers that stop when the parent dies.

May import: nodes.base, nodes.errors, nodes.origins, nodes.rng, nodes.state_checks,
nodes.tensor_tree, nodes.exit_close, nodes.credentials, nodes.steps, nodes.adapters.
"""
