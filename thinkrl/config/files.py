"""Reading a YAML config file: every leaf as (dotted key, value, line), so errors can name `file:line`.

The `method:` section stays one level deep (its keys are the method's own hyperparameters). Aliases are
refused when they would expand past MAX_NODES values (a few hundred bytes of nested aliases can stand for
gigabytes), and YAML syntax errors name their line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from thinkrl.errors import UserError

MAX_NODES = 10_000  # values in a config once aliases are expanded; a real config has a few hundred


def read_yaml(path: Path) -> list[tuple[str, Any, int]]:
    """(dotted key, value, 1-based line) for every setting in the file."""
    if not path.is_file():
        raise UserError(f"config file not found: {path}")
    text = path.read_text()
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            _count(node, [0])
        data = loader.construct_document(node) if node is not None else {}
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise UserError(f"{where}: malformed YAML: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise UserError(f"{path}: malformed YAML: {str(e).splitlines()[0]}") from None
    except ValueError as e:  # an integer of more than 4,300 digits: no setting takes one
        raise UserError(f"{path}: a value could not be read ({str(e).split(';')[0]})") from None
    finally:
        loader.dispose()
    if data is None:
        return []
    if not isinstance(data, dict) or not isinstance(node, yaml.MappingNode):
        raise UserError(f"{path}: expected a mapping of config sections at the top level (e.g. `train:` then `lr: 1e-5`)")
    return list(_leaves(node, data, ""))


def _count(node: yaml.Node, seen: list[int]) -> None:
    """Count the values the document expands to (an alias counts each time it is used)."""
    seen[0] += 1
    if seen[0] > MAX_NODES:
        raise UserError(f"the config expands to more than {MAX_NODES} values (nested YAML aliases?); write it out plainly")
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            _count(k, seen)
            _count(v, seen)
    elif isinstance(node, yaml.SequenceNode):
        for v in node.value:
            _count(v, seen)


def _leaves(node: yaml.MappingNode, data: dict, prefix: str):
    lines = {k.value: k.start_mark.line + 1 for k, _ in node.value if isinstance(k, yaml.ScalarNode)}
    children = {k.value: v for k, v in node.value if isinstance(k, yaml.ScalarNode)}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        child = children.get(str(key))
        one_level = dotted == "method.params" or (prefix == "method." and key != "params")
        if isinstance(value, dict) and isinstance(child, yaml.MappingNode) and not one_level:
            yield from _leaves(child, value, dotted + ".")
        else:
            yield dotted, value, lines.get(str(key), 0)
