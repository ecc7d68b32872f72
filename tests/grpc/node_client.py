"""Run the @grpc/grpc-js client of tests/grpc/node/ from a test, without blocking the event loop.

Its npm dependencies are installed once per lock file into a cache directory (``npm ci``), never
into the source tree. Tests that use it skip, saying why, when ``node`` or ``npm`` is missing.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

NODE_DIR = Path(__file__).parent / "node"


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ragguard-tests"


def install_node_client() -> Path:
    """The directory holding client.js with its node_modules; installs them on first use."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("the Node gRPC client needs `node` and `npm` on PATH (Node 18 or newer)")
    lock = (NODE_DIR / "package-lock.json").read_bytes()
    digest = hashlib.sha256(lock + (NODE_DIR / "package.json").read_bytes()).hexdigest()[:16]
    target = _cache_root() / f"grpc-js-{digest}"
    if not (target / "node_modules" / "@grpc" / "grpc-js").is_dir():
        staging = target.with_name(target.name + f".tmp{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copy(NODE_DIR / name, staging / name)
        done = subprocess.run(
            [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=staging,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise RuntimeError(f"npm ci failed for the Node gRPC client:\n{done.stderr[-2000:]}")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    shutil.copy(NODE_DIR / "client.js", target / "client.js")
    return target


async def node_unary(
    where: Path,
    target: str,
    method: str,
    request: bytes = b"",
    *,
    metadata: dict[str, str] | None = None,
    deadline_ms: int = 10_000,
    service_config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One unary call by the grpc-js client; returns {"code", "details", "trailers", "response"}."""
    spec = {
        "target": target,
        "method": method,
        "request": base64.b64encode(request).decode(),
        "metadata": metadata or {},
        "deadlineMs": deadline_ms,
        "serviceConfig": service_config,
    }
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(where / "client.js"),
        json.dumps(spec),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"node client exited {proc.returncode}: {err.decode()[-2000:]}")
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result
