"""The op table as Markdown, for the README.  A tool apart from the
library: it reads the drop-in namespace (the public names) and the batch
rules, both of which import ir/table.py, so the table cannot import them."""

import subgraphjit

from ..batcher.rules import rule_for
from ..ir.table import OPERATORS, TF_ENTRIES


def markdown_table():
    """The op table as Markdown, as the README shows it (kept current by a
    test): one line per family with every public name it records, an op
    without a batch rule marked as run per instance."""
    public_names = {}
    for module_name in ("", "math.", "nn.", "linalg."):
        module = subgraphjit if not module_name else getattr(
            subgraphjit, module_name[:-1])
        for attribute, value in vars(module).items():
            wrapped = getattr(getattr(value, "__wrapped__", None), "__name__", None)
            if wrapped is not None and callable(value) and not attribute.startswith("_"):
                public_names.setdefault(value, []).append(
                    f"tf.{module_name}{attribute}")
    by_family = {}
    for entry in TF_ENTRIES:
        wrapper = next((w for w in public_names
                        if w.__wrapped__ is entry.fn), None)
        names = sorted(public_names.get(wrapper, [f"tf.{entry.name}"]))
        # (An op of no tensors is made once for every instance: executor.py
        # and program.py run a kind whose operands are all shared once.)
        mark = "" if rule_for(entry) is not None or not entry.tensors else " (per instance)"
        by_family.setdefault(entry.family, []).extend(
            f"`{name}`{mark}" for name in names)
    operators = " ".join(f"`{dunder}`" for dunder in OPERATORS) + " `__getitem__`"
    lines = ["| family | ops |", "|---|---|"]
    lines += [f"| {family} | {', '.join(names)} |"
              for family, names in by_family.items()]
    lines.append(f"| VirtualNode operators | {operators} |")
    lines.append("| special | `tf.shape` (static, no evaluation), "
                 "`tf.nn.dropout` (mask drawn at record time) |")
    lines.append("| generic (through dispatch) | any other TensorFlow API that "
                 "supports dispatch, given a node (per instance) |")
    return "\n".join(lines)
