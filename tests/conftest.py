import os

# A plugin that fails to load is an error in the test suite, not a warning.
os.environ.setdefault("KTFRAME_STRICT_PLUGINS", "1")
