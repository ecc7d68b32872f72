"""The Redis keys of the shared tenant quotas: a tenant's (:func:`quota_keys`) and the unlisted
pool's (:func:`pool_keys`), each set under one hash tag so that one script sees all of it (Redis
Cluster runs it on the node owning the tag)."""

from __future__ import annotations

from ..quotas._local import POOL_NAME

__all__ = ["pool_keys", "quota_keys"]

_PARTS = ("leases", "queue", "qexp")


def quota_keys(tenant: str, key_prefix: str = "ragguard") -> list[str]:
    """The Redis keys of the quota of ``tenant`` (one not in a pool): ``{<prefix>:quota:<tenant>}:``
    then ``leases`` (lease id -> expiry, and ``tat``), ``queue``, ``qexp``, ``share`` (tenant ids
    cannot contain braces)."""
    tag = f"{{{key_prefix}:quota:{tenant}}}"
    return [f"{tag}:{part}" for part in (*_PARTS, "share")]


def pool_keys(key_prefix: str = "ragguard", tenant: str | None = None) -> list[str]:
    """The keys of the unlisted pool (``leases``, ``queue``, ``qexp`` under
    ``{<prefix>:quota:*unlisted}``), or with ``tenant`` those of that member's own quota, under the
    pool's hash tag so that one script sees both."""
    tag = f"{{{key_prefix}:quota:{POOL_NAME}}}"
    base = tag if tenant is None else f"{tag}:{tenant}"
    return [f"{base}:{part}" for part in _PARTS]
