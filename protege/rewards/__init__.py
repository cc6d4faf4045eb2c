"""Rewards: judges of correctness, discriminator similarity."""
