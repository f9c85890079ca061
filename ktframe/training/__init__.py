"""Training k-means transformers with Lightning: configuration, tasks, loss, metrics, the
LightningModule and ``train(cfg)``."""
