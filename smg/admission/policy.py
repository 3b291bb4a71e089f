"""Tenant rate-limit policy: the `--tenant-rate-limit-config` YAML, checked and compiled.

The reference gateway's format, so one file serves both::

    default_policy: {tokens_per_minute: 100000, requests_per_minute: 600}
    tenants:
      - tenant_key: auth:team-red
        tokens_per_minute: 500000
        requests_per_minute: 3000
        model_rules:
          - rule_id: big-models
            matcher: {type: prefix, value: qwen3-}
            tokens_per_minute: 50000
            requests_per_minute: 100
          - rule_id: opus-spend
            matcher: {type: exact, value: claude-opus-4}
            tokens_per_minute: 200000
            requests_per_minute: 600
            dollars_per_minute: 0.5

A model rule may also state a budget in money, `dollars_per_minute` (priced by `--price-table`),
beside its tokens and requests: only a model rule, since only it names the models whose prices
it is spent at, and only for models the price table prices (an exact matcher's model, or for a
prefix matcher a `<prefix>*`-or-wider pattern of the table), else the config is refused: a
money limit that could not be priced would mean "no limit".

Unknown keys are refused (a typo must not silently mean "no limit"), every limit is > 0, a
tenant key is in the form a request can resolve to (`auth:…`, `header:…`, `ip:<address>`,
`anonymous`), and `header:` keys need `--trust-tenant-header`. A request is charged to its
tenant's scope (the default policy for a tenant not listed) and to at most one model rule of
that policy: an exact match beats a prefix, the longest prefix wins.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from journal.prices import PriceTable

_RULE_ID = re.compile(r"[A-Za-z0-9._-]+")
_POLICY_KEYS = {"tenant_key", "tokens_per_minute", "requests_per_minute", "model_rules"}
_RULE_KEYS = {"rule_id", "matcher", "tokens_per_minute", "requests_per_minute", "dollars_per_minute"}
_GLOB = "*?["


class PolicyError(ValueError):
    """A rate-limit config that cannot be used, said plainly."""


@dataclass(frozen=True)
class Limits:
    tokens_per_minute: int
    requests_per_minute: int
    dollars_per_minute: float | None = None  # None: no money limit


@dataclass(frozen=True)
class Rule:
    rule_id: str
    kind: str  # exact | prefix
    value: str
    limits: Limits


@dataclass(frozen=True)
class TenantPolicy:
    limits: Limits
    rules: tuple[Rule, ...] = ()

    def rule_for(self, model: str) -> Rule | None:
        exact = next((r for r in self.rules if r.kind == "exact" and r.value == model), None)
        if exact is not None:
            return exact
        prefixes = [r for r in self.rules if r.kind == "prefix" and model.startswith(r.value)]
        return max(prefixes, key=lambda r: len(r.value)) if prefixes else None


@dataclass(frozen=True)
class Scope:
    """One bucket a request is charged to: `key` names it in the ledger."""

    key: str
    limits: Limits


@dataclass(frozen=True)
class PolicySet:
    default: TenantPolicy
    tenants: dict[str, TenantPolicy]

    def scopes(self, tenant: str, model: str) -> list[Scope]:
        """The tenant's scope, then its matching model rule's, if any (a fixed order)."""
        policy = self.tenants.get(tenant, self.default)
        out = [Scope(f"tenant\x1f{tenant}", policy.limits)]
        rule = policy.rule_for(model)
        if rule is not None:
            out.append(Scope(f"rule\x1f{tenant}\x1f{rule.rule_id}", rule.limits))
        return out


def _positive(raw: dict[str, Any], key: str, label: str) -> int:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolicyError(f"{label}: {key} must be an integer")
    if value <= 0:
        raise PolicyError(f"{label}: {key} must be > 0")
    return value


def _dollars(raw: dict[str, Any], label: str) -> float | None:
    if "dollars_per_minute" not in raw:
        return None
    value = raw["dollars_per_minute"]
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise PolicyError(f"{label}: dollars_per_minute must be a number of dollars")
    if value <= 0 or value == float("inf"):
        raise PolicyError(f"{label}: dollars_per_minute must be > 0 and finite")
    return float(value)


def _priced(kind: str, value: str, prices: PriceTable) -> bool:
    """Whether the table prices every model the matcher can match."""
    if kind == "exact":
        return prices.price(value) is not None
    for pattern, _ in prices.patterns:
        stem = pattern[:-1]
        if pattern.endswith("*") and not any(c in stem for c in _GLOB) and value.startswith(stem):
            return True
    return False


def _unknown(raw: dict[str, Any], allowed: set[str], label: str) -> None:
    extra = sorted(set(raw) - allowed)
    if extra:
        raise PolicyError(f"{label}: unknown key(s) {', '.join(extra)}")


def _canonical_tenant(key: str) -> bool:
    if key == "anonymous":
        return True
    for prefix in ("auth:", "header:"):
        if key.startswith(prefix):
            rest = key[len(prefix) :]
            return bool(rest) and rest.strip() == rest and all(c == "\t" or " " <= c <= "~" for c in rest)
    if key.startswith("ip:"):
        try:
            return str(ipaddress.ip_address(key[3:])) == key[3:]
        except ValueError:
            return False
    return False


def _rules(raw: Any, label: str, prices: PriceTable | None) -> tuple[Rule, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise PolicyError(f"{label}: model_rules must be a list")
    rules: list[Rule] = []
    for item in raw:
        if not isinstance(item, dict):
            raise PolicyError(f"{label}: each model rule is a mapping")
        _unknown(item, _RULE_KEYS, f"{label}: model rule")
        rule_id = item.get("rule_id")
        if not isinstance(rule_id, str) or not _RULE_ID.fullmatch(rule_id):
            raise PolicyError(f"{label}: rule_id {rule_id!r} must match [A-Za-z0-9._-]+")
        if any(r.rule_id == rule_id for r in rules):
            raise PolicyError(f"{label}: duplicate rule_id {rule_id!r}")
        where = f"{label}: rule {rule_id!r}"
        matcher = item.get("matcher")
        if not isinstance(matcher, dict):
            raise PolicyError(f"{where}: matcher must be a mapping {{type: exact|prefix, value: …}}")
        _unknown(matcher, {"type", "value"}, f"{where}: matcher")
        kind, value = matcher.get("type"), matcher.get("value")
        if kind not in ("exact", "prefix"):
            raise PolicyError(f"{where}: matcher type must be exact or prefix")
        if not isinstance(value, str) or not value.strip():
            raise PolicyError(f"{where}: matcher value must not be empty")
        if value.strip() != value:
            raise PolicyError(f"{where}: matcher value {value!r} must not have surrounding whitespace")
        twin = next((r for r in rules if r.kind == kind and r.value == value), None)
        if twin is not None:
            raise PolicyError(f"{where}: matcher duplicates rule {twin.rule_id!r}")
        dollars = _dollars(item, where)
        if dollars is not None and prices is None:
            raise PolicyError(f"{where}: dollars_per_minute needs --price-table (the prices it is spent at)")
        if dollars is not None and prices is not None and not _priced(kind, value, prices):
            which = (
                f"model {value!r}"
                if kind == "exact"
                else f"every model starting with {value!r} (a pattern {value + '*'!r})"
            )
            raise PolicyError(f"{where}: dollars_per_minute needs a price for {which} in the price table")
        limits = Limits(
            _positive(item, "tokens_per_minute", where), _positive(item, "requests_per_minute", where), dollars
        )
        rules.append(Rule(rule_id, kind, value, limits))
    return tuple(rules)


def _policy(raw: Any, label: str, prices: PriceTable | None) -> TenantPolicy:
    if not isinstance(raw, dict):
        raise PolicyError(f"{label}: must be a mapping")
    if "dollars_per_minute" in raw:
        raise PolicyError(f"{label}: dollars_per_minute belongs in a model rule (it is spent at that model's prices)")
    _unknown(raw, _POLICY_KEYS, label)
    limits = Limits(_positive(raw, "tokens_per_minute", label), _positive(raw, "requests_per_minute", label))
    return TenantPolicy(limits, _rules(raw.get("model_rules"), label, prices))


def compile_policy(data: Any, *, trust_tenant_header: bool = False, prices: PriceTable | None = None) -> PolicySet:
    """The policy from the parsed YAML; `prices` prices its money limits. Raises PolicyError."""
    if not isinstance(data, dict):
        raise PolicyError("the rate-limit config must be a mapping with default_policy (and tenants)")
    _unknown(data, {"default_policy", "tenants"}, "config")
    if "default_policy" not in data:
        raise PolicyError("config: default_policy is required")
    default_raw = data["default_policy"]
    if isinstance(default_raw, dict) and default_raw.get("tenant_key") is not None:
        raise PolicyError("default_policy must not set tenant_key")
    default = _policy(default_raw, "default_policy", prices)
    tenants: dict[str, TenantPolicy] = {}
    raw_tenants = data.get("tenants") or []
    if not isinstance(raw_tenants, list):
        raise PolicyError("tenants must be a list")
    for index, raw in enumerate(raw_tenants):
        key = raw.get("tenant_key") if isinstance(raw, dict) else None
        if not isinstance(key, str) or not key.strip():
            raise PolicyError(f"tenants[{index}] is missing tenant_key")
        if key.strip() != key:
            raise PolicyError(f"tenant_key {key!r} must not have surrounding whitespace")
        if not _canonical_tenant(key):
            raise PolicyError(
                f"tenant_key {key!r} is not a tenant key a request can have "
                "(expected auth:<id>, header:<id>, ip:<address>, or anonymous)"
            )
        if key in tenants:
            raise PolicyError(f"duplicate tenant_key {key!r}")
        if key.startswith("header:") and not trust_tenant_header:
            raise PolicyError(f"tenant_key {key!r} can never match a request without --trust-tenant-header")
        tenants[key] = _policy(raw, key, prices)
    return PolicySet(default, tenants)


def load_policy(path: Path, *, trust_tenant_header: bool = False, prices: PriceTable | None = None) -> PolicySet:
    """Read and compile `--tenant-rate-limit-config`. Raises PolicyError."""
    import yaml

    try:
        text = path.read_text()
    except OSError as exc:
        raise PolicyError(f"reading {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(f"parsing {path}: {exc}") from None
    try:
        return compile_policy(data, trust_tenant_header=trust_tenant_header, prices=prices)
    except PolicyError as exc:
        raise PolicyError(f"{path}: {exc}") from None
