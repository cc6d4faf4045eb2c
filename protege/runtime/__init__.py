"""What every training stage (sft, disc_pretrain, rl) runs on, so a stage holds only its own maths.

- distributed.py: which process this is (RANK / WORLD_SIZE from torchrun or the deepspeed launcher),
  barriers and sums across processes, and the per-rank share of a loss normalised over the global batch.
- placement.py: the device a stage trains on (`auto | cpu | cuda`) and moving batches / idle models there.
- updaters.py: plain torch or DeepSpeed ZeRO-2/3 updates, with separate `backward` (micro-batches) and
  `step`, gradient clipping and an optional per-step LR schedule that belongs to the updater.
- run.py: the skeleton every trainer shares (resume, the epoch-wise data order, the save cadence), so sft,
  agent_sft, disc_pretrain and both RL loops hold only their step bodies.
- state.py: the training state of exact resume as named parts (weights, optimizer + LR schedule, RNG),
  written atomically without pickle; a re-run after a kill continues bitwise where the last state was.
"""
