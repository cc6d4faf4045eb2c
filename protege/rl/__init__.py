"""RL: pure advantage and loss functions, and the training loops built on them."""
