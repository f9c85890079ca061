"""The plugin hooks (pluggy markers and specifications) and the registry they fill."""
