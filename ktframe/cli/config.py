"""``ktframe config show [key=value ...]``: print the resolved config."""

from __future__ import annotations


def add_parser(commands) -> None:
    p = commands.add_parser("config")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="print the config that `ktframe fit` would use (the model keys its variant reads)")
    show.add_argument("overrides", nargs="*", metavar="key=value")
    show.set_defaults(run=run)


def run(args) -> int:
    from ktframe.learning.config import applicable, load_config, to_yaml

    print(to_yaml(applicable(load_config(args.overrides))), end="")
    return 0
