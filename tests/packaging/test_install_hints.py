"""Every hint to install an extra names ragguard's checkout, never the PyPI name ``ragguard``.

The name ``ragguard`` on PyPI belongs to another project: ``pip install 'ragguard[demo]'`` installs
someone else's package. A user reported following the demo's hint on a plain install.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ragguard._extras import install_hint

ROOT = Path(__file__).parents[2]
# pip install ragguard / 'ragguard[x]' / "ragguard[x]" / ragguard[x], but not '/path/to/ragguard[x]'
PYPI_NAME = re.compile(r"""pip install ['"]?ragguard\b""")


def _run_blocking(modules: tuple[str, ...], code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter where importing any of ``modules`` fails, as on a plain
    install without the extra."""
    block = "".join(f"sys.modules[{m!r}] = None\n" for m in modules)
    return subprocess.run(
        [sys.executable, "-c", f"import sys\n{block}{code}"], capture_output=True, text=True, timeout=60
    )


def test_the_hint_names_the_checkout() -> None:
    want = "pip install '/path/to/ragguard[demo]' (from a checkout: pip install '.[demo]')"
    assert install_hint("demo") == want


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", ["demo", "bench"])
def test_cli_without_the_demo_extra_points_at_the_checkout(command: str) -> None:
    done = _run_blocking(
        ("numpy",),
        f"import runpy\nsys.argv = ['ragguard', {command!r}, '--quick']\n"
        "runpy.run_module('ragguard_tools.cli', run_name='__main__')",
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert install_hint("demo") in done.stderr, done.stderr
    assert "numpy" in done.stderr  # what is missing
    assert not PYPI_NAME.search(done.stderr), done.stderr


@pytest.mark.timeout(60)
def test_ragguard_httpx_without_httpx_points_at_the_checkout() -> None:
    done = _run_blocking(("httpx",), "import ragguard.httpx")
    assert done.returncode == 1
    assert f"ragguard.httpx needs httpx: {install_hint('http')}" in done.stderr, done.stderr
    assert not PYPI_NAME.search(done.stderr), done.stderr


@pytest.mark.timeout(60)
def test_tracing_without_opentelemetry_points_at_the_checkout() -> None:
    done = _run_blocking(("opentelemetry",), "import ragguard.metrics\nragguard.metrics.enable_tracing()")
    assert done.returncode == 1
    assert install_hint("otel") in done.stderr, done.stderr
    assert not PYPI_NAME.search(done.stderr), done.stderr


def test_no_source_example_or_doc_says_pip_install_ragguard() -> None:
    files = [*(ROOT / "src").rglob("*.py"), *(ROOT / "examples").rglob("*.py"),
             *(ROOT / "docs").rglob("*.md")]  # fmt: skip
    offenders = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in files
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if PYPI_NAME.search(line)
    ]
    assert not offenders, "\n".join(offenders)
    assert "pip install '/path/to/ragguard[http]'" in (ROOT / "examples" / "fastapi_service.py").read_text()
