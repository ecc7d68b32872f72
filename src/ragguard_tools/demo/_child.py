"""``python -m ragguard_tools.demo._child --seed N``: the demo's backends in their own process."""

import os

# gRPC's C core reads its log level once, when grpc is first imported (below): errors only,
# unless the user chose a level (as `ragguard demo` and `ragguard bench` do for themselves).
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from .backends import child_main

child_main()
