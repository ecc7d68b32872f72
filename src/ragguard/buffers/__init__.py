"""Pooled byte buffers and the Snappy codec that compresses straight into them.

>>> from ragguard.buffers import BufferPool, SnappyCodec
>>> codec = SnappyCodec(pool=BufferPool())
>>> with codec.compressed(b"hits " * 100) as block:
...     codec.decompress(block) == b"hits " * 100
True
"""

from ._codec import SnappyCodec
from ._pool import BufferPool, DoubleRelease

__all__ = ["BufferPool", "DoubleRelease", "SnappyCodec"]
