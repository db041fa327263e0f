"""A Loader method carried out by one of its parts, with that part's signature and docstring."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class by_part:  # noqa: N801 - used like a decorator-made method
    """``stats = by_part("_reports", LoaderReports.stats)`` in a class body: ``obj.stats()``
    calls ``obj._reports.stats()``; ``help()`` and the docs show the part's docstring.

    >>> class Part:
    ...     def hello(self) -> str:
    ...         '''Says hello.'''
    ...         return "hello"
    >>> class Whole:
    ...     hello = by_part("_part", Part.hello)
    ...     def __init__(self) -> None:
    ...         self._part = Part()
    >>> Whole().hello(), Whole.hello.__doc__
    ('hello', 'Says hello.')
    """

    def __init__(self, part: str, method: Callable[..., Any]) -> None:
        self._part, self._name = part, method.__name__
        self.__doc__ = method.__doc__
        self.__wrapped__ = method
        self.__name__ = method.__name__

    def __get__(self, owner: Any, cls: type | None = None) -> Any:
        if owner is None:
            return self
        return getattr(getattr(owner, self._part), self._name)
