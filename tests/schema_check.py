"""A validator for the subset of JSON Schema that spoolctl publishes (type,
properties, required, additionalProperties, items, enum, const, anyOf,
maxItems). jsonschema is not a dependency; this keeps the check honest: a
keyword it does not know fails loudly instead of being skipped."""

from __future__ import annotations

from typing import Any

KNOWN = {
    "$schema",
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "anyOf",
    "maxItems",
    "minItems",
    "description",
}
TYPES: dict[str, Any] = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
}


def is_type(value: Any, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, TYPES[name])


def errors(value: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """Every violation, with a JSON path; empty when value matches."""
    unknown = set(schema) - KNOWN
    if unknown:
        return [f"{path}: schema uses unsupported keywords {sorted(unknown)}"]
    if "anyOf" in schema:
        branches = [errors(value, s, path) for s in schema["anyOf"]]
        if all(branches):
            return [f"{path}: matches no anyOf branch: {min(branches, key=len)}"]
    kinds = schema.get("type")
    if kinds is not None:
        kinds = kinds if isinstance(kinds, list) else [kinds]
        if not any(is_type(value, k) for k in kinds):
            return [f"{path}: {value!r:.60} is not {kinds}"]
    found: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{path}: {value!r} not in {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        found.append(f"{path}: {value!r} != {schema['const']!r}")
    if isinstance(value, dict):
        found += object_errors(value, schema, path)
    if isinstance(value, list):
        found += array_errors(value, schema, path)
    return found


def array_errors(value: list[Any], schema: dict[str, Any], path: str) -> list[str]:
    found = []
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        found.append(f"{path}: more than {schema['maxItems']} items")
    if "minItems" in schema and len(value) < schema["minItems"]:
        found.append(f"{path}: fewer than {schema['minItems']} items")
    for i, item in enumerate(value):
        found += errors(item, schema.get("items", {}), f"{path}[{i}]")
    return found


def object_errors(value: dict[str, Any], schema: dict[str, Any], path: str) -> list[str]:
    found = [f"{path}: missing {key!r}" for key in schema.get("required", []) if key not in value]
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if key in properties:
            found += errors(item, properties[key], f"{path}.{key}")
        elif extra is False:
            found.append(f"{path}: unexpected key {key!r}")
        elif isinstance(extra, dict):
            found += errors(item, extra, f"{path}.{key}")
    return found
