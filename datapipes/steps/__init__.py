"""The recipe's steps: what a user chains, each a frozen description that builds its node.

- :mod:`~datapipes.steps.sources`: ranges and random-access sequences;
- :mod:`~datapipes.steps.iterables`: sources from iterables, torch datasets, Hugging Face;
- :mod:`~datapipes.steps.files`: ``dp.files(...)`` and its ``read_*`` steps;
- :mod:`~datapipes.steps.transforms`: the chainable steps (map, filter, batch, shuffle, ...);
- :mod:`~datapipes.steps.decode`: ``decode``, dict samples' bytes fields decoded;
- :mod:`~datapipes.steps.combine`: concat, zip, mix;
- :mod:`~datapipes.steps.random_map`: random transforms that resume exactly;
  :mod:`~datapipes.steps.crops`: seeded random resized crops;
  :mod:`~datapipes.steps.text`: ``tokenize`` and ``pack``;
- :mod:`~datapipes.steps.custom`: a user's own node as a step.

May import: nodes, datapipes.pipe, datapipes.identity, datapipes.describe.
"""
