"""The names of the GDN ops (kept free of torch so that configuration code can read them)."""

from gdn.op_specs import SPECS

OP_NAMES = tuple(spec.name for spec in SPECS)
