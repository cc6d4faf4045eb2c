def test_sft_schedule_warms_up_then_decays_to_a_tenth():
    from protege.config import SFTConfig
    from protege.runtime.schedule import lr_factor

    cfg = SFTConfig(steps=110, warmup_steps=10, schedule="cosine")
    assert lr_factor(0, cfg) == 0.1 and lr_factor(4, cfg) == 0.5  # (step + 1) / 10
    assert lr_factor(10, cfg) == 1.0                               # cosine starts at the peak
    assert abs(lr_factor(60, cfg) - 0.55) < 1e-12                  # half way: 0.1 + 0.45 * (1 + cos(pi/2))
    assert abs(lr_factor(110, cfg) - 0.1) < 1e-12                  # the end: 10% of lr
    assert lr_factor(60, SFTConfig(steps=110, warmup_steps=10, schedule="constant")) == 1.0
