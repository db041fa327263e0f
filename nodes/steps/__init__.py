"""Step nodes: the runtime of map, filter, batch, shuffle, shard, prefetch and friends.

One module per kind of step (transforms, batch, collate, shuffle, shard, repeat,
combine, parallel_map, prefetch, random_map, even, device, tokenize, pack); each
node keeps the node contract of :mod:`nodes.base`.

May import: nodes.base, nodes.context, nodes.errors, nodes.origins, nodes.rng, nodes.state_checks,
nodes.iterators, nodes.tensor_tree, nodes.rounds, nodes.exit_close, nodes.elastic,
nodes.media, nodes.workers.
"""
