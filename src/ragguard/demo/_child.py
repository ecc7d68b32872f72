"""``python -m ragguard.demo._child --seed N``: the demo's backends in their own process."""

from .backends import child_main

child_main()
