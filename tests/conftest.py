"""Settings for the whole suite, applied before any test module imports grpc."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# gRPC's C core reads its log level once, at import: without this it logs connection teardown
# ("chttp2_transport.cc ... Got goaway") at INFO level amid the test output. No test reads those
# logs; a run that wants them sets GRPC_VERBOSITY (or GRPC_TRACE) itself.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

# imported after the variable is set: ragguard may import grpc
from ragguard import _default, _inject
from ragguard.events import bus


@pytest.fixture
def isolated_registry() -> Iterator[None]:
    """The default registry, the chaos hook and the event bus's listeners are restored as they were
    before the test. Folders whose tests build guards request it from an autouse fixture."""
    saved = _default.guard
    listeners, taps = list(bus._listeners), list(bus._taps)
    try:
        yield
    finally:
        _default.guard = saved
        _inject.uninstall()
        bus._listeners[:] = listeners
        bus._taps[:] = taps
        bus._refresh()  # ``active`` follows: a listener left by the test must not keep it True
