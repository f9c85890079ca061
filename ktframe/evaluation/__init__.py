"""The paper's evaluation protocol, run on a checkpoint."""
