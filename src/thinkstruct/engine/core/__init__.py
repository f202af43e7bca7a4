"""The serving loop: the engine thread, its scheduler and executor, the per-request
state they share, and the plain data a step hands back (see docs/design.md)."""
