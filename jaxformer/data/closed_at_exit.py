"""Grain iterators closed when the interpreter exits.

Left to their ``__del__`` during interpreter teardown, Grain's prefetching iterators (threads or
worker processes) raise ("'NoneType' object has no attribute 'Empty'") or abort ("terminate called
without an active exception"); `ClosedAtExit` registers every iterator it hands out and closes
those still open at exit.
"""

from __future__ import annotations

import atexit
import weakref
from collections.abc import Callable

import grain

_OPEN_ITERATORS: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_open_iterators() -> None:
    """Stop the prefetch threads/processes of iterators still alive at exit. Left to their
    ``__del__`` during interpreter teardown, Grain's iterators raise ("'NoneType' object has no
    attribute 'Empty'", or an abort: "terminate called without an active exception")."""
    for iterator in list(_OPEN_ITERATORS):
        iterator.close()
        # Their __del__ closes them again during teardown, which Grain's prefetch iterators do
        # not survive (not idempotent once module globals are gone): make that a no-op for the
        # whole chain, which they hold as attributes (``_parents``, ``_prefetch_ds_iter`` …).
        chain, seen = [iterator], set()
        while chain:
            it = chain.pop()
            if id(it) in seen:
                continue
            seen.add(id(it))
            it.close = _already_closed
            for value in vars(it).values():
                values = value if isinstance(value, (tuple, list)) else (value,)
                chain.extend(v for v in values if isinstance(v, grain.DatasetIterator))


def _already_closed() -> None:
    """The ``close`` of an iterator closed at exit."""


class ClosedAtExit(grain.IterDataset):
    """``parent`` unchanged, except that its iterators are closed when the interpreter exits, and
    that closing one first calls ``on_close`` (e.g. to report what the pipeline counted)."""

    def __init__(self, parent: grain.IterDataset,
                 on_close: Callable[[], None] | None = None) -> None:
        super().__init__(parent)
        self.on_close = on_close

    def __iter__(self) -> grain.DatasetIterator:
        iterator = self._parent.__iter__()
        if self.on_close is not None:
            # A weak reference: one from the iterator to itself would leave it to the cycle
            # collector, which may run its __del__ (joining its prefetch thread) in that thread.
            ref, close, on_close = weakref.ref(iterator), type(iterator).close, self.on_close

            def close_and_report() -> None:
                on_close()
                if (it := ref()) is not None:
                    close(it)

            iterator.close = close_and_report
        _OPEN_ITERATORS.add(iterator)
        return iterator

    def __str__(self) -> str:
        return "ClosedAtExit"
