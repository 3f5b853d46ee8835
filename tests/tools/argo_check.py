"""Checks Argo Rollouts `Rollout` documents the way the cluster would, offline and strictly.

usage: argo_check.py SCHEMA_PACKAGE FILE...

SCHEMA_PACKAGE is the npm package @kubernetes-models/argo-rollouts 0.3.2, whose Rollout model
carries the openAPIV3Schema of Argo Rollouts' v1.5.0 CRD (its install.yaml) as a literal. The
schema is made strict as kubeconform's -strict does (an object that lists its properties admits
no others, unless it preserves unknown fields), `metadata` is checked against Kubernetes' own
ObjectMeta from kubernetes-validate's strict schemas, and Argo's validation rules for a canary
(pkg/apis/rollouts/validation) are applied on top. Exit 0 when every document passes, 1 with
each problem on stderr otherwise.
"""

import json
import pathlib
import sys

import jsonschema
import kubernetes_validate
import referencing
import yaml

OBJECT_META = "https://kubernetes.io/api/objectmeta/meta/v1"


def rollout_schema(package: pathlib.Path) -> dict:
    text = (package / "argoproj.io/v1alpha1/Rollout.js").read_text()
    start = text.index("const schema = ") + len("const schema = ")
    end = text.index(";\nclass Rollout")
    schema = json.loads(text[start:end])
    strict(schema)
    schema["properties"]["metadata"] = {"$ref": OBJECT_META}
    return schema


def strict(node):
    """Refuses properties a schema does not list, everywhere below `node`."""
    if isinstance(node, dict):
        listed = "properties" in node
        preserves = node.get("x-kubernetes-preserve-unknown-fields") is True
        if listed and "additionalProperties" not in node and not preserves:
            node["additionalProperties"] = False
        for value in node.values():
            strict(value)
    elif isinstance(node, list):
        for value in node:
            strict(value)


def kubernetes_schemas() -> referencing.Registry:
    root = pathlib.Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    latest = max(
        (d for d in root.iterdir() if d.name.endswith("-local-strict")),
        key=lambda d: tuple(int(p) for p in d.name[1:].split("-")[0].split(".")),
    )
    registry = referencing.Registry()
    for name in ("objectmeta-meta-v1.json", "_definitions.json"):
        contents = json.loads((latest / name).read_text())
        registry = referencing.Resource.from_contents(contents) @ registry
    return registry


def argo_rules(rollout: dict) -> list:
    """Argo Rollouts' own checks of a canary rollout, beyond its schema."""
    problems = []
    spec = rollout.get("spec", {})
    min_ready = spec.get("minReadySeconds", 0)
    deadline = spec.get("progressDeadlineSeconds", 600)
    if deadline <= min_ready:
        problems.append("spec.progressDeadlineSeconds must be greater than minReadySeconds")
    canary = spec.get("strategy", {}).get("canary")
    if canary is None:
        return problems + ["spec.strategy.canary is missing"]
    if canary.get("maxSurge", "25%") in (0, "0%") and canary.get("maxUnavailable", 0) in (0, "0%"):
        problems.append("MaxSurge and MaxUnavailable both can not be zero")
    for index, step in enumerate(canary.get("steps", [])):
        if len(step) != 1:
            problems.append(f"steps[{index}] must set exactly one of its kinds: {sorted(step)}")
        weight = step.get("setWeight")
        if weight is not None and not 0 <= weight <= 100:
            problems.append(f"steps[{index}].setWeight {weight} must be between 0 and 100")
        pause = step.get("pause")
        if pause is not None and "duration" not in pause:
            problems.append(f"steps[{index}].pause without a duration waits for a person")
    return problems


def main() -> int:
    package, files = pathlib.Path(sys.argv[1]), sys.argv[2:]
    validator = jsonschema.Draft202012Validator(
        rollout_schema(package), registry=kubernetes_schemas()
    )
    failed = False
    for file in files:
        for number, document in enumerate(yaml.safe_load_all(pathlib.Path(file).read_text())):
            if document is None:
                continue
            problems = [
                f"{'.'.join(str(p) for p in error.absolute_path) or '(top)'}: {error.message}"
                for error in validator.iter_errors(document)
            ] + argo_rules(document)
            for problem in problems:
                print(f"{file}: document {number}: {problem}", file=sys.stderr)
            failed = failed or bool(problems)
    if not failed:
        print(f"{len(files)} file(s): every Rollout is valid")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
