"""Supervised training loops (SFT, discriminator pretraining)."""
