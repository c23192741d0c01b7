"""YAML as a config reads it: the loader that refuses a key given twice and reads YAML 1.2
floats (`UniqueKeyLoader`), and ``--set section.key=value`` overrides (`parse_override`,
`set_path`). Used by `mlhpc.config`, which re-exports them."""

from __future__ import annotations

import re
from typing import Any

import yaml

from mlhpc.errors import ConfigError

__all__ = ["UniqueKeyLoader", "parse_override", "set_path", "show"]


def show(text: Any) -> str:
    """``text`` as it can stand in a one-line message (repr when it holds control characters),
    at most a few hundred characters of it (`mlhpc.text.clip`, which never formats a huge or
    deeply nested object whole)."""
    from mlhpc.text import MAX_SHOWN_CHARS, clip

    if not isinstance(text, str):
        text = clip(text)
    return clip(text if text.isprintable() else repr(text[:2 * MAX_SHOWN_CHARS]))


def set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Put ``value`` at the dotted key path ``dotted`` of ``tree``, making sections on the way.

    Raises:
        ConfigError: an empty name in the path, or a part that is a value, not a section.
    """
    parts = dotted.split(".")
    if not all(parts):
        raise ConfigError(f"--set {show(dotted)}: empty key path")
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"--set {show(dotted)}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


_KEY_PATH = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")


def parse_override(text: str) -> tuple[str, Any]:
    """``"train.max_epochs=5"`` -> ``("train.max_epochs", 5)``; the value is read as YAML (with
    the same duplicate-key check as a config file).

    Raises:
        ConfigError: no ``=``, a key path that is not dot-separated names (letters, digits, ``_``,
            ``-``), or a value that is not valid YAML; the message starts with ``--set``.
    """
    if "=" not in text:
        raise ConfigError(f"--set {show(text)}: expected section.key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not _KEY_PATH.fullmatch(key):
        raise ConfigError(f"--set {show(key)}: the key must be a dotted path of names, "
                          f"e.g. train.max_epochs")
    try:
        value = yaml.load(raw, Loader=UniqueKeyLoader) if raw != "" else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {show(key)}: value {show(raw)} is not valid YAML "
                          f"({show(getattr(exc, 'problem', None) or type(exc).__name__)})") from None
    return key, value


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (PyYAML keeps the last
    silently). Keys brought in by a merge (``<<: *anchor``) may be overridden, as YAML intends."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {show(key)} (first at line {seen[key]})",
                            key_node.start_mark)
                    seen[key] = key_node.start_mark.line + 1
                except TypeError:
                    continue  # unhashable key: SafeConstructor reports it
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 (PyYAML's resolver) reads a float only with a dot and a signed exponent, so ``1e-3``,
# ``1E+30`` or ``1.5e3`` would stay strings and fail as "input should be a valid number". YAML 1.2's
# core schema (yaml.org/spec/1.2.2, 10.3.2 "Tag Resolution") reads them as floats, as users mean:
# this resolver adds the 1.2 exponent forms; the 1.1 forms (and ``.inf``/``.nan``, which every
# section rejects as non-finite) resolve as before, ahead of it.
UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"))
