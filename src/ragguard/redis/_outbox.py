"""The releases a replica made that Redis has not acknowledged yet, per tenant.

Every command the replica sends for a tenant carries all of them, those already on their way in
another command too: Redis applies releases idempotently, and so no admission of this replica can
overtake a release it made before (a replica always sees its own releases, as in memory). A release
leaves the outbox when a command carrying it succeeds, or once the lease it removes would have
expired in Redis anyway (``expire_s`` after it was queued). A release sent in no command for
``delay_s`` is due: the background sends it on its own. A release sent in no command yet may
instead be taken over by the tenant's next admission (:meth:`take_fresh`): that request reuses the
lease id, and its slot passes on without a write.

Each release carries a code for the script: 0, plus 1 to refund its rate token, plus 2 to take it
out of the queues too (a request that may have queued).
"""

from __future__ import annotations

import math

__all__ = ["Outbox"]


class Outbox:
    """``tenant -> lease id -> [code, queued_at, commands carrying it]``; times in monotonic s."""

    __slots__ = ("_boxes", "expire_s")

    def __init__(self, expire_s: float) -> None:
        self._boxes: dict[str, dict[str, list[float]]] = {}  # [code, queued_at, in flight]
        self.expire_s = expire_s

    def __len__(self) -> int:
        return sum(len(box) for box in self._boxes.values())

    def add(self, tenant: str, lease_id: str, code: int, now: float) -> None:
        box = self._boxes.setdefault(tenant, {})
        entry = box.get(lease_id)
        if entry is None:
            box[lease_id] = [code, now, 0]
        else:
            entry[0] = int(entry[0]) | code

    def take_fresh(self, tenant: str) -> str | None:
        """Remove and return the id of a plain release of ``tenant`` that no command carried yet
        (None when there is none): the caller's request takes over its slot."""
        box = self._boxes.get(tenant)
        if not box:
            return None
        for lease_id in reversed(box):
            entry = box[lease_id]
            if not entry[0] and not entry[2]:
                del box[lease_id]
                if not box:
                    del self._boxes[tenant]
                return lease_id
        return None

    def carry(self, tenant: str, now: float) -> tuple[list[str], str]:
        """The releases of ``tenant`` to send now: their ids, and the script's operations
        ``" id code id code ..."`` (each pair after a space; "" when there is none). Each is
        marked in flight until :meth:`acked` or :meth:`unsent`."""
        box = self._boxes.get(tenant)
        if not box:
            return [], ""
        too_old = now - self.expire_s
        parts: list[str] = []
        for lease_id, entry in list(box.items()):
            if entry[1] <= too_old and not entry[2]:
                del box[lease_id]  # its lease has expired in Redis: nothing left to remove
                continue
            entry[2] += 1
            parts.append(f" {lease_id} {int(entry[0])}")
        return list(box), "".join(parts)

    def acked(self, tenant: str, ids: list[str]) -> None:
        """A command carrying ``ids`` succeeded: they are applied in Redis."""
        box = self._boxes.get(tenant)
        if box is None:
            return
        for lease_id in ids:
            box.pop(lease_id, None)
        if not box:
            del self._boxes[tenant]

    def unsent(self, tenant: str, ids: list[str]) -> None:
        """A command carrying ``ids`` failed: they stay, to be sent again."""
        box = self._boxes.get(tenant, {})
        for lease_id in ids:
            entry = box.get(lease_id)
            if entry is not None:
                entry[2] -= 1

    def tenants(self) -> list[str]:
        return list(self._boxes)

    def due(self, before: float) -> list[str]:
        """Tenants with a release queued before ``before`` that no command is carrying."""
        return [t for t, box in self._boxes.items()
                if any(e[1] <= before and not e[2] for e in box.values())]

    def oldest(self) -> float:
        """When the oldest release not in flight was queued (inf when there is none)."""
        return min((e[1] for box in self._boxes.values() for e in box.values() if not e[2]),
                   default=math.inf)
