"""``minitransformer presets [FAMILY] [NAME]``: the named settings and their values.

    minitransformer presets                 every family's presets, one line each
    minitransformer presets gpt cpu-small   one preset, field by field, beside the defaults
    minitransformer presets debug           that preset of every family that has one
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
                                   "beside the config's own defaults. With a preset name "
                                   "alone: that preset of every family that has one.")
    p.add_argument("family", nargs="?", metavar="FAMILY",
                   help=f"model family ({', '.join(FAMILIES)}), or a preset name")
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
    if args.family not in FAMILIES and args.name is None:
        having = [f for f in FAMILIES.values() if args.family in f.presets]
        if not having:
            raise UserError(f"{args.family!r} is neither a family ({', '.join(FAMILIES)}) nor "
                            f"a preset; minitransformer presets lists them")
        for i, family in enumerate(having):
            print("\n" * (i > 0), end="")
            _print_preset(family, args.family)
        return 0
    family = get_family(args.family)
    if args.name is None:
        for preset in family.presets:
            print(preset)
        return 0
    _print_preset(family, args.name)
    return 0


def _print_preset(family, name: str) -> None:
    values, defaults = family.preset(name), _defaults(family)
    print(f"{family.name} preset {name}: the fields it sets, beside the config classes' own "
          f"defaults, which every field it leaves out keeps (train --help shows "
          f"{family.default_preset}'s)")
    for key, value in values.items():
        print(f"  --{key:<18} {value!s:<12} (config default {defaults.get(key)})")
