"""What protege knows about each benchmark (names, item fields, prompt formats), in one place below both the
world's generator and the evaluation."""
