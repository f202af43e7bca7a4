"""Loading a model for the engine: paths, Hugging Face and GGUF loading, family
detection, the tokenizer, the crash-safe cache of converted models."""
