"""WordLlama embeddings from the files shipped inside the ``wordllama`` wheel, and nothing else.

``WordLlama.load()`` (0.4) looks for the tokenizer under ``wordllama/tokenizer/`` while the wheel
ships it under ``wordllama/tokenizers/``; it then tries the user cache and the network. Here the two
packaged files are opened directly, so loading never touches the network.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["DIM", "Embedder", "load_embedder", "packaged_files"]

DIM = 256
_CONFIG = "l2_supercat"
_TENSOR_KEY = "embedding.weight"

Vectors = npt.NDArray[np.float32]


def packaged_files() -> tuple[Path, Path]:
    """(tokenizer JSON, safetensors weights) inside the installed ``wordllama`` package.

    Raises FileNotFoundError naming the missing file when the wheel lacks one.
    """
    root = Path(_import_wordllama().__file__).parent
    tokenizer = root / "tokenizers" / f"{_CONFIG}_tokenizer_config.json"
    weights = root / "weights" / f"{_CONFIG}_{DIM}.safetensors"
    for path in (tokenizer, weights):
        if not path.is_file():
            raise FileNotFoundError(f"wordllama wheel does not ship {path}")
    return tokenizer, weights


@dataclass(frozen=True, slots=True)
class Embedder:
    """A loaded WordLlama model: ``embed(texts)`` returns L2-normalised float32 vectors of shape
    (len(texts), 256). CPU-bound and thread-safe; call it from a worker thread in async code."""

    model: Any  # wordllama.WordLlamaInference (untyped package)
    _lock: threading.Lock

    @property
    def dim(self) -> int:
        return int(self.model.embedding.shape[1])

    def embed(self, texts: list[str]) -> Vectors:
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise TypeError("Embedder.embed: texts must be a list of str")
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        # The HF tokenizer object keeps padding state; serialise access to it.
        with self._lock:
            vecs = self.model.embed(texts, norm=True)
        return np.ascontiguousarray(vecs, dtype=np.float32)

    @property
    def token_vectors(self) -> Vectors:
        """The (vocabulary, dim) float32 token embedding matrix."""
        return self.model.embedding  # type: ignore[no-any-return]

    def token_ids(self, texts: list[str]) -> list[npt.NDArray[np.int64]]:
        """Each text's token ids (unpadded, clipped to the vocabulary)."""
        with self._lock:
            encoded = self.model.tokenizer.encode_batch(texts, add_special_tokens=False)
        top = self.token_vectors.shape[0] - 1
        out: list[npt.NDArray[np.int64]] = []
        for e in encoded:
            ids = np.asarray(e.ids, dtype=np.int64)[np.asarray(e.attention_mask, dtype=bool)]
            out.append(np.clip(ids, 0, top))
        return out


def _import_wordllama() -> Any:
    """Import wordllama without its import-time ``logging.basicConfig(level=INFO)``, which would
    otherwise add a root handler and print every library's INFO logs in the host program."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    import wordllama

    if not handlers:
        for handler in root.handlers[:]:
            root.removeHandler(handler)
        root.setLevel(level)
    return wordllama


def load_embedder() -> Embedder:
    """Load the 256-dim ``l2_supercat`` WordLlama model from the wheel's own files (no network)."""
    from safetensors import safe_open

    wordllama = _import_wordllama()
    WordLlama, WordLlamaInference = wordllama.WordLlama, wordllama.WordLlamaInference

    tokenizer_path, weights_path = packaged_files()
    # hf_model_id=None: a missing file raises instead of falling back to the Hugging Face hub.
    tokenizer = WordLlama.load_tokenizer(tokenizer_path, hf_model_id=None)
    with safe_open(str(weights_path), framework="np", device="cpu") as f:
        weights = f.get_tensor(_TENSOR_KEY)
    return Embedder(model=WordLlamaInference(weights, tokenizer, binary=False), _lock=threading.Lock())
