"""What a learning experiment is: its config, its tasks, the LightningModule, its metrics and checkpoints."""
