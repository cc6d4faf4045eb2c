"""Student, discriminator and tokenizer factories; load and save (safetensors only)."""
