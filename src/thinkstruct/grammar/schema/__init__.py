"""Schema analysis: keyword scans and rewrites, thinkstruct's own checks, instances, cost estimates, the one walker."""
