"""A request's generated tokens turned into what its caller reads: text, the reasoning
split, stop strings, tool calls, checked keywords."""
