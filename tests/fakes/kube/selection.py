"""Label and field selectors as the apiserver parses them.

Labels (k8s.io/apimachinery/pkg/labels): `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`,
`a` (exists), `!a` (does not exist), comma-separated and all required. Fields: `metadata.name`,
`metadata.namespace` for every resource, plus `status.phase` and `spec.nodeName` for pods;
anything else is refused with the apiserver's 400.

Keys and values are held to label syntax (apimachinery's `validation.IsQualifiedName`,
`IsValidLabelValue`), in a selector (400) as on an object's labels and annotation keys
(`metadata_causes`: 422 causes, as `ValidateObjectMeta` gives them, with annotations at most
256 KiB in all).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from tests.fakes.kube.errors import bad_request

Matcher = Callable[[dict[str, Any]], bool]

_SET = re.compile(r"^\s*(!?)\s*([A-Za-z0-9._/-]+)\s*(?:(in|notin)\s*\(([^)]*)\))?\s*$")
_EQ = re.compile(r"^\s*([A-Za-z0-9._/-]+)\s*(==|=|!=)\s*([A-Za-z0-9._-]*)\s*$")


_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
ANNOTATIONS_MAX_BYTES = 256 * 1024


def key_problem(key: str) -> str | None:
    """Why `key` is not a qualified name (`[prefix/]name`), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _SUBDOMAIN.match(prefix)):
        return "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters"
    if not name or len(name) > 63 or not _NAME.match(name):
        return (
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
            "alphanumeric character, and be no more than 63 characters"
        )
    return None


def value_problem(value: str) -> str | None:
    """Why `value` is not a label value, or None."""
    if value and (len(value) > 63 or not _NAME.match(value)):
        return (
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and "
            "must start and end with an alphanumeric character, and be no more than 63 characters"
        )
    return None


def metadata_causes(meta: dict[str, Any]) -> list[dict[str, str]]:
    """The 422 causes of an object's labels and annotations outside their syntax."""
    causes = []
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    for key, value in labels.items() if isinstance(labels, dict) else ():
        problem = key_problem(str(key)) or value_problem(str(value))
        if problem:
            shown = key if key_problem(str(key)) else value
            causes.append(_cause("metadata.labels", f'Invalid value: "{shown}": {problem}'))
    if isinstance(annotations, dict):
        for key in annotations:
            problem = key_problem(str(key).lower())
            if problem:
                causes.append(_cause("metadata.annotations", f'Invalid value: "{key}": {problem}'))
        size = sum(len(str(k).encode()) + len(str(v).encode()) for k, v in annotations.items())
        if size > ANNOTATIONS_MAX_BYTES:
            causes.append(_cause("metadata.annotations", f"Too long: must have at most {ANNOTATIONS_MAX_BYTES} bytes"))
    return causes


def _cause(field: str, message: str) -> dict[str, str]:
    return {"reason": "FieldValueInvalid", "message": message, "field": field}


def _checked(term: str, key: str, values: list[str]) -> None:
    problem = key_problem(key)
    shown = key
    for value in values:
        if problem:
            break
        problem, shown = value_problem(value), value
    if problem:
        raise bad_request(f'unable to parse requirement: {term.strip()}: Invalid value: "{shown}": {problem}')


def _split_top(text: str) -> list[str]:
    """Split at commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p for p in parts if p.strip()]


def _label_requirement(term: str) -> Callable[[dict[str, str]], bool]:
    eq = _EQ.match(term)
    if eq:
        key, op, value = eq.groups()
        _checked(term, key, [value])
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    m = _SET.match(term)
    if not m:
        raise bad_request(f"unable to parse requirement: found '{term.strip()}', expected: identifier")
    negated, key, op, values_text = m.groups()
    _checked(term, key, [v.strip() for v in (values_text or "").split(",") if v.strip()])
    if op:
        if negated:
            raise bad_request(f"unable to parse requirement: found '{term.strip()}'")
        values = {v.strip() for v in values_text.split(",") if v.strip()}
        if not values:
            raise bad_request("unable to parse requirement: for 'in', 'notin' operators, values set can't be empty")
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if negated:
        return lambda labels: key not in labels
    return lambda labels: key in labels


def label_matcher(selector: str | None) -> Matcher:
    if not selector:
        return lambda obj: True
    requirements = [_label_requirement(t) for t in _split_top(selector)]

    def match(obj: dict[str, Any]) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(req(labels) for req in requirements)

    return match


def _field_value(obj: dict[str, Any], path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return "" if node is None else str(node)


COMMON_FIELDS = ("metadata.name", "metadata.namespace")
EXTRA_FIELDS = {"pods": ("status.phase", "spec.nodeName", "spec.restartPolicy", "status.podIP")}


def field_matcher(selector: str | None, plural: str, kind: str) -> Matcher:
    if not selector:
        return lambda obj: True
    allowed = COMMON_FIELDS + EXTRA_FIELDS.get(plural, ())
    terms: list[tuple[str, bool, str]] = []
    for term in _split_top(selector):
        m = re.match(r"^\s*([A-Za-z0-9._]+)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if not m:
            raise bad_request(f"invalid selector: '{selector}'; can't understand '{term}'")
        name, op, value = m.groups()
        if name not in allowed:
            raise bad_request(f"field label not supported: {name}")
        terms.append((name, op == "!=", value))

    def match(obj: dict[str, Any]) -> bool:
        return all((_field_value(obj, name) == value) != negated for name, negated, value in terms)

    return match
