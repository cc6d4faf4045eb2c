"""Where a loop's prompts, rewards, the advantages' shape and the data cursor come from: a rollout per loop.
A new environment or data source is a file here (see docs/adding-an-algorithm.md)."""
