"""``ktframe plugins``: every loaded plugin, its distribution and what it registers."""

from __future__ import annotations

import json


def add_parser(commands) -> None:
    p = commands.add_parser("plugins")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def describe() -> dict:
    from ktframe.plugin import manager as pluginmanager
    from ktframe.plugin.variant import setting_json

    state = pluginmanager.state()
    registry = state.registry
    return {
        "plugins": [
            {"name": info.name, "distribution": info.provenance.distribution, "version": info.provenance.version, "registers": info.registers}
            for info in state.plugins
        ],
        "variants": [
            {
                "name": name,
                "plugin": registry.entry("variant", name).provenance.plugin,
                "distribution": registry.entry("variant", name).provenance.distribution,
                "classical": registry.get("variant", name).classical,
                "summary": registry.get("variant", name).summary,
                "options": registry.get("variant", name).options(),
                # The setting `ktframe verify --variant NAME` runs by default (None: declares none).
                "exact": None if registry.get("variant", name).exact is None else setting_json(registry.get("variant", name).exact),
                # What TransformerKMeans offers with it: predict_proba and memberships_, sample_weight.
                "soft_memberships": registry.get("variant", name).soft_memberships,
                "sample_weights": registry.get("variant", name).sample_weights,
            }
            for name in registry.names("variant")
        ],
        "failures": [{"plugin": f.plugin, "distribution": f.distribution, "stage": f.stage, "error": f.error} for f in state.failures],
    }


def run(args) -> int:
    from ktframe.cli.columns import wrapped
    from ktframe.plugin.variant import setting_text

    info = describe()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    for plugin in info["plugins"]:
        print(f"{plugin['name']}  ({plugin['distribution']} {plugin['version']})")
        for kind, names in plugin["registers"].items():
            print(wrapped(f"{kind}: {', '.join(names)}", "    ", "        "))
    if info["variants"]:
        print("\nvariants:")
        for v in info["variants"]:
            exact = setting_text(v["exact"]) if v["exact"] is not None else "none declared"
            print(wrapped(f"{v['name']}: {v['classical']}", "    ", "        "))
            for line in (v["summary"], f"options: {', '.join(v['options']) or '-'}", f"exact: {exact}"):
                print(wrapped(line, "        ", "          "))
    for failure in info["failures"]:
        print("\n" + wrapped(f"FAILED: plugin {failure['plugin']!r} ({failure['distribution']}) at {failure['stage']}: {failure['error']}", "", "    "))
    return 0
