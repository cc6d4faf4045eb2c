"""Reward functions the rl.rewards tests name by their module path."""
