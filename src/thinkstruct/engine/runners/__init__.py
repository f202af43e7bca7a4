"""Model runners: one forward pass over slots of a KV cache (the seam), on the
architecture registry's compiled kernels or on transformers' own modules."""
