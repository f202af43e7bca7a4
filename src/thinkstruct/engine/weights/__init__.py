"""Weight formats the kernels multiply by: int8 rows, a GGUF's own blocks, torch's
dynamic int8."""
