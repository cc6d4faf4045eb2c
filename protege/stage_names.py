"""The pipeline's stages, by name and in dvc.yaml's order (foundation: config validates names against it
without importing the stages themselves). `world` and `data` are the two data sources: dvc.yaml holds the
one `data.source` names (`protege dag`)."""
STAGES = ("world", "data", "mini_benchmarks", "validate", "sft", "curate", "teachers", "rollouts", "disc_pretrain", "rl",
          "rl_baseline", "merge", "agent_sft", "agent_rl", "tool_sft", "tool_rl", "evaluate", "promote")

# the training stages and the params section that holds their runtime (backend, device, processes)
TRAINING_SECTIONS = {"sft": "sft", "disc_pretrain": "disc_pretrain", "rl": "rl", "rl_baseline": "rl",
                     "agent_rl": "agent.rl", "tool_rl": "tool.rl"}
