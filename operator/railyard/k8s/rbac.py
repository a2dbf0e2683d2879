"""The operator's RBAC rules, derived from the code that calls the Kubernetes API.

The chart's ClusterRole must hold exactly what the operator uses: anything less breaks it at
run time, anything more is privilege nobody reviewed. So the rules are not written by hand; this
module reads the operator's source (``railyard.k8s``, ``railyard.handlers``, ``railyard.observe``)
and finds every API call:

* ``kube.get/list/create/patch/delete(core_path(...) | custom_path(...))`` (and ``kube.request``
  with an HTTP method) -> (group, resource[/subresource], verb). Path arguments that are names
  are resolved inside the function (``plural = {...}[kind]``, ``for plural in (...)``,
  ``path = core_path(...)``) or from the module's globals (``GROUP``, ``PLURAL``).
* kopf decorators: ``@kopf.index`` / ``@kopf.on.event`` need list + watch; change handlers
  (``on.create``, ``on.update``, ``timer``, ``daemon`` ...) also patch (kopf stores progress and
  finalizers on the object).
* an ownerReference with ``blockOwnerDeletion: true`` in the manifest builders needs ``update``
  on the owner's ``finalizers`` subresource (the OwnerReferencesPermissionEnforcement plugin).

What kopf itself calls (peering, discovery of CRDs and namespaces) is listed in
:data:`FRAMEWORK` with the reason. ``python -m railyard.k8s.rbac`` writes the chart's
``helm/railyard/rbac-rules.yaml``; ``--check`` exits 1 when that file is stale.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import pkgutil
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

#: Packages whose code runs in the operator process and may call the API.
OPERATOR_PACKAGES = ("railyard.k8s", "railyard.handlers", "railyard.observe")
#: Modules (or packages) building manifests (scanned for ownerReferences only).
MANIFEST_MODULES = ("railyard.logic.manifests",)

_CLIENT_VERBS = {"get": "get", "list": "list", "create": "create", "patch": "patch", "delete": "delete"}
_HTTP_VERBS = {"GET": "get", "POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}
_WATCH_ONLY = {"index", "event"}
_WATCH_AND_PATCH = {"create", "update", "delete", "resume", "field", "timer", "daemon"}


@dataclass(frozen=True, order=True)
class Permission:
    group: str
    resource: str
    verb: str


@dataclass(frozen=True)
class FrameworkRule:
    group: str
    resource: str
    verbs: tuple[str, ...]
    reason: str


#: What kopf does on its own, not visible as calls in our code.
FRAMEWORK: tuple[FrameworkRule, ...] = (
    FrameworkRule("apiextensions.k8s.io", "customresourcedefinitions", ("list", "watch"),
                  "kopf's resource observer notices CRDs added or removed at run time"),
    FrameworkRule("", "namespaces", ("list", "watch"),
                  "kopf's namespace observer, when watching a list of namespaces (--namespace)"),
    FrameworkRule("kopf.dev", "clusterkopfpeerings", ("list", "watch", "patch"),
                  "kopf peering (--peering) of a cluster-wide operator: one active replica"),
    FrameworkRule("kopf.dev", "kopfpeerings", ("list", "watch", "patch"),
                  "kopf peering of a namespaced operator"),
)

_VERB_ORDER = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


class _Unresolved(Exception):
    pass


class _Scope:
    """Resolves an expression to the set of strings (or None) it may evaluate to."""

    def __init__(self, func: ast.AST | None, module_globals: dict[str, Any]) -> None:
        self.globals = module_globals
        self.local: dict[str, list[ast.expr]] = {}
        if func is None:
            return
        for node in ast.walk(func):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self.local.setdefault(target.id, []).append(node.value)
            elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension) and isinstance(node.target, ast.Name):
                self.local.setdefault(node.target.id, []).append(ast.Starred(value=node.iter))

    def values(self, expr: ast.expr) -> set[str | None]:
        if isinstance(expr, ast.Constant) and (expr.value is None or isinstance(expr.value, str)):
            return {expr.value}
        if isinstance(expr, ast.Starred):  # a loop variable: every element of the iterable
            it = expr.value
            if isinstance(it, ast.Tuple | ast.List | ast.Set):
                return set().union(*(self.values(e) for e in it.elts))
            raise _Unresolved(ast.unparse(it))
        if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Dict):
            return set().union(*(self.values(v) for v in expr.value.values))
        if isinstance(expr, ast.IfExp):
            return self.values(expr.body) | self.values(expr.orelse)
        if isinstance(expr, ast.Name):
            if expr.id in self.local:
                return set().union(*(self.values(v) for v in self.local[expr.id]))
            if expr.id in self.globals and isinstance(self.globals[expr.id], str):
                return {self.globals[expr.id]}
            raise _Unresolved(expr.id)
        raise _Unresolved(ast.unparse(expr))

    def paths(self, expr: ast.expr) -> set[tuple[str, str, bool]]:
        """(group, resource, has_name) for a path expression."""
        if isinstance(expr, ast.Name) and expr.id in self.local:
            return set().union(*(self.paths(v) for v in self.local[expr.id]))
        if not (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name)):
            raise _Unresolved(ast.unparse(expr))
        args = list(expr.args)
        kw = {k.arg: k.value for k in expr.keywords if k.arg}
        if expr.func.id == "core_path":
            names = ["plural", "namespace", "name", "sub"]
            groups: set[str | None] = {""}
        elif expr.func.id == "custom_path":
            names = ["group", "version", "plural", "namespace", "name", "sub"]
            groups = set()
        else:
            raise _Unresolved(ast.unparse(expr))
        bound = dict(zip(names, args, strict=False)) | kw
        if expr.func.id == "custom_path":
            groups = self.values(bound["group"])
        plurals = self.values(bound["plural"])
        subs = self.values(bound["sub"]) if "sub" in bound else {None}
        has_name = "name" in bound and not (isinstance(bound["name"], ast.Constant) and bound["name"].value is None)
        out: set[tuple[str, str, bool]] = set()
        for g in groups:
            for p in plurals:
                for s in subs:
                    if g is None or p is None:
                        raise _Unresolved(ast.unparse(expr))
                    out.add((g, f"{p}/{s}" if s else p, has_name))
        return out


def _kopf_target(call: ast.Call, scope: _Scope) -> tuple[str, str] | None:
    """(group, plural) of a kopf resource decorator: ("pods") or (GROUP, VERSION, PLURAL)."""
    pos = [a for a in call.args]
    if not pos:
        return None
    vals = [scope.values(a) for a in pos]
    flat = [next(iter(v)) for v in vals]
    if len(flat) == 1 and isinstance(flat[0], str):
        return ("", flat[0]) if "." not in flat[0] else (flat[0].split(".", 1)[1], flat[0].split(".", 1)[0])
    if len(flat) >= 3 and all(isinstance(x, str) for x in flat[:3]):
        return str(flat[0]), str(flat[2])
    if len(flat) == 2 and all(isinstance(x, str) for x in flat):  # ("v1", "pods") or (group/version, plural)
        group = str(flat[0]).split("/")[0] if "/" in str(flat[0]) else ""
        return group, str(flat[1])
    return None


def _decorator_kind(dec: ast.expr) -> tuple[str, ast.Call] | None:
    if not isinstance(dec, ast.Call):
        return None
    name = ast.unparse(dec.func)
    if name == "kopf.index":
        return "index", dec
    if name.startswith("kopf.on.") or name in ("kopf.timer", "kopf.daemon"):
        return name.rsplit(".", 1)[-1], dec
    return None


def scan_source(
    source: str, module_globals: dict[str, Any] | None = None, *, where: str = "<source>"
) -> set[Permission]:
    """Every API permission the code in ``source`` needs (raises ValueError on what it cannot resolve)."""
    tree = ast.parse(source)
    g = module_globals or {}
    perms: set[Permission] = set()
    owner = _innermost_functions(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for dec in node.decorator_list:
                kind = _decorator_kind(dec)
                if kind is None:
                    continue
                what, call = kind
                target = _kopf_target(call, _Scope(None, g))
                if target is None:
                    continue
                verbs = ["list", "watch"] + (["patch"] if what in _WATCH_AND_PATCH else [])
                if what not in _WATCH_ONLY | _WATCH_AND_PATCH:
                    continue
                perms.update(Permission(target[0], target[1], v) for v in verbs)
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
            continue
        attr = node.func.attr
        scope = _Scope(owner.get(id(node)), g)
        try:
            if attr in _CLIENT_VERBS and _looks_like_path(node.args[0], scope):
                verb = _CLIENT_VERBS[attr]
                path_expr = node.args[0]
            elif attr == "request" and len(node.args) >= 2 and _looks_like_path(node.args[1], scope):
                methods = scope.values(node.args[0])
                if len(methods) != 1:
                    raise _Unresolved(ast.unparse(node.args[0]))
                verb = _HTTP_VERBS[str(next(iter(methods))).upper()]
                path_expr = node.args[1]
            else:
                continue
            for group, resource, has_name in scope.paths(path_expr):
                v = "deletecollection" if verb == "delete" and not has_name else verb
                perms.add(Permission(group, resource, v))
        except _Unresolved as exc:
            raise ValueError(
                f"{where}:{node.lineno}: cannot tell which resource `{ast.unparse(node)}` touches "
                f"(unresolved {exc}); use literal plurals or module constants in the path"
            ) from None
    perms.update(_owner_reference_permissions(tree, g))
    return perms


def _innermost_functions(tree: ast.AST) -> dict[int, ast.AST]:
    """id(node) -> the innermost function containing it."""
    owner: dict[int, ast.AST] = {}

    def visit(node: ast.AST, func: ast.AST | None) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            func = node
        if func is not None:
            owner[id(node)] = func
        for child in ast.iter_child_nodes(node):
            visit(child, func)

    visit(tree, None)
    return owner


def _looks_like_path(expr: ast.expr, scope: _Scope) -> bool:
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name):
        return expr.func.id in ("core_path", "custom_path")
    if isinstance(expr, ast.Name) and expr.id in scope.local:
        return any(_looks_like_path(v, scope) for v in scope.local[expr.id])
    return False


def _owner_reference_permissions(tree: ast.AST, g: dict[str, Any]) -> set[Permission]:
    """An ownerReference dict with blockOwnerDeletion True -> update <owner plural>/finalizers."""
    out: set[Permission] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Dict):
            continue
        keys = {k.value: v for k, v in zip(node.keys, node.values, strict=True) if isinstance(k, ast.Constant)}
        block = keys.get("blockOwnerDeletion")
        if isinstance(block, ast.Constant) and block.value is True and "apiVersion" in keys:
            api_version = _const_or_global(keys["apiVersion"], g)
            kind = _const_or_global(keys.get("kind"), g)
            plural = _kind_plurals().get(kind or "")
            if api_version and plural:
                out.add(
                    Permission(
                        api_version.split("/")[0] if "/" in api_version else "", f"{plural}/finalizers", "update"
                    )
                )
    return out


def _kind_plurals() -> dict[str, str]:
    """Kinds the operator owns children with -> their plural (our CRD's)."""
    from railyard.api import trainingjob

    return {trainingjob.KIND: trainingjob.PLURAL}


def _const_or_global(expr: ast.expr | None, g: dict[str, Any]) -> str | None:
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value
    if isinstance(expr, ast.Name) and isinstance(g.get(expr.id), str):
        return str(g[expr.id])
    return None


def _modules(packages: Iterable[str]) -> Iterator[ModuleType]:
    for name in packages:
        mod = importlib.import_module(name)
        yield mod
        for info in pkgutil.walk_packages(getattr(mod, "__path__", []), prefix=f"{name}."):
            yield importlib.import_module(info.name)


def scan_operator(
    packages: Iterable[str] = OPERATOR_PACKAGES, manifests: Iterable[str] = MANIFEST_MODULES
) -> set[Permission]:
    """The permissions the operator's own code needs (without :data:`FRAMEWORK`)."""
    perms: set[Permission] = set()
    for mod in [*_modules(packages), *_modules(manifests)]:
        try:
            source = inspect.getsource(mod)
        except (OSError, TypeError):
            continue
        perms |= scan_source(source, vars(mod), where=getattr(mod, "__file__", mod.__name__) or mod.__name__)
    return perms


def required_permissions() -> set[Permission]:
    perms = scan_operator()
    for rule in FRAMEWORK:
        perms.update(Permission(rule.group, rule.resource, v) for v in rule.verbs)
    return perms


def build_rules(perms: Iterable[Permission]) -> list[dict[str, list[str]]]:
    """ClusterRole rules: one per (group, resource), verbs in the usual order, sorted."""
    by: dict[tuple[str, str], set[str]] = {}
    for p in perms:
        by.setdefault((p.group, p.resource), set()).add(p.verb)
    return [
        {"apiGroups": [g], "resources": [r], "verbs": sorted(v, key=_VERB_ORDER.index)}
        for (g, r), v in sorted(by.items())
    ]


def rules_to_permissions(rules: Iterable[dict[str, Any]]) -> set[Permission]:
    """Expand ClusterRole rules into single permissions (for comparison)."""
    return {
        Permission(g, r, v)
        for rule in rules
        for g in rule.get("apiGroups", [])
        for r in rule.get("resources", [])
        for v in rule.get("verbs", [])
    }


def render_rules_yaml(rules: list[dict[str, list[str]]]) -> str:
    reasons = {(r.group, r.resource): r.reason for r in FRAMEWORK}
    lines = [
        "# Generated by `python -m railyard.k8s.rbac` from the operator's API calls. Do not edit;",
        "# rerun it after changing what the operator calls (tests/deployment checks it is current).",
    ]
    for rule in rules:
        g, r = rule["apiGroups"][0], rule["resources"][0]
        if (g, r) in reasons:
            lines.append(f"# kopf: {reasons[(g, r)]}")
        lines.append(f"- apiGroups: [{_q(g)}]")
        lines.append(f"  resources: [{r}]")
        lines.append(f"  verbs: [{', '.join(rule['verbs'])}]")
    return "\n".join(lines) + "\n"


def _q(group: str) -> str:
    return '""' if group == "" else group


def default_rules_path() -> Path:
    return Path(__file__).resolve().parents[3] / "helm" / "railyard" / "rbac-rules.yaml"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m railyard.k8s.rbac", description=__doc__.splitlines()[0] if __doc__ else None
    )
    ap.add_argument("--output", type=Path, default=default_rules_path(), help="rules file (default: the chart's)")
    ap.add_argument("--check", action="store_true", help="exit 1 if the file differs instead of writing it")
    args = ap.parse_args(argv)
    text = render_rules_yaml(build_rules(required_permissions()))
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run python -m railyard.k8s.rbac", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
