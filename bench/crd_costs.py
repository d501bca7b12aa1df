"""Print the worst-case CEL cost of every x-kubernetes-validations rule of the CompileCache CRD.

The figures are the API server's static estimate (re-created in tests/celcost.py): a rule
whose cost exceeds the per-rule budget, or rules whose sum exceeds the CRD's budget, make
`kubectl apply` of the CRD fail. Run: python bench/crd_costs.py [path/to/crd.yaml]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from celcost import CRD_TOTAL_LIMIT, PER_RULE_LIMIT, rule_costs  # noqa: E402
from crdschema import load_crd, openapi_schema  # noqa: E402


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else ROOT / "crds" / "compilecache.yaml"
    costs = rule_costs(openapi_schema(load_crd(path), "v1alpha1"))
    print(f"{'worst case':>12} {'per call':>9} {'x runs':>7} {'of budget':>9}  rule")
    for cost in costs:
        print(
            f"{cost.total:>12,} {cost.per_call:>9,} {cost.cardinality:>7,} {cost.factor:>9.4f}  "
            f"{cost.path}: {cost.rule[:90]}"
        )
    total = sum(cost.total for cost in costs)
    print(f"per-rule budget {PER_RULE_LIMIT:,}; worst rule {max(c.total for c in costs):,}")
    print(f"CRD total {total:,} of {CRD_TOTAL_LIMIT:,} ({total / CRD_TOTAL_LIMIT:.4f})")
    over = [cost for cost in costs if cost.total > PER_RULE_LIMIT]
    return 1 if over or total > CRD_TOTAL_LIMIT else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
