"""Built-in components. Each module is an ordinary plugin: it registers through the same hooks
as any third-party package."""
