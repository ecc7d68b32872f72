"""WordLlama loads from the wheel's own files, touches no network, and embeds sensibly."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ragguard_tools.demo.embedder import DIM, Embedder, packaged_files

# Runs in a fresh interpreter, so the imports are covered too: every DNS lookup and every socket
# connect to a non-loopback address is recorded and refused.
_NO_NETWORK = textwrap.dedent(
    """
    import json, os, socket, sys, tempfile
    os.environ["HF_HUB_OFFLINE"] = "1"
    attempts = []
    real_connect, real_connect_ex, real_getaddrinfo = (
        socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo)

    def loopback(address):
        host = address[0] if isinstance(address, tuple) else str(address)
        return host in ("127.0.0.1", "::1", "localhost") or isinstance(address, (str, bytes))

    def connect(self, address):
        if not loopback(address):
            attempts.append(repr(address))
            raise OSError("network blocked by test")
        return real_connect(self, address)

    def connect_ex(self, address):
        if not loopback(address):
            attempts.append(repr(address))
            return 111
        return real_connect_ex(self, address)

    def getaddrinfo(host, *args, **kwargs):
        if host not in ("127.0.0.1", "::1", "localhost", None):
            attempts.append(f"dns:{host}")
            raise socket.gaierror("network blocked by test")
        return real_getaddrinfo(host, *args, **kwargs)

    socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo = connect, connect_ex, getaddrinfo

    from ragguard_tools.demo.embedder import load_embedder
    vecs = load_embedder().embed(["How does the with statement work?"])
    ours = list(attempts)

    # The library's own loader, for contrast: it misses the packaged tokenizer and goes online.
    from wordllama import WordLlama
    try:
        WordLlama.load(cache_dir=tempfile.mkdtemp())
        stock = "loaded"
    except Exception as exc:
        stock = type(exc).__name__
    print(json.dumps({"ours": ours, "shape": list(vecs.shape), "stock": stock,
                      "stock_attempts": attempts[len(ours):]}))
    """
)


@pytest.mark.timeout(60)
def test_loading_touches_no_network() -> None:
    proc = subprocess.run([sys.executable, "-c", _NO_NETWORK], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ours"] == []
    assert report["shape"] == [1, DIM]
    # The stock loader reached for the network (and was refused), which is why we bypass it.
    assert report["stock_attempts"], report
    assert report["stock"] != "loaded"


def test_packaged_files_exist() -> None:
    tokenizer, weights = packaged_files()
    assert tokenizer.suffix == ".json" and weights.suffix == ".safetensors"


def test_embeddings_are_normalised_and_meaningful(demo_embedder: Embedder) -> None:
    vecs = demo_embedder.embed(
        ["How do I catch an exception?", "try and except handle errors", "a list comprehension syntax"]
    )
    assert vecs.shape == (3, DIM) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert vecs[0] @ vecs[1] > vecs[0] @ vecs[2]
    assert demo_embedder.embed([]).shape == (0, DIM)


def test_embed_rejects_non_lists(demo_embedder: Embedder) -> None:
    with pytest.raises(TypeError):
        demo_embedder.embed("not a list")  # type: ignore[arg-type]
