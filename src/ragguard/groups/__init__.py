"""Model groups: deployments of a model (or of interchangeable ones) that one call may go to,
picked by a strategy, skipped while their breaker is open or their limits spent, failed over within
the request's deadline (:class:`ModelGroup`; ``guard.group(name, {deployment: target})`` binds a
group of the policy's ``groups``). See docs/integrations.md for the recipe.
"""

from ._group import ModelGroup

__all__ = ["ModelGroup"]
