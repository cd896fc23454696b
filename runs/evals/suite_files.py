"""A suite as one YAML file: parsed strictly (no tags, no anchors' surprises,
mappings with string keys only) and written so that import(export(s)) == s."""

from __future__ import annotations

from typing import Any

import yaml

from runs.evals.definitions import DefinitionError, suite_validate

MAX_YAML_BYTES = 1_000_000


class _SuiteLoader(yaml.SafeLoader):
    """SafeLoader whose mappings refuse a repeated key (PyYAML keeps the last)."""


def _mapping(loader: _SuiteLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)  # type: ignore[no-untyped-call]
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} appears twice", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_SuiteLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _mapping,
)


def suite_file_parse(text: str) -> dict[str, Any]:
    """The checked suite document of a YAML file; raises DefinitionError naming
    the problem (a YAML syntax error is reported at `yaml` with its line)."""
    if len(text.encode("utf-8")) > MAX_YAML_BYTES:
        raise DefinitionError({"yaml": [f"larger than {MAX_YAML_BYTES} bytes"]})
    try:
        document = yaml.load(text, Loader=_SuiteLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as bad:
        raise DefinitionError({"yaml": [f"not valid YAML: {bad}"]}) from None
    except RecursionError:
        raise DefinitionError({"yaml": ["nested too deeply"]}) from None
    return suite_validate(document)


def suite_file_render(document: dict[str, Any]) -> str:
    """A suite document as YAML, keys in the schema's order."""
    return yaml.safe_dump(
        document, sort_keys=False, allow_unicode=True, default_flow_style=False
    )
