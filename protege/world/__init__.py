"""The embedded tiny world: procedural images, questions and scripted teachers, all from a seed."""
