"""Adapters: every use of another library's private names, in one place.

- :mod:`~nodes.adapters.torch`: torch, outside the DataLoader;
- :mod:`~nodes.adapters.torchdata`: torch's DataLoader and torchdata;
- :mod:`~nodes.adapters.third_party`: numpy and Hugging Face ``datasets``.

May import: nodes.errors, nodes.state_checks.
"""
