"""DAPO's recipe and several updates per batch on two DeepSpeed ranks (CPU, gloo): dynamic sampling's further
draws, the mini-batch count and the token_mean normaliser are agreed between the ranks, which end on the same
weights."""
import json

import pytest

from tests.stages.test_deepspeed import launch

pytest.importorskip("deepspeed")

RECIPE = {"clip_eps_low": 0.2, "clip_eps_high": 0.28, "loss_aggregation": "token_mean",
          "overlong": {"penalty_window": 2}, "dynamic_sampling": {"max_draws": 2}, "ppo_epochs": 2,
          "mini_batches": 2, "entropy_coef": 0.01, "kl": {"estimator": "low_var", "placement": "reward"}}


def test_two_processes_stay_in_sync_with_the_recipe(tmp_path):
    r0, r1 = launch(tmp_path, "ril", 2, 2, "--micro", "1", "--settings", json.dumps(RECIPE))
    assert r0["steps"] == r1["steps"] == 2
    assert r0["changed"] > 0 and r0["digest"] == r1["digest"]
