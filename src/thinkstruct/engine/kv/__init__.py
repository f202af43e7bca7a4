"""Keys and values: the paged cache, slot buffers, and the prefix cache over their blocks."""
