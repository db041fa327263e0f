"""Tar files: samples grouped by key, read from any byte offset, damage reported.

- :mod:`~nodes.readers.tar.samples`: the tar reader node's format;
- :mod:`~nodes.readers.tar.header`: one header parsed and checked;
- :mod:`~nodes.readers.tar.walker`: members walked in order;
- :mod:`~nodes.readers.tar.cursor`: a resumable position inside a tar;
- :mod:`~nodes.readers.tar.damage`: what a damaged archive becomes.

May import: nodes.errors, nodes.state_checks, nodes.storage, nodes.readers.
"""
