"""The serving engine: continuous batching over a transformers causal LM (see docs/design.md)."""
