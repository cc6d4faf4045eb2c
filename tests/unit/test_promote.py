from protege.stages.promote import decide


def test_first_model_becomes_champion():
    assert decide(0.3, None, margin=0.0)


def test_champion_moves_only_past_the_margin():
    assert decide(0.71, 0.70, margin=0.0)
    assert not decide(0.70, 0.70, margin=0.0)  # a tie keeps the champion
    assert not decide(0.705, 0.70, margin=0.01)
    assert decide(0.72, 0.70, margin=0.01)
