"""Generation backends: transformers (batched, KV cache; the default) and vLLM (vllm_backend, optional), both
producing `transformers_backend.Completions`; `transformers_backend.complete` takes either."""
