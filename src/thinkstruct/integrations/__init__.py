"""thinkstruct inside other serving engines: :mod:`thinkstruct.integrations.vllm`.

This layer imports the grammar layer and the parsers only, never the engine or the server.
"""
