"""Guidance terms: what steers an RL loop beside its own reward (base.py says how a loop calls them).
discriminator.py: RIL's similarity reward (the question loop); shaping.py: GTPO's similarity shaping and
merged_teacher.py: GTR-Turbo's merged teacher (the multi-turn loop). The package imports none of them, so a
stage depends only on the terms its loop uses."""
