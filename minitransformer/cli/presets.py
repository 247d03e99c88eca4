"""``minitransformer presets [FAMILY] [NAME]``: the named settings and their values.

    minitransformer presets                 every family's presets, one line each
    minitransformer presets gpt cpu-small   one preset, field by field, beside the defaults
"""

from __future__ import annotations

import dataclasses

from ..config import TrainConfig
from ..errors import UserError
from ..families import FAMILIES, get_family


def add_parser(sub) -> None:
    p = sub.add_parser("presets", help="list the presets of each model family and their values",
                       description="Without arguments: every preset of every family. With a "
                                   "family and a preset name: its values, field by field, "
                                   "beside the config's own defaults.")
    p.add_argument("family", nargs="?", choices=list(FAMILIES), help="model family")
    p.add_argument("name", nargs="?", help="preset name")
    p.set_defaults(func=cmd_presets)


def _defaults(family) -> dict:
    classes = (family.config_class, *family.data_classes, TrainConfig)
    return {f.name: f.default for cls in classes for f in dataclasses.fields(cls)}


def cmd_presets(args) -> int:
    if args.family is None:
        if args.name is not None:
            raise UserError("name the family first: minitransformer presets gpt cpu-small")
        for name, family in FAMILIES.items():
            print(f"{name} ({family.title}; default {family.default_preset}):")
            for preset, values in family.presets.items():
                short = ", ".join(f"{k}={v}" for k, v in list(values.items())[:6])
                print(f"  {preset:<18} {short}, ...")
        print("one preset in full: minitransformer presets FAMILY NAME")
        return 0
    family = get_family(args.family)
    if args.name is None:
        for preset in family.presets:
            print(preset)
        return 0
    values, defaults = family.preset(args.name), _defaults(family)
    print(f"{family.name} preset {args.name} (other fields keep their defaults):")
    for key, value in values.items():
        print(f"  --{key:<18} {value!s:<12} (default {defaults.get(key)})")
    return 0
