"""The exceptions ktframe raises for things a user can fix.

Every message is one line that says what is wrong and what is expected; the CLI prints it and
exits with code 2, with no traceback.
"""


class KtframeError(ValueError):
    """Base class: bad input, bad configuration or a broken plugin."""


class InputError(KtframeError):
    """Data, shapes or parameters a function cannot work with."""


class UnknownNameError(KtframeError):
    """A component, variant or option name that nothing registered."""


class PluginError(KtframeError):
    """A plugin failed to load or to register, or two plugins clash."""


class NotFittedError(InputError, AttributeError):
    """A method that needs a fitted estimator, called before ``fit``; a ``ValueError`` and an
    ``AttributeError``, as scikit-learn's own ``NotFittedError`` is."""
