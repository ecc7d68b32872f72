"""How to install one of ragguard's optional extras: the one wording every install hint uses.

ragguard is installed from a checkout (or its git URL), not from PyPI: the name ``ragguard`` there
belongs to another project, so a hint naming the bare ``ragguard[demo]`` would install
someone else's package. Every hint (the CLI's, ``ragguard.httpx``'s, ``ragguard.metrics``',
the examples') comes from :func:`install_hint`.
"""

from __future__ import annotations

__all__ = ["install_hint"]


def install_hint(extra: str) -> str:
    """The command that installs ragguard's ``extra`` from a checkout, e.g. for ``"demo"``:
    ``pip install '/path/to/ragguard[demo]' (from a checkout: pip install '.[demo]')``."""
    return f"pip install '/path/to/ragguard[{extra}]' (from a checkout: pip install '.[{extra}]')"
