"""Token-level constraints: specs, backends, reasoning-aware wrapper, compile service, bitmasks."""
