"""`rlfleet config show [--config F] [key=value ...]`: the resolved job config as YAML, each key
preceded by its description (and bounds) as a comment. The output is itself a valid job file.
`--key env.name` prints that one value instead (nothing for null), for scripts such as the Slurm job."""
from __future__ import annotations

import argparse
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo


def add_parser(sub) -> None:
    config = sub.add_parser("config", help="show the resolved job config with every key's documentation")
    actions = config.add_subparsers(dest="config_command", required=True)
    show = actions.add_parser("show", help="print the resolved config (defaults, --config, overrides) as "
                              "YAML with each key's description as a comment")
    show.add_argument("--config", "-c", help="job YAML file (default: the embedded default job)")
    show.add_argument("overrides", nargs="*", metavar="key=value",
                      help="dotted overrides, e.g. learner.lr=1e-6 controller.max_staleness=2")
    show.add_argument("--key", help="print only this dotted key's value (a string as it is, null as "
                      "nothing, anything else as one line of YAML), e.g. --key env.name")


def _bounds(field: FieldInfo) -> str:
    names = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "min_length": "length >=",
             "max_length": "length <="}
    found = [f"{names[key]} {value}" for meta in field.metadata for key in names
             if (value := getattr(meta, key, None)) is not None]
    return f" ({', '.join(found)})" if found else ""


def _scalar(value: Any) -> str:
    """One YAML value on one line (flow style for lists and mappings)."""
    return yaml.safe_dump(value, default_flow_style=True, width=10**9).removesuffix("\n...\n").strip()


def render(model: BaseModel, indent: int = 0) -> list[str]:
    lines: list[str] = []
    pad = "  " * indent
    dumped = model.model_dump(mode="json")  # as config.yaml holds it: tuples as lists, models as mappings
    for name, field in type(model).model_fields.items():
        if field.description:
            lines.append(f"{pad}# {' '.join(field.description.split())}{_bounds(field)}")
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            lines.append(f"{pad}{name}:")
            lines.extend(render(value, indent + 1))
        else:
            lines.append(f"{pad}{name}: {_scalar(dumped[name])}")
    return lines


def run(args: argparse.Namespace) -> int:
    from rlfleet.config import load_config

    cfg = load_config(args.config, args.overrides)
    if args.key:
        print(value_of(cfg, args.key))
        return 0
    print("\n".join(render(cfg)))
    return 0


def value_of(cfg: BaseModel, key: str) -> str:
    from rlfleet.errors import ConfigError

    value: Any = cfg.model_dump(mode="json")
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ConfigError(f"--key {key}: the config has no key {key!r}")
        value = value[part]
    if value is None:
        return ""
    return value if isinstance(value, str) else _scalar(value)
