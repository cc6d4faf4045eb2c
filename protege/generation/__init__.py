"""Generation backends (transformers: batched with KV cache; vLLM and HTTP come with later stages)."""
