"""A recipe run inside torch DataLoader worker processes.

- :mod:`~datapipes.workers.in_workers`: the ``in_workers`` step and its plan;
- :mod:`~datapipes.workers.torch_dataset`: the ``IterableDataset`` each worker runs;
- :mod:`~datapipes.workers.shipping`: the recipe pickled by value for the worker processes.

May import: nodes, datapipes.pipe, datapipes.placement, datapipes.topology, datapipes.resume,
datapipes.loader.options (the record of a Loader's options it reads, as a type only).
"""
