"""Settings for the whole suite, applied before any test module imports grpc."""

from __future__ import annotations

import os

# gRPC's C core reads its log level once, at import: without this it logs connection teardown
# ("chttp2_transport.cc ... Got goaway") at INFO level amid the test output. No test reads those
# logs; a run that wants them sets GRPC_VERBOSITY (or GRPC_TRACE) itself.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
