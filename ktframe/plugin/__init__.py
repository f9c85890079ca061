"""The plugin system: the hooks a plugin implements (``hookspecs``), loading plugins
(``manager``), looking registered components up (``registry``), what a variant declares and how a
model is built from one (``variant``), and the conformance checks for a variant plugin (``testing``)."""
