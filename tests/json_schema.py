#!/usr/bin/env python3
"""Validates the JSON of `seqflow info --json`, `seqflow stages --json` and `seqflow run
--stats-json` against the schemas of tests/schema. Skips (77) where python3-jsonschema is absent.
usage: json_schema.py SEQFLOW_BIN SCHEMA_DIR TMP_DIR"""
import json
import os
import subprocess
import sys

try:
    import jsonschema
except ImportError:
    print("skipped: python3 jsonschema is not installed (Debian: python3-jsonschema)")
    sys.exit(77)

binary, schema_dir, tmp = sys.argv[1:4]
schemas = {}
for name in os.listdir(schema_dir):
    with open(os.path.join(schema_dir, name)) as f:
        schemas[name] = json.load(f)
try:  # jsonschema 4.18 and newer resolve $ref through a registry
    from referencing import Registry, Resource
    registry = Registry().with_resources((name, Resource.from_contents(s)) for name, s in schemas.items())

    def validator_for(name):
        return jsonschema.Draft202012Validator(schemas[name], registry=registry)
except ImportError:  # older ones (Debian 12 has 4.10) through a RefResolver
    def validator_for(name):
        resolver = jsonschema.RefResolver.from_schema(schemas[name], store=dict(schemas))
        return jsonschema.Draft202012Validator(schemas[name], resolver=resolver)


def check(name, document):
    validator = validator_for(name)
    errors = list(validator.iter_errors(document))
    for e in errors:
        print(f"{name}: {'/'.join(map(str, e.absolute_path))}: {e.message}")
    return not errors


ok = True
for args, schema in ((["info", "--json"], "info.schema.json"),
                     (["info", "--json", "--memory", "none", "--branches", "256:1"], "info.schema.json"),
                     (["stages", "--json"], "stages.schema.json")):
    out = subprocess.run([binary] + args, check=True, capture_output=True, text=True).stdout
    ok &= check(schema, json.loads(out))
stats = os.path.join(tmp, "json_schema_stats.json")
subprocess.run([binary, "run", "-q", "--stats-json", stats], check=True, capture_output=True)
with open(stats) as f:
    ok &= check("stats.schema.json", json.load(f))
os.unlink(stats)
print("all JSON outputs match their schemas" if ok else "schema violations above")
sys.exit(0 if ok else 1)
