"""Model loading for the executor: checkpoints on disk and the embedded default model."""
