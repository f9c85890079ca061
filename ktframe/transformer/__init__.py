"""The k-means transformer: its plain definition (``model``), the helpers that hand-build
constructions from it (``construction``), the learnable variant (``learned``), its result type and
its input checks."""
