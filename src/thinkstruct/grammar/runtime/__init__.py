"""Matching while decoding: the matcher interface, the reasoning wrapper, the end-of-thought matcher, bitmasks, whole-answer checks."""
